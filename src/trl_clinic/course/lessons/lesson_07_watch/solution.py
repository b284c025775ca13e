# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 07 · Worked solutions
#
# The exercises of [the lesson](../07_watch_your_run.ipynb), at the lesson's own sizes; each answer ends in an
# assertion, so this notebook fails if an answer stops being true.

# %% tags=["parameters"]
profile = "auto"  # "auto" (gpu when CUDA is present), "cpu" or "gpu"
seed = 0
output_dir = None  # None: outputs/07_watch_your_run at the repository root

# %%
import math

import torch

from trl_clinic.course.lessons.lesson_03_reward_nan.companion import reward_trainer
from trl_clinic.course.lessons.lesson_07_watch.companion import log_rows, reward_pairs
from trl_clinic.course.parameters import start_run
from trl_clinic.watch import ClinicWatch

run = start_run("07", profile, seed, output_dir)
sizes = run.sizes
pairs = reward_pairs(run)
user_settings = dict(optim="adamw_torch", per_device_train_batch_size=sizes.batch_size, max_steps=sizes.train_steps,
                     logging_steps=10, bf16=False)

# %% [markdown]
# ## Exercise 1
#
# fp16 weights with the fused AdamW, under the watch.

# %%
fused = reward_trainer(run, pairs, torch.float16, "fused", **{**user_settings, "optim": "adamw_torch_fused"})
fused_watch = ClinicWatch(show=False)
fused.add_callback(fused_watch)
fused.train()
fused_raw = [row["raw_loss"] for row in fused_watch.steps]
head = fused.model.get_base_model().score.modules_to_save.default.weight
head_state = fused.optimizer.optimizer.state[head]["exp_avg_sq"].dtype
print(f"findings: {[f.probe for f in fused_watch.findings]}; "
      f"every raw loss finite: {all(map(math.isfinite, fused_raw))}; "
      f"the score head is still {head.dtype} and its AdamW state {head_state}: the fused kernel hid the bug on this "
      "run, float32 weights remove it")
assert fused_watch.findings == [] and all(map(math.isfinite, fused_raw)) and head_state == torch.float16

# %% [markdown]
# ## Exercise 2
#
# Stop on the symptom the log shows.

# %%
on_zero = reward_trainer(run, pairs, torch.float16, "on-zero", **user_settings)
on_zero.add_callback(ClinicWatch(stop_on="zero_loss", show=False))
on_zero.train()
on_nonfinite = reward_trainer(run, pairs, torch.float16, "on-nonfinite", **user_settings)
on_nonfinite.add_callback(ClinicWatch(stop_on="nonfinite", show=False))
on_nonfinite.train()
later = on_zero.state.global_step - on_nonfinite.state.global_step
print(f"stop_on='zero_loss' stopped after step {on_zero.state.global_step}, {later} steps after stop_on='nonfinite': "
      "a logged loss exists only at a log, and the first log still shows the filter's finite average")
assert on_zero.state.global_step == 2 * user_settings["logging_steps"] and later > 0

# %% [markdown]
# ## Exercise 3
#
# The NaN filter off, under the watch.

# %%
unfiltered = reward_trainer(run, pairs, torch.float16, "unfiltered", **user_settings, logging_nan_inf_filter=False)
unfiltered_watch = ClinicWatch(show=False)
unfiltered.add_callback(unfiltered_watch)
unfiltered.train()
rows = log_rows(unfiltered)
found = {f.probe: f.step for f in unfiltered_watch.findings}
print(f"first log: loss {rows[0]['loss']} at step {rows[0]['step']}; findings {found}: the log shows the NaN itself, "
      "so no log is exactly 0 and zero_loss stays silent; nonfinite still comes at step 1")
assert all(math.isnan(row["loss"]) for row in rows) and found == {"nonfinite": 1}
