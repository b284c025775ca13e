"""The machine as the lessons see it: precision flags TRL accepts there, attention kernels, threads,
seeds, progress bars, versions."""

from __future__ import annotations

import gc
import importlib.metadata
import logging
import os
import platform
import random
import textwrap
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch is imported where it is used: the runner reads PROGRESS_ENV without it
    import torch

LIBRARIES = ("torch", "transformers", "trl", "peft", "accelerate", "datasets")
# transformers' names, best first; each needs its own package (flash-attn, flash-attn-3, flash-attn-4)
FLASH_ATTENTION = ("flash_attention_4", "flash_attention_3", "flash_attention_2")
# `trl-clinic run` sets it to 0: executed notebooks stay free of progress bars
PROGRESS_ENV = "TRL_CLINIC_PROGRESS"


def bf16_supported(device: torch.device) -> bool:
    import torch

    return device.type == "cuda" and torch.cuda.is_bf16_supported()


def precision_flags(device: torch.device, precision: str) -> dict[str, bool]:
    """Mixed-precision arguments for a TRL config: ``precision`` ("bf16" or "fp32") on ``device``.

    TRL configs default to ``bf16=True``, which raises on a machine without a GPU, so every lesson
    passes these instead of relying on the default (fp16 autocast would need a loss scaler and
    changes what some lessons measure). On the CPU, ``use_cpu=True`` keeps the trainers off a GPU
    that the machine may have: the cpu profile means the CPU.
    """
    if precision not in ("bf16", "fp32"):
        raise ValueError(f"unknown precision {precision!r}: choose bf16 or fp32")
    return {"bf16": precision == "bf16", "fp16": False, **cpu_flags(device)}


def cpu_flags(device: torch.device) -> dict[str, bool]:
    """``use_cpu=True`` on the CPU: keeps a trainer off a GPU the machine may have (the cpu profile
    means the CPU), and lets a config that sets its own precision pass TRL's bf16 default there."""
    return {"use_cpu": True} if device.type == "cpu" else {}


def best_attention(device: torch.device) -> str:
    """The best FlashAttention kernel transformers can use here, else sdpa (always on CPU)."""
    if device.type != "cuda":
        return "sdpa"
    from transformers.utils import import_utils

    for name in FLASH_ATTENTION:
        if getattr(import_utils, f"is_flash_attn_{name[-1]}_available")():
            return name
    return "sdpa"


def show_progress() -> bool:
    """Progress bars for learners in JupyterLab; none in notebooks executed by ``trl-clinic run``."""
    return os.environ.get(PROGRESS_ENV, "1") != "0"


def progress(iterable, description: str, total: int | None = None):
    """One bar for a sweep of runs, saying what it does; silent where ``show_progress()`` is False."""
    from tqdm.auto import tqdm

    return tqdm(iterable, desc=description, total=total, disable=not show_progress(), leave=False)


def checkpointing_flag() -> str:
    """The name this transformers version gives the activation (gradient) checkpointing switch.

    transformers 5.23 renamed ``gradient_checkpointing`` to ``activation_checkpointing`` and warns on
    the old name; older 5.x releases (the GPU machines' 5.17) know only the old one.
    """
    from transformers import TrainingArguments

    if "activation_checkpointing" in TrainingArguments.__dataclass_fields__:
        return "activation_checkpointing"
    return "gradient_checkpointing"


def no_activation_checkpointing() -> dict[str, bool]:
    """Turn off TRL's default checkpointing (it only slows the small models here), under ``checkpointing_flag()``."""
    return {checkpointing_flag(): False}


class FoldedOnce(logging.Formatter):
    """A library warning on a learner's screen once and at most ``WIDTH`` characters wide: transformers' generation
    warns "right-padding was detected" (187 characters) on every right-padded ``generate()`` call (transformers
    5.23.0 ``generation/utils.py``), and a lesson that measures that call three times would show it three times.

    One object is both the handler's filter (the same message again is dropped) and its formatter (the first one is
    folded and says that repeats are hidden): the folding happens in the text this handler writes, never in the
    record, which every other handler of the logger (a test's log capture, an experiment tracker) reads as logged."""

    WIDTH = 120

    def __init__(self) -> None:
        super().__init__()
        self.seen: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if message in self.seen:
            return False
        self.seen.add(message)
        return True

    def format(self, record: logging.LogRecord) -> str:
        return textwrap.fill(
            f"{super().format(record)} (shown once; repeats hidden)", self.WIDTH - 20, subsequent_indent="    "
        )

    def install(self, handler: logging.Handler) -> None:
        handler.addFilter(self)
        handler.setFormatter(self)


def quiet_library_noise() -> None:
    """Dataset preprocessing and weight loading/saving bars repeat for every trainer and checkpoint a
    lesson builds and bury its output; training bars (Trainer's own tqdm) stay. TRL and peft still read
    ``is_gradient_checkpointing``, which transformers 5 deprecates with a FutureWarning a learner can do
    nothing about.

    Without progress bars (a notebook run by ``trl-clinic run``), ``Trainer`` prints every log row as a dict of
    200-300 characters instead (``PrinterCallback``, added when ``disable_tqdm``: transformers 5.23.0
    ``trainer.py``); a lesson prints the rows that are its symptom itself, so those dicts are left out (in
    JupyterLab, with bars, the Trainer shows its rows as one compact table). Only the lesson's own process
    (``run.prepare``) is changed, never the library's users."""
    import warnings

    import datasets
    import transformers.trainer
    from transformers.utils import logging as transformers_logging

    datasets.disable_progress_bars()
    transformers_logging.disable_progress_bar()
    transformers_logging.get_logger()  # configures transformers' own stderr handler on its root logger
    for handler in transformers_logging._get_library_root_logger().handlers:
        if not isinstance(handler.formatter, FoldedOnce):  # once per process, however many runs
            FoldedOnce().install(handler)
    trl = logging.getLogger("trl")  # TRL's warnings reach stderr through Python's last-resort handler, unfolded
    if not any(isinstance(handler.formatter, FoldedOnce) for handler in trl.handlers):
        handler = logging.StreamHandler()
        FoldedOnce().install(handler)
        trl.addHandler(handler)
        trl.propagate = False
    warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning)
    if not show_progress():  # the base class does nothing at any event: rows stay in state.log_history
        transformers.trainer.PrinterCallback = transformers.trainer.TrainerCallback


def freeze_what_is_loaded() -> None:
    """Move every object alive now (the libraries' modules, above all) out of the garbage collector's
    reach. Each ``Trainer.train`` calls accelerate's ``free_memory`` (transformers 5.23.0 ``trainer.py``),
    whose ``release_memory`` runs ``gc.collect()`` over all tracked objects (accelerate 1.15.0
    ``utils/memory.py``): about 0.25 s per trainer after importing TRL, 13 s of lesson 01's 103 (cProfile,
    50 trainers). Frozen objects are never collected, so the garbage of earlier runs is collected first."""
    gc.collect()
    gc.freeze()


def set_threads(n: int | None) -> None:
    import torch

    if n is not None:
        torch.set_num_threads(n)


def seed_everything(seed: int) -> None:
    """Seed every generator a lesson touches, so two runs that should be identical are."""
    import numpy as np
    import torch

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
    import torch

    report: dict[str, object] = {"device": device.type, "torch_threads": torch.get_num_threads()}
    if device.type == "cuda":
        report["gpu"] = torch.cuda.get_device_name(device)
        report["bf16_supported"] = bf16_supported(device)
    else:
        report["cpu"] = platform.processor() or platform.machine()
        report["cpu_count"] = os.cpu_count()
    report["hf_hub_offline"] = os.environ.get("HF_HUB_OFFLINE", "0")
    return report


def reset_peak_memory(device: torch.device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_memory_mib(device: torch.device) -> float | None:
    """Peak GPU memory since the last reset; None on the CPU, where torch does not track it."""
    import torch

    return torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else None
