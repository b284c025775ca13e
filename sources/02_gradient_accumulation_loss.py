# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 02 · Gradient accumulation trains worse than the same batch
#
# **The report** ([TRL issue #2175](https://github.com/huggingface/trl/issues/2175)): training with
# batch 1 × gradient accumulation 32 gave a worse model than batch 32 × accumulation 1, although the
# two should be the same optimisation. It was closed by transformers PR
# [#34198](https://github.com/huggingface/transformers/pull/34198), released in transformers 4.46.0.
#
# **You will learn**
# * why adding up per-micro-batch *means* is not the mean of the big batch, and which tokens it weighs up;
# * how today's `Trainer` and `SFTTrainer` fix it with `num_items_in_batch`, and how a custom
#   `compute_loss` that ignores that argument brings the wrong gradient back today;
# * how to test your own set-up: the first step's gradient of batch 1 × N against one batch of N;
# * why packed data suffers less, and what the bug does to a whole training run.
#
# **You should know**
# * TRL's [`SFTTrainer`](https://huggingface.co/docs/trl/sft_trainer) and its prompt/completion datasets;
# * gradient accumulation in the [`Trainer`](https://huggingface.co/docs/transformers/main_classes/trainer)
#   (`gradient_accumulation_steps`), and the Hugging Face post
#   [Fixing Gradient Accumulation](https://huggingface.co/blog/gradient_accumulation);
# * a causal LM's loss: the cross-entropy over label tokens, where a label of `-100` does not count.
#
# **Time**: 87 s to run on the cpu profile (seed 0, 2 CPU cores, one lesson at a time: `trl-clinic run 02
# --profile cpu --jobs 1`); gpu profile not measured yet. About 30 minutes to read and try the exercises.
#
# **What runs here**: today's real `SFTTrainer` (TRL, transformers) for the fix, the custom-loss trap and
# `loss_is_scaled_for_ga`. The old normalisation of transformers before 4.46.0 is **re-created** on
# today's `Trainer` by one line, `model_accepts_loss_kwargs = False` (`trl_clinic.course.stand_ins.recreate_pre_446_loss`
# names the 4.45 code it stands for). **Then** (section 7): the real transformers 4.45.2 `Trainer` and
# TRL 0.11.4 `SFTTrainer` run the same step in a side environment, and the re-creation is compared with them.

# %% tags=["parameters"]
profile = "auto"  # "auto" (gpu when CUDA is present), "cpu" or "gpu"
seed = 0
output_dir = None  # None: outputs/02_gradient_accumulation_loss at the repository root

# %%
from trl_clinic.course import data, eras, handshake
from trl_clinic.course.companions import accumulation as companion
from trl_clinic.course.companions.accumulation import FirstStep, degrees_apart
from trl_clinic.probes.gradients import first_step_gradient, label_counts, relative_error
from trl_clinic.course.models import model_maker
from trl_clinic.course.parameters import start_run
from trl_clinic.course.results import failed_checks, recreated, save_metrics
from trl_clinic.course.runtime import progress
from trl_clinic.course.stand_ins import MeanPerMicroBatchSFTTrainer

run = start_run("02", profile, seed, output_dir)
print(run.describe())
sizes = run.sizes  # this lesson's numbers for the profile (lessons.yaml)
# every call gives the same weights: a random-init tiny llama (cpu) or SmolLM2-135M-Instruct (gpu)
make_model, tokenizer = model_maker(sizes.model_size, seed=run.seed)
# prompt/completion pairs: even rows a one-word answer, odd rows the biographies of one to six people
train_set = data.instruction_pairs(sizes.n_train, seed=run.subseed("train"))
eval_set = data.instruction_pairs(sizes.n_eval, seed=run.subseed("eval"))

# %% [markdown]
# ## 1. The symptom
#
# The report's two settings, one optimizer step each, from the same weights on the same first N samples
# (read in order, so short and long answers alternate): one batch of N, and batch 1 × accumulation N with
# the normalisation of transformers before 4.46.0, **re-created** by setting `model_accepts_loss_kwargs = False`
# on today's trainer. `first_step_gradient` copies the gradient just before the optimizer step (nothing is
# clipped) and stops training.

# %% tags=["symptom"]
N = sizes.curve_accumulation  # the report: batch 1 x accumulation 32 against batch 32
steps = FirstStep(run, make_model, tokenizer, train_set, packing_length=sizes.packing_length)
big = steps.trainer(batch_size=N, accumulation=1)
accumulated = steps.trainer(batch_size=1, accumulation=N)
accumulated.model_accepts_loss_kwargs = False  # RE-CREATED: the loss path of transformers before 4.46.0
reference, old = first_step_gradient(big), first_step_gradient(accumulated)
print(f"batch 1 x {N} (old normalisation, recreated) against batch {N}: the gradient is off by "
      f"{relative_error(old, reference):.0%} of its length and points {degrees_apart(old, reference):.0f} degrees away")

# %% [markdown]
# The same samples, the same weights, one step: a different gradient. Two batchings of the same samples
# should differ only by float rounding (section 3 measures how little that is).
#
# ## 2. Diagnose: who gets which weight
#
# The loss we want is the mean over *all* label tokens of the accumulation window: every token weighs
# `1 / Σ nᵢ`. With `model_accepts_loss_kwargs = False`, today's `Trainer.training_step` (transformers 5.23,
# `trainer.py`) divides each micro-batch's own mean by N, as transformers 4.45.2 did (its `training_step`
# called `compute_loss(model, inputs)`, and accelerate 1.0.1's `Accelerator.backward` divided the loss
# by the accumulation steps): a token of sample *i* weighs `1 / (N · nᵢ)`. The label counts `nᵢ` are
# read from the trainer's own dataloader (shifted labels that are not `-100`; for prompt/completion data
# TRL 1.16's `completion_only_loss=None` keeps only the completion's tokens).

# %%
probe = steps.trainer(batch_size=1, accumulation=N)
window = [batch for batch, _ in zip(probe.get_train_dataloader(), range(N))]  # the first window, as trained
counts = label_counts(probe, N)
token_weight_spread = companion.print_token_weights(counts)
print(f"label tokens per sample: {min(counts)} to {max(counts)}; on the old path one token of the shortest "
      f"sample weighs {token_weight_spread:.0f}x one token of the longest")

# %% [markdown]
# Short answers are weighted up, long answers down: the old path trains another objective, which is
# why the report saw a *worse* model and not only a noisier one. A batch of N has no such problem:
# its loss is one mean over all its tokens.
#
# ## 3. The fix, `num_items_in_batch`, and a trap that undoes it
#
# Since transformers 4.46.0 (`trainer.py`: `get_batch_samples`, `training_step`) the Trainer counts the
# label tokens of the whole window before its first micro-batch and passes that count to the loss as
# `num_items_in_batch`; each micro-batch returns the sum of its token losses divided by the window's
# count, and the accumulated sum is the big batch's mean. TRL 1.16's `SFTTrainer.compute_loss`
# (`sft_trainer.py`) passes it on.
#
# The wrong gradient comes back when the count does not reach the loss. Today's `Trainer` sets
# `model_accepts_loss_kwargs` from the model (its `accepts_loss_kwargs` attribute, else whether `forward`
# takes `**kwargs`; transformers 5.23, `trainer.py`), so a model whose forward takes no loss kwargs runs
# the old path of section 1 today. Transformers issue [#37766](https://github.com/huggingface/transformers/issues/37766)
# reported that case on 4.47.1, where the loss grew with `gradient_accumulation_steps`. A custom
# `compute_loss` that takes the mean over its micro-batch is another way; `MeanPerMicroBatchSFTTrainer`
# (in `trl_clinic.course.stand_ins`) is such a user override:
#
# ```python
# class MeanPerMicroBatchSFTTrainer(SFTTrainer):
#     def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
#         return super().compute_loss(model, inputs, return_outputs=return_outputs, num_items_in_batch=None)
# ```
#
# Below, at each accumulation count, batch 1 × count on the three paths against one batch of that count.

# %%
sweep = companion.accumulation_sweep(steps, sizes.accumulation_sweep, custom_class=MeanPerMicroBatchSFTTrainer)

# %%
errors = {path: [row["relative_error"] for row in rows] for path, rows in sweep.items()}
cosines = {path: [row["cosine"] for row in rows] for path, rows in sweep.items()}
print(f"today: largest relative error over the sweep {max(errors['today']):.1e}")
print(f"old: error {min(errors['old']):.2f} to {max(errors['old']):.2f}, cosine {min(cosines['old']):.3f} to "
      f"{max(cosines['old']):.3f}")
print(f"custom: error {errors['custom'][0]:.1f} at 1 x {sizes.accumulation_sweep[0]}, {errors['custom'][-1]:.1f} at "
      f"1 x {sizes.accumulation_sweep[-1]}; its cosine differs from the old path's by at most "
      f"{max(abs(c - o) for c, o in zip(cosines['custom'], cosines['old'])):.0e}")

# %% [markdown]
# Today's path matches the big batch to float precision at every accumulation count. The old
# normalisation misses it at every count, with a cosine far from 1: another direction, not a rescaled
# gradient. The custom loss has the old path's direction (the same cosine) and misses by more.
#
# ## 4. The custom loss: a wrong gradient, and a logged loss N times too high
#
# Each trainer above also reports the training loss of its one step (the `train_loss` a run prints at
# its end). What `Trainer.training_step` does with the loss `compute_loss` returns (transformers 5.23,
# `trainer.py`, shortened):
#
# ```python
# loss = self.compute_loss(model, inputs, num_items_in_batch=num_items_in_batch)
# ...
# if self.loss_is_scaled_for_ga is not None:        # a class attribute, None unless a trainer sets it
#     loss_is_scaled_for_ga = self.loss_is_scaled_for_ga
# else:
#     loss_is_scaled_for_ga = (self.model_accepts_loss_kwargs and num_items_in_batch is not None) \
#                             or self.compute_loss_func is not None
# if not loss_is_scaled_for_ga:
#     loss = loss / self.current_gradient_accumulation_steps
# self.accelerator.backward(loss, **kwargs)
# return loss.detach()                               # summed over the window: the step's logged loss
# ```
#
# The Trainer decides from *its own* view: the model accepts loss kwargs and it did count the window's
# tokens, so it takes the returned loss as already divided and leaves it alone. The override dropped the
# count, so every micro-batch returns its own mean, undivided: the logged loss is the sum of N means,
# and the gradient is the old path's, N times longer.

# %%
companion.print_reported_losses(sweep)

# %%
custom, custom_loss = steps.run_step(1, N, trainer_class=MeanPerMicroBatchSFTTrainer)
custom_vs_n_old = relative_error(custom, N * old)
print(f"at 1 x {N} the custom run reports {custom_loss:.1f}, {N} micro-batch means of about {custom_loss / N:.2f} "
      f"nats/token added up; its gradient is {N} x the old path's (relative error {custom_vs_n_old:.1e})")

# %% [markdown]
# So the high number is a scale effect (N means added up), but the model is not fine: its gradient is the
# old path's, pointing the old path's wrong way, N times longer.
#
# Since transformers 5.19.0 (`trainer.py`; absent from 5.18.0) a trainer can say what its loss is:
# `loss_is_scaled_for_ga = False` means "a mean per micro-batch, divide it for me". Declared on the custom
# trainer, the Trainer divides again, and the run becomes the old normalisation: honest numbers, still the
# wrong objective. Only a loss that uses `num_items_in_batch` fixes that.

# %%
class DeclaredMeanSFTTrainer(MeanPerMicroBatchSFTTrainer):
    loss_is_scaled_for_ga = False  # "my loss is a per-micro-batch mean": training_step divides it by N


declared, declared_loss = steps.run_step(1, N, trainer_class=DeclaredMeanSFTTrainer)
old_loss = next(row["reported_loss"] for row in sweep["old"] if row["accumulation"] == N)
declared_vs_old = {"relative_error": relative_error(declared, old), "reported_loss": declared_loss,
                   "old_reported_loss": old_loss}
print(f"declared custom loss, 1 x {N}: gradient vs the old path's {declared_vs_old['relative_error']:.1e}, "
      f"reported loss {declared_loss:.3f} (old path {old_loss:.3f})")

# %% [markdown]
# ## 5. Packed data suffers less
#
# Does packed data suffer less? With `SFTConfig(packing=True)` TRL 1.16 fills rows of
# `max_length` tokens with whole samples (`packing_strategy="bfd"`, best-fit decreasing), so a micro-batch
# is a row of several samples. The old path weighs a row's tokens by `1 / (N · nᵢ)`: with equal `nᵢ`
# that is the big batch's weight. Below: label tokens per micro-batch over the whole training set, one
# sample per micro-batch and packed, and the first step at batch 1 × N against batch N on packed rows.

# %%
spread = companion.label_spread(steps)
packed_big, _ = steps.run_step(N, 1, packing=True)
packed = {path: relative_error(steps.run_step(1, N, path, packing=True)[0], packed_big) for path in ("old", "today")}
old_at_n = errors["old"][sizes.accumulation_sweep.index(N)]
print(f"packed rows, first step at 1 x {N} vs batch {N}: old normalisation {packed['old']:.1e} (one sample per "
      f"micro-batch: {old_at_n:.2f}, {old_at_n / packed['old']:.0f}x more), today {packed['today']:.1e}")

# %% [markdown]
# Packing does not change the normalisation: it evens out the label counts, which is what the old one
# got wrong, so its error shrinks; compare it with today's above to see what is left.
#
# ## 6. Trained to the end: the report's two settings
#
# Batch N × accumulation 1 against batch 1 × accumulation N (once today's, once the old normalisation),
# over one pass of the training data (`max_steps × N` samples, none repeated), same weights, same data
# order, same learning-rate schedule (`warmup_steps=0.1`, a ratio: a linear warm-up over the first tenth
# of the steps, then linear decay). Held-out loss is evaluated as one batch per subset (short answers,
# long answers, all), so it is the true token mean.

# %%
eval_sets = {"all": eval_set, "short": eval_set.filter(lambda row: len(row["completion"].split()) == 1),
             "long": eval_set.filter(lambda row: len(row["completion"].split()) > 1)}
RUNS = {"big batch": ({"per_device_train_batch_size": N, "gradient_accumulation_steps": 1}, "today"),
        "today": ({"per_device_train_batch_size": 1, "gradient_accumulation_steps": N}, "today"),
        "old": ({"per_device_train_batch_size": 1, "gradient_accumulation_steps": N}, "old")}
curves = {name: companion.train_curve(run, make_model, tokenizer, train_set, eval_sets, name, config, normalisation)
          for name, (config, normalisation) in progress(RUNS.items(), "training runs")}

# %%
held_out = {name: {subset: rec.last(f"eval_{subset}_loss") for subset in eval_sets} for name, rec in curves.items()}
short_long = {name: losses["short"] / losses["long"] for name, losses in held_out.items()}  # lower: short answers favoured
for name, losses in held_out.items():
    print(f"{name:>9}: " + ", ".join(f"held-out {subset} {loss:.3f}" for subset, loss in losses.items())
          + f", short/long ratio {short_long[name]:.3f}")

# %%
train_losses = {name: rec.series("loss")[1] for name, rec in curves.items()}
train_gap = {name: max(abs(a - b) for a, b in zip(train_losses[name], train_losses["big batch"]))
             for name in ("today", "old")}
print(f"logged training loss, largest gap to batch {N} over {sizes.curve_steps} steps: "
      f"today {train_gap['today']:.1e}, old {train_gap['old']:.2f}")

# %% [markdown]
# Today's batch 1 × N is the big batch: the same logged loss at every step, the same held-out loss.
# The old normalisation logs another number (a mean of per-micro-batch means, which counts a short
# answer's few tokens as much as a long answer's many), trains another model, and favours short answers
# (its short/long ratio is the lowest).

# %%
companion.plot_lesson(sweep, curves, N, run.output_dir)

# %% [markdown]
# On some seeds the big batch's logged loss jumps once early in training, and today's with it, at the
# same step and by the same amount: they are the same computation. The loss logged at a step is computed on
# that step's window with the weights after the previous update, so a jump is either a harder window or an
# update that made the model worse. The run's own logs tell which:

# %%
rise = companion.largest_rise(curves["big batch"])
print(companion.describe_rise(rise))

# %% [markdown]
# Windows of ordinary size with a gradient norm far above its median point at the update, not the samples.
# Such a jump has nothing to do with accumulation: the big batch accumulates nothing and takes the same
# steps as today's path, while the old path takes other steps, so its curve need not jump there.
#
# ## 7. Then: the same step on transformers 4.45.2 and TRL 0.11.4, for real
#
# The old normalisation above is a re-creation on today's `Trainer`. Here the real old code runs in
# its own environment, an *era* (`make eras` builds it once under `.eras/`): the first window of
# section 2 (the same token ids) and the same initial weights go through transformers 4.45.2's
# `Trainer` and TRL 0.11.4's `SFTTrainer` with batch 1 × N. Its gradient is compared with the mean of
# per-micro-batch means, with the full-batch gradient, and with today's re-creation on the same weights.

# %%
then_dir = run.output_dir / "then"
then_spec = handshake.accumulation_spec(
    then_dir, model=make_model(), accumulation=N,
    examples=[{"input_ids": b["input_ids"][0].tolist(), "labels": b["labels"][0].tolist()} for b in window])
then = eras.run_in_era("02-transformers-4.45", "then_02_accumulation", then_spec, then_dir)
print(then.describe())

# %%
then_numbers = {"status": then.status}
if then.finished:
    era_gradients = handshake.load_era_gradients(then.result["gradients_file"])
    recreation = handshake.compare_gradients(handshake.today_gradient(then_spec, then_dir, recreate_old=True),
                                             era_gradients["sft_trainer"])
    then_numbers.update(paths=then.result["paths"], recreation_vs_era=recreation,
                        label_counts=then.result["label_counts"])
    for path, era in then.result["paths"].items():
        print(f"{path:>11} (real 4.45 code): vs mean of per-micro-batch means {era['vs_mean_of_means']:.1e}, "
              f"vs full batch {era['vs_full_batch']:.2f} (cosine {era['cosine_full_batch']:.3f})")
    print(f"today's re-creation vs the real 4.45 SFTTrainer: relative error {recreation['relative_error']:.1e}")
else:
    print("the era part is skipped; the lesson's other sections stand on their own")

# %% [markdown]
# ## 8. What to remember
#
# * Adding up per-micro-batch *means* is not the mean of the big batch when micro-batches hold different
#   numbers of label tokens: a token of a short sample gets more weight, and the model trains on another
#   objective.
# * Today's `Trainer` and `SFTTrainer` fix it with `num_items_in_batch` (transformers 4.46.0). A model
#   whose forward takes no loss kwargs gets the old path back today; a custom `compute_loss` that ignores the
#   count gets the old path's gradient, N times longer (a `compute_loss_func` is trusted the same way:
#   `training_step` above).
# * With such a custom `compute_loss`, the logged training loss is N times the old path's: that number is a
#   scale effect (the Trainer did not divide your per-micro-batch mean). The gradient is wrong as well: the
#   old path's direction, N times longer. `loss_is_scaled_for_ga = False` (transformers 5.19.0) repairs the
#   logged number only.
# * To check your own set-up: capture the first step's gradient for batch 1 × N and batch N × 1 on the same
#   weights and data (`first_step_gradient(trainer)`, as in section 1); today's path above shows how small
#   the relative error should be.
# * Packing evens out the label tokens per micro-batch, which hides most of the error without fixing it.
#
# **The fix in your script**: transformers 4.46.0 or newer, and a custom loss that passes the count on:
#
# ```python
# def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
#     return super().compute_loss(model, inputs, return_outputs=return_outputs, num_items_in_batch=num_items_in_batch)
# ```

# %% [markdown]
# ## 9. Exercise
#
# 1. Run `steps.run_step(2, N // 2, "old")`: is batch 2 × N/2 closer to the big batch than 1 × N? Why?
#    <details><summary>Hint</summary>
#    Compare the label counts per micro-batch, <code>label_counts(steps.trainer(2, N // 2), N // 2)</code>
#    against <code>counts</code>: what does a micro-batch of two consecutive samples hold?
#    </details>
# 2. Make every completion about the same length (`data.instruction_pairs(..., max_people=1)` and keep
#    only the biographies). Does the old normalisation still differ from the big batch, and by how much?
#    <details><summary>Hint</summary>
#    Biographies are the odd rows (<code>.select(range(1, n, 2))</code>); build a <code>FirstStep</code> on
#    that set and look at its label counts first.
#    </details>
# 3. Fix `MeanPerMicroBatchSFTTrainer` by passing `num_items_in_batch` on, and check it against the big batch.
#    <details><summary>Hint</summary>
#    <code>compute_loss</code> receives <code>num_items_in_batch</code>: hand it to
#    <code>super().compute_loss</code> instead of <code>None</code>, then compare with <code>relative_error</code>.
#    </details>
#
# Worked solutions: [`solutions/02_gradient_accumulation_loss.py`](solutions/02_gradient_accumulation_loss.py) (a test runs them).

# %% [markdown]
# ## Checks
#
# The claims above, asserted on this run's numbers and written to `metrics.json`.

# %% jupyter={"source_hidden": true} tags=["checks"]
def old_path_checks(n: dict) -> dict:
    """The old normalisation's gradient (recreated; real 4.45.2 when the era ran), padded and packed."""
    at_n, packed, spread = n["first_step"], n["packed"], n["label_spread"]
    claims = {
        "first step: batch 1 x N on the old normalisation misses batch N (relative error > 1e-2)":
            recreated(at_n["old_vs_big"] > 1e-2),
        "old normalisation misses the big-batch gradient at every count (relative error > 1e-2)":
            recreated(min(r["relative_error"] for r in n["sweep"]["old"]) > 1e-2),
        "packed rows hold more even label counts than padded samples (spread at most half)":
            spread["packed"]["coefficient_of_variation"] < 0.5 * spread["padded"]["coefficient_of_variation"],
        "packing shrinks the old normalisation's gradient error at least tenfold":
            recreated(packed["old"] < 0.1 * at_n["old_vs_big"]),
    }
    then = n["then"]
    if then["status"] == "finished":  # the real transformers 4.45.2 / TRL 0.11.4 (checks absent when skipped)
        old_sft = then["paths"]["sft_trainer"]
        claims["on transformers 4.45.2, SFTTrainer's gradient is the mean of per-micro-batch means (< 1e-5)"] = (
            old_sft["vs_mean_of_means"] < 1e-5)
        claims["on transformers 4.45.2, it misses the full-batch gradient (> 1e-2)"] = old_sft["vs_full_batch"] > 1e-2
    return claims


# %% jupyter={"source_hidden": true} tags=["checks"]
def old_run_checks(n: dict) -> dict:
    """The old normalisation trained to the end (recreated): another logged loss, another model."""
    held_out, short_long = n["held_out_loss"], n["held_out_short_long_ratio"]
    return {
        "old normalisation logs another training loss than the big batch (gap > 1e-2)":
            recreated(n["train_loss_gap"]["old"] > 1e-2),
        "old normalisation ends with a higher held-out loss than the big batch":
            recreated(held_out["old"]["all"] > held_out["big batch"]["all"]),
        "old normalisation favours short answers (its short/long held-out loss ratio is below the big batch's)":
            recreated(short_long["old"] < short_long["big batch"]),
    }


# %% jupyter={"source_hidden": true} tags=["checks"]
def custom_loss_checks(n: dict) -> dict:
    """A custom compute_loss that ignores num_items_in_batch: the old direction, N times longer, N times the loss."""
    old, custom = n["sweep"]["old"], n["sweep"]["custom"]
    return {
        "custom mean-per-micro-batch loss misses it too": min(r["relative_error"] for r in custom) > 1e-2,
        "custom loss has the old path's direction (cosines equal within 1e-6)": recreated(all(
            abs(c["cosine"] - o["cosine"]) < 1e-6 for c, o in zip(custom, old))),
        "custom loss gradient is N times the old path's (relative error < 1e-5)":
            recreated(n["first_step"]["custom_vs_n_old"] < 1e-5),
        "custom loss error grows with accumulation": all(
            a["relative_error"] < b["relative_error"] for a, b in zip(custom, custom[1:])),
        "custom loss reports N times the old path's training loss (within 1e-4 relative)": recreated(all(
            abs(c["reported_loss"] / o["reported_loss"] / c["accumulation"] - 1) < 1e-4 for c, o in zip(custom, old))),
        "declared loss_is_scaled_for_ga=False turns the custom loss into the old path (gradient < 1e-5)":
            recreated(n["declared_vs_old"]["relative_error"] < 1e-5),
    }


# %% jupyter={"source_hidden": true} tags=["checks"]
def fix_checks(n: dict) -> dict:
    """Today's num_items_in_batch: batch 1 x N is batch N, step after step; the re-creation is the real 4.45.2."""
    held_out = n["held_out_loss"]
    claims = {"num_items_in_batch matches the big batch (relative error < 1e-4)":
              max(r["relative_error"] for r in n["sweep"]["today"]) < 1e-4,
              "num_items_in_batch matches the big batch on packed rows too (< 1e-4)": n["packed"]["today"] < 1e-4,
              "batch 1 x N logs the big batch's training loss at every step (within 1e-3)":
              n["train_loss_gap"]["today"] < 1e-3,
              "batch 1 x N ends with the big batch's held-out loss (within 1e-3)":
              abs(held_out["today"]["all"] - held_out["big batch"]["all"]) < 1e-3}
    if n["then"]["status"] == "finished":
        claims["today's re-creation gives the real 4.45.2 gradient (relative error < 1e-5)"] = (
            n["then"]["recreation_vs_era"]["relative_error"] < 1e-5)
    return claims


def checks(n: dict) -> tuple[dict, dict]:
    """The claims above as functions of the numbers alone (a test feeds them runs without the bug)."""
    return {**old_path_checks(n), **old_run_checks(n), **custom_loss_checks(n)}, fix_checks(n)


# %% jupyter={"source_hidden": true}
numbers = {"first_step": {"old_vs_big": relative_error(old, reference), "custom_vs_n_old": custom_vs_n_old},
           "max_relative_error_today": max(errors["today"]), "min_relative_error_old": min(errors["old"]),
           "sweep": sweep, "token_weight_spread_old": token_weight_spread, "declared_vs_old": declared_vs_old,
           "label_spread": spread, "packed": packed, "held_out_loss": held_out, "train_loss_gap": train_gap,
           "held_out_short_long_ratio": short_long, "curve_accumulation": N, "curve_steps": sizes.curve_steps,
           "largest_loss_rise": rise, "then": then_numbers}
real_too = "; the real transformers 4.45.2 gave the same gradient" if then.finished else ""
summary = (f"Batch 1 x {N} with the pre-4.46 per-micro-batch mean (recreated{real_too}) missed the batch-{N} "
           f"gradient by {numbers['first_step']['old_vs_big']:.0%} and ended with held-out loss "
           f"{held_out['old']['all']:.3f} against {held_out['big batch']['all']:.3f}; today's num_items_in_batch "
           f"matched to {max(errors['today']):.0e}, while a custom compute_loss that drops it gave the old "
           f"gradient {N} times longer and logged a training loss of {custom_loss:.0f} ({N} means added up).")
metrics = save_metrics(run, "02", numbers, checks, summary=summary, eras=[then.to_metrics()])
assert not failed_checks(metrics), f"checks failed: {failed_checks(metrics)}"
print(f"all checks passed; metrics in {run.output_dir / 'metrics.json'}")
