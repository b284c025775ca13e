import os
from pathlib import Path

import pytest

# The lessons must never reach the hub; make the unit tests as strict as CI.
os.environ.setdefault("HF_HUB_OFFLINE", "1")


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

