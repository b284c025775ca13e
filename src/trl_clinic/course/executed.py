"""Executed copies of the notebooks where GitHub renders them (``make executed``): what a visitor reads first.

``python -m trl_clinic.course.executed RUN_OUT docs/executed`` copies each executed notebook of a
``trl-clinic run`` (cpu profile, seed 0) to the same relative path it has under ``notebooks/``, outputs and
figures included, without what changes at every run and says nothing (papermill's per-cell timings and the
kernel's execution metadata), and the figures each notebook saved to ``figures/<notebook>/`` beside them (the
README shows one per lesson). The sources under ``notebooks/`` stay without outputs.

A copy lies one folder deeper than its notebook (``docs/executed/06_x.ipynb`` beside ``notebooks/06_x.ipynb``), so
each relative link of its markdown is pointed again at the same file: another executed copy where there is one (a
core's link to its deep dive), else the repository's file (the solutions, ``docs/*.md``); tests/test_links.py
follows every link of the copies and of ``notebooks/`` to a file that exists.

A copy carries no path of the machine that ran it (AUDIT H.5): the injected ``output_dir``, the "metrics in"
line and a traceback's frames name files under the checkout and in a virtual environment; the checkout's prefix is
dropped (``.executed-run/03_x``, ``src/trl_clinic/course/crash.py``) and an environment's becomes
``site-packages/``, in code and outputs alike.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
from pathlib import Path

import nbformat

VOLATILE_CELL_KEYS = ("papermill", "execution")
# a markdown link or image, [text](target) or ![alt](target), and an HTML href/src: the target, up to a title or ")"
LINK = re.compile(r"(?P<lead>\]\(|(?:href|src)=[\"'])(?P<target>[^)\"'\s]+)")
# an installed package's file, in any virtual environment or Python: ".../lib/python3.11/site-packages/"
SITE_PACKAGES = re.compile(r"/[^\s\"'<>]*?/site-packages/")


def unrooted(text: str, root: Path) -> str:
    """``text`` without this machine's paths: an environment's packages as ``site-packages/``, the checkout's
    files relative to it."""
    return SITE_PACKAGES.sub("site-packages/", text).replace(f"{root.resolve()}/", "")


def unrooted_outputs(cell, root: Path) -> None:
    """The same in a code cell's outputs: printed text, results, and an error's traceback lines."""
    for output in cell.get("outputs", []):
        if "text" in output:
            output["text"] = unrooted(output["text"], root)
        for kind, value in output.get("data", {}).items():
            if kind.startswith("text/") and isinstance(value, str):
                output["data"][kind] = unrooted(value, root)
        if "traceback" in output:
            output["traceback"] = [unrooted(line, root) for line in output["traceback"]]


def is_relative(target: str) -> bool:
    """A link to a file of the repository: not a web address, a mail address or an anchor of the same page."""
    return not re.match(r"^([a-z][a-z0-9+.-]*:|#|/)", target, re.IGNORECASE)


def relinked(text: str, source_dir: Path, copy_dir: Path, copies: dict[Path, Path]) -> str:
    """``text`` with each relative link written from ``source_dir`` pointed at the same file from ``copy_dir``:
    its executed copy where ``copies`` (notebook -> copy, resolved paths) has one, else the file itself."""

    def again(match: re.Match) -> str:
        target = match["target"]
        if not is_relative(target):
            return match[0]
        path, hash_, anchor = target.partition("#")
        if not path:
            return match[0]
        file = (source_dir / path).resolve()
        moved = os.path.relpath(copies.get(file, file), copy_dir)
        return f"{match['lead']}{Path(moved).as_posix()}{hash_}{anchor}"

    return LINK.sub(again, text)


def executed_copy(
    executed: Path,
    target: Path,
    source: Path | None = None,
    copies: dict[Path, Path] | None = None,
    root: Path | None = None,
):
    """The executed notebook without its run's metadata, written to ``target``; with ``source`` (its notebook under
    ``notebooks/``), the markdown's relative links pointed again from ``target`` (see ``relinked``); with ``root``
    (the checkout that ran it), no path of the machine (see ``unrooted``)."""
    notebook = nbformat.read(executed, as_version=4)
    notebook.metadata.pop("papermill", None)
    for cell in notebook.cells:
        for key in VOLATILE_CELL_KEYS:
            cell.metadata.pop(key, None)
        if root is not None and cell.cell_type == "code":
            cell.source = unrooted(cell.source, root)
            unrooted_outputs(cell, root)
        if source is not None and cell.cell_type == "markdown":
            cell.source = relinked(cell.source, source.resolve().parent, target.resolve().parent, copies or {})
    target.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(notebook, target)


def copy_run(run_out: Path, target_dir: Path, notebooks_dir: Path = Path("notebooks")) -> list[Path]:
    """Every notebook of ``notebooks_dir`` that the run executed, copied; a notebook the run lacks is an error:
    the copies are refreshed together, so that none is older than the sources beside it."""
    from trl_clinic.course.paths import repo_root
    from trl_clinic.course.workbook import find_lessons

    written = []
    lessons = find_lessons(notebooks_dir)
    copies = {
        source.resolve(): (target_dir / source.relative_to(notebooks_dir)).resolve() for source in lessons.values()
    }
    for stem, source in lessons.items():
        executed = run_out / stem / f"{stem}.ipynb"
        if not executed.exists():
            raise FileNotFoundError(f"{executed} is missing: run every lesson (`make executed`)")
        target = target_dir / source.relative_to(notebooks_dir)
        executed_copy(executed, target, source, copies, root=repo_root())
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
