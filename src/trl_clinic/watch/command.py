"""``trl-clinic watch sft|dpo|reward|grpo``: TRL's own script trains, for real, with ``ClinicWatch`` added.

The arguments after the trainer kind are those of ``trl sft`` (a ``--config`` YAML, or flags), parsed by
the script's own ``make_parser`` (``TrlParser`` over TRL's dataclasses), as ``trl-clinic checkup`` does.
The script's ``main`` then runs unchanged (it builds the trainer, trains, saves); the watch is added to
the trainer at its call to ``train()``. Exit code 1 when the watch made a finding, 0 when it made none.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import textwrap
from unittest import mock

from trl_clinic.checkup.command import KINDS, add_script_command, own_options
from trl_clinic.watch.findings import CATALOGUE, lesson_name


def watch_from_command_line(kind: str, argv: list[str], stop_on=None, window: int = 10, report=None, show: bool = True):
    """Run ``trl <kind> <argv>`` (``trl.scripts.<kind>.main``) with a ``ClinicWatch`` on its trainer; return it."""
    import trl

    from trl_clinic.watch.callback import ClinicWatch

    script = importlib.import_module(f"trl.scripts.{kind}")
    parsed = script.make_parser(prog=f"trl-clinic watch {kind}").parse_args_and_config(args=argv)
    watch = ClinicWatch(stop_on=stop_on, window=window, report=report, show=show)
    trainer_class = getattr(trl, KINDS[kind])
    train = trainer_class.train

    def watched(trainer, *args, **kwargs):
        trainer.add_callback(watch)
        return train(trainer, *args, **kwargs)

    with mock.patch.object(trainer_class, "train", watched):
        script.main(*parsed)
    return watch


def explain() -> str:
    """Every finding and the lesson that explains it (for --help; torch is not imported)."""
    lines = ["findings (each: what was seen, the likely cause, the fix in one line, the lesson; once per run):"]
    lines += [
        textwrap.fill(
            f"{key}, {lesson_name(entry.lesson)}: {entry.looks_for}",
            width=100,
            initial_indent="  ",
            subsequent_indent="      ",
        )
        for key, entry in CATALOGUE.items()
    ]
    return "\n".join(lines)


def _options(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument(
        "--stop-on",
        nargs="+",
        metavar="FINDING",
        help="end the run at the step one of these findings is made ('any' for every finding)",
    )
    parser.add_argument("--window", type=int, help="optimizer steps a windowed finding looks at (default 10)")
    parser.add_argument("--report", metavar="PAGE.html", help="write a self-contained HTML page at the end")
    return parser


def add_parser(commands: argparse._SubParsersAction) -> None:
    """Register ``watch`` on the ``trl-clinic`` command (no heavy import until it runs)."""
    add_script_command(
        commands,
        "watch",
        _options,
        handle,
        "the TRL script to run",
        epilog=explain(),
        help="train with `trl sft|dpo|reward|grpo` and the watch on; exit 1 when it finds something",
        description=__doc__.split("\n\n")[0] + "\n\nexample: trl-clinic watch sft --config recipe.yaml "
        "--stop-on nonfinite --report watch.html\n(`trl-clinic watch sft --help` lists TRL's own arguments)",
    )


def handle(args: argparse.Namespace) -> int:
    own, trl_args = own_options(_options, args)
    watch = watch_from_command_line(
        args.kind, trl_args, stop_on=own.stop_on, window=own.window or 10, report=own.report
    )
    sys.stdout.flush()
    return 1 if watch.findings else 0
