"""Studying a crash that kills the process: a real native fault, and bisecting a config to find its cause.

A native fault (SIGFPE, SIGSEGV) kills the Python process that hits it; in Jupyter that is the
kernel, with every variable in it. So each trial runs in a child (``trl_clinic.course.child``), with
``faulthandler`` on so the child prints its Python stack as it dies, and the parent reads how it ended.
"""

from __future__ import annotations

import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from trl_clinic.course.child import Outcome

INT64_MIN = torch.iinfo(torch.int64).min
# what divide_and_report() writes when the division came back: a child that trapped never writes it
DIVISION_RETURNED = "the division returned"


def native_sigfpe() -> torch.Tensor:
    """Integer division of the smallest int64 by -1 in torch's kernel: the quotient overflows, and an x86
    processor traps it (#DE, which Linux delivers as SIGFPE), so on x86 this call never returns and the
    process dies. Python cannot catch it (integer division by zero, by contrast, raises a Python error in torch).

    An ARM processor's division does not trap: there the call returns the wrapped quotient (INT64_MIN) and
    nothing dies. Nothing here sends the signal by hand, so a child that dies in this call died by the trap;
    the injected stand-in that must die on every machine is ``stand_ins.die_by_sigfpe``.
    """
    return torch.div(torch.tensor([INT64_MIN]), -1, rounding_mode="trunc")


def divide_and_report() -> None:
    """``native_sigfpe()``, then ``DIVISION_RETURNED`` on stderr: run in a child, the line's absence and
    faulthandler's stack naming ``native_sigfpe`` tell a trap in the kernel from any other death."""
    print("about to divide", file=sys.stderr, flush=True)
    native_sigfpe()
    print(DIVISION_RETURNED, file=sys.stderr, flush=True)


def in_process(call: Callable[[], object]) -> Outcome:
    """Run ``call()`` here and say how it ended, as ``child.run_child`` says it for a child.

    A failure Python can catch (a config that today's TRL rejects) needs no child process, and a
    trial of ``bisect_settings`` then costs milliseconds instead of a Python start-up.
    """
    start = time.perf_counter()
    try:
        call()
    except Exception as error:  # noqa: BLE001 - any Python error is the trial's result, reported in full
        return Outcome(
            "exception",
            None,
            time.perf_counter() - start,
            message=f"{type(error).__name__}: {error}",
            stderr=traceback.format_exc(),
        )
    return Outcome("finished", 0, time.perf_counter() - start)


@dataclass
class Trial:
    settings: list[str]  # names of the settings added to the minimal config
    outcome: Outcome
    phase: str  # "minimal", "all" or "halving"


@dataclass
class Bisection:
    trials: list[Trial] = field(default_factory=list)
    culprits: list[str] | None = None  # smallest set of settings that makes the minimal config fail


def bisect_settings(names: list[str], run: Callable[[list[str]], Outcome]) -> Bisection:
    """Find the smallest set of settings that turns a working minimal config into a crash, as ``git bisect``
    finds a commit: by halving, so n settings cost about log2(n) trials per culprit, not n.

    ``run(subset)`` runs the minimal config plus the named settings and returns its Outcome. The minimal
    config must work and all the settings together must fail. Halving then finds the shortest prefix of the
    settings (in the user's order) that still fails: its last setting is needed. The same halving repeats over
    the settings before it, with the needed ones added, until the needed ones fail on their own. It assumes
    that adding a setting never cures a failure.
    """
    result = Bisection()

    def attempt(subset: list[str], phase: str) -> bool:
        outcome = run(subset)
        result.trials.append(Trial(list(subset), outcome, phase))
        return outcome.crashed

    if attempt([], "minimal") or not attempt(names, "all"):
        return result  # the minimal config fails itself, or nothing the user set makes it fail
    needed, rest = [], list(names)
    while True:
        low, high = 1, len(rest)  # rest[:high] + needed fails; rest[:0] + needed works
        while low < high:
            middle = (low + high) // 2
            if attempt(rest[:middle] + needed, "halving"):
                high = middle
            else:
                low = middle + 1
        needed.insert(0, rest[low - 1])
        rest = rest[: low - 1]
        if not rest or attempt(needed, "halving"):
            break
    result.culprits = [name for name in names if name in needed]
    return result
