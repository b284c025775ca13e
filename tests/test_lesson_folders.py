"""One folder per lesson (CONTRIBUTING.md, "Layout"): everything that belongs to one lesson lives in its folder, and
a copy of that folder under a new number is a lesson the workbook, the tests and the generated files pick up.

The copy is made the way a maintainer starts lesson 09 (``python -m trl_clinic.course.lessons new``), in a copy of
this checkout's tracked files, with that copy's ``src`` first on the path: nothing here is touched.
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from trl_clinic.course.generate import TABLE_BEGIN, cheatsheet, readme
from trl_clinic.course.lessons import CARD, SOURCES, lessons

ROOT = Path(__file__).resolve().parents[1]
SOURCE_KEY = "03"  # a core without an era: its copy runs here without building one
KEY, TOPIC = "09", "copied_reward_nan"


def test_the_generated_tables_are_what_the_folders_say():
    """README's table of failures and the cheat sheet's entries are made from the folders: `make generated`."""
    for path, make in ((ROOT / "README.md", readme), (ROOT / "docs" / "cheatsheet.md", cheatsheet)):
        text = path.read_text()
        assert TABLE_BEGIN in text and make(text) == text, f"{path.name} is out of date: run `make generated`"


def test_a_lesson_s_files_are_in_its_folder_and_only_there():
    """Each core's folder holds its text sources, lesson.yaml, card, mutations and numbers; no lesson file is left in
    the places a lesson used to be spread over."""
    for lesson in lessons().values():
        names = {path.name for path in lesson.folder.iterdir()}
        part = "" if lesson.is_core else "_deeper"
        needed = {SOURCES["core" if lesson.is_core else "deeper"], "lesson.yaml", f"mutations{part}.py"}
        needed |= {f"numbers{part}.json"} | ({CARD} if lesson.is_core else set())
        assert needed <= names, f"{lesson.folder.name} lacks {sorted(needed - names)}"
    for gone in ("sources", "tests/mutations", "tests/fixtures/numbers", "src/trl_clinic/course/companions"):
        assert not (ROOT / gone).exists(), f"{gone}/ is gone: a lesson's files live in its folder"
    assert not (ROOT / "src" / "trl_clinic" / "course" / "lessons.yaml").exists()


def run(command: list[str], cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    """A command in the copied checkout, importing that checkout's package."""
    env = {**os.environ, "PYTHONPATH": str(cwd / "src")}
    env.pop("TRL_CLINIC_ROOT", None)
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def copied(tmp_path_factory) -> Path:
    """A copy of the checkout's tracked files with lesson 03's folder copied to lesson 09, and `make generated`'s
    command run there."""
    checkout = tmp_path_factory.mktemp("checkout")
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, text=True, check=True)
    for name in filter(None, tracked.stdout.split("\0")):
        if (ROOT / name).is_file():
            (checkout / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, checkout / name)
    new = run([sys.executable, "-m", "trl_clinic.course.lessons", "new", KEY, TOPIC, "--from", SOURCE_KEY], checkout)
    assert new.returncode == 0, new.stderr
    generated = run([sys.executable, "-m", "trl_clinic.course.generate"], checkout)
    assert generated.returncode == 0, generated.stderr
    return checkout


def test_a_copied_folder_is_a_lesson_the_generated_files_and_the_runner_pick_up(copied):
    folder = copied / "src" / "trl_clinic" / "course" / "lessons" / f"lesson_{KEY}_{TOPIC}"
    changed = subprocess.run(["git", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True)
    assert f"lesson_{KEY}_" not in changed.stdout, "the copy was made here, not in the copied checkout"
    for notebook in (f"{KEY}_{TOPIC}", f"deeper/{KEY}_{TOPIC}_deeper", f"solutions/{KEY}_{TOPIC}"):
        assert (copied / "notebooks" / f"{notebook}.ipynb").is_file(), f"no notebooks/{notebook}.ipynb"
    assert f"| **{KEY}** " in (copied / "README.md").read_text()
    assert f"**{KEY} · " in (copied / "docs" / "cheatsheet.md").read_text()
    core = (folder / "core.py").read_text()
    assert f'start_run("{KEY}"' in core and f"lesson_{KEY}_{TOPIC}.companion import" in core
    listed = run([sys.executable, "-m", "trl_clinic.cli", "list"], copied, timeout=120)
    assert listed.returncode == 0 and f"{KEY}_{TOPIC}" in listed.stdout, listed.stderr
    checked = run([sys.executable, "-m", "trl_clinic.course.generate", "--check"], copied, timeout=120)
    assert checked.returncode == 0, checked.stdout


def test_the_tests_pick_up_a_copied_folder(copied):
    """The lesson tests are parametrized by the folders: the copy's checks, mutations, margins, shape and notebooks
    are tested, and pass, as lesson 03's are."""
    tests = ["tests/test_checks_can_fail.py", "tests/test_notebooks.py", "tests/test_course_shape.py"]
    tests += ["tests/test_lessons.py", "tests/test_lesson_companions.py", "tests/test_solutions.py"]
    done = run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:xdist", "-p", "no:cacheprovider",
         "-m", "not slow and not notebook", "-k", f"{KEY} or {TOPIC}", *tests],
        copied,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:]
    passed = int(done.stdout.strip().splitlines()[-1].split(" passed")[0].split()[-1])
    assert passed >= 10, done.stdout[-1000:]


@pytest.mark.slow
def test_a_copied_folder_runs_in_the_workbook(copied):
    """The copy's core on the cpu profile through `trl-clinic run`, as `make workbook` runs it: its checks pass."""
    out = copied / "out"
    done = run(
        [sys.executable, "-m", "trl_clinic.cli", "run", KEY, "--cores", "--profile", "cpu", "--out", str(out)], copied
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    assert (out / f"{KEY}_{TOPIC}" / "metrics.json").is_file()
