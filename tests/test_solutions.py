"""Every exercise has a worked solution, and every solution still gives the answer it claims.

A lesson's solutions live beside it in ``notebooks/solutions/<notebook>.py``: one ``exercise_N``
function per numbered item of the lesson's Exercise cell, each asserting the claim its answer makes.
Running the file runs them all, on the CPU, as a learner would from the repository root.
"""

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import jupytext
import pytest

from trl_clinic.course.workbook import find_lessons

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = find_lessons(ROOT / "notebooks")
SOLUTIONS = ROOT / "notebooks" / "solutions"
TIME_LIMIT_S = 180  # each file is written to finish in about 40 s on one thread; a loaded CI machine is slower


def exercise_items(notebook: Path) -> list[str]:
    """The numbered items of the markdown cell headed "Exercise"."""
    cells = [cell.source for cell in jupytext.read(notebook.with_suffix(".py")).cells
             if cell.cell_type == "markdown" and re.search(r"^#+ .*Exercise", cell.source, re.M)]
    assert len(cells) == 1, f"{notebook.stem} must have one Exercise cell"
    return re.findall(r"^(\d+)\. ", cells[0], re.M)


def exercise_functions(solution: Path) -> list[str]:
    return [node.name for node in ast.parse(solution.read_text()).body
            if isinstance(node, ast.FunctionDef) and node.name.startswith("exercise_")]


@pytest.mark.parametrize("notebook", NOTEBOOKS.values(), ids=NOTEBOOKS.keys())
def test_every_exercise_has_a_worked_solution(notebook):
    solution = SOLUTIONS / f"{notebook.stem}.py"
    assert solution.exists(), f"{notebook.stem}'s exercises have no worked solution at {solution.relative_to(ROOT)}"
    items = exercise_items(notebook)
    assert exercise_functions(solution) == [f"exercise_{n}" for n in items], (
        f"{solution.name} must define exercise_1 .. exercise_{len(items)}, one per item, in order")
    assert f"solutions/{solution.name}" in notebook.with_suffix(".py").read_text(), (
        f"{notebook.stem}'s Exercise cell must link its worked solution")


@pytest.mark.parametrize("notebook", NOTEBOOKS.values(), ids=NOTEBOOKS.keys())
def test_worked_solution_runs_and_its_answers_hold(notebook, tmp_path):
    solution = SOLUTIONS / f"{notebook.stem}.py"
    if not solution.exists():
        pytest.skip("no solution (the test above fails)")
    # the clinic's cache as the lessons use it: the tokenizer and SmolLM2's dequantized copy are made once
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "MPLBACKEND": "Agg", "TRL_CLINIC_PROGRESS": "0"}
    done = subprocess.run([sys.executable, str(solution)], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=TIME_LIMIT_S)
    assert done.returncode == 0, f"{solution.name} failed:\n{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
    assert done.stdout.strip(), f"{solution.name} printed no answers"
