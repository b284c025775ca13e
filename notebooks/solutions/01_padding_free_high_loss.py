"""Worked solutions to the exercises of lesson 01 (padding-free training gives an abnormally high loss).

Run from the repository root: ``python notebooks/solutions/01_padding_free_high_loss.py`` (cpu, fp32,
tiny models, seed 0). Each function answers one exercise with the package's real code and asserts
the claim its answer makes.
"""

from __future__ import annotations

import functools
import tempfile

import torch
from trl import SFTConfig, SFTTrainer

from trl_clinic.course import data
from trl_clinic.course.companions import padding_free as companion
from trl_clinic.course.models import make_causal_lm
from trl_clinic.probes.packing import pack, packed_vs_separate
from trl_clinic.course.parameters import start_run
from trl_clinic.course.stand_ins import recreated_all_ones_mask
from trl_clinic.course.tokenizer import build_tokenizer

run = start_run("01", "cpu", 0, tempfile.mkdtemp(prefix="solutions-01-"))
sizes = run.sizes  # the lesson's cpu warm-up and measurement sizes


@functools.cache
def bench() -> companion.Bench:
    """The lesson's warm-up and lr-0 runner (warm_model trains a tiny Llama once, padded)."""
    return companion.Bench(run, build_tokenizer())


def sft_trainer(mode: str, batch_size: int, dataset, **config) -> SFTTrainer:
    """The lesson's trainer: padded, or padding-free with the re-created all-ones mask ("contaminated")."""
    args = SFTConfig(**run.trainer_kwargs(f"{mode}-{batch_size}", progress=False), per_device_train_batch_size=batch_size,
                     padding_free=mode != "padded", max_length=None, completion_only_loss=False, **config)
    trainer = SFTTrainer(model=bench().warm_model(), args=args, train_dataset=dataset, processing_class=bench().tokenizer)
    if mode == "contaminated":
        trainer.data_collator = recreated_all_ones_mask(trainer.data_collator)
    return trainer


def held_out(n: int) -> list[list[int]]:
    return [companion.as_sequence(bench().tokenizer, row) for row in data.mrc_samples(n, seed=run.subseed("held-out"))]


def lr0_loss(mode: str, batch_size: int) -> float:
    """Mean logged whole-sequence loss over held-out MRC samples at lr 0 (the weights never change)."""
    dataset = data.mrc_samples(sizes.measure_samples, seed=run.subseed("held-out"))
    return bench().measure(sft_trainer, mode, batch_size, dataset)["loss"]


def exercise_1() -> None:
    """Add batch size 32 to the sweep. Predict the contaminated/padded ratio first.

    Prediction: more sequences per row means more foreign context per token, so the ratio keeps
    growing past batch 16, more slowly (the foreign context a token sees grows, its share of the
    loss saturates)."""
    ratios = {b: lr0_loss("contaminated", b) / lr0_loss("padded", b) for b in (16, 32)}
    print(f"exercise 1: contaminated/padded loss ratio, batch 16: {ratios[16]:.2f}, batch 32: {ratios[32]:.2f}")
    assert ratios[32] > ratios[16] > 1, ratios


def exercise_2() -> None:
    """Run packed_vs_separate(all_ones_mask=True) on a freshly initialised model and on a warmed-up one.
    Why does the lesson warm its models up before measuring contamination?"""
    sequences = held_out(8)
    fresh = packed_vs_separate(make_causal_lm(bench().tokenizer, seed=run.seed), sequences, all_ones_mask=True)
    warm = packed_vs_separate(bench().warm_model(), sequences, all_ones_mask=True)
    print(f"exercise 2: packed/alone loss with an all-ones mask: fresh model {fresh['ratio']:.4f}, "
          f"warmed-up {warm['ratio']:.3f}: a random model predicts badly whatever it attends to, so the foreign "
          "context barely moves its loss; a model that uses context is misled by it.")
    assert not fresh["isolated"] and not warm["isolated"]  # both see the foreign sequences...
    assert warm["ratio"] - 1 > 10 * abs(fresh["ratio"] - 1), (fresh["ratio"], warm["ratio"])  # ...only one cares


@torch.no_grad()
def exercise_3() -> None:
    """Pass use_cache=True in a hand-written forward of a packed row (no mask). Is it still isolated?"""
    model = bench().warm_model().eval()
    sequences = held_out(4)
    row = pack(sequences)
    logits = {cache: model(**row, use_cache=cache).logits[0] for cache in (False, True)}
    start, alone = len(sequences[0]), []
    for seq in sequences[1:]:  # the later sequences: the ones that could see earlier ones
        own = model(input_ids=torch.tensor([seq]), use_cache=False).logits[0]
        alone.append({cache: (logits[cache][start:start + len(seq)] - own).abs().max().item() for cache in logits})
        start += len(seq)
    worst = {cache: max(d[cache] for d in alone) for cache in logits}
    print(f"exercise 3: largest logit difference packed vs alone: use_cache=False {worst[False]:.1e} (isolated), "
          f"use_cache=True {worst[True]:.2f} (contaminated: with a cache transformers stops reading boundaries "
          "from position_ids)")
    assert worst[False] < 1e-4 < worst[True], worst


if __name__ == "__main__":
    exercise_1()
    exercise_2()
    exercise_3()
