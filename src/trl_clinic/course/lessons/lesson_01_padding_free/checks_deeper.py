"""Lesson 01's deep-dive checks: its claims, asserted on the numbers its last cell records (``check(run, numbers)``).

They see nothing but those numbers (as metrics.json stores them), so tests/test_checks_can_fail.py can hand them the
other run's numbers and see each one fail; ``summary`` is the sentence the workbook's report shows, written from the
same numbers.
"""

from trl_clinic.course.results import above, below, measured


def sweep_checks(bad: dict, good: dict, largest: int, equal: float) -> tuple[dict, dict]:
    """The probes and the two models at learning rate 0: the run without the fix (a mask of ones or a cache on
    the Llama's row, the families that ignore position_ids, OPT) and the run with it, measured the same way."""
    loss, grad = bad["loss_ratio"], bad["grad_ratio"]
    worst = max(loss, key=lambda name: loss[name][-1])
    symptom = {
        "probe flags a packed Llama row sent with a mask of ones or run with use_cache=True (over 1e-4)": measured(
            above(min(p["max_relative_difference"] for p in bad["probes"].values()), 1e-4)
        ),
        "probe flags OPT, Falcon, Bloom and MPT with today's padding-free inputs (over 1e-4)": measured(
            above(min(f["max_relative_difference"] for f in bad["families"].values()), 1e-4)
        ),
        "OPT: padding-free/padded loss grows over 1.02x from the smallest batch to the largest "
        "in every setting": measured(above(min(r[-1] / r[0] for r in loss.values()), 1.02)),
        f"OPT: padding-free/padded loss over 1.05x at batch {largest} in every setting": measured(
            above(min(r[-1] for r in loss.values()), 1.05)
        ),
        f"OPT: over 1.5x at batch {largest} where it hurts most": measured(above(loss[worst][-1], 1.5)),
        f"OPT: grad norm over 1.5x padded at batch {largest} in every setting": measured(
            above(min(g[-1] for g in grad.values()), 1.5)
        ),
    }
    fix = {
        "probe finds the Llama's packed row isolated with position_ids, no mask, no cache (under 1e-4)": measured(
            below(max(p["max_relative_difference"] for p in good["probes"].values()), 1e-4)
        ),
        "probe finds Llama and Qwen2 isolated across families (under 1e-4)": measured(
            below(max(f["max_relative_difference"] for f in good["families"].values()), 1e-4)
        ),
        "Llama: padding-free equals padded at every batch size in every setting (same weights)": measured(
            below(max(abs(r - 1) for rs in good["loss_ratio"].values() for r in rs), equal)
        ),
    }
    return symptom, fix


def training_checks(bad: dict, good: dict, tolerance: float) -> tuple[dict, dict]:
    """The short trainings, the remedies and the flag, on each run."""
    padded, free, remedies = bad["training"]["padded"], bad["training"]["padding-free"], bad["remedies"]
    symptom = {
        "OPT training: the padding-free grad norm at step 1 (same weights) is over 2x padded": measured(
            above(free["grad_norm"][0] / padded["grad_norm"][0], 2)
        ),
        "OPT training: the padding-free run's last steps log over 1.02x the padded loss": measured(
            above(free["final_loss"] / padded["final_loss"], 1.02)
        ),
        "remedies short of attention leave OPT's loss over 1.05x padded": measured(
            above(min(r["over_padded"] for r in remedies.values()), 1.05)
        ),
        "model_init_kwargs is ignored for a model instance": measured(bad["kernel"] != "eager"),
    }
    fix = {
        "Llama on today's padding-free path follows padded step by step": measured(below(good["gap"], tolerance)),
        "every remedy leaves the Llama's padding-free loss equal to padded": measured(
            below(max(abs(r["over_padded"] - 1) for r in good["remedies"].values()), tolerance)
        ),
        "model_init_kwargs applies for a model path": measured(good["kernel"] == "eager"),
    }
    return symptom, fix


def checks(n: dict) -> tuple[dict, dict]:
    """Today's checks on the run without the fix and the run with it, and those of TRL 0.21.0 + transformers
    4.55.4 where its side environment ran."""
    bad, good = n["runs"]["without_fix"], n["runs"]["with_fix"]
    # fp32: the two paths differ by rounding (1e-7 at lr 0, 1e-6 after 20 steps); bf16 autocast on a GPU: a mean loss
    # rounds by 4e-3 (8 bits of mantissa) at lr 0, and two trainings drift apart by a few 1e-2 over 60 steps
    equal, tolerance = (1e-4, 1e-3) if n["precision"] == "fp32" else (2e-2, 5e-2)
    (symptom, fix), (trained_symptom, trained_fix) = (
        sweep_checks(bad, good, n["batch_sizes"][-1], equal),
        training_checks(bad, good, tolerance),
    )
    symptom, fix = {**symptom, **trained_symptom}, {**fix, **trained_fix}
    if n["then"]["status"] == "finished":
        symptom[
            "transformers 4.55.4: a packed row is contaminated in train mode with the config's cache (over 1e-4)"
        ] = measured(above(bad["era_difference"], 1e-4))
        fix["transformers 4.55.4: use_cache=False keeps packed sequences apart (under 1e-4)"] = measured(
            below(good["era_difference"], 1e-4)
        )
    return symptom, fix


def summary(n: dict) -> str:
    """The run in two sentences, from its numbers."""
    loss_ratio, speed = n["runs"]["without_fix"]["loss_ratio"], n["throughput"]
    worst = max(loss_ratio, key=lambda s: loss_ratio[s][-1])
    device = "cpu" if speed["padded"]["peak_memory_mib"] is None else "cuda"  # peak memory: tracked on CUDA only
    faster = speed["padding-free"]["tokens_per_second"] / speed["padded"]["tokens_per_second"]
    return (
        f"OPT through today's SFTTrainer(padding_free=True): {loss_ratio[worst][-1]:.2f}x the padded loss at batch "
        f"{n['batch_sizes'][-1]} ({worst}); no remedy short of attention brought it back to padded. Padding-free ran "
        f"{faster:.2f}x the padded real tokens/s "
        f"({n['attention']}, {device})."
    )
