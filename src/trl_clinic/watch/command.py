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

from trl_clinic.checkup.command import KINDS
from trl_clinic.watch.findings import CATALOGUE, lesson_name


def watch_from_command_line(kind: str, argv: list[str], stop_on=None, window: int = 10, report=None,
                            show: bool = True):
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
    lines += [textwrap.fill(f"{key}, {lesson_name(lesson)}: {sees}", width=100, initial_indent="  ",
                            subsequent_indent="      ") for key, (lesson, sees) in CATALOGUE.items()]
    return "\n".join(lines)


def _options(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument("--stop-on", nargs="+", metavar="FINDING",
                        help="end the run at the step one of these findings is made ('any' for every finding)")
    parser.add_argument("--window", type=int, help="optimizer steps a windowed finding looks at (default 10)")
    parser.add_argument("--report", metavar="PAGE.html", help="write a self-contained HTML page at the end")
    return parser


def add_parser(commands: argparse._SubParsersAction) -> None:
    """Register ``watch`` on the ``trl-clinic`` command (no heavy import until it runs)."""
    watch = commands.add_parser(
        "watch", formatter_class=argparse.RawDescriptionHelpFormatter, epilog=explain(),
        help="train with `trl sft|dpo|reward|grpo` and the watch on; exit 1 when it finds something",
        description=__doc__.split("\n\n")[0] + "\n\nexample: trl-clinic watch sft --config recipe.yaml "
        "--stop-on nonfinite --report watch.html\n(`trl-clinic watch sft --help` lists TRL's own arguments)")
    watch.add_argument("kind", choices=list(KINDS), help="the TRL script to run")
    _options(watch)
    watch.add_argument("trl_args", nargs=argparse.REMAINDER, help="the arguments `trl <kind>` takes")
    watch.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    # our options may also come after the kind, among TRL's arguments
    own, trl_args = _options(argparse.ArgumentParser(add_help=False)).parse_known_args(args.trl_args)
    watch = watch_from_command_line(args.kind, trl_args, stop_on=own.stop_on or args.stop_on,
                                    window=own.window or args.window or 10, report=own.report or args.report)
    sys.stdout.flush()
    return 1 if watch.findings else 0
