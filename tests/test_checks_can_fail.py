"""Every check can fail, for the reason it names: each notebook's ``checks`` function, fed the numbers of the
other run, reports the checks that run breaks as failed, and each threshold sits between the two runs.

Each lesson's checks live in its folder (``checks.py``; a deep dive's ``checks_deeper.py``), which imports
nothing but math and the check kinds, so they can use nothing but the numbers. The numbers of a real cpu run at
seed 0 are kept in the lesson's folder, ``numbers.json`` and ``numbers_deeper.json`` (refresh them with
``python tools/refresh_numbers.py OUT`` after a ``trl-clinic run --profile cpu --seed 0``). ``mutations.py``
(a deep dive's: ``mutations_deeper.py``) in the lesson's folder holds, for that lesson:

* ``OTHER_RUN``: for each group, a function that puts the other run's complete numbers where the group reads
  its own (``"symptom"``: the fixed run's numbers in place of the bad run's; ``"fix"``: the bad run's in place
  of the fixed run's). Every check of the group must fail on them: whole runs, not one field moved into a
  state no run has.
* ``SHARED``: the checks both runs pass by design (a precondition of the experiment, such as the model class
  both runs train), each with the reason; these keep a one-field mutation in ``MUTATIONS``, a value a real run
  could produce, and so does a threshold check whose smallest failure sits nearer its line than the other run's.
* ``MARGINS``: for each check written as ``below()``/``above()``, shared ones included, how far the lesson argues
  its threshold sits from its own run and from the value it must fail, the other run's or its mutation's
  (``log(own, other)``: factors; ``linear(own, other)``: differences; ``at_most``: a bound from its own run
  where there is no such value). The test measures both on the fixture and on those numbers, and moves each
  threshold tenfold toward the value it must fail (halfway, where that is nearer): tightened toward its own
  run, or loosened that far, a threshold fails here.
* ``gpu_shape``: the cpu numbers reshaped to the gpu profile's sizes (what it tests is the checks' indexing
  and their thresholds' arguments at those sizes, not a GPU's numbers).
"""

import ast
import copy
import importlib.util
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from trl_clinic.course import results
from trl_clinic.course.lessons import lessons
from trl_clinic.course.results import Check, Comparison, from_json_safe

ROOT = Path(__file__).resolve().parents[1]
LESSONS = lessons()


def in_folder(key: str, stem: str, suffix: str) -> Path:
    """A file of the lesson's folder: ``mutations.py``/``numbers.json`` for a core, ``..._deeper`` for a deep dive."""
    lesson = LESSONS[key]
    return lesson.folder / f"{stem}{'' if lesson.is_core else '_deeper'}{suffix}"


def lesson_checks(key: str):
    """The lesson's ``checks`` function, from its folder's checks module (``checks.py``, ``checks_deeper.py``)."""
    return checks_module(key).checks


def checks_module(key: str):
    return results.lesson_checks(key)


def mutations(key: str) -> dict:
    return table(key).MUTATIONS


def table(key: str):
    """The lesson folder's mutations module: MUTATIONS, and gpu_shape (the cpu numbers in the gpu profile's shape)."""
    lesson = LESSONS[key]
    return importlib.import_module(
        f"trl_clinic.course.lessons.{lesson.folder.name}.{in_folder(key, 'mutations', '').name}"
    )


def baseline(key: str) -> dict:
    return from_json_safe(json.loads(in_folder(key, "numbers", ".json").read_text()))


def verdict(key: str, numbers: dict) -> dict[str, Check]:
    symptom, fix = lesson_checks(key)(numbers)
    return {**symptom, **fix}


def parts_of(part) -> tuple[str, ...]:
    return part if isinstance(part, tuple) else (part,)


def named(part, names) -> set[str]:
    return {name for name in names if any(p in name for p in parts_of(part))}


def test_every_lesson_has_its_mutations_and_fixture():
    """Each notebook: a mutation table and the numbers of a real run, in its lesson's folder."""
    for key in lessons():
        for path in (in_folder(key, "mutations", ".py"), in_folder(key, "numbers", ".json")):
            assert path.is_file(), f"lesson {key}: no {path.name} in {path.parent.name}/"


@pytest.mark.parametrize("key", LESSONS)
def test_the_real_runs_numbers_pass_every_check_and_each_says_its_kind(key):
    checks = verdict(key, baseline(key))
    assert all(isinstance(check, Check) for check in checks.values()), (
        f"lesson {key}: wrap each check in measured(), recreated() or injected()"
    )
    assert all(check.passed for check in checks.values()), [name for name, c in checks.items() if not c.passed]


def groups(key: str, numbers: dict) -> dict[str, dict[str, Check]]:
    symptom, fix = lesson_checks(key)(numbers)
    return {"symptom": symptom, "fix": fix}


def shared(key: str) -> dict[str, str]:
    return getattr(table(key), "SHARED", {})


def is_shared(key: str, name: str) -> bool:
    return any(part in name for part in shared(key))


@pytest.mark.parametrize("key", LESSONS)
def test_each_lesson_mutates_whole_runs(key):
    """OTHER_RUN for both groups; one-field mutations only for the checks both runs share, each with a reason, and for
    a threshold check the smallest failure it is for, nearer its line than the other run's (a count of 1 where the
    other run shows 17, a packed row the other run does not record)."""
    other = getattr(table(key), "OTHER_RUN", None)
    assert other is not None and set(other) == {"symptom", "fix"}, (
        f"lesson {key}: its mutations module needs OTHER_RUN per group"
    )
    names = verdict(key, baseline(key))
    for part, reason in shared(key).items():
        assert sum(part in name for name in names) == 1, f"SHARED {part!r} must name exactly one check of {key}"
        assert reason.strip(), f"SHARED {part!r}: say why both runs pass it"
    for part in mutations(key):
        for p in parts_of(part):
            assert sum(p in name for name in names) == 1, f"{p!r} must name exactly one check of lesson {key}"
            assert is_shared(key, p) or any(p in s_ for s_ in shared(key)) or nearer_than_the_other_run(key, p), (
                f"lesson {key}: {p!r} has a one-field mutation but is neither SHARED nor a failure nearer its line "
                "than the other run's: the other run must fail it"
            )
    for name in names:
        if is_shared(key, name):
            assert any(named(part, [name]) for part in mutations(key)), f"{key}: shared {name!r} has no mutation"


@pytest.mark.parametrize("key, group", [(key, group) for key in LESSONS for group in ("symptom", "fix")])
def test_the_other_run_fails_every_check_of_the_group(key, group):
    """The fixed run's numbers fail every symptom check; the bad run's fail every fix check (shared ones aside)."""
    numbers = table(key).OTHER_RUN[group](copy.deepcopy(baseline(key)))
    checks = groups(key, numbers)[group]
    assert checks, f"lesson {key}: the {group} group is empty on the other run"
    passing = [name for name, check in checks.items() if check.passed and not is_shared(key, name)]
    assert not passing, f"lesson {key}: on the other run's numbers these {group} checks still pass: {passing}"


@pytest.mark.parametrize("key, part", [(key, part) for key in LESSONS for part in mutations(key)])
def test_a_shared_precondition_fails_alone_when_its_run_changes_it(key, part):
    numbers = copy.deepcopy(baseline(key))
    mutations(key)[part](numbers)
    checks = verdict(key, numbers)
    failed = {name for name, check in checks.items() if not check.passed}
    assert failed == named(part, checks), f"lesson {key}, mutation {part!r}: failed {sorted(failed)}"


def margins(key: str) -> dict:
    return getattr(table(key), "MARGINS", {})


def sides(op: str, threshold: float, own: float, other: float, scale: str) -> tuple[float, float]:
    """How far the threshold sits from the run's own value (on the side where the check passes) and from the
    value it must fail (on the other side): factors on the log scale, differences on the linear one. A NaN, or
    a 0 beyond the line, is infinitely far (every threshold fails it)."""
    if scale == "linear":
        gaps = (threshold - own, other - threshold) if op == "<" else (own - threshold, threshold - other)
        return tuple(math.inf if math.isnan(g) else g for g in gaps)
    small, large = (own, threshold) if op == "<" else (threshold, own)
    own_side = math.inf if small == 0 and large > 0 else large / small
    small, large = (threshold, other) if op == "<" else (other, threshold)
    other_side = math.inf if math.isnan(other) or (small == 0 and large > 0) else large / small
    if min(own, threshold, other) < 0:
        raise AssertionError(f"a log margin needs numbers >= 0, got {own}, {threshold}, {other}: use linear()")
    return own_side, other_side


def loosened(op: str, threshold: float, other: float, scale: str) -> float:
    """The threshold moved toward the value it must fail: tenfold, or halfway to that value where that is nearer
    (halfway on the margin's scale: the geometric mean on the log scale, the mean on the linear one). The smallest
    loosening a test must see, for every check (AUDIT G.2)."""
    up = op == "<"  # a "<" line loosens upward, a ">" line downward
    if threshold <= 0:  # a linear line at 0 or below has no tenfold: halfway
        return (threshold + other) / 2
    tenfold = threshold * 10 if up else threshold / 10
    if not math.isfinite(other):
        return tenfold
    halfway = math.sqrt(threshold * other) if scale == "log" else (threshold + other) / 2
    return min(tenfold, halfway) if up else max(tenfold, halfway)


def test_a_line_is_loosened_tenfold_or_halfway_whichever_is_nearer():
    """The loosening the margins must see: a "< 1e-4" line held against 1.16 moves tenfold, to 1e-3; a "> 2" line
    held against 1.0 moves halfway (geometric), to 1.41; a count's "< 0.5" against 1 moves halfway, to 0.75; with no
    value to move toward (NaN), tenfold."""
    assert loosened("<", 1e-4, 1.16, "log") == pytest.approx(1e-3)
    assert loosened(">", 2.0, 1.0, "log") == pytest.approx(math.sqrt(2))
    assert loosened("<", 0.5, 1, "linear") == pytest.approx(0.75)
    assert loosened(">", 1e-3, 0.0, "log") == pytest.approx(1e-4)
    assert loosened("<", 0.7, math.nan, "log") == pytest.approx(7.0)


@dataclass(frozen=True)
class Line:
    """One check written as below()/above(): its comparison on the fixture, the value it sees on the numbers it
    must fail, and the margin its lesson argues (``(scale, own, other, at_most)``, None where MARGINS has not one
    entry)."""

    group: str
    name: str
    comparison: Comparison
    failing: float
    margin: tuple | None


def failing_numbers(key: str, group: str, name: str) -> dict:
    """The numbers a check must fail: its mutation where MUTATIONS names it (a shared check, or one the other run
    fails without a number to hold against its line), else the other run's (``OTHER_RUN``)."""
    numbers = copy.deepcopy(baseline(key))
    for part, mutate in mutations(key).items():
        if named(part, [name]):
            mutate(numbers)
            return numbers
    return table(key).OTHER_RUN[group](numbers)


def value_on(key: str, group: str, name: str, numbers: dict) -> float:
    """The check's value on ``numbers``; NaN where it decides with no comparison there (a row not recorded)."""
    check = groups(key, numbers)[group].get(name)
    return math.nan if check is None or check.comparison is None else check.comparison.value


def nearer_than_the_other_run(key: str, part: str) -> bool:
    """Whether the check ``part`` names is a threshold check whose mutation sits nearer its line than the other
    run's value (NaN, a number not recorded, is infinitely far)."""
    for line in (line for line in lines(key) if part in line.name and line.margin is not None):
        other = value_on(key, line.group, line.name, table(key).OTHER_RUN[line.group](copy.deepcopy(baseline(key))))
        op, threshold, own, scale = line.comparison.op, line.comparison.threshold, line.comparison.value, line.margin[0]
        return sides(op, threshold, own, line.failing, scale)[1] < sides(op, threshold, own, other, scale)[1]
    return False


def argued(key: str, name: str) -> list[tuple]:
    return [margin for part, margin in margins(key).items() if part in name]


def lines(key: str) -> list[Line]:
    """Every check of the lesson written as below()/above(), shared ones included."""
    found = []
    for group, checks in groups(key, baseline(key)).items():
        for name, check in checks.items():
            if check.comparison is not None:
                margin = argued(key, name)
                failing = value_on(key, group, name, failing_numbers(key, group, name))
                found.append(Line(group, name, check.comparison, failing, margin[0] if len(margin) == 1 else None))
    return found


@pytest.mark.parametrize("key", LESSONS)
def test_every_threshold_check_has_one_margin(key):
    """Each check written as below()/above() has one entry in MARGINS, and nothing else has one."""
    problems = [
        f"{line.name!r}: {len(argued(key, line.name))} MARGINS entries (one needed)"
        for line in lines(key)
        if line.margin is None
    ]
    for name, check in verdict(key, baseline(key)).items():
        if check.comparison is None and argued(key, name):
            problems.append(f"{name!r} has a margin but no below()/above()")
    assert not problems, f"lesson {key}:\n" + "\n".join(problems)


def placed(line: Line, threshold: float) -> str:
    """Where ``threshold`` sits against the line's two values and its argued margin, for a failure message."""
    scale, own_margin, other_margin, at_most = line.margin
    got_own, got_other = sides(line.comparison.op, threshold, line.comparison.value, line.failing, scale)
    return (
        f"{line.comparison.op} {threshold:g} sits {got_own:.3g} from its own run ({line.comparison.value:.3g}, argued "
        f"{own_margin:g} to {at_most:g}) and {got_other:.3g} from the value it must fail ({line.failing:.3g}, argued "
        f"{other_margin:g})"
    )


def within(line: Line, threshold: float) -> bool:
    """Whether ``threshold`` keeps the line's argued margin: at least ``own`` (and at most ``at_most``) from its own
    value, at least ``other`` from the value it must fail."""
    scale, own_margin, other_margin, at_most = line.margin
    got_own, got_other = sides(line.comparison.op, threshold, line.comparison.value, line.failing, scale)
    return own_margin <= got_own <= at_most and got_other >= other_margin


@pytest.mark.parametrize("key", LESSONS)
def test_every_threshold_sits_between_the_runs_with_the_argued_margin(key):
    """On the fixture and on the numbers it must fail (the other run's, or the check's mutation), each line is at
    least its argued margin from each value (and at most ``at_most`` from its own): tightening it toward its own run
    fails here, and so does loosening it past the margin on the other side."""
    problems = [
        f"{line.name!r}: {placed(line, line.comparison.threshold)}"
        for line in lines(key)
        if line.margin is not None and not within(line, line.comparison.threshold)
    ]
    assert not problems, f"lesson {key}:\n" + "\n".join(problems)


@pytest.mark.parametrize("key", LESSONS)
def test_a_threshold_loosened_toward_the_failure_breaks_its_argued_margin(key):
    """Every threshold moved tenfold toward the value its check must fail, or halfway to it where that is nearer,
    falls short of its argued margin on that side (or strays past ``at_most`` from its own), so the test above fails:
    no check's line can be loosened that far unseen. A check the other run fails without a number (a row it does not
    record, NaN) names its failure with a mutation, as a shared check does, or bounds its line from its own run."""
    problems = []
    for line in (line for line in lines(key) if line.margin is not None):
        threshold = loosened(line.comparison.op, line.comparison.threshold, line.failing, line.margin[0])
        if within(line, threshold):
            problems.append(f"{line.name!r} loosened: {placed(line, threshold)}")
    assert not problems, f"lesson {key}:\n" + "\n".join(problems)


@pytest.mark.parametrize("key", LESSONS)
def test_threshold_checks_are_written_as_comparisons(key):
    """A check that compares a number with a constant is written below()/above(), so its margin is tested."""
    tree = ast.parse(Path(checks_module(key).__file__).read_text())
    bare = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and getattr(node.func, "id", None) in ("measured", "recreated", "injected")
            and node.args
            and isinstance(node.args[0], ast.Compare)
            and any(isinstance(c, ast.Constant) and isinstance(c.value, (int, float)) for c in ast.walk(node.args[0]))
            and any(isinstance(op, (ast.Lt, ast.Gt, ast.LtE, ast.GtE)) for op in node.args[0].ops)
        ):
            bare.append(ast.unparse(node)[:100])
    assert not bare, f"lesson {key}: threshold checks not written as below()/above(): {bare}"


@pytest.mark.parametrize("key", LESSONS)
def test_the_checks_see_nothing_but_the_numbers(key):
    """A checks module imports math and the check kinds, nothing else (no torch, no companion, no notebook state):
    what it checks is what the notebook recorded, and a test can hand it any run's numbers."""
    tree = ast.parse(Path(checks_module(key).__file__).read_text())
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert imported <= {"math", "trl_clinic.course.results", "__future__"}, f"lesson {key} imports {sorted(imported)}"
    assert callable(getattr(checks_module(key), "summary", None)), f"lesson {key}: its checks module has no summary()"
    assert isinstance(checks_module(key).summary(baseline(key)), str)


@pytest.mark.parametrize("key", [key for key in LESSONS if "then" in baseline(key)])
def test_a_skipped_era_leaves_its_checks_out_rather_than_passing_them(key):
    numbers = baseline(key)
    eras = numbers["then"]
    for record in eras.values() if "status" not in eras else [eras]:
        record["status"] = "skipped"
    skipped = verdict(key, numbers)
    assert all(check.passed for check in skipped.values())
    dropped = set(verdict(key, baseline(key))) - set(skipped)
    assert dropped and all(re.search(r"\d+\.\d+", name) for name in dropped), dropped  # each names its version


def test_deep_dive_02s_bisect_is_left_out_when_no_index_listed_it_and_fails_when_undecided():
    """Section 7 bisects transformers 4.45.0..4.46.0: offline (no index) its checks are left out, as a skipped
    era's; a search a failed build left undecided is a failure, not a pass."""
    named = [name for name in verdict("02-deeper", baseline("02-deeper")) if "bisect" in name or "4.46.0" in name]
    assert len(named) == 3
    numbers = baseline("02-deeper")
    numbers["bisect"] = {"status": "skipped", "reason": "pip could not list transformers's versions"}
    assert not set(named) & set(verdict("02-deeper", numbers))
    numbers["bisect"] = {**baseline("02-deeper")["bisect"], "status": "undecided", "first": None, "last_same": None}
    numbers["bisect"]["parts"] = []
    assert not any(verdict("02-deeper", numbers)[name].passed for name in named[:2])


@pytest.mark.parametrize("key", LESSONS)
def test_the_checks_hold_on_numbers_of_the_gpu_shape(key):
    """The gpu sizes have never run on a GPU here, so each notebook's checks are run on the cpu run's
    numbers reshaped to the gpu profile's sizes (longer sweeps, other batch sizes, more steps): a check that
    indexes the cpu shape, or a threshold argued for the cpu sizes only, fails here first."""
    assert hasattr(table(key), "gpu_shape"), f"lesson {key}: its mutations module has no gpu_shape(numbers, sizes)"
    gpu = table(key).gpu_shape(copy.deepcopy(baseline(key)), dict(lessons()[key].sizes("gpu")))
    checks = verdict(key, gpu)
    assert all(check.passed for check in checks.values()), [name for name, c in checks.items() if not c.passed]
