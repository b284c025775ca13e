# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 02 · Worked solutions
#
# The exercises of [02_gradient_accumulation_loss.ipynb](../02_gradient_accumulation_loss.ipynb), at the lesson's
# own sizes (its N), with its one-step trainers. Each answer is measured, printed and asserted.

# %% tags=["parameters"]
profile = "auto"  # "auto" (gpu when CUDA is present), "cpu" or "gpu"
seed = 0
output_dir = None  # None: outputs/02_gradient_accumulation_loss at the repository root

# %%
import trl_clinic.course  # first: the lessons' offline mode, and two optional libraries' warnings kept quiet
from trl import SFTTrainer

from trl_clinic.course import data
from trl_clinic.course.lessons.lesson_02_accumulation import companion
from trl_clinic.course.parameters import start_run
from trl_clinic.course.stand_ins import MeanPerMicroBatchSFTTrainer
from trl_clinic.probes.gradients import first_step_gradient, relative_error

run = start_run("02", profile, seed, output_dir)
sizes = run.sizes
N = sizes.accumulation
make_model, tokenizer = companion.vision_language_model_maker(sizes.model_size, seed=run.seed)
steps = companion.FirstStep(run, make_model, tokenizer, data.instruction_pairs(sizes.n_train, seed=run.subseed("train")))


def error(batch_size: int, accumulation: int, **options) -> float:
    """The lesson's check: batch_size x accumulation against one batch of batch_size * accumulation, first step."""
    big = first_step_gradient(steps.trainer(batch_size * accumulation, 1, **options))
    return relative_error(first_step_gradient(steps.trainer(batch_size, accumulation, **options)), big)


def window_counts(batch_size: int, accumulation: int, **options) -> list[int]:
    return [companion.label_tokens(b) for b in companion.window(steps.trainer(batch_size, accumulation, **options), accumulation)]


# %% [markdown]
# ## Exercise 1
#
# Batch 2 × N/2 against 1 × N, without the fix.

# %%
one_by_n, two_by_half = error(1, N), error(2, N // 2)
singles, pairs = window_counts(1, N), window_counts(2, N // 2)
print(f"without the fix: 1 x {N} is {one_by_n:.2f} off, 2 x {N // 2} {two_by_half:.2f}. A micro-batch of two "
      f"consecutive rows holds a one-word answer and a biography: {min(pairs)} to {max(pairs)} label tokens "
      f"({max(pairs) / min(pairs):.0f}x apart) against {min(singles)} to {max(singles)} for single rows "
      f"({max(singles) / min(singles):.0f}x): the micro-batch means are weighted closer to right, not right.")
assert two_by_half < 0.5 * one_by_n and two_by_half > 1e-2

# %% [markdown]
# ## Exercise 2
#
# One-person biographies only: every row has the same number of label tokens.

# %%
biographies = data.instruction_pairs(2 * sizes.n_train, seed=run.subseed("train"), max_people=1).select(
    range(1, 2 * sizes.n_train, 2))
equal = window_counts(1, N, train_set=biographies)
equal_error = error(1, N, train_set=biographies)
print(f"every row has {equal[0]} label tokens, so 1/(N n) = 1/sum(n) = 1/{sum(equal)} for every token: without the "
      f"fix, 1 x {N} matches batch {N} to {equal_error:.1e}. The old arithmetic needs unequal counts to go wrong.")
assert len(set(equal)) == 1 and equal_error < 1e-4


# %% [markdown]
# ## Exercise 3
#
# The custom `compute_loss` with the fix applied, then the same override passing the count on.

# %%
class PassesTheCountSFTTrainer(SFTTrainer):
    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        return super().compute_loss(model, inputs, return_outputs=return_outputs, num_items_in_batch=num_items_in_batch)


dropped = error(1, N, fixed=True, trainer_class=MeanPerMicroBatchSFTTrainer)
passed = error(1, N, fixed=True, trainer_class=PassesTheCountSFTTrainer)
print(f"dropping num_items_in_batch: {dropped:.1f} off (each micro-batch's own mean, and the Trainer, which counted, "
      f"does not divide by {N}: {N} times the old gradient); passing it on: {passed:.1e}.")
assert dropped > 1 and passed < 1e-4
