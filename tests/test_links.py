"""Every relative link a reader can click leads somewhere: the markdown of the notebooks under ``notebooks/``, of
their executed copies under ``docs/executed/`` (which lie one folder deeper, so ``make executed`` points their links
again: ``trl_clinic.course.executed.relinked``), and the repository's own pages (README, CONTRIBUTING, ``docs/``,
``tools/``). A link to a file must reach a file that exists; a link into a markdown page's heading
(``checkup.md#the-known-bugs-table-...``) must name a heading GitHub makes that anchor for."""

import re
from pathlib import Path

import nbformat
import pytest

from trl_clinic.course.executed import LINK, is_relative, relinked

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted(
    [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *(ROOT / "docs").rglob("*.md"), *(ROOT / "tools").rglob("*.md")]
)
NOTEBOOKS = sorted((ROOT / "notebooks").rglob("*.ipynb")) + sorted((ROOT / "docs" / "executed").rglob("*.ipynb"))
FENCED = re.compile(r"^(```|~~~).*?^\1", re.MULTILINE | re.DOTALL)
CODE_SPAN = re.compile(r"`[^`\n]*`")


def markdown_of(path: Path) -> str:
    if path.suffix == ".ipynb":
        notebook = nbformat.read(path, as_version=4)
        return "\n\n".join(cell.source for cell in notebook.cells if cell.cell_type == "markdown")
    return path.read_text()


def links(text: str) -> list[str]:
    """The relative link targets of a page, outside code blocks and code spans (where a link is only text)."""
    text = CODE_SPAN.sub("", FENCED.sub("", text))
    return [match["target"] for match in LINK.finditer(text) if is_relative(match["target"])]


def github_anchors(markdown: str) -> set[str]:
    """The anchors GitHub gives a page's headings: the heading's text as rendered, lower-cased, every character
    that is not a letter, digit, space, hyphen or underscore dropped, spaces made hyphens; a repeat gets -1, -2."""
    anchors, seen = set(), {}
    for line in FENCED.sub("", markdown).splitlines():
        heading = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not heading:
            continue
        text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading[1])  # a link's text stays, its target goes
        text = re.sub(r"<[^>]+>", "", text).replace("`", "")
        slug = re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        anchors.add(slug if count == 0 else f"{slug}-{count}")
    return anchors


def broken_links(path: Path) -> list[str]:
    broken = []
    for target in links(markdown_of(path)):
        file, _, anchor = target.partition("#")
        if not file:
            continue
        resolved = (path.parent / file).resolve()
        if not resolved.exists():
            broken.append(f"{target} (no {resolved.relative_to(ROOT) if resolved.is_relative_to(ROOT) else resolved})")
        elif anchor and resolved.suffix == ".md" and anchor not in github_anchors(resolved.read_text()):
            broken.append(f"{target} (no heading with that anchor in {resolved.relative_to(ROOT)})")
    return broken


@pytest.mark.parametrize("path", PAGES + NOTEBOOKS, ids=[str(p.relative_to(ROOT)) for p in PAGES + NOTEBOOKS])
def test_every_relative_link_reaches_a_file(path):
    broken = broken_links(path)
    assert not broken, f"{path.relative_to(ROOT)}: broken links (run `make executed` for docs/executed):\n" + "\n".join(
        broken
    )


def test_the_executed_copies_exist_to_be_followed():
    assert (ROOT / "docs" / "executed").is_dir() and len(NOTEBOOKS) > len(list((ROOT / "notebooks").rglob("*.ipynb")))


def test_a_copy_one_folder_deeper_points_each_link_again(tmp_path):
    """From notebooks/06.ipynb to docs/executed/06.ipynb: a solution and a page are the repository's files, a deep
    dive that has a copy is that copy; web addresses and anchors of the same page stay as written."""
    notebooks, executed = tmp_path / "notebooks", tmp_path / "docs" / "executed"
    copies = {
        (notebooks / "deeper" / "06_x_deeper.ipynb").resolve(): (executed / "deeper" / "06_x_deeper.ipynb").resolve()
    }
    text = (
        "[solutions](solutions/06_x.ipynb), [page](../docs/checkup.md#the-table), [deeper](deeper/06_x_deeper.ipynb), "
        '[web](https://github.com/huggingface/trl/issues/2367), [here](#checks), <img src="figures/a.png">'
    )
    assert relinked(text, notebooks, executed, copies) == (
        "[solutions](../../notebooks/solutions/06_x.ipynb), [page](../checkup.md#the-table), "
        "[deeper](deeper/06_x_deeper.ipynb), [web](https://github.com/huggingface/trl/issues/2367), [here](#checks), "
        '<img src="../../notebooks/figures/a.png">'
    )


def test_github_anchors_follow_its_rules():
    page = (
        "# The known-bugs table (`src/trl_clinic/checkup/known_bugs.yaml`)\n## Proven where the bugs lived\n## A\n## A"
    )
    assert github_anchors(page) == {
        "the-known-bugs-table-srctrl_cliniccheckupknown_bugsyaml",
        "proven-where-the-bugs-lived",
        "a",
        "a-1",
    }
