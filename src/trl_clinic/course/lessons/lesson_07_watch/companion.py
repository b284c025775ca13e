"""Companion of lesson 07 (core.py and its worked solutions): the preference pairs its
reward-model runs read, the bit-for-bit comparison of two runs' weights, the log rows as numbers, each run's
measurements for the checks and the figure, which the notebooks call in one line each.

The lines that make the run go wrong and put it right stay in the notebook (``dtype=torch.float16`` against
``torch.float32``, ``optim="adamw_torch"``), and so does every ``ClinicWatch`` call. The reward model and its
trainer are lesson 03's (``lesson_03_reward_nan/companion.py``): this lesson watches the same failure in a
user's run.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
from transformers import AutoTokenizer

from trl_clinic.course import data, plotting
from trl_clinic.course.lessons.lesson_03_reward_nan.companion import Pairs, with_passage
from trl_clinic.course.models import dequantized_smollm2
from trl_clinic.course.run import Run
from trl_clinic.course.tokenizer import build_tokenizer
from trl_clinic.probes.recording import replay_nan_filter


def reward_pairs(run: Run) -> Pairs:
    """The profile's tokenizer and the (prompt, chosen, rejected) pairs of ``train_steps`` steps of ``batch_size``,
    drawn from the seed. Nothing is evaluated, so there is no held-out set."""
    sizes = run.sizes
    tokenizer = (
        AutoTokenizer.from_pretrained(dequantized_smollm2(), local_files_only=True)
        if sizes.model_size == "smollm2"
        else build_tokenizer()
    )
    train = data.preference_pairs(sizes.train_steps * sizes.batch_size, seed=run.subseed("train"))
    return Pairs(tokenizer, with_passage(train, sizes.context_people, run.subseed("train passages")), eval=None)


def same_weights(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    """Every parameter of ``a`` and ``b`` equal bit for bit (NaN bytes included: ``==`` would call NaN unequal)."""
    pairs = list(zip(a.named_parameters(), b.named_parameters(), strict=True))
    return all(
        na == nb
        and torch.equal(
            pa.detach().contiguous().view(torch.uint8).flatten(), pb.detach().contiguous().view(torch.uint8).flatten()
        )
        for (na, pa), (nb, pb) in pairs
    )


def log_rows(trainer) -> list[dict]:
    """The training log rows (those with a ``loss``): step, logged loss, grad norm, and the watch's ``clinic/`` keys."""
    return [
        {k: v for k, v in row.items() if k in ("step", "loss", "grad_norm") or k.startswith("clinic/")}
        for row in trainer.state.log_history
        if "loss" in row
    ]


def measurements(plain, watched, watch, stopped, pasted_check, probe_status: str) -> dict:
    """The same numbers from each run (fp16 and float32), so that each check group can be fed the other run's: its
    log rows without (``plain``) and with the watch (``watched``), the raw loss per step and the NaN filter's replay
    of it (``replay_nan_filter``, the Trainer's arithmetic), the watch's findings, the trainable tensors' float32 sums
    where ``stop_on`` ended the run (``stopped``), where the pasted callback stopped, and the check-up's verdict."""
    found = {f.probe: f for f in watch.findings}
    raw = [row["raw_loss"] for row in watch.steps]
    return {
        "plain_logged": log_rows(plain),
        "watched_logged": log_rows(watched),
        "raw_loss": raw,
        "replayed_logs": replay_nan_filter(raw, 1, plain.args.logging_steps),
        "findings": {key: f.step for key, f in found.items()},
        "nonfinite_seen": found["nonfinite"].measured if "nonfinite" in found else "",
        "zero_loss_lesson": found["zero_loss"].lesson if "zero_loss" in found else None,
        "weight_sums": {
            name: (str(p.dtype).removeprefix("torch."), p.detach().sum(dtype=torch.float32).item())
            for name, p in stopped.model.named_parameters()
            if p.requires_grad
        },
        "stopped_step": stopped.state.global_step,
        "pasted_step": pasted_check.step,
        "pasted_names": pasted_check.names,
        "checkup_fp16_adamw": probe_status,
    }


def plot_watched(bad, fixed, bad_rows: list[dict], fixed_rows: list[dict], output_dir: Path) -> Path:
    """The core's figure: the loss the watch saw at every step and what the trainer logged, fp16 against float32,
    with each finding of the fp16 run marked at its step."""
    steps, raw = [r["step"] for r in bad.steps], [r["raw_loss"] for r in bad.steps]
    nan_grad = next(r["step"] for r in bad_rows if math.isnan(r["grad_norm"]))
    zero = next(r["step"] for r in bad_rows if r["loss"] == 0.0)
    found = {f.probe: f.step for f in bad.findings}
    title = (
        f"fp16 head: the watch says nonfinite at step {found['nonfinite']}; the log shows grad_norm nan at step "
        f"{nan_grad}\nand loss 0 at step {zero}. float32 weights: {len(fixed.findings)} findings"
    )
    fig, [ax] = plotting.figure(1, title=title, width=9.0, height=4.8)
    plotting.line(
        ax,
        [r["step"] for r in fixed.steps],
        [r["raw_loss"] for r in fixed.steps],
        "fixed",
        "float32: loss at each step",
        markersize=0,
        linewidth=1,
    )
    finite = [(s, v) for s, v in zip(steps, raw) if math.isfinite(v)]
    plotting.line(ax, *zip(*finite), "bad", "fp16: loss at each step (finite)", markersize=5, linestyle="none")
    top = max(r["raw_loss"] for r in fixed.steps) * 1.04
    ax.scatter(
        [s for s, v in zip(steps, raw) if not math.isfinite(v)],
        [top] * (len(steps) - len(finite)),
        marker="|",
        color=plotting.BAD,
        label="fp16: loss NaN at this step",
    )
    for rows, kind, label in ((bad_rows, "bad", "fp16: logged loss"), (fixed_rows, "fixed", "float32: logged loss")):
        plotting.line(
            ax,
            [r["step"] for r in rows],
            [r["loss"] for r in rows],
            kind,
            label,
            marker="s",
            markersize=7,
            linestyle="none",
            markerfacecolor="none",
        )
    for key, step in found.items():
        ax.axvline(step, color=plotting.BAD, linestyle=":", linewidth=1)
        ax.annotate(
            f"watch: {key}\n(step {step})",
            (step, 0.1),
            xycoords=("data", "axes fraction"),
            xytext=(3, 0),
            textcoords="offset points",
            fontsize=8,
            color=plotting.BAD,
        )
    plotting.label(ax, "optimizer step", "reward-model loss")
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.18), ncol=3)
    return plotting.save(fig, output_dir, "watch_your_run")
