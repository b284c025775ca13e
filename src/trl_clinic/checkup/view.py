"""What the probes read from a trainer, and the guard that leaves the trainer as it found it.

The probes see the trainer's real model, collator, dataset and arguments. Batches are built the way
``Trainer._get_dataloader`` builds them (unused columns removed, then the trainer's own collator),
from the dataset's first rows, without a DataLoader: ``get_train_dataloader`` would register the
loader with the accelerator, a change to the trainer.

Written against the transformers Trainer of 4.40.2 to 5.23.0 (the versions the check-up is run on):
where an attribute moved (``processing_class`` was ``tokenizer`` before transformers 4.46), the view
reads whichever the installed version has.
"""

from __future__ import annotations

import copy
import random
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np
import torch
from torch import nn
from transformers import PreTrainedModel, Trainer

from trl_clinic.checkup.engine import Skip
from trl_clinic.checkup.sharded import gathered
from trl_clinic.probes.command import TRAINERS

KINDS = {trainer: kind for kind, trainer in TRAINERS.items()}  # TRL's trainer class names, and their kind
# keys of a batch the model's forward never takes (the trainer's loss reads them), and TRL's own forward flags
NOT_MODEL_INPUTS = (
    "labels",
    "completion_mask",
    "assistant_masks",
    "fused_lm_head",
    "num_items_in_batch",
    "logits_to_keep",
    "return_dict",
)


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
    """Numbers, strings and containers of them (a trainer's metrics, counters, logs): safe to deep-copy."""
    if isinstance(value, PLAIN):
        return True
    if depth > 6:
        return False
    if isinstance(value, dict):
        return all(_plain(k, depth + 1) and _plain(v, depth + 1) for k, v in value.items())
    if isinstance(value, (list, tuple, set, deque)):  # GRPO keeps its logged completions in deques
        return all(_plain(v, depth + 1) for v in value)
    return False


def _contents(value: object) -> object | None:
    """What a probe might change in place, copied: plain containers and the Trainer's state objects deeply,
    other lists, dicts and sets shallowly (their members are the user's objects: a model, a dataloader the
    accelerator keeps; putting the same members back must not copy them). None for anything else."""
    if type(value).__name__ in ("TrainerState", "TrainerControl") or (
        isinstance(value, (dict, list, set, deque)) and _plain(value)
    ):
        return copy.deepcopy(value)
    if isinstance(value, (dict, list, set, deque)):
        return copy.copy(value)
    return None


def _refill(target: object, saved: object) -> None:
    if isinstance(target, dict):
        target.clear()
        target.update(saved)
    elif isinstance(target, (list, deque)):
        target.clear()
        target.extend(saved)
    elif isinstance(target, set):
        target.clear()
        target |= saved
    else:
        vars(target).clear()
        vars(target).update(vars(saved))


@dataclass
class _Attributes:
    """An object's attributes as they were: which object each name was bound to, and the contents of those
    a probe could change in place. Restored through ``vars()``, past any ``__setattr__`` (a config's
    attribute map, a frozen dataclass), so restoring changes nothing else."""

    target: object
    bound: dict[str, object] = field(init=False)
    contents: dict[str, object] = field(init=False)

    def __post_init__(self) -> None:
        self.bound = dict(vars(self.target))
        self.contents = {name: _contents(value) for name, value in self.bound.items()}

    def restore(self) -> None:
        now = vars(self.target)
        for name in set(now) - set(self.bound):
            del now[name]
        for name, value in self.bound.items():
            if now.get(name, _Attributes) is not value:
                now[name] = value
            if self.contents[name] is not None:
                _refill(value, self.contents[name])


def _modules(trainer: Trainer) -> list[nn.Module]:
    """Every model the trainer holds (the policy, a reference or reward model), each once."""
    found: dict[int, nn.Module] = {}
    for value in vars(trainer).values():
        if isinstance(value, nn.Module):
            found.setdefault(id(value), value)
    return list(found.values())


def _configs(modules: list[nn.Module]) -> list[object]:
    """The models' configs, their sub-configs one level down, and their generation configs."""
    found: dict[int, object] = {}
    for module in modules:
        for model in module.modules():
            for name in ("config", "generation_config"):
                config = getattr(model, name, None)
                if config is not None and hasattr(config, "to_dict"):
                    found.setdefault(id(config), config)
                    for value in vars(config).values():
                        if hasattr(value, "to_dict") and hasattr(value, "model_type"):
                            found.setdefault(id(value), value)
    return list(found.values())


def _tokenizers(trainer: Trainer) -> list[object]:
    processing = getattr(trainer, "processing_class", None) or getattr(trainer, "tokenizer", None)
    return [t for t in (processing, getattr(processing, "tokenizer", None)) if t is not None]


def _accelerator_parts(trainer: Trainer) -> list[object]:
    accelerator = getattr(trainer, "accelerator", None)
    if accelerator is None:
        return []
    return [part for part in (accelerator, getattr(accelerator, "gradient_state", None)) if part is not None]


@contextmanager
def untouched(trainer: Trainer, budget: int = 1 << 30) -> Iterator[None]:
    """Run probes and leave everything they could change as it was: the random generators, grad mode, every
    model's train/eval modes, ``requires_grad`` flags, gradients and buffers, the models' configs and
    generation configs, the trainer's, its arguments', its accelerator's (and gradient state's) and its
    tokenizer's attributes (the padding side among them). Probes never step the optimizer and never write
    weights; the tests compare the weights byte for byte. Weights held sharded before ``train()`` (DeepSpeed ZeRO-3's
    partitions, FSDP2's shards) are whole inside, within ``budget`` (``checkup.step.DEFAULT_BUDGET``), and sharded
    again before anything is restored (``checkup.sharded.gathered``)."""
    rng, grad_mode = _rng_state(), torch.is_grad_enabled()
    modules = _modules(trainer)
    modes = [(m, m.training) for module in modules for m in module.modules()]
    params = list({id(p): p for module in modules for p in module.parameters()}.values())
    flags = [p.requires_grad for p in params]
    grads = [p.grad for p in params]
    grad_values = [None if g is None else g.detach().clone() for g in grads]
    buffers = [
        (owner, name, tensor, tensor.detach().clone())
        for module in modules
        for owner in module.modules()
        for name, tensor in owner.named_buffers(recurse=False)
    ]
    saved = [
        _Attributes(part)
        for part in (trainer, trainer.args, *_accelerator_parts(trainer), *_tokenizers(trainer), *_configs(modules))
    ]
    try:
        with gathered(modules, budget):
            yield
    finally:
        for p, flag, grad, value in zip(params, flags, grads, grad_values):
            p.requires_grad_(flag)
            if grad is not None:
                grad.copy_(value)  # the same tensor object, with its values
            p.grad = grad
        for owner, name, tensor, value in buffers:
            if owner._buffers.get(name) is not tensor:
                owner._buffers[name] = tensor
            if not torch.equal(tensor, value):
                tensor.copy_(value)
        for module, training in modes:
            module.training = training
        for part in saved:
            part.restore()
        torch.set_grad_enabled(grad_mode)
        _set_rng_state(rng)


class _Captured(Exception):
    def __init__(self, kwargs: dict) -> None:
        super().__init__("forward captured")
        self.kwargs = kwargs


@dataclass
class TrainerView:
    """The trainer as the probes see it."""

    trainer: Trainer
    budget: int = 1 << 30  # bytes a probe may hold beyond what training holds (checkup.step.DEFAULT_BUDGET)
    probes: frozenset[str] | None = None  # the probes this check-up runs (None: all): first_step's live readers

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
        """The tokenizer (``processing_class`` since transformers 4.46, ``tokenizer`` before)."""
        tokenizers = _tokenizers(self.trainer)
        return tokenizers[-1] if tokenizers else None

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        """The dtype the model computes in: bfloat16/float16 under the trainer's autocast, else its weights'."""
        if getattr(self.args, "bf16", False):
            return torch.bfloat16
        if getattr(self.args, "fp16", False):
            return torch.float16
        return next(self.model.parameters()).dtype

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

    @cached_property
    def grpo_batch_counts_prompts(self) -> bool:
        """Whether GRPO's per-device batch counts prompts, each given ``num_generations`` completions inside the
        loss: trl 0.14.0 (grpo_trainer.py, compute_loss; no sampler of its own). From 0.15.0 it counts
        completions, the global batch divided by ``num_generations`` (grpo_trainer.py:341-350)."""
        from importlib.metadata import version

        from packaging.version import Version

        return Version(version("trl")) < Version("0.15.0")

    def grpo_prompts(self, most: int) -> list[dict]:
        """The first prompts of one GRPO generation batch (at least one, at most ``most``): its completions,
        ``generation_batch_size`` (per-device batch by default), come ``num_generations`` to a prompt; on trl 0.14.0
        the per-device batch is prompts."""
        size = getattr(self.args, "generation_batch_size", None) or self.args.per_device_train_batch_size
        prompts = size if self.grpo_batch_counts_prompts else size // self.args.num_generations
        return self.samples(max(1, min(most, prompts)))

    def batches(self, most: int) -> list[dict]:
        """The first ``most`` batches of the trainer's own dataloader (``get_train_dataloader``): its dataset of any
        type, its sampler, its collator and, under several processes, this process's shard; what its first
        optimizer step will read (the random generators are restored after the check-up). The accelerator's
        record of the loader is undone by ``untouched``."""
        loader = self.trainer.get_train_dataloader()
        return [batch for batch, _ in zip(loader, range(most))]

    def batch(self, n: int | None = None, start: int = 0) -> dict:
        """One batch of ``n`` rows (the per-device batch size by default) from ``start``, in the dataset's order,
        through the trainer's own collator; for a dataset that is not a ``datasets.Dataset``, the first batch of the
        trainer's dataloader."""
        b = self.args.per_device_train_batch_size
        n = n or b
        try:
            return self.trainer.data_collator(self.samples(n, start))
        except Skip:
            if n != b or start:
                raise
        (first,) = self.batches(1) or [None]
        if first is None:
            raise Skip("the trainer's dataloader gave no batch")
        return first

    @cached_property
    def step(self):
        """The first optimizer step's window through ``training_step`` (``checkup.step.first_step``), shared."""
        if self.kind == "grpo":
            raise Skip("GRPO's loss needs its own generations, not a collated batch")
        from trl_clinic.checkup.step import first_step

        return first_step(self, self.budget)

    def checkpointing(self):
        """The activation checkpointing ``train()`` would turn on, on while a probe trains."""
        from trl_clinic.checkup.step import trainer_checkpointing

        return trainer_checkpointing(self)

    def to_device(self, batch: dict) -> dict:
        return {k: v.to(self.device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}

    def forward_inputs(self, batch: dict) -> dict:
        """The keyword arguments the trainer's own ``compute_loss`` passes to the model for ``batch`` (its
        ``use_cache``, mask, positions...), captured at the model's first forward, which is then cut short.
        Without the loss-only keys (``NOT_MODEL_INPUTS``), so the model returns its logits."""

        def capture(module, args, kwargs):
            raise _Captured(dict(kwargs, **dict(zip(("input_ids",), args))))

        handle = self.model.register_forward_pre_hook(capture, with_kwargs=True)
        try:
            with self.trainer.compute_loss_context_manager():
                self.trainer.compute_loss(self.model, self.to_device(dict(batch)))
        except _Captured as captured:
            return {k: v for k, v in captured.kwargs.items() if k not in NOT_MODEL_INPUTS}
        finally:
            handle.remove()
        raise RuntimeError(f"{type(self.trainer).__name__}.compute_loss returned without calling the model")
