"""What the lessons take from their companions exists there: a name a notebook calls but its companion lost (an
import that only re-exported it, removed as unused) fails here in seconds instead of minutes into a deep dive."""

import ast
import importlib
import os
import sys
from pathlib import Path

import pytest

from trl_clinic.course.lessons import text_sources

LESSONS = "trl_clinic.course.lessons"


def companion_names(source: Path) -> set[tuple[str, str]]:
    """(companion module, name) for every ``alias.name`` a lesson's source reads from a companion it imports."""
    tree = ast.parse(source.read_text())
    aliases = {
        alias.asname or alias.name: f"{node.module}.{alias.name}"
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(f"{LESSONS}.lesson_")
        for alias in node.names
        if alias.name.startswith("companion")
    }
    return {
        (aliases[node.value.id], node.attr)
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases
    }


@pytest.mark.parametrize("source", text_sources(), ids=lambda path: f"{path.parent.name}/{path.name}")
def test_every_companion_name_a_lesson_uses_exists(source):
    missing = sorted(
        f"{module}.{name}"
        for module, name in companion_names(source)
        if not hasattr(importlib.import_module(module), name)
    )
    assert missing == []


def test_a_source_that_calls_a_lost_name_is_caught(tmp_path):
    lesson = tmp_path / "lesson.py"
    lesson.write_text(f"from {LESSONS}.lesson_09_topic import companion as topic\ntopic.nowhere()\n")
    assert companion_names(lesson) == {(f"{LESSONS}.lesson_09_topic.companion", "nowhere")}


def test_the_command_runs_without_an_installed_script(monkeypatch, tmp_path):
    """On the GPU machine the package runs from its source on PYTHONPATH: no console script beside the Python."""
    from trl_clinic.course.lessons.lesson_06_checkup_tour import companion as checkup_tour

    python = tmp_path / "bin" / "python"  # outside the venv: its packages come from PYTHONPATH, as there
    python.parent.mkdir()
    python.symlink_to(sys.executable)
    monkeypatch.setattr(sys, "executable", str(python))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(path for path in sys.path if path))
    done = checkup_tour.trl_clinic("--help", timeout=120)
    assert done.returncode == 0 and "checkup" in done.stdout and done.argv == ["trl-clinic", "--help"]
