"""Every lesson reads as a course (issue 21, ../shared/STYLE.md): the story first, short cells, checks last.

Measured on the percent-format sources, as a learner meets them in JupyterLab:
* the opening cell says what you will learn, what you should know first, and how long it takes;
* the symptom, one small real run, is within the first five cells (the cell tagged ``symptom``);
* code cells fit a screen: none over 30 lines, a median of 8 lines or fewer (d2l's is 5);
* every numbered exercise has a hint a learner can unfold;
* the checks come last, introduced in one sentence, in cells collapsed in JupyterLab
  (``jupyter: {source_hidden: true}``) that papermill still runs.
"""

import re
import statistics
from pathlib import Path

import jupytext
import nbformat
import pytest

from trl_clinic.course.workbook import find_lessons

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = find_lessons(ROOT / "notebooks")
MAX_CODE_LINES = 30
MAX_MEDIAN_CODE_LINES = 8
SYMPTOM_BY_CELL = 5


def cells(path: Path):
    return jupytext.read(path.with_suffix(".py")).cells


def lines(cell) -> int:
    return len(cell.source.strip("\n").splitlines())


def tagged(path: Path, tag: str) -> list[int]:
    return [i for i, cell in enumerate(cells(path)) if tag in cell.metadata.get("tags", [])]


@pytest.mark.parametrize("path", NOTEBOOKS.values(), ids=NOTEBOOKS.keys())
def test_the_opening_says_what_you_learn_need_and_spend(path):
    opening = cells(path)[0]
    assert opening.cell_type == "markdown"
    for heading in ("You will learn", "You should know", "Time"):
        assert re.search(rf"\*\*{heading}\*\*", opening.source), f"{path.stem}'s first cell has no **{heading}**"


@pytest.mark.parametrize("path", NOTEBOOKS.values(), ids=NOTEBOOKS.keys())
def test_the_symptom_comes_within_the_first_five_cells(path):
    symptom = tagged(path, "symptom")
    assert symptom, f"{path.stem}: tag the cell that first shows the symptom 'symptom'"
    assert symptom[0] < SYMPTOM_BY_CELL, f"{path.stem}: the symptom is cell {symptom[0] + 1}, after cell {SYMPTOM_BY_CELL}"
    assert cells(path)[symptom[0]].cell_type == "code"


@pytest.mark.parametrize("path", NOTEBOOKS.values(), ids=NOTEBOOKS.keys())
def test_code_cells_fit_on_a_screen(path):
    code = [(i, lines(cell)) for i, cell in enumerate(cells(path)) if cell.cell_type == "code"]
    long = [f"cell {i + 1}: {n} lines" for i, n in code if n > MAX_CODE_LINES]
    assert not long, f"{path.stem} has code cells over {MAX_CODE_LINES} lines: {long}"
    median = statistics.median(n for _, n in code)
    assert median <= MAX_MEDIAN_CODE_LINES, f"{path.stem}: median code cell {median} lines (> {MAX_MEDIAN_CODE_LINES})"


@pytest.mark.parametrize("path", NOTEBOOKS.values(), ids=NOTEBOOKS.keys())
def test_every_exercise_has_a_hint(path):
    [exercise] = [c.source for c in cells(path) if c.cell_type == "markdown" and re.search(r"^#+ .*Exercise", c.source, re.M)]
    items = re.split(r"^\d+\. ", exercise, flags=re.M)[1:]
    assert items, f"{path.stem}: the Exercise cell has no numbered items"
    for number, item in enumerate(items, 1):
        assert "<summary>Hint</summary>" in item, f"{path.stem}: exercise {number} has no <details><summary>Hint</summary>"


@pytest.mark.parametrize("path", NOTEBOOKS.values(), ids=NOTEBOOKS.keys())
def test_checks_come_last_collapsed_and_introduced_in_one_sentence(path):
    source_cells = cells(path)
    checks = tagged(path, "checks")
    assert checks, f"{path.stem} has no cell tagged 'checks'"
    assert checks == list(range(checks[0], checks[-1] + 1)), f"{path.stem}: the checks cells must follow each other"
    intro = source_cells[checks[0] - 1]
    assert intro.cell_type == "markdown"
    prose = re.sub(r"^#+ .*$", "", intro.source, flags=re.M).strip()
    assert prose and len(re.findall(r"[.!?](\s|$)", prose)) == 1, f"{path.stem}: introduce the checks in one sentence"
    notebook = nbformat.read(path, as_version=4)
    for i in checks:
        assert notebook.cells[i].metadata.get("jupyter", {}).get("source_hidden") is True, (
            f"{path.stem}: checks cell {i + 1} is not collapsed (jupyter: {{source_hidden: true}})")
    after = [c for c in source_cells[checks[-1] + 1:] if c.cell_type == "markdown"]
    assert not after, f"{path.stem}: nothing for the learner to read after the checks"


@pytest.mark.parametrize("path", NOTEBOOKS.values(), ids=NOTEBOOKS.keys())
def test_the_report_gets_sentences_written_from_the_numbers(path):
    """The report shows each lesson's own summary, not raw metric keys: save_metrics(..., summary=...)."""
    assert re.search(r"save_metrics\([^)]*summary=", path.with_suffix(".py").read_text(), re.S), (
        f"{path.stem}: pass save_metrics a summary= written from the run's numbers")


@pytest.mark.parametrize("path", NOTEBOOKS.values(), ids=NOTEBOOKS.keys())
def test_the_opening_gives_the_measured_cpu_time(path):
    """The run time a learner is promised is the one measured and declared in lessons.yaml."""
    from trl_clinic.course.lessons import lessons

    [lesson] = [lesson for lesson in lessons().values() if lesson.notebook == path.stem]
    opening = re.sub(r"\s*\n#?\s*", " ", cells(path)[0].source)
    time_line = opening[opening.index("**Time**"):]
    assert f"{lesson.seconds['cpu']} s to run on the cpu profile" in time_line[:200], (
        f"{path.stem}: the **Time** line must say '{lesson.seconds['cpu']} s to run on the cpu profile' (lessons.yaml)")


@pytest.mark.parametrize("path", NOTEBOOKS.values(), ids=NOTEBOOKS.keys())
def test_the_last_cell_says_all_checks_passed(path):
    """A learner who ran every cell reads the verdict last (the learner's-path tests wait for this line)."""
    last = [cell for cell in cells(path) if cell.cell_type == "code"][-1].source.strip().splitlines()[-1]
    assert last.startswith('print(f"all checks passed'), f"{path.stem}'s last line is {last!r}"
