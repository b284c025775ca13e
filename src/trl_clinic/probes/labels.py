"""The label tokens a loss trains on, counted one way for the check-up, the watch and the lessons.

``IGNORE_INDEX`` marks a position without loss: it is the default ``ignore_index`` of torch's ``cross_entropy``,
and the value transformers' and TRL's collators write into ``labels`` for prompts and padding. A causal LM's
loss shifts the labels by one (position t predicts token t+1), so the first position is never a target.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

IGNORE_INDEX = -100


def targets(batch: Mapping) -> torch.Tensor | None:
    """The positions the loss trains on, one boolean each: the ``labels`` that are not ``IGNORE_INDEX`` after the
    shift by one, else the ``completion_mask`` (GRPO's batches); None for a batch with neither (a reward or
    classification loss)."""
    if "labels" in batch:
        mask = torch.zeros_like(batch["labels"], dtype=torch.bool)
        mask[..., 1:] = batch["labels"][..., 1:] != IGNORE_INDEX
        return mask
    if "completion_mask" in batch:
        return batch["completion_mask"].bool()
    return None


def label_tokens(batch: object) -> torch.Tensor | None:
    """How many label tokens the loss of a micro-batch sees (``targets``), as a tensor on the batch's device, so
    counting costs no host sync; None for a batch whose loss is not over tokens (reward pairs, GRPO's prompts,
    anything that is not a dict of tensors)."""
    if not isinstance(batch, dict):
        return None
    labels = batch.get("labels")
    if not (isinstance(labels, torch.Tensor) and labels.dim() == 2) and "completion_mask" not in batch:
        return None
    return targets(batch).sum()
