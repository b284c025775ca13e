# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 03 · Worked solutions
#
# The exercises of [the lesson](../03_lora_reward_nan.ipynb), at the lesson's own sizes; each answer ends in an
# assertion, so this notebook fails if an answer stops being true.

# %% tags=["parameters"]
profile = "auto"  # "auto" (gpu when CUDA is present), "cpu" or "gpu"
seed = 0
output_dir = None  # None: outputs/03_lora_reward_nan at the repository root

# %%
import math

import torch

from trl_clinic.course.lessons.lesson_03_reward_nan.companion import keep_log, preference_data, reward_trainer
from trl_clinic.course.parameters import start_run

run = start_run("03", profile, seed, output_dir)
sizes = run.sizes
pairs = preference_data(run)
report_settings = dict(optim="adamw_torch", per_device_train_batch_size=sizes.batch_size,
                       gradient_accumulation_steps=32, logging_steps=25, max_steps=sizes.train_steps)

# %% [markdown]
# ## Exercise 1
#
# The report's fp16 run for two steps, a log at each, with the NaN filter off.

# %%
no_filter = reward_trainer(run, pairs, torch.float16, "no-filter", bf16=False, logging_nan_inf_filter=False,
                           **{**report_settings, "max_steps": 2, "logging_steps": 1})
no_filter_log = keep_log(no_filter)
no_filter.train()
logged = no_filter_log.series("loss")[1]
print(f"logged losses: {logged}: step 1's loss, then the NaN itself instead of a huge number and 0")
assert math.isfinite(logged[0]) and math.isnan(logged[1])

# %% [markdown]
# ## Exercise 2
#
# One AdamW step on one bfloat16 weight.

# %%
bf16_step = {}
for g in (1e-3, 1e-7):
    w = torch.zeros(1, dtype=torch.bfloat16, device=run.device, requires_grad=True)
    w.grad = torch.full_like(w, g)
    adam = torch.optim.AdamW([w], lr=1e-3, weight_decay=0.0)
    adam.step()
    bf16_step[g] = (adam.state[w]["exp_avg_sq"].item(), w.item())
smallest = {dtype: torch.tensor(1e-9, dtype=dtype).item() for dtype in (torch.bfloat16, torch.float16)}
print(f"(v, weight after the step) in bfloat16: {bf16_step}; 1e-9 is {smallest[torch.bfloat16]:.3g} in bfloat16 and "
      f"{smallest[torch.float16]} in float16: bfloat16 keeps fp32's exponent range, so v, m and eps survive")
assert all(v > 0 and math.isfinite(weight) for v, weight in bf16_step.values())
assert smallest[torch.bfloat16] > 0 and smallest[torch.float16] == 0

# %% [markdown]
# ## Exercise 3
#
# The one-step fp16 run without `task_type="SEQ_CLS"`.

# %%
no_head = reward_trainer(run, pairs, torch.float16, "no-head", task_type=None, bf16=False,
                         **{**report_settings, "max_steps": 1})
no_head.train()
trainable = {name: p for name, p in no_head.model.named_parameters() if p.requires_grad}
nonfinite = [name for name, p in trainable.items() if not torch.isfinite(p).all()]
head_trains = any("score" in name for name in trainable)
print(f"non-finite trainable tensors: {nonfinite}; the score head trains: {head_trains}; trainable dtypes: "
      f"{sorted({str(p.dtype) for p in trainable.values()})}. Nothing breaks because only the LoRA matrices train, "
      "in fp32; but the head stays the random one it was drawn with, and the adapter does not save it: no fix.")
assert not nonfinite and not head_trains
assert all(p.dtype == torch.float32 for p in trainable.values())
