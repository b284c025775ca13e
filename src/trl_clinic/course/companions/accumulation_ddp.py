"""Companion of notebooks/02b_gradient_accumulation_ddp.py: the multi-process run, the one-process
reference, the comparison table and the figure, so that the notebook keeps the settings, the launch
and the numbers.

Each setting is a dict of ``SFTConfig`` changes written in the notebook (``average_tokens_across_devices``
is there, visibly); the setting named ``old`` is also re-created with ``recreate_pre_446_loss``.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from datasets import Dataset
from trl import SFTConfig, SFTTrainer

from trl_clinic.course import data, plotting
from trl_clinic.probes.gradients import cosine, first_step_gradient, label_counts, relative_error
from trl_clinic.course.models import make_causal_lm
from trl_clinic.course.parameters import Run
from trl_clinic.course.stand_ins import recreate_pre_446_loss
from trl_clinic.course.tokenizer import build_tokenizer

RECREATED = "old"  # the setting re-created on today's Trainer (stand_ins.recreate_pre_446_loss)


def one_step_trainer(run: Run, name: str, batch_size: int, accumulation: int, train_set: Dataset | None = None,
                     **config) -> SFTTrainer:
    """The real SFTTrainer for one step on ``train_set`` (the lesson's data by default) read in order
    (``sequential``): process p of W gets batches p, p + W, ... (accelerate 1.15, ``data_loader.py``,
    ``BatchSamplerShard`` with ``split_batches=False``), so one process with batch W x accumulation gets
    the same rows. ``max_grad_norm=0``: the gradient as accumulation left it, not clipped. Used by
    sections 1-2 and the worked solutions."""
    tokenizer = build_tokenizer()
    args = SFTConfig(**{**run.trainer_kwargs(name, logging=False, progress=False), "bf16": False},
                     per_device_train_batch_size=batch_size, gradient_accumulation_steps=accumulation,
                     max_grad_norm=0, max_steps=1, train_sampling_strategy="sequential", **config)
    if train_set is None:
        train_set = data.instruction_pairs(run.sizes.n_samples, seed=run.subseed("train"))
    return SFTTrainer(model=make_causal_lm(tokenizer, size=run.sizes.model_size, seed=run.seed), args=args,
                      train_dataset=train_set, processing_class=tokenizer)


def distributed_gradients(run: Run, spec: dict) -> dict:
    """Section 1 (runs in every process): the first step's gradient after DDP synchronised it, for each
    accumulation count and each setting in ``spec["settings"]``; the label tokens of each process's
    micro-batches (gathered, in rank order); and what ran: backend, processes, accelerate's distributed
    type and the model's wrapper."""
    from accelerate.utils import gather_object

    gradients, counts, ran_as = {}, {}, {}
    for accumulation in run.sizes.accumulation:
        for setting, config in spec["settings"].items():
            name = f"ddp-{setting}-{accumulation}".replace(", ", "-")
            trainer = one_step_trainer(run, name, 1, accumulation, **config)
            if setting == RECREATED:
                recreate_pre_446_loss(trainer)
            gradients[(setting, accumulation)] = first_step_gradient(trainer)
            ran_as[setting] = f"{trainer.accelerator.distributed_type.value}, {type(trainer.model_wrapped).__name__}"
        counts[accumulation] = gather_object([label_counts(trainer, accumulation)])  # one list per process
    world = {"backend": torch.distributed.get_backend(), "processes": torch.distributed.get_world_size()}
    return {"gradients": gradients, "counts": counts, "ran_as": ran_as, "world": world}


class Reference(NamedTuple):
    gradient: torch.Tensor
    label_tokens: int


def reference_gradients(run: Run) -> dict[int, Reference]:
    """Section 1: per accumulation count, one process with the whole batch (processes x accumulation
    rows, no accumulation): its first-step gradient and the label tokens its loss saw."""
    references = {}
    for accumulation in run.sizes.accumulation:
        trainer = one_step_trainer(run, f"reference-{accumulation}", run.sizes.processes * accumulation, 1)
        references[accumulation] = Reference(first_step_gradient(trainer), sum(label_counts(trainer, 1)))
    return references


def compare(gradients: dict, references: dict[int, Reference], settings) -> dict[str, list[dict]]:
    """Section 2: each setting's relative error and cosine against the reference, per accumulation count."""
    return {setting: [{"accumulation": acc, "relative_error": relative_error(gradients[(setting, acc)], ref.gradient),
                       "cosine": cosine(gradients[(setting, acc)], ref.gradient)}
                      for acc, ref in references.items()]
            for setting in settings}


def same_label_tokens(counts: dict[int, list[list[int]]], references: dict[int, Reference]) -> bool:
    """Section 2: did the reference's loss see as many label tokens as all processes' micro-batches?"""
    return all(ref.label_tokens == sum(map(sum, counts[acc])) for acc, ref in references.items())


def plot_errors(run: Run, comparison: dict[str, list[dict]], backend: str, fsdp_applied: bool) -> None:
    """Section 2's figure: relative error (log scale) and cosine against the big batch, per setting."""
    fsdp = [s for s in comparison if "fsdp" in s]
    kinds = {RECREATED: "bad", "per-process": "other"}
    legend = {RECREATED: f"{RECREATED} (recreated)",
              **{s: f"{s}=True ({'FSDP' if fsdp_applied else 'ran as DDP'})" for s in fsdp}}
    styles = {"per-process": {"linestyle": ":"}, **{s: {"linestyle": "--", "marker": "x"} for s in fsdp}}
    fig, (ax_err, ax_cos) = plotting.figure(
        2, title=f"{run.sizes.processes} processes: only counts summed across processes match the big batch")
    accumulation = run.sizes.accumulation
    for setting, rows in comparison.items():
        style = (kinds.get(setting, "fixed"), legend.get(setting, setting))
        plotting.line(ax_err, accumulation, [max(r["relative_error"], 1e-9) for r in rows], *style,
                      **styles.get(setting, {}))
        plotting.line(ax_cos, accumulation, [r["cosine"] for r in rows], *style, **styles.get(setting, {}))
    x_label = "accumulation steps per process (batch 1)"
    plotting.label(ax_err, x_label, "relative error vs big batch", f"gradient error ({backend})", log_y=True)
    plotting.label(ax_cos, x_label, "cosine with big-batch gradient", "direction")
    for ax in (ax_err, ax_cos):
        ax.set_xticks(accumulation, [str(acc) for acc in accumulation])  # accumulation counts are integers
        ax.minorticks_off()
    plotting.save(fig, run.output_dir, "ddp_accumulation")
