"""``trl-clinic checkup sft|dpo|reward|grpo|kto``: TRL's own script builds the trainer, the check-up examines it.

The command's shape is the one the watch shares (``trl_clinic.probes.command``): the arguments after the
trainer kind are those of ``trl sft``, parsed by the script's own ``make_parser``, and the script's own
``main`` builds the trainer; its call to ``train()`` is intercepted, so the trainer checked is exactly the
one ``trl sft`` would train, and nothing is trained. A config that one of TRL's config classes rejects
(``GRPOConfig``'s batch rules) is a failed finding carrying TRL's message, decided ``config``; anything
else that stops the build (a missing file, a TRL without that script) is an ``error`` finding with its
reason, never a fail the config did not earn.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import textwrap
import traceback
from pathlib import Path

from trl_clinic.probes.command import add_script_command, own_options, run_script

BUILD_PROBE = {"grpo": ("grpo_config", "05")}  # where a config TRL refuses belongs; others are reported as "build"


class _Built(Exception):
    def __init__(self, trainer) -> None:
        super().__init__("trainer built")
        self.trainer = trainer


def build_trainer(kind: str, argv: list[str]):
    """The trainer ``trl <kind> <argv>`` would train, built by TRL's script (``trl.scripts.<kind>.main``)."""
    import trl

    try:
        script = importlib.import_module(f"trl.scripts.{kind}")
    except ModuleNotFoundError as error:
        raise RuntimeError(
            f"trl {trl.__version__} has no `trl {kind}` script (trl.scripts.{kind}): build the trainer "
            "in your own script and call checkup(trainer)"
        ) from error
    if not hasattr(script, "make_parser"):
        raise RuntimeError(
            f"trl {trl.__version__}'s trl.scripts.{kind} has no make_parser: build the trainer in "
            "your own script and call checkup(trainer)"
        )

    def intercept(trainer, *args, **kwargs):
        raise _Built(trainer)

    try:
        run_script(script, kind, argv, "checkup", intercept)
    except _Built as built:
        return built.trainer
    raise RuntimeError(f"trl.scripts.{kind}.main returned without calling train()")


def refused_by_config(error: BaseException) -> bool:
    """Whether ``error`` was raised inside one of TRL's config classes (``trl/trainer/*_config.py``), where TRL
    validates a config's values (``GRPOConfig.__post_init__``), rather than anywhere else in the build."""
    frame = traceback.extract_tb(error.__traceback__)[-1]
    path = Path(frame.filename)
    return isinstance(error, (ValueError, TypeError)) and path.name.endswith("_config.py") and "trl" in path.parts


def checkup_from_command_line(
    kind: str, argv: list[str], only=None, skip=None, show: bool = True, budget: int | None = None
):
    """The check-up report of the trainer TRL's script builds from ``argv``; a config TRL refuses is a fail,
    any other build error an error."""
    from trl_clinic.checkup import run_checkup
    from trl_clinic.checkup.engine import Report
    from trl_clinic.probes.finding import Finding

    try:
        trainer = build_trainer(kind, argv)
    except SystemExit:  # TRL's argument parser already said what was wrong
        raise
    except Exception as error:  # noqa: BLE001 - reported as a finding, with the exit code that says which
        text = f"{type(error).__name__}: {error}"
        if refused_by_config(error):
            probe, lesson = BUILD_PROBE.get(kind, ("build", ""))
            finding = Finding(
                probe, "fail", "TRL's config class refused the config", lesson=lesson, fix=text, decided="config"
            )
        else:
            finding = Finding("build", "error", reason=f"the trainer could not be built: {text}")
        report = Report([finding], subject=f"trl {kind} (not built)")
        if show:
            report.print()
        return report
    return run_checkup(trainer, only=only, skip=skip, show=show, budget=budget)


def explain() -> str:
    """Every probe, the lesson that explains it, and what its fail or warn means (for --help)."""
    from trl_clinic.checkup import probe_catalogue
    from trl_clinic.probes.finding import DECISIONS

    lines = [
        "probes (each finding: ok / warn / fail, or skipped with the reason it does not apply, or error with the "
        "exception a probe raised; the number, the fix in one line, the lesson):"
    ]
    lines += [
        textwrap.fill(
            f"{name} (lesson {lesson}): {explains}", width=100, initial_indent="  ", subsequent_indent="      "
        )
        for name, lesson, explains in probe_catalogue()
    ]
    lines += ["", "decided (how each ok / warn / fail was reached):"]
    lines += [f"  {name}: {meaning}" for name, meaning in DECISIONS.items()]
    lines += [
        "",
        "exit code: 0 no fail and no error; 1 a probe failed; 3 no fail, but a probe (or the build) crashed; "
        "2 a usage error",
    ]
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
    parser.add_argument(
        "--budget",
        type=int,
        metavar="BYTES",
        help="bytes a probe may hold beyond what training holds (default 1 GiB); a probe that needs more skips",
    )
    return parser


def add_parser(commands: argparse._SubParsersAction) -> None:
    """Register ``checkup`` on the ``trl-clinic`` command (no heavy import until it runs)."""
    checkup = add_script_command(
        commands,
        "checkup",
        _options,
        handle,
        "the TRL script whose trainer is checked",
        add_help=False,
        help="run the lessons' probes on the trainer `trl sft|dpo|reward|grpo|kto` would build; "
        "exit 1 on a fail, 3 on an error",
        description=__doc__.split("\n\n")[0] + "\n\nexample: trl-clinic checkup sft --config recipe.yaml --json\n"
        "(`trl-clinic checkup sft --help` lists TRL's own arguments)",
    )
    checkup.add_argument("-h", "--help", action=_Help, help="show this help, with what each finding means")


def handle(args: argparse.Namespace) -> int:
    own, trl_args = own_options(_options, args)
    report = checkup_from_command_line(
        args.kind, trl_args, only=own.only, skip=own.skip, show=not own.json, budget=own.budget
    )
    if own.json and report.main:  # one JSON for a run of several processes
        print(report.to_json())
    sys.stdout.flush()
    return report.exit_code
