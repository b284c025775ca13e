"""Companion of notebooks/02_gradient_accumulation_loss.py: the one-step trainers, the accumulation sweep,
the reported-loss table, the label-count spread, the trained curves and the figure, so that the notebook
keeps the settings, the line that re-creates the old path and the numbers.

The old normalisation is re-created on today's Trainer by ``stand_ins.recreate_pre_446_loss`` (it sets
``trainer.model_accepts_loss_kwargs = False``, which the notebook shows in its first section).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from datasets import Dataset
from transformers import PreTrainedModel, PreTrainedTokenizerBase
from trl import SFTConfig, SFTTrainer

from trl_clinic.course import plotting
from trl_clinic.probes.gradients import cosine, first_step_gradient, label_counts, relative_error
from trl_clinic.course.parameters import Run
from trl_clinic.probes.recording import StepRecorder
from trl_clinic.course.runtime import progress
from trl_clinic.course.stand_ins import MeanPerMicroBatchSFTTrainer, recreate_pre_446_loss

PATHS = ("today", "old", "custom")  # the three ways batch 1 x N is normalised in sections 3 and 4


class FirstStep:
    """One optimizer step of the real SFTTrainer over the first samples, from the same initial weights.

    ``train_sampling_strategy="sequential"`` feeds the first N samples in order, so every window mixes short
    and long answers by construction; ``max_grad_norm=0`` leaves the gradient as accumulation built it; fp32
    on every device (under bf16 autocast a big batch and its micro-batches round differently, about 1e-3).
    Used by sections 1 to 5 and the worked solutions.
    """

    def __init__(self, run: Run, make_model: Callable[[], PreTrainedModel], tokenizer: PreTrainedTokenizerBase,
                 train_set: Dataset, packing_length: int | None = None) -> None:
        self.run, self.make_model, self.tokenizer, self.train_set = run, make_model, tokenizer, train_set
        self.packing_length = packing_length

    def trainer(self, batch_size: int, accumulation: int, trainer_class: type[SFTTrainer] = SFTTrainer,
                packing: bool = False) -> SFTTrainer:
        """Today's trainer for batch ``batch_size`` x accumulation ``accumulation``, not yet trained."""
        name = f"grad-{trainer_class.__name__}-{batch_size}x{accumulation}{'-packed' * packing}"
        args = SFTConfig(**{**self.run.trainer_kwargs(name, logging=False, progress=False), "bf16": False},
                         per_device_train_batch_size=batch_size, gradient_accumulation_steps=accumulation,
                         max_grad_norm=0, train_sampling_strategy="sequential", max_steps=1,
                         **({"packing": True, "max_length": self.packing_length} if packing else {}))
        return trainer_class(model=self.make_model(), args=args, train_dataset=self.train_set,
                             processing_class=self.tokenizer)

    def run_step(self, batch_size: int, accumulation: int, normalisation: str = "today",
                 trainer_class: type[SFTTrainer] = SFTTrainer, packing: bool = False) -> tuple[torch.Tensor, float]:
        """The first step's gradient and the training loss the Trainer reports for it; ``normalisation="old"``
        re-creates the pre-4.46 path (``recreate_pre_446_loss``)."""
        trainer = self.trainer(batch_size, accumulation, trainer_class, packing)
        if normalisation == "old":
            recreate_pre_446_loss(trainer)
        recorder = StepRecorder().watch(trainer)  # keeps what the Trainer logs (and stops it printing raw dicts)
        gradient = first_step_gradient(trainer)
        return gradient, recorder.last("train_loss")


def degrees_apart(gradient: torch.Tensor, reference: torch.Tensor) -> float:
    """The angle between two gradients: a rescaled gradient is 0 degrees away, another direction is not."""
    return math.degrees(math.acos(max(-1.0, min(1.0, cosine(gradient, reference)))))


def print_token_weights(counts: Sequence[int], shown: int = 8) -> float:
    """Section 2: the weight one label token gets in each micro-batch of the window, today (``1 / sum n``) and
    on the old path (``1 / (N n_i)``); returns how much more a token of the shortest sample weighs than one of
    the longest on the old path."""
    n = len(counts)
    today, old = 1 / sum(counts), [1 / (n * c) for c in counts]
    print(f"{'sample':>6} {'labels':>7} {'weight today':>13} {'weight old':>11} {'old/today':>9}")
    for i, (c, w_old) in enumerate(zip(counts[:shown], old)):
        print(f"{i:>6} {c:>7} {today:>13.5f} {w_old:>11.5f} {w_old / today:>9.2f}")
    if n > shown:
        print(f"{'...':>6} ({n - shown} more micro-batches in the window)")
    return max(old) / min(old)


def accumulation_sweep(steps: FirstStep, counts: Sequence[int],
                       custom_class: type[SFTTrainer] = MeanPerMicroBatchSFTTrainer) -> dict[str, list[dict]]:
    """Sections 3 and 4: at each accumulation count, batch 1 x count on today's path, the old path and a custom
    ``compute_loss`` against one batch of count samples: gradient error, cosine and the reported loss."""
    sweep = {path: [] for path in PATHS}
    for count in progress(counts, "accumulation sweep"):
        big, big_loss = steps.run_step(count, 1)
        candidates = {"today": steps.run_step(1, count), "old": steps.run_step(1, count, "old"),
                      "custom": steps.run_step(1, count, trainer_class=custom_class)}
        for path, (gradient, reported) in candidates.items():
            sweep[path].append({"accumulation": count, "relative_error": relative_error(gradient, big),
                                "cosine": cosine(gradient, big), "reported_loss": reported,
                                "big_batch_reported_loss": big_loss})
        print(f"1 x {count:>2}: " + "  ".join(f"{path}: err {sweep[path][-1]['relative_error']:.2e} "
                                              f"cos {sweep[path][-1]['cosine']:.6f}" for path in PATHS))
    return sweep


def print_reported_losses(sweep: dict[str, list[dict]]) -> None:
    """Section 4: the training loss each path reports for its one step, and the custom one over the old one."""
    for today, old, custom in zip(*(sweep[path] for path in PATHS)):
        count = today["accumulation"]
        print(f"1 x {count:>2} reports: today {today['reported_loss']:.3f} "
              f"(batch {count}: {today['big_batch_reported_loss']:.3f}), old {old['reported_loss']:.3f}, "
              f"custom {custom['reported_loss']:.1f} = {custom['reported_loss'] / old['reported_loss']:.3f} x old")


def label_spread(steps: FirstStep) -> dict[str, dict]:
    """Section 5: label tokens per micro-batch over the whole training set, one sample per micro-batch
    (padded) and packed rows, and their spread (standard deviation / mean)."""
    spread = {}
    for name, packing in (("padded", False), ("packed", True)):
        counts = label_counts(steps.trainer(1, 1, packing=packing))
        mean = sum(counts) / len(counts)
        std = (sum((c - mean) ** 2 for c in counts) / len(counts)) ** 0.5
        spread[name] = {"micro_batches": len(counts), "min": min(counts), "max": max(counts),
                        "coefficient_of_variation": std / mean}
        print(f"{name}: {len(counts)} micro-batches, label tokens {min(counts)} to {max(counts)}, "
              f"spread (std / mean) {std / mean:.2f}")
    return spread


def train_curve(run: Run, make_model: Callable[[], PreTrainedModel], tokenizer: PreTrainedTokenizerBase,
                train_set: Dataset, eval_sets: dict[str, Dataset], name: str, config: dict,
                normalisation: str) -> StepRecorder:
    """Section 6: one run over the training data, logged every step and evaluated four times; each held-out
    subset is one batch, so its loss is the true token mean (a mean of batch means would repeat the bug)."""
    sizes = run.sizes
    args = SFTConfig(**run.trainer_kwargs(f"curve-{name.replace(' ', '-')}"), **config,
                     learning_rate=sizes.learning_rate, warmup_steps=0.1,  # a float below 1 is a ratio
                     max_steps=sizes.curve_steps, eval_strategy="steps", eval_steps=max(1, sizes.curve_steps // 4),
                     per_device_eval_batch_size=max(len(subset) for subset in eval_sets.values()))
    trainer = SFTTrainer(model=make_model(), args=args, train_dataset=train_set, eval_dataset=eval_sets,
                         processing_class=tokenizer)
    if normalisation == "old":
        recreate_pre_446_loss(trainer)
    recorder = StepRecorder().watch(trainer)
    trainer.train()
    recorder.save(Path(run.output_dir) / f"history_{name.replace(' ', '_')}.json")
    return recorder


def largest_rise(recorder: StepRecorder) -> dict[str, float]:
    """Section 6: the step where a run's logged training loss rises most, and what the run logged around it.

    The loss logged at step s is computed on step s's window with the weights after update s - 1, so a rise
    is either a harder window or an update that made the model worse. The window's size (tokens per step, from
    the ``num_tokens`` TRL 1.16 logs, a running sum of attention-mask tokens) and the gradient norm the Trainer
    logs (before clipping) tell the two apart.
    """
    rows = {row["step"]: row for row in recorder.history if "loss" in row}
    steps = sorted(rows)
    rise_at = max(steps[1:-1], key=lambda step: rows[step]["loss"] - rows[step - 1]["loss"])
    tokens = {step: rows[step]["num_tokens"] - rows.get(step - 1, {"num_tokens": 0})["num_tokens"] for step in steps}
    return {"step": rise_at, "loss_before": rows[rise_at - 1]["loss"], "loss": rows[rise_at]["loss"],
            "loss_after": rows[rise_at + 1]["loss"], "grad_norm": rows[rise_at]["grad_norm"],
            "median_grad_norm": statistics.median(rows[step]["grad_norm"] for step in steps),
            "learning_rate_before": rows[rise_at - 1]["learning_rate"], "window_tokens": tokens[rise_at],
            "previous_window_tokens": tokens[rise_at - 1], "min_window_tokens": min(tokens.values()),
            "max_window_tokens": max(tokens.values())}


JUMP = 0.5  # nats: a rise of the logged loss from one step to the next that the figure shows as a jump


def describe_rise(rise: dict[str, float]) -> str:
    """Section 6: the largest rise of ``largest_rise``, in sentences written from the run's numbers."""
    step, jump = rise["step"], rise["loss"] - rise["loss_before"]
    windows = (rise["previous_window_tokens"], rise["window_tokens"])
    lines = [f"largest rise of the logged loss: step {step}, {rise['loss_before']:.2f} -> {rise['loss']:.2f} "
             f"(+{jump:.2f}), then {rise['loss_after']:.2f}; gradient norm there {rise['grad_norm']:.1f} (median of "
             f"the run {rise['median_grad_norm']:.1f}); learning rate logged the step before "
             f"{rise['learning_rate_before']:.1e}",
             f"tokens in the windows of steps {step - 1} and {step}: {windows[0]:.0f} and {windows[1]:.0f} (all windows "
             f"of the run: {rise['min_window_tokens']:.0f} to {rise['max_window_tokens']:.0f})"]
    ordinary = rise["min_window_tokens"] < min(windows) and max(windows) < rise["max_window_tokens"]
    if jump < JUMP:
        lines.append(f"no jump in this run: no step raised the logged loss by {JUMP} nats or more")
    elif ordinary and rise["grad_norm"] > 10 * rise["median_grad_norm"]:
        lines.append(f"a jump with windows of ordinary size and a gradient norm "
                     f"{rise['grad_norm'] / rise['median_grad_norm']:.0f}x the median: the update before it made the "
                     "model worse; the samples are not the cause")
    else:
        lines.append("a jump that these logs do not explain: look at the samples of those windows")
    return "\n".join(lines)


def plot_lesson(sweep: dict[str, list[dict]], curves: dict[str, StepRecorder], n: int, output_dir: Path) -> None:
    """Sections 3 to 6 in one figure, saved in ``output_dir``: gradient error and direction against the
    accumulation count, then the logged training loss and the held-out loss of the trained runs."""
    fig, (ax_err, ax_cos, ax_train, ax_curve) = plotting.figure(
        4, title="Old normalisation (recreated): wrong gradient at every accumulation count, "
                 "a different run, worse held-out loss", width=4.4)
    counts = [row["accumulation"] for row in sweep["today"]]
    paths = (("old", "bad", "old: mean per micro-batch (recreated)"), ("custom", "other", "custom compute_loss"),
             ("today", "fixed", "today: num_items_in_batch"))
    for path, kind, name in paths:
        plotting.line(ax_err, counts, [max(row["relative_error"], 1e-9) for row in sweep[path]], kind, name)
        plotting.line(ax_cos, counts, [row["cosine"] for row in sweep[path]], kind, name,
                      linestyle=":" if path == "custom" else "-")
    plotting.label(ax_err, "accumulation steps (batch 1)", "relative error vs big batch", "gradient error", log_y=True)
    plotting.label(ax_cos, "accumulation steps (batch 1)", "cosine with big-batch gradient", "gradient direction")
    for ax in (ax_err, ax_cos):
        ax.set_xscale("log", base=2)
        ax.set_xticks(counts, [str(count) for count in counts])  # accumulation counts are integers
    legends = {"big batch": ("reference", f"batch {n} x 1"), "today": ("fixed", f"batch 1 x {n}, today"),
               "old": ("bad", f"batch 1 x {n}, old (recreated)")}
    for name, (kind, legend) in legends.items():
        # today's line lies on the big batch's: the big batch is drawn wide underneath, today dotted on top
        style = {"big batch": {"linewidth": 5, "alpha": 0.4}, "today": {"linestyle": ":"}}.get(name, {})
        plotting.line(ax_train, *curves[name].series("loss"), kind, legend, **style)
        plotting.line(ax_curve, *curves[name].series("eval_all_loss"), kind, legend, **style)
    plotting.label(ax_train, "optimizer step", "logged training loss", "what each run logs")
    plotting.label(ax_curve, "optimizer step", "held-out loss (nats/token)", "held-out loss")
    plotting.save(fig, output_dir, "gradient_accumulation")
