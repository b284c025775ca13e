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

MAX_ROWS = 100_000  # rows a process counts at most (collation only, no forward): the whole set below it


def _targets(batch: dict) -> torch.Tensor:
    """``probes.labels.targets``, or a Skip for batches whose loss is not over tokens."""
    mask = targets(batch)
    if mask is None:
        raise Skip("the batches have neither labels nor a completion_mask (a reward or classification loss)")
    return mask


def label_counts(view: TrainerView) -> tuple[list[int], int, int]:
    """Label tokens of every micro-batch of one epoch of the trainer's own dataloader (this process's shard), the
    EOS tokens among them, and the rows read: token counts only, no forward, at most ``MAX_ROWS`` rows."""
    if view.kind == "grpo":
        raise Skip("GRPO's targets are its own generations, not collated labels")
    cached = getattr(view, "_label_counts", None)
    if cached is not None:
        return cached
    tokenizer = view.tokenizer
    eos = getattr(tokenizer, "eos_token_id", None)
    counts, eos_targets, rows = [], 0, 0
    for batch in view.trainer.get_train_dataloader():
        mask = _targets(batch)
        counts.append(int(mask.sum()))
        if eos is not None and "input_ids" in batch:
            eos_targets += int((mask & (batch["input_ids"] == eos)).sum())
        rows += len(mask)
        if rows >= MAX_ROWS:
            break
    if not counts:
        raise Skip("the trainer's dataloader gave no batch")
    view._label_counts = counts, eos_targets, rows
    return view._label_counts


def _read(counts: list[int], rows: int) -> str:
    bound = f" (stopped at {MAX_ROWS} rows)" if rows >= MAX_ROWS else ""
    return f"{len(counts)} micro-batches ({rows} rows) of the trainer's dataloader{bound}"


@probe(
    "labels_present",
    "02",
    "batches whose every label is masked: their loss is 0 and they teach nothing "
    "(prompt longer than max_length, a completion mask or assistant_only_loss template that masks every token).",
)
def labels_present(view: TrainerView) -> Finding:
    counts, _, rows = label_counts(view)
    empty = sum(c == 0 for c in counts)
    where = [i for i, c in enumerate(counts) if c == 0]
    measured = (
        f"{empty} without a label token in {_read(counts, rows)}"
        + (f" (micro-batch {', '.join(map(str, where[:3]))}{', ...' if len(where) > 3 else ''})" if where else "")
        + f"; fewest label tokens in one: {min(counts)}"
    )
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
    eos = tokenizer.eos_token_id
    counts, found, rows = label_counts(view)
    measured = f"{found} EOS targets in {_read(counts, rows)} (pad == eos: {tokenizer.pad_token_id == eos})"
    if found:
        return Finding("eos_label", "ok", measured, value=found, decided="measured", reason="EOS is a target")
    turn_end = chat_formatted(view, [next(iter(view.trainer.get_train_dataloader()))])
    if turn_end is not None:  # a ChatML turn ends with <|im_end|>, not EOS: no EOS target is right there
        raise Skip(
            f"chat-formatted batches end their turns with {tokenizer.convert_ids_to_tokens(turn_end)}, not EOS: "
            "turn_end checks them"
        )
    fix = (
        "pad == eos and the collator masks pad tokens, so EOS is masked too: set a pad token distinct from "
        "eos (tokenizer.pad_token = ...)"
        if tokenizer.pad_token_id == eos
        else "no completion ends with EOS: append tokenizer.eos_token to each text (TRL's SFTTrainer does from "
        "0.16.0 on a text dataset; before 0.16.0, and in a custom dataset, nothing adds it)"
    )
    return Finding("eos_label", "fail", measured, value=0, decided="measured", fix=fix)


def _frozen_adapter(model) -> bool:
    """A PEFT model whose adapter tensors are all frozen: ``PeftModel.from_pretrained`` without
    ``is_trainable=True`` loads it for inference."""
    adapters = [p for name, p in model.named_parameters() if "lora_" in name or "modules_to_save" in name]
    return bool(getattr(model, "peft_config", None)) and bool(adapters) and not any(p.requires_grad for p in adapters)


@probe(
    "gradients_reach",
    "-",
    "nothing trainable (a PEFT adapter loaded without is_trainable=True, a preparation step that froze "
    "everything), or trainable parameters that get no gradient in the first optimizer step's window through the "
    "trainer's own training_step (PEFT + reentrant gradient checkpointing without input gradients, a detached head).",
)
def gradients_reach(view: TrainerView) -> Finding:
    step = view.step
    if not step.trainable:
        total = sum(1 for _ in view.model.parameters())
        fix = (
            "the PEFT adapter is frozen (PeftModel.from_pretrained loads it for inference): "
            "PeftModel.from_pretrained(model, path, is_trainable=True), or pass peft_config to the trainer"
            if _frozen_adapter(view.model)
            else "a preparation step froze every tensor (requires_grad_(False), prepare_model_for_kbit_training "
            "without an adapter): add an adapter (peft_config) or unfreeze the tensors to train"
        )
        return Finding(
            "gradients_reach",
            "fail",
            f"0 of {total} tensors are trainable: the optimizer would update nothing",
            value=total,
            decided="measured",
            fix=fix,
        )
    missing = step.missing
    measured = (
        f"{len(missing)} of {len(step.trainable)} trainable tensors without a gradient in the first optimizer step "
        f"({len(step.batches)} micro-batches through training_step)"
    )
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
