"""``bisect(...)``: the Python call behind ``trl-clinic bisect``, for a notebook or a script.

It lists the window, pins the rest of the stack from this environment, and measures versions as the search
asks for them: each one's side environment built or taken from the cache, then the recipe's first step
recorded in it. One progress line per version goes to ``progress`` (stderr by default, so ``--json`` keeps
stdout for the JSON).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from trl_clinic.bisect import search, versions
from trl_clinic.bisect.environments import prepare
from trl_clinic.bisect.records import TRAINER_KINDS, first_step_spec, record_first_step


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def bisect(
    kind: str,
    recipe: dict,
    package: str,
    good: str,
    bad: str,
    *,
    pins: Iterable[str] = (),
    pre: bool = False,
    linear: bool = False,
    window: list[str] | None = None,
    seed: int = 0,
    threads: int = 1,
    checkup: bool = True,
    data: str = "text",
    cache: Path | None = None,
    bound: float = search.LOSS_BOUND,
    progress: Callable[[str], None] = _stderr,
) -> search.Outcome:
    """Find the first release of ``package`` between ``good`` and ``bad`` whose first step of ``recipe``
    (the config a ``trl <kind> --config`` YAML holds, as a dict) differs from ``good``'s.

    ``pins`` override what is pinned from this environment ("NAME==X", or a bare "NAME" for the resolver to
    choose); ``window`` replaces the index's listing (the ends are kept); ``checkup`` runs the check-up on each
    version's trainer before its first step and keeps its verdicts; ``data`` is what the step trains on (synthetic
    text, or for SFT "conversational" prompt-completion chats through a chat template). A ValueError is a usage
    error, raised before the index is asked; ``versions.IndexUnavailable`` says the index listed nothing (undecided).
    """
    if kind not in TRAINER_KINDS:
        raise ValueError(f"bisect builds {', '.join(TRAINER_KINDS)} trainers, not {kind}")
    versions.ends(good, bad)
    pinned = versions.pins(package, pins)
    spec = first_step_spec(kind, recipe, seed=seed, threads=threads, checkup=checkup, data=data)
    listed = window if window is not None else versions.index_versions(package, pre=pre)
    chosen = versions.between(listed, good, bad, pre=pre)
    progress(f"bisect {package} {good}..{bad}: {len(chosen)} versions; pinned: {', '.join(pinned.values())}")
    count = iter(range(1, len(chosen) + 1))

    def measure(version: str) -> search.Measured:
        start = time.perf_counter()
        environment = prepare(package, version, pinned, kind, cache)
        step = search.Measured(version, environment.status, message=environment.message)
        if environment.ready:
            step.record, step.message = record_first_step(environment.python, spec)
            if step.record is None:
                step.status = "step failed"  # built, but the first step raised: not a verdict on the version
        step.seconds = time.perf_counter() - start
        record = step.record or {}
        if not step.record:
            said = step.message.splitlines()[0][:200]
        elif record.get("raised"):
            said = f"the step raised {record['raised'][:200]}"
        elif record.get("grad_norm") is not None:
            said = f"loss {record['loss']:.6g}, grad norm {record['grad_norm']:.6g}"
            said += f", {record['label_tokens']} label tokens"
        else:
            said = f"loss {record['loss']:.6g}"
        progress(f"[{next(count)}] {package} {version}: {environment.status} ({step.seconds:.1f} s): {said}")
        return step

    return (search.linear if linear else search.binary)(chosen, measure, bound)
