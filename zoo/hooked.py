"""``trl-clinic checkup`` on a twin whose break is a change to the built trainer (``twins.HOOKS``), not its config:

    python zoo/hooked.py HOOK KIND --config config.yaml [--json]

TRL's own script builds the trainer from the config (``trl_clinic.checkup.command.build_trainer``, as the
``trl-clinic checkup`` command does), the hook changes it, and the check-up runs on it; the report and the exit code
are the command's."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import twins  # noqa: E402


def main() -> int:
    hook, kind, *argv = sys.argv[1:]
    as_json = "--json" in argv
    argv = [a for a in argv if a != "--json"]
    from trl_clinic.checkup import run_checkup
    from trl_clinic.checkup.command import build_trainer

    trainer = build_trainer(kind, argv)
    twins.HOOKS[hook](trainer)
    report = run_checkup(trainer, show=not as_json)
    if as_json:
        print(report.to_json())
    return report.exit_code


if __name__ == "__main__":
    sys.exit(main())
