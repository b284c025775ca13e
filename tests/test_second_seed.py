"""Every lesson holds at seeds its thresholds were not set on (the thresholds were first argued on seed 0).

``make test`` runs every core and deep dive at seed 0 (tests/test_notebooks.py, tests/test_deep_dives.py) and, here,
one core and one deep dive at a second seed, chosen by a rotation, and the newest core (the highest key: the lesson
added last, until the next one) at that seed too: all fourteen at a second seed would add about
nine minutes to its ten, one of each adds 50-115 s. The rotation index is ``TRL_CLINIC_ROTATION`` when set (CI can
set it, and a failure is rerun with the index its test id names: a red test prints the command, ``rerun``), else
today's date (days since 0001-01-01, UTC), so that consecutive days walk through the lessons:

    core = cores[i % 9], deep dive = deep_dives[i % 6], seed = 1 + i % 5

(9 and 5 share no factor, nor 6 and 5: every core meets every seed 1-5 within 45 days, every deep dive within
30). The test ids say the lesson, the seed and the index: ``06-deeper-seed3-rotation739215``.

``make test-slow`` runs every core and deep dive at seeds 1-5 (``TRL_CLINIC_SEEDS`` narrows them).
"""

import datetime
import json
import os

import pytest
from test_notebooks import CORES, NOTEBOOKS_DIR, assert_passed, run_workbook

from trl_clinic.course.lessons import lessons
from trl_clinic.course.workbook import SUMMARY_JSON, is_deep_dive

KEYS = {lesson.stem: key for key, lesson in lessons().items()}  # notebook stem -> lesson key ("06-deeper")
CORE_NAMES = sorted(CORES)
DEEP_NAMES = sorted(name for name in KEYS if name not in CORES)


def rotation() -> int:
    set_by_ci = os.environ.get("TRL_CLINIC_ROTATION")
    return int(set_by_ci) if set_by_ci else datetime.datetime.now(datetime.UTC).date().toordinal()


def todays(index: int) -> tuple[str, str, int]:
    """The core, the deep dive and the seed of rotation ``index``."""
    return CORE_NAMES[index % len(CORE_NAMES)], DEEP_NAMES[index % len(DEEP_NAMES)], 1 + index % 5


INDEX = rotation()
CORE, DEEP, SEED = todays(INDEX)
NEWEST = max(CORE_NAMES, key=lambda name: KEYS[name])  # the lesson added last: at a second seed in every make test
TODAYS = list(dict.fromkeys([CORE, NEWEST, DEEP]))


def rerun(name: str, index: int = INDEX) -> str:
    """What reruns a red second-seed test on another day: the same rotation under pytest, or the lesson alone at
    its seed (the date moves the rotation on, so the index must be given)."""
    core, deep, seed = todays(index)
    assert name in (core, deep, NEWEST), f"{name} is not in rotation {index}"
    test = test_todays_core_and_deep_dive_pass_at_a_second_seed.__name__
    node = f"tests/test_second_seed.py::{test}[{KEYS[name]}-seed{seed}-rotation{index}]"
    return (
        f"rerun: TRL_CLINIC_ROTATION={index} .venv/bin/python -m pytest '{node}'"
        f' (the lesson alone: make seeds LESSONS="{KEYS[name]}" SEEDS="{seed}")'
    )


@pytest.fixture(scope="session")
def second_seed(tmp_path_factory):
    return run_workbook(tmp_path_factory.mktemp(f"seed-{SEED}"), *TODAYS, "--seed", str(SEED))  # exact names


@pytest.mark.notebook
@pytest.mark.parametrize("name", TODAYS, ids=[f"{KEYS[n]}-seed{SEED}-rotation{INDEX}" for n in TODAYS])
def test_todays_core_and_deep_dive_pass_at_a_second_seed(second_seed, name):
    out, _, results = second_seed
    try:
        assert_passed(out, results, name)
        assert json.loads((out / name / "metrics.json").read_text())["seed"] == SEED
    except AssertionError as failure:
        raise AssertionError(f"{failure}\n{rerun(name)}") from failure


def test_a_red_second_seed_names_the_command_that_reruns_it():
    index = 739215
    core, deep, seed = todays(index)
    said = rerun(deep, index)
    assert f"TRL_CLINIC_ROTATION={index} " in said and f"[{KEYS[deep]}-seed{seed}-rotation{index}]" in said
    assert f'make seeds LESSONS="{KEYS[deep]}" SEEDS="{seed}"' in said and KEYS[core] not in said.split("[")[0]


def test_the_rotation_walks_through_every_lesson_and_seed():
    assert DEEP_NAMES and all(is_deep_dive(NOTEBOOKS_DIR / "deeper" / f"{name}.ipynb") for name in DEEP_NAMES)
    assert set(CORE_NAMES) | set(DEEP_NAMES) == set(KEYS)
    days = [todays(i) for i in range(len(CORE_NAMES) * 5)]
    assert {(core, seed) for core, _, seed in days} == {(c, s) for c in CORE_NAMES for s in range(1, 6)}
    assert {(deep, seed) for _, deep, seed in days[:30]} == {(d, s) for d in DEEP_NAMES for s in range(1, 6)}


SLOW_SEEDS = [int(seed) for seed in os.environ.get("TRL_CLINIC_SEEDS", "1 2 3 4 5").split()]


@pytest.fixture(scope="module", params=SLOW_SEEDS, ids=[f"seed{seed}" for seed in SLOW_SEEDS])
def every_lesson_at(request, tmp_path_factory):
    """Every core and deep dive at one seed, two at a time (each lesson one thread, as on the cpu profile; make
    test-slow runs nothing beside it)."""
    out = tmp_path_factory.mktemp(f"every-seed-{request.param}")
    code = run_workbook(out, "--seed", str(request.param), jobs=2)[1]
    return request.param, out, code, json.loads((out / SUMMARY_JSON).read_text())


@pytest.mark.notebook
@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(KEYS))
def test_every_lesson_holds_at_seeds_1_to_5(every_lesson_at, name):
    _, out, _, summary = every_lesson_at
    assert_passed(out, {row["lesson"]: row for row in summary["lessons"]}, name)
