"""Which releases a bisect walks, and what each side environment pins beside the one that moves.

The releases come from the index the user's pip reads (``pip index versions``: its index URL, extra indexes
and find-links, as configured), so a private mirror lists what it holds. The two ends are always kept, even
where the index hides them (a yanked release, such as transformers 4.46.0, is installable by its exact pin
but not listed). Everything else is pinned at the version installed in this environment, so two side
environments differ only in the package that moves (and in what the resolver must change for it, which each
record's versions show).
"""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
from collections.abc import Callable, Iterable

from packaging.requirements import InvalidRequirement, Requirement
from packaging.version import InvalidVersion, Version

# The stack a first step depends on: pinned from this environment unless it is the package that moves.
STACK = ("torch", "transformers", "trl", "accelerate", "peft", "datasets")
LISTING_TIMEOUT = 300  # seconds for pip to answer


class IndexUnavailable(RuntimeError):
    """The index did not list the package's releases, so the search could not start: exit code 3 (undecided),
    not 2. pip's answer does not tell a usage error from a failure: for an index it cannot reach it says only
    "No matching distribution found" (pip 23.2, an index URL on a closed port), naming neither."""


def parse_index_listing(text: str) -> list[str]:
    """The versions of ``pip index versions``' "Available versions:" line, in its order."""
    for line in text.splitlines():
        if line.strip().startswith("Available versions:"):
            return [v.strip() for v in line.split(":", 1)[1].split(",") if v.strip()]
    raise IndexUnavailable(f"pip listed no versions:\n{text.strip()[-500:]}")


def index_versions(package: str, *, pre: bool = False, run: Callable = subprocess.run) -> list[str]:
    """Every version of ``package`` the user's pip index lists (pre-releases with ``pre``)."""
    command = [sys.executable, "-m", "pip", "index", "versions", package, "--disable-pip-version-check"]
    try:
        done = run([*command, *(["--pre"] if pre else [])], capture_output=True, text=True, timeout=LISTING_TIMEOUT)
    except subprocess.TimeoutExpired as error:
        raise IndexUnavailable(f"pip did not list {package}'s versions in {LISTING_TIMEOUT} s") from error
    if done.returncode != 0:
        raise IndexUnavailable(f"pip could not list {package}'s versions: {' '.join(done.stderr.split()[-40:])}")
    return parse_index_listing(done.stdout)


def ends(good: str, bad: str) -> tuple[Version, Version]:
    """The window's ends; a usage error (ValueError) when one is not a version or ``good`` is not older (checked
    before the index is asked, so a usage error is never reported as an index failure)."""
    try:
        low, high = Version(good), Version(bad)
    except InvalidVersion as error:
        raise ValueError(f"not a version: {error}") from error
    if not low < high:
        raise ValueError(f"--good {good} must be older than --bad {bad}")
    return low, high


def between(available: Iterable[str], good: str, bad: str, *, pre: bool = False) -> list[str]:
    """The releases from ``good`` to ``bad``, both kept, oldest first; pre-releases and dev releases only
    with ``pre``."""
    low, high = ends(good, bad)
    chosen = {low: good, high: bad}
    for text in available:
        try:
            version = Version(text)
        except InvalidVersion:
            continue
        if low < version < high and (pre or not (version.is_prerelease or version.is_devrelease)):
            chosen.setdefault(version, text)
    return [chosen[version] for version in sorted(chosen)]


def installed(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def pins(package: str, overrides: Iterable[str] = (), *, stack: Iterable[str] = STACK) -> dict[str, str]:
    """Requirement lines by package name: the stack at this environment's versions, the moving ``package``
    left out, then ``overrides`` ("NAME==X" pins NAME there, a bare "NAME" lets the resolver choose it)."""
    lines = {name: f"{name}=={version}" for name in stack if name != package and (version := installed(name))}
    for line in overrides:
        try:
            requirement = Requirement(line)
        except InvalidRequirement as error:
            raise ValueError(f"--pin {line!r} is not a requirement: {error}") from error
        if requirement.name == package:
            raise ValueError(f"--pin {line!r} names the package that moves")
        lines[requirement.name] = str(requirement)
    return lines
