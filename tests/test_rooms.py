"""The library and the course are two rooms (DEVELOPERS.md, ../shared/STYLE.md): the library
(``trl_clinic.probes``, ``trl_clinic.checkup`` and what a user installs beside their own stack) never
imports the course (``trl_clinic.course``), so that it needs none of the course's tools or sizes."""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "trl_clinic"
LIBRARY = sorted(p for room in ("probes", "checkup", "watch") for p in (PACKAGE / room).glob("*.py"))


def imported(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


@pytest.mark.parametrize("path", LIBRARY, ids=[str(p.relative_to(PACKAGE)) for p in LIBRARY])
def test_the_library_never_imports_the_course(path):
    course = sorted(
        name for name in imported(path) if name == "trl_clinic.course" or name.startswith("trl_clinic.course.")
    )
    assert not course, f"{path.relative_to(PACKAGE)} imports the course: {course}"
