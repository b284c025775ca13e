"""Probe 2 (lesson 02): does an accumulation window weigh every label token of the window equally?

Lesson 02 trains one real step (``trl_clinic.probes.gradients.first_step_gradient``); a check-up may not
step the user's optimizer, so this probe calls the trainer's own ``get_batch_samples`` (which counts
``num_items_in_batch``, transformers >= 4.46) and ``training_step`` (loss, scaling, backward) on k
micro-batches of b samples (the first window of its dataloader, ``checkup.step``), and compares that
gradient with a reference on the same samples:

* padded rows: each micro-batch alone through the same ``training_step`` (a window of one: its loss over its own
  label tokens), weighted by its share of the window's label tokens: the gradient one batch of b*k would give
  with a token-mean loss (what "batch b*k" means to a user), never holding more than b rows; pair batches
  (DPO, reward) weighted by their rows, each loss a mean over pairs, except DPO's 'sft' term, a mean over the
  chosen tokens, which a second pass weighs by them (the trainer's ``loss_weights`` masked to one kind of term
  in each pass and put back);
* packed rows: the same k micro-batches, each forwarded exactly as the trainer forwards it, their summed
  token losses divided by the window's own ``num_items_in_batch``. A packed batch of b*k would pack
  differently from k rows of b, so a contaminated packing would show here as an accumulation error; the
  like-with-like reference leaves contamination to the ``packing`` probe.

Dropout is off while it runs, so every pass sees the same function. The trainer is told the window's
length the way its version reads it (``window``).

A window that weighs tokens wrongly scales each micro-batch's loss by its own factor, and every trainable tensor's
gradient is the sum of the micro-batches' gradients, so each tensor the loss reaches carries the error. The
comparison reads the last kept tensors (nearest the output, ``COMPARED_SHARE`` of the trainable gradient's bytes,
at least one), and the reference's backward runs only as deep as those (``loss.backward(inputs=...)``): its forward
is whole, its backward a fraction of the first window's. Reentrant activation checkpointing
(``use_reentrant=True``: each block's weights are reached by a backward of its own, inside the outer one, not by
the outer graph) leaves the tensors inside a block without a gradient there; then the reference runs again with
the whole backward.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import nn
from transformers import Trainer

from trl_clinic.checkup.engine import Skip, probe
from trl_clinic.checkup.known_bugs import explain
from trl_clinic.checkup.step import Step, _window_samples, dropout_off, micro_counts, run_window, size
from trl_clinic.checkup.view import TrainerView
from trl_clinic.probes.finding import Finding
from trl_clinic.probes.labels import IGNORE_INDEX, targets

# relative gradient error. fp32: lesson 02 measures <= 4e-7 fixed, >= 0.42 buggy. 16 bits: the zoo's healthy windows
# measured 0 to 0.0099 (bf16 and fp16, accumulation 2 to 8, every recipe), its smallest broken twin 0.044 (docs/zoo.md)
TOLERANCE = {"full": 1e-3, "half": 2e-2}


def _rows(batch: dict) -> int:
    """The rows of a batch (pairs stacked as 2b rows count the same share): its first tensor's length."""
    return len(next(value for value in batch.values() if isinstance(value, torch.Tensor)))


def _shares(counts: list[float]) -> list[float]:
    total = sum(counts)
    return [count / total if total else 0.0 for count in counts]


def _sft_term(trainer: Trainer) -> tuple[list[float], list[float]] | None:
    """TRL's DPOTrainer adds its loss terms weighted by ``self.loss_weights`` (trl 1.16.0 dpo_trainer.py:804, :1386,
    :1528): every term but 'sft' is a mean over the micro-batch's pairs, 'sft' a mean over its chosen tokens
    (:1495-1498). The weights that keep only the pair terms, and only the 'sft' term; None without an 'sft' term."""
    types, weights = getattr(trainer, "loss_types", None), getattr(trainer, "loss_weights", None)
    if not isinstance(types, list) or "sft" not in types or not isinstance(weights, list):
        return None
    pairs = [0.0 if kind == "sft" else weight for kind, weight in zip(types, weights)]
    sft = [weight if kind == "sft" else 0.0 for kind, weight in zip(types, weights)]
    return pairs, sft


@contextmanager
def _loss_weights(trainer: Trainer, weights: list[float]) -> Iterator[None]:
    """The trainer's ``loss_weights`` set to ``weights`` while a pass runs, the user's list put back after."""
    original = trainer.loss_weights
    trainer.loss_weights = weights
    try:
        yield
    finally:
        trainer.loss_weights = original


def _chosen_tokens(batch: dict) -> float:
    """The tokens DPO's 'sft' term averages over: the chosen half's shifted completion mask (trl 1.16.0
    dpo_trainer.py:1297, :1496-1498)."""
    chosen, _ = batch["completion_mask"][..., 1:].chunk(2, dim=0)
    return float(chosen.sum())


def token_sum_gradient(view: TrainerView, batches: list[dict], inputs: list[torch.Tensor] | None = None) -> None:
    """Into ``p.grad``: the gradient of the window's summed next-token losses over its label count, each
    micro-batch forwarded exactly as the trainer forwards it: the definition of a correct accumulation window,
    packing included. With ``inputs``, into those tensors only (the backward runs as deep as they are)."""
    trainer, model = view.trainer, view.model
    for p in model.parameters():
        p.grad = None
    model.train()
    with dropout_off(model):
        _, num_items = _window_samples(trainer, batches, view.device)
        shifted = [batch["labels"][..., 1:] for batch in batches]
        total = num_items if num_items is not None else sum(int(targets(batch).sum()) for batch in batches)
        # transformers multiplies each process's loss by the number of processes when it counts the window's tokens
        # over all of them, since DDP then averages the processes' gradients (5.23.0 trainer.py compute_loss, under
        # average_tokens_across_devices: "loss_scale = self.accelerator.num_processes // self.get_tp_size()"): the
        # reference does too
        averaged = getattr(view.args, "average_tokens_across_devices", False) and num_items is not None
        scale = trainer.accelerator.num_processes if averaged else 1
        for batch, labels in zip(batches, shifted):
            logits = model(**view.forward_inputs(batch)).logits[..., :-1, :]
            loss = F.cross_entropy(
                logits.flatten(0, 1).float(),
                labels.flatten().to(logits.device),
                ignore_index=IGNORE_INDEX,
                reduction="sum",
            )
            (loss * scale / total).backward(inputs=inputs)


def _coverage(step: Step, compared: dict[str, torch.Tensor]) -> str:
    """Which tensors the number is about, so the finding claims no more than it read."""
    nbytes = sum(grad.numel() * grad.element_size() for grad in compared.values())
    budget = f"; the budget of {size(step.budget)} kept {len(compared)}" if step.cut else ""
    return (
        f"on the last {len(compared)} of {len(step.trainable)} trainable tensors ({size(nbytes)} of "
        f"{size(step.needed)}{budget}): "
    )


def relative_difference(kept: dict[str, torch.Tensor], model: nn.Module) -> float:
    """|kept - p.grad| / |p.grad| over the tensors in ``kept``, tensor by tensor on their device (squares summed
    in float32): no concatenated or float64 copy of the gradient."""
    grads = {name: p.grad for name, p in model.named_parameters() if name in kept}
    difference = reference = 0.0
    for name, tensor in kept.items():
        grad = grads.get(name)
        if grad is None:
            difference += float(tensor.float().square().sum())
            continue
        difference += float((tensor.float() - grad.float()).square().sum())
        reference += float(grad.float().square().sum())
    return (difference / reference) ** 0.5 if reference else float("inf")


def _why(view: TrainerView, entry: dict | None) -> str:
    trainer = view.trainer
    if entry:
        return entry["fix"]
    loss_types = getattr(view.args, "loss_type", None)
    loss_types = [loss_types] if isinstance(loss_types, str) else list(loss_types or [])
    if view.kind == "dpo" and "sft" in loss_types:
        # TRL 1.16.0 DPOTrainer._compute_loss: the 'sft' term is -chosen_per_token_logps[chosen_mask.bool()].mean(),
        # a mean over this micro-batch's chosen tokens, and Trainer divides it by the accumulation steps
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
    "accumulation k (the trainer's own training_step on its first window) differs from the window's token-mean "
    "loss, built from each micro-batch alone weighted by its label tokens (never a batch larger than b), or on "
    "packed rows from the window's summed token loss over its label count (a custom compute_loss or model that "
    "ignores num_items_in_batch, model_accepts_loss_kwargs=False, transformers < 4.46, DPO's per-micro-batch "
    "'sft' term); average_tokens_across_devices=False with several processes.",
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
    k = args.gradient_accumulation_steps
    if k < 2:
        if findings:
            return findings
        raise Skip("gradient_accumulation_steps is 1: no accumulation window")
    step = view.step  # the first window through training_step, its gradient kept within the budget
    micro = step.batches
    if len(micro) < 2:
        raise Skip(f"the trainer's dataloader gave {len(micro)} batch: a window needs 2 or more")
    if not step.kept:
        raise Skip(step.over_budget())
    b = args.per_device_train_batch_size
    packed = any("position_ids" in batch and bool((batch["position_ids"][..., 1:] == 0).any()) for batch in micro)
    compared = {name: step.kept[name] for name in step.compared}  # kept by first_step, nearest the output
    params = dict(view.model.named_parameters())
    inputs = [params[name] for name in compared]
    view.model.train()
    counts, terms = [], None
    if packed:
        measured = f"relative gradient error {b}x{len(micro)} packed vs the window's token-sum loss: "
    else:
        tokens = all("labels" in batch for batch in micro)  # a token-mean loss; else a mean over rows (pairs)
        counts = micro_counts(trainer, micro) if tokens else [float(_rows(batch)) for batch in micro]
        terms = None if tokens else _sft_term(trainer)
        measured = (
            f"relative gradient error {b}x{len(micro)} vs each micro-batch alone weighted by its "
            f"{'label tokens' if tokens else 'rows'}{'' if terms is None else ' (the sft term by chosen tokens)'}: "
        )

    def reference(inputs: list[torch.Tensor] | None) -> None:
        with view.checkpointing():
            if packed:
                token_sum_gradient(view, micro, inputs)
            elif terms is None:
                run_window(trainer, micro, _shares(counts), inputs=inputs)
            else:  # the pair terms weighted by rows, then the 'sft' term by chosen tokens, added on
                pairs, sft = terms
                if any(pairs):
                    with _loss_weights(trainer, pairs):
                        run_window(trainer, micro, _shares(counts), inputs=inputs)
                with _loss_weights(trainer, sft):
                    shares = _shares([_chosen_tokens(batch) for batch in micro])
                    run_window(trainer, micro, shares, add=any(pairs), inputs=inputs)

    reference(inputs)
    if any(p.grad is None for p in inputs):  # reentrant checkpointing: the outer backward never reached them
        reference(None)
    with torch.no_grad():
        error = relative_difference(compared, view.model)
    for p in view.model.parameters():
        p.grad = None
    measured += _coverage(step, compared)
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
