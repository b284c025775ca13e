"""Every check can fail: each notebook's ``checks`` function, fed the numbers of a run without the bug
(or without the fix), reports exactly the checks that such a run breaks as failed.

The ``checks`` cells of each notebook (tag ``checks``) are read from its percent-format source and run on
their own, so they can use nothing but the numbers. The numbers of a real cpu run at seed 0 are kept in
``tests/fixtures/numbers/<key>.json`` (refresh them with ``python tests/fixtures/refresh.py OUT`` after a
``trl-clinic run --profile cpu --seed 0``). ``tests/mutations/<key>.py`` holds one mutation per check: the
part of the check's name it matches (or a tuple of parts, where one realistic change breaks several checks)
and a change of the numbers that a real run without the bug, or without the fix, could produce (a value of
the other run, not an impossible one). The test asserts that exactly the named checks fail, no more, no less.
A check made constant, or a new check without a mutation, fails here loudly.
"""

import copy
import importlib.util
import json
import math
import re
import sys
from pathlib import Path

import jupytext
import pytest

from trl_clinic.course.lessons import lessons
from trl_clinic.course.results import Check, from_json_safe, injected, measured, recreated

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures" / "numbers"
MUTATIONS_DIR = ROOT / "tests" / "mutations"
LESSONS = {key: lesson for key, lesson in lessons().items() if (MUTATIONS_DIR / f"{key}.py").exists()}


def lesson_checks(key: str):
    """The notebook's ``checks`` function, defined with nothing but math and the check kinds at hand (the
    cells tagged ``checks``, in order: a long list of claims may span several short cells)."""
    source = ROOT / "sources" / f"{LESSONS[key].notebook}.py"
    cells = [cell for cell in jupytext.read(source).cells if "checks" in cell.metadata.get("tags", [])]
    assert cells, f"{source.name} has no cell tagged 'checks'"
    namespace = {"math": math, "measured": measured, "recreated": recreated, "injected": injected}
    for cell in cells:
        exec(cell.source, namespace)
    return namespace["checks"]


def mutations(key: str) -> dict:
    return table(key).MUTATIONS


def table(key: str):
    """The module tests/mutations/<key>.py: MUTATIONS, and gpu_shape (the cpu numbers in the gpu profile's shape)."""
    sys.path.insert(0, str(MUTATIONS_DIR))
    try:
        spec = importlib.util.spec_from_file_location(f"mutations_{key.replace('-', '_')}", MUTATIONS_DIR / f"{key}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(MUTATIONS_DIR))
    return module


def baseline(key: str) -> dict:
    return from_json_safe(json.loads((FIXTURES / f"{key}.json").read_text()))


def verdict(key: str, numbers: dict) -> dict[str, Check]:
    symptom, fix = lesson_checks(key)(numbers)
    return {**symptom, **fix}


def parts_of(part) -> tuple[str, ...]:
    return part if isinstance(part, tuple) else (part,)


def named(part, names) -> set[str]:
    return {name for name in names if any(p in name for p in parts_of(part))}


def test_every_lesson_has_its_mutations_and_fixture():
    """Each notebook in lessons.yaml: a mutation table and the numbers of a real run."""
    for key in lessons():
        assert (MUTATIONS_DIR / f"{key}.py").exists(), f"no tests/mutations/{key}.py"
        assert (FIXTURES / f"{key}.json").exists(), f"no tests/fixtures/numbers/{key}.json"


@pytest.mark.parametrize("key", LESSONS)
def test_the_real_runs_numbers_pass_every_check_and_each_says_its_kind(key):
    checks = verdict(key, baseline(key))
    assert all(isinstance(check, Check) for check in checks.values()), (
        f"lesson {key}: wrap each check in measured(), recreated() or injected()"
    )
    assert all(check.passed for check in checks.values()), [name for name, c in checks.items() if not c.passed]


@pytest.mark.parametrize("key", LESSONS)
def test_every_check_has_a_mutation(key):
    names = verdict(key, baseline(key))
    for part in mutations(key):
        for p in parts_of(part):
            assert sum(p in name for name in names) == 1, f"{p!r} must name exactly one check of lesson {key}"
    unmatched = [name for name in names if not any(named(part, [name]) for part in mutations(key))]
    assert not unmatched, f"lesson {key}: checks without a mutation that makes them fail: {unmatched}"


@pytest.mark.parametrize("key, part", [(key, part) for key in LESSONS for part in mutations(key)])
def test_exactly_the_named_checks_fail_on_a_run_without_the_bug_or_the_fix(key, part):
    numbers = copy.deepcopy(baseline(key))
    mutations(key)[part](numbers)
    checks = verdict(key, numbers)
    failed = {name for name, check in checks.items() if not check.passed}
    assert failed == named(part, checks), f"lesson {key}, mutation {part!r}: failed {sorted(failed)}"


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


@pytest.mark.parametrize("key", LESSONS)
def test_the_checks_hold_on_numbers_of_the_gpu_shape(key):
    """The gpu sizes have never run on a GPU here, so each notebook's checks are run on the cpu run's
    numbers reshaped to the gpu profile's sizes (longer sweeps, other batch sizes, more steps): a check that
    indexes the cpu shape, or a threshold argued for the cpu sizes only, fails here first."""
    assert hasattr(table(key), "gpu_shape"), f"tests/mutations/{key}.py has no gpu_shape(numbers, sizes)"
    gpu = table(key).gpu_shape(copy.deepcopy(baseline(key)), dict(lessons()[key].sizes("gpu")))
    checks = verdict(key, gpu)
    assert all(check.passed for check in checks.values()), [name for name, c in checks.items() if not c.passed]
