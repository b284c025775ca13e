"""The check-up leaves the user's trainer as it found it: every model's weights, buffers, modes, flags and
gradients (the policy, DPO's reference and GRPO's), the optimizer state, the random generators, the configs,
the tokenizer's padding side, the accelerator, the trainer's state, arguments and attributes.

Two ways: the whole check-up on real trainers whose probes are asserted to have run (not skipped), compared
bit for bit (NaN-safe: the bytes, not the values); and a probe that changes each of those on purpose, which
``untouched`` must undo.
"""

import copy
import random

import numpy as np
import pytest
import torch
from torch import nn

from trl_clinic import checkup
from trl_clinic.checkup.engine import Probe, run_probe
from trl_clinic.checkup.view import TrainerView, untouched
from trl_clinic.course import examples, stand_ins
from trl_clinic.course.data import reward_prompts
from trl_clinic.course.models import make_causal_lm


def bits(tensor: torch.Tensor) -> tuple:
    """A tensor's dtype, shape and bytes, copied: equal bytes are equal bits, NaN payloads and -0.0 included."""
    flat = tensor.detach().cpu().contiguous().reshape(-1)
    return tensor.dtype, tuple(tensor.shape), flat.view(torch.uint8).clone()


def frozen(value):
    """``value`` with every tensor replaced by its bits, containers walked (an optimizer's state, RNG states)."""
    if isinstance(value, torch.Tensor):
        return bits(value)
    if isinstance(value, dict):
        return {k: frozen(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(frozen(v) for v in value)
    if isinstance(value, np.ndarray):
        return ("ndarray", value.dtype.str, value.shape, value.tobytes())
    return copy.deepcopy(value)


def models(trainer) -> dict[str, nn.Module]:
    """Every model the trainer holds, by attribute: the policy, a reference, reward models in a list."""
    found = {}
    for name, value in vars(trainer).items():
        for i, member in enumerate(value if isinstance(value, (list, tuple)) else [value]):
            if isinstance(member, nn.Module):
                found[name if member is value else f"{name}[{i}]"] = member
    return found


def model_snapshot(model: nn.Module) -> dict:
    params = list(model.parameters())
    return {
        "weights": frozen(model.state_dict()),
        "buffers": frozen(dict(model.named_buffers())),
        "modes": [m.training for m in model.modules()],
        "flags": [p.requires_grad for p in params],
        "grads": [None if p.grad is None else bits(p.grad) for p in params],  # their values; identities() the objects
        "config": model.config.to_dict() if hasattr(model, "config") else None,
        "generation_config": getattr(model, "generation_config", None) and model.generation_config.to_dict(),
    }


def rng_state() -> dict:
    state = {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return frozen(state)


def snapshot(trainer):
    """Everything the check-up must not change, copied (tensors as bits)."""
    plain = {
        name: copy.deepcopy(value)
        for name, value in vars(trainer).items()
        if isinstance(value, (dict, list, int, float, str, bool, type(None)))
        or type(value).__name__ in ("TrainerState", "TrainerControl")
    }
    tokenizer = trainer.processing_class
    held = models(trainer)
    return {
        "models": {name: model_snapshot(model) for name, model in held.items()},
        "optimizer": frozen(trainer.optimizer.state_dict()) if trainer.optimizer is not None else None,
        "rng": rng_state(),
        "padding_side": getattr(tokenizer, "padding_side", None),
        "accelerator": (
            trainer.accelerator.gradient_accumulation_steps,
            trainer.accelerator.step,
        ),
        "names": list(vars(trainer)),
        "plain": plain,
        "state": copy.deepcopy(vars(trainer.state)),
        "args": trainer.args.to_dict(),
        "grad_mode": torch.is_grad_enabled(),
    }


def identities(trainer) -> dict[str, list]:
    """The objects the check-up must hand back themselves, not equal copies: the trainer's attributes, every
    model's gradient tensors (a probe that puts back an equal gradient breaks an optimizer holding the old one),
    the accelerator's models and dataloaders."""
    return {
        "bound": list(vars(trainer).values()),
        "grads": [p.grad for model in models(trainer).values() for p in model.parameters()],
        "accelerator": [*trainer.accelerator._models, *trainer.accelerator._dataloaders],
    }


def same(a, b) -> bool:
    """Equal, walking containers; tensors (already bits) by ``torch.equal`` on their bytes."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and bool(torch.equal(a, b))
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b or a is b


def differences(before, after, path="") -> list[str]:
    """Where two snapshots differ, as paths (an assertion message that names the changed key)."""
    if isinstance(before, dict) and isinstance(after, dict) and before.keys() == after.keys():
        return [d for k in before for d in differences(before[k], after[k], f"{path}/{k}")]
    return [] if same(before, after) else [path or "/"]


def assert_unchanged(before, after, held_before, held_after):
    changed = differences(before, after)
    assert not changed, changed
    for key, objects in held_before.items():
        assert len(objects) == len(held_after[key]), key
        assert all(a is b for a, b in zip(objects, held_after[key])), key


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


def grpo_with_reference(tokenizer, out):
    """GRPO with ``beta`` > 0, which builds its own reference model from the policy's path (TRL 1.16.0's
    ``create_model_from_path``): the policy is saved first, so the reference loads offline."""
    from trl import GRPOConfig, GRPOTrainer

    path = out / "policy"
    make_causal_lm(tokenizer).save_pretrained(path)
    settings = {"num_generations": 4, "per_device_train_batch_size": 4, "max_completion_length": 8, "beta": 0.04}
    return GRPOTrainer(
        model=str(path),
        reward_funcs=examples.length_reward,
        args=GRPOConfig(**examples.config_kwargs(out, **settings)),
        processing_class=tokenizer,
        train_dataset=reward_prompts(16, seed=0),
    )


# each trainer, the probes that must have run on it (ok/warn/fail, not skipped nor crashed), the models it holds
CASES = {
    "sft": (
        lambda tok, out: stepped(examples.sft_trainer(tok, out, gradient_accumulation_steps=2)),
        {"accumulation", "fp16_adamw", "padding_cache", "labels_present", "eos_label", "gradients_reach", "known_bugs"},
        {"model"},
    ),
    # 16-bit trainable weights: fp16_adamw steps a fresh optimizer on clones of them, stalled_update compares their
    # update with their ulp; neither may touch the trainer's optimizer state or the weights (AUDIT G.5)
    "sft-fp16-weights": (
        lambda tok, out: stepped(
            examples.sft_trainer(tok, out, model=make_causal_lm(tok).to(torch.float16), gradient_accumulation_steps=2)
        ),
        {"accumulation", "fp16_adamw", "stalled_update", "gradients_reach"},
        {"model"},
    ),
    "sft-bf16-weights": (
        lambda tok, out: stepped(
            examples.sft_trainer(tok, out, model=make_causal_lm(tok).to(torch.bfloat16), gradient_accumulation_steps=2)
        ),
        {"accumulation", "stalled_update", "gradients_reach"},
        {"model"},
    ),
    "sft-padding-free-opt": (
        lambda tok, out: stepped(
            examples.sft_trainer(
                tok, out, family="opt", padding_free=True, max_length=None, gradient_accumulation_steps=2
            )
        ),
        {"packing", "accumulation", "padding_cache", "gradients_reach"},
        {"model"},
    ),
    "dpo": (
        lambda tok, out: stepped(examples.dpo_trainer(tok, out, gradient_accumulation_steps=2)),
        {"accumulation", "padding_cache", "gradients_reach"},
        {"model", "ref_model"},
    ),
    "reward": (
        lambda tok, out: stepped(examples.reward_trainer(tok, out, gradient_accumulation_steps=2)),
        {"accumulation", "reward_head", "padding_cache", "gradients_reach"},
        {"model"},
    ),
    "custom-loss": (
        lambda tok, out: stepped(
            examples.custom_trainer(tok, out, stand_ins.MeanLossTrainer, gradient_accumulation_steps=2)
        ),
        {"accumulation", "padding_cache", "labels_present", "gradients_reach"},
        {"model"},
    ),
    "grpo": (
        lambda tok, out: grpo_with_reference(tok, out),
        {"equal_rewards", "padding_cache"},
        {"model", "ref_model"},
    ),
}


@pytest.mark.parametrize("case", CASES)
def test_checkup_changes_nothing_bit_for_bit(tokenizer, tmp_path, case):
    make, ran, held = CASES[case]
    trainer = make(tokenizer, tmp_path)
    if trainer.optimizer is None:
        trainer.create_optimizer_and_scheduler(num_training_steps=2)
        torch.manual_seed(7)
    assert held <= models(trainer).keys(), models(trainer).keys()  # the reference models are compared too
    before, held_before = snapshot(trainer), identities(trainer)
    report = checkup(trainer, show=False)
    assert_unchanged(before, snapshot(trainer), held_before, identities(trainer))
    measured = {f.probe for f in report.findings if f.status in ("ok", "warn", "fail")}
    assert ran <= measured, f"did not run: {ran - measured}; {report.to_json()}"
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
    params[2].grad = None  # one dropped
    params[3].grad = params[3].grad.clone()  # and one replaced by an equal copy
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
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(99)
    raise RuntimeError("the probe crashed after meddling")


def test_untouched_undoes_every_change_a_probe_makes_even_when_it_crashes(tokenizer, tmp_path):
    trainer = stepped(examples.sft_trainer(tokenizer, tmp_path, gradient_accumulation_steps=2))
    before, held_before = snapshot(trainer), identities(trainer)
    view = TrainerView(trainer)
    with untouched(trainer):
        (finding,) = run_probe(Probe("meddler", "-", "", meddle), view)
    assert finding.status == "error" and "crashed after meddling" in finding.reason
    assert_unchanged(before, snapshot(trainer), held_before, identities(trainer))
    assert not hasattr(trainer, "invented") and not hasattr(trainer.model.config, "invented")
    assert trainer.args.gradient_accumulation_steps == 2 and trainer.model.config._attn_implementation == "sdpa"


def test_the_comparison_sees_what_equal_values_hide():
    """The snapshot tells apart what ``torch.equal`` calls equal or unequal wrongly: a NaN is itself, -0.0 is
    not 0.0, and a gradient put back as an equal copy is not the tensor the optimizer holds."""
    nan = torch.tensor([float("nan"), 1.0])
    assert same(bits(nan), bits(nan.clone())) and not torch.equal(nan, nan.clone())
    assert not same(bits(torch.tensor([0.0])), bits(torch.tensor([-0.0])))
    layer = nn.Linear(2, 2)
    layer(torch.ones(1, 2)).sum().backward()
    before, held = model_snapshot(layer), [p.grad for p in layer.parameters()]
    layer.weight.grad = layer.weight.grad.clone()
    assert same(before, model_snapshot(layer)) and held[0] is not layer.weight.grad
