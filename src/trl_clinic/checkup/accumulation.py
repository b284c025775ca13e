"""Probe 2 (lesson 02): does an accumulation window weigh every label token of the window equally?

Lesson 02 trains one real step (``trl_clinic.probes.gradients.first_step_gradient``); a check-up may not
step the user's optimizer, so this probe calls the trainer's own ``get_batch_samples`` (which counts
``num_items_in_batch``, transformers >= 4.46) and ``training_step`` (loss, scaling, backward) on k
micro-batches of b samples, and compares that gradient with a reference on the same samples:

* padded rows: one batch of b*k through the same ``training_step`` (what "batch b*k" means to a user);
* packed rows: the same k micro-batches, each forwarded exactly as the trainer forwards it, their summed
  token losses divided by the window's own ``num_items_in_batch``. A packed batch of b*k would pack
  differently from k rows of b, so a contaminated packing would show here as an accumulation error; the
  like-with-like reference leaves contamination to the ``packing`` probe.

Dropout is off while it runs, so every pass sees the same function. The trainer is told the window's
length the way its version reads it (``window``).
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import nn
from transformers import Trainer

from trl_clinic.checkup.engine import Skip, probe
from trl_clinic.checkup.known_bugs import explain
from trl_clinic.checkup.view import TrainerView
from trl_clinic.probes.batches import batch_layout
from trl_clinic.probes.finding import Finding
from trl_clinic.probes.labels import IGNORE_INDEX, targets

MAX_STEPS = 4  # the reweighting shows at any k >= 2; more micro-batches only cost time
TOLERANCE = {"full": 1e-3, "half": 5e-2}  # relative gradient error; lesson 02 measures <= 4e-7 fixed, >= 0.42 buggy


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


@contextmanager
def window(trainer: Trainer, steps: int) -> Iterator[None]:
    """Let ``training_step`` treat ``steps`` micro-batches as one accumulation window, whichever version reads
    it where: ``args.gradient_accumulation_steps`` (every version), ``current_gradient_accumulation_steps`` (read
    by 4.55.4's trainer.py, absent from 4.53.1's), and the accelerator, which divides each backward by the steps
    it was given through transformers 4.46.1 (``Trainer.create_accelerator_and_postprocess`` passes it
    ``num_steps`` in 4.45.2 and 4.46.1) and is given none from 4.46.2 (the same function: "We explicitly don't
    rely on the Accelerator to do gradient accumulation")."""
    args, accelerator = trainer.args, trainer.accelerator
    original = args.gradient_accumulation_steps
    accelerator_steps = accelerator.gradient_accumulation_steps
    scales = original > 1 and accelerator_steps == original
    missing = object()
    current = vars(trainer).get("current_gradient_accumulation_steps", missing)
    vars(args)["gradient_accumulation_steps"] = steps  # past a frozen TrainingArguments' __setattr__
    trainer.current_gradient_accumulation_steps = steps
    if scales:
        accelerator.gradient_accumulation_steps = steps
    try:
        yield
    finally:
        vars(args)["gradient_accumulation_steps"] = original
        if current is missing:
            del vars(trainer)["current_gradient_accumulation_steps"]
        else:
            trainer.current_gradient_accumulation_steps = current
        if scales:
            accelerator.gradient_accumulation_steps = accelerator_steps


def _window_samples(trainer: Trainer, batches: list[dict], device: torch.device) -> tuple[list[dict], object]:
    """The window's batches and ``num_items_in_batch`` as the trainer counts them (None before transformers 4.46)."""
    if not hasattr(trainer, "get_batch_samples"):
        return batches, None
    count = trainer.get_batch_samples
    if "device" in inspect.signature(count).parameters:
        return count(iter(batches), len(batches), device)
    return count(iter(batches), len(batches))


def _gradient(model: nn.Module) -> torch.Tensor:
    return torch.cat(
        [p.grad.detach().flatten().double().cpu() for p in model.parameters() if p.requires_grad and p.grad is not None]
    )


def _takes_num_items(method) -> bool:
    """Whether ``training_step`` takes ``num_items_in_batch``: named in its signature, or passed on through
    ``*args`` (TRL wraps it) to a transformers Trainer whose own ``training_step`` takes it (>= 4.46)."""
    parameters = inspect.signature(method).parameters
    passes_on = any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in parameters.values())
    return "num_items_in_batch" in parameters or (
        passes_on and "num_items_in_batch" in inspect.signature(Trainer.training_step).parameters
    )


def accumulated_gradient(trainer: Trainer, batches: list[dict]) -> torch.Tensor:
    """The gradient the trainer's own training_step accumulates over ``batches`` (one window)."""
    model = trainer.model
    for p in model.parameters():
        p.grad = None
    device = next(model.parameters()).device
    takes_items = _takes_num_items(trainer.training_step)
    with window(trainer, len(batches)), dropout_off(model):
        batches, num_items = _window_samples(trainer, batches, device)
        for batch in batches:
            if takes_items:
                trainer.training_step(model, batch, num_items)
            else:
                trainer.training_step(model, batch)
    return _gradient(model)


def token_sum_gradient(view: TrainerView, batches: list[dict]) -> torch.Tensor:
    """The gradient of the window's summed next-token losses over its label count, each micro-batch forwarded
    exactly as the trainer forwards it: the definition of a correct accumulation window, packing included."""
    trainer, model = view.trainer, view.model
    for p in model.parameters():
        p.grad = None
    model.train()
    with dropout_off(model):
        _, num_items = _window_samples(trainer, batches, view.device)
        shifted = [batch["labels"][..., 1:] for batch in batches]
        total = num_items if num_items is not None else sum(int(targets(batch).sum()) for batch in batches)
        for batch, labels in zip(batches, shifted):
            logits = model(**view.forward_inputs(batch)).logits[..., :-1, :]
            loss = F.cross_entropy(
                logits.flatten(0, 1).float(),
                labels.flatten().to(logits.device),
                ignore_index=IGNORE_INDEX,
                reduction="sum",
            )
            (loss / total).backward()
    return _gradient(model)


def _why(view: TrainerView, entry: dict | None) -> str:
    trainer = view.trainer
    if entry:
        return entry["fix"]
    loss_types = getattr(view.args, "loss_type", None)
    loss_types = [loss_types] if isinstance(loss_types, str) else list(loss_types or [])
    if view.kind == "dpo" and "sft" in loss_types:
        # TRL 1.16.0 DPOTrainer._compute_loss: the 'sft' term is -chosen_per_token_logps[chosen_mask].mean(), a mean
        # over this micro-batch's chosen tokens, and Trainer divides it by the accumulation steps
        return (
            "DPO's 'sft' loss term is a mean over each micro-batch's chosen tokens, so accumulation weighs the tokens "
            "of short micro-batches more: raise per_device_train_batch_size and lower gradient_accumulation_steps, "
            "or leave 'sft' out of loss_type"
        )
    if (
        getattr(trainer, "model_accepts_loss_kwargs", True) is False
        and getattr(trainer, "compute_loss_func", None) is None
    ):
        return (
            "model_accepts_loss_kwargs is False, so each micro-batch mean is divided by the accumulation steps "
            "(the pre-4.46 path): leave it True, or divide the summed loss by num_items_in_batch yourself"
        )
    owner = next(c for c in type(trainer).__mro__ if "compute_loss" in vars(c))
    if owner is not Trainer:
        return (
            f"{owner.__name__}.compute_loss ignores num_items_in_batch: return the summed token loss divided by "
            "num_items_in_batch when it is given"
        )
    return "the model's loss ignores num_items_in_batch: sum the token losses and divide by num_items_in_batch"


@probe(
    "accumulation",
    "02",
    "gradient accumulation that reweights tokens: the first step's gradient at batch b x "
    "accumulation k differs from one batch of b*k on the same samples, or on packed rows from the window's summed "
    "token loss over its label count (a custom compute_loss or model that ignores num_items_in_batch, "
    "model_accepts_loss_kwargs=False, transformers < 4.46, DPO's per-micro-batch 'sft' term); for DPO and reward "
    "pairs the same comparison through their own collators; average_tokens_across_devices=False with "
    "several processes.",
)
def accumulation(view: TrainerView) -> list[Finding]:
    args, trainer = view.args, view.trainer
    findings = []
    if args.world_size > 1 and not getattr(args, "average_tokens_across_devices", False):
        findings.append(
            Finding(
                "accumulation",
                "warn",
                f"{args.world_size} processes",
                decided="config",
                fix="average_tokens_across_devices=True: each process divides by its own token "
                "count otherwise, which reweights tokens across processes",
            )
        )
    if view.kind == "grpo":
        raise Skip("GRPO's loss comes from its own generations; its accumulation is not a collator batch")
    k = min(args.gradient_accumulation_steps, MAX_STEPS)
    if k < 2:
        if findings:
            return findings
        raise Skip("gradient_accumulation_steps is 1: no accumulation window")
    b = args.per_device_train_batch_size
    samples = [view.samples(b, start=i * b) for i in range(k)]
    micro = [trainer.data_collator(s) for s in samples]
    packed = any(batch_layout(s, batch).packed for s, batch in zip(samples, micro))
    if packed and "labels" not in micro[0]:
        raise Skip("packed rows without labels: no token loss to sum for the reference")
    error_of = accumulated_gradient(trainer, micro)
    if packed:
        reference = token_sum_gradient(view, micro)
        measured = f"relative gradient error {b}x{k} packed vs the window's token-sum loss: "
    else:
        reference = accumulated_gradient(trainer, [trainer.data_collator(sum(samples, []))])
        measured = f"relative gradient error {b}x{k} vs {b * k}x1: "
    error = ((error_of - reference).norm() / reference.norm()).item()
    tolerance = TOLERANCE["half" if view.dtype in (torch.float16, torch.bfloat16) else "full"]
    measured += f"{error:.2g} (tolerance {tolerance:g})"
    if error <= tolerance:
        return findings + [
            Finding(
                "accumulation",
                "ok",
                measured,
                value=error,
                decided="measured",
                reason="every label token of the window weighs the same",
            )
        ]
    entry = explain(view, "accumulation")
    return findings + [
        Finding(
            "accumulation",
            "fail",
            measured,
            value=error,
            decided="measured",
            fix=_why(view, entry),
            known_bug=entry["id"] if entry else "",
        )
    ]
