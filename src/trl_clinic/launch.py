"""Starting a script on several processes, the way users launch multi-device training."""

from __future__ import annotations

import socket
import torch


def free_port() -> int:
    """A TCP port nobody listens on now, for the processes' rendezvous on this machine."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def distributed_args(script: str, script_args: list[str], processes: int = 2) -> tuple[list[str], str]:
    """Python arguments that start ``script`` on ``processes`` processes, and the backend they will use.

    With that many GPUs: ``accelerate launch --multi_gpu`` (NCCL). Otherwise CPU processes talking
    over gloo, started with torchrun (``torch.distributed.run``), the launcher accelerate itself uses:
    accelerate 1.15's ``launch`` starts multi-CPU jobs only through MPI. Inside, the Trainer's
    accelerate sees the distributed environment either way.
    """
    if torch.cuda.is_available() and torch.cuda.device_count() >= processes:
        return (["-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", str(processes),
                 "--main_process_port", str(free_port()), "--mixed_precision", "no", script, *script_args], "nccl")
    return (["-m", "torch.distributed.run", "--nproc_per_node", str(processes), "--master_addr", "127.0.0.1",
             "--master_port", str(free_port()), script, *script_args], "gloo")
