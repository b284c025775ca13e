"""Companion of notebooks/01_padding_free_high_loss.py: the warm-up, the sweep runners, the eras started
in the background, the report lines and the multi-panel figures that a learner need not read.

The notebook keeps the lines that show the bug and the fix: it builds every ``SFTTrainer`` itself
(``padding_free=True``, the re-created all-ones mask, ``attn_implementation``) and hands that builder
to the runners here, which only repeat it over batch sizes, settings and modes and record the logs.
"""

from __future__ import annotations

import copy
import logging
import math
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from datasets import Dataset, concatenate_datasets
from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedModel, PreTrainedTokenizerBase
from trl import SFTConfig, SFTTrainer

from trl_clinic.course import data, eras, plotting
from trl_clinic.course.models import make_causal_lm
from trl_clinic.probes.packing import packed_vs_separate
from trl_clinic.course.parameters import Run
from trl_clinic.probes.recording import StepRecorder, quiet
from trl_clinic.course.runtime import peak_memory_mib, reset_peak_memory

MODES = ("padded", "contaminated", "fixed")
ERAS = ("01-trl-0.14", "01-transformers-4.55")
EARLY = 5  # the first optimizer steps, where the report saw the grad norm "fluctuate abnormally"
# Section 5: the families probed at random init. Weights drawn 10x wider than the usual 0.02 make
# attention far from uniform, so a foreign token moves the loss measurably even without training
# (at 0.02, Bloom's packed/alone difference was 2e-5, under the probe's 1e-4).
WIDE_INIT = 0.2
FAMILY_CONFIGS = {
    "llama": {"hidden_size": 128, "intermediate_size": 384, "num_hidden_layers": 2, "num_attention_heads": 4,
              "num_key_value_heads": 2, "max_position_embeddings": 4096, "initializer_range": WIDE_INIT},
    "qwen2": {"hidden_size": 128, "intermediate_size": 384, "num_hidden_layers": 2, "num_attention_heads": 4,
              "num_key_value_heads": 2, "max_position_embeddings": 4096, "initializer_range": WIDE_INIT},
    "opt": {"hidden_size": 128, "ffn_dim": 384, "num_hidden_layers": 2, "num_attention_heads": 4,
            "word_embed_proj_dim": 128, "max_position_embeddings": 4096, "init_std": WIDE_INIT},
    "falcon": {"hidden_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "initializer_range": WIDE_INIT},
    "bloom": {"hidden_size": 128, "n_layer": 2, "n_head": 4, "initializer_range": WIDE_INIT},
    "mpt": {"d_model": 128, "n_layers": 2, "n_heads": 4, "max_seq_len": 4096},
}


def as_sequence(tokenizer: PreTrainedTokenizerBase, row: dict) -> list[int]:
    """Sections 3, 7, 8: one prompt-completion sample as the token ids SFTTrainer trains on (with eos)."""
    return tokenizer(row["prompt"] + row["completion"])["input_ids"] + [tokenizer.eos_token_id]


def length_grouped_row(tokenizer: PreTrainedTokenizerBase, dataset: Dataset, size: int) -> list[list[int]]:
    """Section 8: the rows a length-grouped batch packs together, the middle of the samples sorted by length."""
    by_length = sorted(dataset, key=lambda row: len(row["prompt"]))
    return [as_sequence(tokenizer, row) for row in by_length[(len(by_length) - size) // 2:][:size]]


def describe_probes(probes: dict[str, dict]) -> None:
    """Sections 3 and 5: one verdict line per probe."""
    for name, result in probes.items():
        verdict = "isolated" if result["isolated"] else "CONTAMINATED"
        where = f", {result['attention']}" if "attention" in result else ""
        print(f"{name:>38}: {verdict} (largest relative loss difference {result['max_relative_difference']:.1e}{where})")


def kernel_dtype(attention: str) -> torch.dtype:
    """Section 10: FlashAttention-2 takes half-precision weights; sdpa keeps fp32 (bf16 autocast on a GPU)."""
    return torch.bfloat16 if attention.startswith("flash_attention") else torch.float32


def describe_throughput(speed: dict[str, dict]) -> None:
    """Section 10: padding share, tokens per second and peak memory, and the speed-up."""
    for name, numbers in speed.items():
        memory = f"{numbers['peak_memory_mib']:.0f} MiB" if numbers["peak_memory_mib"] else "not measured on CPU"
        print(f"{name:>12}: padding share {numbers['padding_share']:.0%}, {numbers['tokens_per_second']:.0f} tokens/s, "
              f"peak memory {memory}")
    print(f"padding-free / padded throughput: "
          f"{speed['padding_free']['tokens_per_second'] / speed['padded']['tokens_per_second']:.2f}x")


def collect_numbers(run: Run, **numbers: object) -> dict:
    """Checks: the run's numbers for metrics.json, probes cut to their verdicts (the per-sequence losses
    are only needed on the way)."""
    keep = ("isolated", "max_relative_difference", "attention")
    for key in ("probes", "family_probes"):
        numbers[key] = {name: {k: v for k, v in r.items() if k in keep} for name, r in numbers[key].items()}
    speed = numbers["throughput"]
    return {"speed_attention": run.attention,
            "padding_free_speedup": speed["padding_free"]["tokens_per_second"] / speed["padded"]["tokens_per_second"],
            **numbers}


@contextmanager
def _quiet_batch_one_warning():
    """TRL warns at every padding-free run of batch 1 that batch 1 gains nothing: true, and the point
    of that baseline (one sequence per row has nothing to contaminate)."""
    logger = logging.getLogger("trl.trainer.sft_trainer")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def start_eras(run: Run) -> dict[str, Future]:
    """Section 2 and 6: both eras in one background thread, on the core the lesson's single torch
    thread leaves free, so their 20-30 s overlap the warm-up and the sweeps."""
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="eras")
    futures = {era: pool.submit(eras.run_in_era, era, "then_01_padding_free", {"seed": run.subseed("then")},
                                run.output_dir / "then") for era in ERAS}
    pool.shutdown(wait=False)
    return futures


def era_numbers(then: eras.EraRun) -> dict:
    """Section 2 and 6: what the checks read from one era's result (``status`` alone when it did not run)."""
    numbers = {"status": then.status}
    if then.finished:
        collator = then.result["collator"]
        numbers.update(collator_has_mask=collator["has_attention_mask"],
                       collator_mask_all_ones=collator["attention_mask_all_ones"],
                       differences=then.result["max_abs_logit_difference"])
        by_batch = then.result.get("loss_by_batch_size")
        if by_batch:
            numbers["loss_ratio_by_batch_size"] = dict(zip(by_batch["batch_sizes"], by_batch["ratio"]))
    return numbers


def describe_era(then: eras.EraRun) -> None:
    """Section 2 and 6: the era's collator, its loss by batch size and its packed-vs-alone table."""
    print(then.describe())
    if not then.finished:
        return
    print(f"  collator: {then.result['collator']['collator']} -> keys {then.result['collator']['keys']}")
    by_batch = then.result.get("loss_by_batch_size")
    if by_batch:
        print("  real SFTTrainer at lr 0, padding-free / padded loss: " + ", ".join(
            f"batch {b}: {r:.2f}" for b, r in zip(by_batch["batch_sizes"], by_batch["ratio"])))
    for implementation, rows in then.result["max_abs_logit_difference"].items():
        for mode, difference in rows.items():
            verdict = "isolated" if difference < then.result["isolated_below"] else "CONTAMINATED"
            print(f"  {implementation:>5} | {mode:<40} {verdict} (largest logit difference {difference:.2g})")


def family_probe(tokenizer: PreTrainedTokenizerBase, family: str, seed: int,
                 sequences: list[list[int]]) -> dict[str, object]:
    """Section 5: ``packed_vs_separate`` with today's padding-free inputs (``position_ids``, no mask, no
    cache) on a tiny random ``family`` model, on sdpa where the family has it, else eager."""
    config = AutoConfig.for_model(family, vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id,
                                  eos_token_id=tokenizer.eos_token_id, bos_token_id=None, tie_word_embeddings=True,
                                  **FAMILY_CONFIGS[family])
    for implementation in ("sdpa", "eager"):
        try:
            torch.manual_seed(seed)
            model = AutoModelForCausalLM.from_config(config, attn_implementation=implementation)
            break
        except ValueError:  # "... does not support an attention implementation through sdpa yet"
            continue
    probe = packed_vs_separate(model, sequences)
    return {"attention": model.config._attn_implementation, **probe}


@dataclass
class Bench:
    """The lesson's models and the runs it repeats: warm-up, lr-0 measurements, short trainings."""

    run: Run
    tokenizer: PreTrainedTokenizerBase
    weights: dict[str, dict] = field(default_factory=dict)
    _measured: dict[tuple, dict[str, float]] = field(default_factory=dict)

    def warmup_set(self) -> Dataset:
        sizes = self.run.sizes
        half = sizes.warmup_batch_size * sizes.warmup_steps // 2
        return concatenate_datasets([data.mrc_samples(half, seed=self.run.subseed("warm-up")),
                                     data.instruction_pairs(half, seed=self.run.subseed("warm-up"), max_people=2)])

    def warm_model(self, family: str = "llama") -> PreTrainedModel:
        """Section 1: a fresh model with the family's warmed-up weights (trained once, padded, whole-sequence
        loss): a random model predicts every token about equally badly whatever it attends to."""
        model = make_causal_lm(self.tokenizer, family, size=self.run.sizes.model_size, seed=self.run.seed)
        if family not in self.weights:
            self.weights[family] = self._warm_up(model, family)
        model.load_state_dict(self.weights[family])
        return model

    def _warm_up(self, model: PreTrainedModel, family: str) -> dict:
        sizes = self.run.sizes
        args = SFTConfig(**self.run.trainer_kwargs(f"warmup-{family}"), per_device_train_batch_size=sizes.warmup_batch_size,
                         learning_rate=sizes.warmup_learning_rate, max_steps=sizes.warmup_steps, max_length=None,
                         completion_only_loss=False)
        trainer = SFTTrainer(model=model, args=args, processing_class=self.tokenizer,
                             train_dataset=self.warmup_set().shuffle(seed=self.run.subseed("warm-up order")))
        log = StepRecorder().watch(trainer)
        trainer.train()
        raw = log.series("raw_loss")[1]
        # every later ratio divides by losses of this model: a warm-up that diverged must stop here, loudly
        assert all(math.isfinite(v) and v > 0 for v in raw), f"{family} warm-up diverged: raw losses {raw[-5:]}"
        print(f"{family} warm-up ({sizes.warmup_steps} steps, padded): loss {log.series('loss')[1][0]:.2f} -> "
              f"{log.last('loss'):.2f}")
        return copy.deepcopy(model.state_dict())

    def measure(self, make_trainer: Callable[..., SFTTrainer], mode: str, batch_size: int, dataset: Dataset,
                **kwargs) -> dict[str, float]:
        """Sections 1, 4, 5, 7: mean logged loss and grad norm over the dataset at lr 0 (the weights never
        change, only the batching does). The same run asked twice is measured once."""
        key = (mode, batch_size, dataset._fingerprint, tuple(sorted(kwargs.items())))
        if key not in self._measured:
            with _quiet_batch_one_warning():
                recorder, _ = self.train(make_trainer, mode, batch_size, dataset, learning_rate=0.0,
                                         max_steps=len(dataset) // batch_size, **kwargs)
            losses, norms = recorder.series("loss")[1], recorder.series("grad_norm")[1]
            self._measured[key] = {"loss": sum(losses) / len(losses), "grad_norm": sum(norms) / len(norms)}
        return self._measured[key]

    @staticmethod
    def train(make_trainer: Callable[..., SFTTrainer], mode: str, batch_size: int, dataset: Dataset,
              **kwargs) -> tuple[StepRecorder, PreTrainedModel]:
        """One real run of the notebook's trainer, recorded step by step."""
        trainer = make_trainer(mode, batch_size, dataset, **kwargs)
        recorder = StepRecorder().watch(trainer)
        trainer.train()
        # Trainer logs 0.0 for a NaN step loss: the ratios divide by these, so they must be real
        assert all(math.isfinite(v) and v > 0 for v in recorder.series("raw_loss")[1]), f"{mode} run: non-finite loss"
        return recorder, trainer.model

    def sweep(self, make_trainer: Callable[..., SFTTrainer], settings: dict[str, tuple[Dataset, bool]],
              batch_sizes: list[int]) -> dict:
        """Section 4: every setting x mode x batch size at lr 0, and one report line per setting."""
        sweep = {}
        for name, (dataset, completion_only) in settings.items():
            sweep[name] = {mode: [self.measure(make_trainer, mode, b, dataset, completion_only=completion_only)
                                  for b in batch_sizes] for mode in MODES}
            print(f"{name:>30}: contaminated/padded loss " + ", ".join(f"{r:.2f}" for r in ratios(sweep[name]))
                  + "; grad norm " + ", ".join(f"{r:.1f}" for r in ratios(sweep[name], key="grad_norm"))
                  + f" at batch {', '.join(map(str, batch_sizes))}")
        return sweep

    def training(self, make_trainer: Callable[..., SFTTrainer], mode: str, dataset: Dataset,
                 held_out: list[list[int]], **config) -> dict:
        """Sections 7 and 8: a short real training run from the warmed-up Llama (per-step loss and grad norm),
        then ``packed_vs_separate`` on held-out rows packed the way the run packed them."""
        sizes = self.run.sizes
        config = {"learning_rate": sizes.train_learning_rate, "max_steps": sizes.train_steps, **config}
        recorder, model = self.train(make_trainer, mode, sizes.train_batch_size, dataset, **config)
        losses, norms = recorder.series("loss")[1], recorder.series("grad_norm")[1]
        probe = packed_vs_separate(model, held_out[:sizes.train_batch_size], all_ones_mask=mode == "contaminated")
        return {"loss": losses, "grad_norm": norms, "mean_loss": sum(losses) / len(losses),
                "mean_grad_norm": sum(norms) / len(norms), "final_loss": sum(losses[-EARLY:]) / EARLY,
                "early_grad_max": max(norms[:EARLY]), "early_grad_spread": float(torch.tensor(norms[:EARLY]).std()),
                "held_out_loss": sum(probe["separate"]) / len(probe["separate"]),
                "isolated": probe["isolated"], "ratio": probe["ratio"]}


def ratios(runs: dict[str, list[dict[str, float]]], mode: str = "contaminated", key: str = "loss") -> list[float]:
    """Sections 4 and 5: ``mode`` over padded, batch size by batch size, at the same weights."""
    return [c[key] / p[key] for c, p in zip(runs[mode], runs["padded"])]


def describe_training(training: dict[str, dict]) -> None:
    """Section 7: one line per mode."""
    for mode, t in training.items():
        print(f"{mode:>12}: loss {t['loss'][0]:.2f} -> {t['final_loss']:.2f} (last {EARLY} steps); grad norm at step 1 "
              f"{t['grad_norm'][0]:.2f}, first {EARLY} steps max {t['early_grad_max']:.2f}; "
              f"held-out loss alone {t['held_out_loss']:.3f}")


def remedy_at_lr_0(logged: dict[str, float], model: PreTrainedModel, sequences: list[list[int]],
                   baseline: dict[str, float]) -> dict:
    """Section 8: a data-side remedy's lr-0 logged numbers, and the probe on the warmed-up weights with its rows."""
    probe = packed_vs_separate(model, sequences, all_ones_mask=True)
    return {"loss": logged["loss"], "grad_norm": logged["grad_norm"], "isolated": probe["isolated"],
            "ratio": probe["ratio"], "baseline": baseline}


def remedy_trained(t: dict, padded: dict, contaminated: dict) -> dict:
    """Section 8: an optimizer-side remedy (or the cure), against the contaminated training.

    Every training starts from the warmed-up weights on the same first batch, so the step-1 loss over
    padded's step-1 loss is the cost of the row's foreign context at equal weights; the probe runs on
    the weights the training leaves: do packed sequences still see each other?
    """
    return {"loss": t["mean_loss"], "grad_norm": t["mean_grad_norm"], "isolated": t["isolated"],
            "ratio": t["loss"][0] / padded["loss"][0], "ratio_after_training": t["ratio"],
            "baseline": {"loss": contaminated["mean_loss"], "grad_norm": contaminated["mean_grad_norm"]}}


def judge_remedies(remedies: dict[str, tuple[str, dict]], separation: str) -> dict[str, dict]:
    """Section 8: each remedy hides the symptom (lower logged numbers), cures it (probe isolated) or neither."""
    judged = {}
    for name, (how, r) in remedies.items():
        hides = r["loss"] < r["baseline"]["loss"] or r["grad_norm"] < r["baseline"]["grad_norm"]
        verdict = "cures it" if r["isolated"] else ("hides it, no cure" if hides else "neither hides nor cures it")
        judged[name] = {"how": how, "separates": name == separation, "verdict": verdict, **r}
        print(f"{name + ' (' + how + ')':>50}: logged loss {r['loss']:.2f} (contaminated {r['baseline']['loss']:.2f}), "
              f"grad norm {r['grad_norm']:.2f} ({r['baseline']['grad_norm']:.2f}); equal-weights loss ratio "
              f"{r['ratio']:.3f} -> {verdict}")
    return judged


def throughput(trainer: SFTTrainer, pad_token_id: int) -> dict[str, float | None]:
    """Section 10: the share of pad tokens in the batches the trainer will see, real tokens per second and
    peak memory of its training run."""
    steps = quiet(trainer).args.max_steps
    # the same seeded sampler feeds train(): these are the batches it will see
    batches = [batch for batch, _ in zip(trainer.get_train_dataloader(), range(steps))]
    slots = sum(batch["input_ids"].numel() for batch in batches)  # positions the model computes
    real = sum(int((batch["input_ids"] != pad_token_id).sum()) for batch in batches)
    device = trainer.model.device
    reset_peak_memory(device)
    start = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - start
    return {"padding_share": 1 - real / slots, "tokens_per_second": real / seconds, "seconds": seconds,
            "peak_memory_mib": peak_memory_mib(device)}


def plot_sweep(run: Run, sweep: dict, batch_sizes: list[int], main: str) -> None:
    """Section 4: loss and grad norm by batch size on the main setting, and every setting's ratio."""
    fig, (ax_loss, ax_grad) = plotting.figure(
        2, title="Padding-free batches with an all-ones mask (recreated): loss and grad norm grow with batch size")
    for mode, kind in (("contaminated", "bad"), ("padded", "reference"), ("fixed", "fixed")):
        label = "fixed (on top of padded)" if mode == "fixed" else mode
        plotting.line(ax_loss, batch_sizes, [r["loss"] for r in sweep[main][mode]], kind, label)
        plotting.line(ax_grad, batch_sizes, [r["grad_norm"] for r in sweep[main][mode]], kind, label)
    plotting.label(ax_loss, "per-device batch size", "mean loss (nats/token)", f"{main}, same weights")
    plotting.label(ax_grad, "per-device batch size", "mean grad norm", f"{main}, same weights")
    for ax in (ax_loss, ax_grad):
        ax.set_xscale("log", base=2)
    plotting.save(fig, run.output_dir, "padding_free")
    fig, axes = plotting.figure(len(sweep), title="Contaminated (recreated) / padded loss ratio, every setting", width=3.6)
    for ax, (name, runs) in zip(axes, sweep.items()):
        plotting.line(ax, batch_sizes, ratios(runs), "bad", "contaminated / padded")
        plotting.line(ax, batch_sizes, ratios(runs, "fixed"), "fixed", "fixed / padded")
        ax.set_xscale("log", base=2)
        plotting.label(ax, "batch size", "loss ratio", name)
    plotting.save(fig, run.output_dir, "loss_ratio_by_setting")


def plot_families(run: Run, probes: dict[str, dict]) -> None:
    """Section 5: packed/alone loss per family with today's padding-free inputs."""
    fig, (ax,) = plotting.figure(1, width=6.5, title="Today's padding-free inputs (position_ids, no mask, no cache)")
    names = list(probes)
    kinds = ["fixed" if probes[name]["isolated"] else "bad" for name in names]
    ax.barh(names, [max(probes[name]["max_relative_difference"], 1e-9) for name in names],
            color=[plotting.STYLE[k] for k in kinds])
    ax.axvline(1e-4, color=plotting.REFERENCE, linestyle="--")
    ax.set_xscale("log")
    plotting.label(ax, "largest relative loss difference, packed vs alone", "",
                   "left of the dashed line: packed sequences kept apart")
    plotting.save(fig, run.output_dir, "loss_ratio_by_family")


def plot_training(run: Run, training: dict[str, dict], spike: float) -> None:
    """Section 7: per-step loss and grad norm of the three short trainings."""
    fig, (ax_loss, ax_grad) = plotting.figure(2, title=f"Training: contaminated batches (recreated) start with a "
                                              f"{spike:.0f}x grad-norm spike and log a higher loss")
    steps = range(1, run.sizes.train_steps + 1)
    for mode, kind in (("contaminated", "bad"), ("padded", "reference"), ("fixed", "fixed")):
        label = "fixed (on top of padded)" if mode == "fixed" else mode
        plotting.line(ax_loss, steps, training[mode]["loss"], kind, label)
        plotting.line(ax_grad, steps, training[mode]["grad_norm"], kind, label)
    plotting.label(ax_loss, "optimizer step", "logged loss (nats/token)",
                   f"Llama, batch {run.sizes.train_batch_size}, lr {run.sizes.train_learning_rate:g}")
    plotting.label(ax_grad, "optimizer step", "grad norm (before clipping)", "grad norm per step", log_y=True)
    plotting.save(fig, run.output_dir, "training")


def plot_remedies(run: Run, remedies: dict[str, dict]) -> None:
    """Section 8: does each remedy keep sequences apart, and does its logged loss look better?"""
    cured = [name for name, r in remedies.items() if r["isolated"]]
    hidden = [name for name, r in remedies.items() if r["verdict"].startswith("hides")]
    fig, (ax_ratio, ax_logged) = plotting.figure(
        2, width=6.5, height=4.2, title=f"Remedies: {len(hidden)} of {len(remedies) - len(cured)} others hide the "
                                        f"symptom, only {' and '.join(cured) or 'none'} cures it")
    names = list(remedies)
    colors = [plotting.STYLE["fixed" if remedies[name]["isolated"] else "bad"] for name in names]
    ax_ratio.barh(names, [remedies[name]["ratio"] for name in names], color=colors)
    ax_ratio.axvline(1, color=plotting.REFERENCE, linestyle="--")
    ax_ratio.set_xlim(left=min(0.95, min(r["ratio"] for r in remedies.values()) - 0.02))
    plotting.label(ax_ratio, "contaminated / padded loss, same weights", "", "do sequences still see each other? (1: no)")
    ax_logged.barh(names, [remedies[name]["loss"] / remedies[name]["baseline"]["loss"] for name in names], color=colors)
    ax_logged.axvline(1, color=plotting.REFERENCE, linestyle="--")
    ax_logged.set_yticklabels([])
    plotting.label(ax_logged, "logged loss / contaminated baseline", "", "does the logged loss look better? (< 1: yes)")
    plotting.save(fig, run.output_dir, "remedies")


def plot_throughput(run: Run, speed: dict[str, dict]) -> None:
    """Section 10: real tokens per second, padded vs padding-free."""
    fig, (ax,) = plotting.figure(1, title="Padding-free computes no pad tokens")
    plotting.bars(ax, ["padded", "padding-free"], [speed[k]["tokens_per_second"] for k in ("padded", "padding_free")],
                  ["reference", "fixed"], fmt="{:.0f}")
    plotting.label(ax, f"batch {run.sizes.speed_batch_size}, {run.attention}, {run.device.type}", "real tokens / second",
                   f"throughput (padding share {speed['padded']['padding_share']:.0%} when padded)")
    plotting.save(fig, run.output_dir, "throughput")
