"""The trainer's first optimizer step as the check-up sees it, once per check-up and shared by the probes.

The first window of ``gradient_accumulation_steps`` micro-batches from the trainer's own dataloader (its
dataset, sampler, collator and this process's shard) goes through its own ``training_step`` (the loss divided
by k or by ``num_items_in_batch``, as the installed version does), with the activation checkpointing
``train()`` would turn on: the gradient the optimizer's first step would be given, before the
``max_grad_norm`` clipping, whose factor is kept beside it. The probes that stand for an optimizer step use
this gradient (``fp16_adamw``), which tensors it reached (``gradients_reach``), and the accumulation probe
compares it with its reference. Only what a probe reads is copied: the last tensors, nearest the output (which
every label token's loss reaches), up to ``COMPARED_SHARE`` of the gradient's bytes, the ones the accumulation
probe compares, and the fp16 trainable tensors ``fp16_adamw`` steps; within the budget. A probe that needs a
tensor not kept says how many bytes a copy of every trainable gradient would take.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from accelerate.utils import DistributedType
from torch import nn
from transformers import Trainer

from trl_clinic.probes.labels import targets


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
    rely on the `Accelerator` to do gradient accumulation")."""
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


def _takes_num_items(method) -> bool:
    """Whether ``training_step`` takes ``num_items_in_batch``: named in its signature, or passed on through
    ``*args`` (TRL wraps it) to a transformers Trainer whose own ``training_step`` takes it (>= 4.46)."""
    parameters = inspect.signature(method).parameters
    passes_on = any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in parameters.values())
    return "num_items_in_batch" in parameters or (
        passes_on and "num_items_in_batch" in inspect.signature(Trainer.training_step).parameters
    )


def _deepspeed_backward(trainer: Trainer):
    """Before ``train()`` DeepSpeed's engine does not exist and ``accelerator.backward`` has nothing to call: the
    plain backward DeepSpeed would run for this loss (``scale_wrt_gas=False``: no division), else None."""
    accelerator = trainer.accelerator
    if getattr(trainer, "is_deepspeed_enabled", False) and getattr(accelerator, "deepspeed_engine_wrapped", 1) is None:
        return lambda loss, inputs=None, **kwargs: loss.backward(inputs=inputs)
    return None


@contextmanager
def backward_to(trainer: Trainer, inputs: list[torch.Tensor] | None = None) -> Iterator[None]:
    """The accelerator's ``backward`` as ``training_step`` calls it, for one pass: DeepSpeed's plain backward before
    ``train()``, and with ``inputs`` a backward that stops at them. ``Accelerator.backward`` hands its keyword
    arguments to ``loss.backward`` (or to the grad scaler's scaled loss; accelerate 0.30.1, 1.0.1 and 1.15.0), and
    ``loss.backward(inputs=...)`` accumulates into those tensors' ``.grad`` only, so autograd runs no node that
    leads to none of them (torch 2.13.0 ``torch.autograd.backward``). A live DeepSpeed engine takes no ``inputs``:
    there the backward stays whole. An instance attribute on the accelerator, removed after."""
    accelerator = trainer.accelerator
    backward = _deepspeed_backward(trainer)
    if inputs is not None and (backward is not None or accelerator.distributed_type != DistributedType.DEEPSPEED):
        backward = functools.partial(backward or accelerator.backward, inputs=inputs)
    if backward is None:
        yield
        return
    missing = object()
    saved = vars(accelerator).get("backward", missing)
    accelerator.backward = backward
    try:
        yield
    finally:
        if saved is missing:
            del vars(accelerator)["backward"]
        else:
            accelerator.backward = saved


def run_window(
    trainer: Trainer,
    batches: list[dict],
    weights: list[float] | None = None,
    add: bool = False,
    inputs: list[torch.Tensor] | None = None,
) -> None:
    """Accumulate into each trainable ``p.grad`` what the trainer's own ``training_step`` gives for ``batches``:
    one window of ``len(batches)`` micro-batches (``weights`` None), or each micro-batch alone as a window of one,
    its gradient weighted by ``weights[i]`` (the running sum is divided by the weight before the micro-batch's
    backward and multiplied by it after: no second gradient is held). Dropout off; gradients start at None, or,
    with ``add``, at what they hold (a second weighted pass adds onto the first). With ``inputs``, the backward
    runs only as deep as those tensors (``backward_to``): the others get no gradient."""
    model = trainer.model
    params = [p for p in model.parameters() if p.requires_grad]
    if not add:
        for p in params:
            p.grad = None
    device = next(model.parameters()).device
    takes_items = _takes_num_items(trainer.training_step)

    def step(batch, num_items):
        trainer.training_step(model, batch, num_items) if takes_items else trainer.training_step(model, batch)

    with dropout_off(model), backward_to(trainer, inputs):
        if weights is None:
            with window(trainer, len(batches)):
                batches, num_items = _window_samples(trainer, batches, device)
                for batch in batches:
                    step(batch, num_items)
            return
        previous = 1.0
        for batch, weight in zip(batches, weights):
            if weight == 0:  # a micro-batch without label tokens has no share of a token mean
                continue
            with torch.no_grad():
                for p in params:
                    if p.grad is not None:
                        p.grad.mul_(previous / weight)
            with window(trainer, 1):
                (one,), num_items = _window_samples(trainer, [batch], device)
                step(one, num_items)
            previous = weight
        with torch.no_grad():
            for p in params:
                if p.grad is not None:
                    p.grad.mul_(previous)


def micro_counts(trainer: Trainer, batches: list[dict]) -> list[float]:
    """What ``training_step`` divides each micro-batch's summed loss by when it runs alone: its
    ``num_items_in_batch`` as the trainer counts it (over every process under ``average_tokens_across_devices``),
    else its own label tokens (before transformers 4.46)."""
    device = next(trainer.model.parameters()).device
    counts = []
    for batch in batches:
        _, num_items = _window_samples(trainer, [batch], device)
        counts.append(float(num_items) if num_items is not None else float(targets(batch).sum()))
    return counts


GiB = 1 << 30
DEFAULT_BUDGET = GiB  # bytes a probe may hold beyond what training holds (copies of gradients, clones)
# The share of the trainable gradient's bytes the comparison reads, from the output back. The reference's forward is
# whole and its backward goes as deep as these tensors: an eighth keeps that backward near an eighth of the window's
# for a stack of equal blocks (SmolLM2-135M's full fine-tune: the last 41 of 272 tensors, 15.9 M entries, down into
# block 25 of 30; its LoRA: the last 50 of 420, into block 26), and still reads many tensors of several blocks,
# where any one tensor the loss reaches carries a per-micro-batch scale.
COMPARED_SHARE = 1 / 8


# Probes that read every trainable gradient while the first window's gradients are live, instead of a copy of them
# (a copy of a full fine-tune's gradient is as large as the model): name -> reader(view, named, clip), run by
# first_step for the probes the check-up runs (``view.probes``), its result or its exception kept in ``Step.live``.
LIVE_READERS: dict[str, Callable] = {}


def live_reader(name: str) -> Callable:
    """Register ``reader(view, named, clip)`` for probe ``name``: called once, in ``first_step``, with the trainable
    ``(name, parameter)`` pairs whose ``.grad`` holds the window's gradient and the clipping factor."""

    def register(reader: Callable) -> Callable:
        LIVE_READERS[name] = reader
        return reader

    return register


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
    compared: list[str] = field(default_factory=list)  # the last kept tensors, COMPARED_SHARE of the bytes
    cut: bool = False  # the budget kept fewer of the compared tensors than COMPARED_SHARE asks for
    live: dict[str, object] = field(default_factory=dict)  # probe -> what its live reader returned, or raised

    def read_live(self, probe: str) -> object:
        """What ``probe``'s live reader returned; the exception it raised is raised here, in the probe."""
        if probe not in self.live:
            raise RuntimeError(f"{probe}'s reader did not run in the first window")
        value = self.live[probe]
        if isinstance(value, BaseException):
            raise value
        return value

    def over_budget(self) -> str:
        return (
            f"a copy of the trainable gradient needs {size(self.needed)} and not one tensor of it fits the budget of "
            f"{size(self.budget)}: checkup(trainer, budget=...) or --budget BYTES"
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
    live = {}
    for probe, reader in LIVE_READERS.items():
        if view.probes is None or probe in view.probes:
            try:
                live[probe] = reader(view, named, clip)
            except Exception as error:  # noqa: BLE001 - the probe that reads it reports it as its own error
                live[probe] = error
    needed = sum(g.numel() * g.element_size() for g in grads)
    kept, used, cut = {}, 0, False
    for name, p in reversed(named):  # the compared tensors: the last ones up to COMPARED_SHARE, at least one
        if p.grad is None:
            continue
        nbytes = p.grad.numel() * p.grad.element_size()
        if kept and used + nbytes > COMPARED_SHARE * needed:
            break
        if used + nbytes > budget:
            cut = True
            break
        kept[name] = p.grad.detach().clone()
        used += nbytes
    compared = list(reversed(kept))
    for name, p in named:  # the ones fp16_adamw steps, each that fits
        nbytes = p.numel() * p.element_size()
        if p.grad is not None and p.dtype == torch.float16 and name not in kept and used + nbytes <= budget:
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
        kept={name: kept[name] for name, _ in named if name in kept},
        compared=compared,
        cut=cut,
        live=live,
    )
    for p in model.parameters():
        p.grad = None
    return step
