"""Studying a crash that kills the process: run it in a child, report how it ended, bisect the config.

A native fault (SIGFPE, SIGSEGV) kills the Python process that hits it; in Jupyter that is the
kernel, with every variable in it. So a run suspected of crashing goes to a child process, with
``faulthandler`` on so the child prints its Python stack as it dies, and the parent reads how it ended.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import TrainerCallback

INT64_MIN = torch.iinfo(torch.int64).min


@dataclass
class Outcome:
    status: str  # "finished", "exception", "signal" or "timeout"
    returncode: int | None
    seconds: float
    signal: str | None = None  # e.g. "SIGFPE" when killed by a signal
    message: str | None = None  # the exception line ("ValueError: ...") or faulthandler's first line
    stderr: str = ""  # faulthandler's or Python's stack as the child printed it (its tail)

    @property
    def crashed(self) -> bool:
        return self.status != "finished"

    def describe(self) -> str:
        if self.status == "finished":
            return f"finished in {self.seconds:.1f} s"
        if self.status == "signal":
            return f"killed by {self.signal} (return code {self.returncode}): {self.message}"
        return f"{self.status}: {self.message}"


_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Interrupt|Exit)\b.*")


def run_child(args: list[str], timeout: float = 600, cwd: str | Path | None = None,
              faulthandler: bool = True) -> Outcome:
    """Run ``python -X faulthandler ARGS`` and say how it ended; never raises for the child's failures.

    ``faulthandler=False`` shows what a plain run leaves behind after a native crash: nothing.
    """
    start = time.perf_counter()
    command = [sys.executable, *(["-X", "faulthandler"] if faulthandler else []), *args]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=cwd)
    except subprocess.TimeoutExpired as expired:
        stderr = expired.stderr.decode() if isinstance(expired.stderr, bytes) else (expired.stderr or "")
        return Outcome("timeout", None, time.perf_counter() - start, message=f"still running after {timeout} s",
                       stderr=stderr[-4000:])
    seconds = time.perf_counter() - start
    stderr = done.stderr[-4000:]
    if done.returncode == 0:
        return Outcome("finished", 0, seconds, stderr=stderr)
    if done.returncode < 0:
        name = signal.Signals(-done.returncode).name
        fatal = next((line for line in stderr.splitlines() if line.startswith("Fatal Python error")), "no message")
        return Outcome("signal", done.returncode, seconds, signal=name, message=fatal, stderr=stderr)
    lines = [line for line in done.stderr.splitlines() if _EXCEPTION_LINE.match(line)]
    return Outcome("exception", done.returncode, seconds, message=lines[-1] if lines else stderr.strip()[-300:],
                   stderr=stderr)


def native_sigfpe() -> None:
    """A real native SIGFPE on CPU: integer division of the smallest int64 by -1 overflows in the kernel.

    Python cannot catch it (integer division by zero, by contrast, raises a Python error in torch).
    """
    torch.div(torch.tensor([INT64_MIN]), -1, rounding_mode="trunc")


class SimulatedH20Fault(TrainerCallback):
    """A STAND-IN, injected on purpose: dies with a native SIGFPE at the first step when ``bf16`` is on.

    The real crash (bf16 GEMMs on an H20 GPU with the cuBLAS of torch's cu121 wheels) cannot happen on
    this hardware. This callback reproduces its *shape* (a bf16-only native SIGFPE at the first step)
    so that crash isolation and bisection can be shown for real; it says nothing about cuBLAS.
    """

    def on_step_begin(self, args, state, control, **kwargs):
        if args.bf16:
            native_sigfpe()


@dataclass
class Trial:
    settings: list[str]  # names of the settings added to the minimal config
    outcome: Outcome
    phase: str  # "minimal", "ladder" or "halving"


@dataclass
class Bisection:
    trials: list[Trial] = field(default_factory=list)
    culprits: list[str] | None = None  # smallest set of settings that makes the minimal config fail


def bisect_settings(names: list[str], run: Callable[[list[str]], Outcome]) -> Bisection:
    """Find the smallest set of settings that turns a working minimal config into a crash.

    ``run(subset)`` runs the minimal config plus the named settings and returns its Outcome. First a
    ladder adds the settings one by one, in order, until a run fails; the last one added is needed.
    Then halving: the shortest prefix of the earlier settings that still fails together with the
    needed ones adds one more needed setting, until the needed ones fail on their own.
    """
    result = Bisection()

    def attempt(subset: list[str], phase: str) -> bool:
        outcome = run(subset)
        result.trials.append(Trial(list(subset), outcome, phase))
        return outcome.crashed

    if attempt([], "minimal"):
        return result  # the minimal config itself fails: nothing to bisect
    failing_prefix = next((k for k in range(1, len(names) + 1) if attempt(names[:k], "ladder")), None)
    if failing_prefix is None:
        return result
    needed, rest = [names[failing_prefix - 1]], names[:failing_prefix - 1]
    while rest and not attempt(needed, "halving"):
        low, high = 1, len(rest)  # the full rest fails with `needed` (the ladder showed it)
        while low < high:
            middle = (low + high) // 2
            if attempt(rest[:middle] + needed, "halving"):
                high = middle
            else:
                low = middle + 1
        needed.insert(0, rest[low - 1])
        rest = rest[:low - 1]
    result.culprits = [name for name in names if name in needed]
    return result
