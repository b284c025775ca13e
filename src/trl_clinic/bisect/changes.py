"""What the wheel itself says changed: the moving package's files that the first step imported, compared between the
last version that matched and the first that differed.

The registry's metadata of TRL and transformers carries no changelog (read in trl 0.22.2's and transformers 4.53.1's
METADATA: the project's README, no release-notes link), so the wheel's code is what can be quoted: each record lists
the files of the modules its step imported (``first_step.imported_modules``), and the two side environments still
hold them. A file that differs is named with the lines it gained and lost, most changed first, so a maintainer knows
where to read; a small change (``QUOTED`` lines at most) is quoted, as a diff without context.
"""

from __future__ import annotations

import difflib
from pathlib import Path

from trl_clinic.bisect.search import Outcome

SHOWN = 5  # files named in the verdict's line (the JSON keeps them all)
QUOTED = 30  # a file whose change is at most this many lines is quoted whole, as a diff without context


def moved_package(before: dict, after: dict) -> str | None:
    """The package of the records' modules whose version differs between them (an upgrade path moves one)."""
    versions_a, versions_b = before.get("versions") or {}, after.get("versions") or {}
    moved = [p for p in (after.get("modules") or {}) if versions_a.get(p) != versions_b.get(p)]
    return moved[0] if moved else None


def changed_files(outcome: Outcome) -> dict | None:
    """``{"package", "from", "to", "imported", "files": [{"file", "added", "removed"}]}`` for the first change, or
    None where there is none, or where either record lacks its module list or the moving package's files."""
    if not outcome.first or not outcome.last_same:
        return None
    before, after = (outcome.measured[v].record or {} for v in (outcome.last_same, outcome.first))
    package = moved_package(before, after)
    if package is None or package not in (before.get("modules") or {}):
        return None
    a, b = before["modules"][package], after["modules"][package]
    files = []
    for name in sorted(set(a["files"]) | set(b["files"])):
        old, new = (_lines(Path(side["folder"]) / name) for side in (a, b))
        if old == new:
            continue
        diff = list(difflib.unified_diff(old, new, n=0, lineterm=""))
        added = sum(line.startswith("+") and not line.startswith("+++") for line in diff)
        removed = sum(line.startswith("-") and not line.startswith("---") for line in diff)
        quoted = [line for line in diff if not line.startswith(("+++", "---"))] if added + removed <= QUOTED else []
        files.append({"file": name, "added": added, "removed": removed, "diff": quoted})
    files.sort(key=lambda f: (-(f["added"] + f["removed"]), f["file"]))
    versions = (before["versions"].get(package), after["versions"].get(package))
    imported = len(set(a["files"]) | set(b["files"]))
    return {"package": package, "from": versions[0], "to": versions[1], "imported": imported, "files": files}


def _lines(path: Path) -> list[str]:
    """A file's lines; none where a version does not have it."""
    try:
        return path.read_text(encoding="utf-8").splitlines()
    except OSError:
        return []


def said(changes: dict | None) -> str:
    """One line for the reader: the changed files among those the step imported, most changed first."""
    if not changes:
        return ""
    files = changes["files"]
    named = ", ".join(f"{f['file']} (+{f['added']} -{f['removed']})" for f in files[:SHOWN])
    more = f" and {len(files) - SHOWN} more" if len(files) > SHOWN else ""
    line = (
        f"in {changes['package']} {changes['from']} -> {changes['to']}, {len(files)} of the {changes['imported']} "
        f"files the step imported changed: {named or 'none'}{more}"
    )
    if files and files[0]["diff"]:  # the most changed file, small enough to read: its change, quoted
        line += f"\n{files[0]['file']}:\n" + "\n".join(f"    {hunk}" for hunk in files[0]["diff"])
    return line
