"""Companion of notebooks/03_lora_reward_nan.py: the report's training arguments, the checkpoints and
loader the dtype spellings need, Adam's state read back, the accumulation sweep, the head audit and the
four-panel figure, which the lesson calls in one line each.

The lines that show the bug and the fix stay in the notebook: ``dtype=torch.float16``,
``optim="adamw_torch"``, ``task_type="SEQ_CLS"`` and the fp32 model of the fixed run.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from pathlib import Path

import torch
from datasets import Dataset
from peft import LoraConfig, PeftModel
from safetensors import safe_open
from transformers import PreTrainedTokenizerBase
from trl import RewardConfig, RewardTrainer

from trl_clinic.course import plotting
from trl_clinic.course.models import make_reward_model, rewards, trained_model
from trl_clinic.course.parameters import Run
from trl_clinic.probes.recording import StepRecorder


def lora(task_type: str | None) -> LoraConfig:
    """Sections 1-5: a new LoRA config per trainer (peft's SEQ_CLS model appends ``score`` to the config's
    ``modules_to_save``, so a shared one would carry it into a run meant to go without). Target modules are
    left to peft's default for Llama, ``q_proj`` and ``v_proj``."""
    return LoraConfig(task_type=task_type, r=8, lora_alpha=16)


def reward_config(run: Run, name: str, **overrides: object) -> RewardConfig:
    """Sections 1-5: the report's shape, batch 1 x accumulation 32, learning rate 5e-3; the notebook passes
    what a section studies (the optimizer, the precision flags, the step counts) visibly."""
    return RewardConfig(**{**run.trainer_kwargs(name), "per_device_train_batch_size": 1,
                           "gradient_accumulation_steps": 32, "learning_rate": 5e-3,
                           "per_device_eval_batch_size": 64, **overrides})


def print_log(recorder: StepRecorder) -> None:
    """Section 1: every logged row as the report showed it, beside the raw loss the model returned."""
    for row in recorder.history:
        if "loss" in row:
            print(f"step {row['step']:>3}: logged loss {row['loss']:.4g}, grad_norm {row['grad_norm']}, "
                  f"raw loss {row['raw_loss']}")


def train_recorded(trainer: RewardTrainer, history: Path | None = None) -> StepRecorder:
    """Sections 2-4: train with a ``StepRecorder`` attached (the unfiltered loss of every step) and keep
    its history beside the lesson's outputs."""
    recorder = StepRecorder().watch(trainer)
    trainer.train()
    if history is not None:
        recorder.save(history)
    return recorder


def save_checkpoints(run: Run, tokenizer: PreTrainedTokenizerBase, dtypes: Iterable[torch.dtype]) -> dict:
    """Section 2: the lesson's model saved locally once per stored dtype, so that TRL loads it from a
    path through ``model_init_kwargs`` as it loads a hub checkpoint."""
    checkpoints = {}
    for dtype in dtypes:
        checkpoints[dtype] = run.output_dir / f"checkpoint-{str(dtype).split('.')[-1]}"
        model = make_reward_model(tokenizer, size=run.sizes.model_size, seed=run.seed, dtype=dtype)
        model.save_pretrained(checkpoints[dtype])
        tokenizer.save_pretrained(checkpoints[dtype])
    return checkpoints


def load_outcome(checkpoint: Path, args: RewardConfig, train_pairs: Dataset, tokenizer: PreTrainedTokenizerBase) -> str:
    """Section 2: what ``RewardTrainer`` makes of ``args.model_init_kwargs`` on a checkpoint path: the
    dtype the reward head ends up in, or the ``ValueError`` it raises."""
    try:
        trainer = RewardTrainer(model=str(checkpoint), args=args, train_dataset=train_pairs,
                                processing_class=tokenizer, peft_config=lora("SEQ_CLS"))
    except ValueError as error:
        return f"ValueError: {error}"
    return f"loads with weights in {trainer.model.get_base_model().score.weight.dtype}"


def adam_underflow(optimizer: torch.optim.Optimizer, param: torch.Tensor) -> dict:
    """Section 3: after one step of ``torch.optim.AdamW``, ``exp_avg = (1 - beta1) * g`` and
    ``exp_avg_sq = (1 - beta2) * g**2``; in fp16 the latter is 0 below half the smallest subnormal
    (2**-25). Returns which weights' second moment is 0, the ``|g|`` threshold that predicts it, and
    whether the non-finite weights are exactly those."""
    state = optimizer.state[param]
    beta1, beta2 = optimizer.param_groups[0]["betas"]
    gradient = state["exp_avg"].float() / (1 - beta1)
    underflowed = state["exp_avg_sq"] == 0
    return {"state_dtype": str(state["exp_avg_sq"].dtype), "underflowed": int(underflowed.sum()),
            "weights": underflowed.numel(), "nonfinite": int((~torch.isfinite(param)).sum()),
            "threshold": (2.0 ** -25 / (1 - beta2)) ** 0.5,
            "largest_underflowed": gradient[underflowed].abs().max().item(),
            "smallest_kept": gradient[~underflowed].abs().min().item(),
            "inf_weights_are_underflowed": torch.equal(~torch.isfinite(param), underflowed)}


def accumulation_sweep(make_trainer: Callable[[int], RewardTrainer], accumulations: Iterable[int]) -> dict:
    """Section 3: for each accumulation count, the first optimizer step whose raw loss is non-finite
    (None if none) and the first logged loss."""
    sweep = {}
    for accumulation in accumulations:
        recorder = train_recorded(make_trainer(accumulation))
        raw = recorder.series("raw_loss")[1]
        sweep[accumulation] = {
            "first_nonfinite_step": next((s for s, v in enumerate(raw, start=1) if not math.isfinite(v)), None),
            "first_log": recorder.series("loss")[1][0]}
    return sweep


def head_report(run: Run, trainer: RewardTrainer, name: str, tokenizer: PreTrainedTokenizerBase,
                eval_pairs: Dataset) -> dict:
    """Section 4: is the ``score`` head trainable, is it in the saved adapter, and how far do the rewards
    move when the adapter is loaded on a base whose head was drawn under another seed, as loading a
    pretrained base into a sequence-classification class draws a new one (a same-seed reload would
    draw the same head and hide the bug)."""
    head_trainable = any("score" in n and p.requires_grad for n, p in trainer.model.named_parameters())
    adapter_dir = run.output_dir / f"adapter_{name}"
    trainer.save_model(str(adapter_dir))
    with safe_open(str(adapter_dir / "adapter_model.safetensors"), "pt") as saved:
        keys = list(saved.keys())
    texts = [row["prompt"] + row["chosen"] for row in eval_pairs.select(range(8))]
    # trained_model: the trained module without the bf16 autocast wrapper a bf16 run leaves on it
    before = rewards(trained_model(trainer), tokenizer, texts)
    base = make_reward_model(tokenizer, size=run.sizes.model_size, seed=run.seed,
                             head_seed=run.subseed("reload head")).to(run.device)
    after = rewards(PeftModel.from_pretrained(base, str(adapter_dir)), tokenizer, texts)
    return {"trainable_params": sum(p.numel() for p in trainer.model.parameters() if p.requires_grad),
            "head_trainable": head_trainable, "score_saved": any("score" in k for k in keys),
            "saved_tensors": len(keys), "reload_max_reward_change": (after - before).abs().max().item()}


def _nonfinite_marks(ax, steps: list, values: list, height: float, label: str) -> None:
    """Crosses at a fixed height where a series is NaN/inf (a log scale cannot draw them)."""
    bad = [s for s, v in zip(steps, values) if not math.isfinite(v)]
    ax.scatter(bad, [height] * len(bad), marker="x", color=plotting.BAD, label=label)


def plot_comparison(report: StepRecorder, fixed: StepRecorder, accuracy: dict[str, float], output_dir: Path) -> Path:
    """Section 5: what the log says, what the model returned, the grad norm, and the eval accuracy of the
    report's run, the frozen-head run and the fixed run, side by side."""
    raw_steps, raw_values = report.series("raw_loss")
    bad_steps = [s for s, v in zip(raw_steps, raw_values) if not math.isfinite(v)]
    steps, logged = report.series("loss")
    title = (f"fp16 weights + non-fused AdamW: NaN from step {bad_steps[0] if bad_steps else '-'}, logged as "
             f"{logged[0]:.0e}" + (" then 0" if logged[1:] and not any(logged[1:]) else ""))
    fig, (ax_log, ax_raw, ax_grad, ax_acc) = plotting.figure(4, width=4.4, title=title)
    plotting.line(ax_log, steps, logged, "bad", "fp16: logged loss")
    plotting.line(ax_log, *fixed.series("loss"), "fixed", "fixed: logged loss")
    ax_log.set_yscale("symlog", linthresh=1.0)
    plotting.label(ax_log, "optimizer step", "logged loss (symlog)", "what the log says")
    finite = [(s, v) for s, v in zip(raw_steps, raw_values) if math.isfinite(v)]
    plotting.line(ax_raw, *fixed.series("raw_loss"), "fixed", "fixed: raw loss")
    if finite:
        plotting.line(ax_raw, *zip(*finite), "bad", "fp16: raw loss (finite)")
    _nonfinite_marks(ax_raw, raw_steps, raw_values, max(fixed.series("raw_loss")[1]) * 1.1, "fp16: raw loss NaN")
    plotting.label(ax_raw, "optimizer step", "raw loss", "what the model returned")
    plotting.line(ax_grad, *fixed.series("grad_norm"), "fixed", "fixed: grad norm")
    _nonfinite_marks(ax_grad, *report.series("grad_norm"), max(fixed.series("grad_norm")[1]) * 1.1,
                     "fp16: logged grad norm NaN")
    plotting.label(ax_grad, "optimizer step", "grad norm (before clipping)", "gradient norm")
    plotting.bars(ax_acc, ["fp16\n(report)", "no SEQ_CLS\n(frozen head)", "fp32+SEQ_CLS\n(fixed)"],
                  list(accuracy.values()), ["bad", "other", "fixed"])
    plotting.label(ax_acc, "run", "eval pair accuracy", "chosen ranked above rejected")
    return plotting.save(fig, output_dir, "reward_nan")
