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
# * to add `ClinicWatch` to a trainer and read its finding: what it saw, the cause, the fix;
# * what it reads at one step, and why the trainer's log showed it late;
# * to stop a run at its first bad step, with the watch or a callback you paste.
#
# **You should know**: a transformers `TrainerCallback`; lesson 03 helps.
#
# **Time**: 23 s to run on the cpu profile; about 20 minutes to work through.
#
# > **Hosted** (Colab, Kaggle, a server without the repository): upload the wheel (`uv build` makes it) and run `%pip install "./trl_clinic-0.1.0-py3-none-any.whl[course]"` in a cell first.

# %% tags=["parameters"]
profile = "auto"  # "auto" (gpu when CUDA is present), "cpu" or "gpu"
seed = 0
output_dir = None  # None: outputs/07_watch_your_run at the repository root

# %%
import math

import torch
from transformers import TrainerCallback

from trl_clinic import checkup
from trl_clinic.course.companions.lesson_03_reward_nan import reward_trainer
from trl_clinic.course.companions.lesson_07_watch import log_rows, plot_watched, reward_pairs, same_weights
from trl_clinic.course.parameters import start_run
from trl_clinic.course.results import conclude, measured, save_metrics
from trl_clinic.watch import ClinicWatch

run = start_run("07", profile, seed, output_dir)
print(run.describe())
sizes = run.sizes
pairs = reward_pairs(run)  # the model's tokenizer and (prompt, chosen, rejected) pairs drawn from the seed

# %% [markdown]
# ## 1. The run, as its log shows it
#
# `RewardTrainer` on a reward model loaded in fp16, LoRA with `task_type="SEQ_CLS"` (the `score` head trains),
# `optim="adamw_torch"` and a log every 10 steps, `RewardConfig`'s default:

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
watched_rows = log_rows(watched)
print("the first two log rows, as TensorBoard, W&B or trackio get them:", *watched_rows[:2], sep="\n")

# %% [markdown]
# The watch spoke at the step the run broke, before the first log: which tensor went non-finite, its dtype, the
# optimizer, the likely cause, the fix and the lesson that explains it; at the first log of 0 it named the cause
# of that too. Its numbers are in the trainer's own log under `clinic/`.
#
# `clinic/raw_loss` is the mean loss the model returned since the last log: NaN where the log says a finite
# number. The trainer's `logging_nan_inf_filter` (on by default) replaces each NaN step loss by a running
# average before it is logged.
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
optimizer = stopped.optimizer.optimizer
print(f"optimizer {type(optimizer).__name__}, fused: {bool(optimizer.defaults.get('fused'))}")
weight_sums = {}
for name, p in stopped.model.named_parameters():
    if p.requires_grad:
        weight_sums[name] = (str(p.dtype).removeprefix("torch."), p.detach().sum(dtype=torch.float32).item())
        print(f"{name.removeprefix('base_model.model.'):58} {weight_sums[name][0]:8} {p.numel():5} weights, "
              f"sum {weight_sums[name][1]:.4g}")
raw = [row["raw_loss"] for row in watch.steps]
print(f"loss the model returned, steps 1-3: {raw[:3]}")

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
fixed_watch = ClinicWatch()
fixed.add_callback(fixed_watch)
fixed_seconds = fixed.train().metrics["train_runtime"]

# %% [markdown]
# No finding. Does watching change the run? The float32 run again without the watch, and both pairs' weights
# compared bit for bit, with the time each run took:

# %%
fixed_plain = reward_trainer(run, pairs, torch.float32, "fixed-plain", **user_settings)
fixed_plain_seconds = fixed_plain.train().metrics["train_runtime"]
identical = {"fp16": same_weights(plain.model, watched.model), "float32": same_weights(fixed_plain.model, fixed.model)}
for name, off, on in (("fp16", plain_seconds, watched_seconds), ("float32", fixed_plain_seconds, fixed_seconds)):
    print(f"{name} run: watched and unwatched weights bit-identical: {identical[name]}; {off:.2f} s unwatched, "
          f"{on:.2f} s watched ({on / off - 1:+.0%})")

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
    step = None

    def on_optimizer_step(self, args, state, control, model=None, **kwargs):
        if self.step is None:
            bad = {n: p.dtype for n, p in model.named_parameters()
                   if p.requires_grad and not torch.isfinite(p).all()}
            if bad:
                self.step, self.names = state.global_step + 1, list(bad)
                print(f"step {self.step}: non-finite weights after the optimizer step: {bad}")
                control.should_training_stop = True
        return control


# %% [markdown]
# On the lesson's fp16 trainer; beside it, the check-up's probe that predicts the same before any step (lesson 06).
# On the command line, `trl-clinic watch reward --config recipe.yaml` runs TRL's own script with the watch on.

# %%
pasted = reward_trainer(run, pairs, torch.float16, "pasted", **user_settings)
pasted_check = StopAtFirstNonFinite()
pasted.add_callback(pasted_check)
pasted.train()
probe = checkup(reward_trainer(run, pairs, torch.float16, "checkup", **user_settings), only=["fp16_adamw"])

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

# %% jupyter={"source_hidden": true} tags=["checks"]
def log_checks(n: dict) -> dict:
    """What the trainer's log showed, and what the watch put beside it."""
    logged = n["plain_logged"]
    return {
        "the first logged loss is finite and below ln 2, with a NaN grad norm": logged[0]["loss"] < math.log(2)
            and math.isfinite(logged[0]["loss"]) and math.isnan(logged[0]["grad_norm"]),
        "every later logged loss is exactly 0": len(logged) > 1 and all(r["loss"] == 0.0 for r in logged[1:]),
        "the NaN filter's arithmetic on the raw losses gives every logged loss (within 1e-3)":
            len(n["replayed_logs"]) == len(logged) and all(abs(p - r["loss"]) <= 1e-3 * max(abs(p), 1e-12)
                                                           for p, r in zip(n["replayed_logs"], logged)),
        "clinic/raw_loss is NaN in the first log row, where the logged loss is finite":
            math.isnan(n["watched_logged"][0]["clinic/raw_loss"]) and math.isfinite(n["watched_logged"][0]["loss"]),
        "zero_loss is found at the first log of 0 and put down to the NaN filter (lesson 03)":
            n["findings"].get("zero_loss") == next((r["step"] for r in logged if r["loss"] == 0.0), None)
            and n["zero_loss_lesson"] == "03",
    }


# %% jupyter={"source_hidden": true} tags=["checks"]
def watch_checks(n: dict) -> dict:
    """When the watch spoke and what it named, stop_on, and that watching changed nothing."""
    found, raw, first_log = n["findings"], n["raw_loss"], n["plain_logged"][0]["step"]
    first_nan = next((i + 1 for i, v in enumerate(raw) if not math.isfinite(v)), None)
    bad_sums = {name: dtype for name, (dtype, total) in n["weight_sums"].items() if not math.isfinite(total)}
    return {
        "the watch finds nonfinite at the step the pasted callback stops, before the first log":
            n["pasted_step"] is not None and found.get("nonfinite") == n["pasted_step"] < first_log,
        "the raw loss is finite up to the finding's step and NaN at every step after it": first_nan is not None
            and first_nan == found.get("nonfinite", 0) + 1 and not any(math.isfinite(v) for v in raw[first_nan - 1:]),
        "the non-finite tensors are exactly the pasted callback's, all fp16, and the watch's line names them":
            bool(bad_sums) and set(bad_sums) == set(n["pasted_names"]) and set(bad_sums.values()) == {"float16"}
            and all(name in n["nonfinite_seen"] for name in bad_sums),
        "stop_on='nonfinite' ends the run at the finding's step": n["stopped_step"] == found.get("nonfinite")
            and n["stopped_step"] < n["train_steps"],
        "the watched and unwatched fp16 runs end with bit-identical weights": n["identical"]["fp16"],
        "the check-up's fp16_adamw probe fails on the trainer before training": n["checkup_fp16_adamw"] == "fail",
    }


# %% jupyter={"source_hidden": true} tags=["checks"]
def fix_checks(n: dict) -> dict:
    """float32 weights: finite, learning, silent under the watch, and the same weights watched or not."""
    raw = n["fixed_raw_loss"]
    return {
        "the watch makes no finding on the float32 run": n["fixed_findings"] == [],
        "the float32 run's raw loss is finite at every step": bool(raw) and all(math.isfinite(v) for v in raw),
        "the float32 run learns: its last 10 steps' mean loss is below its first 10 steps'":
            len(raw) >= 20 and sum(raw[-10:]) < sum(raw[:10]),
        "the watched and unwatched float32 runs end with bit-identical weights": n["identical"]["float32"],
    }


def checks(n: dict) -> tuple[dict, dict]:
    """The symptom under the watch, then the fix; every check on today's real code path."""
    return ({name: measured(ok) for name, ok in {**log_checks(n), **watch_checks(n)}.items()},
            {name: measured(ok) for name, ok in fix_checks(n).items()})


# %% jupyter={"source_hidden": true}
from trl_clinic.probes.recording import replay_nan_filter  # the Trainer's filter, step by step

found = {f.probe: f for f in watch.findings}
numbers = {
    "plain_logged": plain_rows, "watched_logged": watched_rows, "raw_loss": raw, "train_steps": sizes.train_steps,
    "replayed_logs": replay_nan_filter(raw, 1, plain.args.logging_steps),
    "findings": {key: f.step for key, f in found.items()}, "nonfinite_seen": found["nonfinite"].measured,
    "zero_loss_lesson": found["zero_loss"].lesson, "weight_sums": weight_sums,
    "stopped_step": stopped.state.global_step, "pasted_step": pasted_check.step, "pasted_names": pasted_check.names,
    "identical": identical, "checkup_fp16_adamw": {f.probe: f.status for f in probe.findings}["fp16_adamw"],
    "fixed_findings": [f.probe for f in fixed_watch.findings],
    "fixed_raw_loss": [row["raw_loss"] for row in fixed_watch.steps],
    "seconds": {"plain": plain_seconds, "watched": watched_seconds, "stopped": stopped_seconds,
                "fixed": fixed_seconds, "fixed_plain": fixed_plain_seconds},
}
summary = (f"fp16 weights with the non-fused AdamW: the watch named the score head non-finite at step "
           f"{found['nonfinite'].step}; the log showed loss {plain_rows[0]['loss']:.3f} with grad_norm nan at step "
           f"{plain_rows[0]['step']}, then 0. stop_on saved {sizes.train_steps - stopped.state.global_step} of "
           f"{sizes.train_steps} steps; float32 weights: no finding; weights bit-identical watched or not.")
metrics = save_metrics(run, "07", numbers, checks, summary=summary)
print(summary)
conclude(metrics, run.output_dir)
