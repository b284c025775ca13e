"""``trl-clinic watch sft|dpo|reward|grpo|kto``: TRL's own script trains, for real, with ``ClinicWatch`` added.

The command's shape is the one the check-up shares (``trl_clinic.probes.command``): the arguments after the
trainer kind are those of ``trl sft`` (a ``--config`` YAML, or flags), parsed by the script's own
``make_parser``. The script's ``main`` then runs unchanged (it builds the trainer, trains, saves); the watch
is added to the trainer, and given it, at its call to ``train()``. Exit code 1 when the watch made a
finding, 0 when it made none. Launched on several processes, the process group outlives the script's own
``trainer.end()``, so every process agrees on the exit code and ends with it together (``trl_clinic.cli.main``).
"""

from __future__ import annotations

import argparse
import importlib
import sys
import textwrap
from unittest import mock

from trl_clinic.probes.command import TRAINERS, add_script_command, own_options, run_script
from trl_clinic.watch.config import WatchConfig
from trl_clinic.watch.findings import CATALOGUE, lesson_name


def watch_from_command_line(kind: str, argv: list[str], config: WatchConfig | None = None):
    """Run ``trl <kind> <argv>`` (``trl.scripts.<kind>.main``) with a ``ClinicWatch`` on its trainer; return it."""
    import trl

    from trl_clinic.watch.callback import ClinicWatch

    config = config or WatchConfig()
    script = importlib.import_module(f"trl.scripts.{kind}")
    train, watches = getattr(trl, TRAINERS[kind]).train, []

    def watched(trainer, *args, **kwargs):
        watches.append(ClinicWatch(config, trainer=trainer))
        trainer.add_callback(watches[-1])
        return train(trainer, *args, **kwargs)

    # TRL 1.16.0's scripts end with trainer.end() (transformers >= 5.18), which finishes the trackers and destroys the
    # process group (accelerate 1.15.0 Accelerator.end_training): kept until every process has agreed on the exit
    # code and meets the others to leave (probes.processes.leave_together destroys it then)
    with mock.patch("torch.distributed.destroy_process_group", _kept):
        run_script(script, kind, argv, "watch", watched)
    if not watches:  # nothing was watched: not an all-clear
        raise RuntimeError(f"trl.scripts.{kind}.main returned without calling train()")
    return watches[-1]


def _kept(group=None) -> None:
    """``torch.distributed.destroy_process_group`` while TRL's script runs: the group is kept for the exit."""


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
    parser.add_argument(
        "--window", type=int, help=f"optimizer steps a windowed finding looks at (default {WatchConfig.window})"
    )
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
        help="train with `trl sft|dpo|reward|grpo|kto` and the watch on; exit 1 when it finds something",
        description=__doc__.split("\n\n")[0] + "\n\nexample: trl-clinic watch sft --config recipe.yaml "
        "--stop-on nonfinite --report watch.html\n(`trl-clinic watch sft --help` lists TRL's own arguments)",
    )


def handle(args: argparse.Namespace) -> int:
    own, trl_args = own_options(_options, args)
    options = {"stop_on": own.stop_on, "window": own.window, "report": own.report}
    config = WatchConfig(**{name: value for name, value in options.items() if value is not None})
    watch = watch_from_command_line(args.kind, trl_args, config)
    sys.stdout.flush()
    return 1 if watch.findings else 0
