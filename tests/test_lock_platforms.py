"""The lock holds on every platform and Python the course claims (requirements-lock.txt's header): uv resolves
pyproject's extras against it for each, wheels only, from PyPI (the network these tests need; 15 to 25 s here, four
resolutions side by side: more only contend for the cores), and gets exactly the lock's pins whose markers hold
there."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from functools import cache
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from test_packaging import LOCK, ROOT, locked

# uv's name for each platform, and the markers a Python there reports. Linux at glibc 2.28 and macOS 14, the
# oldest that torch 2.13.0's wheels accept (manylinux_2_28_*, macosx_14_0_arm64).
PLATFORMS = {
    "x86_64-manylinux_2_28": {"sys_platform": "linux", "platform_machine": "x86_64", "os_name": "posix"},
    "aarch64-manylinux_2_28": {"sys_platform": "linux", "platform_machine": "aarch64", "os_name": "posix"},
    "aarch64-apple-darwin": {"sys_platform": "darwin", "platform_machine": "arm64", "os_name": "posix"},
    "x86_64-pc-windows-msvc": {"sys_platform": "win32", "platform_machine": "AMD64", "os_name": "nt"},
}
SYSTEMS = {"linux": "Linux", "darwin": "Darwin", "win32": "Windows"}
PYTHONS = ("3.11", "3.12", "3.13")  # the first of each: 3.11 is 3.11.0, below soupsieve 4.1.3's 3.11.5
CASES = [(platform, python) for platform in PLATFORMS for python in PYTHONS]
MACOS = "14.0"


def uv() -> str:
    beside = Path(sys.executable).with_name("uv")
    return str(beside) if beside.exists() else shutil.which("uv") or pytest.fail("uv is not installed (test extra)")


def compile_(*args: str, output: str | None = None) -> subprocess.CompletedProcess:
    """`uv pip compile pyproject.toml ...` from PyPI alone: no uv.toml, no find-links (the local torch build
    would stand in for PyPI's), no Python download (uv looks for one for each --python-version)."""
    env = {**os.environ, "UV_PYTHON_DOWNLOADS": "never", "MACOSX_DEPLOYMENT_TARGET": MACOS}
    command = [uv(), "pip", "compile", "pyproject.toml", "--no-config", "--no-header", "--no-annotate"]
    to = ["-o", output] if output else []  # else stdout: uv takes `-o -` for a file named "-"
    return subprocess.run([*command, *args, *to], cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)


def pins(output: str) -> dict[str, str]:
    found = {}
    for line in output.splitlines():
        if line.strip() and not line.startswith("#"):
            requirement = Requirement(line)
            found[canonicalize_name(requirement.name)] = str(requirement.specifier).removeprefix("==")
    return found


@cache
def resolutions() -> dict[tuple[str, str], subprocess.CompletedProcess]:
    """Every platform and Python, four at a time, once per test session."""
    with ThreadPoolExecutor(max_workers=4) as pool:
        done = pool.map(
            lambda case: compile_(
                *("--extra", "course", "--extra", "test", "-c", str(LOCK), "--only-binary", ":all:"),
                *("--python-platform", case[0], "--python-version", case[1]),
            ),
            CASES,
        )
        return dict(zip(CASES, done))


def environment(platform: str, python: str) -> dict[str, str]:
    markers = PLATFORMS[platform]
    return {
        **markers,
        "platform_system": SYSTEMS[markers["sys_platform"]],
        "python_version": python,
        "python_full_version": f"{python}.0",
        "implementation_name": "cpython",
        "platform_python_implementation": "CPython",
    }


@pytest.mark.parametrize(("platform", "python"), CASES)
def test_the_lock_resolves_wheels_only_to_itself(platform, python):
    """A wheel of every package for the platform (no sdist to build on a learner's laptop), and nothing the lock
    leaves out or pins otherwise: the resolution is the lock's pins for that platform and Python, exactly."""
    result = resolutions()[platform, python]
    assert result.returncode == 0, f"{platform}, Python {python}:\n{result.stderr}"
    assert pins(result.stdout) == locked(environment(platform, python))


def test_the_lock_is_uvs_universal_resolution_of_pyproject(tmp_path):
    """Compiled again as its header says (the lock itself as uv's preferences), it comes out the same: no pin
    edited by hand, none missing for a range pyproject.toml now asks for."""
    preferences = tmp_path / "lock.txt"
    shutil.copy(LOCK, preferences)
    universal = ("--extra", "course", "--extra", "test", "--universal", "--python-version", "3.11")
    result = compile_(*universal, output=str(preferences))
    assert result.returncode == 0, result.stderr
    body = [line for line in LOCK.read_text().splitlines() if not line.startswith("#")]
    assert preferences.read_text().splitlines() == body


def test_the_course_needs_python_311_and_the_library_keeps_310():
    """pyproject says >=3.10 for the library; the course's extra cannot install on 3.10, and uv says why."""
    course = compile_("--extra", "course", "--python-platform", "x86_64-manylinux_2_28", "--python-version", "3.10")
    assert course.returncode != 0 and "Python>=3.11" in course.stderr, course.stderr
    library = compile_("--python-platform", "x86_64-manylinux_2_28", "--python-version", "3.10")
    assert library.returncode == 0, library.stderr
    assert "torch" in pins(library.stdout) and "transformers" in pins(library.stdout)
