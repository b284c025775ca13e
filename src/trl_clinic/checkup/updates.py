"""Probe: trainable tensors held in bfloat16 or float16 whose optimizer updates round away.

AdamW moves an element by about the learning rate per step (exactly lr times the gradient's sign at the first
step); the step is lost when it is below half a unit in the last place of the weight, |w| * 2^-9 in bfloat16. DoRA's
magnitude vector after TRL's QLoRA cast to bfloat16 (trl 0.26.0-1.14.2, TRL #7268) never moved: 384 of 384 elements
unchanged over 20 steps at lr 2e-4 (|w| about 0.23), 0 of 384 in float32 (trl 1.16.0). A tiny model built in
bfloat16 and fully fine-tuned at lr 2e-5 left 70% of its elements unchanged in 10 steps, its norm weights (1.0) all.

The probe builds the trainer's own optimizer class with its settings (``precision.optimizer_recipe``) at the peak
learning rate (a warmup's first rate can be 0) over clones of the half-precision trainable tensors, gives them the
gradient the trainer's first optimizer step gets (``checkup.step``: the accumulation window's, after clipping), steps
once and counts the elements with a gradient that did not change. The user's weights and optimizer are never
stepped; the clones, their gradients and the optimizer's two moments stay within the check-up's budget.
"""

from __future__ import annotations

import torch

from trl_clinic.checkup.engine import Skip, probe
from trl_clinic.checkup.precision import optimizer_recipe, within_budget
from trl_clinic.checkup.view import TrainerView
from trl_clinic.probes.finding import Finding

HALF = (torch.bfloat16, torch.float16)
FAIL_SHARE, WARN_SHARE = 0.9, 0.5  # of a tensor's elements with a gradient left unchanged by one step


def unchanged_shares(cls: type, settings: dict, source: str, tensors: list) -> dict[str, float]:
    """Step a fresh ``cls`` once over clones of ``tensors`` (name, weight, gradient): per tensor, the share of its
    elements with a non-zero gradient whose value did not change."""
    clones = []
    for _, weight, gradient in tensors:
        clone = weight.detach().clone().requires_grad_(True)
        clone.grad = gradient.to(clone.dtype).clone()
        clones.append(clone)
    try:
        optimizer = cls([{"params": clones, **settings}]) if source == "trainer.optimizer" else cls(clones, **settings)
        optimizer.step()
    except Exception as error:  # a GPU-only optimizer on a CPU, a class that needs more than its params
        raise RuntimeError(
            f"{cls.__module__}.{cls.__name__} could not step on cloned tensors here, so the update is not measured: "
            f"{type(error).__name__}: {error}"
        ) from error
    shares = {}
    for (name, weight, gradient), clone in zip(tensors, clones):
        moved = gradient != 0
        if moved.any():
            shares[name] = ((clone.detach() == weight.detach()) & moved).sum().item() / moved.sum().item()
    return shares


@probe(
    "stalled_update",
    "-",
    "trainable tensors held in bfloat16/float16 whose updates round to zero: one step of the trainer's own "
    "optimizer at the peak learning rate leaves most of their elements unchanged (DoRA's magnitude vector after "
    "TRL's QLoRA cast in trl 0.26.0-1.14.2, TRL #7268; a model loaded in bfloat16 and fully fine-tuned).",
)
def stalled_update(view: TrainerView) -> Finding:
    half = [(name, p) for name, p in view.model.named_parameters() if p.requires_grad and p.dtype in HALF]
    if not half:
        return Finding(
            "stalled_update",
            "ok",
            "0 bfloat16/float16 trainable tensors",
            value=0.0,
            decided="config",
            reason="every trainable tensor is float32",
        )
    cls, settings, source = optimizer_recipe(view)
    settings["lr"] = view.args.learning_rate
    step = view.step  # the gradient the first optimizer step is given: the window's, then clipped
    graded = [(name, p) for name, p in half if name not in step.missing]
    if not graded:
        raise Skip("no half-precision trainable tensor got a gradient from the trainer's loss (see gradients_reach)")
    tensors = within_budget(view, graded)  # an embedding larger than the budget is left out, not the rest
    if not tensors:
        needed = 4 * min(p.numel() * p.element_size() for _, p in graded)
        raise Skip(
            f"one optimizer step on a clone of the smallest half-precision trainable tensor needs "
            f"{needed / (1 << 20):.3g} MiB, over the budget of {view.budget / (1 << 20):.3g} MiB: "
            "checkup(trainer, budget=...) or --budget BYTES"
        )
    shares = unchanged_shares(cls, settings, source, tensors)
    if not shares:
        raise Skip("every gradient of the half-precision trainable tensors is zero")
    stalled = sorted((name for name, share in shares.items() if share >= WARN_SHARE), key=shares.get, reverse=True)
    worst = max(shares.values())
    measured = (
        f"one {cls.__name__} step ({source}) at lr {view.args.learning_rate:g} on clones of {len(tensors)} of "
        f"{len(half)} bfloat16/float16 trainable tensors: {len(stalled)} leave at least {WARN_SHARE:.0%} of their "
        f"elements unchanged (worst {worst:.0%}"
        + (f": {', '.join(stalled[:3])}{', ...' if len(stalled) > 3 else ''})" if stalled else ")")
    )
    if worst < WARN_SHARE:
        return Finding(
            "stalled_update", "ok", measured, value=worst, decided="measured", reason="the updates move the weights"
        )
    magnitude = any("lora_magnitude_vector" in name for name in stalled)
    return Finding(
        "stalled_update",
        "fail" if worst >= FAIL_SHARE else "warn",
        measured,
        value=worst,
        decided="measured",
        fix=(
            "trl>=1.15.0 keeps DoRA's magnitude in float32; on an older TRL cast it back after building the trainer "
            "(p.data = p.data.float() for the lora_magnitude_vector parameters)"
            if magnitude
            else "keep trainable weights in float32 (load the model in float32 and train with bf16=True autocast), "
            "or raise learning_rate"
        ),
    )
