"""The rooms of the package, read from the imports of every module: the library (``trl_clinic.probes``,
``trl_clinic.checkup``, ``trl_clinic.watch``, ``trl_clinic.bisect``: what a user installs beside their own stack)
never imports the course (``trl_clinic.course``), so that it needs none of the course's tools or sizes; and inside
the library the check-up, the watch and bisect are siblings over ``probes``: none imports another, and ``probes``
imports none of them.

Every import counts, the deferred ones inside functions included, and so do the module names given to
``importlib.import_module`` or ``__import__`` as text."""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "trl_clinic"
ROOMS = ("probes", "checkup", "watch", "bisect")
LIBRARY = sorted(p for room in ROOMS for p in (PACKAGE / room).glob("*.py"))
# what each room of the library must not import
FORBIDDEN = {
    "probes": ("trl_clinic.course", "trl_clinic.checkup", "trl_clinic.watch", "trl_clinic.bisect"),
    "checkup": ("trl_clinic.course", "trl_clinic.watch", "trl_clinic.bisect"),
    "watch": ("trl_clinic.course", "trl_clinic.checkup", "trl_clinic.bisect"),
    "bisect": ("trl_clinic.course", "trl_clinic.checkup", "trl_clinic.watch"),
}
# The one sibling import allowed, by file and name: bisect's first-step script, which runs as a program in each
# side environment (never imported by the bisect package), runs the check-up there on that version's trainer,
# because issue 48's record holds the check-up's verdicts per version. The bisect package itself imports none.
ALLOWED = {"bisect/first_step.py": ("trl_clinic.checkup",)}


def _module(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _text_prefix(node: ast.expr) -> str | None:
    """The literal start of a module name given as text: a string, or an f-string's leading text."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr) and node.values and isinstance(node.values[0], ast.Constant):
        return node.values[0].value
    return None


def imported(path: Path, source: str | None = None) -> set[str]:
    """Every module ``path`` (or ``source`` standing there) imports, wherever the import stands: module level,
    functions, conditionals."""
    package = _module(path) if path.name == "__init__.py" else _module(path).rpartition(".")[0]
    names = set()
    for node in ast.walk(ast.parse(source if source is not None else path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the module's own package, one level up per extra dot
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Call) and node.args:
            function = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            prefix = _text_prefix(node.args[0]) if function in ("import_module", "__import__") else None
            if prefix:
                names.add(prefix.rstrip("."))
    return names


def _room(path: Path) -> str:
    return path.relative_to(PACKAGE).parts[0]


@pytest.mark.parametrize("path", LIBRARY, ids=[str(p.relative_to(PACKAGE)) for p in LIBRARY])
def test_the_library_never_imports_the_course(path):
    course = sorted(
        name for name in imported(path) if name == "trl_clinic.course" or name.startswith("trl_clinic.course.")
    )
    assert not course, f"{path.relative_to(PACKAGE)} imports the course: {course}"


@pytest.mark.parametrize("path", LIBRARY, ids=[str(p.relative_to(PACKAGE)) for p in LIBRARY])
def test_checkup_and_watch_are_siblings_over_probes(path):
    forbidden = FORBIDDEN[_room(path)]
    allowed = ALLOWED.get(str(path.relative_to(PACKAGE)), ())
    found = sorted(
        name
        for name in imported(path)
        if any(name == f or name.startswith(f + ".") for f in forbidden) and name not in allowed
    )
    assert not found, f"{path.relative_to(PACKAGE)} ({_room(path)}) imports {found}"


def test_the_reader_sees_deferred_relative_and_textual_imports():
    """The rule's reader itself: an import inside a function, a relative import and ``import_module`` count."""
    source = (
        "def later():\n    from trl_clinic.checkup import engine\n"
        "from ..checkup.view import TrainerView\n"
        "import importlib\nimportlib.import_module(f'trl_clinic.course.{name}')\n"
    )
    found = imported(PACKAGE / "watch" / "example.py", source)  # as if it stood in the watch
    assert {"trl_clinic.checkup.engine", "trl_clinic.checkup.view.TrainerView", "trl_clinic.course"} <= found
