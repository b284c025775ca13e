"""Lesson 07's checks: the claims of the core, asserted on the numbers its last cell records
(``check(run, numbers)``).

They see nothing but those numbers (as metrics.json stores them), so tests/test_checks_can_fail.py can hand them the
other run's numbers and see each one fail; ``summary`` is the sentence the workbook's report shows, written from the
same numbers.
"""

import math

from trl_clinic.course.results import below, measured


def log_checks(n: dict) -> dict:
    """What the trainer's log showed of the fp16 run, and what the watch put beside it."""
    run = n["runs"]["fp16"]
    logged, raw = run["plain_logged"], run["raw_loss"]
    first_zero = next((r["step"] for r in logged if r["loss"] == 0.0), None)
    error = max(
        (abs(p - r["loss"]) / max(abs(p), 1e-12) for p, r in zip(run["replayed_logs"], logged)), default=math.nan
    )
    return {
        "the first log shows a finite loss with a NaN grad norm": measured(
            math.isfinite(logged[0]["loss"]) and math.isnan(logged[0]["grad_norm"])
        ),
        "every later logged loss is exactly 0": measured(len(logged) > 1 and all(r["loss"] == 0.0 for r in logged[1:])),
        "the raw losses hold NaN, and the NaN filter's arithmetic on them gives "
        "every logged loss (within 1e-3)": measured(
            any(math.isnan(v) for v in raw) and len(run["replayed_logs"]) == len(logged) and below(error, 1e-3)
        ),
        "clinic/raw_loss is NaN in the first log row, where the logged loss is finite": measured(
            math.isnan(run["watched_logged"][0]["clinic/raw_loss"]) and math.isfinite(run["watched_logged"][0]["loss"])
        ),
        "zero_loss is found at the first log of 0 and put down to the NaN filter (lesson 03)": measured(
            first_zero is not None
            and run["findings"].get("zero_loss") == first_zero
            and run["zero_loss_lesson"] == "03"
        ),
    }


def watch_checks(n: dict) -> dict:
    """When the watch spoke on the fp16 run and what it named, stop_on, and the check-up's probe."""
    run = n["runs"]["fp16"]
    found, raw, first_log = run["findings"], run["raw_loss"], run["plain_logged"][0]["step"]
    first_nan = next((i + 1 for i, v in enumerate(raw) if not math.isfinite(v)), None)
    bad_sums = {name: dtype for name, (dtype, total) in run["weight_sums"].items() if not math.isfinite(total)}
    return {
        "the watch finds nonfinite at the step the pasted callback stops, before the first log": measured(
            run["pasted_step"] is not None and found.get("nonfinite") == run["pasted_step"] < first_log
        ),
        "the raw loss is finite up to the finding's step and NaN at every step after it": measured(
            first_nan is not None
            and first_nan == found.get("nonfinite", 0) + 1
            and not any(math.isfinite(v) for v in raw[first_nan - 1 :])
        ),
        "the non-finite tensors are exactly the pasted callback's, all fp16, and the watch's line names them": measured(
            bool(bad_sums)
            and set(bad_sums) == set(run["pasted_names"])
            and set(bad_sums.values()) == {"float16"}
            and all(name in run["nonfinite_seen"] for name in bad_sums)
        ),
        "stop_on='nonfinite' ends the run at the finding's step": measured(
            run["stopped_step"] == found.get("nonfinite") and run["stopped_step"] < n["train_steps"]
        ),
        "the check-up's fp16_adamw probe fails on the trainer before training": measured(
            run["checkup_fp16_adamw"] == "fail"
        ),
    }


def fix_checks(n: dict) -> dict:
    """float32 weights: finite, learning, silent under the watch; and watching changed no weight."""
    run = n["runs"]["float32"]
    raw = run["raw_loss"]
    return {
        "the watch makes no finding on the float32 run": measured(run["findings"] == {}),
        "the float32 run's raw loss is finite at every step": measured(
            bool(raw) and all(math.isfinite(v) for v in raw)
        ),
        "the float32 run learns: its last 10 steps' mean loss is below its first 10 steps'": measured(
            len(raw) >= 20 and below(sum(raw[-10:]) / 10, sum(raw[:10]) / 10)
        ),
        "the watched and unwatched float32 runs end with bit-identical weights": measured(n["identical"]["float32"]),
    }


def checks(n: dict) -> tuple[dict, dict]:
    """The symptom under the watch, then the fix; every check on today's real code path."""
    return {**log_checks(n), **watch_checks(n)}, fix_checks(n)


def summary(n: dict) -> str:
    """The run in two sentences, from its numbers."""
    bad = n["runs"]["fp16"]
    first = bad["plain_logged"][0]
    return (
        f"fp16 weights with the non-fused AdamW: the watch named the score head non-finite at step "
        f"{bad['findings']['nonfinite']}; the log showed loss {first['loss']:.3f} with grad_norm nan at step "
        f"{first['step']}, then 0. stop_on saved {n['train_steps'] - bad['stopped_step']} of "
        f"{n['train_steps']} steps; float32 weights: no finding; weights bit-identical watched or not."
    )
