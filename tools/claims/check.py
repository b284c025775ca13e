"""`make claims`: every quote of the register read in the wheels it cites, every count computed; prints each
failure and exits 1 on any. Network: each cited wheel is downloaded once into .claims-cache/ (PyPI).

    python tools/claims/check.py [--cache DIR]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import counts
import wheels
from register import At, Quote, Register, load


def flat(text: str) -> str:
    """Whitespace folded to single spaces: a quote holds across re-indentation and line wrapping."""
    return " ".join(text.split())


def lines_of(text: str, at: At) -> str:
    """The part of a file a quote must lie in: the cited lines where a range is given, else the whole file."""
    if at.lines is None:
        return text
    first, last = at.lines
    return "\n".join(text.splitlines()[first - 1 : last])


def quote_failures(quote: Quote, cache: Path) -> list[str]:
    """What is wrong with one quote, one line per version: missing where it must be present, present where it
    must be absent."""
    failures = []
    for at in quote.present_in:
        text = wheels.read(quote.package, at.version, quote.path, cache)
        where = f"{quote.package} {at.version} {quote.path}" + (f":{at.lines[0]}-{at.lines[1]}" if at.lines else "")
        if text is None:
            failures.append(f"{where}: no such file in the wheel")
        elif flat(quote.text) not in flat(lines_of(text, at)):
            failures.append(f"{where}: {quote.text!r} not found")
    for at in quote.absent_in:
        text = wheels.read(quote.package, at.version, quote.path, cache)
        if text is not None and flat(quote.text) in flat(text):
            failures.append(f"{quote.package} {at.version} {quote.path}: {quote.text!r} present, cited as absent")
    return failures


def failures(register: Register, cache: Path) -> list[str]:
    """Every failing quote and count of the register, each line led by its citation's id."""
    out = []
    for citation in register.citations:
        for quote in citation.quotes:
            try:
                out += [f"{citation.id}: {f}" for f in quote_failures(quote, cache)]
            except wheels.WheelError as error:
                out.append(f"{citation.id}: {error}")
        for count in citation.counts:
            script = counts.SCRIPTS.get(count.script)
            if script is None:
                out.append(f"{citation.id}: no count script {count.script!r} in tools/claims/counts.py")
                continue
            files = wheels.names(count.package, count.version, cache)
            got = script(files, lambda p, c=count: wheels.read(c.package, c.version, p, cache))
            if got != count.expect:
                out.append(
                    f"{citation.id}: {count.script} on {count.package} {count.version} is {got}, "
                    f"the prose says {count.expect}"
                )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache", type=Path, default=wheels.CACHE, help="where the wheels are kept")
    args = parser.parse_args(argv)
    register = load()
    found = failures(register, args.cache)
    for line in found:
        print(f"FAIL {line}")
    quotes = sum(len(c.quotes) for c in register.citations)
    print(
        f"{len(register.citations)} citations, {quotes} quotes: {len(found)} failures; "
        f"{len(register.threads)} threads read, not machine-checked"
    )
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
