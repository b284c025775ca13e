"""The command shape the check-up and the watch share: ``trl-clinic checkup|watch sft|dpo|reward|grpo|kto [our
options] [TRL's arguments]``, where TRL's own script parses the arguments and builds the trainer.

The arguments after the trainer kind are those of ``trl sft`` (a ``--config`` YAML, or flags), parsed by the
script's own ``make_parser`` (``TrlParser`` over TRL's dataclasses); the script's ``main`` then runs with its
trainer class's ``train`` replaced (``run_script``): the check-up intercepts it, the watch adds itself and
trains. Stdlib only, so ``trl-clinic --help`` stays light: TRL loads when a command runs.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from types import ModuleType
from unittest import mock

TRAINERS = {
    "sft": "SFTTrainer",
    "dpo": "DPOTrainer",
    "reward": "RewardTrainer",
    "grpo": "GRPOTrainer",
    "kto": "KTOTrainer",
}


def add_script_command(
    commands: argparse._SubParsersAction, name: str, options, handle, kind_help: str, **parser_kwargs
) -> argparse.ArgumentParser:
    """Register ``trl-clinic <name> <kind> [our options] [TRL's arguments]``: ``options(parser)`` adds our
    options, everything after the kind goes to TRL's script."""
    parser = commands.add_parser(name, formatter_class=argparse.RawDescriptionHelpFormatter, **parser_kwargs)
    parser.add_argument("kind", choices=list(TRAINERS), help=kind_help)
    options(parser)
    parser.add_argument("trl_args", nargs=argparse.REMAINDER, help="the arguments `trl <kind>` takes")
    parser.set_defaults(handler=handle)
    return parser


def own_options(options, args: argparse.Namespace) -> tuple[argparse.Namespace, list[str]]:
    """Our options, which may also come after the kind among TRL's arguments (there they win), and TRL's
    arguments without them. Options not given after the kind are left out of that parse (``SUPPRESS``), so a
    value given there, 0 included, is never mistaken for one not given."""
    parser = options(argparse.ArgumentParser(add_help=False, argument_default=argparse.SUPPRESS))
    after, trl_args = parser.parse_known_args(args.trl_args)
    own = {action.dest: getattr(args, action.dest) for action in parser._actions}
    return argparse.Namespace(**{**own, **vars(after)}), trl_args


def run_script(script: ModuleType, kind: str, argv: list[str], command: str, train: Callable) -> None:
    """Run TRL's ``script`` (``trl.scripts.<kind>``) on ``argv`` as ``trl <kind>`` would, its trainer class's
    ``train`` replaced by ``train(trainer, *args, **kwargs)`` while it runs. The usage line names our command
    where ``make_parser`` takes a ``prog`` (trl 1.16.0's does, trl 0.24.0's does not)."""
    import inspect

    import trl

    named = {"prog": f"trl-clinic {command} {kind}"}
    takes = inspect.signature(script.make_parser).parameters
    parsed = script.make_parser(**{k: v for k, v in named.items() if k in takes}).parse_args_and_config(args=argv)
    with mock.patch.object(getattr(trl, TRAINERS[kind]), "train", train):
        script.main(*parsed)
