"""The executed copies a visitor reads on GitHub (``docs/executed/``, written by ``make executed``): one per
core and deep dive, with outputs and at least one figure, and the same code as its source today."""

from pathlib import Path

import jupytext
import nbformat
import pytest

from trl_clinic.course.executed import executed_copy
from trl_clinic.course.workbook import find_lessons

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = find_lessons(ROOT / "notebooks")
EXECUTED = ROOT / "docs" / "executed"


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
    source = jupytext.read(ROOT / "sources" / relative.with_suffix(".py"))
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
