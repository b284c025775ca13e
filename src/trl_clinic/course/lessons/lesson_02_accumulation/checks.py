"""Lesson 02's checks: the claims of the core, asserted on the numbers its last cell records (``check(run, numbers)``).

They see nothing but those numbers (as metrics.json stores them), so tests/test_checks_can_fail.py can hand them the
other run's numbers and see each one fail; ``summary`` is the sentence the workbook's report shows, written from the
same numbers.
"""

from trl_clinic.course.results import above, below, measured


def bad_checks(n: dict) -> dict:
    """Without the fix (``runs["without_fix"]``): the symptom, its mechanism by hand, training, the checks that
    flag it."""
    bad, good = n["runs"]["without_fix"], n["runs"]["with_fix"]
    return {
        "Qwen2.5-VL declares no loss kwargs": measured(not n["model"]["accepts_loss_kwargs"]),
        "without the fix the Trainer counts no tokens for it": measured(not bad["trainer_counts_tokens"]),
        "batch 1 x N misses batch N's gradient (relative error > 1e-2)": measured(above(bad["relative_error"], 1e-2)),
        "batch 1 x N's gradient points elsewhere (1 - cosine > 1e-2)": measured(above(1 - bad["cosine"], 1e-2)),
        "batch 1 x N's gradient is the mean of per-row means by hand (< 1e-4)": measured(
            below(bad["vs_mean_of_means"], 1e-4)
        ),
        "trained without the fix, the held-out loss ends over 1.1x the fixed run's": measured(
            above(bad["held_out"][-1] / good["held_out"][-1], 1.1)
        ),
        "the portable check flags the trainer without the fix at every other count (> 1e-2)": measured(
            above(min(bad["sweep"]), 1e-2)
        ),
        "the checkup probe fails the trainer without the fix": measured("fail" in bad["probe"]),
    }


def good_checks(n: dict) -> dict:
    """With the fix (``runs["with_fix"]``): batch 1 x N is batch N, and the portable check and the probe say so."""
    good = n["runs"]["with_fix"]
    return {
        "batch N's gradient is the mean over all label tokens by hand (< 1e-4)": measured(
            below(n["big_vs_token_mean"], 1e-4)
        ),
        "with the fix batch 1 x N matches batch N (< 1e-4)": measured(below(good["relative_error"], 1e-4)),
        "the portable check passes the trainer with the fix at every other count (< 1e-4)": measured(
            below(max(good["sweep"]), 1e-4)
        ),
        "the checkup probe passes the trainer with the fix": measured(good["probe"] == ["ok"]),
    }


def checks(n: dict) -> tuple[dict, dict]:
    """The claims above as functions of the numbers alone (a test swaps the two runs and expects each group to fail)."""
    return bad_checks(n), good_checks(n)


def summary(n: dict) -> str:
    """The run in one sentence, from its numbers."""
    bad, good, N, counts = n["runs"]["without_fix"], n["runs"]["with_fix"], n["accumulation"], n["window_label_tokens"]
    return (
        f"Today's SFTTrainer on {n['model']['class']} (it declares no loss kwargs): batch 1 x {N} missed "
        f"batch {N}'s gradient by {bad['relative_error']:.0%} (cosine {bad['cosine']:.2f}), exactly the mean of "
        f"per-row means, which weighs a short answer's tokens {max(counts) / min(counts):.0f}x a long one's; trained "
        f"{bad['held_out_steps'][-1]} steps it ended at held-out loss {bad['held_out'][-1]:.2f} against "
        f"{good['held_out'][-1]:.2f} with trainer.model_accepts_loss_kwargs = True, which matched batch {N} to "
        f"{good['relative_error']:.0e}."
    )
