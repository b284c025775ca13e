"""``checkup(trainer)``: the lessons' probes run on your own trainer, just before ``trainer.train()``.

    from trl_clinic import checkup
    report = checkup(trainer)          # prints a table; report.failed, report.to_json()

Each probe leaves a finding: ok / warn / fail with how it was decided (``measured`` on your trainer,
``config`` read from its arguments or model, ``table`` from the known-bugs table), the number, the fix in
one line and the lesson that explains it; ``skipped`` with the reason it does not apply; or ``error`` with
the exception a probe raised. The check-up never changes the model's weights, buffers, flags, gradients or
config, the optimizer, the random generators, the tokenizer's padding side, the accelerator or the
trainer's attributes (``view.untouched``). docs/checkup.md says what each probe measures.
The module itself is callable, so ``from trl_clinic import checkup`` gives the function's behaviour
and ``trl_clinic.checkup.engine`` stays importable. Importing it is cheap (the ``trl-clinic``
command's help imports it): the probes, and torch with them, load at the first check-up.
"""

from __future__ import annotations

import ast
import importlib
import sys
import time
import types
from collections.abc import Iterable
from pathlib import Path

from trl_clinic.checkup.engine import PROBES, Report, merged, run_probe, selected
from trl_clinic.probes.finding import Finding

__all__ = ["PROBES", "Finding", "Report", "checkup", "load_probes", "probe_catalogue", "run_checkup"]
# one module per probe family; importing one registers its probes, in the order
PROBE_MODULES = (
    "packing",
    "accumulation",
    "precision",
    "updates",
    "padding",
    "grpo",
    "gspo",
    "labels",
    "turns",
    "prompts",
    "pairs",
    "known_bugs",
    "replicas",
)


def probe_catalogue() -> list[tuple[str, str, str]]:
    """Each probe's (name, lesson, explains), read from its ``@probe(...)`` line in the modules' source
    without importing them: the modules import torch (7 s), and ``trl-clinic checkup --help`` answers in
    well under a second."""
    folder = Path(__file__).resolve().parent
    catalogue = []
    for name in PROBE_MODULES:
        for node in ast.parse((folder / f"{name}.py").read_text()).body:
            for decorator in getattr(node, "decorator_list", []):
                if isinstance(decorator, ast.Call) and getattr(decorator.func, "id", None) == "probe":
                    catalogue.append(tuple(ast.literal_eval(argument) for argument in decorator.args))
    return catalogue


def load_probes() -> dict:
    """Import every probe module, and keep the registry in PROBE_MODULES' order whichever was imported first."""
    for name in PROBE_MODULES:
        importlib.import_module(f"trl_clinic.checkup.{name}")
    order = sorted(PROBES.values(), key=lambda p: PROBE_MODULES.index(p.run.__module__.rsplit(".", 1)[1]))
    PROBES.clear()
    PROBES.update((p.name, p) for p in order)
    return PROBES


def run_checkup(
    trainer,
    only: Iterable[str] | None = None,
    skip: Iterable[str] | None = None,
    show: bool = True,
    budget: int | None = None,
) -> Report:
    """Run the selected probes on ``trainer`` and return the report (printed as a table when ``show``).

    ``budget``: the bytes a probe may hold beyond what training holds (copies of gradients, clones;
    ``checkup.step.DEFAULT_BUDGET``, 1 GiB); a probe that needs more skips and says how much it needed. Under
    several processes (torchrun, accelerate launch) every process runs the probes on its own shard, the findings
    are gathered into one verdict (``engine.merged``), the same report is returned on every process, and only the
    main process prints it."""
    from trl_clinic.checkup.sharded import parameter_count
    from trl_clinic.checkup.step import DEFAULT_BUDGET
    from trl_clinic.checkup.view import TrainerView, untouched
    from trl_clinic.probes.processes import Processes

    load_probes()
    processes = Processes.of(trainer.args)
    specs = selected(only, skip)
    view = TrainerView(
        trainer, budget=DEFAULT_BUDGET if budget is None else budget, probes=frozenset(s.name for s in specs)
    )
    model = view.base_model
    report = Report(
        subject=f"{type(trainer).__name__} on {type(model).__name__} ({parameter_count(model) / 1e6:.1f}M parameters)"
    )
    start = time.perf_counter()
    with untouched(trainer, budget=view.budget):
        for spec in specs:
            report.findings += run_probe(spec, view)
    if processes.several:
        report.findings = merged(processes.gather(report.findings))
    report.processes, report.main = processes.count, processes.main
    report.seconds = time.perf_counter() - start
    if show and report.main:
        report.print()
    return report


checkup = run_checkup


class _CallableModule(types.ModuleType):
    def __call__(self, trainer, **kwargs) -> Report:
        return run_checkup(trainer, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
