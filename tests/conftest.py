import os
from pathlib import Path

import pytest

# The lessons must never reach the hub; make the unit tests as strict as CI.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
# make test runs two workers on two cores: one torch thread each (and in their children), as the cpu profile's
# lessons use, instead of two threads each fighting over the same cores
os.environ.setdefault("OMP_NUM_THREADS", "1")


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


# The two workbooks (tests/test_deep_dives.py, tests/test_notebooks.py) are most of make test's minutes: they go
# first, one to each worker (make test passes --no-loadscope-reorder, so xdist hands out files in this order),
# and the other files fill in around them.
FIRST = {"test_deep_dives.py": 0, "test_notebooks.py": 1}


def pytest_collection_modifyitems(config, items):
    items.sort(key=lambda item: FIRST.get(item.path.name, len(FIRST)))

