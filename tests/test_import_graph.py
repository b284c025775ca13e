"""No import circle among trl_clinic's modules: each module can be read, and imported, after the ones it uses.

The graph is read from the source with ``ast``, every import counted wherever it stands: at the top, inside a
function, under ``if TYPE_CHECKING``. An import deferred into a function does not break a circle, it hides
one (``parameters`` -> ``eras`` -> ``child`` -> ``parameters`` was held together that way until ``repo_root``
and ``Run`` moved into modules of their own). A module's edge goes to the module it names; a package's
``__init__`` that a submodule's import runs first is not counted, or every package that gathers its
submodules' names would be a circle.
"""

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"


def modules() -> dict[str, Path]:
    """Every module of the package by its dotted name (a package by its own name, for its ``__init__``)."""
    found = {}
    for path in (SRC / "trl_clinic").rglob("*.py"):
        parts = path.relative_to(SRC).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The package's modules that ``name`` imports: ``from X import y`` counts as ``X.y`` where that is a module."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    targets = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the package, one level up per dot after the first
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([node.module] if node.module else []))
            targets.update(f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names)
    found = set()
    for target in targets:
        while target and target not in known:  # a name inside a module: the module
            target = target.rpartition(".")[0]
        if target and target != name:
            found.add(target)
    return found


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports(name, path, known) for name, path in known.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The circles a depth-first walk meets, each as the modules along it, first and last the same."""
    found, state, stack = [], {}, []

    def visit(module: str) -> None:
        state[module] = "open"
        stack.append(module)
        for target in sorted(edges[module]):
            if state.get(target) == "open":
                found.append(stack[stack.index(target) :] + [target])
            elif target not in state:
                visit(target)
        stack.pop()
        state[module] = "done"

    for module in sorted(edges):
        if module not in state:
            visit(module)
    return found


def test_the_package_has_no_import_circle():
    found = cycles(graph())
    assert not found, "import circles:\n" + "\n".join(" -> ".join(circle) for circle in found)


def test_the_walk_finds_a_circle_and_deferred_imports():
    """The test itself can fail: a circle is found, and an import inside a function is an edge."""
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c", "a"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
    edges = graph()
    assert "trl_clinic.course.run" in edges["trl_clinic.course.child"]  # under TYPE_CHECKING and in _main
    assert "trl_clinic.course.workbook" in edges["trl_clinic.course.executed"]  # inside a function only
