import os
from pathlib import Path

import pytest

# The lessons must never reach the hub; make the unit tests as strict as CI.
os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="session")
def tokenizer(tmp_path_factory):
    os.environ["TRL_CLINIC_CACHE"] = str(tmp_path_factory.mktemp("cache"))
    from trl_clinic.tokenizer import build_tokenizer

    return build_tokenizer()


@pytest.fixture(scope="session")
def notebooks():
    """The lesson notebooks by name, in order, as the runner finds them."""
    from trl_clinic.workbook import find_lessons

    return find_lessons(Path(__file__).resolve().parents[1] / "notebooks")


# `make test` spreads tests over the cores with pytest-xdist (-n auto --dist loadgroup). A session fixture
# that runs something long (every lesson, an era's scripts) would run once per worker: the tests that use
# one stay together on one worker.
SHARED_RUNS = ("workbook", "era_01_runs")


def pytest_collection_modifyitems(items):
    for item in items:
        for fixture in SHARED_RUNS:
            if fixture in getattr(item, "fixturenames", ()):
                item.add_marker(pytest.mark.xdist_group(fixture))
