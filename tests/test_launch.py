import socket

from trl_clinic.launch import distributed_args, free_port


def test_free_port_can_be_bound():
    port = free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))


def test_cpu_machines_use_torchrun_with_gloo():
    args, backend = distributed_args("train.py", ["spec.json"], processes=2)
    assert backend == "gloo"
    assert args[:4] == ["-m", "torch.distributed.run", "--nproc_per_node", "2"]
    assert args[-2:] == ["train.py", "spec.json"]


def test_multi_gpu_machines_use_accelerate_launch(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    args, backend = distributed_args("train.py", [], processes=2)
    assert backend == "nccl" and args[:3] == ["-m", "accelerate.commands.launch", "--multi_gpu"]
