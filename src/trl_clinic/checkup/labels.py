"""Probe 6: the labels the loss really sees, and whether every trainable parameter gets a gradient.

The traps users hit most now: batches whose every label is masked (loss 0, nothing learned), an EOS
that is never a target because the collator masks pad tokens and pad == eos (the model never learns
to stop), an ``assistant_only_loss`` template that masks everything, and trainable parameters that
get no gradient (reentrant gradient checkpointing whose inputs need no gradient: transformers 5.23 turns
input gradients on when checkpointing is enabled, ``PreTrainedModel._activation_checkpointing_enable``,
so it returns when something turns them off again, e.g. ``disable_input_require_grads()``).
"""

from __future__ import annotations

import torch

from trl_clinic.checkup.engine import Skip, probe
from trl_clinic.checkup.turns import chat_formatted
from trl_clinic.checkup.view import TrainerView
from trl_clinic.probes.finding import Finding
from trl_clinic.probes.labels import targets

BATCHES = 4  # how many of the first batches are read


def _targets(batch: dict) -> torch.Tensor:
    """``probes.labels.targets``, or a Skip for batches whose loss is not over tokens."""
    mask = targets(batch)
    if mask is None:
        raise Skip("the batches have neither labels nor a completion_mask (a reward or classification loss)")
    return mask


def _first_batches(view: TrainerView) -> list[dict]:
    if view.kind == "grpo":
        raise Skip("GRPO's targets are its own generations, not collated labels")
    b = view.args.per_device_train_batch_size
    n = min(BATCHES, len(view.rows) // b)
    if n == 0:
        raise Skip(f"fewer rows than one batch of {b}")
    return [view.batch(b, start=i * b) for i in range(n)]


@probe(
    "labels_present",
    "02",
    "batches whose every label is masked: their loss is 0 and they teach nothing "
    "(prompt longer than max_length, a completion mask or assistant_only_loss template that masks every token).",
)
def labels_present(view: TrainerView) -> Finding:
    counts = [int(_targets(batch).sum()) for batch in _first_batches(view)]
    empty = sum(c == 0 for c in counts)
    measured = f"label tokens in the first {len(counts)} batches: {counts}"
    if not empty:
        return Finding(
            "labels_present", "ok", measured, value=0, decided="measured", reason="every batch has label tokens"
        )
    cause = (
        "assistant_only_loss=True and the chat template marks no assistant tokens ({% generation %} tags)"
        if getattr(view.args, "assistant_only_loss", False)
        else "check max_length (completions cut off), the completion mask and the dataset's columns"
    )
    return Finding(
        "labels_present",
        "fail",
        measured,
        value=empty,
        decided="measured",
        fix=f"{empty} of {len(counts)} batches have no label token: {cause}",
    )


@probe(
    "eos_label",
    "-",
    "an EOS that is never a target: the model never learns to stop (pad == eos with a "
    "collator that masks pad tokens, or completions without EOS).",
)
def eos_label(view: TrainerView) -> Finding:
    tokenizer = view.tokenizer
    if tokenizer is None or tokenizer.eos_token_id is None:
        raise Skip("no tokenizer with an eos token on the trainer")
    eos, found = tokenizer.eos_token_id, 0
    batches = _first_batches(view)
    for batch in batches:
        found += int((_targets(batch) & (batch["input_ids"] == eos)).sum())
    measured = f"{found} EOS targets in the first batches (pad == eos: {tokenizer.pad_token_id == eos})"
    if found:
        return Finding("eos_label", "ok", measured, value=found, decided="measured", reason="EOS is a target")
    turn_end = chat_formatted(view, batches)
    if turn_end is not None:  # a ChatML turn ends with <|im_end|>, not EOS: no EOS target is right there
        raise Skip(
            f"chat-formatted batches end their turns with {tokenizer.convert_ids_to_tokens(turn_end)}, not EOS: "
            "turn_end checks them"
        )
    fix = (
        "pad == eos and the collator masks pad tokens, so EOS is masked too: set a pad token distinct from "
        "eos (tokenizer.pad_token = ...)"
        if tokenizer.pad_token_id == eos
        else "no completion ends with EOS: append tokenizer.eos_token (SFTTrainer does; a custom dataset may not)"
    )
    return Finding("eos_label", "fail", measured, value=0, decided="measured", fix=fix)


@probe(
    "gradients_reach",
    "-",
    "trainable parameters that get no gradient in one forward/backward of the "
    "trainer's own loss (PEFT + reentrant gradient checkpointing without input gradients, a detached head).",
)
def gradients_reach(view: TrainerView) -> Finding:
    gradients = view.first_gradients
    missing = [name for name, grad in gradients.items() if grad is None]
    measured = f"{len(missing)} of {len(gradients)} trainable tensors without a gradient"
    if not missing:
        return Finding(
            "gradients_reach",
            "ok",
            measured,
            value=0,
            decided="measured",
            reason="every trainable tensor got a gradient",
        )
    return Finding(
        "gradients_reach",
        "fail",
        measured,
        value=len(missing),
        decided="measured",
        fix=f"{missing[0]} (and {len(missing) - 1} more) get no gradient: with gradient checkpointing use "
        "gradient_checkpointing_kwargs={'use_reentrant': False} or model.enable_input_require_grads()",
    )
