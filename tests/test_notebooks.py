"""Every lesson notebook: committed clean, parametrisable, and passing its own checks on the cpu profile."""

from pathlib import Path

import nbformat
import papermill
import pytest

from trl_clinic.results import failed_checks, load_metrics
from trl_clinic.workbook import find_lessons, notebook_parameters

NOTEBOOKS = find_lessons(Path(__file__).resolve().parents[1] / "notebooks")
REQUIRED = {"profile", "seed", "output_dir"}


def test_there_are_lessons():
    assert NOTEBOOKS


@pytest.mark.parametrize("path", NOTEBOOKS.values(), ids=NOTEBOOKS.keys())
def test_committed_without_outputs(path):
    notebook = nbformat.read(path, as_version=4)
    for cell in notebook.cells:
        if cell.cell_type == "code":
            assert not cell.outputs and cell.execution_count is None, f"{path.name} carries outputs"


@pytest.mark.parametrize("path", NOTEBOOKS.values(), ids=NOTEBOOKS.keys())
def test_has_one_parameters_cell_with_the_required_names(path):
    notebook = nbformat.read(path, as_version=4)
    tagged = [cell for cell in notebook.cells if "parameters" in cell.metadata.get("tags", [])]
    assert len(tagged) == 1
    assert REQUIRED <= set(notebook_parameters(path))
    assert notebook_parameters(path)["profile"]["default"] == '"auto"'


@pytest.mark.notebook
@pytest.mark.parametrize("path", NOTEBOOKS.values(), ids=NOTEBOOKS.keys())
def test_cpu_profile_passes_its_checks(path, tmp_path):
    out = tmp_path / path.stem
    papermill.execute_notebook(str(path), str(tmp_path / path.name), cwd=str(path.parent), progress_bar=False,
                               parameters={"profile": "cpu", "seed": 0, "output_dir": str(out)})
    metrics = load_metrics(out)
    assert metrics["profile"] == "cpu"
    assert metrics["symptom_reproduced"] and metrics["fix_verified"], failed_checks(metrics)
    assert list(out.glob("*.png")), "the notebook saved no figure"


@pytest.mark.notebook
def test_unknown_profile_fails_in_the_notebook_with_a_clear_message(tmp_path):
    path = next(iter(NOTEBOOKS.values()))
    with pytest.raises(papermill.PapermillExecutionError, match="unknown profile 'fast'"):
        papermill.execute_notebook(str(path), str(tmp_path / path.name), cwd=str(path.parent), progress_bar=False,
                                   parameters={"profile": "fast", "output_dir": str(tmp_path / "out")})
