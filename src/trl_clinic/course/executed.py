"""Executed copies of the notebooks where GitHub renders them (``make executed``): what a visitor reads first.

``python -m trl_clinic.course.executed RUN_OUT docs/executed`` copies each executed notebook of a
``trl-clinic run`` (cpu profile, seed 0) to the same relative path it has under ``notebooks/``, outputs and
figures included, without what changes at every run and says nothing (papermill's per-cell timings and the
kernel's execution metadata), and the figures each notebook saved to ``figures/<notebook>/`` beside them (the
README shows one per lesson). The sources under ``notebooks/`` stay without outputs.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import nbformat

VOLATILE_CELL_KEYS = ("papermill", "execution")


def executed_copy(executed: Path, target: Path) -> None:
    notebook = nbformat.read(executed, as_version=4)
    notebook.metadata.pop("papermill", None)
    for cell in notebook.cells:
        for key in VOLATILE_CELL_KEYS:
            cell.metadata.pop(key, None)
    target.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(notebook, target)


def copy_run(run_out: Path, target_dir: Path, notebooks_dir: Path = Path("notebooks")) -> list[Path]:
    """Every notebook of ``notebooks_dir`` that the run executed, copied; a notebook the run lacks is an error:
    the copies are refreshed together, so that none is older than the sources beside it."""
    from trl_clinic.course.workbook import find_lessons

    written = []
    for stem, source in find_lessons(notebooks_dir).items():
        executed = run_out / stem / f"{stem}.ipynb"
        if not executed.exists():
            raise FileNotFoundError(f"{executed} is missing: run every lesson (`make executed`)")
        target = target_dir / source.relative_to(notebooks_dir)
        executed_copy(executed, target)
        written.append(target)
        figures = target_dir / "figures" / stem
        shutil.rmtree(figures, ignore_errors=True)
        figures.mkdir(parents=True)
        for png in sorted((run_out / stem).glob("*.png")):
            shutil.copy2(png, figures / png.name)
            written.append(figures / png.name)
    return written


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: python -m trl_clinic.course.executed RUN_OUT TARGET_DIR")
    for path in copy_run(Path(sys.argv[1]), Path(sys.argv[2])):
        print(f"wrote {path}")
