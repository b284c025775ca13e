"""``trl-clinic bisect sft --config recipe.yaml --package trl --good X --bad Y``: the first release whose first
step of the recipe differs from the good end's.

Exit codes follow the check-up's: 0 nothing changed, 1 a change found, 2 a usage error, 3 a build failure
left the search undecided. Stdlib and YAML only at import, so ``trl-clinic --help`` stays light.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import yaml

from trl_clinic.bisect.records import DATA, TRAINER_KINDS


def add_parser(commands: argparse._SubParsersAction) -> None:
    """Register ``bisect`` on the ``trl-clinic`` command."""
    parser = commands.add_parser(
        "bisect",
        help="the first release of a package whose first training step of your recipe changed",
        description=__doc__.split("\n\n")[0],
        epilog="example: trl-clinic bisect sft --config recipe.yaml --package transformers --good 4.45.0 "
        "--bad 4.46.0 --pin trl==0.11.4 --pin peft==0.13.2 --pin accelerate==1.0.1 --pin datasets --pin rich",
    )
    parser.add_argument("kind", choices=TRAINER_KINDS, help="the trainer the recipe builds")
    parser.add_argument("--config", type=Path, required=True, help="the recipe: a `trl <kind> --config` YAML")
    parser.add_argument(
        "--package",
        required=True,
        help="the package that moves (trl, transformers, ...), or several upgraded together, comma-separated "
        "(trl,transformers: the first moves from its good to its bad version, then the next)",
    )
    parser.add_argument("--good", required=True, help="a version whose first step is the reference (one per package)")
    parser.add_argument("--bad", required=True, help="a newer version that shows the change (one per package)")
    parser.add_argument(
        "--pin",
        action="append",
        default=[],
        help="NAME==X pins NAME in every side environment, a bare NAME lets uv choose it (default: this "
        "environment's torch, transformers, trl, accelerate, peft, datasets); repeatable",
    )
    parser.add_argument("--pre", action="store_true", help="walk pre-releases too")
    parser.add_argument("--linear", action="store_true", help="measure every version (a change that went back)")
    parser.add_argument("--json", action="store_true", help="print the result as JSON (progress stays on stderr)")
    parser.add_argument(
        "--no-checkup", action="store_true", help="no check-up verdicts per version (they run before each first step)"
    )
    parser.add_argument(
        "--data",
        choices=DATA,
        default="text",
        help="what the step trains on: synthetic text (default), or for sft conversational prompt-completion chats "
        "through a chat template",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="torch threads in each first step (default 1)")
    parser.add_argument("--cache", type=Path, default=None, help="where the side environments are kept")
    parser.set_defaults(handler=handle)


def read_recipe(path: Path) -> dict:
    """The recipe's fields: a YAML mapping, as ``trl <kind> --config`` reads it (a ValueError otherwise)."""
    if not path.is_file():
        raise ValueError(f"no config file {path}")
    recipe = yaml.safe_load(path.read_text()) or {}
    if not isinstance(recipe, dict):
        raise ValueError(f"{path} holds no mapping of config fields")
    return recipe


def unlisted(args: argparse.Namespace, why: str) -> int:
    """Exit code 3: the index did not list the window, so nothing was measured (said as JSON with ``--json``)."""
    said = f"undecided: {args.package}'s releases could not be listed: {why}"
    if args.json:
        listed = {"package": args.package, "good": args.good, "bad": args.bad, "decided": False, "exit_code": 3}
        print(json.dumps(listed | {"verdict": said}, indent=1))
    else:
        print(said)
    return 3


def moves(args: argparse.Namespace) -> list[tuple[str, str, str]]:
    """(package, good, bad) for each comma-separated package (a ValueError when the counts differ)."""
    packages, goods, bads = (value.split(",") for value in (args.package, args.good, args.bad))
    if not len(packages) == len(goods) == len(bads):
        raise ValueError(f"--package names {len(packages)}, --good {len(goods)} and --bad {len(bads)}: one each")
    return [(p.strip(), g.strip(), b.strip()) for p, g, b in zip(packages, goods, bads)]


def handle(args: argparse.Namespace) -> int:
    from trl_clinic.bisect.changes import changed_files, said
    from trl_clinic.bisect.report import table, to_json, verdict
    from trl_clinic.bisect.runner import bisect_together
    from trl_clinic.bisect.versions import IndexUnavailable

    moving = moves(args)
    package = moving[0][0] if len(moving) == 1 else ""  # an upgrade path's labels name every package
    try:
        outcome = bisect_together(
            args.kind,
            read_recipe(args.config),
            moving,
            pins=args.pin,
            pre=args.pre,
            linear=args.linear,
            seed=args.seed,
            threads=args.threads,
            checkup=not args.no_checkup,
            data=args.data,
            cache=args.cache,
        )
    except IndexUnavailable as error:
        return unlisted(args, str(error))
    if args.json:
        print(json.dumps(to_json(outcome, package) | {"package": args.package}, indent=1))
    else:
        print(table(outcome))
        print(verdict(outcome, package))
        if files := said(changed_files(outcome)):
            print(files)
    sys.stdout.flush()
    return outcome.exit_code
