"""What the probes read from a trainer, and the guard that leaves the trainer as it found it.

The probes see the trainer's real model, collator, dataset and arguments. Batches are built the way
``Trainer._get_dataloader`` builds them (unused columns removed, then the trainer's own collator),
from the dataset's first rows, without a DataLoader: ``get_train_dataloader`` would register the
loader with the accelerator, a change to the trainer.
"""

from __future__ import annotations

import copy
import random
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import torch
from transformers import PreTrainedModel, Trainer

from trl_clinic.checkup.engine import Skip

KINDS = {"SFTTrainer": "sft", "DPOTrainer": "dpo", "RewardTrainer": "reward", "GRPOTrainer": "grpo"}


def trainer_kind(trainer: Trainer) -> str:
    """sft, dpo, reward or grpo for TRL's trainers (and subclasses of them), else "trainer"."""
    return next((KINDS[c.__name__] for c in type(trainer).__mro__ if c.__name__ in KINDS), "trainer")


def _rng_state() -> dict[str, object]:
    state = {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict[str, object]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    if "cuda" in state:
        torch.cuda.set_rng_state_all(state["cuda"])


PLAIN = (int, float, str, bool, type(None))


def _plain(value: object, depth: int = 0) -> bool:
    """Numbers, strings and containers of them (a trainer's metrics, counters, logs): safe to copy and refill.
    A container holding a model, a tensor or a tokenizer is not: refilling it would swap the user's objects."""
    if isinstance(value, PLAIN):
        return True
    if depth > 6:
        return False
    if isinstance(value, dict):
        return all(_plain(k, depth + 1) and _plain(v, depth + 1) for k, v in value.items())
    if isinstance(value, (list, tuple, set)):
        return all(_plain(v, depth + 1) for v in value)
    return False


def _contents(value: object) -> object | None:
    """A copy of what a probe might change in place (plain containers, the Trainer's state objects), else None."""
    small_state = type(value).__name__ in ("TrainerState", "TrainerControl")
    if (isinstance(value, (dict, list, set)) and _plain(value)) or small_state:
        return copy.deepcopy(value)
    return None


def _refill(target: object, saved: object) -> None:
    if isinstance(target, dict):
        target.clear()
        target.update(saved)
    elif isinstance(target, list):
        target[:] = saved
    elif isinstance(target, set):
        target.clear()
        target |= saved
    else:
        vars(target).clear()
        vars(target).update(vars(saved))


@contextmanager
def untouched(trainer: Trainer) -> Iterator[None]:
    """Run probes and leave the model's modes, flags and gradients, the RNGs and the trainer's attributes
    as they were. Probes never step the optimizer; the weights are compared in the tests."""
    model = trainer.model
    rng = _rng_state()
    modes = {module: module.training for module in model.modules()}
    params = list(model.parameters())
    flags = [p.requires_grad for p in params]
    grads = [None if p.grad is None else p.grad.detach().clone() for p in params]
    attributes = dict(vars(trainer))
    contents = {name: _contents(value) for name, value in attributes.items()}
    try:
        yield
    finally:
        for p, flag, grad in zip(params, flags, grads):
            p.requires_grad_(flag)
            p.grad = grad
        for module, training in modes.items():
            module.training = training
        for name in set(vars(trainer)) - set(attributes):
            delattr(trainer, name)
        for name, value in attributes.items():
            setattr(trainer, name, value)
            if contents[name] is not None:
                _refill(value, contents[name])
        _set_rng_state(rng)


@dataclass
class TrainerView:
    """The trainer as the probes see it."""

    trainer: Trainer

    @property
    def args(self):
        return self.trainer.args

    @property
    def kind(self) -> str:
        return trainer_kind(self.trainer)

    @property
    def model(self) -> PreTrainedModel:
        return self.trainer.model

    @property
    def base_model(self) -> PreTrainedModel:
        """The transformers model under a PEFT wrapper, if any."""
        model = self.model
        return model.get_base_model() if hasattr(model, "get_base_model") else model

    @property
    def tokenizer(self):
        processing = self.trainer.processing_class
        return getattr(processing, "tokenizer", processing)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def half(self) -> bool:
        """Whether the model computes in 16 bits (its weights or the trainer's autocast)."""
        dtype = next(self.model.parameters()).dtype
        return dtype in (torch.float16, torch.bfloat16) or bool(self.args.bf16 or self.args.fp16)

    @cached_property
    def rows(self):
        """The training set after the trainer's own preprocessing, with the columns its collator gets."""
        dataset = self.trainer.train_dataset
        if dataset is None:
            raise Skip("the trainer has no train_dataset")
        if not hasattr(dataset, "select"):
            raise Skip("the train_dataset is not a datasets.Dataset (an iterable dataset is not read ahead)")
        if self.kind == "grpo":
            return dataset
        return self.trainer._remove_unused_columns(dataset, description="training")

    def samples(self, n: int, start: int = 0) -> list[dict]:
        rows = self.rows
        if len(rows) < start + n:
            raise Skip(f"the training set has {len(rows)} rows; this probe needs {start + n}")
        return [rows[i] for i in range(start, start + n)]

    def batch(self, n: int | None = None, start: int = 0) -> dict:
        """One batch from the trainer's own collator: ``n`` rows (the per-device batch size by default)."""
        n = n or self.args.per_device_train_batch_size
        return self.trainer.data_collator(self.samples(n, start))

    def to_device(self, batch: dict) -> dict:
        return {k: v.to(self.device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
