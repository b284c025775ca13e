# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 02, deeper · Gradient accumulation: the real old code, the versions, a custom loss, packing, whole runs
#
# The core ([02_gradient_accumulation_loss.ipynb](../02_gradient_accumulation_loss.ipynb)) showed batch 1 × N
# averaging per-micro-batch means on today's `SFTTrainer`, for a model that declares no loss kwargs, and the
# line that fixes it. Here, on the report's own kind of model (a Llama: a tiny random one on the cpu profile,
# SmolLM2-135M-Instruct on the gpu profile):
#
# 1. the report's versions, transformers 4.45.2 and TRL 0.11.4, run for real in a side environment;
# 2. which transformers version did what, read in the released files;
# 3. every accumulation count on three paths: today's, the old arithmetic (re-created on today's `Trainer`,
#    checked against the real 4.45.2 in section 1) and a custom `compute_loss` that drops the count;
# 4. what that custom loss logs, and what `loss_is_scaled_for_ga` changes;
# 5. why packed rows suffer less;
# 6. the report's two settings trained to the end.
#
# > **Hosted** (Colab, Kaggle, no clone): upload the wheel `uv build` makes, then run `%pip install "./trl_clinic-0.1.0-py3-none-any.whl[course]"` first.

# %% tags=["parameters"]
profile = "auto"  # "auto" (gpu when CUDA is present), "cpu" or "gpu"
seed = 0
output_dir = None  # None: outputs/02_gradient_accumulation_loss_deeper at the repository root

# %%
import textwrap

from trl_clinic.course import data, eras, handshake
from trl_clinic.course.lessons.lesson_02_accumulation import companion_deeper as companion
from trl_clinic.course.lessons.lesson_02_accumulation.companion import FirstStep
from trl_clinic.course.models import model_maker
from trl_clinic.course.parameters import start_run
from trl_clinic.course.results import check
from trl_clinic.course.runtime import progress
from trl_clinic.course.stand_ins import MeanPerMicroBatchSFTTrainer
from trl_clinic.probes.gradients import relative_error

run = start_run("02-deeper", profile, seed, output_dir)
print(run.describe())
sizes = run.sizes
# every call gives the same weights: a random-init tiny llama (cpu) or SmolLM2-135M-Instruct (gpu)
make_model, tokenizer = model_maker(sizes.model_size, seed=run.seed)
train_set = data.instruction_pairs(sizes.n_train, seed=run.subseed("train"))  # a one-word answer, a biography, ...
eval_set = data.instruction_pairs(sizes.n_eval, seed=run.subseed("eval"))
N = sizes.curve_accumulation  # the report: batch 1 x accumulation 32 against batch 32
steps = FirstStep(run, make_model, tokenizer, train_set.select(range(max(sizes.accumulation_sweep))))  # the first rows
tokenized = steps.trainer(1, 1, train_set=train_set).train_dataset  # TRL's tokenization of all rows, done once
packed_steps = FirstStep(run, make_model, tokenizer, tokenized.select(range(sizes.packing_rows)),
                         packing_length=sizes.packing_length)  # the first packing_rows rows

# %% [markdown]
# ## 1. Then: transformers 4.45.2 and TRL 0.11.4, for real
#
# A side environment with the report's versions (`make eras` builds it once under `.eras/`) takes the first
# window of this lesson (the same token ids) and the same initial weights through transformers 4.45.2's
# `Trainer` and TRL 0.11.4's `SFTTrainer`, batch 1 × N, one step. Its gradient is compared, in the same
# environment, with the mean of per-micro-batch means and with the full-batch mean over all label tokens, both
# computed by hand; and here with today's `Trainer` after `trainer.model_accepts_loss_kwargs = False`, the
# re-creation of the old arithmetic that sections 3 to 6 use (`trl_clinic.course.stand_ins.recreate_pre_446_loss`).

# %%
window = [batch for batch, _ in zip(steps.trainer(1, N).get_train_dataloader(), range(N))]  # the first window
then_dir = run.output_dir / "then"
then_spec = handshake.accumulation_spec(
    then_dir, model=make_model(), accumulation=N,
    examples=[{"input_ids": b["input_ids"][0].tolist(), "labels": b["labels"][0].tolist()} for b in window])
then = eras.run_in_era("02-transformers-4.45", "then_02", then_spec, then_dir)
print(then.describe())

# %%
then_numbers = {"status": then.status}
if then.finished:
    era = handshake.load_era_gradients(then.result["gradients_file"])  # 4.45.2's gradients and the objectives by hand
    real = then.result["paths"]["sft_trainer"]  # the real 4.45.2 SFTTrainer against the two objectives, there
    here = {path: handshake.today_gradient(then_spec, then_dir, recreate_old=path == "old") for path in ("old", "today")}
    then_numbers.update(paths=then.result["paths"], label_counts=then.result["label_counts"], runs={
        "old": {"vs_mean_of_means": real["vs_mean_of_means"], "vs_full_batch": real["vs_full_batch"],
                "vs_real_sft_trainer": relative_error(here["old"], era["sft_trainer"])},
        "today": {"vs_mean_of_means": relative_error(here["today"], era["mean_of_means"]),
                  "vs_full_batch": relative_error(here["today"], era["full_batch"]),
                  "vs_real_sft_trainer": relative_error(here["today"], era["sft_trainer"])}})
    for path, era_path in then.result["paths"].items():
        print(f"{path:>11} (real 4.45.2 code): vs the mean of per-micro-batch means {era_path['vs_mean_of_means']:.1e}, "
              f"vs the full batch {era_path['vs_full_batch']:.2f} (cosine {era_path['cosine_full_batch']:.3f})")
    for path, record in then_numbers["runs"].items():
        print(f"today's Trainer, {'re-created old' if path == 'old' else 'today'} path: vs the real 4.45.2 SFTTrainer "
              f"{record['vs_real_sft_trainer']:.1e}, vs the era's full batch {record['vs_full_batch']:.1e}")
else:
    print("the era part is skipped; the other sections stand on their own")

# %% [markdown]
# In 4.45.2, `Trainer.training_step` hands each micro-batch to the model, which returns the mean over that
# micro-batch's own label tokens, and accelerate 1.0.1's `Accelerator.backward` divides it by the
# accumulation steps: the mean of per-micro-batch means, for every model. TRL 0.11.4's `SFTTrainer` inherits
# that step.
#
# ## 2. Which version did what
#
# Read in each released `transformers/trainer.py` (`pip download --no-deps transformers==X`):
#
# | transformers | batch b × accumulation k | where |
# |---|---|---|
# | up to 4.45.2 | every model: the mean of per-micro-batch means (each micro-batch's mean, divided by k by accelerate) | `training_step` |
# | 4.46.0, 4.46.1 | counts the window's label tokens and passes them as `num_items_in_batch` to models whose `forward` has a parameter named `loss_kwargs`; `loss *= k` before accelerate divides by k, so other models backpropagate each micro-batch's mean undivided: k times the old gradient | `__init__` (:593), `training_step` (:3605) |
# | 4.46.2 | the same count for `**loss_kwargs`; accelerate no longer divides and `training_step` neither: still k times the old gradient without loss kwargs | :592, :3612 |
# | 4.47.0 | `**kwargs` makes the Trainer count (:626), but `training_step` hands the count only to models that do not take loss kwargs (:3651-3655): every model backpropagates its micro-batch mean undivided, k times the old gradient | :626, :3651-3655 |
# | 4.47.1 | any `**kwargs` in `forward` counts; others as in 4.46.2 | :3654, :3687 |
# | 4.48.0 | a model's `accepts_loss_kwargs` attribute decides first; divided by k when no count was made, but the count again reaches only models that do not take it (:3675-3678): models that take loss kwargs get k times the old gradient | :628, :3675-3678, :3712 |
# | 4.48.1 – 5.23.0 | divided by k when the model takes no loss kwargs and no `compute_loss_func` is set: the old arithmetic, for those models | 4.48.1 :3675, :3709; 4.48.3 :3709 |
# | 5.19.0 | a trainer may declare `loss_is_scaled_for_ga` (absent from 5.18.0) | `Trainer` |
#
# `average_tokens_across_devices` (lesson 02b) is absent from 4.46.1, arrives in 4.46.2 defaulting to False,
# and defaults to True from 4.54.0 (False in 4.53.3; `training_args.py`). Which model classes of this run's
# transformers declare that they take no loss kwargs, read in their source:

# %%
no_loss_kwargs = companion.models_without_loss_kwargs()
top_level = sorted({c for classes in no_loss_kwargs.values() for c in classes if c.endswith(("ForConditionalGeneration", "ForCausalLM"))})
print(f"{sum(map(len, no_loss_kwargs.values()))} classes in {len(no_loss_kwargs)} modeling files set "
      f"accepts_loss_kwargs = False; the ones a fine-tune passes to a trainer ({len(top_level)}):")
print(textwrap.fill(", ".join(top_level), width=116))  # folded to the screen

# %% [markdown]
# ## 3. Every accumulation count, three paths
#
# At each count k, batch 1 × k against one batch of k from the same weights on the same rows: today's path
# (the Llama accepts loss kwargs, so the Trainer counts), the old arithmetic (re-created), and a user's
# `compute_loss` that drops the count (`MeanPerMicroBatchSFTTrainer`, a fault set here on purpose):
#
# ```python
# class MeanPerMicroBatchSFTTrainer(SFTTrainer):
#     def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
#         return super().compute_loss(model, inputs, return_outputs=return_outputs, num_items_in_batch=None)
# ```

# %%
sweep = companion.accumulation_sweep(steps, sizes.accumulation_sweep, custom_class=MeanPerMicroBatchSFTTrainer)
errors = {path: [row["relative_error"] for row in rows] for path, rows in sweep.items()}
cosines = {path: [row["cosine"] for row in rows] for path, rows in sweep.items()}
print(f"today: largest relative error {max(errors['today']):.1e}")
print(f"old: error {min(errors['old']):.2f} to {max(errors['old']):.2f}, cosine {min(cosines['old']):.3f} to "
      f"{max(cosines['old']):.3f}: {'another direction, not only another length' if max(cosines['old']) < 0.99 else 'close to the big batch direction'}")
print(f"custom: error {errors['custom'][0]:.1f} at 1 x {sizes.accumulation_sweep[0]} to {errors['custom'][-1]:.1f} at "
      f"1 x {sizes.accumulation_sweep[-1]}; k times the old gradient to "
      f"{max(row['vs_count_times_old'] for row in sweep['custom']):.0e}, so its cosine is the old path's")

# %% [markdown]
# ## 4. The custom loss: a wrong gradient, and a logged loss k times too high
#
# `Trainer.training_step` decides from its own view whether the loss it got is already divided for
# accumulation: with a model that accepts loss kwargs and a count made, it leaves the loss alone. The override
# dropped the count, so every micro-batch returns its own mean, undivided: the logged loss is the sum of k
# means, and the gradient is the old path's, k times longer. Each trainer above reported its step's loss:

# %%
companion.print_reported_losses(sweep)

# %% [markdown]
# Since transformers 5.19.0 a trainer can say what its loss is: `loss_is_scaled_for_ga = False` means "a mean
# per micro-batch, divide it for me". Declared on the custom trainer, the Trainer divides by k again: the run
# becomes the old arithmetic, the logged number and the gradient's length both, while the direction stays
# the old path's. Only a loss that uses `num_items_in_batch` gives the big batch's gradient.

# %%
class DeclaredMeanSFTTrainer(MeanPerMicroBatchSFTTrainer):
    loss_is_scaled_for_ga = False  # "my loss is a per-micro-batch mean": training_step divides it by k


old, old_loss = steps.run_step(1, N, "old")
vs_old = {}
for name, (gradient, loss) in {"declared": steps.run_step(1, N, trainer_class=DeclaredMeanSFTTrainer),
                               "today": steps.run_step(1, N)}.items():
    vs_old[name] = {"relative_error": relative_error(gradient, old), "reported_loss": loss}
    print(f"{name}, 1 x {N}: gradient vs the old path's {vs_old[name]['relative_error']:.1e}, reported loss {loss:.3f} "
          f"(old path {old_loss:.3f})")

# %% [markdown]
# ## 5. Packed rows suffer less
#
# With `SFTConfig(packing=True)` TRL fills each row of `max_length` tokens with several samples
# (`packing_strategy="bfd"`, best-fit decreasing) and cuts a sample longer than `max_length` (TRL 1.16.0
# `data_utils.py`, `_pack_bfd`); here every sample fits. The old arithmetic weighs a row's tokens by `1 / (k · nᵢ)`:
# the more even the rows' label counts, the closer that is to the big batch. Label tokens per micro-batch over the
# profile's `packing_rows` rows, one sample per micro-batch and packed:

# %%
spread = companion.label_spread(packed_steps, N)
print(f"longest sample {spread['longest_sample_tokens']} tokens, packed rows of {spread['packing_length']}: "
      f"{'none cut' if spread['longest_sample_tokens'] <= spread['packing_length'] else 'some cut'}; the first {N} "
      f"packed rows in order hold {spread['packed']['first_window'][0]} to {spread['packed']['first_window'][1]} label tokens")

# %% [markdown]
# Best-fit decreasing fills the first rows fullest, so the first rows read in order hold nearly the same counts
# (printed above); a run reads them shuffled. The first step at 1 × N against N, on N packed rows in the seed's random order (the
# same rows for both batchings):

# %%
packed_big, _ = packed_steps.run_step(N, 1, packing=True, order="random")
packed = {path: {"packed": relative_error(packed_steps.run_step(1, N, path, packing=True, order="random")[0], packed_big),
                 "single": errors[path][sizes.accumulation_sweep.index(N)]} for path in ("old", "today")}
print(f"first step at 1 x {N} vs {N}, packed rows against one sample per micro-batch:\n  old arithmetic "
      f"{packed['old']['packed']:.1e} against {packed['old']['single']:.2f} "
      f"({packed['old']['single'] / packed['old']['packed']:.0f}x less), today {packed['today']['packed']:.1e}")

# %% [markdown]
# Packing does not change the arithmetic: it evens out the label counts, which is what the old one got wrong,
# so its error shrinks without vanishing.
#
# ## 6. Trained to the end: the report's two settings
#
# Batch N × 1 against batch 1 × N (once today's, once the old arithmetic), over `max_steps × N` rows of the
# training data read in order (every window half one-word answers, half biographies), none repeated, same
# weights, same schedule (`warmup_steps=0.1`, a ratio: linear warm-up over the first tenth of the steps, then
# linear decay). Each held-out subset (short answers, long answers, all) is evaluated as one batch, so its loss
# is the true token mean.

# %%
eval_sets = {"all": eval_set, "short": eval_set.filter(lambda row: len(row["completion"].split()) == 1),
             "long": eval_set.filter(lambda row: len(row["completion"].split()) > 1)}
RUNS = {"big batch": ({"per_device_train_batch_size": N, "gradient_accumulation_steps": 1}, "today"),
        "today": ({"per_device_train_batch_size": 1, "gradient_accumulation_steps": N}, "today"),
        "old": ({"per_device_train_batch_size": 1, "gradient_accumulation_steps": N}, "old")}
curves = {name: companion.train_curve(run, make_model, tokenizer, tokenized, eval_sets, name, config, normalisation)
          for name, (config, normalisation) in progress(RUNS.items(), "training runs")}

# %%
held_out = {name: {subset: rec.last(f"eval_{subset}_loss") for subset in eval_sets} for name, rec in curves.items()}
short_long = {name: losses["short"] / losses["long"] for name, losses in held_out.items()}  # lower: short answers favoured
train_losses = {name: rec.series("loss")[1] for name, rec in curves.items()}
train_gap = {name: max(abs(a - b) for a, b in zip(train_losses[name], train_losses["big batch"])) for name in ("today", "old")}
for name, losses in held_out.items():
    print(f"{name:>9}: " + ", ".join(f"held-out {subset} {loss:.3f}" for subset, loss in losses.items())
          + f", short/long ratio {short_long[name]:.3f}")
print(f"logged training loss, largest gap to batch {N} over {sizes.curve_steps} steps: today {train_gap['today']:.1e}, "
      f"old {train_gap['old']:.2f}")
favoured = min(short_long, key=short_long.get)
print(f"lowest short/long ratio (short answers learned best relative to long ones): {favoured}")

# %% [markdown]
# Today's batch 1 × N is the big batch: the same logged loss at every step and the same held-out loss. The old
# arithmetic logs another number (a mean of per-micro-batch means, which counts a short answer's few tokens as
# much as a long answer's many) and trains another model; the printed ratios say which run favoured short answers.

# %%
figure_path = companion.plot_runs(curves, N, run.output_dir)

# %% [markdown]
# ## 7. Which release? Bisect it
#
# Section 2's table was read in each release's source. `trl-clinic bisect` finds the release by measuring, without
# being told where to look: a side environment per transformers release from 4.45.0 to 4.46.0 (the era's TRL
# 0.11.4 and the rest of its pins beside each), one first training step of a recipe in each (batch 1 ×
# accumulation 4 at learning rate 0, on a tiny model and sentences drawn from the seed), and a binary search for
# the first release whose step differs from the good end's. The first run builds the environments (about 25 s
# each, uv's cache warm) and keeps them for the next ([docs/bisect.md](../../docs/bisect.md)).

# %%
from trl_clinic.bisect import bisect, table, verdict
from trl_clinic.bisect.versions import IndexUnavailable

recipe = {"per_device_train_batch_size": 1, "gradient_accumulation_steps": 4, "max_seq_length": 128, "max_length": 128}
pins = companion.era_pins("02-transformers-4.45", moving="transformers")
try:
    found = bisect("sft", recipe, "transformers", "4.45.0", "4.46.0", pins=pins, seed=run.seed, progress=companion.say)
    print(table(found, columns=companion.BISECT_COLUMNS))
    companion.say(verdict(found, "transformers"))
    bisected = companion.bisect_numbers(found)
except IndexUnavailable as error:  # no package index to list the releases: the section is left out
    bisected = companion.bisect_numbers(None, skipped=str(error))
    print(f"skipped: {error}")

# %% [markdown]
# The batch and its label count are the same in every release; the loss and the gradient norm move at the first
# change (the loss scale), and the check-up, run inside each release's environment, says whether its
# accumulation probe fails there. The same command from a shell: `trl-clinic bisect sft --config recipe.yaml
# --package transformers --good 4.45.0 --bad 4.46.0` with a `--pin` for each of the pins above.

# %% [markdown]
# ## Checks
#
# The claims above, asserted on this run's numbers.

# %% jupyter={"source_hidden": true}
numbers = {"then": then_numbers, "sweep": sweep, "vs_old": vs_old, "old_reported_loss": old_loss, "label_spread": spread,
           "packed": packed, "held_out_loss": held_out, "held_out_short_long_ratio": short_long,
           "train_loss_gap": train_gap, "curve_accumulation": N, "curve_steps": sizes.curve_steps,
           "models_without_loss_kwargs": no_loss_kwargs, "top_level_without_loss_kwargs": top_level, "bisect": bisected}
era_records = [then.to_metrics()]  # the era's run: finished, skipped or failed
check(run, numbers, eras=era_records)
