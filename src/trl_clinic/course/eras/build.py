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
import os
import sys
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
from trl_clinic.probes.environments import (
    EnvironmentBuildError,
    build_lock,
    create_and_install,
    flock,
    holds_lock,
    local_torch_links,
    probe_versions,
    torch_pin,
    uv_command,
    write_stamp,
)

__all__ = ["EraBuildError", "build_era", "local_torch_links", "main", "uv_command", "wait_for_builds"]

VERSIONED = ("torch", "transformers", "trl", "peft", "accelerate", "datasets")

# An era could not be built; its folder is left without a stamp (the library's error, shared with bisect).
EraBuildError = EnvironmentBuildError


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


@contextlib.contextmanager
def _build_lock(root: Path) -> Iterator[None]:
    """One build at a time per checkout (two `make` runs must not write the same venv). Re-entrant in one
    process: ``main`` holds it across all its builds, so a lesson that waits for a background build
    (``make lab``) never wakes up in the gap between two eras."""
    with build_lock(root / ERAS_DIR):
        yield


def wait_for_builds(root: Path, timeout: float) -> bool:
    """Wait while another process builds eras (``make lab`` starts the build in the background and
    JupyterLab at once); True when one was running and has ended within ``timeout``."""
    lock = root / ERAS_DIR / ".lock"
    if not lock.is_file() or holds_lock(root / ERAS_DIR):
        return False
    with open(lock) as handle:
        if flock(handle, "shared"):
            return False
        print(f"waiting for the eras being built in the background (log: {ERAS_DIR}/build.log)", flush=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            time.sleep(1)
            if flock(handle, "shared"):
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
        try:
            links = torch_links
            if links == "auto":
                pin = torch_pin(requirements)
                links = local_torch_links(pin) if pin else None
            create_and_install(venv, requirements, uv=installer or uv_command(), links=links)
            versions = probe_versions(python_in(venv), probe_imports(requirements), VERSIONED, CHILD_ENV)
            stamp = {
                "requirements_sha256": requirements_digest(requirements),
                "versions": versions,
                "torch_links": str(links) if links else None,
                "built_in_s": round(time.perf_counter() - start, 1),
            }
            write_stamp(venv, STAMP, stamp)
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
