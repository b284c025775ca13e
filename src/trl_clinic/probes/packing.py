"""Does a model keep packed sequences apart? A check anyone can run on their own model.

Padding-free training concatenates a batch into one row with ``position_ids`` restarting at 0 for
every sequence. That is only correct when the attention kernel stops each token at its own
sequence's start. The check: the per-sequence loss of the packed row must equal the loss of the
same sequences run one at a time.

On sdpa/eager, transformers (4.53.1 and later, ``masking_utils._preprocess_mask_arguments``) finds the
boundaries in ``position_ids`` only when no attention mask and no KV cache reach the mask builder,
and only in the model families whose mask builder is given ``position_ids``: the probe can send a
mask (``all_ones_mask``) or ask for a cache (``use_cache``) to show what each does.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers import PreTrainedModel


def pack(sequences: list[list[int]]) -> dict[str, torch.Tensor]:
    """One row holding every sequence, with positions restarting at 0, like TRL's padding-free collator."""
    return {
        "input_ids": torch.tensor([[t for seq in sequences for t in seq]]),
        "position_ids": torch.tensor([[i for seq in sequences for i in range(len(seq))]]),
    }


def _token_losses(logits: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits[:-1].float(), input_ids[1:], reduction="none")


@torch.no_grad()
def packed_vs_separate(
    model: PreTrainedModel,
    sequences: list[list[int]],
    all_ones_mask: bool = False,
    use_cache: bool = False,
    tolerance: float = 1e-4,
) -> dict[str, object]:
    """Per-sequence mean loss one at a time and inside one packed row, and whether they agree.

    ``all_ones_mask=True`` sends the packed row with an attention mask of ones, as a collator that
    keeps the per-sequence masks does (TRL 0.19.0-0.23.0's padding-free collator sent one).
    ``use_cache=True`` runs the packed row with a KV cache, as a hand-written forward that leaves
    ``use_cache`` at a config default of True does (TRL's ``SFTTrainer.compute_loss`` passes False).
    ``isolated`` is True when every sequence's loss matches within ``tolerance`` (relative): the
    packed sequences did not see each other. ``ratio`` is the mean packed loss over the mean loss
    alone: how much the row's foreign context costs at these weights (1 when isolated).
    """
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    separate = []
    for seq in sequences:
        ids = torch.tensor([seq], device=device)
        separate.append(_token_losses(model(input_ids=ids, use_cache=False).logits[0], ids[0]).mean().item())
    row = {key: value.to(device) for key, value in pack(sequences).items()}
    if all_ones_mask:
        row["attention_mask"] = torch.ones_like(row["input_ids"])
    logits = model(**row, use_cache=use_cache).logits[0]
    packed, start = [], 0
    for seq in sequences:
        end = start + len(seq)
        packed.append(_token_losses(logits[start:end], row["input_ids"][0, start:end]).mean().item())
        start = end
    model.train(was_training)
    worst = max(abs(p - s) / abs(s) for p, s in zip(packed, separate))
    return {
        "separate": separate,
        "packed": packed,
        "max_relative_difference": worst,
        "isolated": worst < tolerance,
        "ratio": sum(packed) / sum(separate),
    }
