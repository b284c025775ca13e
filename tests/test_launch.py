import socket

from trl_clinic.course.launch import backend, distributed_args, free_port


def test_free_port_can_be_bound():
    port = free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))


def test_cpu_machines_use_torchrun_with_gloo(monkeypatch):
    """CUDA mocked away: on a host with two or more GPUs this would otherwise choose NCCL, and test nothing."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    args = distributed_args(["-m", "trl_clinic.course.child", "spec.json"], processes=2)
    assert backend(2, cpu=False) == "gloo"
    assert args[:4] == ["-m", "torch.distributed.run", "--nproc_per_node", "2"]
    assert args[-3:] == ["-m", "trl_clinic.course.child", "spec.json"]


def test_multi_gpu_machines_use_accelerate_launch(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    assert backend(2, cpu=False) == "nccl"
    assert distributed_args(["train.py"], processes=2)[:3] == ["-m", "accelerate.commands.launch", "--multi_gpu"]


def test_one_gpu_or_a_cpu_run_falls_back_to_gloo(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert backend(2, cpu=False) == "gloo"
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    assert backend(2, cpu=True) == "gloo"  # the cpu profile stays on the CPU with GPUs present
