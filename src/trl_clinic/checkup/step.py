"""The trainer's first optimizer step as the check-up sees it, once per check-up and shared by the probes.

The first window of ``gradient_accumulation_steps`` micro-batches from the trainer's own dataloader (its
dataset, sampler, collator and this process's shard) goes through its own ``training_step`` (the loss divided
by k or by ``num_items_in_batch``, as the installed version does), with the activation checkpointing
``train()`` would turn on: the gradient the optimizer's first step would be given, before the
``max_grad_norm`` clipping, whose factor is kept beside it. The probes that stand for an optimizer step use
this gradient (``fp16_adamw``), which tensors it reached (``gradients_reach``), and the accumulation probe
compares it with its reference. Copies of it are bounded: only the tensors that fit in the budget are kept
(from the last trainable tensor back, which every label token's loss reaches), and a probe that needs a
tensor not kept says how many bytes a copy of every trainable gradient would take.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from trl_clinic.checkup.accumulation import run_window

GiB = 1 << 30
DEFAULT_BUDGET = GiB  # bytes a probe may hold beyond what training holds (copies of gradients, clones)


def size(nbytes: float) -> str:
    return f"{nbytes / GiB:.3g} GiB" if nbytes >= GiB / 10 else f"{nbytes / (1 << 20):.3g} MiB"


@dataclass
class Step:
    batches: list[dict]  # the window's micro-batches, as the dataloader gave them
    trainable: list[str]  # every trainable tensor's name, in the model's order
    missing: list[str]  # the trainable tensors no gradient reached
    norm: float  # the gradient's total norm before clipping
    clip: float  # the factor max_grad_norm clipping multiplies it by (1: no clipping)
    needed: int  # bytes a copy of every trainable gradient takes
    budget: int
    kept: dict[str, torch.Tensor] = field(default_factory=dict)  # name -> a copy of its gradient (not clipped)

    def over_budget(self) -> str:
        return (
            f"a copy of the trainable gradient needs {size(self.needed)} and not one tensor of it fits the budget of "
            f"{size(self.budget)}: checkup(trainer, budget=...) or --budget BYTES"
        )

    def coverage(self) -> str:
        if len(self.kept) == len(self.trainable) - len(self.missing):
            return ""
        return (
            f"on {len(self.kept)} of {len(self.trainable)} trainable tensors (the last ones; all need "
            f"{size(self.needed)}, budget {size(self.budget)}): "
        )


def _checkpointing_asked(args) -> bool:
    return bool(getattr(args, "activation_checkpointing", None) or getattr(args, "gradient_checkpointing", False))


@contextmanager
def trainer_checkpointing(view) -> Iterator[None]:
    """The activation checkpointing ``train()`` turns on (``args.gradient_checkpointing`` and its kwargs), on
    while the probes train and off again after: the check-up runs before ``train()``, and without it a forward
    and backward holds every layer's activations, more than the training step it stands for."""
    model = view.base_model
    turn_on = (
        _checkpointing_asked(view.args)
        and hasattr(model, "gradient_checkpointing_enable")
        and getattr(model, "supports_gradient_checkpointing", False)
        and not getattr(model, "is_gradient_checkpointing", True)
    )
    if turn_on:
        kwargs = getattr(view.args, "gradient_checkpointing_kwargs", None)
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    try:
        yield
    finally:
        if turn_on:
            model.gradient_checkpointing_disable()


def first_step(view, budget: int) -> Step:
    """Run the first window through ``training_step`` and keep what the probes need (see the module)."""
    trainer, model = view.trainer, view.model
    k = max(1, view.args.gradient_accumulation_steps)
    batches = view.batches(k)
    named = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
    model.train()
    if named:
        with trainer_checkpointing(view):
            try:
                run_window(trainer, batches)
            except RuntimeError as error:  # a loss without a grad_fn: no trainable tensor is reached
                if "does not require grad" not in str(error):
                    raise
    grads = [p.grad for _, p in named if p.grad is not None]
    norm = 0.0
    if grads:
        with torch.no_grad():
            norm = float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g.float()) for g in grads])))
    limit = getattr(view.args, "max_grad_norm", None)
    clip = min(1.0, limit / (norm + 1e-6)) if limit and norm > 0 else 1.0  # as clip_grad_norm_ scales
    needed = sum(g.numel() * g.element_size() for g in grads)
    kept, used = {}, 0
    for name, p in reversed(named):
        if p.grad is None:
            continue
        nbytes = p.grad.numel() * p.grad.element_size()
        if used + nbytes > budget:
            break
        kept[name] = p.grad.detach().clone()
        used += nbytes
    step = Step(
        batches=batches,
        trainable=[name for name, _ in named],
        missing=[name for name, p in named if p.grad is None],
        norm=norm,
        clip=clip,
        needed=needed,
        budget=budget,
        kept=dict(reversed(list(kept.items()))),
    )
    for p in model.parameters():
        p.grad = None
    return step
