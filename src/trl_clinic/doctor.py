"""The environment as the lessons see it, with warnings for the traps they teach."""

from __future__ import annotations

import os

import torch

from trl_clinic.runtime import bf16_supported, detect_device, versions


def attention_report() -> dict[str, str]:
    """Which attention kernels a freshly built model really gets (read from the built model)."""
    from transformers.utils import is_flash_attn_2_available

    from trl_clinic.models import attention_implementation, make_causal_lm
    from trl_clinic.tokenizer import build_tokenizer

    tokenizer = build_tokenizer()
    report = {}
    for wanted in ("sdpa", "eager", "flash_attention_2"):
        if wanted == "flash_attention_2" and not is_flash_attn_2_available():
            report[wanted] = "not available (flash-attn not installed or no CUDA)"
            continue
        try:
            dtype = torch.bfloat16 if wanted == "flash_attention_2" else torch.float32
            model = make_causal_lm(tokenizer, attn_implementation=wanted, dtype=dtype)
            report[wanted] = f"built model uses {attention_implementation(model)}"
        except (ImportError, ValueError) as error:
            report[wanted] = f"refused: {str(error).splitlines()[0][:120]}"
    return report


def warnings_for(device: torch.device) -> list[str]:
    """The traps from the lessons that apply to this machine and these versions."""
    from trl import SFTConfig
    from transformers import TrainingArguments

    notes = []
    if device.type != "cuda":
        notes.append("no GPU: TRL configs default to bf16=True and raise here; pass bf16=False or use_cpu=True "
                     "(trl_clinic.runtime.precision_flags does)")
    elif not bf16_supported(device):
        notes.append("this GPU has no bf16: TRL's default bf16=True fails; use fp32 or fp16 with a loss scaler")
    default_optim = str(TrainingArguments.__dataclass_fields__["optim"].default)
    if "fused" in default_optim:
        notes.append(f"the default optimizer is {default_optim}: it computes in fp32 and hides the fp16 Adam "
                     "underflow of lesson 03 (optim='adamw_torch' shows it)")
    if SFTConfig.__dataclass_fields__["gradient_checkpointing"].default:
        notes.append("TRL turns gradient checkpointing on by default: it slows small models; turn it off on CPU")
    notes.append("padding_free=True needs an attention kernel that sees sequence boundaries: FlashAttention varlen, "
                 "or sdpa/eager on families whose mask uses position_ids (lesson 01: check with packed_vs_separate)")
    if os.environ.get("HF_HUB_OFFLINE") != "1":
        notes.append("HF_HUB_OFFLINE is not 1: the lessons never download, but other code might")
    return notes


def doctor() -> str:
    device = detect_device()
    lines = ["versions:"] + [f"  {name}: {version}" for name, version in versions().items()]
    name = f" ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else ""
    lines += ["device:", f"  {device.type}{name}",
              f"  bf16 supported: {bf16_supported(device)}", f"  torch threads: {torch.get_num_threads()}",
              f"  CPU cores: {os.cpu_count()}", f"  HF_HUB_OFFLINE: {os.environ.get('HF_HUB_OFFLINE', 'not set')}"]
    lines += ["attention implementations:"] + [f"  {k}: {v}" for k, v in attention_report().items()]
    lines += ["warnings:"] + [f"  - {note}" for note in warnings_for(device)]
    return "\n".join(lines)
