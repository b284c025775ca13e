"""Probe 1 (lesson 01): do the sequences of a packed row see each other?

The row is the one the trainer's own collator builds from the dataset's first rows, recognised as packed
by its rows (``trl_clinic.probes.batches``: several samples end to end in one row), whatever keys it
carries. It goes to the model exactly as the trainer's ``compute_loss`` sends it (the keyword arguments
are captured at the model's forward: mask, positions, ``use_cache``, FlashAttention's ``cu_seq_lens``),
in train mode with dropout off, so every cause of contamination shows: the kernel, a family whose mask
ignores ``position_ids``, a cache, a mask sent with the row. Each sequence is then run alone.

The decision is by logits, not losses: on a freshly initialised model the loss barely moves when a
sequence sees its neighbours (OPT, lesson 06's setting: loss change 1e-3, logits 0.6 apart). The first
sequence of a row has nothing before it, so its difference from running alone is the kernel's own
rounding in this dtype: measured here, it sets the floor the later sequences are compared with.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from trl_clinic.checkup.engine import Skip, probe
from trl_clinic.checkup.known_bugs import explain
from trl_clinic.checkup.step import dropout_off
from trl_clinic.checkup.view import TrainerView
from trl_clinic.probes.batches import Layout, batch_layout
from trl_clinic.probes.finding import Finding
from trl_clinic.probes.labels import IGNORE_INDEX

FLOOR_FACTOR = 4  # a later sequence must differ by more than 4x the first sequences' rounding...
ULPS = 4  # ...by more than 4 units in the last place of the dtype at the logits' scale...
# ...and by more than 64 float32 units at that scale: the kernels accumulate in float32 whatever the dtype, and over a
# packed row in another order than over the sequence alone, so a later sequence of a correct model rounds more than
# the first ones. Measured by this probe: up to 10 such units on lesson 01's Llama (16 sequences a row, seeds 0-5,
# where the first sequences' floor alone failed it at seeds 0 and 4) and about 20 on SmolLM2-135M in float32 (4 and 8
# sequences a row); OPT's contamination is 0.61 (about 6e5 units). transformers 5.23.0, torch 2.13.0, CPU sdpa.
FLOAT32_ULPS = 64


def packed_layout(view: TrainerView) -> tuple[dict, Layout]:
    """One batch of the trainer's collator (at least 2 samples) and where its sequences sit; a Skip when the
    collator pads (one sequence per row) or its rows cannot be read."""
    if view.kind == "grpo":
        raise Skip("GRPO builds its batches from generations, not from a collator")
    n = max(2, view.args.per_device_train_batch_size)
    samples = view.samples(n)
    batch = view.trainer.data_collator(samples)
    found = batch_layout(samples, batch)
    if found.kind == "unknown":
        raise Skip(f"cannot tell whether the collator packs: {found.how}")
    if not found.packed:
        if view.kind == "dpo" and getattr(view.args, "padding_free", False):
            raise Skip("DPO's padding_free packs inside its own forward, not in the collator: not measured here")
        raise Skip(f"the collator pads, it does not pack ({found.how})")
    return batch, found


def _label_loss(logits: torch.Tensor, labels: torch.Tensor | None) -> float | None:
    if labels is None or not (labels[1:] != IGNORE_INDEX).any():
        return None
    return F.cross_entropy(logits[:-1].float(), labels[1:], ignore_index=IGNORE_INDEX).item()


@torch.no_grad()
def packed_vs_alone(view: TrainerView, batch: dict, found: Layout) -> list[dict]:
    """For every sequence: its place (first in its row or not), the largest |logit difference| inside the
    trainer's packed forward against alone, and its label loss both ways."""
    model = view.model
    model.train()
    with dropout_off(model):
        inputs = view.forward_inputs(batch)
        logits = model(**inputs).logits.float()
        labels = batch.get("labels")
        pairs = []
        for row, spans in enumerate(found.spans):
            for order, (start, end) in enumerate(spans):
                ids = inputs["input_ids"][row, start:end]
                alone = (
                    model(
                        input_ids=ids[None],
                        position_ids=torch.arange(end - start, device=ids.device)[None],
                        use_cache=False,
                    )
                    .logits[0]
                    .float()
                )
                packed = logits[row, start:end]
                own = None if labels is None else labels[row, start:end].to(ids.device)
                pairs.append(
                    {
                        "first": order == 0,
                        "logits": (packed - alone).abs().max().item(),
                        "scale": alone.abs().max().item(),
                        "loss_packed": _label_loss(packed, own),
                        "loss_alone": _label_loss(alone, own),
                    }
                )
    return pairs


@probe(
    "packing",
    "01",
    "padding-free or packed rows whose sequences see each other: a later sequence's logits inside "
    "the trainer's own packed forward differ from the same sequence alone by more than the kernel's rounding "
    "(batch contamination).",
)
def packing(view: TrainerView) -> Finding:
    batch, found = packed_layout(view)
    pairs = packed_vs_alone(view, batch, found)
    later = [p for p in pairs if not p["first"]]
    floor = max(p["logits"] for p in pairs if p["first"])
    worst = max(p["logits"] for p in later)
    scale = max(p["scale"] for p in pairs)
    ulp = max(ULPS * torch.finfo(view.dtype).eps, FLOAT32_ULPS * torch.finfo(torch.float32).eps)
    tolerance = max(FLOOR_FACTOR * floor, ulp * scale)
    losses = [
        abs(p["loss_packed"] - p["loss_alone"]) / abs(p["loss_alone"])
        for p in later
        if p["loss_packed"] is not None and p["loss_alone"]
    ]
    measured = (
        f"{found.how}: later sequences' logits differ from alone by {worst:.3g} (first sequences, "
        f"rounding only: {floor:.3g}; tolerance {tolerance:.3g})"
        + (f"; label loss changes by up to {max(losses):.2g} (relative)" if losses else "")
    )
    if worst <= tolerance:
        return Finding(
            "packing", "ok", measured, value=worst, decided="measured", reason="each packed sequence sees only itself"
        )
    config = view.base_model.config
    entry = explain(view, "packing")
    cause = (
        entry["fix"]
        if entry
        else "use padding_free=False, or a kernel that reads sequence boundaries "
        "(attn_implementation='flash_attention_2'), and send position_ids with no attention_mask"
    )
    return Finding(
        "packing",
        "fail",
        measured,
        value=worst,
        decided="measured",
        known_bug=entry["id"] if entry else "",
        fix=f"packed sequences see each other ({config.model_type}, {config._attn_implementation}, "
        f"{'position_ids' if 'position_ids' in batch else 'no position_ids'}, "
        f"{'an attention_mask' if 'attention_mask' in batch else 'no attention_mask'}): {cause}",
    )
