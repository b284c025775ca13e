"""The check-up's engine: probes register here, run one by one, and each leaves one ``Finding``.

A probe is a function of a ``TrainerView`` that returns a ``Finding``. It raises ``Skip`` when it
does not apply to this trainer (the reason says why); any other exception it raises is an ``error``
finding with the exception's type, text and where it was raised, never a skip, so one broken probe never ends
the check-up and never hides. The finding is the library's (``trl_clinic.probes.finding``): every ok, warn or fail says
how it was decided (``DECISIONS``): ``measured`` on the user's trainer, ``config`` read from its arguments or
model, or ``table`` (a known-bugs entry). The report prints as a table (rich; folded to what failed, warned or
crashed), as JSON for CI, and gives the exit code (``EXIT_CODES``).
"""

from __future__ import annotations

import json
import time
import traceback
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from trl_clinic.probes.finding import STATUSES, Finding

STYLES = {"ok": "green", "warn": "yellow", "fail": "bold red", "skipped": "dim", "error": "bold magenta"}  # by status
# 0: no fail and no error; 1: a probe failed (whatever else happened); 3: no fail, but a probe crashed, so
# the check-up is incomplete. 2 stays the command line's own (a usage error, a bad file).
EXIT_CODES = {"clean": 0, "fail": 1, "error": 3}
# the printed table's width where the output is not a terminal: JupyterLab's output area holds about 120 characters
# before a line wraps, and a wrapped table is no longer a table
WIDTH = 120


class Skip(Exception):
    """Raised by a probe that does not apply to this trainer; the message says why (one line)."""


@dataclass(frozen=True)
class Probe:
    name: str
    lesson: str
    explains: str  # what a fail or warn of this probe means, for `trl-clinic checkup --help`
    run: Callable[[Any], Finding | list[Finding]]


PROBES: dict[str, Probe] = {}


def probe(name: str, lesson: str, explains: str) -> Callable:
    """Register a probe under ``name`` (the name ``--only``/``--skip`` take)."""

    def register(function: Callable) -> Callable:
        PROBES[name] = Probe(name, lesson, explains, function)
        return function

    return register


@dataclass
class Report:
    findings: list[Finding] = field(default_factory=list)
    subject: str = ""  # the trainer and model the check-up ran on
    seconds: float = 0.0
    processes: int = 1  # the processes it ran on (torchrun, accelerate launch), each on its own shard
    main: bool = True  # whether this process prints it (the main process of a run of several)

    @property
    def failed(self) -> bool:
        return any(f.status == "fail" for f in self.findings)

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.status == "error"]

    @property
    def exit_code(self) -> int:
        """``EXIT_CODES``: 1 when a probe failed, else 3 when a probe crashed, else 0."""
        if self.failed:
            return EXIT_CODES["fail"]
        return EXIT_CODES["error"] if self.errors else EXIT_CODES["clean"]

    def by_probe(self, name: str) -> list[Finding]:
        return [f for f in self.findings if f.probe == name]

    def to_dict(self) -> dict[str, Any]:
        return {
            "subject": self.subject,
            "seconds": round(self.seconds, 3),
            "processes": self.processes,
            "failed": self.failed,
            "errors": len(self.errors),
            "exit_code": self.exit_code,
            "findings": [asdict(f) for f in self.findings],
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def table(self, everything: bool = False):
        """The findings as a rich table: one row per finding, the fix and the lesson beside the number.

        Folded unless ``everything``: only what failed, warned or crashed gets a row (without the seconds column),
        and one line under it names the probes that passed or were skipped, so the rows that need a reader fit a
        screen; with no such row, that line alone."""
        from rich.table import Table
        from rich.text import Text

        title = f"trl-clinic checkup: {self.subject} ({self.seconds:.1f} s)"
        shown = [f for f in self.findings if everything or f.status in ("fail", "warn", "error")]
        folded = {
            status: [f.probe for f in self.findings if f not in shown and f.status == status] for status in STATUSES
        }
        rest = "; ".join(f"{status}: {', '.join(names)}" for status, names in folded.items() if names)
        rest = f"{rest} (all rows: report.print(everything=True))" if rest else None
        if not shown:
            return Text(f"{title}: no probe failed, warned or crashed; {rest}")
        table = Table(title=title, caption=rest, show_lines=True)
        columns = ("probe", "status", "decided", "measured", "fix / why skipped or crashed", "lesson")
        for column in columns + (("s",) if everything else ()):
            table.add_column(column, overflow="fold")
        for f in shown:
            why = f.fix if f.status in ("warn", "fail") else f.reason
            row = [
                f.probe,
                f"[{STYLES[f.status]}]{f.status}[/]",
                f.decided or "-",
                f.measured,
                why + (f" [{f.known_bug}]" if f.known_bug else ""),
                f.lesson,
            ]
            table.add_row(*row, *((f"{f.seconds:.2f}",) if everything else ()))
        return table

    def __str__(self) -> str:
        import io

        from rich.console import Console

        console = Console(width=WIDTH, file=io.StringIO())
        console.print(self.table(everything=True))
        return console.file.getvalue()

    def print(self, everything: bool = False) -> None:
        """The table on the screen (folded unless ``everything``: see ``table``); a terminal's own width, else
        ``WIDTH`` columns (a notebook's output area)."""
        import sys

        from rich.console import Console

        Console(width=None if sys.stdout.isatty() else WIDTH).print(self.table(everything))


SEVERITY = ("fail", "error", "warn", "ok", "skipped")  # which process's finding speaks for all of them


def merged(per_process: list[list[Finding]]) -> list[Finding]:
    """One list of findings from every process's (each ran the same probes in the same order on its own shard):
    for each finding, the most severe process's (a fail anywhere fails the run), saying which process it was
    when they differ; the same list on every process, so every process returns the same verdict."""
    count, out = len(per_process), []
    for position, first in enumerate(per_process[0]):
        same = [
            (index, findings[position])
            for index, findings in enumerate(per_process)
            if position < len(findings) and findings[position].probe == first.probe
        ]
        index, worst = min(same, key=lambda pair: (SEVERITY.index(pair[1].status), pair[0]))
        made = replace(worst, seconds=max(f.seconds for _, f in same))
        if len({(f.status, f.measured) for _, f in same}) > 1:
            made.process = index
            text = "measured" if made.measured else "reason"
            setattr(made, text, f"process {index} of {count}: {getattr(made, text)}")
        out.append(made)
    return out


def selected(only: Iterable[str] | None = None, skip: Iterable[str] | None = None) -> list[Probe]:
    """The registered probes ``--only`` keeps and ``--skip`` leaves out, in registration order."""
    only, skip = set(only or ()), set(skip or ())
    unknown = (only | skip) - set(PROBES)
    if unknown:
        raise ValueError(f"unknown probe(s) {', '.join(sorted(unknown))}: choose from {', '.join(PROBES)}")
    return [p for name, p in PROBES.items() if (not only or name in only) and name not in skip]


def raised_at(error: BaseException) -> str:
    """Where an exception was raised, as ``raised in package/file.py:line, function``: whether a probe's crash
    came from the trainer's own code (trl, transformers, the user's reward), which training would meet too, or
    from the clinic's."""
    frame = traceback.extract_tb(error.__traceback__)[-1]
    parts = Path(frame.filename).parts
    where = "/".join(parts[parts.index("site-packages") + 1 :] if "site-packages" in parts else parts[-2:])
    return f"raised in {where}:{frame.lineno}, {frame.name}"


def run_probe(spec: Probe, view: Any) -> list[Finding]:
    """One probe's findings, timed; a probe that does not apply is skipped saying why, a probe that crashes
    is an ``error`` finding with the exception (the check-up goes on)."""
    start = time.perf_counter()
    try:
        result = spec.run(view)
        findings = result if isinstance(result, list) else [result]
    except Skip as why:
        findings = [Finding(spec.name, "skipped", reason=str(why))]
    except Exception as error:  # noqa: BLE001 - a probe's crash is reported, never raised
        text = f"{type(error).__name__}: {str(error).splitlines()[0][:300]}" if str(error) else type(error).__name__
        findings = [Finding(spec.name, "error", reason=f"{text} ({raised_at(error)})")]
    elapsed = time.perf_counter() - start
    for finding in findings:
        finding.lesson = finding.lesson or spec.lesson
        finding.seconds = elapsed / len(findings)
    return findings
