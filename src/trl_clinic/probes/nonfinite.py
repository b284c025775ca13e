"""Finding the first NaN/inf: a callback that stops training at the first bad step and names the tensor."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from transformers import TrainerCallback


@dataclass
class Finding:
    step: int  # the optimizer step (1-based) after which the tensor was found
    where: str  # "gradient" (before the optimizer step) or "weight" (after it)
    names: list[str] = field(default_factory=list)


class NonFiniteProbe(TrainerCallback):
    """Checks every trainable tensor's gradient before each optimizer step and its weight after it.

    The first step where something is NaN/inf ends training, and ``finding`` says which tensors and
    whether the gradient or the update made them so. The check syncs with the host twice per step:
    a diagnostic for a short run, not something to leave on.
    """

    def __init__(self) -> None:
        self.finding: Finding | None = None

    def _check(self, model, state, control, where: str):
        if self.finding is not None:
            return control
        bad = []
        for name, param in model.named_parameters():
            if not param.requires_grad:
                continue
            tensor = param.grad if where == "gradient" else param
            if tensor is not None and not torch.isfinite(tensor).all():
                bad.append(name)
        if bad:
            self.finding = Finding(step=state.global_step + 1, where=where, names=bad)
            control.should_training_stop = True
        return control

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        return self._check(model, state, control, "gradient")

    def on_optimizer_step(self, args, state, control, model=None, **kwargs):
        return self._check(model, state, control, "weight")
