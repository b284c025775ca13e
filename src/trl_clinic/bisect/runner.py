"""``bisect(...)``: the Python call behind ``trl-clinic bisect``, for a notebook or a script.

It lists the window, pins the rest of the stack from this environment, and measures versions as the search
asks for them: each one's side environment built or taken from the cache, then the recipe's first step
recorded in it. One progress line per version goes to ``progress`` (stderr by default, so ``--json`` keeps
stdout for the JSON).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterable, Sequence
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
    return bisect_together(
        kind,
        recipe,
        [(package, good, bad)],
        pins=pins,
        pre=pre,
        linear=linear,
        windows=None if window is None else {package: window},
        seed=seed,
        threads=threads,
        checkup=checkup,
        data=data,
        cache=cache,
        bound=bound,
        progress=progress,
    )


def upgrade_path(moves: Sequence[tuple[str, str, str]], listed: dict[str, list[str]], *, pre: bool = False) -> list:
    """The environments an upgrade passes through, as (label, package that moved, its version, every package's
    version): every package at its good version first, then the first package through its releases up to its bad
    one with the others still at their good ones, then the next package, and so on. Two neighbours differ in one
    release of one package, so a first change names both. One package: its releases, labelled by version alone."""
    state = {package: good for package, good, _ in moves}
    first_package = moves[0][0]
    path = [(first_package, moves[0][1], dict(state))]
    for package, good, bad in moves:
        for version in versions.between(listed[package], good, bad, pre=pre)[1:]:
            state[package] = version
            path.append((package, version, dict(state)))
    if len(moves) == 1:
        return [(version, package, version, state) for package, version, state in path]
    return [(named(state), package, version, state) for package, version, state in path]


def named(state: dict[str, str]) -> str:
    return " + ".join(f"{package} {version}" for package, version in state.items())


def bisect_together(
    kind: str,
    recipe: dict,
    moves: Sequence[tuple[str, str, str]],
    *,
    pins: Iterable[str] = (),
    pre: bool = False,
    linear: bool = False,
    windows: dict[str, list[str]] | None = None,
    seed: int = 0,
    threads: int = 1,
    checkup: bool = True,
    data: str = "text",
    cache: Path | None = None,
    bound: float = search.LOSS_BOUND,
    progress: Callable[[str], None] = _stderr,
) -> search.Outcome:
    """``bisect`` for packages a user upgrades together (trl and the transformers it needs): ``moves`` holds
    (package, good, bad) for each, in the order the path moves them (``upgrade_path``); the versions of the
    outcome are the path's labels ("trl 0.26.0 + transformers 5.0.0"). A point whose pins cannot be resolved
    together (a TRL that needs a newer transformers than the one held) is a conflict, skipped like any other.
    ``windows`` replaces the index's listing per package. The rest as ``bisect``.
    """
    if kind not in TRAINER_KINDS:
        raise ValueError(f"bisect builds {', '.join(TRAINER_KINDS)} trainers, not {kind}")
    moving = [package for package, _, _ in moves]
    if not moving or len(set(moving)) < len(moving):
        raise ValueError(f"each package moves once: {', '.join(moving) or 'none given'}")
    for _, good, bad in moves:
        versions.ends(good, bad)
    for package in moving:  # a pin may not name a package that moves (a ValueError names it)
        versions.pins(package, pins)
    pinned = {name: line for name, line in versions.pins(moving[0], pins).items() if name not in moving}
    spec = first_step_spec(kind, recipe, seed=seed, threads=threads, checkup=checkup, data=data)
    windows = windows or {}
    listed = {p: windows[p] if p in windows else versions.index_versions(p, pre=pre) for p in moving}
    path = upgrade_path(moves, listed, pre=pre)
    points = {label: (package, version, state) for label, package, version, state in path}
    ends = " then ".join(f"{p} {good}..{bad}" for p, good, bad in moves)
    progress(f"bisect {ends}: {len(path)} versions; pinned: {', '.join(pinned.values())}")
    count = iter(range(1, len(path) + 1))

    def measure(label: str) -> search.Measured:
        start = time.perf_counter()
        package, version, state = points[label]
        held = pinned | {p: f"{p}=={v}" for p, v in state.items() if p != package}
        environment = prepare(package, version, held, kind, cache)
        step = search.Measured(label, environment.status, message=environment.message)
        if environment.ready:
            step.record, step.message = record_first_step(environment.python, spec)
            if step.record is None:
                step.status = "step failed"  # built, but the first step raised: not a verdict on the version
        step.seconds = time.perf_counter() - start
        progress(f"[{next(count)}] {named(state)}: {environment.status} ({step.seconds:.1f} s): {said(step)}")
        return step

    return (search.linear if linear else search.binary)([label for label, *_ in path], measure, bound)


def said(step: search.Measured) -> str:
    """A measured version's progress line: its numbers, the exception its step raised, or why it has none."""
    record = step.record or {}
    if not step.record:
        return step.message.splitlines()[0][:200]
    if record.get("raised"):
        return f"the step raised {record['raised'][:200]}"
    if record.get("grad_norm") is not None:
        return f"loss {record['loss']:.6g}, grad norm {record['grad_norm']:.6g}, {record['label_tokens']} label tokens"
    return f"loss {record['loss']:.6g}"
