"""The environment as the lessons see it, with warnings for the traps they teach."""

from __future__ import annotations

import os

import torch

from trl_clinic.course.runtime import FLASH_ATTENTION, best_attention, bf16_supported, versions

PACKAGES = {"flash_attention_2": "flash-attn", "flash_attention_3": "flash-attn-3", "flash_attention_4": "flash-attn-4"}


def attention_report(device: torch.device) -> dict[str, str]:
    """Which attention kernels a freshly built model really gets (read from the built model)."""
    from transformers.utils import import_utils

    from trl_clinic.course.models import attention_implementation, make_causal_lm
    from trl_clinic.course.tokenizer import build_tokenizer

    tokenizer = build_tokenizer()
    report = {}
    for wanted in ("sdpa", "eager", *FLASH_ATTENTION):
        if wanted in FLASH_ATTENTION and not getattr(import_utils, f"is_flash_attn_{wanted[-1]}_available")():
            report[wanted] = f"not available ({PACKAGES[wanted]} not installed or no CUDA)"
            continue
        try:
            dtype = torch.bfloat16 if wanted in FLASH_ATTENTION else torch.float32
            model = make_causal_lm(tokenizer, attn_implementation=wanted, dtype=dtype).to(device)
            report[wanted] = f"built model uses {attention_implementation(model)}"
        except (ImportError, ValueError) as error:
            report[wanted] = f"refused: {str(error).splitlines()[0][:120]}"
    return report


def warnings_for(device: torch.device) -> list[str]:
    """The traps from the lessons that apply to this machine and these versions."""
    from transformers import TrainingArguments
    from trl import SFTConfig

    notes = []
    if device.type != "cuda":
        notes.append(
            "no GPU: TRL configs default to bf16=True and raise here; pass bf16=False or use_cpu=True "
            "(trl_clinic.course.runtime.precision_flags does)"
        )
    elif not bf16_supported(device):
        notes.append("this GPU has no bf16: TRL's default bf16=True fails; use fp32 or fp16 with a loss scaler")
    default_optim = str(TrainingArguments.__dataclass_fields__["optim"].default)
    if "fused" in default_optim:
        notes.append(
            f"the default optimizer is {default_optim}: it computes in fp32 and hides the fp16 Adam "
            "underflow of lesson 03 (optim='adamw_torch' shows it)"
        )
    if SFTConfig.__dataclass_fields__["gradient_checkpointing"].default:
        notes.append("TRL turns gradient checkpointing on by default: it slows small models; turn it off on CPU")
    notes.append(
        "padding_free=True needs an attention kernel that sees sequence boundaries: FlashAttention varlen, "
        "or sdpa/eager on families whose mask uses position_ids (lesson 01: check with packed_vs_separate)"
    )
    if os.environ.get("HF_HUB_OFFLINE") != "1":
        notes.append("HF_HUB_OFFLINE is not 1: the lessons never download, but other code might")
    return notes


def workshop_readiness() -> list[str]:
    """What a facilitator checks on each learner's machine before the day: the eras that the lessons'
    "then" sections run in (missing ones are skipped in the lesson, so say how to build them)."""
    from trl_clinic.course.eras import era_names, era_state

    lines = []
    for name in era_names():
        _, state = era_state(name)
        lines.append(f"  era {name}: {state}")
    if hasattr(os, "getuid") and os.getuid() == 0:
        lines.append("  running as root: `make lab` adds --allow-root, which JupyterLab needs to start")
    return lines or ["  no era files found in the package"]


def doctor() -> str:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    lines = ["versions:"] + [f"  {name}: {version}" for name, version in versions().items()]
    name = f" ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else ""
    lines += [
        "device:",
        f"  {device.type}{name}",
        f"  bf16 supported: {bf16_supported(device)}",
        f"  torch threads: {torch.get_num_threads()}",
        f"  CPU cores: {os.cpu_count()}",
        f"  HF_HUB_OFFLINE: {os.environ.get('HF_HUB_OFFLINE', 'not set')}",
    ]
    lines += ["attention implementations:"] + [f"  {k}: {v}" for k, v in attention_report(device).items()]
    lines.append(
        f"  the gpu profile uses: {best_attention(device)}"
        if device.type == "cuda"
        else "  the cpu profile uses: sdpa (FlashAttention needs a CUDA GPU)"
    )
    from trl_clinic.course.profiles import PROFILE_ENV, resolve_profile

    try:
        lines.append(f"  a notebook left on profile auto runs: {resolve_profile('auto', device.type == 'cuda')}")
    except ValueError as error:  # the room's setting names no profile, or gpu without CUDA
        lines.append(f"  a notebook left on profile auto stops: {error}")
    lines.append(f"  {PROFILE_ENV}: {os.environ.get(PROFILE_ENV) or 'not set (auto follows CUDA)'}")
    lines += ["workshop readiness:"] + workshop_readiness()
    lines += ["warnings:"] + [f"  - {note}" for note in warnings_for(device)]
    return "\n".join(lines)
