"""The processes of a run as its trainer sees them, and the only collectives the library makes.

Under ``torchrun`` or ``accelerate launch`` every process runs the same script: the check-up and the watch run
on each, and must agree (one table, one verdict, one stop at the same step) without a process ever waiting
alone in a collective. The trainer's own view decides how many processes there are (``args.world_size``,
``args.process_index``), not ``torch.distributed``'s: a CPU run launched on two processes without
``use_cpu=True`` gets accelerate's ``DistributedType.NO`` in each (accelerate 1.15 ``PartialState``), two
independent runs although ``torch.distributed`` is initialised with both, and a collective across them would
pair calls that do not belong together. Objects travel with ``torch.distributed.all_gather_object``, one flag
with one integer all-reduce on the trainer's device.
"""

from __future__ import annotations

from dataclasses import dataclass

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

    def any(self, flag: bool) -> bool:
        """Whether ``flag`` is true on some process (one integer all-reduce; a collective)."""
        if not self.several:
            return flag
        value = torch.tensor([int(flag)], device=self.device)
        torch.distributed.all_reduce(value, op=torch.distributed.ReduceOp.MAX)
        return bool(value.item())
