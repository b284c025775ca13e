"""What the completeness test looks for in prose: library versions and `file.py:N` references, with their
positions, and the spans of the register's anchors that cover them."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from register import Register, Where

# Packages whose versions the course makes claims about. A two-part version ("TRL 0.14") counts only after one
# of these names; a three- or four-part one (4.48.0, 12.4.5.8) counts anywhere.
PACKAGES = (
    "trl",
    "transformers",
    "torch",
    "pytorch",
    "peft",
    "accelerate",
    "deepspeed",
    "bitsandbytes",
    "datasets",
    "vllm",
    "flash-attn",
    "liger-kernel",
    "nvidia-cublas-cu12",
)
_NAMES = "|".join(re.escape(p) for p in PACKAGES)
FULL = re.compile(r"(?<![\w.])\d+\.\d+\.\d+(?:\.\d+)?(?:\+\w+)?(?![\w]|\.\d)")
NAMED = re.compile(rf"(?i)\b(?:{_NAMES})\s*(?:[<>=!~]=?|\s)\s*v?(\d+\.\d+)(?![\w.]\d|\d)")
FILE_LINE = re.compile(r"\b[\w/.-]+\.py:\d+(?:-\d+)?")


@dataclass(frozen=True)
class Mention:
    """One version or file:line in a file: what it says, where it starts and ends, its line (for messages)."""

    text: str
    start: int
    end: int
    line: int


def mentions(text: str) -> list[Mention]:
    """Every version (three-part anywhere, two-part after a package name) and `file.py:N` in `text`."""
    spans = {(m.start(), m.end()) for m in FULL.finditer(text)}
    spans |= {(m.start(1), m.end(1)) for m in NAMED.finditer(text)}
    spans |= {(m.start(), m.end()) for m in FILE_LINE.finditer(text)}
    inside = {s for s in spans if any(o != s and o[0] <= s[0] and s[1] <= o[1] for o in spans)}
    return [Mention(text[a:b], a, b, text.count("\n", 0, a) + 1) for a, b in sorted(spans - inside)]


def anchor_spans(text: str, anchor: str) -> list[tuple[int, int]]:
    """Every place the anchor occurs in the file's text."""
    return [(m.start(), m.start() + len(anchor)) for m in re.finditer(re.escape(anchor), text)]


def covers(version: str, read: set[tuple[str, str]] | None) -> bool:
    """Whether an anchor's citation read this version: a thread or exemption (None) covers what it holds; a
    citation covers a version it read, a two-part one ("0.14") by any release of it, and a file:line by being
    there (the quote's line range is what `make claims` checks)."""
    if read is None or ".py:" in version:
        return True
    return any(v == version or v.startswith(version + ".") for _, v in read)


def uncited(path: Path, relative: str, register: Register) -> list[Mention]:
    """The mentions of one file that no anchor of the register covers."""
    text = path.read_text()
    anchors: list[tuple[tuple[int, int], set[tuple[str, str]] | None]] = []
    for where, read in register.anchors():
        if where.file == relative:
            anchors += [(span, read) for span in anchor_spans(text, where.anchor)]
    return [
        m
        for m in mentions(text)
        if not any(a <= m.start and m.end <= b and covers(m.text, read) for (a, b), read in anchors)
    ]


def missing_anchors(register: Register, root: Path) -> list[Where]:
    """Anchors no longer found in their files: the sentence was edited or moved, and its citation must follow."""
    return [
        w for w, _ in register.anchors() if not (root / w.file).is_file() or w.anchor not in (root / w.file).read_text()
    ]
