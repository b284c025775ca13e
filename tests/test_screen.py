"""A screen a learner can read: each core's outputs, measured in its executed copy (``docs/executed/``, written by
``make executed``), as a learner sees them after Run All.

The rules, and why these numbers:

* **At most 25 output lines a cell** (stream text, a result's plain text, an error's traceback; a figure is not a
  line). JupyterLab on a 1080p screen shows about 40 lines of a notebook at its default font; a code cell of this
  course is at most about 15 lines (a portable check's 15 is the longest), which leaves 25 for what it printed, so
  that a cell and its output are read together without scrolling. Trainer log rows and check-up tables belong on the
  screen only where they are the symptom; the rest is folded (what failed or warned, a count of the others).
* **No output line over 120 characters**: JupyterLab's output area at that screen and font holds about 120
  characters before the line wraps (or scrolls sideways on GitHub), and a wrapped table is no longer a table.
* **An expected error shown once**: the same exception with the same message (``NameError: name ... is not
  defined``) on one output line of the notebook, not repeated per setting; a count says how often it happened.

Point it at other executed notebooks (a ``trl-clinic run`` folder, ``OUT/<notebook>/<notebook>.ipynb``, or a folder
laid out like ``docs/executed``) with ``TRL_CLINIC_SCREEN_DIR=OUT pytest tests/test_screen.py``: a lesson's author
checks a fresh run before the lead refreshes the copies.
"""

import os
import re
from collections import Counter
from pathlib import Path

import nbformat
import pytest

from trl_clinic.course.workbook import find_lessons, is_deep_dive

ROOT = Path(__file__).resolve().parents[1]
CORES = {name: path for name, path in find_lessons(ROOT / "notebooks").items() if not is_deep_dive(path)}
SCREEN_DIR = Path(os.environ.get("TRL_CLINIC_SCREEN_DIR") or ROOT / "docs" / "executed")
LINES_PER_CELL = 25
LINE_WIDTH = 120
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
# "NameError: name 'flash_attn_varlen_func' is not defined": an exception's name, then its message
ERROR = re.compile(r"\b([A-Z]\w*(?:Error|Exception)): (.+)")


def executed(name: str) -> Path:
    """The executed notebook of a core: in a ``trl-clinic run`` folder, else where ``docs/executed`` keeps it."""
    for candidate in (SCREEN_DIR / name / f"{name}.ipynb", SCREEN_DIR / CORES[name].name):
        if candidate.exists():
            return candidate
    pytest.fail(f"no executed copy of {name} in {SCREEN_DIR}: run `make executed` (or point TRL_CLINIC_SCREEN_DIR)")


def output_lines(cell) -> list[str]:
    """What the cell shows under it, line by line, as plain text (terminal colour codes are not characters)."""
    text = []
    for output in cell.get("outputs", []):
        if output.output_type == "stream":
            text.append(output.text)
        elif output.output_type == "error":
            text.append("\n".join(output.traceback) + "\n")
        elif "image/png" not in output.get("data", {}) and "text/plain" in output.get("data", {}):
            text.append(output.data["text/plain"].rstrip("\n") + "\n")  # a display ends its own line
    return ANSI.sub("", "".join(text)).splitlines()


def screen_problems(notebook: nbformat.NotebookNode) -> list[str]:
    """Every rule a notebook's outputs break, one line each, naming the cell (its execution count) and the text."""
    problems, errors = [], Counter()
    for index, cell in enumerate(notebook.cells):
        if cell.cell_type != "code":
            continue
        where = f"cell {index} (In [{cell.get('execution_count')}])"
        lines = output_lines(cell)
        if len(lines) > LINES_PER_CELL:
            problems.append(f"{where}: {len(lines)} output lines (budget {LINES_PER_CELL}); first: {lines[0][:60]!r}")
        for line in lines:
            if len(line) > LINE_WIDTH:
                problems.append(f"{where}: a line of {len(line)} characters (at most {LINE_WIDTH}): {line[:70]!r}...")
        for line in lines:
            match = ERROR.search(line)
            if match:
                errors[match.group(1), match.group(2).strip()] += 1
    problems += [
        f"{name}: {message[:70]!r} shown {count} times (once, with a count, is enough)"
        for (name, message), count in errors.items()
        if count > 1
    ]
    return problems


@pytest.mark.parametrize("name", CORES)
def test_each_cores_outputs_fit_a_learners_screen(name):
    path = executed(name)
    problems = screen_problems(nbformat.read(path, as_version=4))
    assert not problems, f"{path} breaks the screen rules (tests/test_screen.py says why):\n" + "\n".join(problems)


def test_the_rules_see_a_long_table_a_wide_line_and_a_repeated_error():
    notebook = nbformat.v4.new_notebook()
    table = nbformat.v4.new_code_cell("table()")
    table.outputs = [nbformat.v4.new_output("stream", text="row\n" * 26)]
    wide = nbformat.v4.new_code_cell("wide()")
    wide.outputs = [nbformat.v4.new_output("stream", text="x" * 121 + "\n")]
    repeated = nbformat.v4.new_code_cell("eras()")
    said = "4.40 eval: NameError: name 'flash_attn_varlen_func' is not defined\n"
    repeated.outputs = [nbformat.v4.new_output("stream", text=said + said.replace("eval", "train"))]
    figure = nbformat.v4.new_code_cell("plot()")
    figure.outputs = [nbformat.v4.new_output("display_data", data={"image/png": "", "text/plain": "<Figure>"})]
    notebook.cells = [table, wide, repeated, figure]
    problems = screen_problems(notebook)
    assert len(problems) == 3, problems
    assert "26 output lines" in problems[0] and "121 characters" in problems[1] and "shown 2 times" in problems[2]
    table.outputs = [nbformat.v4.new_output("stream", text="row\n" * 25)]
    wide.outputs = [nbformat.v4.new_output("stream", text="x" * 120 + "\n")]
    repeated.outputs = [nbformat.v4.new_output("stream", text=said + "the same error in 6 more settings\n")]
    assert screen_problems(notebook) == []
