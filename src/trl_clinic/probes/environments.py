"""Side environments pinned by a requirements file, built with uv: the machinery the course's eras and
``trl-clinic bisect`` share.

One place for what both need, so the library builds its environments without importing the course: uv beside
this interpreter, the local CPU torch wheel pip knows of (without it uv fetches PyPI's CUDA build, GBs), one
step run with its output kept for the error, a build lock per folder (one writer at a time, re-entrant in one
process), and the import check that reads the built versions. Nothing here imports torch.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

STAMP = ".stamp.json"  # in a built environment: what it was built from and the versions it reported
# What every process in a side environment sees: never the hub, never a GPU (an era script or a bisect record is a
# CPU measurement; a GPU would change the numbers and the old wheels may not know it), no user site-packages, no
# progress bars in the captured output. PYTHONDONTWRITEBYTECODE is emptied (an empty value is "unset" to Python):
# an environment is compiled lazily, each module by the first process that imports it, and read by the rest.
# Compiling a whole era at install took about 50 s of CPU (torch's every file), against about 15 s for what the era
# scripts import; machines that set PYTHONDONTWRITEBYTECODE=1 would otherwise compile on every run.
CHILD_ENV = {
    "HF_HUB_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "CUDA_VISIBLE_DEVICES": "",
    "PYTHONNOUSERSITE": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "PYTHONPATH": "",
    "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1",
    "HF_DATASETS_DISABLE_PROGRESS_BARS": "1",
    "PYTHONDONTWRITEBYTECODE": "",
}


class EnvironmentBuildError(RuntimeError):
    """A side environment could not be built; its folder is left without a stamp."""


def torch_pin(requirements: Path) -> str | None:
    """The version a requirements file pins torch to (``torch==X``), or None."""
    for line in requirements.read_text().splitlines():
        line = line.split("#", 1)[0].strip().replace(" ", "")
        if line.startswith("torch=="):
            return line.removeprefix("torch==")
    return None


def local_torch_links(version: str) -> Path | None:
    """The folder of the torch wheel that pip would install for ``torch==VERSION``, when it is a local file.

    On these machines pip is configured with a local CPU build of torch 2.13.0 that uv does not know
    about; without it uv takes PyPI's CUDA build (GBs). pip is asked (dry run, nothing installed or
    copied) where the wheel comes from; a remote wheel gives None, and uv then fetches torch itself. The
    report goes to a file: inside a Jupyter kernel pip colours what it prints (an era built on a lesson's
    first use read no JSON there, and took PyPI's torch).
    """
    with contextlib.suppress(OSError, subprocess.SubprocessError, ValueError, KeyError, IndexError):
        with tempfile.TemporaryDirectory(prefix="trl-clinic-pip-") as folder:
            report = Path(folder) / "report.json"
            done = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "pip",
                    "install",
                    "--dry-run",
                    "--quiet",
                    "--ignore-installed",
                    "--no-deps",
                    "--report",
                    str(report),
                    f"torch=={version}",
                ],
                capture_output=True,
                text=True,
                timeout=300,
            )
            if done.returncode == 0:
                url = json.loads(report.read_text())["install"][0]["download_info"]["url"]
                if url.startswith("file://"):
                    from urllib.parse import unquote, urlparse

                    return Path(unquote(urlparse(url).path)).parent
    return None


def find_links(links: Path | str | None) -> list[str]:
    """uv's ``--find-links`` options: torch's folder and an offline room's wheelhouse. uv reads UV_FIND_LINKS
    only when no --find-links is given, so the wheelhouse is named again beside torch's folder."""
    return [f"--find-links={link}" for link in [links, *os.environ.get("UV_FIND_LINKS", "").split()] if link]


def uv_command() -> list[str]:
    """uv beside this interpreter (the course extra installs it), else on PATH, else as a module."""
    beside = Path(sys.executable).with_name("uv")
    if beside.exists():
        return [str(beside)]
    found = shutil.which("uv")
    return [found] if found else [sys.executable, "-m", "uv"]


def run_step(command: list[str], what: str, *, quiet: bool = False) -> subprocess.CompletedProcess:
    """Run one step, its output printed through Python (a notebook shows it; a child's own stdout would go to
    the kernel's terminal), and what it said last in the error when it fails (no network, a missing wheel).
    Without colours: a Jupyter kernel sets FORCE_COLOR=1, and the message goes into metrics.json.
    ``quiet`` prints nothing (bisect prints one progress line per build instead)."""
    if not quiet:
        print("  $", " ".join(command), flush=True)
    plain = {k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "CLICOLOR_FORCE")} | {"NO_COLOR": "1"}
    done = subprocess.run(command, capture_output=True, text=True, env=plain)
    if not quiet:
        print(done.stdout + done.stderr, end="", flush=True)
    if done.returncode != 0:
        said = " ".join(done.stderr.split()[-60:])
        raise EnvironmentBuildError(f"{what} failed (exit code {done.returncode}): {said}")
    return done


_PROBE = (
    "import importlib, importlib.metadata as m, json, sys\n"
    "modules, names = sys.argv[1].split(','), sys.argv[2:]\n"
    "for entry in modules:\n"
    "    module, _, name = entry.partition(':')\n"
    "    loaded = importlib.import_module(module)\n"
    "    if name:\n"
    "        getattr(loaded, name)\n"
    "print(json.dumps({n: m.version(n) for n in names}))\n"
)


def probe_versions(python: Path, imports: tuple[str, ...], names: tuple[str, ...], env: dict[str, str]) -> dict:
    """Import the environment's libraries with its interpreter (``imports``: "module" or "module:name", a name
    read from the module, as trl's are imported lazily) and read the versions of ``names``."""
    done = subprocess.run(
        [str(python), "-c", _PROBE, ",".join(imports), *names],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
    )
    if done.returncode != 0:
        raise EnvironmentBuildError(f"the environment's libraries do not import:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def python_in(venv: Path) -> Path:
    """The interpreter of a virtual environment, on POSIX or Windows."""
    return venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def create_and_install(
    venv: Path, requirements: Path, *, uv: list[str], links: Path | str | None, quiet: bool = False
) -> None:
    """``uv venv`` then ``uv pip install -r requirements`` into it, from an empty folder. No bytecode compiled at
    install: a venv is compiled lazily, each module by the first process that imports it (about 25 CPU-seconds
    for what the scripts import, against about 50 for the whole venv)."""
    shutil.rmtree(venv, ignore_errors=True)
    run_step([*uv, "venv", "--quiet", "--python", sys.executable, str(venv)], "uv venv", quiet=quiet)
    install = [*uv, "pip", "install", "--quiet", "--python", str(python_in(venv)), "-r", str(requirements)]
    run_step([*install, *find_links(links)], "uv pip install", quiet=quiet)


def write_stamp(venv: Path, stamp_name: str, stamp: dict) -> None:
    """The stamp last, through a rename: a build that failed before it leaves none."""
    partial = venv / (stamp_name + ".partial")
    partial.write_text(json.dumps(stamp, indent=1))
    partial.replace(venv / stamp_name)


_LOCKED: set[Path] = set()  # the folders whose build lock this process holds


def flock(handle, operation: str) -> bool:
    """``fcntl.flock`` without blocking (``operation``: "exclusive" or "shared"); True when taken. Not
    POSIX: no lock, always taken."""
    try:
        import fcntl
    except ImportError:
        return True
    try:
        fcntl.flock(handle, (fcntl.LOCK_EX if operation == "exclusive" else fcntl.LOCK_SH) | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False


def holds_lock(folder: Path) -> bool:
    """Whether this process holds ``folder``'s build lock."""
    return folder in _LOCKED


@contextlib.contextmanager
def build_lock(folder: Path, what: str = "the eras") -> Iterator[None]:
    """One build at a time per folder (two processes must not write the same venv). Re-entrant in one
    process: a caller that holds it across several builds never lets a waiter in between two of them."""
    if folder in _LOCKED:
        yield
        return
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / ".lock", "w") as handle:
        if not flock(handle, "exclusive"):
            print(f"waiting for another build of {what} to end ({folder / '.lock'})", flush=True)
        while not flock(handle, "exclusive"):
            time.sleep(0.5)
        _LOCKED.add(folder)
        try:
            yield
        finally:
            _LOCKED.discard(folder)
