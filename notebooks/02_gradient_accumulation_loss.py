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
# a run trained with it ends worse on held-out data; and today's
# `num_items_in_batch` path matches the big batch to float precision.
#
# **Time**: about 40 s on the cpu profile (2 CPU cores); `trl-clinic list` shows what each profile runs.
#
# The old normalisation is **re-created** on today's `Trainer` (`trl_clinic.stand_ins`, which names
# the transformers 4.45 code it stands for); the custom-loss trap and the fix are today's real code.

# %% tags=["parameters"]
profile = "auto"  # "auto" (gpu when CUDA is present), "cpu" or "gpu"
seed = 0
output_dir = None  # None: outputs/02_gradient_accumulation_loss at the repository root

# %%
import torch
from trl import SFTConfig, SFTTrainer

from trl_clinic import data, eras, handshake, plotting
from trl_clinic.gradients import cosine, first_step_gradient, relative_error
from trl_clinic.models import make_causal_lm
from trl_clinic.parameters import start_run
from trl_clinic.recording import StepRecorder
from trl_clinic.results import failed_checks, recreated, save_metrics
from trl_clinic.runtime import progress
from trl_clinic.stand_ins import MeanPerMicroBatchSFTTrainer, recreate_pre_446_loss
from trl_clinic.tokenizer import build_tokenizer

run = start_run("02", profile, seed, output_dir)
print(run.describe())
sizes = run.sizes  # this lesson's numbers for the profile (lessons.yaml)

# %% [markdown]
# ## 1. The symptom
#
# An SFT dataset whose completions have very different lengths: one-word answers alternate with
# biographies of one to six people (`data.instruction_pairs` guarantees the alternation on every
# seed). Every sample's number of label tokens (the completion, since `completion_only_loss` is on
# for prompt/completion data) ranges from 2 to about 150.

# %%
tokenizer = build_tokenizer()
train_set = data.instruction_pairs(sizes.n_train, seed=run.subseed("train"))
eval_set = data.instruction_pairs(sizes.n_eval, seed=run.subseed("eval"))
label_counts = [len(tokenizer(row["completion"])["input_ids"]) + 1 for row in train_set]  # + eos
print(f"label tokens per sample: min {min(label_counts)}, max {max(label_counts)}")
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
def accumulated_gradient(batch_size: int, accumulation: int, normalisation: str,
                         trainer_class: type[SFTTrainer] = SFTTrainer) -> torch.Tensor:
    """The accumulated gradient of the first optimizer step; normalisation is "today" or "old"."""
    args = SFTConfig(
        **{**run.trainer_kwargs(f"grad-{trainer_class.__name__}-{batch_size}x{accumulation}-{normalisation}",
                                logging=False), "bf16": False},
        per_device_train_batch_size=batch_size,
        gradient_accumulation_steps=accumulation,
        max_grad_norm=0,  # no clipping: compare the gradient exactly as accumulation built it
        train_sampling_strategy="sequential",  # the first N samples, alternating short and long
        max_steps=1,
    )
    trainer = trainer_class(model=make_causal_lm(tokenizer, size=sizes.model_size, seed=run.seed), args=args,
                            train_dataset=train_set, processing_class=tokenizer)
    if normalisation == "old":
        recreate_pre_446_loss(trainer)  # per-micro-batch mean, divided by the accumulation steps
    return first_step_gradient(trainer)  # trl_clinic.gradients: captures it just before the optimizer step


N = sizes.curve_accumulation
reference = accumulated_gradient(N, 1, "today")
old = accumulated_gradient(1, N, "old")
print(f"batch 1 x {N}, old normalisation vs batch {N}: "
      f"relative error {relative_error(old, reference):.3f}, cosine {cosine(old, reference):.4f}")

# %% [markdown]
# The two gradients differ by tens of percent and do not even point the same way: this is not float
# noise, it is a different objective.
#
# ## 3. Diagnose: who gets which weight
#
# The loss we want is the mean over *all* label tokens of the accumulation window: every token
# weighs `1 / Σ nᵢ`. The old path averages per-micro-batch means: a token of sample *i* weighs
# `1 / (N · nᵢ)`. Below are the label counts of the first window as the trainer's own dataloader
# delivers it (shifted labels that are not `-100`), and the weight each path gives one token.

# %%
probe = SFTTrainer(model=make_causal_lm(tokenizer, size=sizes.model_size, seed=run.seed), processing_class=tokenizer,
                   train_dataset=train_set,
                   args=SFTConfig(**run.trainer_kwargs("probe", logging=False), per_device_train_batch_size=1,
                                  train_sampling_strategy="sequential"))
window = [batch for batch, _ in zip(probe.get_train_dataloader(), range(N))]
counts = [int((batch["labels"][..., 1:] != -100).sum()) for batch in window]
weight_today = [1 / sum(counts)] * N
weight_old = [1 / (N * n) for n in counts]
print(f"{'sample':>6} {'labels':>7} {'weight today':>13} {'weight old':>11} {'old/today':>9}")
for i, (n, w_t, w_o) in enumerate(zip(counts, weight_today, weight_old)):
    print(f"{i:>6} {n:>7} {w_t:>13.5f} {w_o:>11.5f} {w_o / w_t:>9.2f}")
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
sweep = {"today": [], "old": [], "custom": []}
for steps in progress(sizes.accumulation_sweep, "accumulation sweep"):
    big = accumulated_gradient(steps, 1, "today")
    candidates = {"today": accumulated_gradient(1, steps, "today"),
                  "old": accumulated_gradient(1, steps, "old"),
                  "custom": accumulated_gradient(1, steps, "today", trainer_class=MeanPerMicroBatchSFTTrainer)}
    for path, gradient in candidates.items():
        sweep[path].append({"accumulation": steps, "relative_error": relative_error(gradient, big),
                            "cosine": cosine(gradient, big)})
    print(f"1 x {steps:>2}: " + "  ".join(
        f"{path}: err {sweep[path][-1]['relative_error']:.2e} cos {sweep[path][-1]['cosine']:.6f}" for path in sweep))

# %% [markdown]
# Today's path matches the big batch to float precision at every accumulation count. The old
# normalisation misses it at every count, and its cosine stays far from 1: a different direction,
# not a rescaled gradient. The custom loss has exactly the old path's direction (the same cosine,
# its line hides under the red one) and, on top, a gradient N times too large, because the Trainer
# no longer divides by N: its error grows with the accumulation count.
#
# ## 5. Compare: does it matter for training?
#
# Two runs of the same length, batch 1 × 8, same weights, same data order, same learning rate;
# only the normalisation differs. Held-out loss is evaluated as one batch per subset, so it is
# the true token mean (a per-batch mean of means would repeat the very bug we study). The logged
# training losses of the two paths are on different scales, so the held-out loss is the comparison.

# %%
short_eval = eval_set.filter(lambda row: len(row["completion"].split()) == 1)
long_eval = eval_set.filter(lambda row: len(row["completion"].split()) > 1)
eval_sets = {"all": eval_set, "short": short_eval, "long": long_eval}


def train_curve(normalisation: str) -> StepRecorder:
    args = SFTConfig(
        **run.trainer_kwargs(f"curve-{normalisation}"),
        per_device_train_batch_size=1,
        gradient_accumulation_steps=sizes.curve_accumulation,
        learning_rate=sizes.learning_rate,
        warmup_steps=0.1,  # a float below 1 is a ratio
        max_steps=sizes.curve_steps,
        eval_strategy="steps",
        eval_steps=max(1, sizes.curve_steps // 4),
        per_device_eval_batch_size=len(eval_set),
    )
    trainer = SFTTrainer(model=make_causal_lm(tokenizer, size=sizes.model_size, seed=run.seed), args=args,
                         train_dataset=train_set, eval_dataset=eval_sets, processing_class=tokenizer)
    if normalisation == "old":
        recreate_pre_446_loss(trainer)
    recorder = StepRecorder().watch(trainer)
    trainer.train()
    recorder.save(run.output_dir / f"history_{normalisation}.json")
    return recorder


curves = {normalisation: train_curve(normalisation) for normalisation in ("old", "today")}
held_out = {norm: {name: rec.last(f"eval_{name}_loss") for name in eval_sets} for norm, rec in curves.items()}
# the old path weights short answers up: relative to long answers, it should do better on them
short_long = {norm: losses["short"] / losses["long"] for norm, losses in held_out.items()}
for norm, losses in held_out.items():
    print(f"{norm:>6}: " + ", ".join(f"held-out {name} {loss:.3f}" for name, loss in losses.items())
          + f", short/long ratio {short_long[norm]:.3f}")

# %%
fig, (ax_err, ax_cos, ax_curve) = plotting.figure(
    3, title="Old normalisation: wrong gradient at every accumulation count, worse held-out loss")
steps_axis = [row["accumulation"] for row in sweep["today"]]
for path, kind, name in (("old", "bad", "old: mean per micro-batch"), ("custom", "other", "custom compute_loss"),
                         ("today", "fixed", "today: num_items_in_batch")):
    plotting.line(ax_err, steps_axis, [max(row["relative_error"], 1e-9) for row in sweep[path]], kind, name)
    plotting.line(ax_cos, steps_axis, [row["cosine"] for row in sweep[path]], kind, name,
                  linestyle=":" if path == "custom" else "-")
plotting.label(ax_err, "accumulation steps (batch 1)", "relative error vs big batch", "gradient error", log_y=True)
plotting.label(ax_cos, "accumulation steps (batch 1)", "cosine with big-batch gradient", "gradient direction")
ax_err.set_xscale("log", base=2)
ax_cos.set_xscale("log", base=2)
for norm, kind in (("old", "bad"), ("today", "fixed")):
    plotting.line(ax_curve, *curves[norm].series("eval_all_loss"), kind, f"{norm} normalisation")
plotting.label(ax_curve, "optimizer step", "held-out loss (nats/token)", f"training, batch 1 x {N}")
plotting.save(fig, run.output_dir, "gradient_accumulation")

# %% [markdown]
# ## 6. Then: the same step on transformers 4.45.2 and TRL 0.11.4, for real
#
# The old normalisation above is a re-creation on today's `Trainer`. Here the real old code runs in
# its own environment, an *era* (`make eras` builds it once under `.eras/`): the first window of
# section 3 (the same token ids) and the same initial weights go through transformers 4.45.2's
# `Trainer` and TRL 0.11.4's `SFTTrainer` with batch 1 × N. Its gradient is compared with the mean of
# per-micro-batch means, with the full-batch gradient, and with today's re-creation on the same weights.

# %%
then_dir = run.output_dir / "then"
then_spec = handshake.accumulation_spec(
    then_dir, model=make_causal_lm(tokenizer, size=sizes.model_size, seed=run.seed), accumulation=N,
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
# ## 7. What to remember
#
# * Accumulating per-micro-batch *means* is not the mean of the big batch when micro-batches hold
#   different numbers of label tokens: short samples get weighted up.
# * Today's Trainer and `SFTTrainer` fix it with `num_items_in_batch`. Any custom `compute_loss`,
#   `compute_loss_func` or model forward that ignores that argument brings the bug back, silently.
# * To check your own setup: capture the first step's gradient for batch 1 × N and batch N × 1 on the
#   same weights and data (`first_step_gradient(trainer)`, as above). The relative error should be ~1e-7.
# * Compare held-out losses or gradients, not logged training losses: the paths log on different scales.
#
# **The fix in your script**: transformers 4.46 or newer, and a custom loss that passes the count on:
#
# ```python
# def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
#     return super().compute_loss(model, inputs, return_outputs=return_outputs, num_items_in_batch=num_items_in_batch)
# ```
#
# ## 8. Exercise
#
# 1. Run `accumulated_gradient(2, N // 2, "old")`: is 2 × 4 closer to the big batch than 1 × 8? Why?
# 2. Make every completion the same length (`data.instruction_pairs(..., max_people=1)` and keep only
#    the biographies). Does the old normalisation still differ from the big batch?
# 3. Fix `MeanPerMicroBatchSFTTrainer` by using `num_items_in_batch`, and check it against the sweep.
#
# ## Checks
#
# The claims above, checked on this run's numbers and written to `metrics.json`.

# %% tags=["checks"]
def checks(n: dict) -> tuple[dict, dict]:
    """The claims above as functions of the numbers alone (a test feeds them runs without the bug)."""
    old, custom, today = (n["sweep"][path] for path in ("old", "custom", "today"))
    held_out, short_long = n["held_out_loss"], n["held_out_short_long_ratio"]
    symptom = {
        "old normalisation misses the big-batch gradient (relative error > 1e-2)":
            recreated(min(r["relative_error"] for r in old) > 1e-2),
        "custom mean-per-micro-batch loss misses it too": min(r["relative_error"] for r in custom) > 1e-2,
        "custom loss has the old path's direction (cosines equal within 1e-6)": recreated(all(
            abs(c["cosine"] - o["cosine"]) < 1e-6 for c, o in zip(custom, old))),
        "custom loss error grows with accumulation": all(
            a["relative_error"] < b["relative_error"] for a, b in zip(custom, custom[1:])),
        "old normalisation ends with a higher held-out loss":
            recreated(held_out["old"]["all"] > held_out["today"]["all"]),
        "old normalisation favours short answers (its short/long held-out loss ratio is below today's)":
            recreated(short_long["old"] < short_long["today"]),
    }
    fix = {"num_items_in_batch matches the big batch (relative error < 1e-4)":
           max(r["relative_error"] for r in today) < 1e-4}
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
           "sweep": sweep, "token_weight_spread_old": token_weight_spread, "held_out_loss": held_out,
           "held_out_short_long_ratio": short_long, "curve_accumulation": N, "curve_steps": sizes.curve_steps,
           "then": then_numbers}
metrics = save_metrics(run, "02", numbers, checks, eras=[then.to_metrics()])
assert not failed_checks(metrics), f"checks failed: {failed_checks(metrics)}"
print(f"all checks passed; metrics in {run.output_dir / 'metrics.json'}")
