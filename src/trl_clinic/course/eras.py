"""Eras: side environments with the library versions where a bug lived, and running a script in one.

Three lessons show their failure through a re-creation on today's stack, because today's libraries
fixed or removed the old code. An *era* lets a lesson run the real old code beside it:

* ``eras/<name>.txt`` at the repository root pins one era (old transformers, trl, peft, accelerate,
  torch 2.13.0 and what the old versions forgot to declare); its header says which lesson uses it.
* ``make eras`` (``python -m trl_clinic.course.eras [NAME ...]``) builds ``.eras/<name>/``, a virtual
  environment made by uv, once: a stamp file records the SHA-256 of the requirements file, so an era
  is rebuilt only when its file changes, and a failed build leaves no stamp.
* ``run_in_era(name, script, spec, workdir)`` runs a standalone script of ``trl_clinic/course/then/`` with
  the era's interpreter, through ``trl_clinic.course.child.run_child``, and returns its JSON result. An era
  that is not built gives ``status="skipped"`` and a message that says to run ``make eras``; a
  script that fails gives ``status="failed"``; nothing here raises into the notebook.

The contract of an era script (they cannot import ``trl_clinic``: its code needs today's libraries):
``python then_XX.py SPEC.json RESULT.json``; the spec is a JSON object written by the notebook (paths
in it are absolute), the result a JSON object the script writes before it exits 0. Large arrays (a
gradient) go to a ``.pt`` file whose path the spec names; ``trl_clinic.course.handshake`` builds the specs
and reads those files on today's side.

Where things are: the eras' requirements files and ``.eras/`` are found at the repository root,
three folders above this file (``src/trl_clinic/course/eras.py``), so eras work from a checkout (an editable
install, as ``make`` does); ``TRL_CLINIC_ROOT`` overrides that root. This module imports no torch.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from trl_clinic.course.child import run_child
from trl_clinic.course.paths import repo_root

REQUIREMENTS_DIR = "eras"
ERAS_DIR = ".eras"
STAMP = ".stamp.json"
THEN_DIR = Path(__file__).resolve().parent / "then"
VERSIONED = ("torch", "transformers", "trl", "peft", "accelerate", "datasets")
# What every era child sees: never the hub, never a GPU (the era scripts measure CPU behaviour; a GPU
# would change the numbers and the old wheels may not know it), and no user site-packages.
# PYTHONDONTWRITEBYTECODE is emptied (an empty value is "unset" to Python): an era's venv is compiled
# lazily, each module by the first process that imports it, and read by the rest. Compiling the whole
# venv at install took about 50 s of CPU per era (torch's every file), against about 15 s for what the
# era scripts import; machines that set PYTHONDONTWRITEBYTECODE=1 would otherwise compile on every run.
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


def era_names(root: Path | None = None) -> list[str]:
    """Every era the repository defines (``eras/*.txt``), sorted."""
    folder = (root or repo_root()) / REQUIREMENTS_DIR
    return sorted(path.stem for path in folder.glob("*.txt"))


def requirements_file(name: str, root: Path | None = None) -> Path:
    return (root or repo_root()) / REQUIREMENTS_DIR / f"{name}.txt"


def era_dir(name: str, root: Path | None = None) -> Path:
    return (root or repo_root()) / ERAS_DIR / name


def _python_in(venv: Path) -> Path:
    return venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def requirements_digest(path: Path) -> str:
    """The stamp's key: the requirements file's content, not its time (a checkout resets times)."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def read_stamp(name: str, root: Path | None = None) -> dict | None:
    try:
        return json.loads((era_dir(name, root) / STAMP).read_text())
    except (OSError, ValueError):
        return None


def era_state(name: str, root: Path | None = None) -> tuple[bool, str]:
    """``(True, "ready")`` or ``(False, why not)``: unknown, not built, built from another file, broken."""
    requirements = requirements_file(name, root)
    if not requirements.is_file():
        known = ", ".join(era_names(root)) or "none"
        return False, f"era {name} is not defined: no {REQUIREMENTS_DIR}/{name}.txt (eras: {known})"
    stamp = read_stamp(name, root)
    if stamp is None:
        return False, f"era {name} is not installed, run `make eras`"
    if stamp.get("requirements_sha256") != requirements_digest(requirements):
        return False, f"era {name} was built from an older {REQUIREMENTS_DIR}/{name}.txt, run `make eras`"
    if not _python_in(era_dir(name, root)).exists():
        return False, f"era {name} is broken (no interpreter in {ERAS_DIR}/{name}), run `make eras`"
    return True, "ready"


def era_python(name: str, root: Path | None = None) -> Path | None:
    """The era's interpreter when the era is built from its current requirements file, else None."""
    ready, _ = era_state(name, root)
    return _python_in(era_dir(name, root)) if ready else None


def era_versions(name: str, root: Path | None = None) -> dict[str, str]:
    """The versions the era's build recorded (torch, transformers, trl, ...); empty when not built."""
    stamp = read_stamp(name, root) or {}
    return dict(stamp.get("versions", {}))


# ---------------------------------------------------------------------------------------------------
# Running a script in an era
# ---------------------------------------------------------------------------------------------------


@dataclass
class EraRun:
    """What running a script in an era gave: ``finished`` (``result`` holds its JSON), ``skipped``
    (the era is not built: nothing ran) or ``failed`` (the script or its environment broke)."""

    era: str
    script: str
    status: str
    message: str
    result: dict | None = None
    versions: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0
    stderr: str = ""

    @property
    def finished(self) -> bool:
        return self.status == "finished"

    @property
    def skipped(self) -> bool:
        return self.status == "skipped"

    def describe(self) -> str:
        versions = ", ".join(f"{k} {v}" for k, v in self.versions.items() if k != "torch")
        if self.finished:
            return f"era {self.era} ({versions}): {self.script} finished in {self.seconds:.1f} s"
        return self.message  # it starts with the status: "skipped: ..." or "failed: ..."

    def to_metrics(self) -> dict:
        """A JSON-safe record for ``metrics.json``: the era's results come from the real old code."""
        return {
            "era": self.era,
            "script": self.script,
            "status": self.status,
            "message": self.message,
            "kind": "measured",
            "versions": self.versions,
            "seconds": round(self.seconds, 2),
            "result": self.result,
        }


def then_script(script: str | Path) -> Path:
    """A script of ``trl_clinic/course/then/`` by name (``"then_02_accumulation"``), or any path to a .py file."""
    path = Path(script)
    if path.suffix != ".py":
        path = THEN_DIR / f"{path.name}.py"
    elif not path.is_absolute() and not path.exists():
        path = THEN_DIR / path.name
    return path


def run_in_era(
    era: str, script: str | Path, spec: dict, workdir: str | Path, *, timeout: float = 600, root: Path | None = None
) -> EraRun:
    """Run ``script`` with era ``era``'s interpreter as ``script SPEC.json RESULT.json`` and read its result.

    ``spec`` is written to ``workdir/<script>.<era>.spec.json``; the script runs with ``workdir`` as its
    current folder, offline and without GPUs. Never raises: a missing era is ``skipped`` (with the
    message "era X is not installed, run `make eras`"), anything else that goes wrong is ``failed``.
    An era still being built in the background (``make lab``) is waited for, up to ``timeout``.
    """
    path = then_script(script)
    name = path.stem
    try:
        ready, why = era_state(era, root)
        if not ready and wait_for_builds(root or repo_root(), timeout):
            ready, why = era_state(era, root)
        versions = era_versions(era, root)
        if not ready:
            return EraRun(era, name, "skipped", f"skipped: {why}", versions=versions)
        if not path.is_file():
            return EraRun(era, name, "failed", f"failed: no era script {path}", versions=versions)
        workdir = Path(workdir).resolve()
        workdir.mkdir(parents=True, exist_ok=True)
        spec_path = workdir / f"{name}.{era}.spec.json"
        result_path = workdir / f"{name}.{era}.result.json"
        result_path.unlink(missing_ok=True)
        spec_path.write_text(json.dumps(spec, indent=1, default=str))  # Paths as strings
        outcome = run_child(
            [str(path), str(spec_path), str(result_path)],
            timeout=timeout,
            cwd=workdir,
            env=CHILD_ENV,
            python=str(_python_in(era_dir(era, root))),
        )
        if outcome.crashed:
            return EraRun(
                era,
                name,
                "failed",
                f"failed: {outcome.describe()}",
                versions=versions,
                seconds=outcome.seconds,
                stderr=outcome.stderr,
            )
        if not result_path.is_file():
            return EraRun(
                era,
                name,
                "failed",
                f"failed: {name} exited 0 but wrote no {result_path.name}",
                versions=versions,
                seconds=outcome.seconds,
                stderr=outcome.stderr,
            )
        result = json.loads(result_path.read_text())
        return EraRun(
            era,
            name,
            "finished",
            outcome.describe(),
            result=result,
            versions=versions,
            seconds=outcome.seconds,
            stderr=outcome.stderr,
        )
    except Exception as error:  # the notebook must go on: the era part is then reported as failed
        return EraRun(era, name, "failed", f"failed: {type(error).__name__}: {error}")


# ---------------------------------------------------------------------------------------------------
# Building eras (`make eras`)
# ---------------------------------------------------------------------------------------------------


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
    copied) where the wheel comes from; a remote wheel gives None, and uv then fetches torch itself.
    """
    with contextlib.suppress(OSError, subprocess.SubprocessError, ValueError, KeyError):
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
                "-",
                f"torch=={version}",
            ],
            capture_output=True,
            text=True,
            timeout=300,
        )
        if done.returncode == 0:
            url = json.loads(done.stdout)["install"][0]["download_info"]["url"]
            if url.startswith("file://"):
                from urllib.parse import unquote, urlparse

                return Path(unquote(urlparse(url).path)).parent
    return None


def _uv() -> list[str]:
    beside = Path(sys.executable).with_name("uv")
    if beside.exists():
        return [str(beside)]
    found = shutil.which("uv")
    return [found] if found else [sys.executable, "-m", "uv"]


def _run(command: list[str], what: str) -> None:
    print("  $", " ".join(command), flush=True)
    done = subprocess.run(command)
    if done.returncode != 0:
        raise EraBuildError(f"{what} failed (exit code {done.returncode})")


# Imported by the build's check in the new era: an undeclared dependency (trl 0.11's rich) shows here.
# "module:name" also reads a name from the module (trl's names are imported lazily, on first use).
PROBE_IMPORTS = ("torch", "transformers", "trl:SFTTrainer", "trl:DPOTrainer")
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


def _probe_versions(python: Path) -> dict[str, str]:
    """Import the era's libraries with its interpreter (``PROBE_IMPORTS``) and read their versions."""
    done = subprocess.run(
        [str(python), "-c", _PROBE, ",".join(PROBE_IMPORTS), *VERSIONED],
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
    root = root or repo_root()
    requirements = requirements_file(name, root)
    if not requirements.is_file():
        raise EraBuildError(f"no {REQUIREMENTS_DIR}/{name}.txt (eras: {', '.join(era_names(root)) or 'none'})")
    with _build_lock(root):
        if not force and era_state(name, root)[0]:
            print(f"era {name}: up to date ({ERAS_DIR}/{name})", flush=True)
            return False
        start = time.perf_counter()
        venv = era_dir(name, root)
        print(f"era {name}: building {ERAS_DIR}/{name} from {REQUIREMENTS_DIR}/{name}.txt", flush=True)
        shutil.rmtree(venv, ignore_errors=True)
        try:
            uv = installer or _uv()
            _run([*uv, "venv", "--quiet", "--python", sys.executable, str(venv)], "uv venv")
            links = torch_links
            if links == "auto":
                pin = _torch_pin(requirements)
                links = local_torch_links(pin) if pin else None
            extra = ["--find-links", str(links)] if links else []
            # no --compile-bytecode: the import check below compiles what it imports (CHILD_ENV), and the
            # era scripts' first runs the rest they need
            _run(
                [*uv, "pip", "install", "--quiet", "--python", str(_python_in(venv)), "-r", str(requirements), *extra],
                "uv pip install",
            )
            versions = _probe_versions(_python_in(venv))
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
    parser.add_argument("names", nargs="*", help="eras to build (default: every eras/*.txt)")
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


if __name__ == "__main__":
    sys.exit(main())
