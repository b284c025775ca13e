"""Every core's exercises have worked solutions, as a runnable notebook at the lesson's own sizes, and every
solution still gives the answer it claims.

A core's solutions live in ``notebooks/solutions/<core>.ipynb`` (source: ``solution.py`` in the lesson's folder): a
``parameters`` cell as the lessons have, then one section per numbered exercise (``## Exercise N``), each ending
with an assertion of the claim its answer makes. Papermill runs them here on the cpu profile, as a learner would.
"""

import re
from pathlib import Path

import jupytext
import papermill
import pytest

from trl_clinic.course.lessons import SOLUTION, lessons

ROOT = Path(__file__).resolve().parents[1]
CORES = {key: lesson for key, lesson in lessons().items() if lesson.is_core}


def exercise_count(lesson) -> int:
    [cell] = [
        cell.source
        for cell in jupytext.read(lesson.source).cells
        if cell.cell_type == "markdown" and re.search(r"^#+ .*Exercises", cell.source, re.M)
    ]
    return len(re.findall(r"^\d+\. ", cell, re.M))


def solution_source(lesson) -> Path:
    return lesson.folder / SOLUTION


@pytest.mark.parametrize("key", CORES)
def test_every_exercise_has_a_worked_solution_that_asserts_its_answer(key):
    lesson = CORES[key]
    source = solution_source(lesson)
    assert source.exists(), f"{lesson.stem}'s exercises have no worked solution at {source.relative_to(ROOT)}"
    sections = re.split(r"^# ## Exercise (\d+)", source.read_text(), flags=re.M)
    numbers = [int(n) for n in sections[1::2]]
    assert numbers == list(range(1, exercise_count(lesson) + 1)), (
        f"{source.name} must have one '## Exercise N' section per exercise, in order: {numbers}"
    )
    for number, body in zip(numbers, sections[2::2]):
        assert "assert " in body, f"{source.name}: exercise {number} asserts nothing"
    assert f'start_run("{key}", profile, seed, output_dir)' in source.read_text(), (
        f'{source.name}: read the lesson\'s own sizes (start_run("{key}", ...))'
    )


@pytest.mark.notebook
@pytest.mark.parametrize("key", CORES)
def test_worked_solutions_run_and_their_answers_hold(key, tmp_path):
    lesson = CORES[key]
    notebook = ROOT / "notebooks" / "solutions" / f"{lesson.stem}.ipynb"
    if not notebook.exists():
        pytest.skip("no solutions (the test above fails)")
    papermill.execute_notebook(
        str(notebook),
        str(tmp_path / notebook.name),
        cwd=str(notebook.parent),
        progress_bar=False,
        kernel_name="python3",
        parameters={"profile": "cpu", "seed": 0, "output_dir": str(tmp_path / "out")},
    )
