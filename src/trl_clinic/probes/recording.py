"""Trainer callbacks that record what a run really did, step by step."""

from __future__ import annotations

import json
import math
import weakref
from collections.abc import Callable, Mapping
from pathlib import Path

import torch
from transformers import PrinterCallback, Trainer, TrainerCallback

from trl_clinic.probes.jsonable import json_safe


def quiet(trainer: Trainer) -> Trainer:
    """Without progress bars (``trl-clinic run``, sweeps) Trainer prints every log row, and the final
    train metrics, as a raw dict that buries the notebook's own one-line summaries."""
    trainer.remove_callback(PrinterCallback)
    return trainer


def tap_training_step(trainer: Trainer, listener: Callable[[torch.Tensor, object, object], None]) -> Callable[[], None]:
    """Show ``listener(loss, inputs, num_items_in_batch)`` every micro-batch the trainer trains on, with the
    loss ``training_step`` returned (detached), changing neither; returns the function that undoes the tap.

    A callback never sees the loss: transformers 5.23 ``Trainer._run_epoch`` keeps it in a local
    (``tr_loss_step``), so the instance's ``training_step`` is wrapped. ``_run_epoch`` looks the method up
    on every micro-batch, so a tap put in place at ``on_train_begin`` applies from the first step.
    ``inputs`` is a shallow copy of the batch as the dataloader gave it (a ``compute_loss`` that pops
    ``labels`` leaves the copy whole); GRPO's is its list of prompts, generated from inside the step.

    Neither the tap nor its undo holds the trainer: the tap calls the class's ``training_step`` on the instance it
    is called on (a bound method kept here would hold the trainer in a cycle through its own attribute), and the
    undo holds it weakly, so a trainer whose run ended in an exception before the tap was undone, or whose caller
    keeps the undo (the watch does), is freed when its last user reference goes, not at a collection.
    """
    own = vars(trainer).get("training_step")  # an instance attribute of the user's own, put back by undo
    step = own if own is not None else type(trainer).training_step
    bound = own is not None  # the user's attribute is called as it is; the class's function with the trainer
    owner = weakref.ref(trainer)

    def tapped(model, inputs, *args, **kwargs):
        seen = dict(inputs) if isinstance(inputs, Mapping) else inputs
        loss = step(model, inputs, *args, **kwargs) if bound else step(owner(), model, inputs, *args, **kwargs)
        listener(loss.detach(), seen, args[0] if args else kwargs.get("num_items_in_batch"))
        return loss

    def undo() -> None:
        tapped_trainer = owner()
        if tapped_trainer is None:
            return
        if own is not None:
            tapped_trainer.training_step = own
        else:
            vars(tapped_trainer).pop("training_step", None)

    trainer.training_step = tapped
    return undo


class StepRecorder(TrainerCallback):
    """One row per optimizer step: the raw loss of every step, and what Trainer logged at that step.

    Trainer's ``logging_nan_inf_filter`` (on by default) replaces a NaN/inf step loss before it is
    logged, so the logged loss can look healthy while the model is broken. ``watch(trainer)`` wraps
    ``trainer.training_step`` (a callback never sees the loss) and keeps the unfiltered loss of every
    optimizer step as ``raw_loss``, beside the logged ``loss``. Losses stay on the device until a log
    event, so recording adds no host sync to the training step.
    """

    def __init__(self) -> None:
        self.history: list[dict[str, float]] = []
        self._pending: list[torch.Tensor] = []  # micro-batch losses of the current optimizer step
        self._raw: list[tuple[int, torch.Tensor]] = []  # (step, loss) not yet moved to the host

    def watch(self, trainer: Trainer) -> StepRecorder:
        tap_training_step(trainer, lambda loss, inputs, num_items_in_batch: self._pending.append(loss))
        trainer.add_callback(self)
        quiet(trainer)  # the recorder keeps every log row
        return self

    def _row(self, step: int) -> dict[str, float]:
        if not self.history or self.history[-1]["step"] < step:
            self.history.append({"step": step})
        return next(row for row in reversed(self.history) if row["step"] == step)

    def _flush(self) -> None:
        if self._raw:
            values = torch.stack([loss for _, loss in self._raw]).tolist()  # one host sync for all of them
            for (step, _), value in zip(self._raw, values):
                self._row(step)["raw_loss"] = value
            self._raw = []

    def on_step_end(self, args, state, control, **kwargs):
        if self._pending:
            # training_step already divides each micro-batch loss for accumulation: the sum is the step's loss
            self._raw.append((state.global_step, torch.stack(self._pending).sum()))
            self._pending = []

    def on_log(self, args, state, control, logs=None, **kwargs):
        self._flush()
        row = self._row(state.global_step)
        row.update({key: float(value) for key, value in (logs or {}).items() if isinstance(value, (int, float))})

    def on_train_end(self, args, state, control, **kwargs):
        self._flush()

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
        # JSON has no NaN/inf: json_safe writes them as strings, so the file stays valid and says what happened
        Path(path).write_text(json.dumps(json_safe(self.history), indent=1))


def replay_nan_filter(step_losses: list[float], accumulation: int, logging_steps: int) -> list[float]:
    """What Trainer logs every ``logging_steps`` optimizer steps, replayed from each step's raw loss.

    With ``logging_nan_inf_filter=True`` (the default) ``Trainer._run_epoch`` (transformers 5.23.0;
    ``_inner_training_loop`` in 4.46.2 and 4.55.4) adds, for a non-finite micro-batch loss,
    ``running_sum / (1 + global_step - last_logged_step)`` instead of the loss; a log divides the running
    sum by the steps since the last log and restarts it at 0. This replays that arithmetic micro-batch by
    micro-batch, so a lesson can show that the logged numbers follow from the raw ones. A finite step counts
    as ``accumulation`` equal parts of its raw loss, a non-finite step as ``accumulation`` non-finite
    micro-batches.
    """
    logged, running, last_logged = [], 0.0, 0
    for step, loss in enumerate(step_losses, start=1):
        for _ in range(accumulation):
            # during optimizer step `step`, Trainer's global_step is still step - 1
            running += loss / accumulation if math.isfinite(loss) else running / (1 + (step - 1) - last_logged)
        if step % logging_steps == 0:
            logged.append(running / (step - last_logged))
            running, last_logged = 0.0, step
    return logged
