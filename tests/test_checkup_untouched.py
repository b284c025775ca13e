"""The check-up leaves the user's model, optimizer state, random generators and trainer as it found them."""

import copy
import random

import numpy as np
import pytest
import torch

from trl_clinic import checkup
from trl_clinic.course import examples


def snapshot(trainer):
    """Everything the check-up must not change, copied: weights, optimizer state, RNGs, modes, attributes."""
    model = trainer.model
    plain = {name: copy.deepcopy(value) for name, value in vars(trainer).items()
             if isinstance(value, (dict, list, int, float, str, bool, type(None)))
             or type(value).__name__ in ("TrainerState", "TrainerControl")}
    return {
        "weights": {k: v.detach().clone() for k, v in model.state_dict().items()},
        "optimizer": copy.deepcopy(trainer.optimizer.state_dict()),
        "rng": (torch.get_rng_state().clone(), random.getstate(), np.random.get_state()),
        "modes": [m.training for m in model.modules()],
        "flags": [p.requires_grad for p in model.parameters()],
        "grads": [p.grad for p in model.parameters()],
        "bound": dict(vars(trainer)),
        "plain": plain,
        "args": trainer.args.to_dict(),
    }


def same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return a.dtype == b.dtype and a.shape == b.shape and bool(torch.equal(a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, np.ndarray):
        return np.array_equal(a, b)
    return a == b


def stepped(trainer):
    """A trainer whose optimizer has state (one real step), as it is after resuming or between runs."""
    trainer.create_optimizer_and_scheduler(num_training_steps=2)
    batch = trainer._prepare_inputs(trainer.data_collator([trainer.train_dataset[i] for i in range(2)]))
    trainer.compute_loss(trainer.model, batch).backward()
    trainer.optimizer.step()
    trainer.optimizer.zero_grad(set_to_none=True)
    trainer.model.eval()  # a mode the probes switch away from
    torch.manual_seed(123)
    return trainer


@pytest.mark.parametrize("make", [
    lambda tok, out: examples.sft_trainer(tok, out, gradient_accumulation_steps=2),
    lambda tok, out: examples.sft_trainer(tok, out, family="opt", padding_free=True, max_length=None),
    lambda tok, out: examples.dpo_trainer(tok, out, gradient_accumulation_steps=2),
    lambda tok, out: examples.reward_trainer(tok, out, gradient_accumulation_steps=2),
    lambda tok, out: examples.custom_trainer(tok, out, examples.MeanLossTrainer, gradient_accumulation_steps=2),
], ids=["sft", "sft-padding-free-opt", "dpo", "reward", "custom-loss"])
def test_checkup_changes_nothing_byte_for_byte(tokenizer, tmp_path, make):
    trainer = stepped(make(tokenizer, tmp_path))
    before = snapshot(trainer)
    report = checkup(trainer, show=False)
    after = snapshot(trainer)
    assert any(f.status != "skipped" for f in report.findings)
    for key in ("weights", "optimizer", "rng", "modes", "flags", "plain", "args"):
        assert same(before[key], after[key]), key
    assert all(a is b for a, b in zip(before["grads"], after["grads"]))  # None before, None after
    assert before["bound"].keys() == after["bound"].keys()
    assert all(before["bound"][k] is after["bound"][k] for k in before["bound"])


def test_grpo_checkup_changes_nothing(tokenizer, tmp_path):
    trainer = examples.grpo_trainer(tokenizer, tmp_path)
    trainer.create_optimizer_and_scheduler(num_training_steps=2)
    torch.manual_seed(7)
    before = snapshot(trainer)
    checkup(trainer, show=False)
    after = snapshot(trainer)
    for key in ("weights", "optimizer", "rng", "modes", "flags", "plain", "args"):
        assert same(before[key], after[key]), key
