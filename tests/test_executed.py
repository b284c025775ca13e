"""The executed copies a visitor reads on GitHub (``docs/executed/``, written by ``make executed``): one per
core and deep dive, with outputs and at least one figure, the same code as its source today, and no path of the
machine that ran it."""

import re
from pathlib import Path

import jupytext
import nbformat
import pytest

from trl_clinic.course.executed import executed_copy
from trl_clinic.course.lessons import text_sources
from trl_clinic.course.workbook import find_lessons

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = find_lessons(ROOT / "notebooks")
EXECUTED = ROOT / "docs" / "executed"
SOURCES = {notebook: source for source, notebook in text_sources().items()}
# an absolute path on a POSIX machine or a Mac: what a copy must not show (the run's folder, a venv, a traceback)
MACHINE_PATH = re.compile(r"(?<![\w.:/])/(?:home|root|tmp|work|Users|usr|opt|var|mnt|private)/")


def code_cells(notebook) -> list[str]:
    return [
        cell.source
        for cell in notebook.cells
        if cell.cell_type == "code" and "injected-parameters" not in cell.metadata.get("tags", [])
    ]


@pytest.mark.parametrize("path", NOTEBOOKS.values(), ids=NOTEBOOKS.keys())
def test_each_executed_copy_has_its_sources_code_outputs_and_figures(path):
    relative = path.relative_to(ROOT / "notebooks")
    copy = EXECUTED / relative
    assert copy.exists(), f"no executed copy {copy.relative_to(ROOT)}: run `make executed`"
    executed = nbformat.read(copy, as_version=4)
    source = jupytext.read(SOURCES[str(relative)])
    assert code_cells(executed) == code_cells(source), f"{copy.relative_to(ROOT)} is stale: run `make executed`"
    outputs = [output for cell in executed.cells if cell.cell_type == "code" for output in cell.get("outputs", [])]
    assert any("image/png" in output.get("data", {}) for output in outputs), f"{copy.name} shows no figure"
    assert not any(output.get("output_type") == "error" for output in outputs), f"{copy.name} ended in an error"
    assert "papermill" not in executed.metadata
    assert list((EXECUTED / "figures" / path.stem).glob("*.png")), f"no figures copied for {path.stem}"


def test_the_copy_drops_what_changes_at_every_run(tmp_path):
    notebook = nbformat.v4.new_notebook(metadata={"papermill": {"duration": 1.0}})
    notebook.cells.append(nbformat.v4.new_code_cell("1", metadata={"papermill": {"duration": 1}, "execution": {}}))
    nbformat.write(notebook, tmp_path / "run.ipynb")
    executed_copy(tmp_path / "run.ipynb", tmp_path / "copy" / "a.ipynb")
    copy = nbformat.read(tmp_path / "copy" / "a.ipynb", as_version=4)
    assert "papermill" not in copy.metadata and copy.cells[0].metadata == {}


@pytest.mark.parametrize("path", NOTEBOOKS.values(), ids=NOTEBOOKS.keys())
def test_no_executed_copy_shows_a_path_of_the_machine_that_ran_it(path):
    text = (EXECUTED / path.relative_to(ROOT / "notebooks")).read_text()
    found = sorted({match.group() + text[match.end() :].split("/", 1)[0] for match in MACHINE_PATH.finditer(text)})
    assert not found, f"{path.name}'s executed copy shows this machine's paths: {found}: run `make executed`"


def test_the_copy_drops_the_machine_s_paths_from_code_and_outputs(tmp_path):
    """The injected output_dir, a printed path and a traceback's frames: the checkout's prefix goes, a virtual
    environment's packages read ``site-packages/``; the same function on a path that is not the machine's changes
    nothing."""
    root = tmp_path / "checkout"
    cell = nbformat.v4.new_code_cell(f'output_dir = "{root}/.executed-run/03_x"')
    cell.outputs = [
        nbformat.v4.new_output("stream", name="stdout", text=f"metrics in {root}/.executed-run/03_x/metrics.json\n"),
        nbformat.v4.new_output(
            "error", ename="E", evalue="", traceback=[f'File "{root}/.venv/lib/python3.12/site-packages/trl/a.py"']
        ),
    ]
    notebook = nbformat.v4.new_notebook(cells=[cell, nbformat.v4.new_code_cell('print("/tmp is a word here")')])
    nbformat.write(notebook, tmp_path / "run.ipynb")
    executed_copy(tmp_path / "run.ipynb", tmp_path / "copy.ipynb", root=root)
    copy = nbformat.read(tmp_path / "copy.ipynb", as_version=4)
    assert copy.cells[0].source == 'output_dir = ".executed-run/03_x"'
    assert copy.cells[0].outputs[0].text == "metrics in .executed-run/03_x/metrics.json\n"
    assert copy.cells[0].outputs[1].traceback == ['File "site-packages/trl/a.py"']
    assert copy.cells[1].source == 'print("/tmp is a word here")'
