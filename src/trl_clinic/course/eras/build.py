"""Building eras with uv (``make eras``): once per content of their requirements file, one build at a time.

``build_era`` makes ``.eras/<name>/`` with ``uv venv`` and ``uv pip install -r requirements/<name>.txt``, imports
the era's libraries with its interpreter (``PROBE_IMPORTS``) and writes the stamp last, so that a failed
build leaves none. A file lock (``.eras/.lock``) lets one process build at a time per checkout; ``main``
(``python -m trl_clinic.course.eras``) can take it and hand the builds to a forked background process
(``--background``), and ``wait_for_builds`` lets a lesson or a test wait for that process to end.
"""

from __future__ import annotations

import argparse
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

from trl_clinic.course.eras.spec import (
    CHILD_ENV,
    ERAS_DIR,
    STAMP,
    era_dir,
    era_names,
    era_state,
    python_in,
    requirements_digest,
    requirements_file,
)
from trl_clinic.course.paths import repo_root

VERSIONED = ("torch", "transformers", "trl", "peft", "accelerate", "datasets")


class EraBuildError(RuntimeError):
    """An era could not be built; its folder is left without a stamp."""


def _torch_pin(requirements: Path) -> str | None:
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


def uv_command() -> list[str]:
    """uv beside this interpreter (the course extra installs it), else on PATH, else as a module."""
    beside = Path(sys.executable).with_name("uv")
    if beside.exists():
        return [str(beside)]
    found = shutil.which("uv")
    return [found] if found else [sys.executable, "-m", "uv"]


def _run(command: list[str], what: str) -> None:
    """Run one step, its output printed through Python (a notebook shows it; a child's own stdout would go to
    the kernel's terminal), and what it said last in the error when it fails (no network, a missing wheel).
    Without colours: a Jupyter kernel sets FORCE_COLOR=1, and the message goes into metrics.json."""
    print("  $", " ".join(command), flush=True)
    plain = {k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "CLICOLOR_FORCE")} | {"NO_COLOR": "1"}
    done = subprocess.run(command, capture_output=True, text=True, env=plain)
    print(done.stdout + done.stderr, end="", flush=True)
    if done.returncode != 0:
        said = " ".join(done.stderr.split()[-60:])
        raise EraBuildError(f"{what} failed (exit code {done.returncode}): {said}")


# Imported by the build's check in the new era: an undeclared dependency (trl 0.11's rich) shows here.
# "module:name" also reads a name from the module (trl's names are imported lazily, on first use). An era
# whose scripts need less says so in a line of its requirements file, "# imports: torch trl:SFTTrainer".
PROBE_IMPORTS = ("torch", "transformers", "trl:SFTTrainer", "trl:DPOTrainer")
IMPORTS_LINE = "# imports:"


def probe_imports(requirements: Path) -> tuple[str, ...]:
    """What the build's check imports: the requirements file's "# imports:" line, else ``PROBE_IMPORTS``."""
    for line in requirements.read_text().splitlines():
        if line.startswith(IMPORTS_LINE):
            return tuple(line[len(IMPORTS_LINE) :].split())
    return PROBE_IMPORTS


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


def _probe_versions(python: Path, imports: tuple[str, ...]) -> dict[str, str]:
    """Import the era's libraries with its interpreter (``imports``) and read their versions."""
    done = subprocess.run(
        [str(python), "-c", _PROBE, ",".join(imports), *VERSIONED],
        capture_output=True,
        text=True,
        env={**os.environ, **CHILD_ENV},
    )
    if done.returncode != 0:
        raise EraBuildError(f"the era's libraries do not import:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


_LOCKED: set[Path] = set()  # the checkouts' .eras folders whose build lock this process holds


def _flock(handle, operation: str) -> bool:
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


@contextlib.contextmanager
def _build_lock(root: Path) -> Iterator[None]:
    """One build at a time per checkout (two `make` runs must not write the same venv). Re-entrant in one
    process: ``main`` holds it across all its builds, so a lesson that waits for a background build
    (``make lab``) never wakes up in the gap between two eras."""
    folder = root / ERAS_DIR
    if folder in _LOCKED:
        yield
        return
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / ".lock", "w") as handle:
        if not _flock(handle, "exclusive"):
            print(f"waiting for another build of the eras to end ({folder / '.lock'})", flush=True)
        while not _flock(handle, "exclusive"):
            time.sleep(0.5)
        _LOCKED.add(folder)
        try:
            yield
        finally:
            _LOCKED.discard(folder)


def wait_for_builds(root: Path, timeout: float) -> bool:
    """Wait while another process builds eras (``make lab`` starts the build in the background and
    JupyterLab at once); True when one was running and has ended within ``timeout``."""
    lock = root / ERAS_DIR / ".lock"
    if not lock.is_file() or (root / ERAS_DIR) in _LOCKED:
        return False
    with open(lock) as handle:
        if _flock(handle, "shared"):
            return False
        print(f"waiting for the eras being built in the background (log: {ERAS_DIR}/build.log)", flush=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            time.sleep(1)
            if _flock(handle, "shared"):
                return True
    return False


def build_era(
    name: str,
    root: Path | None = None,
    *,
    installer: list[str] | None = None,
    torch_links: Path | None | str = "auto",
    force: bool = False,
) -> bool:
    """Build era ``name`` unless its stamp matches its requirements file; True when it built.

    The stamp is written last, only after the install and an import check succeeded, so a failed
    build leaves none (and the next ``make eras`` tries again from an empty folder).
    """
    requirements = requirements_file(name, root)
    if not requirements.is_file():
        known = ", ".join(era_names(root)) or "none"
        raise EraBuildError(f"no {requirements.name} in {requirements.parent} (eras: {known})")
    with _build_lock(root or repo_root()):
        if not force and era_state(name, root)[0]:
            print(f"era {name}: up to date ({era_dir(name, root)})", flush=True)
            return False
        start = time.perf_counter()
        venv = era_dir(name, root)
        print(f"era {name}: building {venv} from {requirements.name}", flush=True)
        shutil.rmtree(venv, ignore_errors=True)
        try:
            uv = installer or uv_command()
            _run([*uv, "venv", "--quiet", "--python", sys.executable, str(venv)], "uv venv")
            links = torch_links
            if links == "auto":
                pin = _torch_pin(requirements)
                links = local_torch_links(pin) if pin else None
            # uv reads UV_FIND_LINKS (an offline room's wheelhouse) only when no --find-links is given
            extra = [f"--find-links={link}" for link in [links, *os.environ.get("UV_FIND_LINKS", "").split()] if link]
            # no --compile-bytecode: the import check below compiles what it imports (CHILD_ENV), and the
            # era scripts' first runs the rest they need
            _run(
                [*uv, "pip", "install", "--quiet", "--python", str(python_in(venv)), "-r", str(requirements), *extra],
                "uv pip install",
            )
            versions = _probe_versions(python_in(venv), probe_imports(requirements))
            stamp = {
                "requirements_sha256": requirements_digest(requirements),
                "versions": versions,
                "torch_links": str(links) if links else None,
                "built_in_s": round(time.perf_counter() - start, 1),
            }
            partial = venv / (STAMP + ".partial")
            partial.write_text(json.dumps(stamp, indent=1))
            partial.replace(venv / STAMP)
        except BaseException:
            (venv / STAMP).unlink(missing_ok=True)
            raise
        print(
            f"era {name}: built in {time.perf_counter() - start:.1f} s: "
            + ", ".join(f"{k} {v}" for k, v in versions.items()),
            flush=True,
        )
        return True


def main(argv: list[str] | None = None) -> int:
    """``python -m trl_clinic.course.eras [NAME ...]``: build the named eras (all by default); exit 1 on failure."""
    parser = argparse.ArgumentParser(prog="python -m trl_clinic.course.eras", description=main.__doc__)
    parser.add_argument("names", nargs="*", help="eras to build (default: every one the course defines)")
    parser.add_argument("--force", action="store_true", help="rebuild even when the stamp matches")
    parser.add_argument("--list", action="store_true", help="say which eras are ready and exit")
    parser.add_argument(
        "--log", type=Path, default=None, help=f"the background build's log (default {ERAS_DIR}/build.log)"
    )
    parser.add_argument(
        "--background",
        action="store_true",
        help=f"take the build lock, then build in a background process (log: {ERAS_DIR}/build.log) "
        "and return at once: what needs an era waits for the lock (make test, make lab)",
    )
    args = parser.parse_args(argv)
    names = args.names or era_names()
    if args.list:
        for name in names:
            print(f"{name}: {era_state(name)[1]}")
        return 0
    if args.background:
        return _build_in_background(names, args.force, args.log)
    return _build_all(names, args.force)


def _build_in_background(names: list[str], force: bool, log: Path | None = None) -> int:
    """The lock is taken before this returns, so a test or lesson started next cannot find an era missing in
    the gap before the build begins: it waits on the lock instead (``wait_for_builds``). The forked child
    inherits the locked file and releases it when its last build ends."""
    root = repo_root()
    log = log or root / ERAS_DIR / "build.log"
    with _build_lock(root):
        if os.fork():
            print(f"building eras {', '.join(names)} in the background (log: {log})", flush=True)
            os._exit(0)
        os.setsid()
        with open(log, "w") as out, open(os.devnull) as nothing:
            os.dup2(nothing.fileno(), 0)
            os.dup2(out.fileno(), 1)
            os.dup2(out.fileno(), 2)
        status = _build_all(names, force)
    os._exit(status)


def _build_all(names: list[str], force: bool) -> int:
    failed = []
    with _build_lock(repo_root()):
        for name in names:
            try:
                build_era(name, force=force)
            except EraBuildError as error:
                print(f"era {name}: {error}", file=sys.stderr, flush=True)
                failed.append(name)
    if failed:
        print(f"eras not built: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0
