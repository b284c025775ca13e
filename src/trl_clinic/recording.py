"""Trainer callbacks that record what a run really did, step by step."""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
from transformers import PrinterCallback, Trainer, TrainerCallback


class StepRecorder(TrainerCallback):
    """Per-step history of what Trainer logs, plus the raw loss it does not.

    Trainer's ``logging_nan_inf_filter`` (on by default) replaces a NaN/inf step loss before it is
    logged, so the logged loss can look healthy while the model is broken. ``watch(trainer)`` wraps
    ``trainer.training_step`` (a callback never sees the loss) and keeps the unfiltered loss of every
    optimizer step as ``raw_loss``, beside the logged ``loss``. Losses stay on the device until a log
    event, so recording adds no host sync to the training step.
    """

    def __init__(self) -> None:
        self.history: list[dict[str, float]] = []
        self._pending: list[torch.Tensor] = []  # micro-batch losses of the current optimizer step
        self._raw: dict[int, torch.Tensor] = {}

    def watch(self, trainer: Trainer) -> "StepRecorder":
        training_step = trainer.training_step

        def recorded_training_step(*args, **kwargs):
            loss = training_step(*args, **kwargs)
            self._pending.append(loss.detach())
            return loss

        trainer.training_step = recorded_training_step
        trainer.add_callback(self)
        # the recorder keeps every log row; printing them as well buries the notebook's own output
        trainer.remove_callback(PrinterCallback)
        return self

    def on_step_end(self, args, state, control, **kwargs):
        if self._pending:
            # training_step already divides each micro-batch loss for accumulation: the sum is the step's loss
            self._raw[state.global_step] = torch.stack(self._pending).sum()
            self._pending = []

    def on_log(self, args, state, control, logs=None, **kwargs):
        row = {"step": state.global_step}
        row.update({key: float(value) for key, value in (logs or {}).items() if isinstance(value, (int, float))})
        raw = self._raw.pop(state.global_step, None)
        if raw is not None:
            row["raw_loss"] = raw.item()
        # one row per step: evaluation logs at the same step join the training row
        if self.history and self.history[-1]["step"] == state.global_step:
            self.history[-1].update(row)
        else:
            self.history.append(row)

    def series(self, key: str) -> tuple[list[int], list[float]]:
        """Steps and values of one logged quantity, skipping the steps where it was not logged."""
        rows = [row for row in self.history if key in row]
        return [row["step"] for row in rows], [row[key] for row in rows]

    def last(self, key: str) -> float:
        values = self.series(key)[1]
        if not values:
            raise KeyError(f"{key!r} was never logged; logged keys: {sorted({k for r in self.history for k in r})}")
        return values[-1]

    def save(self, path: str | Path) -> None:
        # JSON has no NaN/inf: write them as strings so the file stays valid and says what happened
        def clean(value: float) -> float | str:
            return value if math.isfinite(value) else str(value)

        rows = [{key: clean(value) for key, value in row.items()} for row in self.history]
        Path(path).write_text(json.dumps(rows, indent=1))
