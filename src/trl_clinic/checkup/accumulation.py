"""Probe 2 (lesson 02): does accumulating k micro-batches give the gradient of one batch k times larger?

Lesson 02 trains one real step (``trl_clinic.probes.gradients.first_step_gradient``); a check-up may not
step the user's optimizer, so this probe calls the trainer's own ``get_batch_samples`` (which counts
``num_items_in_batch``) and ``training_step`` (loss, scaling, backward) on the same samples twice:
as k micro-batches of b, and as one batch of b*k, and compares the two gradients. Dropout is off
while it runs, so the two passes see the same function.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn
from transformers import Trainer

from trl_clinic.checkup.engine import Finding, Skip, probe
from trl_clinic.checkup.view import TrainerView

MAX_STEPS = 4  # the reweighting shows at any k >= 2; more micro-batches only cost time


@contextmanager
def dropout_off(model: nn.Module) -> Iterator[None]:
    """Dropout draws a different mask for a batch of b and one of b*k: zero every rate, then restore it
    (``nn.Dropout`` modules, and the float ``*dropout`` attributes that functional dropout reads)."""
    saved = []
    for module in model.modules():
        for name, value in vars(module).items():
            if "dropout" in name and isinstance(value, float) and value > 0:
                saved.append((module, name, value))
        if isinstance(module, nn.Dropout) and module.p > 0:
            saved.append((module, "p", module.p))
    for module, name, _ in saved:
        setattr(module, name, 0.0)
    try:
        yield
    finally:
        for module, name, value in saved:
            setattr(module, name, value)


def accumulated_gradient(trainer: Trainer, batches: list[dict]) -> torch.Tensor:
    """The gradient the trainer's own training_step accumulates over ``batches`` (one window)."""
    model = trainer.model
    for p in model.parameters():
        p.grad = None
    trainer.current_gradient_accumulation_steps = len(batches)
    device = next(model.parameters()).device
    batches, num_items = trainer.get_batch_samples(iter(batches), len(batches), device)
    with dropout_off(model):
        for batch in batches:
            trainer.training_step(model, batch, num_items)
    return torch.cat([p.grad.detach().flatten().double().cpu() for p in model.parameters()
                      if p.requires_grad and p.grad is not None])


def _why(trainer: Trainer) -> str:
    if not trainer.model_accepts_loss_kwargs and trainer.compute_loss_func is None:
        return ("model_accepts_loss_kwargs is False, so each micro-batch mean is divided by the accumulation steps "
                "(the pre-4.46 path): leave it True, or divide the summed loss by num_items_in_batch yourself")
    if type(trainer).compute_loss is not Trainer.compute_loss:
        return (f"{type(trainer).__name__}.compute_loss ignores num_items_in_batch: return the summed token loss "
                "divided by num_items_in_batch when it is given")
    return "the model's loss ignores num_items_in_batch: sum the token losses and divide by num_items_in_batch"


@probe("accumulation", "02", "gradient accumulation that reweights tokens: the first step's gradient at batch b x "
       "accumulation k differs from one batch of b*k on the same samples (a custom compute_loss or model that "
       "ignores num_items_in_batch, model_accepts_loss_kwargs=False); average_tokens_across_devices=False with "
       "several processes.")
def accumulation(view: TrainerView) -> list[Finding]:
    args, trainer = view.args, view.trainer
    findings = []
    if args.world_size > 1 and not args.average_tokens_across_devices:
        findings.append(Finding("accumulation", "warn", f"{args.world_size} processes",
                                fix="average_tokens_across_devices=True: each process divides by its own token "
                                "count otherwise, which reweights tokens across processes"))
    if view.kind == "grpo":
        raise Skip("GRPO's loss comes from its own generations; its accumulation is not a collator batch")
    k = min(args.gradient_accumulation_steps, MAX_STEPS)
    if k < 2:
        if findings:
            return findings
        raise Skip("gradient_accumulation_steps is 1: no accumulation window")
    b = args.per_device_train_batch_size
    micro = [view.batch(b, start=i * b) for i in range(k)]
    error_of = accumulated_gradient(trainer, micro)
    reference = accumulated_gradient(trainer, [view.batch(b * k)])
    error = ((error_of - reference).norm() / reference.norm()).item()
    tolerance = 5e-2 if view.half else 1e-3
    measured = f"relative gradient error {b}x{k} vs {b * k}x1: {error:.2g}"
    if error <= tolerance:
        return findings + [Finding("accumulation", "ok", measured, value=error, reason=f"within {tolerance:g}")]
    return findings + [Finding("accumulation", "fail", measured, value=error, fix=_why(trainer))]
