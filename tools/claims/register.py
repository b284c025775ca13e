"""The claims register (claims/register.yaml) read into typed records, its shape checked without network.

A sentence of the course's prose that names a library version, a file and line, a count or a window holds a
citation here: where the sentence is (a file and an anchor, a distinctive substring of it that survives edits
around it), and the quotes of code that make it true, each with the released versions it was read in. This
module only reads and validates; `wheels` fetches, `check` reads the wheels. The library (src/trl_clinic) never
imports it: the register is the course's bookkeeping, not something a user installs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import date
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
REGISTER = ROOT / "claims" / "register.yaml"

# A released version as a wheel names it (4.48.1, 2.13.0+cpu, 12.4.5.8), and optionally the line range of the
# quote in that version's file: "4.48.1:3675-3676". A range makes a `file.py:N` sentence checkable.
AT = re.compile(r"^(?P<version>\d+(?:\.\d+){1,3}(?:\+[\w.]+)?)(?::(?P<first>\d+)(?:-(?P<last>\d+))?)?$")
ID = re.compile(r"^[a-z0-9][a-z0-9.-]*$")
QUOTED_VERSION = re.compile(r"\d+\.\d+(?:\.\d+)*")


class RegisterError(ValueError):
    """The register's shape is wrong: the message names the entry and what to change."""


@dataclass(frozen=True)
class Where:
    """A sentence: the file it is in (relative to the repository) and an anchor, a substring of the sentence that
    holds every version and file:line it cites (the completeness test counts those inside it as cited)."""

    file: str
    anchor: str


@dataclass(frozen=True)
class At:
    """One released version a quote is read in, and where the line range is given, the lines it must lie on."""

    version: str
    lines: tuple[int, int] | None


@dataclass(frozen=True)
class Quote:
    """Code that makes a sentence true: `text` in `path` (inside the wheel) of `package`, present in every version
    of `present_in` and absent (or the file missing) in every version of `absent_in`: a window names both its
    ends and the releases just outside it."""

    package: str
    path: str
    text: str
    present_in: tuple[At, ...]
    absent_in: tuple[At, ...]


@dataclass(frozen=True)
class Count:
    """A number in prose ("67 classes"), computed by the function `script` of tools/claims/counts.py from one
    wheel; the register holds the number the prose states."""

    script: str
    package: str
    version: str
    expect: int


@dataclass(frozen=True)
class Citation:
    """One claim: the sentences that make it (often the same fact in several files) and what was read for it."""

    id: str
    where: tuple[Where, ...]
    quotes: tuple[Quote, ...]
    counts: tuple[Count, ...]

    def versions(self) -> set[tuple[str, str]]:
        """Every (package, version) this citation reads, and the versions its quoted code names itself
        (`is_torch_greater_or_equal("2.6")` makes a claim about torch 2.6): what the completeness test matches
        prose against."""
        read = {(q.package, at.version) for q in self.quotes for at in q.present_in + q.absent_in}
        quoted = {("quoted", v) for q in self.quotes for v in QUOTED_VERSION.findall(q.text)}
        return read | quoted | {(c.package, c.version) for c in self.counts}


@dataclass(frozen=True)
class Thread:
    """An issue or pull-request thread: read, not machine-checked (no test can fetch it). The quoted sentence and
    the date it was read are kept so that the next reader can find it and see whether it still says so."""

    id: str
    where: tuple[Where, ...]
    url: str
    quote: str
    read: date


@dataclass(frozen=True)
class Exempt:
    """A version in prose that is no claim about a library's code (our own pins, an example's output): the
    completeness test lets it pass, and `reason` says why. Kept small: a library claim belongs in `citations`."""

    where: Where
    reason: str


@dataclass(frozen=True)
class Register:
    citations: tuple[Citation, ...]
    threads: tuple[Thread, ...]
    exempt: tuple[Exempt, ...]

    def anchors(self) -> list[tuple[Where, set[tuple[str, str]] | None]]:
        """Every anchor with the versions it may name: a citation's own; None for a thread or an exemption,
        whose anchors cover what they hold."""
        out: list[tuple[Where, set[tuple[str, str]] | None]] = []
        for c in self.citations:
            out += [(w, c.versions()) for w in c.where]
        for t in self.threads:
            out += [(w, None) for w in t.where]
        return out + [(e.where, None) for e in self.exempt]


def _fail(entry: str, message: str) -> RegisterError:
    return RegisterError(f"claims/register.yaml, {entry}: {message}")


def _text(raw: dict, key: str, entry: str) -> str:
    value = raw.get(key)
    if not isinstance(value, str) or not value.strip():
        raise _fail(entry, f'`{key}` must be a non-empty string (quote versions: "4.48.0", or YAML reads a float)')
    return value


def _where(raw: object, entry: str) -> tuple[Where, ...]:
    items = raw if isinstance(raw, list) else [raw]
    if not items or not all(isinstance(i, dict) for i in items):
        raise _fail(entry, "`where` must be a mapping {file, anchor} or a list of them")
    where = tuple(Where(_text(i, "file", entry), _text(i, "anchor", entry)) for i in items)
    if len(set(where)) < len(where):
        raise _fail(entry, "`where` names one sentence twice")
    return where


def _at(value: object, entry: str) -> At:
    match = AT.match(value) if isinstance(value, str) else None
    if match is None:
        raise _fail(entry, f'version {value!r} must be a quoted string like "4.48.1" or "4.48.1:3675-3676"')
    first, last = match["first"], match["last"] or match["first"]
    return At(match["version"], (int(first), int(last)) if first else None)


def _quote(raw: dict, entry: str) -> Quote:
    present = [_at(v, entry) for v in raw.get("present_in") or []]
    absent = [_at(v, entry) for v in raw.get("absent_in") or []]
    if not present:
        raise _fail(entry, "a quote needs `present_in`: the versions it was read in")
    if any(a.lines for a in absent):
        raise _fail(entry, "`absent_in` takes no line range: the quote is nowhere in that version's file")
    unknown = set(raw) - {"package", "path", "text", "present_in", "absent_in"}
    if unknown:
        raise _fail(entry, f"unknown keys {sorted(unknown)}")
    return Quote(
        _text(raw, "package", entry),
        _text(raw, "path", entry),
        _text(raw, "text", entry),
        tuple(present),
        tuple(absent),
    )


def _count(raw: dict, entry: str) -> Count:
    if not isinstance(raw.get("expect"), int):
        raise _fail(entry, "a count needs `expect`, the number the prose states")
    return Count(_text(raw, "script", entry), _text(raw, "package", entry), _text(raw, "version", entry), raw["expect"])


def _citation(raw: dict) -> Citation:
    entry = _text(raw, "id", "a citation")
    if not ID.match(entry):
        raise _fail(entry, "an id is lower-case letters, digits, dots and dashes")
    quotes = tuple(_quote(q, entry) for q in raw.get("quotes") or [])
    counts = tuple(_count(c, entry) for c in raw.get("counts") or [])
    if not quotes and not counts:
        raise _fail(entry, "a citation needs `quotes` or `counts`: what was read for it")
    return Citation(entry, _where(raw.get("where"), entry), quotes, counts)


def _thread(raw: dict) -> Thread:
    entry = _text(raw, "id", "a thread")
    url = _text(raw, "url", entry)
    if not url.startswith("https://github.com/"):
        raise _fail(entry, "a thread's url is its GitHub issue or pull request")
    if not isinstance(raw.get("read"), date):
        raise _fail(entry, "`read` is the date the thread was read (YYYY-MM-DD)")
    return Thread(entry, _where(raw.get("where"), entry), url, _text(raw, "quote", entry), raw["read"])


def load(path: Path = REGISTER) -> Register:
    """The register at `path`, its shape checked: unique ids, every version a quoted string, every quote with the
    versions it was read in, every thread dated. Raises RegisterError naming the entry."""
    raw = yaml.safe_load(path.read_text())
    if not isinstance(raw, dict) or set(raw) - {"citations", "threads", "exempt"}:
        raise RegisterError("claims/register.yaml holds three lists: citations, threads, exempt")
    citations = tuple(_citation(c) for c in raw.get("citations") or [])
    threads = tuple(_thread(t) for t in raw.get("threads") or [])
    exempt = tuple(
        Exempt(_where(e.get("where"), "an exemption")[0], _text(e, "reason", "an exemption"))
        for e in raw.get("exempt") or []
    )
    exempted = [e.where for e in exempt]
    if len(set(exempted)) < len(exempted):
        twice = sorted({f"{w.file}: {w.anchor}" for w in exempted if exempted.count(w) > 1})
        raise RegisterError(f"claims/register.yaml: sentences exempted twice: {twice}")
    ids = [c.id for c in citations] + [t.id for t in threads]
    duplicated = sorted({i for i in ids if ids.count(i) > 1})
    if duplicated:
        raise RegisterError(f"claims/register.yaml: ids used twice: {duplicated}")
    return Register(citations, threads, exempt)
