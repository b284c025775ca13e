"""Lesson 01's checks: the claims of the core, asserted on the numbers its last cell records (``check(run, numbers)``).

They see nothing but those numbers (as metrics.json stores them), so tests/test_checks_can_fail.py can hand them the
other run's numbers and see each one fail; ``summary`` is the sentence the workbook's report shows, written from the
same numbers.
"""

from trl_clinic.course.results import above, below, measured


def old_checks(n: dict, equal: float) -> tuple[dict, dict]:
    """The run without the fix on the real TRL 0.14.0 + transformers 4.48.3, where its side environment ran
    (absent when skipped)."""
    if n["then"]["status"] != "finished":
        return {}, {}
    bad, good = n["runs"]["without_fix"], n["runs"]["with_fix"]
    ratio = bad["losses"]["ratio"]
    symptom = {
        "TRL 0.14 + transformers 4.48.3: padding-free logs over 2x the padded loss at the largest batch": measured(
            above(ratio[-1], 2)
        ),
        "TRL 0.14 + transformers 4.48.3: the ratio grows over 1.05x from each batch size to the next": measured(
            above(min(b / a for a, b in zip(ratio, ratio[1:])), 1.05)
        ),
        "TRL 0.14's padding-free collator sends position_ids and no attention mask": measured(
            n["then"]["collator"]["has_position_ids"] and not n["then"]["collator"]["has_attention_mask"]
        ),
        "transformers 4.48.3 lets tokens attend across sequence boundaries (a count of cells)": measured(
            bad["foreign_cells"] != 0
        ),
    }
    fix = {
        "today's padded loss at batch 1 equals TRL 0.14's (same weights and examples)": measured(
            below(abs(good["losses"]["padded"][0] / bad["losses"]["padded"][0] - 1), equal)
        )
    }
    return symptom, fix


def checks(n: dict) -> tuple[dict, dict]:
    """The run without the fix (symptom) and the run with it (fix) measured the same way, as functions of the
    numbers alone: each run's loss by batch size, its packed row's mask and its portable check."""
    bad, good = n["runs"]["without_fix"], n["runs"]["with_fix"]
    # fp32 on CPU: the two paths differ by float rounding (1e-7); bf16 on a GPU: up to about 1e-2 (8 bits of mantissa)
    equal = 1e-4 if n["precision"] == "fp32" else 2e-2
    first, *later = good["portable"]
    symptom = {
        "portable check flags OPT: a later sequence differs from alone by over 1e-2": measured(
            above(max(bad["portable"][1:]), 1e-2)
        )
    }
    fix = {
        "today's SFTTrainer: padding-free equals padded at every batch size above 1 (same weights)": measured(
            below(max(abs(r - 1) for r in good["losses"]["ratio"][1:]), equal)
        ),
        "today's packed row is block-diagonal (a count of cross-sequence cells: 0)": measured(
            good["foreign_cells"] == 0
        ),
        "portable check: the Llama's later sequences differ no more than rounding": measured(
            below(max(later), 10 * first + equal)
        ),
    }
    old_symptom, old_fix = old_checks(n, equal)
    return {**symptom, **old_symptom}, {**fix, **old_fix}


def summary(n: dict) -> str:
    """The run in one sentence, from its numbers."""
    today, old = n["runs"]["with_fix"]["losses"], n["runs"]["without_fix"]["losses"]
    ratio = (
        f"{old['ratio'][-1]:.1f}x padded on TRL 0.14 + transformers 4.48.3, "
        if n["then"]["status"] == "finished"
        else ""
    )
    return (
        f"At batch {today['batch_sizes'][-1]}, padding-free logged {ratio}{today['ratio'][-1]:.3f}x today "
        f"({today['attention']}), on the same weights; OPT's packed sequences still see each other on today's sdpa."
    )
