# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 07 · Watch your run: a NaN caught at the step it starts
#
# A LoRA reward model in fp16 with the non-fused AdamW ([TRL #2367](https://github.com/huggingface/trl/issues/2367))
# trains to the end; its log hides when it broke. Here it runs under a watch.
#
# **You will learn**
# * to add `ClinicWatch` to a trainer and read its finding;
# * what it reads at a step, and why the log showed it late;
# * to stop a run at its first bad step.
#
# **You should know**: a transformers `TrainerCallback`.
#
# **Time**: 8 s to run on the cpu [profile](../README.md#words-the-lessons-use); about 20 minutes to work through.
#
# > **Hosted** (Colab, Kaggle, no clone): upload the wheel `uv build` makes, then run `%pip install "./trl_clinic-0.1.0-py3-none-any.whl[course]"` first.

# %% tags=["parameters"]
profile = "auto"  # "auto" (gpu when CUDA is present), "cpu" or "gpu"
seed = 0
output_dir = None  # None: outputs/07_watch_your_run at the repository root

# %%
import trl_clinic.course  # first: the lessons' offline mode, and two optional libraries' warnings kept quiet
import math
import textwrap

import torch
from transformers import TrainerCallback

from trl_clinic import checkup
# the lesson's companions: the reward model and data (lesson 03's), the log rows, the figure; you need not read them
from trl_clinic.course.lessons.lesson_03_reward_nan.companion import reward_trainer
from trl_clinic.course.lessons.lesson_07_watch.companion import (log_rows, measurements, plot_watched, reward_pairs,
                                                             same_weights)
from trl_clinic.course.parameters import start_run
from trl_clinic.course.results import check
from trl_clinic.watch import ClinicWatch

run = start_run("07", profile, seed, output_dir)
print(run.describe())
sizes = run.sizes
pairs = reward_pairs(run)  # the model's tokenizer and (prompt, chosen, rejected) pairs drawn from the seed

# %% [markdown]
# ## 1. The run, as its log shows it
#
# `RewardTrainer` on a reward model loaded in fp16, LoRA with `task_type="SEQ_CLS"` (the `score` head trains),
# `optim="adamw_torch"` and a log every 10 steps, `RewardConfig`'s default (TRL 1.16.0 `reward_config.py`):

# %% tags=["symptom"]
user_settings = dict(optim="adamw_torch", per_device_train_batch_size=sizes.batch_size, max_steps=sizes.train_steps,
                     logging_steps=10, bf16=False)
plain = reward_trainer(run, pairs, torch.float16, "plain", **user_settings)
plain_seconds = plain.train().metrics["train_runtime"]
plain_rows = log_rows(plain)
print(f"first log, step {plain_rows[0]['step']}: loss {plain_rows[0]['loss']:.4f} (ln 2 = {math.log(2):.4f}), "
      f"grad_norm {plain_rows[0]['grad_norm']}; later logs: loss {sorted({r['loss'] for r in plain_rows[1:]})}")

# %% [markdown]
# At the first log the loss is lower than ln 2, what a reward model scores when it cannot tell the answers
# apart: it looks like learning. Only the NaN grad norm says otherwise, and every later log shows 0. Nothing
# stops the run. When did it break?
#
# ## 2. The same run under the watch
#
# One line before `train()`:

# %%
watched = reward_trainer(run, pairs, torch.float16, "watched", **user_settings)
watch = ClinicWatch()
watched.add_callback(watch)
watched_seconds = watched.train().metrics["train_runtime"]
watched_rows = log_rows(watched)  # the first two below, as TensorBoard, W&B or trackio get them
print(*(textwrap.fill(", ".join(f"{k} {v:.4g}" for k, v in row.items()), 116) for row in watched_rows[:2]), sep="\n")

# %% [markdown]
# The watch spoke at the step the run broke, before the first log: which tensor went non-finite, its dtype, the
# optimizer, the likely cause, the fix and the lesson that explains it; at the first log of 0 it named the cause
# of that too. Its numbers are in the trainer's own log under `clinic/`.
#
# `clinic/raw_loss` is the mean loss the model returned since the last log: NaN where the log says a finite
# number. The trainer's `logging_nan_inf_filter` (on by default) replaces each NaN step loss by a running
# average before it is logged (transformers 5.23.0 `trainer.py`, `_run_epoch`).
#
# `stop_on` ends the run at the step of a finding, instead of after all of them:

# %%
stopped = reward_trainer(run, pairs, torch.float16, "stopped", **user_settings)
stopped.add_callback(ClinicWatch(stop_on="nonfinite", show=False))
stopped_seconds = stopped.train().metrics["train_runtime"]
print(f"stopped after step {stopped.state.global_step} of {sizes.train_steps}: "
      f"{sizes.train_steps - stopped.state.global_step} steps and {plain_seconds - stopped_seconds:.1f} s saved")

# %% [markdown]
# ## 3. What the watch read at that step
#
# After each optimizer step the watch sums every trainable tensor in float32: a NaN or an inf survives a sum,
# so a non-finite sum names the broken tensor. The stopped run's tensors, as the watch read them:

# %% tags=["mechanism"]
print("optimizer", type(stopped.optimizer.optimizer).__name__, "fused:", bool(stopped.optimizer.optimizer.defaults["fused"]))
for name, p in stopped.model.named_parameters():
    if p.requires_grad:
        print(f"{name.removeprefix('base_model.model.'):58} {str(p.dtype).removeprefix('torch.'):8} {p.numel():5} "
              f"weights, sum {p.detach().sum(dtype=torch.float32).item():.4g}")
print(f"loss the model returned, steps 1-3: {[row['raw_loss'] for row in watch.steps][:3]}")

# %% [markdown]
# One tensor is non-finite: the `score` head, the one trainable tensor left in fp16 (the LoRA matrices are
# float32). The loss of that step was finite: its update broke the head, and every loss after it is NaN. Why one
# non-fused AdamW step does that in fp16 is [lesson 03](03_lora_reward_nan.ipynb).
#
# ## 4. The fix
#
# ```diff
# - model = AutoModelForSequenceClassification.from_pretrained(name, num_labels=1, dtype=torch.float16)
# + model = AutoModelForSequenceClassification.from_pretrained(name, num_labels=1, dtype=torch.float32)
# ```
#
# The same run with only the dtype changed, under the watch:

# %% tags=["fix"]
fixed = reward_trainer(run, pairs, torch.float32, "fixed", **user_settings)
fixed_watch = ClinicWatch(stop_on="nonfinite")
fixed.add_callback(fixed_watch)
fixed_seconds = fixed.train().metrics["train_runtime"]
print(f"float32: {len(fixed_watch.findings)} findings; stop_on='nonfinite' let it run all {fixed.state.global_step} steps")

# %% [markdown]
# Does watching change the run? The float32 run again without the watch, its weights compared with the watched run's
# bit for bit, with the time each run took. (The fp16 pair cannot show it: NaN from step 2 on in both runs.)

# %%
fixed_plain = reward_trainer(run, pairs, torch.float32, "fixed-plain", **user_settings)
fixed_plain_seconds = fixed_plain.train().metrics["train_runtime"]
identical = {"float32": same_weights(fixed_plain.model, fixed.model)}
print(f"float32 run: watched and unwatched weights bit-identical: {identical['float32']}")
for name, off, on in (("fp16", plain_seconds, watched_seconds), ("float32", fixed_plain_seconds, fixed_seconds)):
    print(f"{name} run: {off:.2f} s unwatched, {on:.2f} s watched ({on / off - 1:+.0%})")

# %% [markdown]
# The weights are the same bit for bit. One pair of tiny runs varies more from run to run than the watch costs;
# [the watch's page](../docs/watch.md) measures the time spent in its own code: under 3 % of a step on the
# lessons' cpu trainers and on SmolLM2-135M.
#
# ## 5. A check you can paste
#
# A callback in plain transformers that stops at the first optimizer step leaving a trainable weight non-finite:

# %% tags=["portable-check"]
class StopAtFirstNonFinite(TrainerCallback):
    step, names = None, []

    def on_optimizer_step(self, args, state, control, model=None, **kwargs):
        if self.step is None:
            bad = {n: p.dtype for n, p in model.named_parameters()
                   if p.requires_grad and not torch.isfinite(p).all()}
            if bad:
                self.step, self.names = state.global_step + 1, list(bad)
                print(f"step {self.step}: non-finite after the optimizer step:", *(f"{n} ({d})" for n, d in bad.items()))
                control.should_training_stop = True
        return control


# %% [markdown]
# On the lesson's fp16 trainer and the float32 one; beside it, the check-up's `fp16_adamw` probe (lesson 06: one
# measurement on your trainer before it trains) predicts the same before any step. On the command line,
# `trl-clinic watch reward --config recipe.yaml` runs TRL's own script with the watch on.

# %%
pasted, probe = {}, {}
for name, dtype in (("fp16", torch.float16), ("float32", torch.float32)):
    trainer, pasted[name] = reward_trainer(run, pairs, dtype, f"pasted-{name}", **user_settings), StopAtFirstNonFinite()
    probe[name] = checkup(trainer, only=["fp16_adamw"], show=name == "fp16").by_probe("fp16_adamw")[0].status
    trainer.add_callback(pasted[name])
    trainer.train()
print(f"pasted callback stopped at step: { {name: c.step for name, c in pasted.items()} }; fp16_adamw: {probe}")

# %% [markdown]
# ## 6. Where the watch spoke, and where the log did

# %% tags=["figure"]
plot_watched(watch, fixed_watch, watched_rows, log_rows(fixed), run.output_dir);

# %% [markdown]
# ## Recap
#
# * `trainer.add_callback(ClinicWatch())` watches a run: at the first sign it says what it saw, the likely cause,
#   the fix and the lesson, and logs the numbers under `clinic/`.
# * A log every 10 steps, with the NaN filter, showed the broken run late: a plausible loss, then 0.
# * The watch reads the loss before the filter and the weights after every optimizer step.
# * `stop_on="nonfinite"` ends the run at that step; the pasted callback does the same in plain transformers.
# * The watch changes nothing the trainer computes: the weights are bit-identical.
#
# ## Exercises
#
# Worked solutions: [solutions/07_watch_your_run.ipynb](solutions/07_watch_your_run.ipynb).
#
# 1. The watch's line names a second fix: keep the fp16 weights and use `optim="adamw_torch_fused"`. Run it
#    under the watch. Any finding?
#    <details><summary>Hint</summary>Pass the starter's trainer a <code>ClinicWatch(show=False)</code>, train,
#    and read <code>watch.findings</code>.</details>
# 2. Stop on the symptom the log shows instead: `ClinicWatch(stop_on="zero_loss")` on the fp16 run. At which
#    step does it stop, and how many steps later than `stop_on="nonfinite"`?
#    <details><summary>Hint</summary>A logged loss exists only at a log: read
#    <code>trainer.state.global_step</code> after training.</details>
# 3. Turn the filter off: `logging_nan_inf_filter=False` on the fp16 run under the watch. What does the first log
#    say, and which findings does the watch make now?
#    <details><summary>Hint</summary><code>log_rows(trainer)</code> gives the logged rows; a NaN is not exactly
#    0.0.</details>

# %% tags=["exercise"]
# Exercise 1: fp16 weights, the fused AdamW; add a ClinicWatch and train
fused = reward_trainer(run, pairs, torch.float16, "fused", **{**user_settings, "optim": "adamw_torch_fused"})

# %% tags=["exercise"]
# Exercise 2: the fp16 run, stopped on zero_loss
on_zero = reward_trainer(run, pairs, torch.float16, "on-zero", **user_settings)

# %% tags=["exercise"]
# Exercise 3: the fp16 run under the watch; add logging_nan_inf_filter=False to its settings
unfiltered = reward_trainer(run, pairs, torch.float16, "unfiltered", **user_settings)

# %% [markdown]
# ## Checks
#
# The claims above, asserted on this run's numbers.

# %% jupyter={"source_hidden": true}
numbers = {
    "runs": {"fp16": measurements(plain, watched, watch, stopped, pasted["fp16"], probe["fp16"]),
             "float32": measurements(fixed_plain, fixed, fixed_watch, fixed, pasted["float32"], probe["float32"])},
    "train_steps": sizes.train_steps, "identical": identical,
    "seconds": {"plain": plain_seconds, "watched": watched_seconds, "stopped": stopped_seconds,
                "fixed": fixed_seconds, "fixed_plain": fixed_plain_seconds},
}
check(run, numbers)
