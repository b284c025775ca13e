# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 03 · LoRA reward model: loss 1e+34, grad norm NaN, then loss 0
#
# A LoRA reward model in half precision (TRL's `RewardTrainer`, batch 1 × accumulation 32) logged loss
# 1e+34 and grad norm NaN, then loss 0
# ([TRL #2367](https://github.com/huggingface/trl/issues/2367)).
#
# **You will learn**
# * to read a huge-then-zero loss as a hidden NaN;
# * why one AdamW step makes an fp16 weight inf or NaN;
# * the line to change, and a check to paste.
#
# **You should know**: `RewardTrainer` with a peft `LoraConfig`; AdamW's `m`, `v`, `eps`.
#
# **Time**: 34 s to run on the cpu [profile](../README.md#words-the-lessons-use); about 25 minutes to work through.
#
# > **Hosted** (Colab, Kaggle, no clone): upload the wheel `uv build` makes, then run `%pip install "./trl_clinic-0.1.0-py3-none-any.whl[course]"` first.

# %% tags=["parameters"]
profile = "auto"  # "auto" (gpu when CUDA is present), "cpu" or "gpu"
seed = 0
output_dir = None  # None: outputs/03_lora_reward_nan at the repository root

# %%
import math

import torch

from trl_clinic import checkup
from trl_clinic.course.lessons.lesson_03_reward_nan.companion import (first_nonfinite_step, keep_log, plot_bad_vs_fixed,
                                                      preference_data, record, reward_trainer)
from trl_clinic.course.parameters import start_run
from trl_clinic.course.results import check
from trl_clinic.probes.recording import quiet

run = start_run("03", profile, seed, output_dir)
print(run.describe())
sizes = run.sizes
pairs = preference_data(run)  # the model's tokenizer; (prompt, chosen, rejected) pairs drawn from the seed

# %% [markdown]
# ## 1. The report's run, on today's libraries
#
# `RewardTrainer` with the report's settings: weights in fp16 (the report's `torch_dtype="half"`), LoRA
# with `task_type="SEQ_CLS"` (the `score` head trains), 32 micro-batches a step, no mixed precision, and
# `optim="adamw_torch"`, the non-fused AdamW that was the default when the report was filed (today's
# default hides the bug: the deep dive shows how). The trainer's log rows, cut to the keys the report quoted:

# %% tags=["symptom"]
report_settings = dict(optim="adamw_torch", per_device_train_batch_size=sizes.batch_size,
                       gradient_accumulation_steps=32, logging_steps=25, max_steps=sizes.train_steps)
report = reward_trainer(run, pairs, torch.float16, "report", task_type="SEQ_CLS", bf16=False, **report_settings)
report_log = keep_log(report)  # prints the log rows; also keeps each step's loss as the model returned it
output = report.train()

# %% [markdown]
# The report's two lines: a loss near 1e+34 with a NaN grad norm, then exactly 0. What the model returned at
# each step:

# %%
raw = report_log.series("raw_loss")[1]
first_bad = first_nonfinite_step(raw)
print(f"raw loss at step 1: {raw[0]:.4f}; non-finite from step {first_bad} on "
      f"({sum(not math.isfinite(v) for v in raw)} of {len(raw)} steps)")
print(f"logged loss {report_log.series('loss')[1]}, logged grad norm {report_log.series('grad_norm')[1]}")

# %% [markdown]
# NaN from the second step on, and the log hides it. With `logging_nan_inf_filter=True` (the default) the
# Trainer adds, for each NaN micro-batch loss, the running sum divided by the steps since the last log
# (transformers 5.23.0, `trainer.py`, `Trainer._run_epoch`): 32 times a step, the sum grows
# ([the deep dive](deeper/03_lora_reward_nan_deeper.ipynb), section 4, works out the 1e+34). After a log the
# sum restarts at 0, and 0 stays 0.
#
# ## 2. One AdamW step on one number
#
# AdamW's first step moves a weight by `lr · (m / (1 − β₁)) / (sqrt(v) / sqrt(1 − β₂) + eps)`, where
# `m = (1 − β₁)·g` and `v = (1 − β₂)·g²` are kept in the weight's dtype. In fp32 that is about `lr` times the
# sign of `g`, for any `g` well above `eps`. In fp16 a result of 2⁻²⁵ or less rounds to 0. torch's own AdamW,
# one step on one weight:

# %% tags=["mechanism"]
lr, beta1, beta2, eps = 1e-3, 0.9, 0.999, 1e-8  # AdamW's defaults, and a fine-tuning learning rate
one_step_table = {"float32": {}, "float16": {}}
for g in (1e-2, 1e-3, 1e-7, 0.0):
    for dtype in (torch.float32, torch.float16):
        w = torch.zeros(1, dtype=dtype, device=run.device, requires_grad=True)
        w.grad = torch.full_like(w, g)
        adam = torch.optim.AdamW([w], lr=lr, betas=(beta1, beta2), eps=eps, weight_decay=0.0)
        adam.step()
        m, v = adam.state[w]["exp_avg"], adam.state[w]["exp_avg_sq"]
        denominator = v.sqrt() / math.sqrt(1 - beta2) + eps  # computed in the weight's dtype, as AdamW does
        one_step_table[str(dtype)[6:]][f"{g:g}"] = w.item()
        print(f"g={g:<6g} {str(dtype)[6:]:8} m={m.item():<10.3g} v={v.item():<10.3g} "
              f"denominator={denominator.item():<10.3g} weight after the step={w.item():.3g}")
print(f"in fp16: eps becomes {torch.tensor(eps, dtype=torch.float16).item()}, v is 0 for |g| < "
      f"{math.sqrt(2**-25 / (1 - beta2)):.1e}, m is 0 for |g| < {2**-25 / (1 - beta1):.0e}")

# %% [markdown]
# In fp16 `eps` is gone and, for a small gradient, so is `v`: the weight is divided by 0 and becomes ±inf.
# Where `m` underflows too, or `g` is 0, it is 0/0 = NaN. At the next step the reward `score · h` is inf or
# NaN, and so is the loss. One fp16 tensor is enough: peft upcasts the LoRA matrices to fp32 (peft 0.21.2,
# `tuners/tuners_utils.py`, `cast_adapter_dtype`), but the trainable copy of `score` that
# `task_type="SEQ_CLS"` adds keeps the model's dtype.
#
# ## 3. A check you can paste
#
# After one optimizer step, a non-finite trainable tensor, an fp16 one, or a frozen reward head is trouble.
# Plain torch, for any trainer:

# %% tags=["portable-check"]
def check_trainable(model: torch.nn.Module) -> list[str]:
    """Call after one optimizer step (max_steps=1): what will break a reward model's training."""
    problems = []
    for name, p in model.named_parameters():
        if p.requires_grad and not torch.isfinite(p).all():
            problems.append(f"{name}: {int(p.isinf().sum())} inf, {int(p.isnan().sum())} NaN ({p.dtype})")
        elif p.requires_grad and p.dtype == torch.float16:
            problems.append(f"{name}: trains in float16, and so does AdamW's state")
    if not any(p.requires_grad for name, p in model.named_parameters() if "score" in name):
        problems.append("the score head is frozen: it stays random and LoRA does not save it")
    return problems


# %% [markdown]
# One optimizer step of the report's trainer and of the same trainer with float32 weights; before each trains,
# the [check-up](../README.md#words-the-lessons-use)'s [probes](../README.md#words-the-lessons-use) `fp16_adamw` and `reward_head` ask the same questions (its table shows the fp16 one):

# %%
after_one_step = {}
for dtype in (torch.float16, torch.float32):
    one_step = quiet(reward_trainer(run, pairs, dtype, f"one-step-{dtype}", bf16=False, **{**report_settings,
                                                                                          "max_steps": 1}))
    probes = checkup(one_step, only=["fp16_adamw", "reward_head"], show=dtype == torch.float16)
    one_step.train()
    after_one_step[dtype] = {"check_trainable": check_trainable(one_step.model),
                             "checkup": {f.probe: f.status for f in probes.findings}}
    print(f"{dtype}, the check-up before the step: {after_one_step[dtype]['checkup']}; check_trainable after it:",
          *(after_one_step[dtype]["check_trainable"] or ["ok"]), sep="\n    ")

# %% [markdown] tags=["fix"]
# ## 4. The fix
#
# Load the weights in float32 (or bfloat16, which has fp32's exponent range) and keep `task_type="SEQ_CLS"`:
#
# ```diff
# - model = AutoModelForSequenceClassification.from_pretrained(name, num_labels=1, dtype=torch.float16)
# + model = AutoModelForSequenceClassification.from_pretrained(name, num_labels=1, dtype=torch.float32)
#   peft_config = LoraConfig(task_type="SEQ_CLS", r=8, lora_alpha=16)  # keep: without it the head is frozen
# ```
#
# When TRL loads the model from its name, the same line is `RewardConfig(model_init_kwargs={"dtype": "float32"})`.
# Mixed precision on top is fine too: `bf16=True` autocasts the matrix multiplies, while the weights and AdamW's
# state stay float32. The report's run with only the dtype changed, its log kept quiet (the figure shows it):

# %%
fixed = reward_trainer(run, pairs, torch.float32, "fixed", task_type="SEQ_CLS", bf16=False, **report_settings)
fixed_log = keep_log(fixed, printed=False)
fixed.train()
fixed_raw = fixed_log.series("raw_loss")[1]

# %%
accuracy = {"fp16 (report)": quiet(report).evaluate()["eval_accuracy"],
            "float32 (fixed)": fixed.evaluate()["eval_accuracy"]}
print(f"fixed run: every raw loss finite {all(map(math.isfinite, fixed_raw))}; held-out pair accuracy {accuracy}")
print("(the fp16 model's rewards are NaN, and NaN never ranks one answer above another: its 0 is a fact, not a test)")

# %% [markdown]
# ## 5. What the log said, what the model did

# %% tags=["figure"]
plot_bad_vs_fixed(report_log, fixed_log, accuracy, run.output_dir);

# %% [markdown]
# ## Recap
#
# * A logged loss that jumps to a huge number, then sits at exactly 0, with a NaN grad norm, is a NaN that
#   the Trainer's `logging_nan_inf_filter` rewrote: look at the loss the model returned.
# * The non-fused AdamW keeps `m` and `v` in the weight's dtype; in fp16 `eps` and small `g²` round to 0,
#   and one step makes a weight ±inf or NaN.
# * With LoRA only the trainable `score` head is fp16 (peft upcasts the adapters), and one step poisons it.
# * The fix: weights in float32 or bfloat16; keep `task_type="SEQ_CLS"` so the head trains and is saved.
# * The check: after one step no non-finite or fp16 trainable tensor and a trainable head
#   (`check_trainable`, or `checkup(trainer, only=["fp16_adamw", "reward_head"])`).
#
# ## Exercises
#
# Worked solutions: [solutions/03_lora_reward_nan.ipynb](solutions/03_lora_reward_nan.ipynb).
#
# 1. Turn the filter off: run the report's trainer for two steps with a log at each and
#    `logging_nan_inf_filter=False`. What does the log say at step 2?
#    <details><summary>Hint</summary>Add the argument to the starter's call; <code>log = keep_log(trainer)</code>
#    before <code>trainer.train()</code>, then <code>log.series("loss")</code> gives what was logged.</details>
# 2. bfloat16 weights: redo section 2's AdamW step in `torch.bfloat16` for g = 1e-3 and 1e-7. Does the weight
#    stay finite, and why?
#    <details><summary>Hint</summary>bfloat16 has fp32's 8 exponent bits: compare
#    <code>torch.tensor(1e-9, dtype=torch.bfloat16)</code> with the same in <code>torch.float16</code>.</details>
# 3. Drop `task_type="SEQ_CLS"` from the one-step fp16 run. Is anything non-finite now? What does
#    `check_trainable` say, and why is that no fix?
#    <details><summary>Hint</summary>Pass <code>task_type=None</code>; then only the LoRA matrices train,
#    in fp32, and the randomly drawn <code>score</code> head never changes.</details>

# %% tags=["exercise"]
# Exercise 1: the report's fp16 run, two steps, a log at each: add logging_nan_inf_filter=False
no_filter = reward_trainer(run, pairs, torch.float16, "no-filter", bf16=False,
                           **{**report_settings, "max_steps": 2, "logging_steps": 1})

# %% tags=["exercise"]
# Exercise 2: section 2's step on one weight, in bfloat16 (g = 1e-3 and 1e-7)
dtype = torch.bfloat16

# %% tags=["exercise"]
# Exercise 3: the one-step fp16 run without task_type="SEQ_CLS", then check_trainable(...)
no_head = reward_trainer(run, pairs, torch.float16, "no-head", task_type="SEQ_CLS", bf16=False,
                         **{**report_settings, "max_steps": 1})

# %% [markdown]
# ## Checks
#
# The claims above, asserted on this run's numbers.

# %% jupyter={"source_hidden": true}
numbers = {"runs": {"without_fix": record(report, report_log, torch.float16, one_step_table, accuracy["fp16 (report)"],
                                          after_one_step),
                    "with_fix": record(fixed, fixed_log, torch.float32, one_step_table, accuracy["float32 (fixed)"],
                                       after_one_step)}}
check(run, numbers)
