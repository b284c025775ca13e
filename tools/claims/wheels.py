"""Released wheels, each downloaded once into a cache (`pip download --no-deps`), and the files inside them read
as text: what the register's quotes are checked against. A wheel is the release a user installs, so a line read
here is the line they run."""

from __future__ import annotations

import re
import subprocess
import sys
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
    prefix = f"{_stem(package)}-{version}-"
    found = [p for p in folder.glob("*.whl") if p.name.lower().startswith(prefix.lower())]
    return min(found) if found else None


def wheel(package: str, version: str, folder: Path = CACHE) -> Path:
    """The wheel of `package==version` in `folder`, downloaded once with pip (no dependencies, binary only)."""
    folder.mkdir(parents=True, exist_ok=True)
    found = _cached(package, version, folder)
    if found is None:
        command = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:"]
        done = subprocess.run(
            [*command, f"{package}=={version}", "-d", str(folder)], capture_output=True, text=True, check=False
        )
        found = _cached(package, version, folder)
        if found is None:
            said = (done.stderr or done.stdout).strip().splitlines()
            raise WheelError(f"{package}=={version}: no wheel downloaded ({said[-1] if said else 'pip said nothing'})")
    return found


@cache
def names(package: str, version: str, folder: Path = CACHE) -> frozenset[str]:
    """Every file path inside the wheel."""
    with zipfile.ZipFile(wheel(package, version, folder)) as archive:
        return frozenset(archive.namelist())


@cache
def read(package: str, version: str, path: str, folder: Path = CACHE) -> str | None:
    """The text of `path` inside the wheel, or None where this release has no such file."""
    if path not in names(package, version, folder):
        return None
    with zipfile.ZipFile(wheel(package, version, folder)) as archive:
        return archive.read(path).decode("utf-8", errors="replace")
