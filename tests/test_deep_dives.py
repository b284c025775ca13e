"""Every deep dive passes its own checks on the cpu profile, run once through the real runner.

A file of its own so that pytest-xdist (`--dist loadfile`) runs the deep dives on one worker while the cores
(tests/test_notebooks.py) run on the other: together they are most of make test's minutes.
"""

import pytest

from test_notebooks import NOTEBOOKS, assert_passed, run_workbook
from trl_clinic.course.workbook import is_deep_dive

DEEP_DIVES = {name: path for name, path in NOTEBOOKS.items() if is_deep_dive(path)}


@pytest.fixture(scope="session")
def deep_dives(tmp_path_factory):
    return run_workbook(tmp_path_factory.mktemp("deep-dives"), *DEEP_DIVES)


@pytest.mark.notebook
@pytest.mark.parametrize("name", DEEP_DIVES)
def test_cpu_profile_passes_its_checks(deep_dives, name):
    assert_passed(deep_dives[0], deep_dives[2], name)


@pytest.mark.notebook
def test_the_runner_exits_zero_when_every_deep_dive_passed(deep_dives):
    assert deep_dives[1] == 0
