"""Every lesson notebook: committed clean, parametrisable, and passing its own checks on the cpu profile.

The cores are executed once, through the real runner (`trl-clinic run --cores`), into one workbook folder;
the report test reads the same folder. The deep dives run in tests/test_deep_dives.py, a file of their own, so
that pytest-xdist (`--dist loadfile`) gives each half to its own worker (make test's two cores).
"""

import json
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import jupytext
import nbformat
import papermill
import pytest
from conftest import missing

from trl_clinic.cli import main
from trl_clinic.course.lessons import text_sources
from trl_clinic.course.report import build_report
from trl_clinic.course.results import eras_not_run, load_metrics
from trl_clinic.course.workbook import SUMMARY_JSON, find_lessons, is_deep_dive, notebook_parameters

NOTEBOOKS_DIR = Path(__file__).resolve().parents[1] / "notebooks"
SOURCES = {notebook: source for source, notebook in text_sources().items()}  # "deeper/01_..ipynb" -> its source
NOTEBOOKS = find_lessons(NOTEBOOKS_DIR)  # cores and deep dives: what the runner runs
CORES = {name: path for name, path in NOTEBOOKS.items() if not is_deep_dive(path)}
EVERY_NOTEBOOK = {
    str(p.relative_to(NOTEBOOKS_DIR)): p
    for p in sorted(NOTEBOOKS_DIR.rglob("*.ipynb"))
    if ".ipynb_checkpoints" not in p.parts
}  # and the worked solutions
REQUIRED = {"profile", "seed", "output_dir"}


def test_there_are_lessons():
    assert NOTEBOOKS


def source_of(path: Path) -> Path:
    """The notebook's text source in its lesson's folder (``core.py``, ``deeper.py``, ``solution.py``)."""
    return SOURCES[str(path.relative_to(NOTEBOOKS_DIR))]


@pytest.mark.parametrize("path", EVERY_NOTEBOOK.values(), ids=EVERY_NOTEBOOK.keys())
def test_committed_without_outputs(path):
    notebook = nbformat.read(path, as_version=4)
    for cell in notebook.cells:
        if cell.cell_type == "code":
            assert not cell.outputs and cell.execution_count is None, f"{path.name} carries outputs"


def _cells(notebook) -> list[tuple[str, str, list[str]]]:
    return [(cell.cell_type, cell.source, cell.metadata.get("tags", [])) for cell in notebook.cells]


@pytest.mark.parametrize("path", EVERY_NOTEBOOK.values(), ids=EVERY_NOTEBOOK.keys())
def test_notebook_matches_its_text_source_exactly(path):
    """The same cells, and the .py exactly as jupytext writes it: `make notebooks` on a clean tree changes nothing,
    so a reviewer reads the source and knows the notebook."""
    assert str(path.relative_to(NOTEBOOKS_DIR)) in SOURCES, f"{path.name} has no text source in a lesson's folder"
    source = source_of(path)
    notebook = nbformat.read(path, as_version=4)
    assert _cells(notebook) == _cells(jupytext.read(source)), (
        f"{path.name} and {source.name} disagree: edit the source and run `make notebooks`"
    )
    assert jupytext.writes(notebook, fmt="py:percent") == source.read_text(), (
        f"{source.name} is not what jupytext writes from {path.name}: run `make notebooks`"
    )


def test_every_text_source_has_its_notebook():
    assert set(SOURCES) == set(EVERY_NOTEBOOK), "run `make notebooks`; delete a notebook whose lesson is gone"


def test_learners_see_one_file_per_notebook():
    """JupyterLab opens on notebooks/: no text source beside a notebook there."""
    assert not [p for p in NOTEBOOKS_DIR.rglob("*.py")], "text sources belong in the lessons' folders"


@pytest.mark.parametrize("path", NOTEBOOKS.values(), ids=NOTEBOOKS.keys())
def test_sizes_come_from_the_profile_not_from_the_device(path):
    """A notebook reads its numbers from run.sizes (its lesson.yaml); it never asks which device it is on."""
    source = source_of(path).read_text()
    for branch in ("on_gpu", "cuda.is_available", "is_flash_attn"):
        assert branch not in source, f"{path.stem} decides something by the device ({branch}): put it in lesson.yaml"


@pytest.mark.parametrize("path", NOTEBOOKS.values(), ids=NOTEBOOKS.keys())
def test_has_one_parameters_cell_with_the_required_names(path):
    notebook = nbformat.read(path, as_version=4)
    tagged = [cell for cell in notebook.cells if "parameters" in cell.metadata.get("tags", [])]
    assert len(tagged) == 1
    assert REQUIRED <= set(notebook_parameters(path))
    assert notebook_parameters(path)["profile"]["default"] == '"auto"'


def run_workbook(out: Path, *options: str, jobs: int = 1) -> tuple[Path, int, dict]:
    """One lesson at a time: under `make test` pytest-xdist's other worker has the other core, and two lessons
    here beside it overloaded the two cores (1260 CPU-seconds in 655 s of wall, about 1000 of them work).
    `--jobs` itself is tested on small notebooks (tests/test_workbook.py); ``jobs=2`` where nothing runs beside."""
    code = main(
        [
            "run",
            *options,
            "--profile",
            "cpu",
            "--out",
            str(out),
            "--no-progress",
            "--notebooks",
            str(NOTEBOOKS_DIR),
            "--jobs",
            str(jobs),
        ]
    )
    summary = json.loads((out / SUMMARY_JSON).read_text())
    return out, code, {row["lesson"]: row for row in summary["lessons"]}


def assert_passed(out: Path, results: dict, name: str) -> None:
    result = results[name]
    assert result["status"] == "passed", result["error"] or result["failed"]
    metrics = load_metrics(out / name)
    assert metrics["profile"] == "cpu"
    assert metrics["symptom_reproduced"] and metrics["fix_verified"]
    assert metrics["complete"], f"{name}: the old versions' part did not run: {eras_not_run(metrics)}"
    assert list((out / name).glob("*.png")), "the notebook saved no figure"
    assert (out / name / f"{name}.ipynb").exists()


@pytest.fixture(scope="session")
def workbook(tmp_path_factory):
    """The cores, as a workshop runs them (`trl-clinic run --cores`)."""
    return run_workbook(tmp_path_factory.mktemp("workbook"), "--cores")


def test_the_cores_and_the_deep_dives_are_every_lesson():
    from test_deep_dives import DEEP_DIVES

    assert set(CORES) | set(DEEP_DIVES) == set(NOTEBOOKS) and not set(CORES) & set(DEEP_DIVES)


@pytest.mark.notebook
@pytest.mark.parametrize("name", CORES)
def test_cpu_profile_passes_its_checks(workbook, name):
    assert_passed(workbook[0], workbook[2], name)


@pytest.mark.notebook
def test_the_runner_exits_zero_when_every_lesson_passed(workbook):
    assert workbook[1] == 0


@pytest.mark.era
def test_01_the_core_s_padding_free_run_on_trl_0_14(workbook):
    """The real trl 0.14 / transformers 4.48.3 run the core made: position_ids and no mask, one causal mask over the
    packed row, and a loss that grows with the batch through the real SFTTrainer, the kernel flag never reaching it."""
    from test_eras import attention_across, era_result

    old = era_result(workbook[0] / "01_padding_free_high_loss" / "then", "then_01", "01-trl-0.14")
    assert old["collator"]["has_position_ids"] and not old["collator"]["has_attention_mask"]
    for implementation in ("eager", "sdpa"):
        assert not any(old["isolated"][implementation].values())  # 4.48: contaminated every way
    # one causal mask over lengths 3, 2, 3: 3*2+3*3+2*3 entries across sequences
    assert attention_across(old, "eval, use_cache=False, no mask") == 21
    losses = old["loss_by_batch_size"]
    assert losses["batch_sizes"] == [1, 4, 16] and losses["attn_implementation"] == ["sdpa"]  # the flag never came
    for padded, free, ratio in zip(losses["padded"], losses["padding_free"], losses["ratio"]):
        assert padded > 0 and ratio == pytest.approx(free / padded)
    assert abs(losses["ratio"][0] - 1) < 1e-3  # one sequence per batch: nothing to leak
    assert (
        losses["ratio"][1] < losses["ratio"][2] and losses["ratio"][2] > 2
    )  # more packed neighbours, more contamination


def chromium():
    return shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.notebook
def test_report_loads_in_a_headless_browser_with_every_lesson_and_figure(workbook):
    if chromium() is None:
        missing("chromium", "needs Debian's chromium (`make browser` installs it when root)")
    out = workbook[0]
    report = build_report(out)
    dom = subprocess.run(
        [
            chromium(),
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            f"--user-data-dir={tempfile.mkdtemp()}",
            "--virtual-time-budget=10000",
            "--dump-dom",
            report.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout
    body = re.search(r"<body([^>]*)>", dom).group(1)
    figures = sum(len(list((out / name).glob("*.png"))) for name in CORES)
    assert f'data-images="{figures}"' in body and 'data-images-loaded="true"' in body
    for name in CORES:
        assert f'id="{name}"' in dom and f"{name}/{name}.html" in dom
        assert (out / name / f"{name}.html").exists()


@pytest.mark.notebook
def test_unknown_profile_fails_in_the_notebook_with_a_clear_message(tmp_path):
    path = next(iter(NOTEBOOKS.values()))
    with pytest.raises(papermill.PapermillExecutionError, match="unknown profile 'fast'"):
        papermill.execute_notebook(
            str(path),
            str(tmp_path / path.name),
            cwd=str(path.parent),
            progress_bar=False,
            parameters={"profile": "fast", "output_dir": str(tmp_path / "out")},
        )
