"""The library's one finding record, for the check-up's probes and the watch's checks alike.

A finding names the probe that made it and its status, says what was measured, how it was decided
(``DECISIONS``), the fix in one line and the lesson that explains it. The check-up's findings take every
status (``ok`` to ``error``) and carry the probe's number (``value``), a known-bugs entry and the probe's
time; the watch's are ``fail``s (a lesson's failure seen in the run: the watch's command exits 1) and carry
the optimizer step where it was seen, the likely cause, and the numbers it logs under ``clinic/``.
Torch-free, so the commands' ``--help`` can read it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

STATUSES = ("ok", "warn", "fail", "skipped", "error")
DECISIONS = {
    "measured": "run on the trainer's own model, collator, loss or optimizer class, and compared with a threshold",
    "config": "read from the trainer's arguments or the model (nothing run)",
    "table": "a known-bugs entry matched the installed versions and settings (nothing run)",
}


@dataclass
class Finding:
    probe: str  # the check-up's probe or the watch's check that made it
    status: str  # one of STATUSES
    measured: str = ""  # what was measured: the number the verdict rests on, with its unit or meaning
    fix: str = ""  # one line the user can apply
    lesson: str = ""  # the lesson that explains it
    reason: str = ""  # why the probe was skipped or crashed, or what it saw
    value: float | None = None  # the measured number alone, for CI
    decided: str = ""  # how an ok/warn/fail was decided: one of DECISIONS ("" for skipped and error)
    known_bug: str = ""  # the known-bugs entry that names this finding's cause, if one matched
    seconds: float = 0.0  # the check-up's time on the probe
    step: int | None = None  # the watch: the optimizer step where it was seen (0: before the first step)
    cause: str = ""  # the watch: the likely cause of what it saw
    numbers: dict[str, float] = field(default_factory=dict)  # the watch: logged as clinic/<probe>/<name>

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"status {self.status!r}: expected one of {', '.join(STATUSES)}")
        verdict = self.status in ("ok", "warn", "fail")
        if verdict and self.decided not in DECISIONS:
            raise ValueError(
                f"a {self.status} finding says how it was decided: one of {', '.join(DECISIONS)}, not {self.decided!r}"
            )
        if not verdict and self.decided:
            raise ValueError(f"a {self.status} finding decided nothing (decided={self.decided!r})")
