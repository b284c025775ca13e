import os
from pathlib import Path

import pytest

# The lessons must never reach the hub; make the unit tests as strict as CI.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
# make test runs two workers on two cores: one torch thread each (and in their children), as the cpu profile's
# lessons use, instead of two threads each fighting over the same cores
os.environ.setdefault("OMP_NUM_THREADS", "1")
# a facilitator's room setting (TRL_CLINIC_PROFILE, trl_clinic.course.profiles) must not choose the tests' profiles
os.environ.pop("TRL_CLINIC_PROFILE", None)


@pytest.fixture(scope="session")
def tokenizer():
    """The lessons' tokenizer from the clinic's cache, as the lessons get it (trained there on first use)."""
    from trl_clinic.course.tokenizer import build_tokenizer

    return build_tokenizer()


@pytest.fixture(scope="session")
def notebooks():
    """The lesson notebooks by name, in order, as the runner finds them."""
    from trl_clinic.course.workbook import find_lessons

    return find_lessons(Path(__file__).resolve().parents[1] / "notebooks")


# make test passes --no-loadscope-reorder, so xdist hands out whole files in this order: the heaviest first
# (seconds of one fresh-clone make test), so that the last files handed out are short and both workers end
# together. The two workbooks are most of the minutes and go one to each worker; the rest follow by weight.
HEAVIEST = (
    "test_deep_dives.py",  # 436 s
    "test_notebooks.py",  # 244 s
    "test_solutions.py",  # 153 s
    "test_gpu_paths.py",  # 81 s
    "test_learner_path.py",  # 70 s
    "test_checkup_eras.py",  # 56 s
    "test_eras.py",  # 44 s
    "test_hosted.py",  # 35 s here (a wheel, a venv, lesson 01 and its era from a warm uv cache)
    "test_workbook.py",  # 26 s
    "test_crash.py",
)  # 15 s; every other file takes under 8 s


def pytest_collection_modifyitems(config, items):
    order = {name: rank for rank, name in enumerate(HEAVIEST)}
    items.sort(key=lambda item: order.get(item.path.name, len(order)))
