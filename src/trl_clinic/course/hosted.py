"""A lesson in a hosted notebook (Colab, Kaggle, a lab's server): the one line that installs the course there,
and an "Open in Colab" link per lesson in the README.

One variable decides both: ``[project.urls] Repository`` in ``pyproject.toml``. Set, the install line is
``%pip install "trl-clinic[course] @ git+URL"`` and, for a GitHub repository, the README links each lesson
to Colab (its ``main`` branch); unset, the line installs the wheel that ``uv build`` makes, uploaded beside
the notebook, and the README says how to get the links. ``python -m trl_clinic.course.hosted`` writes the
line into every lesson's first cell (its text source; then ``make notebooks``) and the README's block between
its two markers; ``tests/test_hosted.py`` checks that they say what the variable says. A lesson needs
nothing else beside itself: the era files are package data, the eras build in the cache folder on first
use, and SmolLM2's weights are fetched there (``paths``, ``eras``, ``models``).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import tomllib

from trl_clinic.course.lessons import lessons
from trl_clinic.course.paths import repo_root

INSTALL_MARK = "**Hosted**"  # the install line's first word in a lesson's first cell
BEGIN, END = "<!-- hosted: begin (python -m trl_clinic.course.hosted writes this) -->", "<!-- hosted: end -->"
GITHUB = re.compile(r"^https://github\.com/([^/\s]+)/([^/\s]+?)(?:\.git)?/?$")
BRANCH = "main"


def project(root: Path) -> dict:
    return tomllib.loads((root / "pyproject.toml").read_text())["project"]


def repository_url(root: Path) -> str | None:
    """``[project.urls] Repository``, or None while it is not set."""
    return project(root).get("urls", {}).get("Repository")


def wheel_name(root: Path) -> str:
    """The file ``uv build`` (or ``pip wheel``) makes of this version: pure Python, any platform."""
    meta = project(root)
    return f"{meta['name'].replace('-', '_')}-{meta['version']}-py3-none-any.whl"


def install_command(root: Path) -> str:
    url = repository_url(root)
    if url:
        return f'%pip install "trl-clinic[course] @ git+{url}"'
    return f'%pip install "./{wheel_name(root)}[course]"'


def install_line(root: Path) -> str:
    """The line in each lesson's first cell (a markdown line, without the source's ``# ``)."""
    where = f"{INSTALL_MARK} (Colab, Kaggle, no clone): "
    if repository_url(root):
        return f"> {where}run `{install_command(root)}` first."
    return f"> {where}upload the wheel `uv build` makes, then run `{install_command(root)}` first."


def colab_url(repository: str, notebook: str) -> str | None:
    """Colab's address for ``notebooks/<notebook>.ipynb`` of a GitHub repository; None for another host."""
    found = GITHUB.match(repository)
    if not found:
        return None
    owner, name = found.groups()
    return f"https://colab.research.google.com/github/{owner}/{name}/blob/{BRANCH}/notebooks/{notebook}.ipynb"


def readme_block(root: Path) -> str:
    """What the README holds between its two markers."""
    lines = [
        BEGIN,
        "",
        "Any lesson also runs alone in a hosted notebook with CPython 3.11 to 3.13. Its first cell gives the one",
        f"line that installs the course there: `{install_command(root)}`. The eras build on the lesson's first",
        "use under `~/.cache/trl_clinic` (PyPI needed once; where they cannot, the lesson says which part did not",
        "run), and the lesson writes its figures and `metrics.json` to `outputs/` beside it.",
        "",
    ]
    url = repository_url(root)
    links = {key: colab_url(url, lesson.notebook) for key, lesson in lessons().items()} if url else {}
    if url and all(links.values()):
        lines += ["| lesson | |", "|---|---|"]
        for key, lesson in lessons().items():
            badge = "![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)"
            lines.append(f"| {key} {lesson.title} | [{badge}]({links[key]}) |")
    elif url:
        lines.append(f"Colab opens notebooks from GitHub only; {url} is not a GitHub repository.")
    else:
        lines.append(
            'An "Open in Colab" link per lesson appears here once `[project.urls] Repository` in pyproject.toml '
            "names the repository (then `python -m trl_clinic.course.hosted` and `make notebooks`)."
        )
    return "\n".join([*lines, "", END])


def with_install_line(source: str, root: Path) -> str:
    """A lesson's percent-format source with its first cell's install line written (replaced, or appended)."""
    start = source.index("# %% [markdown]\n")
    end = source.index("\n# %%", start + 1)
    cell = [line for line in source[start:end].rstrip("\n").split("\n") if INSTALL_MARK not in line]
    while cell[-1] == "#":
        cell.pop()
    cell += ["#", f"# {install_line(root)}"]
    return source[:start] + "\n".join(cell) + "\n" + source[end:]


def lesson_sources() -> list[Path]:
    """Every core's and deep dive's text source, in its lesson's folder."""
    return [lesson.source for lesson in lessons().values()]


def with_readme_block(readme: str, root: Path) -> str:
    start, end = readme.index(BEGIN), readme.index(END) + len(END)
    return readme[:start] + readme_block(root) + readme[end:]


def update(root: Path) -> list[Path]:
    """Write the install line into every lesson's source and the block into the README; the files changed."""
    changed = []
    targets = [(path, with_install_line) for path in lesson_sources()] + [(root / "README.md", with_readme_block)]
    for path, write in targets:
        text = path.read_text()
        new = write(text, root)
        if new != text:
            path.write_text(new)
            changed.append(path)
    return changed


def main() -> int:
    changed = update(repo_root())
    for path in changed:
        print(f"wrote {path}")
    if any(path.suffix == ".py" for path in changed):
        print("now `make notebooks` builds the notebooks from the sources")
    return 0


if __name__ == "__main__":
    sys.exit(main())
