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


def agreed_code(code: int) -> int:
    """The highest exit code of every process (one integer all-reduce): a fail on any process fails every one."""
    value = torch.tensor([int(code)], device=_collective_device())
    torch.distributed.all_reduce(value, op=torch.distributed.ReduceOp.MAX)
    return int(value.item())


def leave_together(code: int) -> NoReturn:
    """End this process with the exit code every process agrees on, when every process gets here, and as one.

    A launcher ends a run when one worker ends badly: torch 2.13 ``torch/distributed/elastic/multiprocessing/api.py``
    ``SubprocessContext._poll`` checks each worker's exit every ``--monitor-interval`` (0.1 s) and, as soon as one has
    exited non-zero, ``close()`` sends SIGTERM to every worker still running ("Sending process ... closing signal
    SIGTERM"), which then ends by that signal; ``accelerate launch --multi_gpu`` runs the same agent (accelerate
    1.15.0 ``commands/launch.py`` ``multi_gpu_launcher`` calls ``torch.distributed.run.run``). A command that
    returns its exit code on each process alone loses that race whenever the processes end more than a poll apart:
    the main process still writes its summary and TRL's script saves the model on it, and the interpreter's own
    teardown (freeing torch, transformers, the trainer) takes a different time on each.

    So: agree on the code (the highest), run what the interpreter runs at exit (``atexit``: logging's flush, a
    tracker's finish) while every process is still here, meet at a barrier, destroy the process group, and end
    at once with ``os._exit``: after the barrier no process does work whose length differs from the others', and
    no gloo or NCCL thread is left for the interpreter's teardown to destroy. Every process prints its code (on
    stderr) first."""
    import atexit

    agreed = agreed_code(code)
    rank, count = torch.distributed.get_rank(), torch.distributed.get_world_size()
    print(f"trl-clinic: process {rank} of {count} exits with {agreed}", file=sys.stderr, flush=True)
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()
    os._exit(agreed)


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
