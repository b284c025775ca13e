"""Lesson 02b's checks: the claims of the core, asserted on the numbers its last cell records (``check(run, numbers)``).

They see nothing but those numbers (as metrics.json stores them), so tests/test_checks_can_fail.py can hand them the
other run's numbers and see each one fail; ``summary`` is the sentence the workbook's report shows, written from the
same numbers.
"""

from trl_clinic.course.results import above, below, measured


def checks(n: dict) -> tuple[dict, dict]:
    """The claims above as functions of the numbers alone: the symptom's read the per-process run, the fix's the
    run that counts across processes (a test swaps the two runs and expects each group to fail)."""
    bad, good = n["runs"]["per-process"], n["runs"]["across processes"]
    unequal = [len({sum(c) for c in per_rank}) > 1 for per_rank in n["label_counts"].values()]
    symptom = {
        "the processes saw different numbers of label tokens at every accumulation count": measured(all(unequal)),
        "per-process num_items_in_batch misses the big batch at every count (> 1e-2)": measured(
            above(min(r["relative_error"] for r in bad["comparison"]), 1e-2)
        ),
        "the per-process gradient is (S0/N0 + S1/N1) / W by hand (< 1e-4)": measured(below(bad["by_hand"], 1e-4)),
        "the checkup probe warns on the per-process trainer": measured("warn" in bad["probe"]),
    }
    fix = {
        "the reference saw as many label tokens as the processes together": measured(n["same_samples"]),
        "the portable check's one-process gradient is the reference (< 1e-6)": measured(
            below(n["portable_vs_reference"], 1e-6)
        ),
        "counts across processes match the big batch at every count (< 1e-4)": measured(
            below(max(r["relative_error"] for r in good["comparison"]), 1e-4)
        ),
        "the checkup probe passes the trainer that counts across processes": measured(good["probe"] == ["ok"]),
    }
    return symptom, fix


def summary(n: dict) -> str:
    """The run in one sentence, from its numbers."""
    bad, good = n["runs"]["per-process"], n["runs"]["across processes"]
    worst = max(r["relative_error"] for r in bad["comparison"])
    fixed_error = max(r["relative_error"] for r in good["comparison"])
    return (
        f"On {n['processes']} processes over {n['backend']}, per-process num_items_in_batch "
        f"(average_tokens_across_devices=False) was up to {worst:.0%} off one process with the whole batch, exactly "
        f"the per-process weighting (by hand {bad['by_hand']:.0e}); average_tokens_across_devices=True "
        f"matched to {fixed_error:.0e}."
    )
