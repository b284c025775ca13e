"""Probe: would the first optimizer step move the trainable weights, as the run is launched?

AdamW's first step moves an element by about the learning rate (lr times the gradient's sign, for a gradient well
above eps); the step is lost when it is below half a unit in the last place of the weight: |w| * 2^-9 in bfloat16,
|w| * 2^-12 in float16. Whether that happens is a question of the launch, not only of the weights' dtype:

* a plain Trainer (one process, or DDP) steps the 16-bit tensors themselves: the update is lost;
* DeepSpeed ZeRO steps float32 master partitions of them, and accelerate's FSDP with mixed precision casts trainable
  16-bit parameters to float32 when it prepares the model (``probes.launch``): the update is kept, and the 16-bit
  copy moves once the master's change passes its half unit.

So a launch with float32 master weights is ``ok`` (decided ``config``). Otherwise the probe measures: the trainer's
own optimizer class with its settings (``precision.optimizer_recipe``) at the peak learning rate (a warmup's first
rate can be 0), stepped once over clones of every 16-bit trainable tensor (norms, embeddings, matrices, adapters,
each whole, in blocks of rows within the check-up's budget: exact for element-wise optimizers, AdamW, Adam, Lion,
RMSprop, SGD), given the gradient of the first window (``checkup.step``: read while it is live, never copied, and
scaled by the ``max_grad_norm`` clipping). It counts the elements with a non-zero gradient whose value did not
change, and reports their share of all trainable parameters with a gradient (float32 ones count as moving), by
kind. GRPO's first window needs its own generations: there a unit gradient stands in (AdamW's, RMSprop's and Lion's
first step does not depend on the gradient's size; SGD's does, and the finding says so).

Where the lines are, from ``benchmarks/bf16_updates.py`` (record: ``benchmarks/results/bf16_updates.json``): a tiny
Llama at transformers' initial scales (matrices std 0.02, norms 1.0) fully fine-tuned 300 steps with AdamW at a
constant learning rate, bfloat16 weights stepped as they are against the same weights in float32 on the same batches
(SmolLM2-135M's bfloat16 matmuls take 52 times the float32 ones on this CPU: days, not minutes). The share this probe
measured before training, and what the bfloat16 run lost of the float32 run's held-out improvement:

    lr      unchanged (by count)                 improvement lost   held-out loss, bf16 / fp32
    2e-5    69.6% (matrices 70%, norms 100%)     59%                5.62 / 4.39
    1e-4    11.9% (matrices 12%, norms 100%)     15%                2.53 / 1.83
    3e-4     0.1% (norms 100%)                    3%                0.45 / 0.25
    1e-3     0.1% (norms 100%)                    0.2%              0.092 / 0.079

So **fail** at ``FAIL_SHARE`` (half the parameters never move: at 70% the run lost most of what it should have
learned), **warn** at ``WARN_SHARE`` (at 12% it still trains, 15% less), and **warn** when a whole kind never moves
(``KIND_SHARE``: the norms at 3e-4 and above, which cost 0.2% to 3% of the improvement here, more where a fine-tune
must move them); **fail** when DoRA's magnitude vector never moves, which turns the DoRA the user asked for into
LoRA.

DoRA's magnitude vector after TRL's QLoRA cast to bfloat16 (trl 0.26.0-1.14.2, TRL #7268) is the small-share case:
its |w| (about 0.2-1) stalls every element at lr 2e-4 while the adapters' matrices move, so it is a whole kind that
never trains; the known-bugs entry that explains it is named when it applies.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import torch
from torch import nn

from trl_clinic.checkup.engine import Skip, probe
from trl_clinic.checkup.known_bugs import explain
from trl_clinic.checkup.precision import optimizer_recipe
from trl_clinic.checkup.step import live_reader
from trl_clinic.checkup.view import TrainerView
from trl_clinic.probes.finding import Finding
from trl_clinic.probes.launch import Launch

HALF = (torch.bfloat16, torch.float16)
FAIL_SHARE = 0.5  # of the trainable parameters with a gradient, by count, that the step leaves unchanged
WARN_SHARE = 0.01
KIND_SHARE = 0.9  # a kind of tensor whose elements stay unchanged at least this share never trains


def kind_of(name: str, module: nn.Module, parameter: torch.Tensor) -> str:
    """What a trainable tensor is, read the same way in every family: ``magnitude`` (DoRA's magnitude vector),
    ``adapter`` (PEFT's other LoRA tensors), ``embedding`` (an ``nn.Embedding``'s weight), ``norm`` (a module whose
    class name says Norm), ``bias``, ``matrix`` (any other tensor of two or more dimensions: projections, the output
    head) or ``vector``."""
    if "magnitude_vector" in name:
        return "magnitude"
    if "lora_" in name:
        return "adapter"
    if isinstance(module, nn.Embedding):
        return "embedding"
    if "norm" in type(module).__name__.lower():
        return "norm"
    if name.rsplit(".", 1)[-1] == "bias":
        return "bias"
    return "matrix" if parameter.ndim >= 2 else "vector"


@dataclass
class Updates:
    """What one step did to the trainable parameters: per kind, the elements with a gradient and those left
    unchanged (16-bit tensors stepped; float32 ones counted as moving)."""

    graded: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    unchanged: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    tensors: int = 0  # 16-bit trainable tensors stepped
    unit_gradient: bool = False  # a unit gradient stood in for the window's (GRPO)

    @property
    def share(self) -> float:
        total = sum(self.graded.values())
        return sum(self.unchanged.values()) / total if total else 0.0

    def kind_share(self, kind: str) -> float:
        return self.unchanged[kind] / self.graded[kind] if self.graded[kind] else 0.0


def _blocks(weight: torch.Tensor, gradient: torch.Tensor, budget: int):
    """``weight`` and ``gradient`` in blocks of whole rows whose clone, gradient and two moments fit ``budget``."""
    rows = weight.detach().reshape(weight.shape[0], -1) if weight.ndim > 1 else weight.detach().reshape(1, -1)
    grads = gradient.detach().reshape(rows.shape)
    per = max(1, budget // max(1, 4 * rows.shape[1] * weight.element_size()))
    for start in range(0, rows.shape[0], per):
        yield rows[start : start + per], grads[start : start + per]


def step_once(cls: type, settings: dict, source: str, blocks: list[tuple[torch.Tensor, torch.Tensor]]) -> list:
    """Step a fresh ``cls`` once over clones of ``blocks`` (weight, gradient); the clones after the step."""
    clones = []
    for weight, gradient in blocks:
        clone = weight.clone().requires_grad_(True)
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
    return [clone.detach() for clone in clones]


def measure(view: TrainerView, named: list[tuple[str, nn.Parameter]], gradients: dict[str, torch.Tensor]) -> Updates:
    """One step of the trainer's optimizer over every 16-bit trainable tensor in ``gradients``, block by block within
    the budget; float32 trainable tensors with a gradient count as moving."""
    cls, settings, source = optimizer_recipe(view)
    settings["lr"] = view.args.learning_rate
    modules = dict(view.model.named_modules())
    updates, pending, held = Updates(), [], 0

    def flush() -> None:
        stepped = step_once(cls, settings, source, [(weight, gradient) for _, weight, gradient in pending])
        for (kind, weight, gradient), after in zip(pending, stepped):
            moved = gradient != 0
            updates.graded[kind] += int(moved.sum())
            updates.unchanged[kind] += int(((after == weight) & moved).sum())
        pending.clear()

    for name, parameter in named:
        gradient = gradients.get(name)
        if gradient is None:
            continue
        kind = kind_of(name, modules.get(name.rpartition(".")[0], view.model), parameter)
        if parameter.dtype not in HALF:
            updates.graded[kind] += int((gradient != 0).sum())
            continue
        updates.tensors += 1
        for weight, block in _blocks(parameter, gradient, view.budget):
            nbytes = 4 * weight.numel() * weight.element_size()
            if pending and held + nbytes > view.budget:
                flush()
                held = 0
            pending.append((kind, weight, block))
            held += nbytes
    if pending:
        flush()
    return updates


@live_reader("stalled_update")
def read_first_window(view: TrainerView, named: list, clip: float) -> Updates | None:
    """In ``first_step``, while the window's gradients are live: the step's effect, or None where the probe decides
    without it (float32 master weights, no 16-bit trainable tensor)."""
    if Launch.of(view.trainer).float32_master or not any(p.dtype in HALF for _, p in named):
        return None
    gradients = {name: p.grad * clip if clip < 1 else p.grad for name, p in named if p.grad is not None}
    return measure(view, named, gradients)


def _counts(parameters: list[tuple[str, nn.Parameter]]) -> str:
    return f"{sum(p.numel() for _, p in parameters) / 1e6:.3g}M parameters"


@probe(
    "stalled_update",
    "08",
    "16-bit trainable weights whose optimizer updates round away as the run is launched: one step of the trainer's "
    "own optimizer at the peak learning rate leaves most parameters, or a whole kind of them (norms, DoRA's "
    "magnitude vector after TRL's QLoRA cast in trl 0.26.0-1.14.2, TRL #7268), unchanged. A launch whose optimizer "
    "steps float32 master weights (DeepSpeed ZeRO, FSDP with mixed precision) keeps the updates.",
)
def stalled_update(view: TrainerView) -> Finding:
    trainable = [(name, p) for name, p in view.model.named_parameters() if p.requires_grad]
    half = [(name, p) for name, p in trainable if p.dtype in HALF]
    if not half:
        return Finding(
            "stalled_update",
            "ok",
            "0 bfloat16/float16 trainable tensors",
            value=0.0,
            decided="config",
            reason="every trainable tensor is float32",
        )
    launch = Launch.of(view.trainer)
    dtypes = "/".join(sorted({str(p.dtype).removeprefix("torch.") for _, p in half}))
    if launch.float32_master:
        return Finding(
            "stalled_update",
            "ok",
            f"{len(half)} {dtypes} trainable tensors ({_counts(half)}) under {launch.described}",
            value=0.0,
            decided="config",
            reason="the optimizer steps float32 master copies of them (DeepSpeed ZeRO's partitions, or FSDP's float32 "
            "upcast under mixed precision), so updates below their 16-bit half unit are kept",
        )
    if view.kind == "grpo":
        updates = measure(view, trainable, {name: torch.ones_like(p) for name, p in half})
        updates.unit_gradient = True
    else:
        updates = view.step.read_live("stalled_update")
    if updates is None or not sum(updates.graded.values()):
        raise Skip("no trainable tensor got a gradient from the trainer's loss (see gradients_reach)")
    return verdict(view, updates, launch, dtypes)


def verdict(view: TrainerView, updates: Updates, launch: Launch, dtypes: str) -> Finding:
    cls, _, source = optimizer_recipe(view)
    kinds = sorted(updates.graded, key=lambda k: -updates.graded[k])
    by_kind = ", ".join(f"{kind} {updates.kind_share(kind):.0%}" for kind in kinds if updates.graded[kind])
    whole = [kind for kind in kinds if updates.graded[kind] and updates.kind_share(kind) >= KIND_SHARE]
    share = updates.share
    measured = (
        f"one {cls.__name__} step ({source}) at lr {view.args.learning_rate:g} on clones of the {updates.tensors} "
        f"{dtypes} trainable tensors, under {launch.described}"
        + (", a unit gradient standing in for GRPO's" if updates.unit_gradient else ", the first window's gradient")
        + f": {share:.1%} of the trainable parameters with a gradient unchanged (by kind: {by_kind})"
    )
    if share < WARN_SHARE and not whole:
        return Finding(
            "stalled_update", "ok", measured, value=share, decided="measured", reason="the updates move the weights"
        )
    entry = explain(view, "stalled_update")
    magnitude = "magnitude" in whole
    if magnitude:
        fix = (
            "trl>=1.15.0 keeps DoRA's magnitude in float32; on an older TRL cast it back after building the trainer "
            "(p.data = p.data.float() for the lora_magnitude_vector parameters)"
        )
    else:
        fix = (
            "keep the trainable weights in float32 (dtype: float32 with bf16: true autocast), or launch with "
            "float32 master weights (DeepSpeed ZeRO, FSDP with mixed precision)"
        )
    if share < WARN_SHARE and not magnitude:  # a warn for a whole kind alone: say which
        fix = f"the {' and '.join(whole)} weights never move in {dtypes} at this learning rate: {fix}"
    return Finding(
        "stalled_update",
        "fail" if share >= FAIL_SHARE or magnitude else "warn",
        measured,
        value=share,
        decided="measured",
        known_bug=entry["id"] if entry else "",
        fix=entry["fix"] if entry else fix,
    )
