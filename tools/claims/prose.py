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
# The known-bugs table's ids carry versions ("01-position-ids-ignored-before-4.53.1"): they are names, and the
# entry's own window is what makes the claim, so the scan blanks them out.
KNOWN_BUGS = Path(__file__).resolve().parents[2] / "src" / "trl_clinic" / "checkup" / "known_bugs.yaml"
ID_LINE = re.compile(r"^- id: (\S+)$", re.MULTILINE)
# A lesson's era file (eras/NAME.txt) pins one requirement a line ("trl==0.14.0"): a pin is the era's input, what
# a measurement in it ran on, not a claim about a library's code, so the scan blanks pin lines; the comment header
# above them is prose and is scanned like any other.
PIN_LINE = re.compile(r"^[A-Za-z0-9][\w.\[\],-]*==\S+$", re.MULTILINE)


def known_bug_ids() -> list[str]:
    """Every id of the known-bugs table, read as text (the tool does not import the library)."""
    return ID_LINE.findall(KNOWN_BUGS.read_text())


@dataclass(frozen=True)
class Mention:
    """One version or file:line in a file: what it says, where it starts and ends, its line (for messages)."""

    text: str
    start: int
    end: int
    line: int


def mentions(text: str) -> list[Mention]:
    """Every version (three-part anywhere, two-part after a package name) and `file.py:N` in `text`, the known-bugs
    ids left out."""
    for name in known_bug_ids():
        text = text.replace(name, " " * len(name))
    spans = {(m.start(), m.end()) for m in FULL.finditer(text)}
    spans |= {(m.start(1), m.end(1)) for m in NAMED.finditer(text)}
    spans |= {(m.start(), m.end()) for m in FILE_LINE.finditer(text)}
    inside = {s for s in spans if any(o != s and o[0] <= s[0] and s[1] <= o[1] for o in spans)}
    return [Mention(text[a:b], a, b, text.count("\n", 0, a) + 1) for a, b in sorted(spans - inside)]


def anchor_spans(text: str, anchor: str) -> list[tuple[int, int]]:
    """Every place the anchor occurs in the file's text, any run of whitespace matching any other: a sentence
    rewrapped, or a Python string split across lines (`"... from "` then `"0.16.0 ..."`), keeps its anchor."""
    pattern = r"\s+".join(re.escape(word) for word in anchor.split())
    return [(m.start(), m.end()) for m in re.finditer(pattern, text)]


def covers(version: str, read: set[tuple[str, str]] | None) -> bool:
    """Whether an anchor's citation read this version: a thread or exemption (None) covers what it holds; a
    citation covers a version it read, a two-part one ("0.14") by any release of it, and a file:line by being
    there (the quote's line range is what `make claims` checks)."""
    if read is None or ".py:" in version:
        return True
    return any(v == version or v.startswith(version + ".") for _, v in read)


def pins_blanked(text: str) -> str:
    """An era file with its pin lines blanked (same length, so positions and lines hold)."""
    return PIN_LINE.sub(lambda m: " " * len(m.group()), text)


def uncited(path: Path, relative: str, register: Register) -> list[Mention]:
    """The mentions of one file that no anchor of the register covers (an era file's pins are no mentions)."""
    text = path.read_text()
    if path.parent.name == "eras" and path.suffix == ".txt":
        text = pins_blanked(text)
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
        w
        for w, _ in register.anchors()
        if not (root / w.file).is_file() or not anchor_spans((root / w.file).read_text(), w.anchor)
    ]
