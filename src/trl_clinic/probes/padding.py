"""Padding side, KV cache and batching: does a batch give the same answers as one sequence at a time?

Two reusable checks (scoring and generation), an audit of the forwards a trainer really makes, and
the evaluation loss a trainer should report at a batch size if padding changed nothing.
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase, Trainer

from trl_clinic.probes.labels import targets
from trl_clinic.probes.packing import pack

SCORING_MODES = ("left", "right", "padding_free")
AUDIT_COLUMNS = ("forwards", "right_padded", "cache_built", "right_padded_with_cache", "mask_to_attention")


def right_padded(attention_mask: torch.Tensor) -> bool:
    """True when some row ends in padding (a 0 after its tokens)."""
    return bool((attention_mask[:, -1] == 0).any())


def library_caller(skip: str = "trl_clinic") -> str | None:
    """``file:function`` of the innermost calling frame in trl (the code that called the forward being
    hooked): which of TRL's functions asked for (or against) a cache."""
    frame = sys._getframe(1)
    while frame is not None:
        path = frame.f_code.co_filename.replace("\\", "/")
        if "/trl/" in path and skip not in path:
            return f"{Path(path).name}:{frame.f_code.co_name}"
        frame = frame.f_back
    return None


class ForwardAudit:
    """Counts the forwards of named models (``ForwardAudit(policy=..., reference=...)``) by phase
    (train/eval: the training flag of the first model named, the one a trainer trains, so a frozen
    reference model's forwards count in the phase they belong to), right padding, the ``use_cache`` each forward
    was passed and by which TRL function, whether the backbone really returned a KV cache, and whether attention
    got a mask.

    The cache is read from what the backbone (``model.base_model``) returns: ``past_key_values`` is
    None unless a cache was built, whatever kwargs and config said. A cache, an attention mask and a
    right-padded row together are what made Qwen2 + FlashAttention-2 raise in transformers
    4.37.0-4.41.2 (``Qwen2Model.forward``) and 4.49.0-4.52.4 (``Qwen2Model._update_causal_mask``).
    The mask is read where attention receives it (the first ``self_attn`` module): transformers drops
    a mask without padding, so the kernel takes its causal fast path, and passes one when a row is
    padded (a boolean 4D mask for sdpa, the 2D padding mask for FlashAttention's unpadding).
    """

    def __init__(self, **models: PreTrainedModel) -> None:
        if not models:
            raise ValueError("name the models to audit, e.g. ForwardAudit(policy=trainer.model)")
        self.forwards: list[dict] = []
        self._pending: dict[str, dict | None] = {}  # per model: the forward whose backbone/attention is next
        self._handles = []
        self._phase_of = next(iter(models.values()))
        for name, model in models.items():
            attention = next(module for key, module in model.named_modules() if key.endswith("self_attn"))
            self._handles += [
                model.register_forward_pre_hook(functools.partial(self._record, name), with_kwargs=True),
                model.base_model.register_forward_hook(functools.partial(self._record_cache, name), with_kwargs=True),
                attention.register_forward_pre_hook(functools.partial(self._record_mask, name), with_kwargs=True),
            ]

    def _record(self, name: str, module, args, kwargs) -> None:
        mask = kwargs.get("attention_mask")
        self._pending[name] = {
            "model": name,
            "mode": "train" if self._phase_of.training else "eval",
            "right_padded": mask is not None and mask.dim() == 2 and right_padded(mask),
            "use_cache": kwargs.get("use_cache"),
            "asked_by": library_caller(),
            "cache_built": False,
            "backbone_use_cache": None,
            "backbone_asked_by": None,
            "mask_to_attention": False,
        }
        self.forwards.append(self._pending[name])

    def _record_cache(self, name: str, module, args, kwargs, output) -> None:
        if self._pending.get(name) is not None:
            self._pending[name].update(
                cache_built=getattr(output, "past_key_values", None) is not None,
                backbone_use_cache=kwargs.get("use_cache"),
                backbone_asked_by=library_caller(),
            )

    def _record_mask(self, name: str, module, args, kwargs) -> None:
        forward = self._pending.get(name)
        if forward is not None and not forward.get("_attention_seen"):  # checkpointing calls attention again
            forward.update(mask_to_attention=kwargs.get("attention_mask") is not None, _attention_seen=True)

    def summary(self) -> dict[str, dict[str, dict]]:
        """Per model and mode: counts of each column, and who passed which ``use_cache`` (``asked``)."""
        table: dict[str, dict[str, dict]] = {}
        for forward in self.forwards:
            row = table.setdefault(forward["model"], {}).setdefault(
                forward["mode"], {**dict.fromkeys(AUDIT_COLUMNS, 0), "asked": {}}
            )
            row["forwards"] += 1
            row["right_padded"] += forward["right_padded"]
            row["cache_built"] += forward["cache_built"]
            row["right_padded_with_cache"] += forward["right_padded"] and forward["cache_built"]
            row["mask_to_attention"] += forward["mask_to_attention"]
            for level in ("", "backbone_"):
                key = f"{level}use_cache={forward[level + 'use_cache']} from {forward[level + 'asked_by']}"
                row["asked"][key] = row["asked"].get(key, 0) + 1
        return table

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()


def per_row_eval_losses(trainer: Trainer) -> list[tuple[float, int]]:
    """Each evaluation row's loss and label-token count, from the trainer's own eval dataloader and
    ``prediction_step`` one row at a time: what ``evaluate()`` at eval batch 1 averages."""
    batch_size, trainer.args.per_device_eval_batch_size = trainer.args.per_device_eval_batch_size, 1
    try:
        return [
            (
                trainer.prediction_step(trainer.model, batch, prediction_loss_only=True)[0].item(),
                int(targets(batch).sum()),  # the targets a causal LM's loss sees
            )
            for batch in trainer.get_eval_dataloader()
        ]
    finally:
        trainer.args.per_device_eval_batch_size = batch_size


def batched_eval_loss(rows: list[tuple[float, int]], batch_size: int) -> float:
    """The ``eval_loss`` that ``Trainer.evaluate()`` reports at ``batch_size`` if batching (and padding)
    changed no row's loss: each batch's loss is the mean over its label tokens, and evaluate() averages
    the batches weighted by their number of rows (``loss.repeat(batch_size)``)."""
    total = 0.0
    for start in range(0, len(rows), batch_size):
        batch = rows[start : start + batch_size]
        total += len(batch) * sum(loss * count for loss, count in batch) / sum(count for _, count in batch)
    return total / len(rows)


def completion_logprob(logits: torch.Tensor, ids: list[int], n_prompt: int) -> float:
    """The summed log-probability of ``ids[n_prompt:]`` under ``logits`` (one row's, aligned with ``ids``): how
    DPO scores a completion, in fp32 whatever the model's dtype."""
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    targets = torch.tensor(ids[n_prompt:], device=logits.device)
    return logprobs[n_prompt - 1 : len(ids) - 1].gather(-1, targets[:, None]).sum().item()


@torch.no_grad()
def sequence_logprobs(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, prompts: list[str], completions: list[str], mode: str
) -> list[float]:
    """Summed log-probability of each completion given its prompt, scored as DPO does (no cache).

    ``mode``: "single" (one at a time, the reference), "left" or "right" (one padded batch), or
    "padding_free" (one packed row with positions restarting at 0).
    """
    device = next(model.parameters()).device
    prompt_ids = [tokenizer(p)["input_ids"] for p in prompts]
    full = [p + tokenizer(c)["input_ids"] for p, c in zip(prompt_ids, completions)]
    if mode == "single":
        return [
            completion_logprob(
                model(input_ids=torch.tensor([ids], device=device), use_cache=False).logits[0], ids, len(p)
            )
            for ids, p in zip(full, prompt_ids)
        ]
    if mode == "padding_free":
        row = {key: value.to(device) for key, value in pack(full).items()}
        logits = model(**row, use_cache=False).logits[0]
        out, start = [], 0
        for ids, p in zip(full, prompt_ids):
            out.append(completion_logprob(logits[start : start + len(ids)], ids, len(p)))
            start += len(ids)
        return out
    if mode not in ("left", "right"):
        raise ValueError(f"unknown mode {mode!r}: choose single, left, right or padding_free")
    width = max(len(ids) for ids in full)
    rows, masks = [], []
    for ids in full:
        pad = [tokenizer.pad_token_id] * (width - len(ids))
        rows.append(pad + ids if mode == "left" else ids + pad)
        masks.append([0] * len(pad) + [1] * len(ids) if mode == "left" else [1] * len(ids) + [0] * len(pad))
    mask = torch.tensor(masks, device=device)
    # positions count real tokens only, as DPO-style scoring and generate() both do
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    logits = model(
        input_ids=torch.tensor(rows, device=device), attention_mask=mask, position_ids=positions, use_cache=False
    ).logits
    out = []
    for i, (ids, p) in enumerate(zip(full, prompt_ids)):
        offset = width - len(ids) if mode == "left" else 0
        out.append(completion_logprob(logits[i, offset : offset + len(ids)], ids, len(p)))
    return out


def scoring_check(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, prompts: list[str], completions: list[str]
) -> dict[str, float]:
    """Largest |log-prob difference| against one-at-a-time scoring, for each batching mode."""
    reference = sequence_logprobs(model, tokenizer, prompts, completions, "single")
    return {
        mode: max(
            abs(a - b) for a, b in zip(sequence_logprobs(model, tokenizer, prompts, completions, mode), reference)
        )
        for mode in SCORING_MODES
    }


@torch.no_grad()
def _generate(model, tokenizer, prompts: list[str], side: str, max_new_tokens: int):
    device = next(model.parameters()).device
    tokenizer.padding_side, previous = side, tokenizer.padding_side
    try:
        batch = tokenizer(prompts, return_tensors="pt", padding=True).to(device)
    finally:
        tokenizer.padding_side = previous
    out = model.generate(
        **batch,
        do_sample=False,
        max_new_tokens=max_new_tokens,
        output_logits=True,
        return_dict_in_generate=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    new = out.sequences[:, batch["input_ids"].shape[1] :]
    texts = [tokenizer.decode(row, skip_special_tokens=True) for row in new]
    return texts, out.logits[0].float()


def generation_check(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, prompts: list[str], max_new_tokens: int = 12
) -> dict[str, dict]:
    """Batched greedy generation (with the KV cache, as generate() does) against one prompt at a time.

    For each padding side: the first new token's largest logit shift per prompt and which outputs changed.
    """
    single = [_generate(model, tokenizer, [p], "left", max_new_tokens) for p in prompts]
    single_texts = [texts[0] for texts, _ in single]
    single_logits = torch.stack([logits[0] for _, logits in single])
    report = {"single": {"outputs": single_texts}}
    for side in ("left", "right"):
        texts, logits = _generate(model, tokenizer, prompts, side, max_new_tokens)
        report[side] = {
            "outputs": texts,
            "first_token_logit_shift": (logits - single_logits).abs().max(dim=-1).values.tolist(),
            "changed": [a != b for a, b in zip(texts, single_texts)],
        }
    return report
