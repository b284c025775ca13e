"""The watch: the lessons' symptoms caught live in a real training run, with their cause.

    from trl_clinic.watch import ClinicWatch, WatchConfig
    trainer.add_callback(ClinicWatch(trainer=trainer))  # or ClinicWatch(WatchConfig(stop_on="nonfinite", window=5))
    trainer.train()

or, on the command line, TRL's own script with the watch added: ``trl-clinic watch sft --config recipe.yaml``.
Every finding (``CATALOGUE``) says what it saw, the likely cause, the fix in one line and the lesson that
explains it, once, as a line and as numbers under ``clinic/`` in the trainer's logs; it is the library's
``Finding`` (``trl_clinic.probes.finding``). ``WatchConfig`` holds the options and thresholds, each with its
help. docs/watch.md is the user's page. Part of the library: nothing here imports the course or the
check-up. Importing this package is cheap (``trl-clinic --help``): torch loads with ``ClinicWatch``.
"""

from __future__ import annotations

from trl_clinic.probes.finding import Finding
from trl_clinic.watch.config import WatchConfig
from trl_clinic.watch.findings import CATALOGUE, LESSONS, lesson_name

__all__ = ["CATALOGUE", "LESSONS", "ClinicWatch", "Finding", "WatchConfig", "lesson_name"]


def __getattr__(name: str):
    if name == "ClinicWatch":
        from trl_clinic.watch.callback import ClinicWatch

        return ClinicWatch
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
