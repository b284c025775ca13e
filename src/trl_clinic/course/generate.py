"""Everything made from the lessons' folders, written by one command: ``python -m trl_clinic.course.generate``
(``make generated``).

A lesson's folder holds what only it knows (CONTRIBUTING.md, "Layout"); the files a reader meets elsewhere are made
from the folders, so that adding a lesson is adding a folder:

* ``notebooks/``: each core, deep dive and solution as a notebook, from its text source (cell ids kept, outputs
  cleared: a test checks that they agree and that no output is committed);
* README.md's table of failures, from each core's ``readme`` block in its ``lesson.yaml``;
* docs/cheatsheet.md's entries, from each core's ``card.md``;
* docs/deck.html, the presenter's deck, from the same entries and the executed copies' figures (not written
  while a lesson has no executed figure yet: a new lesson's, until ``make executed``).

``--check`` writes nothing and exits 1 when a file differs from what would be written (the tests call the
functions below directly).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import jupytext
import nbformat
from jupytext.config import load_jupytext_config

from trl_clinic.course import deck
from trl_clinic.course.lessons import Lesson, lessons, text_sources
from trl_clinic.course.paths import repo_root

README = Path("README.md")
CHEATSHEET = Path("docs") / "cheatsheet.md"
TABLE_BEGIN = "<!-- lessons: begin (python -m trl_clinic.course.generate writes this from each lesson's folder) -->"
TABLE_END = "<!-- lessons: end -->"
TABLE_HEAD = "| lesson | symptom in the logs | cause | fix (the line) | the check |\n|---|---|---|---|---|\n"
CELLS = ("symptom", "cause", "fix", "check")


def notebook(source: Path, target: Path) -> str:
    """The notebook jupytext makes from ``source``, keeping the cell ids ``target`` has (jupytext's ``--update``),
    outputs cleared, with jupytext.toml's metadata filter (the source's header keeps the kernel only); as text."""
    made = jupytext.read(source)
    config = load_jupytext_config(str(source.parent))
    if config is None:
        raise FileNotFoundError("no jupytext.toml above the lessons: the notebooks are made in a checkout")
    made.metadata["jupytext"] = {"notebook_metadata_filter": config.notebook_metadata_filter}
    if target.is_file():
        previous = nbformat.read(target, as_version=4)
        made = jupytext.combine.combine_inputs_with_outputs(made, previous, fmt="py:percent")
    for cell in made.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
        cell.metadata.pop("execution", None)
    return nbformat.writes(made) + "\n"


def readme_row(lesson: Lesson) -> str:
    """A core's row: its key and label, links to its notebook and executed copy, then the four cells."""
    if not lesson.readme or set(lesson.readme) != {"lesson", *CELLS}:
        raise ValueError(f"{lesson.folder.name}/lesson.yaml: core.readme needs lesson, {', '.join(CELLS)}")
    first = (
        f"**{lesson.key}** {lesson.readme['lesson']} · [notebook](notebooks/{lesson.notebook}.ipynb) · "
        f"[executed](docs/executed/{lesson.notebook}.ipynb)"
    )
    return "| " + " | ".join([first, *(" ".join(lesson.readme[cell].split()) for cell in CELLS)]) + " |\n"


def between_markers(text: str, made: str) -> str:
    """``text`` with what lies between the two markers replaced by ``made``."""
    return text[: text.index(TABLE_BEGIN) + len(TABLE_BEGIN)] + made + text[text.index(TABLE_END) :]


def readme(text: str) -> str:
    """README.md with its table of failures made again from the cores' folders, between the two markers."""
    rows = "".join(readme_row(lesson) for lesson in lessons().values() if lesson.is_core)
    return between_markers(text, "\n" + TABLE_HEAD + rows)


def cheatsheet(text: str) -> str:
    """docs/cheatsheet.md with each core's entry (its ``card.md``) between the two markers."""
    cards = "\n".join(lesson.card.read_text() for lesson in lessons().values() if lesson.is_core)
    return between_markers(text, "\n\n" + cards + "\n")


def generated(root: Path) -> dict[Path, str]:
    """Every generated file under ``root`` and the text it should have now. The deck comes last: it reads the
    cheat sheet as it will be written."""
    files = {
        root / "notebooks" / name: notebook(source, root / "notebooks" / name)
        for source, name in text_sources().items()
    }
    files[root / README] = readme((root / README).read_text())
    files[root / CHEATSHEET] = cheatsheet((root / CHEATSHEET).read_text())
    return files


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trl_clinic.course.generate", description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 when a file is out of date")
    options = parser.parse_args(argv)
    root = repo_root()
    stale = []
    for path, text in generated(root).items():
        if not path.is_file() or path.read_text() != text:
            stale.append(path.relative_to(root))
            if not options.check:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(text)
    if not options.check:
        try:
            (root / deck.DECK).write_text(deck.deck(root))
        except FileNotFoundError as missing:  # a new lesson's figure: `make executed` makes it
            print(f"the deck is not written: {missing}")
    for path in stale:
        print(f"{'out of date' if options.check else 'wrote'}: {path}")
    return 1 if options.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
