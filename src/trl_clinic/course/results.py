"""A lesson's verdict: the numbers it measured and the claims they were checked against.

Every notebook ends by writing ``metrics.json`` (read by the tests and the workbook report) and then
asserting its checks, so the file records the truth even when a check fails. A lesson's checks live in its folder
(``checks.py``; a deep dive's ``checks_deeper.py``): ``checks(numbers)`` and ``summary(numbers)`` see nothing but the
numbers the notebook recorded, and the notebook's last cell hands them over with ``check(run, numbers)``, which
shows the learner one line per group. Each check says its
kind: ``measured`` on today's real code path, ``recreated`` through an old behaviour re-created on
today's stack, or ``injected`` through a fault put there on purpose (``trl_clinic.course.stand_ins``).
"""

from __future__ import annotations

import importlib
import json
import math
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from trl_clinic.probes.jsonable import json_safe

if TYPE_CHECKING:
    from trl_clinic.course.run import Run

METRICS_FILE = "metrics.json"
KINDS = ("measured", "recreated", "injected")


@dataclass(frozen=True)
class Comparison:
    """A measurement and the line it is held against (``below(error, 1e-4)``, ``above(ratio, 1.5)``).

    A check written as a comparison keeps its value and its threshold in ``metrics.json``, so a test can
    run the same check on the other run's numbers and see where the line sits between the two
    (tests/test_checks_can_fail.py): a threshold loosened past the other run, or drawn so close to one
    run that another seed crosses it, fails there.
    """

    value: float
    op: str  # "<" or ">"
    threshold: float

    def __bool__(self) -> bool:
        # NaN compares false either way: a NaN measurement never passes a check
        return bool(self.value < self.threshold) if self.op == "<" else bool(self.value > self.threshold)


def below(value: float, threshold: float) -> Comparison:
    """``value < threshold``, kept as a comparison (see ``Comparison``)."""
    return Comparison(float(value), "<", float(threshold))


def above(value: float, threshold: float) -> Comparison:
    """``value > threshold``, kept as a comparison (see ``Comparison``)."""
    return Comparison(float(value), ">", float(threshold))


@dataclass(frozen=True)
class Check:
    passed: bool
    kind: str  # one of KINDS: every check says what it rests on
    comparison: Comparison | None = None  # the value and threshold, for a check written as below()/above()


def _check(passed: bool | Comparison, kind: str) -> Check:
    if isinstance(passed, Comparison):
        return Check(bool(passed), kind, passed)
    return Check(passed, kind)


def measured(passed: bool | Comparison) -> Check:
    """A check on a measurement of the real code path (today's libraries, or an old version in its era)."""
    return _check(passed, "measured")


def recreated(passed: bool | Comparison) -> Check:
    """A check whose bad behaviour comes from a re-creation of old library code."""
    return _check(passed, "recreated")


def injected(passed: bool | Comparison) -> Check:
    """A check whose failure was put there on purpose."""
    return _check(passed, "injected")


NON_FINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


def from_json_safe(value: object) -> object:
    """The inverse of ``json_safe`` for numbers: "nan", "inf" and "-inf" strings become floats again."""
    if isinstance(value, dict):
        return {k: from_json_safe(v) for k, v in value.items()}
    if isinstance(value, list):
        return [from_json_safe(v) for v in value]
    return NON_FINITE.get(value, value) if isinstance(value, str) else value


def stored(numbers: dict) -> dict:
    """The numbers exactly as ``metrics.json`` holds them (tuples as lists, keys as strings), non-finite
    floats kept: what a lesson's ``checks`` function sees, in the notebook and in the tests alike."""
    return from_json_safe(json.loads(json.dumps(json_safe(numbers))))


Checks = Callable[[dict], "tuple[dict[str, bool | Check], dict[str, bool | Check]]"]


def _as_check(name: str, value: object) -> Check:
    if not isinstance(value, Check):
        raise TypeError(f"check {name!r} must say its kind: wrap it in measured(), recreated() or injected()")
    check = value
    if not isinstance(check.passed, bool):
        raise TypeError(f"check {name!r} must be a bool, got {check.passed!r}")
    if check.kind not in KINDS:
        raise ValueError(f"check {name!r} has unknown kind {check.kind!r}: choose one of {', '.join(KINDS)}")
    return check


def _record(check: Check) -> dict:
    record = {"passed": check.passed, "kind": check.kind}
    if check.comparison is not None:
        record.update(value=check.comparison.value, op=check.comparison.op, threshold=check.comparison.threshold)
    return record


def _kind_of(checks: dict[str, Check]) -> str:
    """ "measured" only when every check is; otherwise the stand-in kinds involved, so a report never
    says "reproduced" for a re-created or injected symptom without saying so."""
    kinds = sorted({check.kind for check in checks.values()} - {"measured"})
    return " + ".join(kinds) if kinds else "measured"


def save_metrics(
    run: Run, lesson: str, numbers: dict, checks: Checks, eras: list[dict] | None = None, summary: str = ""
) -> dict:
    """Write ``metrics.json`` with the verdict of ``checks(numbers)``: a pair of dicts, the checks that
    the bad run shows the failure (symptom) and those that the fixed run does not (fix). Each check is
    ``measured(...)``, ``recreated(...)`` or ``injected(...)``: a plain bool is refused.

    ``checks`` sees nothing but the numbers as ``metrics.json`` stores them, so a test can feed it the
    numbers of a run without the bug, or without the fix, and see it report failure: a check that
    cannot fail is not a check. ``eras``: the records of the lesson's runs of real old code
    (``EraRun.to_metrics()``); a skipped or failed era is listed as such, and its checks are absent.
    ``summary``: one or two sentences a workshop participant can read, written from this run's numbers;
    the report shows it instead of raw metric keys.

    Nothing passes by vanishing: an empty group (every check of it left out) is neither reproduced nor
    verified, and a lesson whose era did not finish is ``complete: false`` (the runner reports it as
    incomplete, never as passed).
    """
    if not isinstance(summary, str):
        raise TypeError(f"summary must be a str, got {type(summary).__name__}")
    symptom, fix = checks(stored(numbers))
    groups = {
        "symptom": {name: _as_check(name, value) for name, value in symptom.items()},
        "fix": {name: _as_check(name, value) for name, value in fix.items()},
    }
    payload = {
        "lesson": lesson,
        "summary": summary,
        "profile": run.profile,
        "seed": run.seed,
        "symptom_reproduced": bool(groups["symptom"]) and all(c.passed for c in groups["symptom"].values()),
        "symptom_kind": _kind_of(groups["symptom"]),
        "fix_verified": bool(groups["fix"]) and all(c.passed for c in groups["fix"].values()),
        "fix_kind": _kind_of(groups["fix"]),
        "complete": all(record["status"] == "finished" for record in eras or []),
        "checks": {group: {name: _record(check) for name, check in checks.items()} for group, checks in groups.items()},
        "eras": [
            {key: record[key] for key in ("era", "script", "status", "message", "versions")} for record in eras or []
        ],
        "sizes": dict(run.sizes),
        "numbers": numbers,
        "versions": run.versions,
        "device": run.device_report(),
    }
    payload = json_safe(payload)
    (run.output_dir / METRICS_FILE).write_text(json.dumps(payload, indent=2))
    return payload


def failed_checks(metrics: dict) -> list[str]:
    """The checks that failed, and a group left empty (every check of it absent) as a failure of its own."""
    failed = [name for group in metrics["checks"].values() for name, check in group.items() if not check["passed"]]
    return failed + [f"no {group} check ran" for group, checks in metrics["checks"].items() if not checks]


def eras_not_run(metrics: dict) -> list[str]:
    """The eras of this lesson that did not finish, each with its message ("skipped: ...", "failed: ...")."""
    return [f"{record['era']}: {record['message']}" for record in metrics["eras"] if record["status"] != "finished"]


def conclude(metrics: dict, output_dir: str | Path) -> None:
    """A notebook's last words: raise when a check failed or a group was left empty; otherwise say that the
    checks passed, or, when an era did not run, that the lesson is incomplete and which part is missing."""
    failed = failed_checks(metrics)
    if failed:
        raise AssertionError(f"checks failed: {failed}")
    missing = eras_not_run(metrics)
    where = Path(output_dir) / METRICS_FILE
    if missing:
        print(
            f"INCOMPLETE: the checks that ran passed, but the old versions' part did not run ({'; '.join(missing)}); "
            f"metrics in {where}"
        )
    else:
        print(f"all checks passed; metrics in {where}")


def load_metrics(output_dir: str | Path) -> dict:
    return json.loads((Path(output_dir) / METRICS_FILE).read_text())


def lesson_checks(lesson: str):
    """The module of lesson ``lesson``'s checks: ``checks.py`` in its folder (``checks_deeper.py`` for a deep dive),
    with ``checks(numbers)`` and ``summary(numbers)``."""
    from trl_clinic.course.lessons import lessons

    entry = lessons()[lesson]
    name = "checks" if entry.is_core else "checks_deeper"
    return importlib.import_module(f"{__package__}.lessons.{entry.folder.name}.{name}")


def group_line(group: str, checks: dict) -> str:
    """One line per check group for the learner: how many passed, how they were decided, and which failed."""
    failed = [name for name, check in checks.items() if not check["passed"]]
    kinds = sorted({check["kind"] for check in checks.values()})
    line = f"{group}: {len(checks) - len(failed)} of {len(checks)} checks passed ({', '.join(kinds) or 'none'})"
    return line + (f"; failed: {'; '.join(failed)}" if failed else "")


def check(run: Run, numbers: dict, eras: list[dict] | None = None) -> None:
    """A notebook's last call: its recorded ``numbers`` checked by its lesson's checks, ``metrics.json`` written with
    the summary those numbers give, the summary and one line per group shown, then ``conclude``: a failed check
    stops the run (papermill, the workbook) with the names of the checks that failed. It returns nothing, so the
    cell shows no more than those lines (the metrics are in ``metrics.json``)."""
    module = lesson_checks(run.lesson)
    summary = module.summary(stored(numbers))
    metrics = save_metrics(run, run.lesson, numbers, module.checks, eras, summary=summary)
    print(textwrap.fill(summary, width=116))
    for group in ("symptom", "fix"):
        print(group_line(group, metrics["checks"][group]))
    conclude(metrics, run.output_dir)
