# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 03, deeper · What hides the NaN today, the log's arithmetic, and the frozen head
#
# [The core](../03_lora_reward_nan.ipynb) reproduced the report (fp16 weights, non-fused AdamW: loss 1e+34,
# grad norm NaN, then 0), showed one AdamW step turning an fp16 weight into inf or NaN, and fixed it with
# float32 weights. Here: which of today's defaults and spellings hide or bring it back, the first tensor that
# breaks and Adam's state behind it, how one tensor poisons all, the log's arithmetic replayed, what
# accumulation and mixed precision change, and a second, silent bug of the same set-up: a reward head that
# never trains.
#
# > **Hosted** (Colab, Kaggle, no clone): upload the wheel `uv build` makes, then run `%pip install "./trl_clinic-0.1.0-py3-none-any.whl[course]"` first.

# %% tags=["parameters"]
profile = "auto"  # "auto" (gpu when CUDA is present), "cpu" or "gpu"
seed = 0
output_dir = None  # None: outputs/03_lora_reward_nan_deeper at the repository root

# %%
import math
import textwrap

import torch

from trl_clinic.course.lessons.lesson_03_reward_nan.companion import (FirstGradient, accumulation_run, adam_state,
                                                      head_report, load_outcome, plot_deeper, preference_data,
                                                      reward_trainer, save_checkpoints)
from trl_clinic.course.parameters import start_run
from trl_clinic.course.results import check
from trl_clinic.probes.nonfinite import NonFiniteProbe
from trl_clinic.probes.recording import StepRecorder, quiet

run = start_run("03-deeper", profile, seed, output_dir)
print(run.describe())
sizes = run.sizes
pairs = preference_data(run)
report_settings = dict(optim="adamw_torch", per_device_train_batch_size=sizes.batch_size,
                       gradient_accumulation_steps=32, logging_steps=sizes.train_steps, max_steps=sizes.train_steps)
DTYPES = {"fp16": torch.float16, "float32": torch.float32}  # the report's weights, and the fix's
runs = {name: {} for name in DTYPES}  # every section measures both

# %% [markdown]
# Each section runs the report's settings twice, with fp16 weights (the report's) and with float32 weights (the
# fix), and measures the same things on both.
#
# ## 1. What hides it today: the fused AdamW default
#
# The same model, the optimizer left to `RewardConfig`'s default:

# %%
for name, dtype in DTYPES.items():
    fused = reward_trainer(run, pairs, dtype, f"fused-{name}", bf16=False, max_steps=sizes.fused_steps,
                           per_device_train_batch_size=sizes.batch_size, gradient_accumulation_steps=32)
    fused_log = StepRecorder().watch(fused)
    fused.train()
    runs[name]["fused_raw_loss"] = fused_log.series("raw_loss")[1]
    print(f"{name} weights: raw loss of the {sizes.fused_steps} steps {[f'{v:.4f}' for v in runs[name]['fused_raw_loss']]}")
default_optim = fused.args.optim.value
inner = fused.optimizer.optimizer  # the torch optimizer inside accelerate's wrapper
print(f"default optim {default_optim!r}: {type(inner).__name__}(fused={inner.defaults['fused']})")

# %% [markdown]
# The fused AdamW is **transformers'** choice, not torch's: transformers 5.23.0's `training_args.py` sets
# `default_optim = "adamw_torch_fused"` when `is_torch_greater_or_equal_than_2_8`, else `"adamw_torch"`. The
# rule arrived in transformers 4.54.0 (the same lines in 4.54.1 and 4.55.4); 4.53.3, 4.51.3 and the report's
# 4.46.2 default to `"adamw_torch"` whatever the torch, the fused line commented out (read in each release's
# `training_args.py`). One step of each kernel on one weight of each dtype, as in the core:

# %%
for name, dtype in DTYPES.items():
    runs[name]["one_step"] = {"fused": {}, "non_fused": {}}
    for kernel, fused_kernel in (("non_fused", False), ("fused", True)):
        for g in (1e-3, 1e-7, 0.0):
            w = torch.zeros(1, dtype=dtype, device=run.device, requires_grad=True)
            w.grad = torch.full_like(w, g)
            torch.optim.AdamW([w], lr=1e-3, weight_decay=0.0, fused=fused_kernel).step()
            runs[name]["one_step"][kernel][f"{g:g}"] = w.item()
        print(f"{name} weight, {kernel.replace('_', '-')} AdamW step: "
              + ", ".join(f"g={g} -> {v:.3g}" for g, v in runs[name]["one_step"][kernel].items()))

# %% [markdown]
# The fused kernel keeps fp16 weights finite here (and the fp16 run above for its steps), but the weights and
# AdamW's state are still fp16: float32 weights are the fix, not the default that happens to hide the bug.
#
# ## 2. Asking for a dtype: what each spelling gives today
#
# The report asked through the model-loading arguments. When TRL loads the model from a path it uses
# `RewardConfig(model_init_kwargs=...)`: the lesson's model saved once in fp32 and once in fp16, loaded with
# the old and new spellings:

# %%
checkpoints = save_checkpoints(run, pairs, (torch.float32, torch.float16))
spellings = {}
for init_kwargs, stored in (({"dtype": "half"}, torch.float32), ({"torch_dtype": "float16"}, torch.float32),
                            ({"dtype": "float16"}, torch.float32), ({"dtype": "float32"}, torch.float16),
                            ({"dtype": "auto"}, torch.float16), ({"dtype": "auto"}, torch.float32)):
    key = f"{init_kwargs} on {checkpoints[stored].name}"
    spellings[key] = load_outcome(run, checkpoints[stored], pairs, init_kwargs)
    print(textwrap.fill(f"model_init_kwargs={key}: {spellings[key]}", width=116, subsequent_indent="    "))
runs["fp16"]["spellings"] = {"by_name": spellings["{'dtype': 'float16'} on checkpoint-float32"],
                             "auto": spellings["{'dtype': 'auto'} on checkpoint-float16"]}
runs["float32"]["spellings"] = {"by_name": spellings["{'dtype': 'float32'} on checkpoint-float16"],
                                "auto": spellings["{'dtype': 'auto'} on checkpoint-float32"]}

# %% [markdown]
# * **`"half"` is rejected** by TRL 1.16.0's `create_model_from_path` (`trl/trainer/utils.py`): it takes a
#   `torch.dtype`, `"auto"`, `"bfloat16"`, `"float16"` or `"float32"`.
# * **The legacy key `torch_dtype` is ignored**: the same function sets `dtype=float32` when
#   `model_init_kwargs` has no `dtype`, and transformers 5.23.0's `PreTrainedModel.from_pretrained`
#   (`modeling_utils.py`) uses `torch_dtype` only when `dtype` is None. That default arrived in TRL 0.27.0;
#   TRL 0.26.2's `create_model_from_path` defaults to `"auto"` and leaves `torch_dtype` alone.
# * **`"auto"` keeps the checkpoint's dtype**: on a checkpoint stored in fp16 it gives fp16 trainable weights,
#   the report's situation without anyone asking for half precision; a dtype named outright wins over the
#   checkpoint's.
#
# ## 3. The first non-finite tensor, and AdamW's state behind it
#
# `NonFiniteProbe` (`trl_clinic.probes.nonfinite`) checks every trainable tensor's gradient before each
# optimizer step and its value after it, and stops training at the first NaN or inf; `FirstGradient` keeps the
# head's gradient of step 1 as AdamW receives it. Two steps of the report's settings in each dtype:

# %%
for name, dtype in DTYPES.items():
    probe_trainer = quiet(reward_trainer(run, pairs, dtype, f"probe-{name}", bf16=False,
                                         **{**report_settings, "max_steps": 2, "logging_strategy": "no"}))
    probe, first_gradient = NonFiniteProbe(), FirstGradient()
    probe_trainer.add_callback(first_gradient)
    probe_trainer.add_callback(probe)
    probe_trainer.train()
    finding = probe.finding
    runs[name]["probe"] = {"where": finding.where if finding else None, "step": finding.step if finding else None,
                           "tensors": finding.names if finding else [], "steps_run": probe_trainer.state.global_step}
    score = next(p for n, p in probe_trainer.model.named_parameters() if "score" in n and p.requires_grad)
    runs[name]["adam"] = adam_state(probe_trainer.optimizer, score, first_gradient.gradient)
    print(f"{name}: " + (f"first non-finite {finding.where} after optimizer step {finding.step}: "
                         f"{', '.join(finding.names)}" if finding else "no non-finite tensor")
          + f"; {probe_trainer.state.global_step} of 2 steps ran")

# %%
for name, adam in ((name, runs[name]["adam"]) for name in DTYPES):
    print(f"{name}: {adam['below_v_threshold']} of the head's {adam['weights']} weights had |g| below the v threshold "
          f"{adam['v_threshold']:.2e} (the nearest {adam['nearest_gradient_to_threshold']:.1%} from it; m threshold "
          f"{adam['m_threshold']:.1e})\n    AdamW's state in {adam['state_dtype']}: v = 0 for {adam['v_underflowed']}, "
          f"m = 0 for {adam['m_underflowed']}, {adam['mismatches']} disagree with the threshold; the weights now hold "
          f"{adam['inf_weights']} inf and {adam['nan_weights']} NaN")

# %% [markdown]
# torch 2.13's AdamW (`torch/optim/adam.py`: `_single_tensor_adam` on the CPU, `_multi_tensor_adam` on CUDA, as
# `_default_to_fused_or_foreach` in `torch/optim/optimizer.py` picks)
# keeps `exp_avg` and `exp_avg_sq` in the parameter's dtype (`zeros_like(p)` in `_init_group`) and divides by
# `sqrt(exp_avg_sq) / sqrt(1 − β₂) + eps`. In fp16 `eps` rounds to 0 and `(1 − β₂)·g²` to 0 below the v
# threshold printed above: the weight is divided by 0 and becomes ±inf, or 0/0 = NaN where `m = (1 − β₁)·g`
# underflowed too (below the m threshold, or `g = 0`). In float32 the same gradients keep their state.
#
# ## 4. The log's arithmetic, and what accumulation changes
#
# The report blamed accumulation for amplifying fp16 problems. The same run with accumulation 1, 8 and
# 32, one log at the last step, and the Trainer's NaN filter replayed on the raw losses (`replay_nan_filter`,
# `trl_clinic.probes.recording`):

# %%
sweep_trainers = {}
for name, dtype in DTYPES.items():
    runs[name]["sweep"] = {}
    for accumulation in sizes.accumulation_sweep:
        trainer = reward_trainer(run, pairs, dtype, f"accumulation-{name}-{accumulation}", bf16=False,
                                 **{**report_settings, "gradient_accumulation_steps": accumulation})
        row = runs[name]["sweep"][accumulation] = accumulation_run(trainer)
        sweep_trainers[name, accumulation] = trainer
        broke = row["first_nonfinite_step"]
        print(f"{name}, accumulation {accumulation:>2}: raw loss " + (f"non-finite from step {broke}" if broke else
              "finite at every step") + f"; logged {row['logged'][0]:.4g}, replayed {row['replayed'][0]:.4g}, "
              f"grad norm {row['logged_grad_norm'][0]:.3g}")

# %% [markdown]
# With `logging_nan_inf_filter=True` (the default), transformers 5.23.0's `Trainer._run_epoch` (`trainer.py`)
# adds, for a NaN or inf micro-batch loss, `tr_loss / (1 + global_step − last_logged_step)` instead; the
# report's transformers 4.46.2 has the same lines in `Trainer._inner_training_loop`. During step *s*
# (global_step *s* − 1) that multiplies the running sum by 1 + 1/*s*, once per micro-batch. If only step 1
# was finite, the log at step 25 is step 1's loss times (26/2)^accumulation / 25: 13/25 of it at
# accumulation 1 (a plausible loss), 13³²/25 ≈ 1e34 times at 32. After the log the sum restarts at 0, and
# `0 · (1 + 1/s)` stays 0. Every accumulation count breaks at the same step: accumulation does not cause
# the NaN, fp16 AdamW does; it only changes the number in the log. In float32 the log is the mean loss at
# every accumulation count.
#
# ## 5. How one tensor poisons all of them: gradient clipping
#
# At the next forward the reward `score · h` is inf or NaN, so is the loss, and so is every gradient that
# flows back. Gradient clipping (`max_grad_norm`) then multiplies *every* gradient by
# `max_norm / (total_norm + 1e-6)`, clamped at 1 (torch 2.13, `torch/nn/utils/clip_grad.py`): a NaN total
# norm makes that factor NaN, even for a tensor whose own gradient is finite:

# %%
bad, good = torch.zeros(2, requires_grad=True), torch.zeros(2, requires_grad=True)
bad.grad, good.grad = torch.tensor([math.nan, 1.0]), torch.tensor([1.0, 1.0])
total = torch.nn.utils.clip_grad_norm_([bad, good], max_norm=1.0)
print(f"clip_grad_norm_ with one NaN gradient: total norm {total.item()}, the finite gradient becomes {good.grad.tolist()}")
for name in DTYPES:
    trainable = {n: p for n, p in sweep_trainers[name, 32].model.named_parameters() if p.requires_grad}
    runs[name]["poisoned"] = {"tensors": len(trainable),
                              "non_finite": sum(not torch.isfinite(p).all() for p in trainable.values())}
    print(f"after the {name} accumulation-32 run: {runs[name]['poisoned']['non_finite']} of {len(trainable)} "
          "trainable tensors non-finite")

# %% [markdown]
# ## 6. Mixed precision does not rescue fp16 weights
#
# The report's run with `fp16=True` added, then torch's gradient scaler given the gradients of a weight, in each
# dtype:

# %%
for name, dtype in DTYPES.items():
    amp_trainer = reward_trainer(run, pairs, dtype, f"amp-{name}", bf16=False, fp16=True,
                                 **{**report_settings, "max_steps": 4})
    amp = StepRecorder().watch(amp_trainer)
    try:
        amp_trainer.train()
        outcome = "trained"
    except (ValueError, RuntimeError) as error:
        outcome = f"{type(error).__name__}: {error}"
    scaler = torch.amp.GradScaler(run.device.type)
    weight = torch.nn.Parameter(torch.ones(4, dtype=dtype, device=run.device))
    scaler.scale(weight.float().sum()).backward()
    try:
        scaler.unscale_(torch.optim.AdamW([weight]))
        scaled = "unscaled"
    except ValueError as error:
        scaled = f"ValueError: {error}"
    runs[name]["amp"] = {"outcome": outcome, "raw_loss": amp.series("raw_loss")[1], "grad_scaler": scaled}
    print(f"{name} weights, fp16=True on {run.device.type}: gradient scaler "
          f"{type(amp_trainer.accelerator.scaler).__name__}; {outcome}; raw loss per step "
          f"{[f'{v:.4g}' for v in runs[name]['amp']['raw_loss']]}\n    torch.amp.GradScaler.unscale_ on its "
          f"gradients: {scaled}")

# %% [markdown]
# accelerate 1.15.0 makes a gradient scaler for fp16 only off the CPU (`accelerator.py`, `Accelerator.__init__`:
# its fp16 branch requires `device.type != "cpu"`), so on the cpu profile `fp16=True` changes nothing and the
# fp16 run goes non-finite as before. On CUDA it makes one, and the Trainer's clipping has it unscale the gradients
# first (`Accelerator.clip_grad_norm_` calls `unscale_gradients`), where torch 2.13 refuses fp16 gradients
# (`torch/amp/grad_scaler.py`, `GradScaler._unscale_grads_`, called by `unscale_` with `allow_fp16=False`).
# Over float32 weights mixed precision trains.
#
# ## 7. The second, silent bug: a reward head that never trains
#
# Without `task_type="SEQ_CLS"` (or `modules_to_save=["score"]`), LoRA adapts only its target modules and
# leaves the randomly drawn `score` head frozen. In fp32 weights, with the report's other settings, against
# the fixed run:

# %%
heads, head_runs = {}, {}
for label, task_type in (("without SEQ_CLS", None), ("with SEQ_CLS", "SEQ_CLS")):
    head_runs[label] = quiet(reward_trainer(run, pairs, torch.float32, f"head-{task_type}", task_type=task_type,
                                            **{**report_settings, "max_steps": sizes.head_steps}))
    head_log = StepRecorder().watch(head_runs[label])
    head_runs[label].train()
    heads[label] = {**head_report(run, head_runs[label], f"head-{task_type}", pairs),
                    "raw_loss": head_log.series("raw_loss")[1]}
    print(f"{label}: head trainable {heads[label]['head_trainable']}, saved in the adapter {heads[label]['score_saved']}, "
          f"largest reward change after a reload {heads[label]['reload_max_reward_change']:.2e}")
print("LoRA target modules:", sorted(head_runs["without SEQ_CLS"].model.peft_config["default"].target_modules))
runs["fp16"]["head"], runs["float32"]["head"] = heads["without SEQ_CLS"], heads["with SEQ_CLS"]

# %% [markdown]
# Training is stable, so nothing looks wrong, but the head is not among the trainable parameters, not in the
# saved adapter, and the "same" reward model gives other rewards once reloaded on a base whose head was drawn
# under another seed, as `from_pretrained` draws one for a checkpoint without `score` weights (transformers
# 5.23.0, `modeling_utils.py`, `_initialize_missing_keys`). Reloading under the *same* seed draws the same
# random head and hides it. peft 0.21.2 adds `score` to `modules_to_save` for SEQ_CLS (`peft_model.py`,
# `PeftModelForSequenceClassification.__init__`). Held-out pair accuracy of the three set-ups:

# %%
accuracy = {"fp16 weights (report)": quiet(sweep_trainers["fp16", 32]).evaluate()["eval_accuracy"],
            "no SEQ_CLS (frozen head)": head_runs["without SEQ_CLS"].evaluate()["eval_accuracy"],
            "float32 + SEQ_CLS (fixed)": head_runs["with SEQ_CLS"].evaluate()["eval_accuracy"]}
print({name: f"{value:.1%}" for name, value in accuracy.items()})
print(textwrap.fill("NaN rewards rank no pair right, so the fp16 run's 0 is a fact; a frozen random head over a trained "
                    "body can still rank pairs, and its gap to the fixed run changes sign from seed to seed: shown, not "
                    "checked (the reload above is the frozen head's damage)", width=116))
plot_deeper({k: runs["fp16"]["sweep"][k] for k in sizes.accumulation_sweep}, accuracy, run.output_dir);

# %% [markdown]
# ## Checks
#
# The claims above, asserted on this run's numbers.

# %% jupyter={"source_hidden": true}
numbers = {"default_optim": default_optim, "spellings": spellings, "eval_accuracy": accuracy,
           "runs": {"without_fix": runs["fp16"], "with_fix": runs["float32"]}}
check(run, numbers)
