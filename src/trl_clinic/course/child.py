"""Running a lesson's function in a child process: spec in, result out, a time limit, how it ended.

Some runs must not happen in the notebook's kernel: a native crash (SIGFPE, SIGSEGV) kills the
process that hits it, with every variable in it, and a multi-process launch needs processes of its
own. ``call`` starts ``python -X faulthandler -m trl_clinic.course.child`` (or a launcher such as torchrun
around it), hands it the resolved run and a spec, and reads back what the function returned, or how
the process died. The child never resolves the profile again: it gets the parent's device,
precision and sizes, and a CPU run's children do not see the GPUs at all. ``forked`` does the same from
a ``ForkServer`` that imported the libraries once (a trial then skips Python's start-up), and
``run_child(..., shell=True)`` starts a script from bash, as a user does, to show what the shell says.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import re
import select
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from trl_clinic.course.launch import backend, distributed_args

if TYPE_CHECKING:  # the eras run their scripts through this module, and must import without torch
    from trl_clinic.course.run import Run

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


SHELL_CORE_LIMIT_KB = 1024  # a truncated 1 MB core: enough for the shell to say "(core dumped)", cheap to write


def run_child(
    args: list[str],
    timeout: float = 600,
    cwd: str | Path | None = None,
    faulthandler: bool = True,
    env: dict[str, str] | None = None,
    python: str | None = None,
    shell: bool = False,
) -> Outcome:
    """Run ``python -X faulthandler ARGS`` and say how it ended; never raises for the child's failures.

    ``faulthandler=False`` shows what a plain run leaves behind after a native crash: nothing.
    ``python`` runs another interpreter instead of this one (an era's, ``trl_clinic.course.eras``).
    ``shell=True`` starts it from bash, as a user starts a script at a prompt: bash words a death by a
    signal itself ("Floating point exception (core dumped)") and exits with 128 + the signal's number.
    bash says "(core dumped)" only when the kernel wrote a core file: the core-size limit is set to 1 MB
    (``ulimit -c``, where the machine allows it), and the truncated core files left in ``cwd`` are removed.
    """
    start = time.perf_counter()
    command = [python or sys.executable, *(["-X", "faulthandler"] if faulthandler else []), *args]
    if shell:  # "; exit $?" keeps bash from exec-ing the command: bash itself must see the child die
        command = ["bash", "-c", f'ulimit -c {SHELL_CORE_LIMIT_KB} 2>/dev/null; "$@"; exit $?', "bash", *command]
    folder = Path(cwd or ".")
    cores_before = set(folder.glob("core*")) if shell else set()
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=timeout, cwd=cwd, env={**os.environ, **(env or {})}
        )
    except subprocess.TimeoutExpired as expired:
        stderr = expired.stderr.decode() if isinstance(expired.stderr, bytes) else (expired.stderr or "")
        return Outcome(
            "timeout",
            None,
            time.perf_counter() - start,
            message=f"still running after {timeout} s",
            stderr=stderr[-4000:],
        )
    finally:
        for core in set(folder.glob("core*")) - cores_before if shell else ():
            core.unlink(missing_ok=True)
    seconds = time.perf_counter() - start
    # bash ends its line on a death with the command's text, here the wrapper's "$@": not the user's words
    stderr = done.stderr.replace(' "$@"', "") if shell else done.stderr
    if shell and done.returncode > 128:  # bash's words for the signal are its last line
        last = stderr.strip().splitlines()[-1]  # after a progress bar's line, if one was drawn last
        return Outcome(
            "signal",
            done.returncode,
            seconds,
            signal=signal.Signals(done.returncode - 128).name,
            message=last[last.find("bash:") :].strip(),
            stderr=stderr[-4000:],
        )
    return _outcome(done.returncode, seconds, stderr)


def _outcome(returncode: int, seconds: float, stderr: str) -> Outcome:
    """How a child ended, from its exit code (negative: the signal that killed it) and its stderr."""
    tail = stderr[-4000:]
    if returncode == 0:
        return Outcome("finished", 0, seconds, stderr=tail)
    if returncode < 0:
        name = signal.Signals(-returncode).name
        # searched in the whole stderr: with many threads, faulthandler's first line is beyond the kept tail
        fatal = next((line for line in stderr.splitlines() if line.startswith("Fatal Python error")), "no message")
        return Outcome("signal", returncode, seconds, signal=name, message=fatal, stderr=tail)
    lines = [line for line in stderr.splitlines() if _EXCEPTION_LINE.match(line)]
    return Outcome("exception", returncode, seconds, message=lines[-1] if lines else tail.strip()[-300:], stderr=tail)


def child_env(run: Run) -> dict[str, str]:
    """A CPU run's children see no GPU: accelerate would otherwise put its barrier tensors on cuda:RANK."""
    return {"CUDA_VISIBLE_DEVICES": ""} if run.device.type == "cpu" else {}


def placed(run: Run, processes: int) -> Run:
    """The run as ``processes`` processes really execute it.

    With one GPU per process they run on the GPUs over NCCL, as the profile says. With fewer GPUs than
    processes (one GPU, two processes) they run on the CPU over gloo, in fp32 with sdpa: two ranks
    cannot share one GPU through NCCL, and a rank that sees the GPU asks for ``cuda:RANK`` in
    accelerate's barrier (seen on an H100 with one GPU). ``placement(run)`` says which, for the notebook.
    """
    import torch

    if processes < 2 or run.device.type == "cpu" or backend(processes, cpu=False) == "nccl":
        return run
    return replace(run, device=torch.device("cpu"), precision="fp32", attention="sdpa")


def placement(run: Run, processes: int) -> str:
    """One line a learner reads: where the processes of a multi-process call run, and why."""
    where = placed(run, processes)
    if where.device.type != "cpu":
        return f"{processes} processes, one GPU each, over nccl"
    why = "the cpu profile" if run.device.type == "cpu" else "fewer GPUs than processes, so not the GPU"
    return f"{processes} CPU processes over {backend(processes, cpu=True)}, fp32 ({why})"


def _write_spec(run: Run, target: str, spec: dict | None, name: str) -> tuple[Path, Path]:
    """The job a child reads (``run.output_dir/child_NAME.json``) and where its result will be, cleared first."""
    spec_path = run.output_dir / f"child_{name}.json"
    result_path = spec_path.with_suffix(RESULT_SUFFIX)
    result_path.unlink(missing_ok=True)
    spec_path.write_text(
        json.dumps({"target": target, "run": run.to_spec(), "spec": spec or {}, "result": str(result_path)})
    )
    return spec_path, result_path


def _collect(outcome: Outcome, result_path: Path) -> ChildRun:
    """The child's outcome, with its result when it finished and wrote one."""
    if outcome.crashed or not result_path.exists():
        return ChildRun(outcome)
    import torch

    return ChildRun(outcome, torch.load(result_path, weights_only=False))


def call(
    run: Run,
    target: str,
    spec: dict | None = None,
    *,
    name: str,
    timeout: float = 600,
    processes: int = 1,
    faulthandler: bool = True,
) -> ChildRun:
    """Run ``target`` ("package.module:function" or "path/to/file.py:function") as ``function(run, spec)``
    in a child process and return its outcome and result.

    ``processes > 1`` starts it on that many processes with ``launch.distributed_args`` (the result is
    the main process's), placed as ``placed`` says: on the CPU when there are fewer GPUs than processes.
    ``name`` names the files written to ``run.output_dir``: the spec and the result.
    """
    run = placed(run, processes)
    spec_path, result_path = _write_spec(run, target, spec, name)
    args = ["-m", __name__, str(spec_path)]
    if processes > 1:
        args = distributed_args(args, processes=processes, cpu=run.device.type == "cpu")
    return _collect(run_child(args, timeout=timeout, faulthandler=faulthandler, env=child_env(run)), result_path)


class ForkServer:
    """A Python process that imports ``preload`` once, then forks one child per job and reports how it ended.

    A trial that may crash natively needs a process of its own; started fresh, each pays the seconds
    Python takes to import torch, transformers and TRL. Forked from this server it pays only its own
    work, and a native crash still kills only that child. The server imports modules and never touches
    a GPU, so each child may start CUDA (CUDA cannot be used in a child forked after it started).
    """

    def __init__(self, preload: tuple[str, ...]) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", __name__, "--fork-server", *preload],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        if self.process.stdout.readline().strip() != "ready":
            raise RuntimeError(f"the fork server did not start (importing {', '.join(preload)})")

    def run(self, spec_path: Path, log_path: Path, env: dict[str, str], timeout: float) -> int | None:
        """Fork a child that runs ``_main(spec_path)``; its exit code (negative: the signal), None on timeout."""
        self.process.stdin.write(json.dumps({"spec": str(spec_path), "log": str(log_path), "env": env}) + "\n")
        self.process.stdin.flush()
        pid = json.loads(self.process.stdout.readline())["pid"]
        ready, _, _ = select.select([self.process.stdout], [], [], timeout)
        if not ready:
            os.kill(pid, signal.SIGKILL)
        returncode = json.loads(self.process.stdout.readline())["returncode"]
        return returncode if ready else None


_SERVERS: dict[tuple[str, ...], ForkServer] = {}


def forked(
    run: Run, target: str, spec: dict | None = None, *, name: str, timeout: float = 600, preload: tuple[str, ...] = ()
) -> ChildRun:
    """``call``, but the child is forked from a ``ForkServer`` that imported ``preload`` once (started at the
    first call with that list, kept for the next). The child's output and faulthandler's stack go to
    ``run.output_dir/child_NAME.log``, read back into the outcome."""
    server = _SERVERS.get(preload)
    if server is None or server.process.poll() is not None:
        server = _SERVERS[preload] = ForkServer(preload)
    spec_path, result_path = _write_spec(run, target, spec, name)
    log_path = spec_path.with_suffix(".log")
    start = time.perf_counter()
    returncode = server.run(spec_path, log_path, child_env(run), timeout)
    seconds, log = time.perf_counter() - start, log_path.read_text()
    if returncode is None:
        return ChildRun(
            Outcome("timeout", None, seconds, message=f"still running after {timeout} s", stderr=log[-4000:])
        )
    return _collect(_outcome(returncode, seconds, log), result_path)


def _serve(preload: list[str]) -> None:
    """The fork server: import ``preload``, then one JSON job a line on stdin; for each, the child's pid, then
    its exit code."""
    for module in preload:
        importlib.import_module(module)
    print("ready", flush=True)
    try:
        _serve_jobs()
    except KeyboardInterrupt:  # a notebook's kernel shutting down interrupts its process group: just leave
        pass


def _serve_jobs() -> None:
    import faulthandler
    import traceback

    for line in sys.stdin:
        job = json.loads(line)
        pid = os.fork()
        if pid == 0:  # the child: its output to the job's log, then the job
            code = 1
            try:
                log = os.open(job["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
                os.dup2(log, 1)
                os.dup2(log, 2)
                faulthandler.enable(all_threads=True)  # on fd 2: the log
                os.environ.update(job["env"])
                _main(job["spec"])
                code = 0
            except BaseException:  # noqa: BLE001 - reported in the log, as an uncaught error is
                traceback.print_exc()
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        print(json.dumps({"pid": pid}), flush=True)
        _, status = os.waitpid(pid, 0)
        print(json.dumps({"returncode": os.waitstatus_to_exitcode(status)}), flush=True)


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
    import torch  # not at the top: the eras import this module, without torch

    from trl_clinic.course.run import Run

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
    if sys.argv[1] == "--fork-server":
        _serve(sys.argv[2:])
    else:
        _main(sys.argv[1])
