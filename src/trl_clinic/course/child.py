"""Running a lesson's function in a child process: spec in, result out, a time limit, how it ended.

Some runs must not happen in the notebook's kernel: a native crash (SIGFPE, SIGSEGV) kills the
process that hits it, with every variable in it, and a multi-process launch needs processes of its
own. ``call`` starts ``python -X faulthandler -m trl_clinic.course.child`` (or a launcher such as torchrun
around it), hands it the resolved run and a spec, and reads back what the function returned, or how
the process died. The child never resolves the profile again: it gets the parent's device,
precision and sizes, and a CPU run's children do not see the GPUs at all.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trl_clinic.course.parameters import Run

RESULT_SUFFIX = ".result.pt"
_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Interrupt|Exit)\b.*")


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


@dataclass
class ChildRun:
    outcome: Outcome
    result: object = None  # what the function returned (main process), None when it did not finish


def run_child(args: list[str], timeout: float = 600, cwd: str | Path | None = None, faulthandler: bool = True,
              env: dict[str, str] | None = None, python: str | None = None) -> Outcome:
    """Run ``python -X faulthandler ARGS`` and say how it ended; never raises for the child's failures.

    ``faulthandler=False`` shows what a plain run leaves behind after a native crash: nothing.
    ``python`` runs another interpreter instead of this one (an era's, ``trl_clinic.course.eras``).
    """
    start = time.perf_counter()
    command = [python or sys.executable, *(["-X", "faulthandler"] if faulthandler else []), *args]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=cwd,
                              env={**os.environ, **(env or {})})
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
        # searched in the whole stderr: with many threads, faulthandler's first line is beyond the kept tail
        fatal = next((line for line in done.stderr.splitlines() if line.startswith("Fatal Python error")), "no message")
        return Outcome("signal", done.returncode, seconds, signal=name, message=fatal, stderr=stderr)
    lines = [line for line in done.stderr.splitlines() if _EXCEPTION_LINE.match(line)]
    return Outcome("exception", done.returncode, seconds, message=lines[-1] if lines else stderr.strip()[-300:],
                   stderr=stderr)


def child_env(run: "Run") -> dict[str, str]:
    """A CPU run's children see no GPU: accelerate would otherwise put its barrier tensors on cuda:RANK."""
    return {"CUDA_VISIBLE_DEVICES": ""} if run.device.type == "cpu" else {}


def placed(run: "Run", processes: int) -> "Run":
    """The run as ``processes`` processes really execute it.

    With one GPU per process they run on the GPUs over NCCL, as the profile says. With fewer GPUs than
    processes (one GPU, two processes) they run on the CPU over gloo, in fp32 with sdpa: two ranks
    cannot share one GPU through NCCL, and a rank that sees the GPU asks for ``cuda:RANK`` in
    accelerate's barrier (issue 14, seen on an H100). ``placement(run)`` says which, for the notebook.
    """
    import dataclasses

    import torch

    from trl_clinic.course.launch import backend

    if processes < 2 or run.device.type == "cpu" or backend(processes, cpu=False) == "nccl":
        return run
    return dataclasses.replace(run, device=torch.device("cpu"), precision="fp32", attention="sdpa")


def placement(run: "Run", processes: int) -> str:
    """One line a learner reads: where the processes of a multi-process call run, and why."""
    from trl_clinic.course.launch import backend

    where = placed(run, processes)
    if where.device.type != "cpu":
        return f"{processes} processes, one GPU each, over nccl"
    why = "the cpu profile" if run.device.type == "cpu" else "fewer GPUs than processes, so not the GPU"
    return f"{processes} CPU processes over {backend(processes, cpu=True)}, fp32 ({why})"


def call(run: "Run", target: str, spec: dict | None = None, *, name: str, timeout: float = 600,
         processes: int = 1, faulthandler: bool = True) -> ChildRun:
    """Run ``target`` ("package.module:function" or "path/to/file.py:function") as ``function(run, spec)``
    in a child process and return its outcome and result.

    ``processes > 1`` starts it on that many processes with ``launch.distributed_args`` (the result is
    the main process's), placed as ``placed`` says: on the CPU when there are fewer GPUs than processes. ``name`` names the files written to ``run.output_dir``: the spec and the result.
    """
    from trl_clinic.course.launch import distributed_args

    spec_path = run.output_dir / f"child_{name}.json"
    result_path = spec_path.with_suffix(RESULT_SUFFIX)
    result_path.unlink(missing_ok=True)
    run = placed(run, processes)
    spec_path.write_text(json.dumps({"target": target, "run": run.to_spec(), "spec": spec or {},
                                     "result": str(result_path)}))
    args = ["-m", __name__, str(spec_path)]
    if processes > 1:
        args = distributed_args(args, processes=processes, cpu=run.device.type == "cpu")
    outcome = run_child(args, timeout=timeout, faulthandler=faulthandler, env=child_env(run))
    if outcome.crashed or not result_path.exists():
        return ChildRun(outcome)
    import torch

    return ChildRun(outcome, torch.load(result_path, weights_only=False))


def _load(target: str):
    where, _, function = target.rpartition(":")
    if where.endswith(".py"):
        module_spec = importlib.util.spec_from_file_location(Path(where).stem, where)
        module = importlib.util.module_from_spec(module_spec)
        module_spec.loader.exec_module(module)
    else:
        module = importlib.import_module(where)
    return getattr(module, function)


def _main(spec_path: str) -> None:
    import torch

    from trl_clinic.course.parameters import Run

    payload = json.loads(Path(spec_path).read_text())
    run = Run.from_spec(payload["run"])
    result = _load(payload["target"])(run, payload["spec"])
    if int(os.environ.get("RANK", "0")) == 0:
        torch.save(result, payload["result"])
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        # Leave together: a process that exits while gloo's threads still talk to the others can abort
        # ("terminate called without an active exception", SIGABRT), seen once in 02b at one seed.
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    _main(sys.argv[1])
