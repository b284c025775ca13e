"""``trl-clinic checkup sft|dpo|reward|grpo``: TRL's own script builds the trainer, the check-up examines it.

The arguments after the trainer kind are those of ``trl sft`` (a ``--config`` YAML, or flags), parsed
by the script's own ``make_parser`` (``TrlParser`` over TRL's dataclasses). The script's own ``main``
then builds the trainer; its call to ``train()`` is intercepted, so the trainer checked is exactly the
one ``trl sft`` would train, and nothing is trained. A config that TRL itself rejects while building
(GRPO's batch rules, a removed argument) is a failed finding carrying TRL's message.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import textwrap
from unittest import mock

KINDS = {"sft": "SFTTrainer", "dpo": "DPOTrainer", "reward": "RewardTrainer", "grpo": "GRPOTrainer"}
BUILD_PROBE = {"grpo": ("grpo_config", "05")}  # where a build error belongs; others are reported as "build"


class _Built(Exception):
    def __init__(self, trainer) -> None:
        super().__init__("trainer built")
        self.trainer = trainer


def build_trainer(kind: str, argv: list[str]):
    """The trainer ``trl <kind> <argv>`` would train, built by TRL's script (``trl.scripts.<kind>.main``)."""
    import trl

    script = importlib.import_module(f"trl.scripts.{kind}")
    parsed = script.make_parser(prog=f"trl-clinic checkup {kind}").parse_args_and_config(args=argv)

    def intercept(trainer, *args, **kwargs):
        raise _Built(trainer)

    with mock.patch.object(getattr(trl, KINDS[kind]), "train", intercept):
        try:
            script.main(*parsed)
        except _Built as built:
            return built.trainer
    raise RuntimeError(f"trl.scripts.{kind}.main returned without calling train()")


def checkup_from_command_line(kind: str, argv: list[str], only=None, skip=None, show: bool = True):
    """The check-up report of the trainer TRL's script builds from ``argv``; a build error is a fail."""
    from trl_clinic.checkup import run_checkup
    from trl_clinic.checkup.engine import Finding, Report

    try:
        trainer = build_trainer(kind, argv)
    except (ValueError, TypeError) as error:
        probe, lesson = BUILD_PROBE.get(kind, ("build", ""))
        report = Report([Finding(probe, "fail", "TRL refused the config", lesson=lesson,
                                 fix=f"{type(error).__name__}: {error}")], subject=f"trl {kind} (not built)")
        if show:
            report.print()
        return report
    return run_checkup(trainer, only=only, skip=skip, show=show)


def explain() -> str:
    """Every probe, the lesson that explains it, and what its fail or warn means (for --help)."""
    from trl_clinic.checkup import probe_catalogue

    lines = ["probes (each finding: ok / warn / fail / skipped with the reason, the number measured, the fix "
             "in one line, the lesson):"]
    lines += [textwrap.fill(f"{name} (lesson {lesson}): {explains}", width=100, initial_indent="  ",
                            subsequent_indent="      ") for name, lesson, explains in probe_catalogue()]
    return "\n".join(lines)


class _Help(argparse.Action):
    """Help that reads the probes' descriptions only when asked, from their source (``probe_catalogue``)."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help=None):
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        parser.epilog = explain()
        parser.print_help()
        parser.exit()


def _options(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument("--only", nargs="+", metavar="PROBE", help="run only these probes")
    parser.add_argument("--skip", nargs="+", metavar="PROBE", help="leave these probes out")
    parser.add_argument("--json", action="store_true", help="print the report as JSON (for CI) instead of a table")
    return parser


def add_parser(commands: argparse._SubParsersAction) -> None:
    """Register ``checkup`` on the ``trl-clinic`` command (no heavy import until it runs)."""
    checkup = commands.add_parser(
        "checkup", add_help=False, formatter_class=argparse.RawDescriptionHelpFormatter,
        help="run the lessons' probes on the trainer `trl sft|dpo|reward|grpo` would build; exit 1 on a fail",
        description=__doc__.split("\n\n")[0] + "\n\nexample: trl-clinic checkup sft --config recipe.yaml --json\n"
        "(`trl-clinic checkup sft --help` lists TRL's own arguments)")
    checkup.add_argument("-h", "--help", action=_Help, help="show this help, with what each finding means")
    checkup.add_argument("kind", choices=list(KINDS), help="the TRL script whose trainer is checked")
    _options(checkup)
    checkup.add_argument("trl_args", nargs=argparse.REMAINDER, help="the arguments `trl <kind>` takes")
    checkup.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    # our options may also come after the kind, among TRL's arguments
    own, trl_args = _options(argparse.ArgumentParser(add_help=False)).parse_known_args(args.trl_args)
    report = checkup_from_command_line(args.kind, trl_args, only=own.only or args.only, skip=own.skip or args.skip,
                                       show=not (own.json or args.json))
    if own.json or args.json:
        print(report.to_json())
    sys.stdout.flush()
    return report.exit_code
