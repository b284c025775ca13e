"""The machine as the lessons see it: device, precision flags TRL accepts there, threads, seeds, versions."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import random

import numpy as np
import torch

LIBRARIES = ("torch", "transformers", "trl", "peft", "accelerate", "datasets")


def detect_device() -> torch.device:
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


def bf16_supported(device: torch.device) -> bool:
    return device.type == "cuda" and torch.cuda.is_bf16_supported()


def precision_flags(device: torch.device) -> dict[str, bool]:
    """Mixed-precision arguments for a TRL config on ``device``.

    TRL configs default to ``bf16=True``, which raises on a machine without a GPU, so every lesson
    passes these instead of relying on the default: bf16 autocast where the GPU supports it, fp32
    elsewhere (fp16 autocast would need a loss scaler and changes what some lessons measure).
    """
    if device.type == "cuda":
        return {"bf16": bf16_supported(device), "fp16": False}
    return {"bf16": False, "fp16": False, "use_cpu": True}


def no_activation_checkpointing() -> dict[str, bool]:
    """Turn off TRL's default checkpointing under the name this transformers version uses.

    transformers 5.23 renamed ``gradient_checkpointing`` to ``activation_checkpointing`` and warns on
    the old name; older 5.x releases (the GPU machines' 5.17) know only the old one.
    """
    from transformers import TrainingArguments

    if "activation_checkpointing" in TrainingArguments.__dataclass_fields__:
        return {"activation_checkpointing": False}
    return {"gradient_checkpointing": False}


def quiet_progress_bars() -> None:
    """Dataset preprocessing bars repeat for every trainer a lesson builds and bury its output."""
    import datasets

    datasets.disable_progress_bars()


def set_threads(n: int | None) -> None:
    if n is not None:
        torch.set_num_threads(n)


def seed_everything(seed: int) -> None:
    """Seed every generator a lesson touches, so two runs that should be identical are."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.cuda.manual_seed_all(seed)


def versions() -> dict[str, str]:
    found = {}
    for name in LIBRARIES:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = "not installed"
    found["python"] = platform.python_version()
    return found


def device_report(device: torch.device) -> dict[str, object]:
    report: dict[str, object] = {"device": device.type, "torch_threads": torch.get_num_threads()}
    if device.type == "cuda":
        report["gpu"] = torch.cuda.get_device_name(device)
        report["bf16_supported"] = bf16_supported(device)
    else:
        report["cpu"] = platform.processor() or platform.machine()
        report["cpu_count"] = os.cpu_count()
    report["hf_hub_offline"] = os.environ.get("HF_HUB_OFFLINE", "0")
    return report
