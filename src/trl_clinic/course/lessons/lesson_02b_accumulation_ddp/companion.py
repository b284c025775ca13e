"""Companion of lesson 02b (core.py): the multi-process run, the one-process
reference, the per-process objective computed by hand, the comparison table and the figure, so that the notebook
keeps the settings, the launch and the numbers.

The notebook's launch spec says what runs: ``settings`` (name -> ``SFTConfig`` changes, with
``average_tokens_across_devices`` in them, visibly), ``rows`` ("mixed": the lesson's rows, a one-word answer and a
biography in turn; "biographies": one-person biographies only, every row as many label tokens) and
``batch_size`` (per process). The exercises change ``rows`` and ``batch_size``.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from datasets import Dataset
from trl import SFTConfig, SFTTrainer

from trl_clinic.course import data, plotting
from trl_clinic.course.lessons.lesson_02_accumulation.companion import label_tokens, weighted_token_gradient, window
from trl_clinic.course.models import make_causal_lm
from trl_clinic.course.run import Run
from trl_clinic.course.tokenizer import build_tokenizer
from trl_clinic.probes.gradients import cosine, first_step_gradient, label_counts, relative_error
from trl_clinic.probes.recording import quiet

ROWS = ("mixed", "biographies")


def rows(run: Run, kind: str = "mixed") -> Dataset:
    """The launch's training rows: "mixed" alternates a one-word answer and a biography of one to six people
    (``data.instruction_pairs`` guarantees it on every seed); "biographies" keeps one-person biographies only."""
    if kind not in ROWS:
        raise ValueError(f"unknown rows {kind!r}: choose one of {', '.join(ROWS)}")
    n = run.sizes.n_samples
    if kind == "mixed":
        return data.instruction_pairs(n, seed=run.subseed("train"))
    return data.instruction_pairs(2 * n, seed=run.subseed("train"), max_people=1).select(range(1, 2 * n, 2))


def one_step_trainer(
    run: Run, name: str, batch_size: int, accumulation: int, train_set: Dataset, **config
) -> SFTTrainer:
    """The real SFTTrainer for one step on ``train_set`` read in order (``sequential``): process p of W gets
    batches p, p + W, ... (accelerate 1.15, ``data_loader.py``, ``BatchSamplerShard`` with ``split_batches=False``),
    so one process with batch W x b x k and no accumulation gets the same rows. ``max_grad_norm=0``: the gradient
    as accumulation left it, not clipped."""
    tokenizer = build_tokenizer()
    args = SFTConfig(
        **{**run.trainer_kwargs(name, logging=False, progress=False), "bf16": False},
        per_device_train_batch_size=batch_size,
        gradient_accumulation_steps=accumulation,
        max_grad_norm=0,
        max_steps=1,
        train_sampling_strategy="sequential",
        **config,
    )
    return quiet(
        SFTTrainer(
            model=make_causal_lm(tokenizer, size=run.sizes.model_size, seed=run.seed),
            args=args,
            train_dataset=train_set,
            processing_class=tokenizer,
        )
    )


def distributed_gradients(run: Run, spec: dict) -> dict:
    """Runs in every process: the first step's gradient after DDP synchronised it, for each accumulation count
    and each setting of ``spec["settings"]``; the label tokens of each process's micro-batches (gathered, in rank
    order); what ran (backend, processes, accelerate's distributed type, the model's wrapper); and what the
    check-up's ``accumulation`` probe said about each setting's trainer at the largest accumulation count, in every
    process before it trained (the probe gathers the window's count across processes as the trainer does, so every
    process runs it at the same point)."""
    from accelerate.utils import gather_object

    from trl_clinic import checkup

    train_set, batch_size = rows(run, spec.get("rows", "mixed")), spec.get("batch_size", 1)
    gradients, counts, ran_as, probe = {}, {}, {}, {}
    for accumulation in run.sizes.accumulation:
        for setting, config in spec["settings"].items():
            trainer = one_step_trainer(
                run, f"ddp-{setting}-{accumulation}".replace(" ", "-"), batch_size, accumulation, train_set, **config
            )
            if accumulation == max(run.sizes.accumulation):
                probe[setting] = [(f.status, f.decided) for f in checkup(trainer, only=["accumulation"]).findings]
            gradients[(setting, accumulation)] = first_step_gradient(trainer)
            ran_as[setting] = f"{trainer.accelerator.distributed_type.value}, {type(trainer.model_wrapped).__name__}"
        counts[accumulation] = gather_object([label_counts(trainer, accumulation)])  # one list per process
    world = {"backend": torch.distributed.get_backend(), "processes": torch.distributed.get_world_size()}
    return {"gradients": gradients, "counts": counts, "ran_as": ran_as, "world": world, "probe": probe}


class Reference(NamedTuple):
    gradient: torch.Tensor
    label_tokens: int


def reference_gradients(run: Run, spec: dict) -> dict[int, Reference]:
    """Per accumulation count, one process with the whole batch (processes x batch x accumulation rows, no
    accumulation): its first-step gradient and the label tokens its loss saw."""
    train_set, batch_size, references = rows(run, spec.get("rows", "mixed")), spec.get("batch_size", 1), {}
    for accumulation in run.sizes.accumulation:
        trainer = one_step_trainer(
            run, f"reference-{accumulation}", run.sizes.processes * batch_size * accumulation, 1, train_set
        )
        references[accumulation] = Reference(first_step_gradient(trainer), sum(label_counts(trainer, 1)))
    return references


def per_process_weights(run: Run, spec: dict, accumulation: int) -> tuple[list[dict], list[int], list[float]]:
    """The rows of one distributed step as single-row batches, each process's label tokens N_p, and the weight
    each token of a row gets when every process divides by its own label count and DDP averages: 1/(W x N_p)."""
    processes, batch_size = run.sizes.processes, spec.get("batch_size", 1)
    single = window(
        one_step_trainer(run, "by-hand", 1, 1, rows(run, spec.get("rows", "mixed"))),
        processes * batch_size * accumulation,
    )
    owner = [(i // batch_size) % processes for i in range(len(single))]  # batches dealt to the processes in turn
    tokens = [sum(label_tokens(b) for b, p in zip(single, owner) if p == rank) for rank in range(processes)]
    return single, tokens, [1 / (processes * tokens[p]) for p in owner]


def per_process_gradient(run: Run, spec: dict, accumulation: int) -> torch.Tensor:
    """By hand, in one process: the gradient of (1/W) sum_p (summed token loss of process p / its label count)."""
    single, _, weights = per_process_weights(run, spec, accumulation)
    model = make_causal_lm(build_tokenizer(), size=run.sizes.model_size, seed=run.seed)
    return weighted_token_gradient(model, single, weights)


def compare(gradients: dict, references: dict[int, Reference], settings) -> dict[str, list[dict]]:
    """Each setting's relative error and cosine against the reference, per accumulation count."""
    return {
        setting: [
            {
                "accumulation": acc,
                "relative_error": relative_error(gradients[(setting, acc)], ref.gradient),
                "cosine": cosine(gradients[(setting, acc)], ref.gradient),
            }
            for acc, ref in references.items()
        ]
        for setting in settings
    }


def same_label_tokens(counts: dict[int, list[list[int]]], references: dict[int, Reference]) -> bool:
    """Did the reference's loss see as many label tokens as all processes' micro-batches?"""
    return all(ref.label_tokens == sum(map(sum, counts[acc])) for acc, ref in references.items())


def plot_errors(run: Run, comparison: dict[str, list[dict]], tokens: list[int], backend: str) -> None:
    """The lesson's figure: the weight of one token on each process, and the relative error against the big batch."""
    per_process, across = comparison["per-process"], comparison["across processes"]
    fig, (ax_weight, ax_error) = plotting.figure(
        2,
        title=f"{run.sizes.processes} processes over {backend}: counting tokens per process is "
        f"{min(r['relative_error'] for r in per_process):.0%} to {max(r['relative_error'] for r in per_process):.0%}"
        f" off,\ncounting them across processes matches to {max(r['relative_error'] for r in across):.0e}",
    )
    ranks = [f"process {p}\n({n} tokens)" for p, n in enumerate(tokens)]
    W = len(tokens)
    ax_weight.bar([r + "\nper process" for r in ranks], [1 / (W * n) for n in tokens], color=plotting.BAD)
    ax_weight.axhline(1 / sum(tokens), color=plotting.FIXED, label=f"across processes: 1/{sum(tokens)}")
    plotting.label(ax_weight, "", "weight of one token", f"accumulation {max(run.sizes.accumulation)}", log_y=True)
    accumulation = run.sizes.accumulation
    plotting.line(
        ax_error, accumulation, [r["relative_error"] for r in per_process], "bad", "average_tokens_across_devices=False"
    )
    plotting.line(
        ax_error,
        accumulation,
        [max(r["relative_error"], 1e-9) for r in across],
        "fixed",
        "average_tokens_across_devices=True",
    )
    plotting.label(
        ax_error,
        "accumulation steps per process (batch 1)",
        "gradient error vs one process",
        "first-step gradient",
        log_y=True,
    )
    ax_error.set_xticks(accumulation, [str(acc) for acc in accumulation])  # accumulation counts are integers
    ax_error.minorticks_off()
    plotting.save(fig, run.output_dir, "ddp_accumulation")
