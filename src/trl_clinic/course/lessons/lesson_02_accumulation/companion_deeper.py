"""Companion of lesson 02's deep dive (deeper.py): the sweep over
accumulation counts on three paths, the reported losses, the label counts of padded and packed rows, the trained
runs, the loss-jump reading, the model classes that declare no loss kwargs, the figure, and what section 7's bisect
recorded.

The old normalisation is re-created on today's Trainer by ``stand_ins.recreate_pre_446_loss`` (the deep dive
first shows that it gives the real transformers 4.45.2 gradient); a custom ``compute_loss`` that drops
``num_items_in_batch`` is the hand-set fault ``stand_ins.MeanPerMicroBatchSFTTrainer``.
"""

from __future__ import annotations

import re
import textwrap
from collections.abc import Callable, Sequence
from pathlib import Path

import transformers
from datasets import Dataset
from packaging.requirements import Requirement
from transformers import PreTrainedModel, PreTrainedTokenizerBase
from trl import SFTConfig, SFTTrainer

from trl_clinic.bisect import Outcome
from trl_clinic.course import plotting
from trl_clinic.course.eras.spec import requirements_file
from trl_clinic.course.lessons.lesson_02_accumulation.companion import FirstStep
from trl_clinic.course.run import Run
from trl_clinic.course.runtime import progress
from trl_clinic.course.stand_ins import MeanPerMicroBatchSFTTrainer, recreate_pre_446_loss
from trl_clinic.probes.gradients import cosine, label_counts, relative_error
from trl_clinic.probes.recording import StepRecorder

PATHS = ("today", "old", "custom")  # the three ways batch 1 x N is normalised in sections 3 and 4


def models_without_loss_kwargs() -> dict[str, list[str]]:
    """The model classes whose source in the installed transformers sets ``accepts_loss_kwargs = False``, by
    modeling file: read as text (importing every model would take seconds), so a class is listed under the
    file that defines it."""
    found = {}
    for path in sorted((Path(transformers.__file__).parent / "models").glob("*/modeling_*.py")):
        text = path.read_text(encoding="utf-8")
        classes = [
            match.group(1)
            for match in re.finditer(
                r"^class (\w+)\([^\n]*\):\n(?:(?:[ \t].*|)\n)*?[ \t]+accepts_loss_kwargs = False", text, re.M
            )
        ]
        if classes:
            found[f"{path.parent.name}/{path.name}"] = classes
    return found


def accumulation_sweep(
    steps: FirstStep, counts: Sequence[int], custom_class: type[SFTTrainer] = MeanPerMicroBatchSFTTrainer
) -> dict[str, list[dict]]:
    """Section 3: at each accumulation count, batch 1 x count on today's path, the old path and a custom
    ``compute_loss`` against one batch of count rows: gradient error, cosine, the reported loss, and the distance
    from count times the old path's gradient (the custom path's arithmetic; every path has it, so one path's
    record can stand in another's place)."""
    sweep = {path: [] for path in PATHS}
    for count in progress(counts, "accumulation sweep"):
        big, big_loss = steps.run_step(count, 1)
        candidates = {
            "today": steps.run_step(1, count),
            "old": steps.run_step(1, count, "old"),
            "custom": steps.run_step(1, count, trainer_class=custom_class),
        }
        for path, (gradient, reported) in candidates.items():
            sweep[path].append(
                {
                    "accumulation": count,
                    "relative_error": relative_error(gradient, big),
                    "cosine": cosine(gradient, big),
                    "reported_loss": reported,
                    "big_batch_reported_loss": big_loss,
                    "vs_count_times_old": relative_error(gradient, count * candidates["old"][0]),
                }
            )
        print(
            f"1 x {count:>2}: "
            + "  ".join(
                f"{path}: err {sweep[path][-1]['relative_error']:.2e} cos {sweep[path][-1]['cosine']:.6f}"
                for path in PATHS
            )
        )
    return sweep


def print_reported_losses(sweep: dict[str, list[dict]]) -> None:
    """Section 4: the training loss each path reports for its one step, and the custom one over the old one."""
    for today, old, custom in zip(*(sweep[path] for path in PATHS)):
        count = today["accumulation"]
        print(
            f"1 x {count:>2} reports: today {today['reported_loss']:.3f} "
            f"(batch {count}: {today['big_batch_reported_loss']:.3f}), old {old['reported_loss']:.3f}, "
            f"custom {custom['reported_loss']:.1f} = {custom['reported_loss'] / old['reported_loss']:.3f} x old"
        )


def label_spread(steps: FirstStep, window: int) -> dict[str, dict]:
    """Section 5: label tokens per micro-batch over the whole training set, one row per micro-batch (padded) and
    packed rows, and their spread (standard deviation / mean), and in the first ``window`` micro-batches read in
    order; the longest sample in tokens, against the packing length (TRL's best-fit-decreasing packing cuts a
    longer one)."""
    spread = {}
    for name, packing in (("padded", False), ("packed", True)):
        trainer = steps.trainer(1, 1, packing=packing)
        counts = label_counts(trainer)
        mean = sum(counts) / len(counts)
        std = (sum((c - mean) ** 2 for c in counts) / len(counts)) ** 0.5
        spread[name] = {
            "micro_batches": len(counts),
            "min": min(counts),
            "max": max(counts),
            "coefficient_of_variation": std / mean,
            "first_window": [min(counts[:window]), max(counts[:window])],
        }
        print(
            f"{name}: {len(counts)} micro-batches, label tokens {min(counts)} to {max(counts)}, "
            f"spread (std / mean) {std / mean:.2f}"
        )
        if not packing:
            spread["longest_sample_tokens"] = max(len(ids) for ids in trainer.train_dataset["input_ids"])
    spread["packing_length"] = steps.packing_length
    return spread


def train_curve(
    run: Run,
    make_model: Callable[[], PreTrainedModel],
    tokenizer: PreTrainedTokenizerBase,
    train_set: Dataset,
    eval_sets: dict[str, Dataset],
    name: str,
    config: dict,
    normalisation: str,
) -> StepRecorder:
    """Section 6: one run over the training data, logged every step and evaluated four times; each held-out
    subset is one batch, so its loss is the true token mean (a mean of batch means would repeat the bug)."""
    sizes = run.sizes
    args = SFTConfig(
        **run.trainer_kwargs(f"curve-{name.replace(' ', '-')}"),
        **config,
        learning_rate=sizes.learning_rate,
        warmup_steps=0.1,  # a float below 1 is a ratio
        max_steps=sizes.curve_steps,
        train_sampling_strategy="sequential",  # every window half one-word answers, half biographies
        eval_strategy="steps",
        eval_steps=max(1, sizes.curve_steps // 4),
        per_device_eval_batch_size=max(len(subset) for subset in eval_sets.values()),
    )
    trainer = SFTTrainer(
        model=make_model(), args=args, train_dataset=train_set, eval_dataset=eval_sets, processing_class=tokenizer
    )
    if normalisation == "old":
        recreate_pre_446_loss(trainer)
    recorder = StepRecorder().watch(trainer)
    trainer.train()
    recorder.save(Path(run.output_dir) / f"history_{name.replace(' ', '_')}.json")
    return recorder


def plot_runs(curves: dict[str, StepRecorder], n: int, output_dir: Path) -> Path:
    """Section 6's figure: the logged training loss and the held-out loss of the three trained runs."""
    last = {name: rec.last("eval_all_loss") for name, rec in curves.items()}
    fig, (ax_train, ax_eval) = plotting.figure(
        2,
        title=f"Batch 1 x {n}, old arithmetic (recreated): another logged loss, held-out loss {last['old']:.3f}\n"
        f"against {last['big batch']:.3f} for batch {n}; today's batch 1 x {n} is batch {n}",
    )
    legends = {
        "big batch": ("reference", f"batch {n} x 1"),
        "today": ("fixed", f"batch 1 x {n}, today"),
        "old": ("bad", f"batch 1 x {n}, old (recreated)"),
    }
    for name, (kind, legend) in legends.items():
        # today's line lies on the big batch's: the big batch is drawn wide underneath, today dotted on top
        style = {"big batch": {"linewidth": 5, "alpha": 0.4}, "today": {"linestyle": ":"}}.get(name, {})
        plotting.line(ax_train, *curves[name].series("loss"), kind, legend, **style)
        plotting.line(ax_eval, *curves[name].series("eval_all_loss"), kind, legend, **style)
    plotting.label(ax_train, "optimizer step", "logged training loss (nats/token)", "what each run logs")
    plotting.label(ax_eval, "optimizer step", "held-out loss (nats/token)", "held-out loss, all answers")
    return plotting.save(fig, output_dir, "gradient_accumulation_runs")


BISECT_COLUMNS = ("version", "build", "label tokens", "loss", "grad norm", "verdicts", "vs good")  # fits 120 columns


def era_pins(era: str, moving: str) -> list[str]:
    """The era's requirement lines without the package that moves, and ``datasets`` left to the resolver: the era
    does not pin it, and bisect would otherwise pin this environment's, which TRL 0.11.4 predates."""
    lines = requirements_file(era).read_text().splitlines()
    pins = [line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]
    return [pin for pin in pins if Requirement(pin).name != moving] + ["datasets"]


def say(line: str) -> None:
    """A bisect progress line, folded to the notebook's width."""
    print(textwrap.fill(line, 116, subsequent_indent="    "))


def bisect_numbers(outcome: Outcome | None, skipped: str = "") -> dict:
    """What the checks read of section 7's bisect: ``finished`` when it decided (``skipped`` with the reason when the
    index could not be read, ``undecided`` when a build or a step failed), the first change, the last version that
    matched, the parts, and each measured version's label tokens, loss, gradient norm and accumulation verdict."""
    if outcome is None:
        return {"status": "skipped", "reason": skipped}
    versions = {}
    for version, step in outcome.measured.items():
        record = step.record or {}
        verdicts = record.get("verdicts") or {}
        versions[version] = {
            "status": step.status,
            "label_tokens": record.get("label_tokens"),
            "loss": record.get("loss"),
            "grad_norm": record.get("grad_norm"),
            "accumulation": (verdicts.get("accumulation") or {}).get("status"),
        }
    return {
        "status": "finished" if outcome.decided else "undecided",
        "window": outcome.versions,
        "first": outcome.first,
        "last_same": outcome.last_same,
        "parts": outcome.measured[outcome.first].parts if outcome.first else [],
        "versions": versions,
    }
