"""Worked solutions to lesson 02's exercises (gradient accumulation trains worse than the same batch).

Run from the repository root: ``python notebooks/solutions/02_gradient_accumulation_loss.py``. Each answer
is measured on the cpu profile (tiny llama, fp32, seed 0) with the lesson's own helpers and today's real
SFTTrainer, printed, and asserted, so the file fails if an answer stops being true. An accumulation of 8
(instead of the lesson's 32) keeps the whole file short.
"""

import tempfile

import torch
from datasets import Dataset
from transformers import PrinterCallback
from trl import SFTConfig, SFTTrainer

from trl_clinic import data
from trl_clinic.gradients import first_step_gradient, label_counts, relative_error
from trl_clinic.models import make_causal_lm
from trl_clinic.parameters import start_run
from trl_clinic.stand_ins import recreate_pre_446_loss
from trl_clinic.tokenizer import build_tokenizer

N = 8
run = start_run("02", "cpu", 0, tempfile.mkdtemp(prefix="solutions-02-"))
tokenizer = build_tokenizer()
mixed = data.instruction_pairs(64, seed=run.subseed("train"))


def trainer_for(samples: Dataset, batch_size: int, accumulation: int, trainer_class: type[SFTTrainer] = SFTTrainer,
                old: bool = False) -> SFTTrainer:
    """The lesson's first-step set-up: sequential samples, no clipping, one optimizer step, fp32."""
    args = SFTConfig(**{**run.trainer_kwargs(f"{trainer_class.__name__}-{batch_size}x{accumulation}-{old}",
                                             logging=False, progress=False), "bf16": False},
                     per_device_train_batch_size=batch_size, gradient_accumulation_steps=accumulation,
                     max_grad_norm=0, max_steps=1, train_sampling_strategy="sequential")
    trainer = trainer_class(model=make_causal_lm(tokenizer, seed=run.seed), args=args, train_dataset=samples,
                            processing_class=tokenizer)
    trainer.remove_callback(PrinterCallback)  # no end-of-run dicts between the answers
    return recreate_pre_446_loss(trainer) if old else trainer


def gradient(samples: Dataset, batch_size: int, accumulation: int, **kwargs) -> torch.Tensor:
    return first_step_gradient(trainer_for(samples, batch_size, accumulation, **kwargs))


def exercise_1() -> None:
    """Run first_step(2, N // 2, "old"): is batch 2 x N/2 closer to the big batch than 1 x N? Why?"""
    big = gradient(mixed, N, 1)
    ones, twos = gradient(mixed, 1, N, old=True), gradient(mixed, 2, N // 2, old=True)
    pairs = label_counts(trainer_for(mixed, 2, N // 2), N // 2)
    singles = label_counts(trainer_for(mixed, 1, N), N)
    print(f"1. yes: old normalisation error {relative_error(twos, big):.3f} at 2 x {N // 2} against "
          f"{relative_error(ones, big):.3f} at 1 x {N}; each micro-batch of 2 holds a short and a long answer, so "
          f"their label counts ({min(pairs)} to {max(pairs)}) vary far less than single samples' ({min(singles)} to "
          f"{max(singles)}), and the per-micro-batch means are weighted almost right.")
    assert relative_error(twos, big) < 0.5 * relative_error(ones, big)


def exercise_2() -> None:
    """Completions of about the same length (max_people=1, biographies only): does the old path still differ?"""
    biographies = data.instruction_pairs(2 * 64, seed=run.subseed("train"), max_people=1).select(range(1, 2 * 64, 2))
    counts = label_counts(trainer_for(biographies, 1, N), N)
    even = relative_error(gradient(biographies, 1, N, old=True), gradient(biographies, N, 1))
    uneven = relative_error(gradient(mixed, 1, N, old=True), gradient(mixed, N, 1))
    print(f"2. no: every one-person biography gives {min(counts)} to {max(counts)} label tokens, so the old path's "
          f"per-micro-batch means get the big batch's weights and it misses by {even:.1e}, against {uneven:.2f} on the "
          "mixed data: the bug needs unequal label counts per micro-batch.")
    assert len(set(counts)) == 1 and even < 1e-4 < uneven


class PassesTheCountSFTTrainer(SFTTrainer):
    """The custom compute_loss of the lesson, fixed: it hands num_items_in_batch on."""

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        return super().compute_loss(model, inputs, return_outputs=return_outputs,
                                    num_items_in_batch=num_items_in_batch)


def exercise_3() -> None:
    """Fix MeanPerMicroBatchSFTTrainer by passing num_items_in_batch on, and check it against the big batch."""
    error = relative_error(gradient(mixed, 1, N, trainer_class=PassesTheCountSFTTrainer), gradient(mixed, N, 1))
    print(f"3. passing num_items_in_batch on, batch 1 x {N} matches batch {N} to {error:.1e} (float precision).")
    assert error < 1e-4


if __name__ == "__main__":
    exercise_1()
    exercise_2()
    exercise_3()
