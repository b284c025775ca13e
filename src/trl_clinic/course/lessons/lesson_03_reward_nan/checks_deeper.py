"""Lesson 03's deep-dive checks: its claims, asserted on the numbers its last cell records (``check(run, numbers)``).

They see nothing but those numbers (as metrics.json stores them), so tests/test_checks_can_fail.py can hand them the
other run's numbers and see each one fail; ``summary`` is the sentence the workbook's report shows, written from the
same numbers.
"""

import math

from trl_clinic.course.results import above, below, measured


def finite(value: float) -> float:
    """The value when finite, else NaN (which passes no comparison)."""
    return value if value is not None and math.isfinite(value) else math.nan


def today_checks(n: dict) -> dict:
    """What today's stack does with the report's settings: the optimizer default and the dtype spellings."""
    bad, spellings = n["runs"]["without_fix"], n["spellings"]
    step = bad["one_step"]
    return {
        "transformers' default optimizer is the fused AdamW": measured(n["default_optim"] == "adamw_torch_fused"),
        "the fused default hides it: one fused step keeps the weight finite where the non-fused one does not, and "
        "the fused run stays finite": measured(
            all(math.isfinite(v) for v in step["fused"].values())
            and not any(math.isfinite(v) for v in step["non_fused"].values())
            and bool(bad["fused_raw_loss"])
            and all(math.isfinite(v) for v in bad["fused_raw_loss"])
        ),
        "legacy torch_dtype is ignored (the weights stay fp32)": measured(
            "float32" in spellings["{'torch_dtype': 'float16'} on checkpoint-float32"]
        ),
        "'half' is rejected": measured(spellings["{'dtype': 'half'} on checkpoint-float32"].startswith("ValueError")),
        "dtype='float16', or 'auto' on an fp16 checkpoint, gives fp16 trainable weights": measured(
            all("float16" in outcome for outcome in bad["spellings"].values())
        ),
    }


def mechanism_checks(n: dict) -> dict:
    """The first bad tensor, AdamW's state, the spread through clipping."""
    bad = n["runs"]["without_fix"]
    adam, probe = bad["adam"], bad["probe"]
    return {
        "the first bad tensor is the fp16 score head, made so by the update of step 1": measured(
            probe["where"] == "weight"
            and probe["step"] == 1
            and bool(probe["tensors"])
            and all("score" in name for name in probe["tensors"])
        ),
        "v is 0 exactly for the weights whose |g| is below the v threshold (no mismatch)": measured(
            below(adam["mismatches"], 0.5)
        ),
        "the update made exactly those weights non-finite: inf where m survived, "
        "NaN where it underflowed too": measured(
            bool(adam["inf_weights"] + adam["nan_weights"])
            and adam["inf_where_only_v_underflowed"]
            and adam["nan_where_m_underflowed_too"]
        ),
        "the NaN spread to every trainable tensor": measured(
            bool(bad["poisoned"]["non_finite"]) and bad["poisoned"]["non_finite"] == bad["poisoned"]["tensors"]
        ),
    }


def log_checks(n: dict) -> dict:
    """The NaN filter's arithmetic, accumulation, mixed precision and the frozen head."""
    bad = n["runs"]["without_fix"]
    sweep = bad["sweep"]
    counts = sorted(sweep, key=int)
    errors = [
        abs(p - g) / abs(p) if p else abs(g) for row in sweep.values() for p, g in zip(row["replayed"], row["logged"])
    ]
    ratios = [
        sweep[b]["logged"][0] / sweep[a]["logged"][0] if sweep[a]["logged"][0] else math.nan
        for a, b in zip(counts, counts[1:])
    ]
    return {
        "the NaN filter's replay gives every logged number (within 1e-2)": measured(below(max(errors), 1e-2)),
        "the run breaks at every accumulation count: accumulation does not cause the NaN": measured(
            all(row["first_nonfinite_step"] is not None for row in sweep.values())
        ),
        "more accumulation inflates the first logged loss (over 1e3x each step of the sweep)": measured(
            above(min(ratios), 1e3)
        ),
        "at accumulation 32 the log is a huge finite number (> 1e30)": measured(
            above(finite(sweep["32"]["logged"][0]), 1e30)
        ),
        "torch's gradient scaler refuses to unscale fp16 gradients": measured(
            bad["amp"]["grad_scaler"] == "ValueError: Attempting to unscale FP16 gradients."
        ),
        "fp16=True does not rescue fp16 weights (an error or a non-finite loss)": measured(
            bad["amp"]["outcome"] != "trained" or not all(math.isfinite(v) for v in bad["amp"]["raw_loss"])
        ),
        "without SEQ_CLS the head is frozen and not saved": measured(
            not bad["head"]["head_trainable"] and not bad["head"]["score_saved"]
        ),
        "without SEQ_CLS a reload under another seed changes the rewards (> 1e-3)": measured(
            above(bad["head"]["reload_max_reward_change"], 1e-3)
        ),
    }


def fix_checks(n: dict) -> dict:
    """The fix, float32 weights and SEQ_CLS: the same runs finite, the head trained, saved and reloaded."""
    fixed = n["runs"]["with_fix"]
    return {
        "float32 weights stay finite at every accumulation count": measured(
            bool(fixed["sweep"]) and all(row["first_nonfinite_step"] is None for row in fixed["sweep"].values())
        ),
        "fp16=True over float32 weights trains, every raw loss finite": measured(
            fixed["amp"]["outcome"] == "trained"
            and bool(fixed["amp"]["raw_loss"])
            and all(math.isfinite(v) for v in fixed["amp"]["raw_loss"])
        ),
        "with SEQ_CLS the head is trained and saved": measured(
            fixed["head"]["head_trainable"] and fixed["head"]["score_saved"]
        ),
        "the fixed reload reproduces the rewards (within 1e-4)": measured(
            below(fixed["head"]["reload_max_reward_change"], 1e-4)
        ),
    }


def checks(n: dict) -> tuple[dict, dict]:
    """Today's settings, the mechanism and the log; then the fix. All on the real code path."""
    return ({**today_checks(n), **mechanism_checks(n), **log_checks(n)}, fix_checks(n))


def summary(n: dict) -> str:
    """The run in a few sentences, from its numbers."""
    sweep, adam = n["runs"]["without_fix"]["sweep"], n["runs"]["without_fix"]["adam"]
    return (
        f"Today's default fused AdamW kept fp16 weights finite; the non-fused one made {adam['inf_weights']} inf and "
        f"{adam['nan_weights']} NaN weights of the fp16 score head in one step, exactly where its |g| fell below the "
        "v threshold. The NaN filter logged "
        + ", ".join(f"{sweep[k]['logged'][0]:.2g} (accumulation {k})" for k in sorted(sweep, key=int))
        + " for the same NaN run; float32 weights stayed finite. Without SEQ_CLS the head stayed random and unsaved."
    )
