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
# two should be the same optimisation (SmolLM-135M, Llama 3.2 1B).
#
# **What you will see here**, with the real `SFTTrainer`: the accumulated gradient of the old
# normalisation points somewhere else than the one-big-batch gradient, at every accumulation count;
# packed data, whose micro-batches hold about the same number of label tokens, suffers far less;
# the report's two settings, batch 1 × 32 and batch 32, trained side by side to the end of the data,
# where the old normalisation ends worse on held-out data; and today's `num_items_in_batch` path,
# which matches the big batch to float precision, step after step.
#
# **Time**: about 80 s on the cpu profile (2 CPU cores); `trl-clinic list` shows what each profile runs.
#
# The old normalisation is **re-created** on today's `Trainer` (`trl_clinic.stand_ins`, which names
# the transformers 4.45 code it stands for); the custom-loss trap and the fix are today's real code.

# %% tags=["parameters"]
profile = "auto"  # "auto" (gpu when CUDA is present), "cpu" or "gpu"
seed = 0
output_dir = None  # None: outputs/02_gradient_accumulation_loss at the repository root

# %%
import math

import torch
from trl import SFTConfig, SFTTrainer

from trl_clinic import data, eras, handshake, plotting
from trl_clinic.gradients import cosine, first_step_gradient, label_counts, relative_error
from trl_clinic.models import model_maker
from trl_clinic.parameters import start_run
from trl_clinic.recording import StepRecorder
from trl_clinic.results import failed_checks, recreated, save_metrics
from trl_clinic.runtime import progress
from trl_clinic.stand_ins import MeanPerMicroBatchSFTTrainer, recreate_pre_446_loss

run = start_run("02", profile, seed, output_dir)
print(run.describe())
sizes = run.sizes  # this lesson's numbers for the profile (lessons.yaml)
# every run starts from the same weights: a random-init tiny llama (cpu) or SmolLM2-135M-Instruct (gpu)
make_model, tokenizer = model_maker(sizes.model_size, seed=run.seed)

# %% [markdown]
# ## 1. The symptom
#
# An SFT dataset whose completions have very different lengths: one-word answers alternate with
# biographies of one to six people (`data.instruction_pairs` guarantees the alternation on every
# seed). Every sample's number of label tokens (the completion, since `completion_only_loss` is on
# for prompt/completion data) ranges from 2 to about 150.

# %%
train_set = data.instruction_pairs(sizes.n_train, seed=run.subseed("train"))
eval_set = data.instruction_pairs(sizes.n_eval, seed=run.subseed("eval"))
completion_tokens = [len(tokenizer(row["completion"])["input_ids"]) + 1 for row in train_set]  # + eos
print(f"label tokens per sample: min {min(completion_tokens)}, max {max(completion_tokens)}")
for row in train_set.select(range(3)):
    print(repr(row["prompt"]), "->", repr(row["completion"][:70]))


# %% [markdown]
# ## 2. Reproduce: the same samples as one batch and as accumulated micro-batches
#
# One optimizer step, three ways, each with a fresh model from the same seed (same weights) and
# the same samples: `train_sampling_strategy="sequential"` feeds the first N samples in order, so
# every window mixes short and long answers by construction (a random draw could, now and then,
# give a window whose samples hold equal label counts, where the old path happens to be exact):
#
# * **big batch**: `per_device_train_batch_size=N`, `gradient_accumulation_steps=1`; the reference.
# * **accumulated, old normalisation (re-created)**: batch 1 × N. Before transformers 4.46 each
#   micro-batch's loss was the mean over *its own* label tokens, divided by N. Today's Trainer still
#   does exactly that when it believes the model cannot take `num_items_in_batch`:
#   `recreate_pre_446_loss(trainer)` sets `trainer.model_accepts_loss_kwargs = False` after building
#   the trainer, which brings that path back.
# * **accumulated, today's default**: batch 1 × N with `num_items_in_batch`.
#
# `first_step_gradient` (a `TrainerCallback` underneath) copies the accumulated gradient just before
# the optimizer step (with `max_grad_norm=0`, so nothing is clipped) and stops training.
#
# The comparison runs in fp32 on every device: under bf16 autocast a big batch and its micro-batches
# round differently (about 1e-3), which would blur the 1e-4 check without changing the story.

# %%
def first_step_trainer(batch_size: int, accumulation: int, normalisation: str,
                       trainer_class: type[SFTTrainer] = SFTTrainer, packing: bool = False) -> SFTTrainer:
    """An SFTTrainer set for one optimizer step over the first samples; normalisation is "today" or "old"."""
    name = f"grad-{trainer_class.__name__}-{batch_size}x{accumulation}-{normalisation}{'-packed' * packing}"
    args = SFTConfig(
        **{**run.trainer_kwargs(name, logging=False), "bf16": False},
        per_device_train_batch_size=batch_size,
        gradient_accumulation_steps=accumulation,
        max_grad_norm=0,  # no clipping: compare the gradient exactly as accumulation built it
        train_sampling_strategy="sequential",  # the first N samples, alternating short and long
        max_steps=1,
        **({"packing": True, "max_length": sizes.packing_length} if packing else {}),  # rows of packed samples
    )
    trainer = trainer_class(model=make_model(), args=args, train_dataset=train_set, processing_class=tokenizer)
    if normalisation == "old":
        recreate_pre_446_loss(trainer)  # per-micro-batch mean, divided by the accumulation steps
    return trainer


def first_step(batch_size: int, accumulation: int, normalisation: str,
               trainer_class: type[SFTTrainer] = SFTTrainer, packing: bool = False) -> tuple[torch.Tensor, float]:
    """The accumulated gradient of the first optimizer step, and the training loss the Trainer reports for it."""
    trainer = first_step_trainer(batch_size, accumulation, normalisation, trainer_class, packing)
    recorder = StepRecorder().watch(trainer)  # keeps what the Trainer logs (and stops it printing raw dicts)
    gradient = first_step_gradient(trainer)  # trl_clinic.gradients: captures it just before the optimizer step
    return gradient, recorder.last("train_loss")


N = sizes.curve_accumulation
reference, _ = first_step(N, 1, "today")
old, _ = first_step(1, N, "old")
print(f"batch 1 x {N}, old normalisation vs batch {N}: "
      f"relative error {relative_error(old, reference):.3f}, cosine {cosine(old, reference):.4f}")
print(f"the old gradient is off by {relative_error(old, reference):.0%} of the big batch's and points "
      f"{math.degrees(math.acos(min(1.0, cosine(old, reference)))):.0f} degrees away from it")

# %% [markdown]
# Float noise between two batchings of the same samples is about 1e-7 (section 4 measures it): a gap
# like the one above is a different objective.
#
# ## 3. Diagnose: who gets which weight
#
# The loss we want is the mean over *all* label tokens of the accumulation window: every token
# weighs `1 / Σ nᵢ`. The old path averages per-micro-batch means: a token of sample *i* weighs
# `1 / (N · nᵢ)`. Below are the label counts of the first window as the trainer's own dataloader
# delivers it (shifted labels that are not `-100`), and the weight each path gives one token.

# %%
probe = first_step_trainer(1, N, "today")
window = [batch for batch, _ in zip(probe.get_train_dataloader(), range(N))]
counts = label_counts(probe, N)
weight_today = [1 / sum(counts)] * N
weight_old = [1 / (N * n) for n in counts]
print(f"{'sample':>6} {'labels':>7} {'weight today':>13} {'weight old':>11} {'old/today':>9}")
SHOWN = 8  # the pattern repeats: short and long answers alternate
for i, (n, w_t, w_o) in enumerate(zip(counts[:SHOWN], weight_today, weight_old)):
    print(f"{i:>6} {n:>7} {w_t:>13.5f} {w_o:>11.5f} {w_o / w_t:>9.2f}")
if N > SHOWN:
    print(f"{'...':>6} ({N - SHOWN} more micro-batches in the window)")
token_weight_spread = max(weight_old) / min(weight_old)
print(f"under the old path one token of the shortest sample weighs {token_weight_spread:.0f}x one token of the longest")


# %% [markdown]
# Short answers are weighted up, long answers down: the old path trains a different objective,
# which is why the report saw a *worse* model and not only a noisier one. A real batch of N has no
# such problem because its loss is already one mean over all its tokens.
#
# ## 4. The fix: `num_items_in_batch`
#
# Since transformers 4.46 the Trainer counts the label tokens of the whole accumulation window
# before the first micro-batch and passes that count to the loss as `num_items_in_batch`; each
# micro-batch returns `sum of its token losses / window count`, and the accumulated sum is exactly
# the big-batch mean. TRL's `SFTTrainer` uses it in its own `compute_loss`.
#
# The bug comes back whenever a loss ignores `num_items_in_batch`. A common way today: a custom
# `compute_loss` that takes a mean over its micro-batch (transformers issue #37766). The Trainer
# then believes the loss is already normalised for accumulation and does not even divide by N.
# `MeanPerMicroBatchSFTTrainer` (in `trl_clinic.stand_ins`) is such a user override:
#
# ```python
# class MeanPerMicroBatchSFTTrainer(SFTTrainer):
#     def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
#         return super().compute_loss(model, inputs, return_outputs=return_outputs, num_items_in_batch=None)
# ```

# %%
PATHS = ("today", "old", "custom")
sweep = {path: [] for path in PATHS}
for steps in progress(sizes.accumulation_sweep, "accumulation sweep"):
    big, big_loss = first_step(steps, 1, "today")
    candidates = {"today": first_step(1, steps, "today"), "old": first_step(1, steps, "old"),
                  "custom": first_step(1, steps, "today", trainer_class=MeanPerMicroBatchSFTTrainer)}
    for path, (gradient, reported) in candidates.items():
        sweep[path].append({"accumulation": steps, "relative_error": relative_error(gradient, big),
                            "cosine": cosine(gradient, big), "reported_loss": reported,
                            "big_batch_reported_loss": big_loss})
    print(f"1 x {steps:>2}: " + "  ".join(
        f"{path}: err {sweep[path][-1]['relative_error']:.2e} cos {sweep[path][-1]['cosine']:.6f}" for path in sweep))

# %%
old_errors = [row["relative_error"] for row in sweep["old"]]
custom_errors = [row["relative_error"] for row in sweep["custom"]]
first, last = sweep["old"][0]["accumulation"], sweep["old"][-1]["accumulation"]
print(f"today's path: largest error over the sweep {max(r['relative_error'] for r in sweep['today']):.1e} (float precision)")
print(f"old path: error between {min(old_errors):.2f} and {max(old_errors):.2f}, cosine between "
      f"{min(r['cosine'] for r in sweep['old']):.3f} and {max(r['cosine'] for r in sweep['old']):.3f}: "
      f"{'it grows' if old_errors == sorted(old_errors) else 'it does not grow steadily'} with the accumulation count")
print(f"custom loss: error {custom_errors[0]:.1f} at 1 x {first}, {custom_errors[-1]:.1f} at 1 x {last}: "
      f"{'it grows' if custom_errors == sorted(custom_errors) else 'it does not grow steadily'} with the accumulation count")

# %% [markdown]
# Today's path matches the big batch to float precision at every accumulation count. The old
# normalisation misses it at every count, and its cosine stays far from 1: a different direction,
# not a rescaled gradient. The custom loss has exactly the old path's direction (the same cosine,
# its line hides under the red one) and a gradient N times too large on top.
#
# ### Why the custom run reports a training loss of about 200
#
# Each trainer above also reports the training loss of its one step (the `train_loss` a training
# run prints at its end). Read what `Trainer.training_step` does with the loss `compute_loss` returns
# (transformers 5.23, installed here):
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
# self.accelerator.backward(loss)
# return loss.detach()                               # summed over the window: the step's logged loss
# ```
#
# The Trainer decides from *its own* view: the model accepts loss kwargs and it did count the window's
# tokens, so it takes the returned loss as already divided by the window and leaves it alone. The
# override dropped the count on its way to the loss, so every micro-batch returns its own mean,
# undivided, and the step's loss is the sum of N per-micro-batch means:

# %%
reported = {path: {row["accumulation"]: row["reported_loss"] for row in rows} for path, rows in sweep.items()}
big_reported = {row["accumulation"]: row["big_batch_reported_loss"] for row in sweep["today"]}
custom_over_old = {acc: reported["custom"][acc] / reported["old"][acc] for acc in reported["old"]}
for acc in sizes.accumulation_sweep:
    print(f"1 x {acc:>2} reports: today {reported['today'][acc]:.3f} (batch {acc}: {big_reported[acc]:.3f}), "
          f"old {reported['old'][acc]:.3f}, custom {reported['custom'][acc]:.1f} = {custom_over_old[acc]:.3f} x old")
print(f"so at 1 x {N} the custom run reports {reported['custom'][N]:.1f}: {N} micro-batch means of about "
      f"{reported['custom'][N] / N:.2f} nats/token added up, not a loss {reported['custom'][N] / reported['today'][N]:.0f} "
      "times worse; its gradient is the old path's, times the accumulation count")

# %% [markdown]
# Since transformers 5.19 a trainer can say what its loss is: `loss_is_scaled_for_ga = False` means
# "a mean per micro-batch, divide it for me". Declared on the custom trainer, the Trainer divides again,
# and the run becomes the old normalisation exactly (same gradient, same reported loss): honest
# numbers, still the wrong objective. Only a loss that uses `num_items_in_batch` fixes that.

# %%
class DeclaredMeanSFTTrainer(MeanPerMicroBatchSFTTrainer):
    loss_is_scaled_for_ga = False  # "my loss is a per-micro-batch mean": training_step divides it by N


declared, declared_loss = first_step(1, N, "today", trainer_class=DeclaredMeanSFTTrainer)
declared_vs_old = {"relative_error": relative_error(declared, old), "reported_loss": declared_loss,
                   "old_reported_loss": reported["old"][N]}
print(f"custom loss declared as a per-micro-batch mean, 1 x {N}: gradient vs the old path's "
      f"{declared_vs_old['relative_error']:.1e}, reported loss {declared_loss:.3f} (old path {reported['old'][N]:.3f})")

# %% [markdown]
# ## 5. Packed data suffers less
#
# The report adds that padding-heavy data (short and long samples mixed, each its own micro-batch)
# suffers most, and packed data less. With `SFTConfig(packing=True)` TRL fills rows of `max_length`
# tokens with whole samples (best-fit decreasing), so every micro-batch is a row of several samples,
# and most rows hold about the same number of label tokens. The old normalisation weighs each row's
# tokens by `1 / (N · nᵢ)`: with equal `nᵢ` that is the big batch's weight. Below: the label tokens
# per micro-batch over the whole training set, padded (one sample per micro-batch) and packed, and the
# first step's gradient at batch 1 × N against batch N on the same packed rows.

# %%
spread = {"padded": label_counts(first_step_trainer(1, 1, "today")),
          "packed": label_counts(first_step_trainer(1, 1, "today", packing=True))}
for name, row_counts in spread.items():
    mean = sum(row_counts) / len(row_counts)
    std = (sum((c - mean) ** 2 for c in row_counts) / len(row_counts)) ** 0.5
    spread[name] = {"micro_batches": len(row_counts), "min": min(row_counts), "max": max(row_counts),
                    "coefficient_of_variation": std / mean}
    print(f"{name}: {len(row_counts)} micro-batches, label tokens {min(row_counts)} to {max(row_counts)}, "
          f"spread (std / mean) {std / mean:.2f}")
packed_big, _ = first_step(N, 1, "today", packing=True)
packed = {path: relative_error(first_step(1, N, path, packing=True)[0], packed_big) for path in ("old", "today")}
print(f"packed rows, first step at 1 x {N} vs batch {N}: old normalisation error {packed['old']:.1e} "
      f"(padded: {old_errors[sizes.accumulation_sweep.index(N)]:.2f}), today {packed['today']:.1e}")

# %% [markdown]
# Packing does not fix the normalisation: it removes most of what the old one got wrong, the unequal
# label counts. Rows at the end of the packed set, filled with whatever samples were left, hold fewer
# tokens (the minimum above), so an accumulation window that reaches them is off again.
#
# ## 6. Compare: the report's two settings, trained to the end
#
# The report's runs: batch 32 × accumulation 1 against batch 1 × accumulation 32, here with
# accumulation N, over one pass of the training data (`max_steps × N` samples, none repeated), same
# weights, same data order, same learning rate; batch 1 × N once with today's normalisation and once
# with the old one. Held-out loss is evaluated as one batch per subset, so it is the true token mean
# (a per-batch mean of means would repeat the very bug we study).

# %%
short_eval = eval_set.filter(lambda row: len(row["completion"].split()) == 1)
long_eval = eval_set.filter(lambda row: len(row["completion"].split()) > 1)
eval_sets = {"all": eval_set, "short": short_eval, "long": long_eval}
RUNS = {"big batch": (N, 1, "today"), "today": (1, N, "today"), "old": (1, N, "old")}


def train_curve(name: str, batch_size: int, accumulation: int, normalisation: str) -> StepRecorder:
    args = SFTConfig(
        **run.trainer_kwargs(f"curve-{name.replace(' ', '-')}"),
        per_device_train_batch_size=batch_size,
        gradient_accumulation_steps=accumulation,
        learning_rate=sizes.learning_rate,
        warmup_steps=0.1,  # a float below 1 is a ratio
        max_steps=sizes.curve_steps,
        eval_strategy="steps",
        eval_steps=max(1, sizes.curve_steps // 4),
        per_device_eval_batch_size=len(eval_set),
    )
    trainer = SFTTrainer(model=make_model(), args=args, train_dataset=train_set, eval_dataset=eval_sets,
                         processing_class=tokenizer)
    if normalisation == "old":
        recreate_pre_446_loss(trainer)
    recorder = StepRecorder().watch(trainer)
    trainer.train()
    recorder.save(run.output_dir / f"history_{name.replace(' ', '_')}.json")
    return recorder


curves = {name: train_curve(name, *setting) for name, setting in progress(RUNS.items(), "training runs")}
held_out = {name: {subset: rec.last(f"eval_{subset}_loss") for subset in eval_sets} for name, rec in curves.items()}
train_losses = {name: rec.series("loss")[1] for name, rec in curves.items()}
# the old path weights short answers up: relative to long answers, it should do better on them
short_long = {name: losses["short"] / losses["long"] for name, losses in held_out.items()}
for name, losses in held_out.items():
    print(f"{name:>9}: " + ", ".join(f"held-out {subset} {loss:.3f}" for subset, loss in losses.items())
          + f", short/long ratio {short_long[name]:.3f}")
train_gap = {name: max(abs(a - b) for a, b in zip(train_losses[name], train_losses["big batch"]))
             for name in ("today", "old")}
print(f"logged training loss, largest gap to batch {N} over {sizes.curve_steps} steps: "
      f"today {train_gap['today']:.1e}, old {train_gap['old']:.2f}")

# %% [markdown]
# Today's batch 1 × N is the big batch: the same logged loss at every step, the same held-out loss.
# The old normalisation logs a different number (a mean of per-micro-batch means, which counts a short
# answer's few tokens as much as a long answer's many) and trains a different model.

# %%
fig, (ax_err, ax_cos, ax_train, ax_curve) = plotting.figure(
    4, title="Old normalisation (recreated): wrong gradient at every accumulation count, a different run, worse held-out loss",
    width=4.4)
steps_axis = [row["accumulation"] for row in sweep["today"]]
for path, kind, name in (("old", "bad", "old: mean per micro-batch"), ("custom", "other", "custom compute_loss"),
                         ("today", "fixed", "today: num_items_in_batch")):
    plotting.line(ax_err, steps_axis, [max(row["relative_error"], 1e-9) for row in sweep[path]], kind, name)
    plotting.line(ax_cos, steps_axis, [row["cosine"] for row in sweep[path]], kind, name,
                  linestyle=":" if path == "custom" else "-")
plotting.label(ax_err, "accumulation steps (batch 1)", "relative error vs big batch", "gradient error", log_y=True)
plotting.label(ax_cos, "accumulation steps (batch 1)", "cosine with big-batch gradient", "gradient direction")
for ax in (ax_err, ax_cos):
    ax.set_xscale("log", base=2)
    ax.set_xticks(steps_axis, [str(steps) for steps in steps_axis])  # accumulation counts are integers
KINDS = {"big batch": ("reference", f"batch {N} x 1"), "today": ("fixed", f"batch 1 x {N}, today"),
         "old": ("bad", f"batch 1 x {N}, old (recreated)")}
for name, (kind, legend) in KINDS.items():
    # today's line lies on the big batch's: the big batch is drawn wide underneath, today dotted on top
    style = {"big batch": {"linewidth": 5, "alpha": 0.4}, "today": {"linestyle": ":"}}.get(name, {})
    plotting.line(ax_train, *curves[name].series("loss"), kind, legend, **style)
    plotting.line(ax_curve, *curves[name].series("eval_all_loss"), kind, legend, **style)
plotting.label(ax_train, "optimizer step", "logged training loss", "what each run logs")
plotting.label(ax_curve, "optimizer step", "held-out loss (nats/token)", "held-out loss")
plotting.save(fig, run.output_dir, "gradient_accumulation")

# %% [markdown]
# ## 7. Then: the same step on transformers 4.45.2 and TRL 0.11.4, for real
#
# The old normalisation above is a re-creation on today's `Trainer`. Here the real old code runs in
# its own environment, an *era* (`make eras` builds it once under `.eras/`): the first window of
# section 3 (the same token ids) and the same initial weights go through transformers 4.45.2's
# `Trainer` and TRL 0.11.4's `SFTTrainer` with batch 1 × N. Its gradient is compared with the mean of
# per-micro-batch means, with the full-batch gradient, and with today's re-creation on the same weights.

# %%
then_dir = run.output_dir / "then"
then_spec = handshake.accumulation_spec(
    then_dir, model=make_model(), accumulation=N,
    examples=[{"input_ids": b["input_ids"][0].tolist(), "labels": b["labels"][0].tolist()} for b in window])
then = eras.run_in_era("02-transformers-4.45", "then_02_accumulation", then_spec, then_dir)
print(then.describe())
then_numbers = {"status": then.status}
if then.finished:
    era_gradients = handshake.load_era_gradients(then.result["gradients_file"])
    recreation = handshake.compare_gradients(handshake.today_gradient(then_spec, then_dir, recreate_old=True),
                                             era_gradients["sft_trainer"])
    then_numbers.update(paths=then.result["paths"], recreation_vs_era=recreation,
                        label_counts=then.result["label_counts"])
    for path, numbers in then.result["paths"].items():
        print(f"{path:>11} (real 4.45 code): vs mean of per-micro-batch means {numbers['vs_mean_of_means']:.1e}, "
              f"vs full batch {numbers['vs_full_batch']:.2f} (cosine {numbers['cosine_full_batch']:.3f})")
    print(f"today's re-creation vs the real 4.45 SFTTrainer: relative error {recreation['relative_error']:.1e}")
else:
    print("the era part is skipped; the lesson's other sections stand on their own")

# %% [markdown]
# ## 8. What to remember
#
# * Accumulating per-micro-batch *means* is not the mean of the big batch when micro-batches hold
#   different numbers of label tokens: short samples get weighted up.
# * Today's Trainer and `SFTTrainer` fix it with `num_items_in_batch`. Any custom `compute_loss`,
#   `compute_loss_func` or model forward that ignores that argument brings the bug back, silently.
# * To check your own setup: capture the first step's gradient for batch 1 × N and batch N × 1 on the
#   same weights and data (`first_step_gradient(trainer)`, as above). The relative error should be ~1e-7.
# * Packing evens out the label tokens per micro-batch, which hides most of the error without fixing it.
# * A training loss N times too high with a custom loss is a scale mix-up, not a worse model: the Trainer
#   did not divide your per-micro-batch mean. Compare held-out losses or gradients; the old path's
#   logged loss is another average than the big batch's.
#
# **The fix in your script**: transformers 4.46 or newer, and a custom loss that passes the count on:
#
# ```python
# def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
#     return super().compute_loss(model, inputs, return_outputs=return_outputs, num_items_in_batch=num_items_in_batch)
# ```

# %% [markdown]
# ## 9. Exercise
#
# 1. Run `first_step(2, N // 2, "old")`: is batch 2 × N/2 closer to the big batch than 1 × N? Why?
# 2. Make every completion about the same length (`data.instruction_pairs(..., max_people=1)` and keep
#    only the biographies). Does the old normalisation still differ from the big batch, and by how much?
# 3. Fix `MeanPerMicroBatchSFTTrainer` by passing `num_items_in_batch` on, and check it against the big batch.
#
# Worked solutions: [`solutions/02_gradient_accumulation_loss.py`](solutions/02_gradient_accumulation_loss.py) (a test runs them).

# %% [markdown]
# ## Checks
#
# The claims above, checked on this run's numbers and written to `metrics.json`.

# %% tags=["checks"]
def checks(n: dict) -> tuple[dict, dict]:
    """The claims above as functions of the numbers alone (a test feeds them runs without the bug)."""
    old, custom, today = (n["sweep"][path] for path in ("old", "custom", "today"))
    held_out, short_long, packed, spread = (n["held_out_loss"], n["held_out_short_long_ratio"], n["packed"],
                                            n["label_spread"])
    at_curve = next(r for r in old if r["accumulation"] == n["curve_accumulation"])
    symptom = {
        "old normalisation misses the big-batch gradient (relative error > 1e-2)":
            recreated(min(r["relative_error"] for r in old) > 1e-2),
        "custom mean-per-micro-batch loss misses it too": min(r["relative_error"] for r in custom) > 1e-2,
        "custom loss has the old path's direction (cosines equal within 1e-6)": recreated(all(
            abs(c["cosine"] - o["cosine"]) < 1e-6 for c, o in zip(custom, old))),
        "custom loss error grows with accumulation": all(
            a["relative_error"] < b["relative_error"] for a, b in zip(custom, custom[1:])),
        "custom loss reports N times the old path's training loss (within 1e-4 relative)": recreated(all(
            abs(c["reported_loss"] / o["reported_loss"] / c["accumulation"] - 1) < 1e-4 for c, o in zip(custom, old))),
        "declared loss_is_scaled_for_ga=False turns the custom loss into the old path (gradient < 1e-5)":
            recreated(n["declared_vs_old"]["relative_error"] < 1e-5),
        "packed rows hold more even label counts than padded samples (spread at most half)":
            spread["packed"]["coefficient_of_variation"] < 0.5 * spread["padded"]["coefficient_of_variation"],
        "packing shrinks the old normalisation's gradient error at least tenfold":
            recreated(packed["old"] < 0.1 * at_curve["relative_error"]),
        "old normalisation logs another training loss than the big batch (gap > 1e-2)":
            recreated(n["train_loss_gap"]["old"] > 1e-2),
        "old normalisation ends with a higher held-out loss than the big batch":
            recreated(held_out["old"]["all"] > held_out["big batch"]["all"]),
        "old normalisation favours short answers (its short/long held-out loss ratio is below the big batch's)":
            recreated(short_long["old"] < short_long["big batch"]),
    }
    fix = {"num_items_in_batch matches the big batch (relative error < 1e-4)":
           max(r["relative_error"] for r in today) < 1e-4,
           "num_items_in_batch matches the big batch on packed rows too (< 1e-4)": packed["today"] < 1e-4,
           "batch 1 x N logs the big batch's training loss at every step (within 1e-3)":
           n["train_loss_gap"]["today"] < 1e-3,
           "batch 1 x N ends with the big batch's held-out loss (within 1e-3)":
           abs(held_out["today"]["all"] - held_out["big batch"]["all"]) < 1e-3}
    then = n["then"]
    if then["status"] == "finished":  # the real transformers 4.45.2 / TRL 0.11.4 (checks absent when skipped)
        old_sft = then["paths"]["sft_trainer"]
        symptom["on transformers 4.45.2, SFTTrainer's gradient is the mean of per-micro-batch means (< 1e-5)"] = (
            old_sft["vs_mean_of_means"] < 1e-5)
        symptom["on transformers 4.45.2, it misses the full-batch gradient (> 1e-2)"] = old_sft["vs_full_batch"] > 1e-2
        fix["today's re-creation gives the real 4.45.2 gradient (relative error < 1e-5)"] = (
            then["recreation_vs_era"]["relative_error"] < 1e-5)
    return symptom, fix


# %%
numbers = {"max_relative_error_today": max(r["relative_error"] for r in sweep["today"]),
           "min_relative_error_old": min(r["relative_error"] for r in sweep["old"]),
           "sweep": sweep, "token_weight_spread_old": token_weight_spread, "declared_vs_old": declared_vs_old,
           "label_spread": spread, "packed": packed, "held_out_loss": held_out, "train_loss_gap": train_gap,
           "held_out_short_long_ratio": short_long, "curve_accumulation": N, "curve_steps": sizes.curve_steps,
           "then": then_numbers}
metrics = save_metrics(run, "02", numbers, checks, eras=[then.to_metrics()])
assert not failed_checks(metrics), f"checks failed: {failed_checks(metrics)}"
print(f"all checks passed; metrics in {run.output_dir / 'metrics.json'}")
