"""One side environment per version that a bisect measures, built with uv once and kept in the cache.

The folder's name carries the moving package, its version and a hash of every requirement line (and this
Python's version), so a second bisect over the same window builds nothing. Built by the machinery the course's
eras use (``trl_clinic.probes.environments``); a stamp written last marks it ready. A version whose
requirements cannot be resolved together is a ``conflict``, one whose libraries do not import together is
``unusable``: both are skipped by the search, never counted good or bad. Anything else (no network, a broken
wheel) is ``failed``.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

from trl_clinic.probes.environments import (
    CHILD_ENV,
    STAMP,
    EnvironmentBuildError,
    build_lock,
    create_and_install,
    local_torch_links,
    probe_versions,
    python_in,
    uv_command,
    write_stamp,
)

CACHE_ENV = "TRL_CLINIC_CACHE"
IMPORTS = {
    "sft": ("torch", "transformers", "datasets", "trl:SFTTrainer"),
    "dpo": ("torch", "transformers", "datasets", "trl:DPOTrainer"),
    "reward": ("torch", "transformers", "datasets", "trl:RewardTrainer"),
    "grpo": ("torch", "transformers", "datasets", "trl:GRPOTrainer"),
}
# read at the build (the import check); every one is required by a first step (the record reads the rest)
REPORTED = ("torch", "transformers", "trl", "accelerate", "datasets")
CONFLICT_SIGNS = ("No solution found", "unsatisfiable")


@dataclass
class Environment:
    """A version's side environment: ``built`` now, ``cached`` from an earlier build, or not usable
    (``conflict``, ``unusable``, ``failed``) with what the build said."""

    version: str
    status: str
    python: Path | None = None
    message: str = ""
    versions: dict[str, str] = field(default_factory=dict)

    @property
    def ready(self) -> bool:
        return self.status in ("built", "cached")


def cache_root() -> Path:
    """``$TRL_CLINIC_CACHE/bisect``, else ``~/.cache/trl_clinic/bisect``."""
    return Path(os.environ.get(CACHE_ENV, Path.home() / ".cache" / "trl_clinic")) / "bisect"


def requirement_lines(package: str, version: str, pins: dict[str, str]) -> list[str]:
    return [f"{package}=={version}", *(line for name, line in sorted(pins.items()) if name != package)]


def folder_for(root: Path, package: str, version: str, lines: list[str]) -> Path:
    key = "\n".join([f"python {sys.version_info[0]}.{sys.version_info[1]}", *lines])
    return root / f"{package}-{version}-{hashlib.sha256(key.encode()).hexdigest()[:12]}"


def prepare(package: str, version: str, pins: dict[str, str], kind: str, root: Path | None = None) -> Environment:
    """The side environment of ``package==version`` beside ``pins``: from the cache, else built now."""
    root = root or cache_root()
    lines = requirement_lines(package, version, pins)
    venv = folder_for(root, package, version, lines)
    with build_lock(root, "bisect's environments"):
        stamp = _read_stamp(venv)
        if stamp and stamp.get("requirements") == lines and python_in(venv).exists():
            return Environment(version, "cached", python_in(venv), versions=stamp["versions"])
        requirements = root / f"{venv.name}.txt"
        requirements.write_text("\n".join(lines) + "\n")
        torch = pins.get("torch", "")
        links = local_torch_links(torch.split("==", 1)[1]) if "==" in torch else None
        try:
            create_and_install(venv, requirements, uv=uv_command(), links=links, quiet=True)
        except EnvironmentBuildError as error:
            status = "conflict" if any(sign in str(error) for sign in CONFLICT_SIGNS) else "failed"
            return Environment(version, status, message=str(error))
        try:
            versions = probe_versions(python_in(venv), IMPORTS.get(kind, IMPORTS["sft"]), REPORTED, CHILD_ENV)
        except EnvironmentBuildError as error:
            return Environment(version, "unusable", message=str(error)[-600:])
        write_stamp(venv, STAMP, {"requirements": lines, "versions": versions})
        return Environment(version, "built", python_in(venv), versions=versions)


def _read_stamp(venv: Path) -> dict | None:
    try:
        return json.loads((venv / STAMP).read_text())
    except (OSError, ValueError):
        return None
