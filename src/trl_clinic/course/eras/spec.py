"""Finding and reading eras: which the course defines, where each is built, and whether it is ready.

``eras/<name>.txt`` in a lesson's folder pins one of that lesson's eras (the check-up's era tests use them too);
they are package data, so a wheel install has them too;
``.eras/<name>/`` under the root (``paths.repo_root``: the checkout, or the cache folder outside one) is its
virtual environment, with a stamp (``.stamp.json``) that records the SHA-256 of the requirements file it was
built from and the versions its libraries report. An era is ready when its stamp matches its file and its
interpreter is there. A root given explicitly (an argument, or ``TRL_CLINIC_ROOT``: the tests' fake
checkouts) holds its own era files in ``eras/``. Nothing here builds or runs anything (``build`` and
``runner`` do), and nothing imports torch.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections import Counter
from pathlib import Path

from trl_clinic.course import paths
from trl_clinic.course.paths import ROOT_ENV, repo_root
from trl_clinic.probes.environments import CHILD_ENV, STAMP, python_in  # noqa: F401 (the eras' names for them)

LESSONS = Path(__file__).resolve().parents[1] / "lessons"  # each lesson's own: lessons/lesson_*/eras/*.txt
REQUIREMENTS_DIR = "eras"  # a fake checkout's era files, under the root it is given as
ERAS_DIR = ".eras"


def builds_on_demand(root: Path | None = None) -> bool:
    """Outside a checkout (a wheel install, no root given) an era builds when a lesson first needs it: there is
    no ``make eras`` to run. In a checkout ``make lab`` and ``make eras`` build them, and a lesson says so."""
    return given_root(root) is None and paths.checkout() is None


def given_root(root: Path | None = None) -> Path | None:
    """The root given explicitly (``root``, else ``$TRL_CLINIC_ROOT``: a fake checkout, with its own era files in
    ``eras/``), or None: the package's era files."""
    return None if root is None and not os.environ.get(ROOT_ENV) else (root or repo_root())


def packaged_files() -> list[Path]:
    """The course's era files: every lesson folder's ``eras/*.txt``."""
    return sorted(LESSONS.glob("lesson_*/eras/*.txt"), key=lambda path: path.stem)


def requirements_files(root: Path | None = None) -> dict[str, Path]:
    """Era name -> its pinned requirements file: the package's, unless a root is given (``root``,
    ``$TRL_CLINIC_ROOT``: a fake checkout keeps its own in ``eras/``). Two files of one name are an error: an
    era's name is its folder under ``.eras/``."""
    given = given_root(root)
    found = packaged_files() if given is None else sorted((given / REQUIREMENTS_DIR).glob("*.txt"))
    files = {path.stem: path for path in found}
    if len(files) != len(found):
        twice = sorted(name for name, count in Counter(path.stem for path in found).items() if count > 1)
        raise ValueError(f"era files of the same name in two places: {twice} (an era's name must be unique)")
    return files


def era_names(root: Path | None = None) -> list[str]:
    """Every era the course defines, sorted."""
    return sorted(requirements_files(root))


def requirements_file(name: str, root: Path | None = None) -> Path:
    """The era's requirements file; for an unknown era, a path that does not exist (``era_state`` says so)."""
    given = given_root(root)
    folder = LESSONS if given is None else given / REQUIREMENTS_DIR
    return requirements_files(root).get(name) or folder / f"{name}.txt"


def era_dir(name: str, root: Path | None = None) -> Path:
    return (root or repo_root()) / ERAS_DIR / name


def requirements_digest(path: Path) -> str:
    """The stamp's key: the requirements file's content, not its time (a checkout resets times)."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def read_stamp(name: str, root: Path | None = None) -> dict | None:
    try:
        return json.loads((era_dir(name, root) / STAMP).read_text())
    except (OSError, ValueError):
        return None


def era_state(name: str, root: Path | None = None) -> tuple[bool, str]:
    """``(True, "ready")`` or ``(False, why not)``: unknown, not built, built from another file, broken."""
    requirements = requirements_file(name, root)
    if not requirements.is_file():
        known = ", ".join(era_names(root)) or "none"
        return False, f"era {name} is not defined: no era file {requirements.name} (eras: {known})"
    remedy = "it builds on a lesson's first use" if builds_on_demand(root) else "run `make eras`"
    stamp = read_stamp(name, root)
    if stamp is None:
        return False, f"era {name} is not installed, {remedy}"
    if stamp.get("requirements_sha256") != requirements_digest(requirements):
        return False, f"era {name} was built from an older {requirements.name}, {remedy}"
    if not python_in(era_dir(name, root)).exists():
        return False, f"era {name} is broken (no interpreter in {era_dir(name, root)}), {remedy}"
    return True, "ready"


def era_python(name: str, root: Path | None = None) -> Path | None:
    """The era's interpreter when the era is built from its current requirements file, else None."""
    ready, _ = era_state(name, root)
    return python_in(era_dir(name, root)) if ready else None


def era_versions(name: str, root: Path | None = None) -> dict[str, str]:
    """The versions the era's build recorded (torch, transformers, trl, ...); empty when not built."""
    stamp = read_stamp(name, root) or {}
    return dict(stamp.get("versions", {}))
