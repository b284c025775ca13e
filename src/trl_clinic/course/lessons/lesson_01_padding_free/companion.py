"""Companion of lesson 01 (core.py and its deep dive,
deeper.py): the copy-task model, the eras started in the
background, the runners that repeat the notebook's own trainer over batch sizes, and the figures.

The notebooks keep the lines that show the bug and the fix: they build every ``SFTTrainer`` themselves
(``padding_free=True``, ``model_init_kwargs={"attn_implementation": ...}``) and hand that builder to the
runners here, which only repeat it and record what the trainer logged.
"""

from __future__ import annotations

import copy
import logging
import math
import random
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import torch
from datasets import Dataset, concatenate_datasets
from matplotlib.colors import to_rgb
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    TrainerCallback,
)
from trl import SFTConfig, SFTTrainer

from trl_clinic.course import data, eras, plotting
from trl_clinic.course.handshake import neutral_config

# the copy task's vocabulary, response template and tokenizer are the era script's, so both sides agree
from trl_clinic.course.lessons.lesson_01_padding_free.then import TEMPLATE, VOCAB
from trl_clinic.course.lessons.lesson_01_padding_free.then import tiny_tokenizer as copy_tokenizer
from trl_clinic.course.models import make_causal_lm, model_config
from trl_clinic.course.run import Run
from trl_clinic.course.runtime import peak_memory_mib, reset_peak_memory
from trl_clinic.probes.packing import packed_vs_separate
from trl_clinic.probes.recording import quiet

ERA_OLD, ERA_LATE = "01-trl-0.14", "01-transformers-4.55"
# Copying needs two layers (one head finds the earlier position, the next reads it): one layer of the profile's
# size stayed at a loss of about 1.7 after 200 steps at seeds 0-5, two reached 0.9 to 1.3.
COPIER_LAYERS = 2


# ---- the copy task: a model that must read its own prompt -----------------------------------------------


def copy_examples(count: int, seed: int) -> Dataset:
    """``k`` random tokens, the template, the same ``k`` tokens again, eos; the loss is on the copy and eos
    (``completion_mask``): the completion can only be predicted by attending to the sequence's own prompt."""
    rng, rows = random.Random(seed), {"input_ids": [], "completion_mask": []}
    for _ in range(count):
        prompt = [rng.randrange(5, VOCAB) for _ in range(rng.randint(3, 8))]
        rows["input_ids"].append(prompt + TEMPLATE + prompt + [1])
        rows["completion_mask"].append([0] * (len(prompt) + 2) + [1] * (len(prompt) + 1))
    return Dataset.from_dict(rows)


def handed_over(run: Run) -> Path:
    """Where ``train_copier`` leaves the trained weights for the eras started before it (``start_era``)."""
    return run.output_dir / "then" / "copier.pt"


def train_copier(run: Run) -> Path:
    """A tiny Llama trained on the copy task with today's real ``SFTTrainer`` (padded), saved as a model folder
    with its tokenizer (the model every comparison of the lesson loads, today and in the eras), and its weights
    handed over to the eras (``handed_over``); if training fails, a marker tells the waiting eras to stop."""
    weights = handed_over(run)
    weights.parent.mkdir(exist_ok=True)
    try:
        model, losses = _train_copier(run)
    except BaseException:
        weights.with_suffix(".failed").touch()
        raise
    folder = run.output_dir / "copier"
    model.save_pretrained(folder)
    copy_tokenizer().save_pretrained(folder)
    partial = weights.with_suffix(".partial")  # an era waits for the file: it appears whole or not at all
    torch.save(
        {name: tensor.detach().float().cpu().contiguous() for name, tensor in model.state_dict().items()}, partial
    )
    partial.rename(weights)
    print(
        f"copy-task model: {run.sizes.copier_steps} padded SFT steps, loss {losses[0]:.2f} -> {losses[-1]:.2f}; "
        f"saved in {folder.name}/"
    )
    return folder


def _train_copier(run: Run) -> tuple[PreTrainedModel, list[float]]:
    sizes = run.sizes
    model = make_causal_lm(copy_tokenizer(), size=sizes.model_size, seed=run.seed, num_hidden_layers=COPIER_LAYERS)
    args = SFTConfig(
        **run.trainer_kwargs("copier", progress=False),
        max_length=None,
        completion_only_loss=True,
        per_device_train_batch_size=sizes.copier_batch_size,
        max_steps=sizes.copier_steps,
        learning_rate=sizes.copier_learning_rate,
        lr_scheduler_type="constant",
    )
    examples = copy_examples(sizes.copier_batch_size * sizes.copier_steps, run.subseed("copier"))
    trainer = quiet(SFTTrainer(model=model, args=args, train_dataset=examples, processing_class=copy_tokenizer()))
    trainer.train()
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    return trainer.accelerator.unwrap_model(trainer.model, keep_fp32_wrapper=False), losses


# ---- the eras: the same model and examples on the old libraries -----------------------------------------


def start_era(run: Run, era: str, examples: Dataset) -> Future:
    """``then.py`` (this folder's era script) in ``era``, in a background thread (on the core the lesson's one
    torch thread leaves free). It loads the old libraries at once, then waits for ``train_copier`` to hand over
    the copy-task model's weights (``handed_over``), and runs the same examples. Start every era before
    ``train_copier``: the weights of an earlier run in the same folder are removed here, so no era reads them."""
    weights = handed_over(run)
    for stale in (weights, weights.with_suffix(".failed")):
        stale.unlink(missing_ok=True)
    spec = {
        "seed": run.subseed("then"),
        "threads": 1,
        "loss_batch_sizes": list(run.sizes.batch_sizes),
        "mask_lengths": list(run.sizes.mask_lengths),
        "examples": examples.to_dict(),
        "model": {
            "config": neutral_config(
                model_config(copy_tokenizer(), size=run.sizes.model_size, num_hidden_layers=COPIER_LAYERS)
            ),
            "weights": str(handed_over(run)),
        },
    }
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=era)
    future = pool.submit(eras.run_in_era, era, "then_01", spec, run.output_dir / "then")
    pool.shutdown(wait=False)
    return future


def prepare(run: Run, era: str = ERA_OLD) -> tuple[Dataset, Future, Path]:
    """The lesson's setup in one call: the copy-task examples, ``era`` started on them in the background
    (``start_era``) and the copy-task model trained meanwhile (``train_copier``), in the order that lets the era
    load its libraries while today's side trains."""
    examples = copy_examples(run.sizes.samples, run.subseed("examples"))
    then = start_era(run, era, examples)
    return examples, then, train_copier(run)


def show_logs(then: eras.EraRun) -> None:
    """The old trainer's own log lines at the largest batch size, padded and padding-free, and the mean by batch."""
    print(then.describe())
    if not then.finished:
        return
    losses = then.result["loss_by_batch_size"]
    print(f"  the trainer's model runs: {', '.join(losses['attn_implementation'])}")
    for name, label in (("padded", "padded"), ("padding_free", "padding_free=True")):
        print(f"  {label}, batch {losses['batch_sizes'][-1]}, the trainer's log lines:")
        for entry in losses["log"][name]:
            print("   ", {key: entry[key] for key in ("loss", "grad_norm", "learning_rate", "epoch")})
    print(
        "  mean logged loss, padding-free / padded: "
        + ", ".join(f"batch {b}: {r:.2f}" for b, r in zip(losses["batch_sizes"], losses["ratio"]))
    )


def era_numbers(then: eras.EraRun) -> dict:
    """What the checks read from one era's result (``status`` alone when it did not run)."""
    numbers = {"status": then.status}
    if then.finished:
        result, losses = then.result, then.result["loss_by_batch_size"]
        numbers.update(
            collator=result["collator"],
            differences=result["max_abs_logit_difference"],
            attention_pattern=result["attention_pattern"],
            losses={
                key: losses[key]
                for key in ("batch_sizes", "padded", "padding_free", "ratio", "attn_implementation", "warnings")
            },
        )
    return numbers


def record(
    run: Run, then: eras.EraRun, today: dict, portable: dict[str, list[float]], counts: dict[str, int], probe: str
) -> dict:
    """The core's numbers for its checks (the lesson's checks.py): each run's loss by batch size (the era's for the
    run without the fix, ``today``'s for the one with it), its portable check (OPT, the Llama) and its cross-sequence
    cells (``counts``, from ``show_masks``), the check-up's verdict on OPT (``probe``) and the era's own numbers."""
    then_numbers = era_numbers(then)
    runs = {
        "without_fix": {
            "losses": then_numbers.pop("losses", None),
            "portable": portable["OPT"],
            "foreign_cells": counts.get("TRL 0.14 + transformers 4.48.3"),
        },
        "with_fix": {"losses": today, "portable": portable["Llama"], "foreign_cells": counts["today's transformers"]},
    }
    return {
        "precision": run.precision,
        "attention": run.attention,
        "runs": runs,
        "checkup_opt": probe,
        "then": then_numbers,
    }


# ---- the mechanism: which key each query may attend to ------------------------------------------------


@torch.no_grad()
def attention_pattern(checkpoint: Path, lengths: list[int], **forward: object) -> list[list[int]]:
    """1 where a query of the packed row gives a key a weight above 0 (today's eager kernel, layer 0, head 0),
    the row sent as padding-free collators send it: ``position_ids`` restarting at 0 per sequence, no mask."""
    model = AutoModelForCausalLM.from_pretrained(checkpoint, attn_implementation="eager").eval()
    positions = torch.tensor([[i for n in lengths for i in range(n)]])
    ids = torch.arange(5, 5 + positions.shape[1])[None]
    out = model(input_ids=ids, position_ids=positions, output_attentions=True, **{"use_cache": False, **forward})
    return (out.attentions[0][0, 0] > 0).int().tolist()


def old_pattern(then: eras.EraRun) -> list[list[int]] | None:
    """The era's pattern for the row as the padding-free collator sends it (no mask, no cache); None if it did
    not run."""
    return then.result["attention_pattern"]["eval, use_cache=False, no mask"] if then.finished else None


def foreign_cells(pattern: list[list[int]], lengths: list[int]) -> int:
    """Query/key pairs of different sequences that the pattern lets through."""
    owner = [i for i, n in enumerate(lengths) for _ in range(n)]
    return sum(allowed for q, row in enumerate(pattern) for k, allowed in enumerate(row) if owner[q] != owner[k])


def foreign_counts(masks: dict[str, list[list[int]] | None], lengths: list[int]) -> dict[str, int]:
    """``foreign_cells`` of every pattern that was measured."""
    return {name: foreign_cells(mask, lengths) for name, mask in masks.items() if mask is not None}


def show_masks(run: Run, then: eras.EraRun, checkpoint: Path, lengths: list[int]) -> dict[str, int]:
    """The core's mechanism: the era's pattern (``old_pattern``) beside today's (``attention_pattern``) for one
    packed row of ``lengths``, drawn (``plot_masks``); the cross-sequence cells of each pattern measured."""
    masks = {
        "TRL 0.14 + transformers 4.48.3": old_pattern(then),  # None when the era did not run
        "today's transformers": attention_pattern(checkpoint, lengths),
    }
    plot_masks(run, masks, lengths)
    return foreign_counts(masks, lengths)


def plot_masks(
    run: Run, masks: dict[str, list[list[int]] | None], lengths: list[int], file: str = "attention_masks"
) -> None:
    """One panel per pattern: a key of the query's own sequence green, of another sequence red, none white."""
    masks = {name: mask for name, mask in masks.items() if mask is not None}
    owner = [i for i, n in enumerate(lengths) for _ in range(n)]
    positions = [str(i) for n in lengths for i in range(n)]
    counts = foreign_counts(masks, lengths)
    fig, axes = plotting.figure(
        len(masks),
        width=4.2,
        height=4.4,
        title="One packed row: which keys each query reads "
        f"({' vs '.join(str(c) for c in counts.values())} across sequences, red)",
    )
    for ax, (name, mask) in zip(axes, masks.items()):
        colours = [
            [
                (1, 1, 1) if not allowed else to_rgb(plotting.STYLE["fixed" if owner[q] == owner[k] else "bad"])
                for k, allowed in enumerate(row)
            ]
            for q, row in enumerate(mask)
        ]
        ax.imshow(colours)
        ax.set_xticks(range(len(positions)), positions)
        ax.set_yticks(range(len(positions)), positions)
        ax.set_xticks([x - 0.5 for x in range(1, len(positions))], minor=True)
        ax.set_yticks([y - 0.5 for y in range(1, len(positions))], minor=True)
        ax.grid(which="minor", color="#bbbbbb", linewidth=0.5)
        ax.grid(which="major", visible=False)
        plotting.label(ax, "key (its position_id)", "query (its position_id)", f"{name}: {counts[name]} red")
    plotting.save(fig, run.output_dir, file)


# ---- the fix, measured: the notebook's trainer over batch sizes at learning rate 0 ------------------------


def mean_logged(trainer: SFTTrainer, key: str = "loss") -> float:
    """Train, then the mean of what the trainer logged at each step (``logging_steps=1``)."""
    quiet(trainer).train()
    values = [entry[key] for entry in trainer.state.log_history if key in entry and "train_runtime" not in entry]
    # Trainer logs 0.0 for a NaN step loss: the ratios divide by these, so they must be real
    assert values and all(math.isfinite(v) and v > 0 for v in values), f"non-finite or missing {key}: {values}"
    return sum(values) / len(values)


@contextmanager
def quiet_batch_one_warning():
    """TRL warns at every padding-free trainer of batch 1 that batch 1 gains nothing: true, and the point of
    that baseline (one sequence per row has nothing to contaminate)."""
    logger = logging.getLogger("trl.trainer.sft_trainer")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def loss_by_batch_size(make_trainer: Callable[[int, bool], SFTTrainer], batch_sizes: list[int]) -> dict:
    """``make_trainer(batch_size, padding_free)`` trained one epoch per batch size and mode: mean logged loss,
    the ratio padding-free / padded, and the attention implementation the trainer's model really has."""
    out: dict[str, list] = {"batch_sizes": list(batch_sizes), "padded": [], "padding_free": []}
    for size in batch_sizes:
        for name, padding_free in (("padded", False), ("padding_free", True)):
            with quiet_batch_one_warning():
                trainer = make_trainer(size, padding_free)
            out["attention"] = trainer.model.config._attn_implementation
            out[name].append(mean_logged(trainer))
    out["ratio"] = [free / padded for free, padded in zip(out["padding_free"], out["padded"])]
    print(
        "today, mean logged loss, padding-free / padded: "
        + ", ".join(f"batch {b}: {r:.4f}" for b, r in zip(batch_sizes, out["ratio"]))
        + f" (the model runs {out['attention']})"
    )
    return out


def plot_bad_vs_fixed(run: Run, then: eras.EraRun, today: dict) -> None:
    """The figure of the lesson: padding-free over padded loss by batch size, the report's libraries and today's."""
    old = then.result["loss_by_batch_size"] if then.finished else None
    worst = f"{old['ratio'][-1]:.1f}x on TRL 0.14, " if old else ""
    fig, (ax,) = plotting.figure(
        1,
        width=8,
        title=f"Padding-free / padded loss at batch {today['batch_sizes'][-1]}: {worst}{today['ratio'][-1]:.2f}x today",
    )
    if old:
        plotting.line(ax, old["batch_sizes"], old["ratio"], "bad", "TRL 0.14 + transformers 4.48.3 (sdpa)")
    plotting.line(ax, today["batch_sizes"], today["ratio"], "fixed", f"today's TRL, {today['attention']}")
    ax.axhline(1, color=plotting.REFERENCE, linestyle="--", linewidth=1)
    ax.set_xscale("log", base=2)
    ax.set_xticks(today["batch_sizes"], [str(b) for b in today["batch_sizes"]])
    plotting.label(
        ax,
        "per-device batch size (sequences packed into one row)",
        "mean logged loss, padding-free / padded",
        "copy task, learning rate 0, one epoch",
    )
    plotting.save(fig, run.output_dir, "padding_free_vs_padded")


def checkup_status(report) -> str:
    """The packing probe's verdict in a check-up report."""
    return next((finding.status for finding in report.findings if finding.probe == "packing"), "absent")


# ---- deep dive: TRL 0.21 + transformers 4.55 in their era ------------------------------------------------


def describe_late(then: eras.EraRun) -> None:
    """The era's padding-free batch as its SFTTrainer builds it on sdpa, its warning, its loss by batch size
    and the packed-vs-alone logit table (with and without the config's cache)."""
    print(then.describe())
    if not then.finished:
        return
    result, losses = then.result, then.result["loss_by_batch_size"]
    print(
        f"  collator: {result['collator']['collator']}\n    -> keys {result['collator']['keys']}, attention mask all "
        f"ones: {result['collator']['attention_mask_all_ones']}"
    )
    for warning in losses["warnings"]:
        print(f"  the trainer warned: {warning[:150]}...")
    print(
        "  real SFTTrainer at lr 0, padding-free / padded loss: "
        + ", ".join(f"batch {b}: {r:.2f}" for b, r in zip(losses["batch_sizes"], losses["ratio"]))
    )
    for implementation, rows in result["max_abs_logit_difference"].items():
        for mode, difference in rows.items():
            verdict = "isolated" if difference < result["isolated_below"] else "CONTAMINATED"
            print(f"  {implementation:>5} | {mode:<52} {verdict} (largest logit difference {difference:.2g})")


# ---- deep dive: what keeps packed sequences apart today, family by family --------------------------------

# Weights drawn 10x wider than the usual 0.02 (``initializer_range``; OPT's ``init_std``) make attention far from
# uniform, so a foreign token moves the loss measurably without training (at 0.02, Bloom's packed/alone difference
# was 2e-5, under the probe's 1e-4). MPT is left at its 0.02 (transformers 5.23.0, ``configuration_mpt.py``): its
# packed rows are contaminated without the wider draw (3.7e-3 at seed 0).
WIDE_INIT = 0.2
FAMILY_CONFIGS = {
    "llama": {
        "hidden_size": 128,
        "intermediate_size": 384,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 4096,
        "initializer_range": WIDE_INIT,
    },
    "qwen2": {
        "hidden_size": 128,
        "intermediate_size": 384,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 4096,
        "initializer_range": WIDE_INIT,
    },
    "opt": {
        "hidden_size": 128,
        "ffn_dim": 384,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "word_embed_proj_dim": 128,
        "max_position_embeddings": 4096,
        "init_std": WIDE_INIT,
    },
    "falcon": {"hidden_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "initializer_range": WIDE_INIT},
    "bloom": {"hidden_size": 128, "n_layer": 2, "n_head": 4, "initializer_range": WIDE_INIT},
    "mpt": {"d_model": 128, "n_layers": 2, "n_heads": 4, "max_seq_len": 4096},
}


def as_sequence(tokenizer: PreTrainedTokenizerBase, row: dict) -> list[int]:
    """One prompt-completion sample as the token ids SFTTrainer trains on (with eos)."""
    return tokenizer(row["prompt"] + row["completion"])["input_ids"] + [tokenizer.eos_token_id]


def family_model(tokenizer: PreTrainedTokenizerBase, family: str, seed: int) -> PreTrainedModel:
    """A tiny random ``family`` model (``FAMILY_CONFIGS``) on sdpa where the family has it, else eager."""
    config = AutoConfig.for_model(
        family,
        vocab_size=len(tokenizer),
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
        tie_word_embeddings=True,
        **FAMILY_CONFIGS[family],
    )
    for implementation in ("sdpa", "eager"):
        try:
            torch.manual_seed(seed)
            return AutoModelForCausalLM.from_config(config, attn_implementation=implementation)
        except ValueError:  # "... through torch.nn.functional.scaled_dot_product_attention yet"
            continue
    raise ValueError(f"{family} has neither sdpa nor eager attention")


def family_probe(
    tokenizer: PreTrainedTokenizerBase, family: str, seed: int, sequences: list[list[int]]
) -> dict[str, object]:
    """``packed_vs_separate`` with today's padding-free inputs (``position_ids``, no mask, no cache)."""
    model = family_model(tokenizer, family, seed)
    return {"attention": model.config._attn_implementation, **packed_vs_separate(model, sequences)}


def describe_probes(probes: dict[str, dict]) -> None:
    """One verdict line per probe."""
    for name, result in probes.items():
        verdict = "isolated" if result["isolated"] else "CONTAMINATED"
        where = f", {result['attention']}" if "attention" in result else ""
        print(
            f"{name:>34}: {verdict} (largest relative loss difference {result['max_relative_difference']:.1e}{where})"
        )


def verdicts(probes: dict[str, dict]) -> dict[str, dict]:
    """The probes cut to what the checks read (the per-sequence losses are only needed on the way)."""
    keep = ("isolated", "max_relative_difference", "attention", "ratio")
    return {name: {k: v for k, v in r.items() if k in keep} for name, r in probes.items()}


def record_runs(
    loss_ratio: dict[str, dict],
    grad_ratio: dict[str, dict],
    training: dict[str, dict],
    gap: dict[str, float],
    remedies: dict[str, dict],
    probes: dict[str, dict],
    families: dict[str, dict],
    kernels: dict[str, str],
    era: dict,
) -> dict[str, dict]:
    """The deep dive's two runs for its checks (the lesson's checks_deeper.py): OPT's (``without_fix``) and the
    Llama's (``with_fix``) ratios, training, gap and remedies, each keyed by run; the probes split into the
    contaminating ones (a mask of ones, a cache; OPT, Falcon, Bloom, MPT) and the isolated ones; the kernel a model
    instance and a model path got; and the era's train-mode differences (``era``, from ``era_numbers``)."""
    probe_values, family_values = verdicts(probes), verdicts(families)
    rows = era.get("differences", {}).values()
    runs = {
        name: {
            "loss_ratio": loss_ratio[name],
            "grad_ratio": grad_ratio[name],
            "training": training[name],
            "gap": gap[name],
            "remedies": remedies[name],
        }
        for name in ("without_fix", "with_fix")
    }
    runs["without_fix"] |= {
        "probes": {k: v for k, v in probe_values.items() if k.startswith("+")},
        "families": {f: family_values[f] for f in ("opt", "falcon", "bloom", "mpt")},
        "kernel": kernels["model instance"],
        "era_difference": min((r["train, config use_cache=True, no mask"] for r in rows), default=None),
    }
    runs["with_fix"] |= {
        "probes": {k: v for k, v in probe_values.items() if not k.startswith("+")},
        "families": {f: family_values[f] for f in ("llama", "qwen2")},
        "kernel": kernels["model path"],
        "era_difference": max((r["train, use_cache=False, no mask"] for r in rows), default=None),
    }
    return runs


def plot_families(run: Run, probes: dict[str, dict]) -> None:
    """Packed/alone loss per family with today's padding-free inputs."""
    contaminated = [name for name, r in probes.items() if not r["isolated"]]
    fig, (ax,) = plotting.figure(
        1,
        width=7,
        title=f"Today's padding-free inputs: {len(contaminated)} of {len(probes)} families still mix packed sequences",
    )
    names = list(probes)
    ax.barh(
        names,
        [max(probes[name]["max_relative_difference"], 1e-9) for name in names],
        color=[plotting.STYLE["fixed" if probes[name]["isolated"] else "bad"] for name in names],
    )
    ax.axvline(1e-4, color=plotting.REFERENCE, linestyle="--")
    ax.set_xscale("log")
    plotting.label(
        ax,
        "largest relative loss difference, packed vs alone",
        "",
        "position_ids, no mask, no cache; left of the dashed line: kept apart",
    )
    plotting.save(fig, run.output_dir, "families")


# ---- deep dive: OPT, a family today's sdpa still contaminates, through the real SFTTrainer ---------------

MODES = {"padded": False, "padding-free": True}
EARLY = 5  # the last optimizer steps averaged for a run's final logged loss


class Bench:
    """The deep dive's warmed-up models and the runs it repeats: lr-0 measurements and short trainings."""

    def __init__(self, run: Run, tokenizer: PreTrainedTokenizerBase) -> None:
        self.run, self.tokenizer = run, tokenizer
        self.weights: dict[str, dict] = {}
        self._measured: dict[tuple, dict[str, float]] = {}

    def warm_model(self, family: str = "opt") -> PreTrainedModel:  # the profile's opt_size
        """A fresh ``family`` model with the warmed-up weights (trained once, padded, whole-sequence loss, on the
        lesson's text): a random model predicts every token about equally badly, whatever it attends to."""
        sizes = self.run.sizes
        model = make_causal_lm(self.tokenizer, family, size=sizes.opt_size, seed=self.run.seed)
        if family not in self.weights:
            half = sizes.warmup_batch_size * sizes.warmup_steps // 2
            warm = concatenate_datasets(
                [
                    data.mrc_samples(half, seed=self.run.subseed("warm-up"), max_sentences=sizes.max_sentences),
                    data.instruction_pairs(half, seed=self.run.subseed("warm-up"), max_people=2),
                ]
            )
            args = SFTConfig(
                **self.run.trainer_kwargs(f"warmup-{family}", progress=False),
                max_length=None,
                completion_only_loss=False,
                per_device_train_batch_size=sizes.warmup_batch_size,
                max_steps=sizes.warmup_steps,
                learning_rate=sizes.warmup_learning_rate,
            )
            trainer = SFTTrainer(
                model=model,
                args=args,
                processing_class=self.tokenizer,
                train_dataset=warm.shuffle(seed=self.run.subseed("warm-up order")),
            )
            losses = logged(trainer)["loss"]
            print(f"{family} warm-up ({sizes.warmup_steps} steps, padded): loss {losses[0]:.2f} -> {losses[-1]:.2f}")
            self.weights[family] = copy.deepcopy(model.state_dict())
        model.load_state_dict(self.weights[family])
        return model

    def measure(
        self, make_trainer: Callable[..., SFTTrainer], padding_free: bool, batch_size: int, dataset: Dataset, **kwargs
    ) -> dict[str, float]:
        """Mean logged loss and grad norm over one epoch at lr 0 (the weights never change, only the batching
        does). The same run asked twice is measured once."""
        key = (padding_free, batch_size, dataset._fingerprint, tuple(sorted(kwargs.items())))
        if key not in self._measured:
            trainer = make_trainer(
                batch_size, padding_free, dataset, learning_rate=0.0, max_steps=len(dataset) // batch_size, **kwargs
            )
            log = logged(trainer)
            self._measured[key] = {name: sum(values) / len(values) for name, values in log.items()}
        return self._measured[key]

    def sweep(
        self,
        make_trainer: Callable[..., SFTTrainer],
        settings: dict[str, tuple[Dataset, bool]],
        batch_sizes: list[int],
        **kwargs,
    ) -> dict:
        """Every setting x mode x batch size at lr 0 (``kwargs`` to every trainer), and one line per setting."""
        sweep = {}
        for name, (dataset, completion_only) in settings.items():
            sweep[name] = {
                mode: [
                    self.measure(make_trainer, padding_free, b, dataset, completion_only_loss=completion_only, **kwargs)
                    for b in batch_sizes
                ]
                for mode, padding_free in MODES.items()
            }
            print(
                f"{name:>30}: padding-free/padded loss "
                + ", ".join(f"{r:.2f}" for r in ratios(sweep[name]))
                + "; grad norm "
                + ", ".join(f"{r:.1f}" for r in ratios(sweep[name], "grad_norm"))
                + f" at batch {', '.join(map(str, batch_sizes))}"
            )
        return sweep

    def training(
        self,
        make_trainer: Callable[..., SFTTrainer],
        padding_free: bool,
        dataset: Dataset,
        held_out: list[list[int]],
        **config,
    ) -> dict:
        """A short real training from the warmed-up weights (loss and grad norm per step), then the held-out
        packed/alone loss ratio on the weights it left (``packed_vs_separate``, today's padding-free inputs)."""
        sizes = self.run.sizes
        config = {"learning_rate": sizes.train_learning_rate, "max_steps": sizes.train_steps, **config}
        trainer = make_trainer(sizes.train_batch_size, padding_free, dataset, **config)
        log = logged(trainer)
        probe = packed_vs_separate(trainer.model, held_out)
        return {
            **log,
            "mean_loss": sum(log["loss"]) / len(log["loss"]),
            "final_loss": sum(log["loss"][-EARLY:]) / EARLY,
            "held_out_ratio": probe["ratio"],
        }


def logged(trainer: SFTTrainer) -> dict[str, list[float]]:
    """Train (quietly, batch-1 warning off) and return the loss and grad norm the trainer logged at every step."""
    with quiet_batch_one_warning():
        quiet(trainer).train()
    rows = [entry for entry in trainer.state.log_history if "loss" in entry and "train_runtime" not in entry]
    log = {key: [row[key] for row in rows] for key in ("loss", "grad_norm")}
    # Trainer logs 0.0 for a NaN step loss: the ratios divide by these, so they must be real
    assert log["loss"] and all(math.isfinite(v) and v > 0 for v in log["loss"]), f"non-finite loss: {log['loss']}"
    return log


def ratios(runs: dict[str, list[dict[str, float]]], key: str = "loss") -> list[float]:
    """Padding-free over padded, batch size by batch size, at the same weights."""
    return [free[key] / padded[key] for free, padded in zip(runs["padding-free"], runs["padded"])]


def length_grouped(dataset: Dataset, size: int) -> Dataset:
    """The ``size`` samples in the middle of the length order: one batch of balanced lengths."""
    order = sorted(range(len(dataset)), key=lambda i: len(dataset[i]["prompt"]))
    return dataset.select(order[(len(order) - size) // 2 :][:size])


def plot_sweep(run: Run, sweep: dict, batch_sizes: list[int]) -> None:
    """Every setting's padding-free/padded loss and grad-norm ratio by batch size (the worst setting in red)."""
    worst = max(sweep, key=lambda name: ratios(sweep[name])[-1])
    fig, (ax_loss, ax_grad) = plotting.figure(
        2,
        title=f"OPT today: padding-free up to {ratios(sweep[worst])[-1]:.2f}x the padded loss, more at bigger batches",
    )
    for name, runs in sweep.items():
        style = {"linestyle": "-" if name.startswith("MRC") else ":", "marker": "o" if "completion" in name else "s"}
        kind = "bad" if name == worst else "other"
        plotting.line(ax_loss, batch_sizes, ratios(runs), kind, name, **style)
        plotting.line(ax_grad, batch_sizes, ratios(runs, "grad_norm"), kind, name, **style)
    for ax, what in ((ax_loss, "loss"), (ax_grad, "grad norm")):
        ax.axhline(1, color=plotting.REFERENCE, linestyle="--", linewidth=1)
        ax.set_xscale("log", base=2)
        ax.set_xticks(batch_sizes, [str(b) for b in batch_sizes])
        plotting.label(ax, "per-device batch size", f"padding-free / padded {what}", "same weights, learning rate 0")
    plotting.save(fig, run.output_dir, "opt_by_batch_size")


def describe_training(training: dict[str, dict]) -> None:
    for mode, t in training.items():
        norms = t["grad_norm"]
        print(
            f"{mode:>26}: loss {t['loss'][0]:.2f} -> {sum(t['loss'][-EARLY:]) / EARLY:.2f} (last {EARLY} steps); "
            "grad norm "
            f"at step 1 {norms[0]:.2f}, largest {max(norms):.2f} (step {norms.index(max(norms)) + 1})"
            + (f"; held-out packed/alone loss {t['held_out_ratio']:.3f}" if "held_out_ratio" in t else "")
        )


def plot_training(run: Run, training: dict[str, dict]) -> None:
    """Per-step logged loss and grad norm of the short trainings."""
    spike = training["OPT, padding-free"]["grad_norm"][0] / training["OPT, padded"]["grad_norm"][0]
    fig, (ax_loss, ax_grad) = plotting.figure(
        2, title=f"OPT training: padding-free starts at {spike:.1f}x the padded grad norm and logs a higher loss"
    )
    kinds = {"OPT, padded": "reference", "OPT, padding-free": "bad"}
    for mode, t in training.items():
        if mode in kinds:
            steps = range(1, len(t["loss"]) + 1)
            plotting.line(ax_loss, steps, t["loss"], kinds[mode], mode)
            plotting.line(ax_grad, steps, t["grad_norm"], kinds[mode], mode)
    plotting.label(ax_loss, "optimizer step", "logged loss (nats/token)", f"batch {run.sizes.train_batch_size}")
    plotting.label(ax_grad, "optimizer step", "grad norm (before clipping)", "grad norm per step", log_y=True)
    plotting.save(fig, run.output_dir, "training")


def describe_remedies(remedies: dict[str, dict]) -> None:
    for name, r in remedies.items():
        trained = f"; held-out packed/alone after training {r['held_out_ratio']:.3f}" if "held_out_ratio" in r else ""
        print(
            f"{name:>30}: loss {r['over_padded']:.2f}x padded; logged loss {r['loss']:.2f} against {r['baseline']:.2f} "
            f"without it{trained}"
        )


def plot_remedies(run: Run, remedies: dict[str, dict]) -> None:
    """Each remedy's loss against padded (1: cured) and its logged loss against no remedy (below 1: hidden)."""
    hidden = [name for name, r in remedies.items() if r["loss"] < r["baseline"]]
    fig, (ax_cure, ax_logged) = plotting.figure(
        2,
        width=6.5,
        height=3.6,
        title=f"Remedies: {len(hidden)} of {len(remedies)} lower the logged loss, none brings it back to padded",
    )
    names = list(remedies)
    ax_cure.barh(names, [remedies[name]["over_padded"] for name in names], color=plotting.BAD)
    ax_cure.axvline(1, color=plotting.REFERENCE, linestyle="--")
    ax_cure.set_xlim(left=min(0.95, min(r["over_padded"] for r in remedies.values()) - 0.02))
    plotting.label(ax_cure, "loss / padded loss (1: cured)", "", "cured?")
    ax_logged.barh(names, [remedies[name]["loss"] / remedies[name]["baseline"] for name in names], color=plotting.OTHER)
    ax_logged.axvline(1, color=plotting.REFERENCE, linestyle="--")
    ax_logged.set_yticklabels([])
    plotting.label(ax_logged, "logged loss / without the remedy", "", "does the logged loss look better? (< 1)")
    plotting.save(fig, run.output_dir, "remedies")


# ---- deep dive: why bother (padding share, throughput, memory) ----------------------------------------


class _StepClock(TrainerCallback):
    """The time at the end of every optimizer step (after the device finished it)."""

    def __init__(self, device: torch.device) -> None:
        self.device, self.ends = device, []

    def on_step_end(self, args, state, control, **kwargs):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.ends.append(time.perf_counter())


def throughput(trainer: SFTTrainer, warm_steps: int) -> dict[str, float | None]:
    """Share of pad tokens in the batches the trainer will see, real tokens per second over the steps after
    the first ``warm_steps`` (kernel selection and allocation happen there), and peak memory."""
    steps = quiet(trainer).args.max_steps
    # the same seeded sampler feeds train(): these are the batches it will see
    batches = [batch for batch, _ in zip(trainer.get_train_dataloader(), range(steps))]
    slots = [batch["input_ids"].numel() for batch in batches]  # positions the model computes
    real = [
        int(batch["attention_mask"].sum()) if "attention_mask" in batch else batch["input_ids"].numel()
        for batch in batches
    ]  # a padding-free row holds no pad token
    clock = _StepClock(trainer.model.device)
    trainer.add_callback(clock)
    reset_peak_memory(trainer.model.device)
    trainer.train()
    seconds = clock.ends[-1] - clock.ends[warm_steps - 1]
    return {
        "padding_share": 1 - sum(real) / sum(slots),
        "tokens_per_second": sum(real[warm_steps:]) / seconds,
        "mean_row_tokens": sum(slots) / len(slots),
        "peak_memory_mib": peak_memory_mib(trainer.model.device),
    }


def describe_throughput(speed: dict[str, dict]) -> None:
    for name, numbers in speed.items():
        memory = f"{numbers['peak_memory_mib']:.0f} MiB" if numbers["peak_memory_mib"] else "not measured on CPU"
        print(
            f"{name:>13}: padding share {numbers['padding_share']:.0%}, "
            f"{numbers['tokens_per_second']:.0f} real tokens/s, "
            f"peak memory {memory}"
        )
    print(
        f"padding-free / padded throughput: "
        f"{speed['padding-free']['tokens_per_second'] / speed['padded']['tokens_per_second']:.2f}x"
    )


def plot_throughput(run: Run, speed: dict[str, dict], attention: str) -> None:
    share = speed["padded"]["padding_share"]
    fig, (ax,) = plotting.figure(
        1,
        width=7,
        title=f"{share:.0%} of the padded slots were padding; padding-free: "
        f"{speed['padding-free']['tokens_per_second'] / speed['padded']['tokens_per_second']:.2f}x "
        "the real tokens/s",
    )
    plotting.bars(
        ax, list(speed), [s["tokens_per_second"] for s in speed.values()], ["reference", "fixed"], fmt="{:.0f}"
    )
    plotting.label(ax, f"batch {run.sizes.speed_batch_size}, {attention}, {run.device.type}", "real tokens / second")
    plotting.save(fig, run.output_dir, "throughput")
