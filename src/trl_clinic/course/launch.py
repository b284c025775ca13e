"""Starting a script on several processes, the way users launch multi-device training."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A TCP port nobody listens on now, for the processes' rendezvous on this machine."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def backend(processes: int, cpu: bool) -> str:
    """ "nccl" when the run is on GPUs and there is one GPU per process, else "gloo" (CPU processes)."""
    import torch

    if not cpu and torch.cuda.is_available() and torch.cuda.device_count() >= processes:
        return "nccl"
    return "gloo"


def distributed_args(python_args: list[str], processes: int = 2, cpu: bool = False) -> list[str]:
    """Python arguments that start ``python_args`` (a script or ``-m module`` and its arguments) on
    ``processes`` processes.

    With one GPU per process: ``accelerate launch --multi_gpu`` (NCCL). Otherwise CPU processes
    talking over gloo, started with torchrun (``torch.distributed.run``), which ``accelerate launch
    --multi_gpu`` itself calls (accelerate 1.15.0 ``commands/launch.py``, ``multi_gpu_launcher``);
    ``accelerate launch --cpu`` starts one process, or several only through ``mpirun`` with
    ``--mpirun_hostfile`` (``utils/launch.py``, ``prepare_simple_launcher_cmd_env``). Inside, the
    Trainer's accelerate sees the distributed environment either way (on CPU, ``MULTI_CPU`` over
    gloo: ``state.py``, ``PartialState._prepare_backend``).
    """
    if backend(processes, cpu) == "nccl":
        return [
            "-m",
            "accelerate.commands.launch",
            "--multi_gpu",
            "--num_processes",
            str(processes),
            "--main_process_port",
            str(free_port()),
            "--mixed_precision",
            "no",
            *python_args,
        ]
    return [
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        str(processes),
        "--master_addr",
        "127.0.0.1",
        "--master_port",
        str(free_port()),
        *python_args,
    ]
