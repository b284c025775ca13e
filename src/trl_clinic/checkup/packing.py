"""Probe 1 (lesson 01): do the sequences of a packed row see each other?

Lesson 01's probe (``trl_clinic.probes.packing.packed_vs_separate``) packs sequences by hand; here the row
is the one the trainer's own collator builds, sent to the model with every key the collator gives
(mask, positions, FlashAttention's ``cu_seq_lens``), so any cause of contamination shows: the kernel,
a family whose mask ignores ``position_ids``, a cache, a mask sent with the row.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from trl_clinic.checkup.engine import Finding, Skip, probe
from trl_clinic.checkup.view import TrainerView

NOT_MODEL_INPUTS = ("labels", "completion_mask", "assistant_masks")


def sequence_spans(position_ids: torch.Tensor) -> list[tuple[int, int]]:
    """(start, end) of each sequence in a packed row: positions restart at 0 where one begins."""
    starts = (position_ids == 0).nonzero().flatten().tolist() + [len(position_ids)]
    return list(zip(starts[:-1], starts[1:]))


def _label_loss(logits: torch.Tensor, labels: torch.Tensor) -> float | None:
    """Mean next-token loss over the label tokens of one sequence (None when it has none)."""
    targets = labels[1:]
    if not (targets != -100).any():
        return None
    return F.cross_entropy(logits[:-1].float(), targets, ignore_index=-100).item()


@torch.no_grad()
def packed_vs_alone(view: TrainerView, batch: dict) -> list[tuple[float, float]]:
    """Each labelled sequence's loss inside the collator's packed row and run alone (eval mode, the
    config's cache setting as the trainer's forward leaves it)."""
    model = view.model
    model.eval()
    batch = view.to_device(batch)
    inputs = {k: v for k, v in batch.items() if k not in NOT_MODEL_INPUTS}
    logits = model(**inputs).logits
    pairs = []
    for row in range(batch["input_ids"].shape[0]):
        for start, end in sequence_spans(batch["position_ids"][row]):
            ids, labels = batch["input_ids"][row, start:end], batch["labels"][row, start:end]
            packed = _label_loss(logits[row, start:end], labels)
            if packed is None:
                continue
            alone = model(input_ids=ids[None], position_ids=torch.arange(end - start, device=ids.device)[None])
            pairs.append((packed, _label_loss(alone.logits[0], labels)))
    return pairs


@probe("packing", "01", "padding-free or packed rows whose sequences see each other: each sequence's loss inside "
       "the trainer's packed row differs from the same sequence alone (batch contamination).")
def packing(view: TrainerView) -> Finding:
    if view.kind == "grpo":
        raise Skip("GRPO builds its batches from generations, not from a collator")
    batch = view.batch(max(2, view.args.per_device_train_batch_size))
    if "position_ids" not in batch or "labels" not in batch:
        raise Skip("the collator's batch has no position_ids: rows are padded, not packed")
    pairs = packed_vs_alone(view, batch)
    if len(pairs) < 2:
        raise Skip("the collator's batch holds one sequence per row: nothing to contaminate")
    worst = max(abs(p - a) / abs(a) for p, a in pairs)
    tolerance = 2e-2 if view.half else 1e-3
    measured = f"largest relative loss change packed vs alone: {worst:.2g} over {len(pairs)} sequences"
    if worst <= tolerance:
        return Finding("packing", "ok", measured, value=worst, reason=f"within {tolerance:g}")
    attention = view.base_model.config._attn_implementation
    return Finding("packing", "fail", measured, value=worst,
                   fix=f"packed sequences see each other ({view.base_model.config.model_type}, {attention}): use "
                   "padding_free=False, or a kernel that reads sequence boundaries (attn_implementation="
                   "'flash_attention_2'), and send no attention_mask with the packed row")
