"""The processes of a run as its trainer sees them, and the only collectives the library makes.

Under ``torchrun`` or ``accelerate launch`` every process runs the same script: the check-up and the watch run
on each, and must agree (one table, one verdict, one stop at the same step, one exit code) without a process ever
waiting alone in a collective. The trainer's own view decides how many processes there are (``args.world_size``,
``args.process_index``), not ``torch.distributed``'s: a CPU run launched on two processes without
``use_cpu=True`` gets accelerate's ``DistributedType.NO`` in each (accelerate 1.15 ``PartialState``), two
independent runs although ``torch.distributed`` is initialised with both, and a collective across them would
pair calls that do not belong together. Objects travel with ``torch.distributed.all_gather_object``, numbers with
one ``all_gather`` of a float64 vector on the trainer's device (NCCL needs CUDA tensors).

``leave_together``: how a command that ran under a launcher ends, every process with the same exit code at the
same moment (see its docstring for why a process that returns alone is killed by the launcher).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NoReturn

import torch


@dataclass(frozen=True)
class Processes:
    count: int  # processes the trainer trains on
    index: int  # this process's index among them (0: the main process)
    device: torch.device  # where this process's collectives run (the trainer's device: NCCL needs CUDA)

    @classmethod
    def of(cls, args) -> Processes:
        """The processes ``args`` (a ``TrainingArguments``) trains on."""
        count = int(getattr(args, "world_size", 1) or 1)
        index = int(getattr(args, "process_index", 0) or 0)
        return cls(count, index, getattr(args, "device", torch.device("cpu")))

    @property
    def several(self) -> bool:
        """More than one process, joined by an initialised default process group."""
        return self.count > 1 and torch.distributed.is_available() and torch.distributed.is_initialized()

    @property
    def main(self) -> bool:
        return self.index == 0

    def gather(self, value: object) -> list[object]:
        """Every process's ``value``, in process order (a collective: every process must call it)."""
        if not self.several:
            return [value]
        gathered: list[object] = [None] * self.count
        torch.distributed.all_gather_object(gathered, value)
        return gathered

    def table(self, values: Sequence[float | torch.Tensor]) -> list[list[float]]:
        """Every process's ``values`` (the same number of them on each: floats or 0-d tensors), in process order: one
        ``all_gather`` of a float64 vector and one copy to the host (a collective: every process must call it)."""
        row = torch.stack([torch.as_tensor(v, dtype=torch.float64).to(self.device).reshape(()) for v in values])
        if not self.several:
            return [row.tolist()]
        rows = [torch.empty_like(row) for _ in range(self.count)]
        torch.distributed.all_gather(rows, row)
        return torch.stack(rows).tolist()

    def any(self, flag: bool) -> bool:
        """Whether ``flag`` is true on some process (one integer all-reduce; a collective)."""
        if not self.several:
            return flag
        value = torch.tensor([int(flag)], device=self.device)
        torch.distributed.all_reduce(value, op=torch.distributed.ReduceOp.MAX)
        return bool(value.item())


def _collective_device() -> torch.device:
    """The device the default group's collectives take tensors on: NCCL's are CUDA tensors, gloo's CPU ones."""
    if "nccl" in str(torch.distributed.get_backend()).lower():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def agreed_code(code: int, token: int = 0) -> tuple[int, int]:
    """The highest exit code of every process and the highest ``token`` (one all-reduce of both): a fail on any
    process fails every one."""
    value = torch.tensor([int(code), int(token)], dtype=torch.int64, device=_collective_device())
    torch.distributed.all_reduce(value, op=torch.distributed.ReduceOp.MAX)
    agreed, shared = value.tolist()
    return int(agreed), int(shared)


def leave_together(code: int) -> NoReturn:
    """End this process with the exit code every process agrees on, when every process gets here, and as one.

    A launcher ends a run when one worker ends badly: torch 2.13 ``torch/distributed/elastic/multiprocessing/api.py``
    ``SubprocessContext._poll`` checks each worker's exit every ``--monitor-interval`` (0.1 s) and, as soon as one has
    exited non-zero, ``close()`` sends SIGTERM to every worker still running ("Sending process ... closing signal
    SIGTERM"), which then ends by that signal; ``accelerate launch --multi_gpu`` runs the same agent (accelerate
    1.15.0 ``commands/launch.py`` ``multi_gpu_launcher`` calls ``torch.distributed.run.run``). So the processes must
    end within one poll of each other, or the launcher's poll falls between two ends with the probability of their
    gap over 0.1 s. A command that returned its code on each process alone ended them hundreds of milliseconds apart
    (the main process still wrote its summary, TRL's script saved the model on it; 12 of 16 launches were signalled
    here), and even after a barrier the end of a process that holds torch is slow and uneven: the kernel took 115 ms
    from ``os._exit`` to a reapable exit for a process that had imported torch, transformers and TRL, 200 ms with
    500 MB of tensors besides (measured here under load), which left 1 launch in 9 signalled.

    So: agree on the code (the highest: one all-reduce, which also carries the main process's name for the exit
    gate), say it, run what the interpreter runs at exit (``atexit``: logging's flush, a tracker's finish) while
    every process is still here, destroy the process group (no gloo or NCCL thread is left behind), flush, and on
    Linux replace this process by a bare Python (``os.execv``: the heavy image is torn down there, before the gate)
    that counts itself in at a gate file every local process of the launch shares and ends with the code as soon as
    all are in: what is left between the gate and the ends is a few system calls. A process the launcher signals
    all the same ends with the agreed code (the gate's SIGTERM handler), not by the signal. Elsewhere, or without
    ``LOCAL_WORLD_SIZE`` (set by torchrun and accelerate launch), the processes meet at a barrier before the group
    is destroyed and end with ``os._exit``.
    """
    import atexit
    import secrets
    import tempfile

    rank, count = torch.distributed.get_rank(), torch.distributed.get_world_size()
    agreed, token = agreed_code(code, secrets.randbits(62) if rank == 0 else 0)
    print(f"trl-clinic: process {rank} of {count} exits with {agreed}", file=sys.stderr, flush=True)
    atexit._run_exitfuncs()
    local = int(os.environ.get("LOCAL_WORLD_SIZE", "0") or 0)
    gate = sys.platform == "linux" and local >= 1
    if not gate:
        torch.distributed.barrier()
    torch.distributed.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    if gate:
        path = os.path.join(tempfile.gettempdir(), f"trl-clinic-exit-{token:x}")
        os.execv(sys.executable, [sys.executable, "-S", "-E", "-c", GATE, path, str(local), str(agreed)])
    os._exit(agreed)


# The bare Python a process becomes to leave (``leave_together``): argv is the gate file, the local processes, the
# code. Each appends one byte to the gate and ends once the file holds one from every local process; the first to see
# that removes the file (the others read the size through their open descriptor). Sixty seconds at most.
GATE = """
import os, signal, sys, time
path, local, code = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
signal.signal(signal.SIGTERM, lambda *_: os._exit(code))
gate = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
os.write(gate, b"x")
deadline = time.monotonic() + 60
while os.fstat(gate).st_size < local and time.monotonic() < deadline:
    time.sleep(0.0001)
try:
    os.unlink(path)
except OSError:
    pass
os._exit(code)
"""


# weights read per trainable tensor by ``fingerprint``: every one is read when a tensor holds fewer
SAMPLED = 256


def fingerprint(tensors: Sequence[torch.Tensor]) -> float:
    """A float64 sum of at most ``SAMPLED`` evenly strided entries of each tensor: equal on processes whose tensors
    are equal, bit for bit (the same entries, summed in the same order, in the same dtype), and different where
    the entries read differ. A few hundred reads a tensor (under a millisecond for a 135M-parameter model's 272
    tensors) and one host sync, so it can be taken at any step."""
    total = None
    for tensor in tensors:
        flat = tensor.detach().reshape(-1)
        if flat.numel() == 0:
            continue
        part = flat[:: max(1, flat.numel() // SAMPLED)][:SAMPLED].sum(dtype=torch.float64)
        total = part if total is None else total + part.to(total.device)
    return 0.0 if total is None else float(total)
