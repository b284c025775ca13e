"""The check-up leaves the user's trainer as it found it: weights, optimizer state, random generators, modes,
flags, gradients, buffers, configs, the tokenizer's padding side, the accelerator and the trainer's attributes.

Two ways: the whole check-up on real trainers whose probes are asserted to have run (not skipped), compared
byte for byte; and a probe that changes each of those on purpose, which ``untouched`` must undo.
"""

import copy
import random

import numpy as np
import pytest
import torch

from trl_clinic import checkup
from trl_clinic.checkup.engine import Probe, run_probe
from trl_clinic.checkup.view import TrainerView, untouched
from trl_clinic.course import examples, stand_ins


def snapshot(trainer):
    """Everything the check-up must not change, copied."""
    model = trainer.model
    plain = {
        name: copy.deepcopy(value)
        for name, value in vars(trainer).items()
        if isinstance(value, (dict, list, int, float, str, bool, type(None)))
        or type(value).__name__ in ("TrainerState", "TrainerControl")
    }
    tokenizer = trainer.processing_class
    return {
        "weights": {k: v.detach().clone() for k, v in model.state_dict().items()},
        "buffers": {k: v.detach().clone() for k, v in model.named_buffers()},
        "optimizer": copy.deepcopy(trainer.optimizer.state_dict()),
        "rng": (torch.get_rng_state().clone(), random.getstate(), np.random.get_state()),
        "modes": [m.training for m in model.modules()],
        "flags": [p.requires_grad for p in model.parameters()],
        "grads": [p.grad for p in model.parameters()],
        "config": model.config.to_dict(),
        "generation_config": getattr(model, "generation_config", None) and model.generation_config.to_dict(),
        "padding_side": getattr(tokenizer, "padding_side", None),
        "accelerator": (
            trainer.accelerator.gradient_accumulation_steps,
            trainer.accelerator.step,
            list(trainer.accelerator._models),
            list(trainer.accelerator._dataloaders),
        ),
        "bound": dict(vars(trainer)),
        "plain": plain,
        "args": trainer.args.to_dict(),
        "grad_mode": torch.is_grad_enabled(),
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
    return a == b or a is b


COMPARED = (
    "weights",
    "buffers",
    "optimizer",
    "rng",
    "modes",
    "flags",
    "plain",
    "args",
    "config",
    "generation_config",
    "padding_side",
    "accelerator",
    "grad_mode",
)


def stepped(trainer):
    """A trainer whose optimizer has state (one real step) and whose model holds gradients, as it is between
    runs; in eval mode, a mode the probes switch away from."""
    trainer.create_optimizer_and_scheduler(num_training_steps=2)
    batch = trainer._prepare_inputs(trainer.data_collator([trainer.train_dataset[i] for i in range(2)]))
    trainer.compute_loss(trainer.model, batch).backward()
    trainer.optimizer.step()
    trainer.model.eval()
    torch.manual_seed(123)
    return trainer


def assert_unchanged(before, after):
    for key in COMPARED:
        assert same(before[key], after[key]), key
    assert all(a is b for a, b in zip(before["grads"], after["grads"]))  # the same gradient tensors...
    assert before["bound"].keys() == after["bound"].keys()
    assert all(before["bound"][k] is after["bound"][k] for k in before["bound"])


# each trainer, and the probes that must have run on it (ok/warn/fail, not skipped nor crashed)
CASES = {
    "sft": (
        lambda tok, out: examples.sft_trainer(tok, out, gradient_accumulation_steps=2),
        {"accumulation", "fp16_adamw", "padding_cache", "labels_present", "eos_label", "gradients_reach", "known_bugs"},
    ),
    "sft-padding-free-opt": (
        lambda tok, out: examples.sft_trainer(
            tok, out, family="opt", padding_free=True, max_length=None, gradient_accumulation_steps=2
        ),
        {"packing", "accumulation", "padding_cache", "gradients_reach"},
    ),
    "dpo": (
        lambda tok, out: examples.dpo_trainer(tok, out, gradient_accumulation_steps=2),
        {"accumulation", "padding_cache", "gradients_reach"},
    ),
    "reward": (
        lambda tok, out: examples.reward_trainer(tok, out, gradient_accumulation_steps=2),
        {"accumulation", "reward_head", "padding_cache", "gradients_reach"},
    ),
    "custom-loss": (
        lambda tok, out: examples.custom_trainer(tok, out, stand_ins.MeanLossTrainer, gradient_accumulation_steps=2),
        {"accumulation", "padding_cache", "labels_present", "gradients_reach"},
    ),
}


@pytest.mark.parametrize("case", CASES)
def test_checkup_changes_nothing_byte_for_byte(tokenizer, tmp_path, case):
    make, ran = CASES[case]
    trainer = stepped(make(tokenizer, tmp_path))
    before = snapshot(trainer)
    report = checkup(trainer, show=False)
    assert_unchanged(before, snapshot(trainer))
    measured = {f.probe for f in report.findings if f.status in ("ok", "warn", "fail")}
    assert ran <= measured, f"did not run: {ran - measured}; {report.to_json()}"
    assert not report.errors, report.to_json()


def test_grpo_checkup_changes_nothing_and_its_probes_ran(tokenizer, tmp_path):
    trainer = examples.grpo_trainer(tokenizer, tmp_path, reward=examples.length_reward)
    trainer.create_optimizer_and_scheduler(num_training_steps=2)
    torch.manual_seed(7)
    before = snapshot(trainer)
    report = checkup(trainer, show=False)
    assert_unchanged(before, snapshot(trainer))
    assert {f.probe: f.status for f in report.findings if f.probe in ("equal_rewards", "padding_cache")} == {
        "equal_rewards": "ok",
        "padding_cache": "ok",
    }
    assert not report.errors, report.to_json()


def meddle(view):
    """A probe gone wrong: it changes every kind of state `untouched` covers, then crashes."""
    trainer, model = view.trainer, view.model
    rotary = next(m for m in model.modules() if "inv_freq" in m._buffers)
    rotary.inv_freq.mul_(2)  # a buffer changed in place
    rotary.register_buffer("inv_freq", torch.zeros(3), persistent=False)  # and one replaced
    model.config.use_cache = not model.config.use_cache
    model.config._attn_implementation = "eager"
    model.config.invented = 1
    model.generation_config.max_length = 3
    params = list(model.parameters())
    params[0].requires_grad_(False)
    params[1].grad.add_(1.0)  # a gradient changed in place
    params[2].grad = None
    model.train()
    view.tokenizer.padding_side = "left"
    trainer.accelerator.gradient_accumulation_steps = 7
    trainer.accelerator.step = 5
    trainer.accelerator._models.append(torch.nn.Linear(1, 1))
    trainer.args.gradient_accumulation_steps = 9
    trainer.invented = "new"
    trainer.state.global_step = 11
    torch.set_grad_enabled(False)
    torch.rand(3), random.random(), np.random.rand()
    raise RuntimeError("the probe crashed after meddling")


def test_untouched_undoes_every_change_a_probe_makes_even_when_it_crashes(tokenizer, tmp_path):
    trainer = stepped(examples.sft_trainer(tokenizer, tmp_path, gradient_accumulation_steps=2))
    before = snapshot(trainer)
    view = TrainerView(trainer)
    with untouched(trainer):
        (finding,) = run_probe(Probe("meddler", "-", "", meddle), view)
    assert finding.status == "error" and "crashed after meddling" in finding.reason
    after = snapshot(trainer)
    assert_unchanged(before, after)
    assert not hasattr(trainer, "invented") and not hasattr(trainer.model.config, "invented")
    assert trainer.args.gradient_accumulation_steps == 2 and trainer.model.config._attn_implementation == "sdpa"
