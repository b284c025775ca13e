"""Worked solutions to lesson 02's exercises (gradient accumulation trains worse than the same batch).

Run from the repository root: ``python notebooks/solutions/02_gradient_accumulation_loss.py``. Each answer
is measured on the cpu profile (tiny llama, fp32, seed 0) with the lesson's own one-step trainers
(``trl_clinic.course.companions.accumulation.FirstStep``) and today's real SFTTrainer, printed, and asserted, so the
file fails if an answer stops being true. An accumulation of 8 (instead of the lesson's 32) keeps it short.
"""

import tempfile

from datasets import Dataset
from trl import SFTTrainer

from trl_clinic.course import data
from trl_clinic.course.companions.accumulation import FirstStep
from trl_clinic.probes.gradients import label_counts, relative_error
from trl_clinic.course.models import model_maker
from trl_clinic.course.parameters import start_run

N = 8
run = start_run("02", "cpu", 0, tempfile.mkdtemp(prefix="solutions-02-"))
make_model, tokenizer = model_maker(run.sizes.model_size, seed=run.seed)
mixed = data.instruction_pairs(64, seed=run.subseed("train"))


def first_steps(samples: Dataset) -> FirstStep:
    """The lesson's one-step set-up on ``samples``: sequential, no clipping, one optimizer step, fp32."""
    return FirstStep(run, make_model, tokenizer, samples)


def exercise_1() -> None:
    """Run steps.run_step(2, N // 2, "old"): is batch 2 x N/2 closer to the big batch than 1 x N? Why?"""
    steps = first_steps(mixed)
    big = steps.run_step(N, 1)[0]
    ones, twos = steps.run_step(1, N, "old")[0], steps.run_step(2, N // 2, "old")[0]
    pairs, singles = label_counts(steps.trainer(2, N // 2), N // 2), label_counts(steps.trainer(1, N), N)
    print(f"1. yes: old normalisation error {relative_error(twos, big):.3f} at 2 x {N // 2} against "
          f"{relative_error(ones, big):.3f} at 1 x {N}; each micro-batch of 2 holds a short and a long answer, so "
          f"their label counts ({min(pairs)} to {max(pairs)}) vary far less than single samples' ({min(singles)} to "
          f"{max(singles)}), and the per-micro-batch means are weighted almost right.")
    assert relative_error(twos, big) < 0.5 * relative_error(ones, big)


def exercise_2() -> None:
    """Completions of about the same length (max_people=1, biographies only): does the old path still differ?"""
    biographies = data.instruction_pairs(2 * 64, seed=run.subseed("train"), max_people=1).select(range(1, 2 * 64, 2))
    even_steps, mixed_steps = first_steps(biographies), first_steps(mixed)
    counts = label_counts(even_steps.trainer(1, N), N)
    even = relative_error(even_steps.run_step(1, N, "old")[0], even_steps.run_step(N, 1)[0])
    uneven = relative_error(mixed_steps.run_step(1, N, "old")[0], mixed_steps.run_step(N, 1)[0])
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
    steps = first_steps(mixed)
    error = relative_error(steps.run_step(1, N, trainer_class=PassesTheCountSFTTrainer)[0], steps.run_step(N, 1)[0])
    print(f"3. passing num_items_in_batch on, batch 1 x {N} matches batch {N} to {error:.1e} (float precision).")
    assert error < 1e-4


if __name__ == "__main__":
    exercise_1()
    exercise_2()
    exercise_3()
