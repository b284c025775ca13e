"""Lesson 02's deep-dive checks: its claims, asserted on the numbers its last cell records (``check(run, numbers)``).

They see nothing but those numbers (as metrics.json stores them), so tests/test_checks_can_fail.py can hand them the
other run's numbers and see each one fail; ``summary`` is the sentence the workbook's report shows, written from the
same numbers.
"""

from trl_clinic.course.results import above, below, injected, measured, recreated


def era_checks(n: dict) -> tuple[dict, dict]:
    """The real transformers 4.45.2 / TRL 0.11.4 against today's Trainer on the same spec (absent when the era was
    skipped): ``runs["old"]`` is the real 4.45.2 SFTTrainer (and today's re-creation of it), ``runs["today"]``
    today's."""
    then = n["then"]
    if then["status"] != "finished":
        return {}, {}
    old, today = then["runs"]["old"], then["runs"]["today"]
    symptom = {
        "on transformers 4.45.2, SFTTrainer's gradient is the mean of per-micro-batch means (< 1e-5)": measured(
            below(old["vs_mean_of_means"], 1e-5)
        ),
        "on transformers 4.45.2, it misses the full-batch gradient (> 1e-2)": measured(
            above(old["vs_full_batch"], 1e-2)
        ),
        "today's re-creation gives the real 4.45.2 gradient (< 1e-5)": recreated(
            below(old["vs_real_sft_trainer"], 1e-5)
        ),
    }
    fix = {
        "today's Trainer gives the full-batch gradient computed on transformers 4.45.2 (< 1e-5)": measured(
            below(today["vs_full_batch"], 1e-5)
        )
    }
    return symptom, fix


def old_path_checks(n: dict) -> dict:
    """The old arithmetic (re-created), padded and packed, and the custom compute_loss (a fault set by hand)."""
    old, custom, spread, packed = n["sweep"]["old"], n["sweep"]["custom"], n["label_spread"], n["packed"]["old"]
    return {
        "old arithmetic misses the big-batch gradient at every count (> 1e-2)": recreated(
            above(min(r["relative_error"] for r in old), 1e-2)
        ),
        "old arithmetic points another way at every count (1 - cosine > 1e-2)": recreated(
            above(min(1 - r["cosine"] for r in old), 1e-2)
        ),
        "custom mean-per-micro-batch loss misses it at every count (> 1e-2)": injected(
            above(min(r["relative_error"] for r in custom), 1e-2)
        ),
        "custom loss gradient is k times the old path's (< 1e-5)": injected(
            below(max(r["vs_count_times_old"] for r in custom), 1e-5)
        ),
        "custom loss reports k times the old path's training loss (within 1e-4)": injected(
            below(
                max(abs(c["reported_loss"] / o["reported_loss"] / c["accumulation"] - 1) for c, o in zip(custom, old)),
                1e-4,
            )
        ),
        "declared loss_is_scaled_for_ga=False gives the old path's gradient (< 1e-5)": injected(
            below(n["vs_old"]["declared"]["relative_error"], 1e-5)
        ),
        "packed rows hold more even label counts than single samples (spread at most half)": measured(
            below(spread["packed"]["coefficient_of_variation"] / spread["padded"]["coefficient_of_variation"], 0.5)
        ),
        "packing cuts the old arithmetic's gradient error by over 0.5 (from about 1)": recreated(
            above(packed["single"] - packed["packed"], 0.5)
        ),
        "on packed rows the old arithmetic still misses the big batch (> 1e-4)": recreated(
            above(packed["packed"], 1e-4)
        ),
    }


def run_checks(n: dict) -> dict:
    """The old arithmetic trained to the end (re-created): another logged loss, another model."""
    held_out, short_long, big = n["held_out_loss"], n["held_out_short_long_ratio"], "big batch"
    return {
        "old arithmetic logs another training loss than the big batch (gap > 1e-2)": recreated(
            above(n["train_loss_gap"]["old"], 1e-2)
        ),
        "old arithmetic ends with a held-out loss over 1.1x the big batch's": recreated(
            above(held_out["old"]["all"] / held_out[big]["all"], 1.1)
        ),
        "old arithmetic favours short answers (short/long held-out ratio under 0.9x the big batch's)": recreated(
            below(short_long["old"] / short_long[big], 0.9)
        ),
    }


def fix_checks(n: dict) -> dict:
    """Today's num_items_in_batch on a model that accepts loss kwargs: batch 1 x k is batch k, step after step."""
    held_out, spread = n["held_out_loss"], n["label_spread"]
    return {
        "num_items_in_batch matches the big batch at every count (< 1e-4)": measured(
            below(max(r["relative_error"] for r in n["sweep"]["today"]), 1e-4)
        ),
        "no sample was cut by packing (the longest fits a packed row)": measured(
            spread["longest_sample_tokens"] <= spread["packing_length"]
        ),
        "num_items_in_batch matches the big batch on packed rows too (< 1e-4)": measured(
            below(n["packed"]["today"]["packed"], 1e-4)
        ),
        "batch 1 x N logs the big batch's training loss at every step (within 1e-3)": measured(
            below(n["train_loss_gap"]["today"], 1e-3)
        ),
        "batch 1 x N ends with the big batch's held-out loss (within 1e-3)": measured(
            below(abs(held_out["today"]["all"] / held_out["big batch"]["all"] - 1), 1e-3)
        ),
    }


def bisect_checks(n: dict) -> dict:
    """Section 7: bisect, told only the window, names 4.46.0 in the loss scale (absent when no index could list the
    releases; an undecided search is recorded and fails them)."""
    found = n.get("bisect") or {"status": "skipped"}
    if found["status"] == "skipped":
        return {}
    said = {version: found["versions"].get(version, {}).get("accumulation") for version in ("4.45.2", "4.46.0")}
    return {
        "bisect names transformers 4.46.0 as the first change, 4.45.2 the last same": measured(
            (found["first"], found["last_same"]) == ("4.46.0", "4.45.2")
        ),
        "at transformers 4.46.0 the loss scale changes and the batch and label count do not": measured(
            found["parts"][:1] == ["loss scale"]
        ),
        "the check-up's accumulation probe fails on transformers 4.45.2 and passes on 4.46.0": measured(
            said == {"4.45.2": "fail", "4.46.0": "ok"}
        ),
    }


def checks(n: dict) -> tuple[dict, dict]:
    """The claims above as functions of the numbers alone (a test swaps today's path with the old ones and expects
    each group to fail)."""
    era_symptom, era_fix = era_checks(n)
    return {**era_symptom, **old_path_checks(n), **run_checks(n), **bisect_checks(n)}, {**fix_checks(n), **era_fix}


def summary(n: dict) -> str:
    """The run in one sentence, from its numbers."""
    N, steps, packed, held_out = n["curve_accumulation"], n["curve_steps"], n["packed"], n["held_out_loss"]
    real_too = "; the real transformers 4.45.2 gave the same gradient" if n["then"]["status"] == "finished" else ""
    return (
        f"Batch 1 x {N} with the pre-4.46 per-micro-batch mean (recreated{real_too}) missed the batch-{N} gradient "
        f"by {packed['old']['single']:.0%} and after {steps} steps ended with held-out loss "
        f"{held_out['old']['all']:.3f} against {held_out['big batch']['all']:.3f}; a custom compute_loss that drops "
        f"num_items_in_batch gave the old gradient {N} times longer; {len(n['top_level_without_loss_kwargs'])} model "
        f"classes of today's transformers declare no loss kwargs."
    )
