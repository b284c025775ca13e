"""Lesson 05's checks: the claims of the core, asserted on the numbers its last cell records
(``check(run, numbers)``).

They see nothing but those numbers (as metrics.json stores them), so tests/test_checks_can_fail.py can hand them the
other run's numbers and see each one fail; ``summary`` is the sentence the workbook's report shows, written from the
same numbers.
"""

from trl_clinic.course.results import injected, measured


def symptom_checks(n: dict) -> dict:
    """The bf16=True run of the user's script: from the shell and through the portable check."""
    bad = n["runs"]["without_fix"]
    shell = bad["shell"]
    return {
        "from a shell the bf16=True run dies by SIGFPE: exit status 136, "
        "'Floating point exception', no traceback": injected(
            shell["returncode"] == 136
            and "Floating point exception" in (shell["shell_says"] or "")
            and not shell["traceback"]
        ),
        "the portable check reads the bf16=True death as SIGFPE, its stack inside trainer.train": injected(
            bad["check"].startswith("killed by SIGFPE") and "in train" in bad["check"]
        ),
    }


def fix_checks(n: dict) -> dict:
    """The bf16=False run: the same script, settings and stand-in."""
    bad, fixed = n["runs"]["without_fix"], n["runs"]["with_fix"]
    others = [{k: v for k, v in run["settings"].items() if k != "bf16"} for run in (bad, fixed)]
    return {
        "the two runs differ only in bf16 (True, then False), the stand-in attached to both": measured(
            others[0] == others[1]
            and bad["settings"]["bf16"] is True
            and fixed["settings"]["bf16"] is False
            and bad["stand_in"]
            and fixed["stand_in"]
        ),
        "with bf16=False the script finishes from the shell and under the portable check, every step logged": injected(
            fixed["shell"]["returncode"] == 0 and fixed["check"] == "finished" and fixed["steps"] == n["user_steps"]
        ),
    }


def checks(n: dict) -> tuple[dict, dict]:
    return symptom_checks(n), fix_checks(n)


def summary(n: dict) -> str:
    """The run in two sentences, from its numbers."""
    bad, fixed, native = n["runs"]["without_fix"], n["runs"]["with_fix"], n["native_divisions"]
    return (
        f"The user's GRPO script with bf16=True died by {bad['shell']['signal']} from the shell (exit "
        f"{bad['shell']['returncode']}) with no traceback, from a stand-in for the H20's cuBLAS crash; "
        f"with bf16=False, the same stand-in attached, it trained {fixed['steps']} of {n['user_steps']} steps. "
        f"A torch kernel's overflowing integer division "
        f"{'killed its child by SIGFPE' if native['-2**63 // -1'].startswith('killed by SIGFPE') else 'returned'}."
    )
