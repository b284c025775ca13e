"""What a collator did with the samples it was given: one sequence per row (padded) or several (packed).

Recognised by the rows themselves, not by which keys the batch has: TRL 0.19.0-0.23.0's padding-free
collator on sdpa/eager sends a packed row with an all-ones ``attention_mask`` and no ``position_ids``
(trl 0.21.0 sft_trainer.py, ``return_position_ids`` is set only for FlashAttention), TRL 0.14's sends
``position_ids`` and no mask, a padded batch may carry ``position_ids`` too. Each sample's tokens are
found in the batch's rows, in order: a row that holds two or more samples end to end is packed. Where
the batch also restarts ``position_ids`` inside one sample (a dataset packed beforehand), that sample is
split there as well.

Small and torch-light on purpose: the check-up reads batches with it, and the watch finds packed rows' starts
with its ``restarts``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch


@dataclass
class Layout:
    """Where each sequence sits: ``spans[row]`` lists the (start, end) columns of every sequence in that row."""

    kind: str  # "packed" (some row holds several sequences), "padded" (one per row) or "unknown"
    spans: list[list[tuple[int, int]]] = field(default_factory=list)
    how: str = ""  # one line: how the layout was recognised, or why it could not be

    @property
    def packed(self) -> bool:
        return self.kind == "packed"


def _find(row: list[int], tokens: list[int], start: int) -> int:
    """The first column >= ``start`` where ``tokens`` appear in ``row``, or -1."""
    n, column = len(tokens), start
    while column <= len(row) - n:
        try:
            column = row.index(tokens[0], column, len(row) - n + 1)
        except ValueError:
            return -1
        if row[column : column + n] == tokens:
            return column
        column += 1
    return -1


def restarts(positions: torch.Tensor) -> list[int]:
    """Columns of one row where a later sequence starts: its positions restart at 0 after column 0."""
    return (positions[1:] == 0).nonzero().flatten().add(1).tolist()


def _restarts(position_ids: torch.Tensor | None, row: int, start: int, end: int) -> list[int]:
    """Columns strictly inside (start, end) where the batch's positions restart at 0."""
    if position_ids is None:
        return []
    return [start + column for column in restarts(position_ids[0 if position_ids.shape[0] == 1 else row, start:end])]


def layout(
    samples: Sequence[Sequence[int]], input_ids: torch.Tensor, position_ids: torch.Tensor | None = None
) -> Layout:
    """Where the collator put each of ``samples`` (their ``input_ids``, in the order given) in ``input_ids``.

    A sample's tokens are looked for in the current row after the previous sample, else at the start of
    the next row (padding on either side is skipped over). A sample that is not found (the collator
    truncated or rewrote it) gives ``kind="unknown"`` with the reason: the caller says it cannot tell,
    it never guesses.
    """
    rows = input_ids.tolist()
    spans: list[list[tuple[int, int]]] = [[] for _ in rows]
    row, column = 0, 0
    for index, sample in enumerate(samples):
        tokens = list(sample)
        if not tokens:
            continue
        found = _find(rows[row], tokens, column) if row < len(rows) else -1
        while found < 0 and row + 1 < len(rows):
            row, column = row + 1, 0
            found = _find(rows[row], tokens, 0)
        if found < 0:
            return Layout(
                "unknown",
                how=f"sample {index}'s {len(tokens)} tokens are not in the collator's batch "
                "(truncated or rewritten by the collator)",
            )
        end = found + len(tokens)
        cuts = [found, *_restarts(position_ids, row, found, end), end]
        spans[row] += list(zip(cuts[:-1], cuts[1:]))
        column = end
    if not any(spans):
        return Layout("unknown", how="no sample has tokens")
    most = max(len(row) for row in spans)
    if most > 1:
        return Layout(
            "packed", spans, how=f"{len(samples)} samples in {len(rows)} row(s), up to {most} sequences in one row"
        )
    return Layout("padded", spans, how=f"{len(samples)} samples in {len(rows)} rows, one sequence per row")


def batch_layout(samples: Sequence[dict], batch: dict) -> Layout:
    """``layout`` of a collator's ``batch`` built from ``samples`` (dataset rows with ``input_ids``)."""
    if "input_ids" not in batch or not all("input_ids" in sample for sample in samples):
        return Layout("unknown", how="the samples or the batch have no input_ids (a paired or multimodal batch)")
    return layout([sample["input_ids"] for sample in samples], batch["input_ids"], batch.get("position_ids"))
