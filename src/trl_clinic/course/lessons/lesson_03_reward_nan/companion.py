"""Companion of lesson 03 (core.py, its deep dive deeper.py
and its worked solutions): the reward model and data each profile uses, the trainer built from the settings the
notebook passes, the log kept beside each step's raw loss, and the deep dive's checkpoints, Adam-state reading,
accumulation sweep, head audit and figures, which the notebooks call in one line each.

The lines that show the bug and the fix stay in the notebooks: ``dtype=torch.float16`` against
``torch.float32``, ``optim="adamw_torch"``, batch x accumulation 32 and ``task_type="SEQ_CLS"``.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import torch
from datasets import Dataset
from peft import LoraConfig, PeftModel
from safetensors import safe_open
from transformers import (
    AutoModelForSequenceClassification,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    TrainerCallback,
)
from trl import RewardConfig, RewardTrainer

from trl_clinic.course import data, plotting
from trl_clinic.course.models import dequantized_smollm2, make_reward_model, rewards, trained_model
from trl_clinic.course.run import Run
from trl_clinic.course.tokenizer import build_tokenizer
from trl_clinic.probes.recording import StepRecorder, replay_nan_filter


@dataclass(frozen=True)
class Pairs:
    """The tokenizer of the profile's model and the preference pairs (prompt, chosen, rejected) drawn from the seed."""

    tokenizer: PreTrainedTokenizerBase
    train: Dataset
    eval: Dataset


def with_passage(pairs: Dataset, people: int, seed: int) -> Dataset:
    """Each prompt preceded by the biographies of ``people`` people, the asked one among them (the gpu profile's
    longer sequences: the answer can be read from the passage, so a pretrained model learns it in a few steps)."""
    if people == 0:
        return pairs
    world, rng = data.fixed_world(), random.Random(seed)

    def passage(row: dict) -> dict:
        asked = next(word for word in row["prompt"].replace("?", " ").split() if word in data.NAMES)
        names = rng.sample([n for n in data.NAMES if n != asked], people - 1) + [asked]
        rng.shuffle(names)
        return {"prompt": "passage: " + " ".join(world.biography(n) for n in names) + " question: " + row["prompt"]}

    return pairs.map(passage)


def preference_data(run: Run) -> Pairs:
    """The profile's tokenizer (the clinic's for a random-init model, SmolLM2's own for SmolLM2) and the pairs:
    ``train_steps`` steps of batch x 32 for training, ``eval_pairs`` held out."""
    sizes = run.sizes
    tokenizer = (
        AutoTokenizer.from_pretrained(dequantized_smollm2(), local_files_only=True)
        if sizes.model_size == "smollm2"
        else build_tokenizer()
    )
    train = data.preference_pairs(sizes.train_steps * sizes.batch_size * 32, seed=run.subseed("train"))
    held_out = data.preference_pairs(sizes.eval_pairs, seed=run.subseed("eval"))
    return Pairs(
        tokenizer,
        with_passage(train, sizes.context_people, run.subseed("train passages")),
        with_passage(held_out, sizes.context_people, run.subseed("eval passages")),
    )


def reward_model(
    run: Run, tokenizer: PreTrainedTokenizerBase, dtype: torch.dtype, head_seed: int | None = None
) -> PreTrainedModel:
    """A sequence-classification model with one output (the reward head is ``score``) in ``dtype``.

    "smollm2" loads SmolLM2-135M-Instruct's pretrained body into ``AutoModelForSequenceClassification``, which
    draws a new ``score`` head, as a user's ``from_pretrained(name, num_labels=1)`` does; a ``MODEL_SIZES`` name
    is a random-init llama of that size. ``head_seed`` (default: the run's seed) draws the head, so the runs of
    one lesson start from the same model and a reload can draw another head."""
    head_seed = run.seed if head_seed is None else head_seed
    if run.sizes.model_size != "smollm2":
        return make_reward_model(
            tokenizer,
            size=run.sizes.model_size,
            seed=run.seed,
            head_seed=head_seed,
            dtype=dtype,
            attn_implementation=run.attention,
        )
    torch.manual_seed(head_seed)  # from_pretrained draws the missing score head from torch's generator
    return AutoModelForSequenceClassification.from_pretrained(
        dequantized_smollm2(), num_labels=1, dtype=dtype, attn_implementation=run.attention, local_files_only=True
    )


def reward_trainer(
    run: Run, pairs: Pairs, dtype: torch.dtype, name: str, task_type: str | None = "SEQ_CLS", **settings: object
) -> RewardTrainer:
    """``RewardTrainer`` on the profile's model in ``dtype`` with LoRA r=8 (peft's default targets for Llama,
    ``q_proj`` and ``v_proj``) and the ``RewardConfig`` ``settings`` the notebook passes. Here, not shown: the run's
    folder, seed and logging, the profile's mixed precision (bf16 autocast on the gpu profile; the report's run
    passes ``bf16=False``) and the learning rate. A new ``LoraConfig`` per trainer: peft's SEQ_CLS model appends
    ``score`` to the config's ``modules_to_save``, so a shared one would carry it into a run meant to go without."""
    args = RewardConfig(
        **{
            **run.trainer_kwargs(name),
            "learning_rate": run.sizes.learning_rate,
            "per_device_eval_batch_size": 64,
            **settings,
        }
    )
    # the pairs the steps will read, in order: RewardTrainer tokenizes its whole train set when it is built
    needed = args.max_steps * args.per_device_train_batch_size * args.gradient_accumulation_steps
    train = pairs.train.select(range(needed)) if 0 < needed < len(pairs.train) else pairs.train
    return RewardTrainer(
        model=reward_model(run, pairs.tokenizer, dtype),
        args=args,
        train_dataset=train,
        eval_dataset=pairs.eval,
        processing_class=pairs.tokenizer,
        peft_config=LoraConfig(task_type=task_type, r=8, lora_alpha=16),
    )


# the keys of a training log row the report quoted (RewardTrainer's row also has rewards, margins, token counts)
QUOTED = ("loss", "grad_norm", "learning_rate", "epoch")


class PrintLogRows(TrainerCallback):
    """Print each training log row as transformers' ``PrinterCallback`` does (floats to 4 significant digits), cut
    to the keys the report quoted, so a row fits a screen line."""

    def on_log(self, args, state, control, logs=None, **kwargs):
        if state.is_local_process_zero and logs and "loss" in logs:
            print({k: (f"{logs[k]:.4g}" if isinstance(logs[k], float) else logs[k]) for k in QUOTED if k in logs})


def keep_log(trainer: RewardTrainer, printed: bool = True) -> StepRecorder:
    """Keep each optimizer step's loss as the model returned it (``raw_loss``) beside what the trainer logs
    (``StepRecorder``, which quiets the trainer's own printer); ``printed``: print the training log rows as a user
    sees them (``PrintLogRows``: the report's run, whose log is the symptom)."""
    recorder = StepRecorder().watch(trainer)
    if printed:
        trainer.add_callback(PrintLogRows)
    return recorder


def first_nonfinite_step(values: list[float]) -> int | None:
    """The first optimizer step (1-based) whose value is NaN or inf, None if every one is finite."""
    return next((step for step, value in enumerate(values, start=1) if not math.isfinite(value)), None)


def record(
    trainer: RewardTrainer, log: StepRecorder, dtype: torch.dtype, one_step: dict, accuracy: float, after_one_step: dict
) -> dict:
    """One run's numbers for the checks (the lesson's checks.py): its log and raw losses, the Trainer's NaN filter
    replayed on them, ``one_step`` (the AdamW-step table, by dtype name), its held-out ``accuracy`` and what the
    checks found around one step (``after_one_step``, by dtype)."""
    raw_losses, args = log.series("raw_loss")[1], trainer.args
    replayed = replay_nan_filter(raw_losses, args.gradient_accumulation_steps, args.logging_steps)
    return {
        "dtype": str(dtype),
        "logged_loss": log.series("loss")[1],
        "logged_grad_norm": log.series("grad_norm")[1],
        "raw_loss": raw_losses,
        "replayed_logs": replayed,
        "one_adam_step": one_step[str(dtype).removeprefix("torch.")],
        "eval_accuracy": accuracy,
        **after_one_step[dtype],
    }


def plot_bad_vs_fixed(report: StepRecorder, fixed: StepRecorder, accuracy: dict[str, float], output_dir: Path) -> Path:
    """The core's figure: what the log said, and what the model returned at every step, fp16 against float32."""
    steps, raw = report.series("raw_loss")
    bad_from = first_nonfinite_step(raw)
    log_steps, logged = report.series("loss")
    title = (
        f"fp16 weights: loss NaN from step {bad_from}, logged as {logged[0]:.0e} then {logged[-1]:g}; "
        f"float32: finite, {accuracy['float32 (fixed)']:.0%} of held-out pairs ranked right"
    )
    fig, (ax_log, ax_raw) = plotting.figure(2, title=title, width=5.5)
    for (steps_logged, values), kind, label, offset in (
        (report.series("loss"), "bad", "fp16 weights (the report)", (8, -12)),
        (fixed.series("loss"), "fixed", "float32 weights (the fix)", (8, 4)),
    ):
        plotting.line(ax_log, steps_logged, values, kind, label, linestyle="none", markersize=8)
        for step, value in zip(steps_logged, values):
            ax_log.annotate(f"{value:.2g}", (step, value), textcoords="offset points", xytext=offset, fontsize=8)
    ax_log.set_yscale("symlog", linthresh=1.0)
    ax_log.set_yticks([0, 1e10, 1e20, 1e30])
    ax_log.set_xlim(min(log_steps) - 10, max(log_steps) + 15)
    plotting.label(ax_log, "optimizer step", "logged loss (symlog scale)", "what the trainer logged")
    plotting.line(ax_raw, *fixed.series("raw_loss"), "fixed", "float32 weights")
    finite = [(s, v) for s, v in zip(steps, raw) if math.isfinite(v)]
    if finite:
        plotting.line(ax_raw, *zip(*finite), "bad", "fp16 weights (finite steps)")
    bad = [s for s, v in zip(steps, raw) if not math.isfinite(v)]
    ax_raw.scatter(
        bad,
        [max(fixed.series("raw_loss")[1]) * 1.05] * len(bad),
        marker="x",
        s=12,
        color=plotting.BAD,
        label="fp16 weights: NaN",
    )
    plotting.label(ax_raw, "optimizer step", "loss the model returned", "what the model returned")
    return plotting.save(fig, output_dir, "reward_nan")


# ---- the deep dive ---------------------------------------------------------------------------------------------


def save_checkpoints(run: Run, pairs: Pairs, dtypes: Iterable[torch.dtype]) -> dict[torch.dtype, Path]:
    """The profile's reward model saved locally once per stored dtype, so that TRL loads it from a path
    through ``model_init_kwargs`` as it loads a hub checkpoint."""
    checkpoints = {}
    for dtype in dtypes:
        checkpoints[dtype] = run.output_dir / f"checkpoint-{str(dtype).split('.')[-1]}"
        reward_model(run, pairs.tokenizer, dtype).save_pretrained(checkpoints[dtype])
        pairs.tokenizer.save_pretrained(checkpoints[dtype])
    return checkpoints


def load_outcome(run: Run, checkpoint: Path, pairs: Pairs, model_init_kwargs: dict) -> str:
    """What ``RewardTrainer`` makes of ``model_init_kwargs`` on a checkpoint path: the dtype the trainable
    reward head ends up in, or the ``ValueError`` it raises."""
    args = RewardConfig(**run.trainer_kwargs("spelling"), model_init_kwargs=model_init_kwargs)
    try:
        trainer = RewardTrainer(
            model=str(checkpoint),
            args=args,
            train_dataset=pairs.train,
            processing_class=pairs.tokenizer,
            peft_config=LoraConfig(task_type="SEQ_CLS"),
        )
    except ValueError as error:
        return f"ValueError: {error}"
    return f"loads with weights in {trainer.model.get_base_model().score.weight.dtype}"


class FirstGradient(TrainerCallback):
    """Keep the trainable ``score`` head's gradient of optimizer step 1 as AdamW receives it (after clipping:
    transformers 5.23.0 ``Trainer._run_epoch`` clips, then calls ``on_pre_optimizer_step``, then steps)."""

    def __init__(self) -> None:
        self.gradient: torch.Tensor | None = None

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        if state.global_step == 0:
            head = next(p for n, p in model.named_parameters() if "score" in n and p.requires_grad)
            self.gradient = head.grad.detach().clone()


def adam_state(optimizer: torch.optim.Optimizer, param: torch.Tensor, gradient: torch.Tensor) -> dict:
    """After the first step of ``torch.optim.AdamW``: which weights' state underflowed, against the fp16
    prediction from their gradient, and what the weights became.

    After one step ``exp_avg = (1 - beta1) * g`` and ``exp_avg_sq = (1 - beta2) * g**2``, kept in the weight's
    dtype; in fp16 each is 0 below 2**-25 (half the smallest subnormal, rounding to even), so v is 0 exactly where
    |g| < (2**-25 / (1 - beta2)) ** 0.5, the v threshold. ``mismatches`` counts the weights where v's being 0 and
    |g| (the step's real gradient, ``FirstGradient``) being below the threshold disagree: 0 for fp16 state, the
    number of weights below the threshold for float32 state (which keeps them). A weight whose second moment is 0
    is divided by ``0 + eps`` = 0 (eps rounds to 0 in fp16): ±inf where the first moment is not 0, 0/0 = NaN where
    it is 0 too."""
    state = optimizer.state[param]
    beta1, beta2 = optimizer.param_groups[0]["betas"]
    m_zero, v_zero = state["exp_avg"] == 0, state["exp_avg_sq"] == 0
    v_threshold = (2.0**-25 / (1 - beta2)) ** 0.5
    below = gradient.double().abs() < v_threshold
    return {
        "state_dtype": str(state["exp_avg_sq"].dtype),
        "weights": param.numel(),
        "below_v_threshold": int(below.sum()),
        "v_underflowed": int(v_zero.sum()),
        "m_underflowed": int(m_zero.sum()),
        "mismatches": int((below != v_zero).sum()),
        "inf_weights": int(param.isinf().sum()),
        "nan_weights": int(param.isnan().sum()),
        "inf_where_only_v_underflowed": torch.equal(param.isinf(), v_zero & ~m_zero),
        "nan_where_m_underflowed_too": torch.equal(param.isnan(), v_zero & m_zero),
        "v_threshold": v_threshold,
        "m_threshold": 2.0**-25 / (1 - beta1),
        "nearest_gradient_to_threshold": (gradient.double().abs() / v_threshold).sub(1).abs().min().item(),
    }


def accumulation_run(trainer: RewardTrainer) -> dict:
    """One run of the accumulation sweep: the raw loss of every step, the logged losses, and the NaN filter's
    arithmetic replayed on the raw losses (``replay_nan_filter``)."""
    recorder = StepRecorder().watch(trainer)  # watch() quiets the trainer itself
    trainer.train()
    raw = recorder.series("raw_loss")[1]
    return {
        "first_nonfinite_step": first_nonfinite_step(raw),
        "raw_loss": raw,
        "logged": recorder.series("loss")[1],
        "logged_grad_norm": recorder.series("grad_norm")[1],
        "replayed": replay_nan_filter(raw, trainer.args.gradient_accumulation_steps, trainer.args.logging_steps),
    }


def head_report(run: Run, trainer: RewardTrainer, name: str, pairs: Pairs) -> dict:
    """Is the ``score`` head trainable, is it in the saved adapter, and how far do the rewards move when the
    adapter is loaded on a base whose head was drawn under another seed, as loading a pretrained base into a
    sequence-classification class draws a new one (a same-seed reload would draw the same head and hide it)."""
    head_trainable = any("score" in n and p.requires_grad for n, p in trainer.model.named_parameters())
    adapter_dir = run.output_dir / f"adapter_{name}"
    trainer.save_model(str(adapter_dir))
    with safe_open(str(adapter_dir / "adapter_model.safetensors"), "pt") as saved:
        keys = list(saved.keys())
    texts = [row["prompt"] + row["chosen"] for row in pairs.eval.select(range(8))]
    # trained_model: the trained module without the bf16 autocast wrapper a bf16 run leaves on it
    before = rewards(trained_model(trainer), pairs.tokenizer, texts)
    base = reward_model(run, pairs.tokenizer, torch.float32, head_seed=run.subseed("reload head")).to(run.device)
    after = rewards(PeftModel.from_pretrained(base, str(adapter_dir)), pairs.tokenizer, texts)
    return {
        "trainable_params": sum(p.numel() for p in trainer.model.parameters() if p.requires_grad),
        "head_trainable": head_trainable,
        "score_saved": any("score" in k for k in keys),
        "saved_tensors": len(keys),
        "reload_max_reward_change": (after - before).abs().max().item(),
    }


def plot_deeper(sweep: dict[int, dict], accuracy: dict[str, float], output_dir: Path) -> Path:
    """The deep dive's figure: the first logged loss against accumulation (logged and replayed), and the eval
    accuracy of the fp16, frozen-head and fixed runs."""
    counts = sorted(sweep)
    logged = [sweep[k]["logged"][0] for k in counts]
    title = (
        f"The NaN filter logs {logged[0]:.0e} to {logged[-1]:.0e} as accumulation grows from {counts[0]} to "
        f"{counts[-1]}; a frozen head still ranks pairs, from a random head"
    )
    fig, (ax_log, ax_acc) = plotting.figure(2, title=title, width=5.5)
    plotting.line(ax_log, counts, [max(v, 1e-3) for v in logged], "bad", "logged (fp16 weights)")
    plotting.line(
        ax_log,
        counts,
        [max(sweep[k]["replayed"][0], 1e-3) for k in counts],
        "reference",
        "replayed from the raw losses",
    )
    ax_log.set_xscale("log", base=2)
    plotting.label(ax_log, "gradient accumulation steps", "first logged loss", "one log after the NaN", log_y=True)
    plotting.bars(ax_acc, list(accuracy), list(accuracy.values()), ["bad", "other", "fixed"], fmt="{:.0%}")
    plotting.label(ax_acc, "run", "eval pair accuracy", "chosen ranked above rejected")
    return plotting.save(fig, output_dir, "reward_nan_deeper")
