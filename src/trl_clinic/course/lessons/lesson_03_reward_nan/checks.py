"""Lesson 03's checks: the claims of the core, asserted on the numbers its last cell records (``check(run, numbers)``).

They see nothing but those numbers (as metrics.json stores them), so tests/test_checks_can_fail.py can hand them the
other run's numbers and see each one fail; ``summary`` is the sentence the workbook's report shows, written from the
same numbers.
"""

import math

from trl_clinic.course.results import above, below, measured


def finite(value: float) -> float:
    """The value when finite, else NaN (which passes no comparison): "a huge finite number" is never inf."""
    return value if math.isfinite(value) else math.nan


def log_checks(bad: dict) -> dict:
    """The report's run (fp16 weights): its log, and the raw loss under it."""
    logged, raw = bad["logged_loss"], bad["raw_loss"]
    replay_error = (
        max((abs(p - q) / abs(p) if p else abs(q) for p, q in zip(bad["replayed_logs"], logged)), default=math.nan)
        if len(bad["replayed_logs"]) == len(logged)
        else math.nan
    )
    return {
        "the first logged loss is a huge finite number (> 1e30)": measured(above(finite(logged[0]), 1e30)),
        "every later logged loss is exactly 0": measured(len(logged) > 1 and all(v == 0.0 for v in logged[1:])),
        "the logged grad norm is NaN at every log": measured(
            bool(bad["logged_grad_norm"]) and all(math.isnan(v) for v in bad["logged_grad_norm"])
        ),
        "the raw loss is finite at step 1 and non-finite at every later step": measured(
            len(raw) > 1 and math.isfinite(raw[0]) and not any(math.isfinite(v) for v in raw[1:])
        ),
        "the NaN filter's arithmetic, replayed on the raw losses, gives every logged number (within 1e-2)": measured(
            below(replay_error, 1e-2)
        ),
    }


def symptom_checks(n: dict) -> dict:
    """The report's run: its log (above), one AdamW step on its dtype, and what the checks say around one step."""
    bad = n["runs"]["without_fix"]
    step = bad["one_adam_step"]
    return {
        **log_checks(bad),
        "one AdamW step on the run's dtype: inf where v underflows, NaN where m does too, finite at g=1e-2": measured(
            math.isfinite(step["0.01"])
            and math.isinf(step["0.001"])
            and math.isnan(step["1e-07"])
            and math.isnan(step["0"])
        ),
        "after one step check_trainable flags the fp16 score head, non-finite, and nothing else": measured(
            bool(bad["check_trainable"])
            and all("score" in p and " inf, " in p and "float16" in p for p in bad["check_trainable"])
        ),
        "the check-up's fp16_adamw probe fails on the report's trainer": measured(
            bad["checkup"]["fp16_adamw"] == "fail"
        ),
    }


def fix_checks(n: dict) -> dict:
    """The same run and checks with float32 weights: finite, learning, and clean to both checks."""
    fixed = n["runs"]["with_fix"]
    return {
        "the fixed run's raw loss is finite at every step": measured(
            bool(fixed["raw_loss"]) and all(math.isfinite(v) for v in fixed["raw_loss"])
        ),
        "the fixed run ranks held-out pairs above chance (accuracy > 0.6)": measured(
            above(fixed["eval_accuracy"], 0.6)
        ),
        "after one step check_trainable finds nothing": measured(fixed["check_trainable"] == []),
        "the check-up's fp16_adamw and reward_head probes are ok on the fixed trainer": measured(
            fixed["checkup"] == {"fp16_adamw": "ok", "reward_head": "ok"}
        ),
    }


def checks(n: dict) -> tuple[dict, dict]:
    """The symptom and its mechanism, then the fix; every check on today's real code path."""
    return symptom_checks(n), fix_checks(n)


def summary(n: dict) -> str:
    """The run in two sentences, from its numbers."""
    bad, fixed = n["runs"]["without_fix"], n["runs"]["with_fix"]
    logged, raw = bad["logged_loss"], bad["raw_loss"]
    first_bad = next((step for step, value in enumerate(raw, 1) if not math.isfinite(value)), None)
    return (
        f"fp16 weights with the non-fused AdamW logged loss {logged[0]:.2g}, grad norm NaN, then {logged[-1]:g}: "
        f"the raw loss was NaN from step {first_bad}, after one AdamW step turned the fp16 score head non-finite. "
        f"float32 weights stayed finite and ranked {fixed['eval_accuracy']:.0%} of held-out pairs right."
    )
