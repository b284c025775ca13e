"""Probe 3 (lesson 03): fp16 trainable weights under a non-fused AdamW, and a reward head that never trains.

A non-fused AdamW keeps its state in the weights' dtype: in fp16, eps=1e-8 rounds to 0 and small
squared gradients underflow, so the first update is inf (lesson 03). A reward model whose ``score``
head is frozen, or trainable but not saved with a LoRA adapter, keeps a random head.
"""

from __future__ import annotations

import torch

from trl_clinic.checkup.engine import Finding, Skip, probe
from trl_clinic.checkup.view import TrainerView

HEADS = ("score", "classifier")  # what transformers calls a sequence-classification head


def _head_names(view: TrainerView) -> list[str]:
    return [name for name, _ in view.model.named_parameters() if any(f".{h}." in f".{name}" for h in HEADS)]


def _saved_with_adapter(view: TrainerView) -> bool | None:
    """Whether a PEFT adapter saves the head (SEQ_CLS or modules_to_save); None without PEFT."""
    config = getattr(view.model, "peft_config", None)
    if not config:
        return None
    peft = next(iter(config.values()))
    modules = set(peft.modules_to_save or ())
    return str(peft.task_type) in ("SEQ_CLS", "TaskType.SEQ_CLS") or bool(modules & set(HEADS))


@probe("fp16_adamw", "03", "fp16 trainable weights with a non-fused AdamW: its fp16 state rounds eps to 0 and "
       "underflows g^2, the first update is inf, then the loss is NaN (and logged as 0).")
def fp16_adamw(view: TrainerView) -> Finding:
    fp16 = [name for name, p in view.model.named_parameters() if p.requires_grad and p.dtype == torch.float16]
    optim = str(getattr(view.args.optim, "value", view.args.optim))
    measured = f"{len(fp16)} fp16 trainable tensors, optim={optim}"
    if not fp16:
        return Finding("fp16_adamw", "ok", measured, value=0, reason="no fp16 trainable weights")
    if "fused" in optim or "adamw" not in optim:
        return Finding("fp16_adamw", "warn", measured, value=len(fp16),
                       fix=f"fp16 trainable weights ({fp16[0]}...) train only because {optim} computes in fp32: "
                       "load in float32 or bfloat16")
    return Finding("fp16_adamw", "fail", measured, value=len(fp16),
                   fix=f"load the model in float32 or bfloat16 (dtype='float32'), or use optim='adamw_torch_fused'; "
                   f"first fp16 trainable tensor: {fp16[0]}")


@probe("reward_head", "03", "a reward model whose score head is frozen, or trained but not saved with the LoRA "
       "adapter (no task_type='SEQ_CLS' nor modules_to_save=['score']): its rewards come from a random head.")
def reward_head(view: TrainerView) -> Finding:
    names = _head_names(view)
    if not names:
        raise Skip("no score/classifier head: not a sequence-classification model")
    params = dict(view.model.named_parameters())
    trainable = [n for n in names if params[n].requires_grad]
    measured = f"{len(trainable)} of {len(names)} head tensors trainable"
    if not trainable:
        return Finding("reward_head", "fail", measured, value=0,
                       fix="the score head is frozen: with LoRA pass task_type='SEQ_CLS' (or modules_to_save=['score'])")
    if _saved_with_adapter(view) is False:
        return Finding("reward_head", "fail", measured, value=len(trainable),
                       fix="the LoRA adapter will not save the trained head: task_type='SEQ_CLS' or "
                       "modules_to_save=['score']")
    return Finding("reward_head", "ok", measured, value=len(trainable), reason="the head trains and is saved")
