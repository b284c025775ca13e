"""Lesson 06's checks: the claims of the core, asserted on the numbers its last cell records
(``check(run, numbers)``).

They see nothing but those numbers (as metrics.json stores them), so tests/test_checks_can_fail.py can hand them the
other run's numbers and see each one fail; ``summary`` is the sentence the workbook's report shows, written from the
same numbers.
"""

from trl_clinic.course.results import above, below, injected, measured


def symptom_checks(n: dict) -> dict:
    """Your trainer's two traps fail by measurement, the packed row shows why, the pasted check agrees with the
    probe, and each other lesson's trap trips its probe: all read from the run without the fix lines."""
    run, traps = n["runs"]["without_fix"], n["runs"]["without_fix"]["traps"]
    row, pasted, probe = run["by_token"], run["pasted"], run["statuses"]
    return {
        "your trainer: packing fails, measured (OPT, padding-free)": measured(probe["packing"] == "fail measured"),
        "your trainer: fp16_adamw fails, measured (fp16 weights, adamw_torch)": measured(
            probe["fp16_adamw"] == "fail measured"
        ),
        "in the row, the first sequence differs by rounding only (below 4 units in "
        "the last place at the logits' size)": measured(row is not None and below(max(row["first"]), run["four_ulps"])),
        "in the row, the second sequence's first token already differs beyond the probe's tolerance": measured(
            row is not None and above(row["second"][0], run["tolerance"])
        ),
        "the pasted check finds the packing probe's number (later sequences, within 1 %)": measured(
            pasted is not None
            and run["packing_value"] is not None
            and below(abs(pasted[1] / run["packing_value"] - 1), 0.01)
        ),
        "a custom loss that takes the mean fails the accumulation probe": injected(
            traps["02 accumulation: a loss that takes the mean"]["status"] == "fail"
        ),
        "LoRA without SEQ_CLS fails reward_head": measured(
            traps["03 reward_head: LoRA, no task_type"]["status"] == "fail"
        ),
        "Qwen2 with use_cache=True runs right-padded forwards with a cache": measured(
            above(traps["04 padding_cache: Qwen2, use_cache"]["value"], 0.5)
        ),
        "an all-or-nothing reward leaves every GRPO group equal": measured(
            traps["05 equal_rewards: a reward never earned"]["status"] == "fail"
        ),
    }


def fix_checks(n: dict) -> dict:
    """Each fix line passes its probe (read from the run with the fix lines), and the check-up changed no part of
    the trainer a training step changes."""
    run, traps, changed = n["runs"]["with_fix"], n["runs"]["with_fix"]["traps"], n["changed"]
    return {
        "the fixed trainer's check-up: no probe fails or crashes (exit code 0)": measured(run["exit_code"] == 0),
        "float32 weights: fp16_adamw ok": measured(run["statuses"]["fp16_adamw"].startswith("ok ")),
        "padding_free=False: the pasted check finds no packed row": measured(run["pasted"] is None),
        "the loss divided by num_items_in_batch passes accumulation": measured(
            traps["02 accumulation: a loss that takes the mean"]["status"] == "ok"
        ),
        "task_type='SEQ_CLS' passes reward_head": measured(
            traps["03 reward_head: LoRA, no task_type"]["status"] == "ok"
        ),
        "use_cache=False: no right-padded forward with a cache": measured(
            traps["04 padding_cache: Qwen2, use_cache"]["value"] == 0
        ),
        "a reward that differs within groups passes equal_rewards": measured(
            traps["05 equal_rewards: a reward never earned"]["status"] == "ok"
        ),
        "one training step changes the weights and the optimizer in the fingerprint": measured(
            {"weights and buffers", "optimizer"} <= set(changed["training step"])
        ),
        "the check-up changed no part of the trainer, before and after training": measured(
            changed["check-up"] == [] and changed["second check-up"] == []
        ),
    }


def checks(n: dict) -> tuple[dict, dict]:
    """Today's real trainers and probes; the one trap set by hand (stand_ins.MeanLossTrainer) says injected."""
    return symptom_checks(n), fix_checks(n)


def summary(n: dict) -> str:
    """The run in one sentence, from its numbers."""
    bad, fixed = n["runs"]["without_fix"], n["runs"]["with_fix"]
    first, later = bad["pasted"]
    fails = [sum(run["traps"][name]["status"] == "fail" for name in bad["traps"]) for run in (bad, fixed)]
    return (
        f"checkup(trainer) on an OPT SFTTrainer loaded in fp16 with padding-free batches failed packing (a later "
        f"sequence's logits {later:.2g} from alone, rounding {first:.2g}) and fp16_adamw, by measurement; "
        f"{fails[0]} of {len(bad['traps'])} lesson traps failed and {fails[1]} with their fix lines; "
        f"padding_free=False and float32 weights exit {fixed['exit_code']}, and no part of the trainer changed."
    )
