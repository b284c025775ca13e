"""Probe 3 (lesson 03): fp16 trainable weights under the trainer's optimizer, the dtype the model was built in,
and a reward head that never trains.

A non-fused AdamW keeps its state in the weights' dtype: in fp16, eps=1e-8 rounds to 0 and small squared
gradients underflow, so the first update is inf or NaN (lesson 03). Which optimizers do that is not read
from their names: the probe builds the trainer's own optimizer class (the one passed in ``optimizers=``,
``optimizer_cls_and_kwargs``, or the one ``args.optim`` selects) with its own settings over clones of the
fp16 trainable tensors, gives them the gradient the first optimizer step will use (the accumulation
window through the trainer's own ``training_step``, scaled by the ``max_grad_norm`` clipping:
``checkup.step``), steps once and looks at the result. The user's weights and optimizer are never stepped.
"""

from __future__ import annotations

import torch
from transformers import Trainer

from trl_clinic.checkup.engine import Skip, probe
from trl_clinic.checkup.known_bugs import explain
from trl_clinic.checkup.view import TrainerView
from trl_clinic.probes.finding import Finding
from trl_clinic.probes.launch import Launch

HEADS = ("score", "classifier")  # what transformers calls a sequence-classification head


def _head_names(view: TrainerView) -> list[str]:
    return [name for name, _ in view.model.named_parameters() if any(f".{h}." in f".{name}" for h in HEADS)]


def _saved_with_adapter(view: TrainerView) -> bool | None:
    """Whether a PEFT adapter saves the head (SEQ_CLS or modules_to_save); None without PEFT."""
    config = getattr(view.model, "peft_config", None)
    if not config:
        return None
    peft = next(iter(config.values()))
    modules = set(peft.modules_to_save or ())
    return str(peft.task_type) in ("SEQ_CLS", "TaskType.SEQ_CLS") or bool(modules & set(HEADS))


def optimizer_recipe(view: TrainerView) -> tuple[type, dict, str]:
    """The class and settings the trainer's optimizer has or will have, and where they were read."""
    trainer = view.trainer
    optimizer = getattr(trainer, "optimizer", None)
    if optimizer is not None:
        inner = getattr(optimizer, "optimizer", optimizer)  # accelerate's AcceleratedOptimizer wraps the user's
        return type(inner), {k: v for k, v in inner.param_groups[0].items() if k != "params"}, "trainer.optimizer"
    given = getattr(trainer, "optimizer_cls_and_kwargs", None)
    if given is not None:
        return given[0], dict(given[1]), "optimizer_cls_and_kwargs"
    cls, kwargs = Trainer.get_optimizer_cls_and_kwargs(view.args, view.model)
    optim = str(getattr(view.args.optim, "value", view.args.optim))
    return cls, dict(kwargs), f"optim={optim}"


def within_budget(view: TrainerView, params: list[tuple[str, torch.nn.Parameter]]) -> list[tuple]:
    """``(name, tensor, gradient)`` for each of ``params`` whose clone, gradient and two moments (4x its bytes) fit
    the check-up's budget together with the ones before it, the gradient the first optimizer step is given (the
    window's, clipped at ``max_grad_norm``): a tensor larger than what is left is left out, not the rest."""
    step, tensors, held = view.step, [], 0
    for name, p in params:
        nbytes = 4 * p.numel() * p.element_size()
        if name in step.kept and held + nbytes <= view.budget:
            tensors.append((name, p, step.kept[name] * step.clip))
            held += nbytes
    return tensors


def one_step(
    cls: type, settings: dict, source: str, tensors: list[tuple[str, torch.Tensor, torch.Tensor]]
) -> list[str]:
    """Step a fresh ``cls`` once over clones of ``tensors`` (name, weight, gradient); the names left non-finite."""
    clones = []
    for _, weight, gradient in tensors:
        clone = weight.detach().clone().requires_grad_(True)
        clone.grad = gradient.to(clone.dtype).clone()
        clones.append(clone)
    try:
        if source == "trainer.optimizer":
            optimizer = cls([{"params": clones, **settings}])
        else:
            optimizer = cls(clones, **settings)
        optimizer.step()
    except Exception as error:  # a GPU-only optimizer (bitsandbytes, paged) on a CPU, a class that needs more
        raise RuntimeError(
            f"{cls.__module__}.{cls.__name__} could not step on cloned tensors here, so fp16 "
            f"stability is not measured: {type(error).__name__}: {error}"
        ) from error
    return [name for (name, _, _), clone in zip(tensors, clones) if not torch.isfinite(clone).all()]


@probe(
    "fp16_adamw",
    "03",
    "fp16 trainable weights that the trainer's own optimizer (its class and settings, the one passed in "
    "optimizers= included) turns non-finite in one step on the first step's gradient (the accumulation window's, "
    "clipped at max_grad_norm): a non-fused AdamW's fp16 state rounds eps to 0 and underflows g^2; then the loss "
    "is NaN (logged as a huge number, then 0).",
)
def fp16_adamw(view: TrainerView) -> Finding:
    trainable = [(name, p) for name, p in view.model.named_parameters() if p.requires_grad]
    if not trainable:
        raise Skip("nothing is trainable (see gradients_reach)")
    fp16 = [(name, p) for name, p in trainable if p.dtype == torch.float16]
    if not fp16:
        return Finding(
            "fp16_adamw",
            "ok",
            "0 fp16 trainable tensors",
            value=0,
            decided="config",
            reason="no fp16 trainable weights",
        )
    launch = Launch.of(view.trainer)
    if launch.float32_master:
        return Finding(
            "fp16_adamw",
            "ok",
            f"{len(fp16)} fp16 trainable tensors under {launch.described}",
            value=0,
            decided="config",
            reason="the optimizer steps float32 master copies of them and keeps its state in float32 (DeepSpeed "
            "ZeRO's partitions, or FSDP's float32 upcast under mixed precision)",
        )
    cls, settings, source = optimizer_recipe(view)
    step = view.step  # the gradient the first optimizer step is given: the window's, then clipped
    reached = [(name, p) for name, p in fp16 if name not in step.missing]
    if not reached:
        raise Skip("no fp16 trainable tensor got a gradient from the trainer's loss (see gradients_reach)")
    tensors = within_budget(view, reached)
    if not tensors:
        needed = 4 * sum(p.numel() * p.element_size() for _, p in reached)
        raise Skip(
            f"one optimizer step on clones of the fp16 trainable tensors needs {needed / (1 << 20):.3g} MiB and none "
            f"fits the budget of {view.budget / (1 << 20):.3g} MiB: checkup(trainer, budget=...) or --budget BYTES"
        )
    broken = one_step(cls, settings, source, tensors)
    k = len(step.batches)
    measured = (
        f"one {cls.__name__} step ({source}) on clones of {len(tensors)} of {len(fp16)} fp16 trainable tensors "
        f"and the first step's gradient ({k} micro-batches through training_step"
        + (f", clipped x{step.clip:.3g}" if step.clip < 1 else "")
        + f"): {len(broken)} non-finite"
    )
    if not broken:
        return Finding("fp16_adamw", "ok", measured, value=0, decided="measured", reason="the step stays finite")
    return Finding(
        "fp16_adamw",
        "fail",
        measured,
        value=len(broken),
        decided="measured",
        fix=f"{broken[0]} turns inf/NaN after one step: load the model in float32 or bfloat16 "
        "(dtype='float32'), or keep fp16 weights frozen and train float32 adapters",
    )


@probe(
    "init_dtype",
    "03",
    "model_init_kwargs asks for a dtype (dtype or the legacy torch_dtype) that the built model "
    "does not have: TRL >= 0.27.0 sets dtype='float32' itself, which transformers prefers over torch_dtype, and TRL "
    "ignores model_init_kwargs for a model passed as an instance.",
)
def init_dtype(view: TrainerView) -> Finding:
    kwargs = getattr(view.args, "model_init_kwargs", None) or {}
    asked = {key: kwargs[key] for key in ("dtype", "torch_dtype") if kwargs.get(key) not in (None, "auto")}
    if not asked:
        raise Skip("model_init_kwargs names no dtype")
    built = next(view.base_model.parameters()).dtype
    wanted = {key: getattr(torch, value) if isinstance(value, str) else value for key, value in asked.items()}
    measured = (
        f"model_init_kwargs {', '.join(f'{k}={v}' for k, v in asked.items())}; the built model's weights are {built}"
    )
    lost = [key for key, dtype in wanted.items() if dtype != built]
    if not lost:
        return Finding("init_dtype", "ok", measured, decided="config", reason="the model has the dtype asked for")
    launch = Launch.of(view.trainer)
    chosen = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(launch.mixed_precision)
    if launch.engine == "deepspeed" and launch.zero_stage == 3 and built == chosen:
        # ZeRO-3's zero.Init casts the weights to the config's 16-bit dtype as it partitions them (deepspeed 0.19.8
        # runtime/zero/partition_parameters.py, Init._set_dtype): the launch chose it, not a lost keyword
        return Finding(
            "init_dtype",
            "ok",
            measured + f" under {launch.described}",
            decided="config",
            reason="DeepSpeed ZeRO-3 builds the weights in the launch's precision and steps float32 master copies",
        )
    entry = explain(view, "init_dtype")
    return Finding(
        "init_dtype",
        "warn",
        measured,
        decided="config",
        known_bug=entry["id"] if entry else "",
        fix=entry["fix"]
        if entry and "torch_dtype" in lost
        else f"the model was built in {built}, not "
        f"{asked[lost[0]]}: pass the dtype to from_pretrained yourself (model_init_kwargs applies only "
        "when TRL loads the model)",
    )


@probe(
    "reward_head",
    "03",
    "a reward model whose score head is frozen, or trained but not saved with the LoRA "
    "adapter (no task_type='SEQ_CLS' nor modules_to_save=['score']): its rewards come from a random head.",
)
def reward_head(view: TrainerView) -> Finding:
    names = _head_names(view)
    if not names:
        raise Skip("no score/classifier head: not a sequence-classification model")
    params = dict(view.model.named_parameters())
    trainable = [n for n in names if params[n].requires_grad]
    measured = f"{len(trainable)} of {len(names)} head tensors trainable"
    if not trainable:
        return Finding(
            "reward_head",
            "fail",
            measured,
            value=0,
            decided="config",
            fix="the score head is frozen: with LoRA pass task_type='SEQ_CLS' (or modules_to_save=['score'])",
        )
    if _saved_with_adapter(view) is False:
        return Finding(
            "reward_head",
            "fail",
            measured,
            value=len(trainable),
            decided="config",
            fix="the LoRA adapter will not save the trained head: task_type='SEQ_CLS' or modules_to_save=['score']",
        )
    return Finding(
        "reward_head", "ok", measured, value=len(trainable), decided="config", reason="the head trains and is saved"
    )
