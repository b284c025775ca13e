"""How a run is launched, read from its trainer before ``train()``: how many processes, which engine holds the
weights (DeepSpeed ZeRO, FSDP, DDP, one process), its mixed precision, and whether the optimizer steps float32
master copies of 16-bit trainable weights.

A verdict about a run must read its launch, not only the process it runs in. The same recipe that loads bfloat16
weights stalls its updates under a plain Trainer (AdamW steps the bfloat16 tensors themselves) and trains under
DeepSpeed ZeRO, whose optimizer steps float32 partitions of them (deepspeed 0.19.8
``runtime/zero/stage_1_and_2.py`` ``single_partition_of_fp32_groups``, ``stage3.py`` ``_create_fp32_partitions``;
off only with ``bf16_master_weights_and_grads`` or ``fp16_master_weights_and_grads``, ``runtime/precision_config.py``),
or under accelerate's FSDP with mixed precision, which casts trainable 16-bit parameters to float32 when it prepares
the model (accelerate 1.15.0 ``utils/fsdp_utils.py`` ``fsdp2_prepare_model``: "FSDP upcast of low precision parameters
to fp32"; ``accelerator.py`` ``prepare_model`` for FSDP1). Before ``train()`` none of these engines exists yet: the
trainer's accelerator already holds the plugin and the precision it will use, which is what is read here.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Launch:
    processes: int  # the processes the trainer trains on (args.world_size)
    engine: str  # "deepspeed", "fsdp", "ddp" (several processes, DistributedDataParallel), "unwrapped" or "single"
    mixed_precision: str  # the accelerator's: "no", "bf16", "fp16" (or another accelerate value)
    zero_stage: int | None = None  # DeepSpeed's ZeRO stage
    fsdp_version: int | None = None  # accelerate's FSDP plugin version (1 or 2)
    float32_master: bool = False  # the optimizer steps float32 copies of 16-bit trainable weights

    @property
    def described(self) -> str:
        """In a user's words: "DeepSpeed ZeRO-3, bf16, 8 processes"."""
        name = {
            "deepspeed": f"DeepSpeed ZeRO-{self.zero_stage}",
            "fsdp": f"FSDP{self.fsdp_version or ''}",
            "ddp": "DDP",
            "unwrapped": "no wrapper (accelerate's distributed_type NO)",
            "single": "one process",
        }[self.engine]
        parts = [name] + ([self.mixed_precision] if self.mixed_precision not in ("no", None) else [])
        if self.processes > 1 and self.engine != "single":
            parts.append(f"{self.processes} processes")
        return ", ".join(parts)

    @classmethod
    def of(cls, trainer) -> Launch:
        """The launch ``trainer`` will train under (its arguments and its accelerator, before ``train()``)."""
        args, accelerator = trainer.args, getattr(trainer, "accelerator", None)
        processes = int(getattr(args, "world_size", 1) or 1)
        state = getattr(accelerator, "state", None)
        mixed = str(getattr(accelerator, "mixed_precision", None) or "no")
        enabled = getattr(trainer, "is_deepspeed_enabled", False)
        deepspeed = getattr(state, "deepspeed_plugin", None) if enabled else None
        if deepspeed is not None:
            config = getattr(getattr(deepspeed, "hf_ds_config", None), "config", None) or deepspeed.deepspeed_config
            stage = int((config.get("zero_optimization") or {}).get("stage", 0) or 0)
            half = [config.get(key) or {} for key in ("bf16", "fp16")]
            kept_half = any(
                section.get("enabled") in (True, "auto")
                and (section.get("bf16_master_weights_and_grads") or section.get("fp16_master_weights_and_grads"))
                for section in half
            )
            return cls(processes, "deepspeed", mixed, zero_stage=stage, float32_master=not kept_half)
        fsdp = getattr(state, "fsdp_plugin", None) if getattr(trainer, "is_fsdp_enabled", False) else None
        if fsdp is not None:
            version = int(getattr(fsdp, "fsdp_version", 1) or 1)
            return cls(processes, "fsdp", mixed, fsdp_version=version, float32_master=mixed != "no")
        if getattr(trainer, "is_distributed_loading_by_transformers", False):
            # from_pretrained(distributed_config=...) sharded the model at load (transformers 5.23 distributed/
            # mixin.py): its DTensor shards keep the dtype it was loaded in, and no accelerate upcast runs on them
            return cls(processes, "fsdp", mixed, fsdp_version=2)
        if processes > 1 and str(getattr(getattr(accelerator, "distributed_type", None), "value", "")) == "NO":
            # several processes that accelerate will not wrap: each trains its own model (checkup/replicas.py)
            return cls(processes, "unwrapped", mixed)
        return cls(processes, "ddp" if processes > 1 else "single", mixed)
