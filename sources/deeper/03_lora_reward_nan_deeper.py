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
# > **Hosted** (Colab, Kaggle, a server without the repository): upload the wheel (`uv build` makes it) and run `%pip install "./trl_clinic-0.1.0-py3-none-any.whl[course]"` in a cell first.

# %% tags=["parameters"]
profile = "auto"  # "auto" (gpu when CUDA is present), "cpu" or "gpu"
seed = 0
output_dir = None  # None: outputs/03_lora_reward_nan_deeper at the repository root

# %%
import math

import torch

from trl_clinic.course.companions.lesson_03_reward_nan import (accumulation_run, adam_state, head_report, load_outcome,
                                                      plot_deeper, preference_data, reward_trainer, save_checkpoints)
from trl_clinic.course.parameters import start_run
from trl_clinic.course.results import conclude, measured, save_metrics
from trl_clinic.probes.nonfinite import NonFiniteProbe
from trl_clinic.probes.recording import StepRecorder, quiet

run = start_run("03-deeper", profile, seed, output_dir)
print(run.describe())
sizes = run.sizes
pairs = preference_data(run)
report_settings = dict(optim="adamw_torch", per_device_train_batch_size=sizes.batch_size,
                       gradient_accumulation_steps=32, logging_steps=sizes.train_steps, max_steps=sizes.train_steps)

# %% [markdown]
# ## 1. What hides it today: the fused AdamW default
#
# The same fp16 model, the optimizer left to `RewardConfig`'s default:

# %%
fused = reward_trainer(run, pairs, torch.float16, "fused", bf16=False, max_steps=sizes.fused_steps,
                       per_device_train_batch_size=sizes.batch_size, gradient_accumulation_steps=32)
fused_log = StepRecorder().watch(fused)
fused.train()
fused_raw = fused_log.series("raw_loss")[1]
default_optim = fused.args.optim.value
inner = fused.optimizer.optimizer  # the torch optimizer inside accelerate's wrapper
print(f"default optim {default_optim!r}: {type(inner).__name__}(fused={inner.defaults['fused']}); "
      f"raw loss of the {len(fused_raw)} steps: {[f'{v:.4f}' for v in fused_raw]}")

# %% [markdown]
# The fused AdamW is **transformers'** choice, not torch's: transformers 5.23.0's `training_args.py` sets
# `default_optim = "adamw_torch_fused"` when `is_torch_greater_or_equal_than_2_8`, else `"adamw_torch"`. The
# rule arrived in transformers 4.54.0 (the same lines in 4.54.1 and 4.55.4); 4.53.3, 4.51.3 and the report's
# 4.46.2 default to `"adamw_torch"` whatever the torch, the fused line commented out (read in each release's
# `training_args.py`). One step of each on one fp16 weight, as in the core:

# %%
one_fp16_step = {}
for fused_kernel in (False, True):
    for g in (1e-3, 1e-7, 0.0):
        w = torch.zeros(1, dtype=torch.float16, device=run.device, requires_grad=True)
        w.grad = torch.full_like(w, g)
        torch.optim.AdamW([w], lr=1e-3, weight_decay=0.0, fused=fused_kernel).step()
        one_fp16_step[f"fused={fused_kernel} g={g:g}"] = w.item()
print(one_fp16_step)

# %% [markdown]
# The fused kernel keeps fp16 weights finite here (and the run above for its steps), but the weights and
# AdamW's state are still fp16: float32 weights are the fix, not the default that happens to hide the bug.
#
# ## 2. Asking for fp16: what each spelling gives today
#
# The report asked through the model-loading arguments. When TRL loads the model from a path it uses
# `RewardConfig(model_init_kwargs=...)`: the lesson's model saved once in fp32 and once in fp16, loaded with
# the old and new spellings:

# %%
checkpoints = save_checkpoints(run, pairs, (torch.float32, torch.float16))
spellings = {}
for init_kwargs, stored in (({"dtype": "half"}, torch.float32), ({"torch_dtype": "float16"}, torch.float32),
                            ({"dtype": "float16"}, torch.float32), ({"dtype": "auto"}, torch.float16)):
    spellings[str(init_kwargs)] = load_outcome(run, checkpoints[stored], pairs, init_kwargs)
    print(f"model_init_kwargs={init_kwargs} on {checkpoints[stored].name}: {spellings[str(init_kwargs)]}")

# %% [markdown]
# * **`"half"` is rejected** by TRL 1.16.0's `create_model_from_path` (`trl/trainer/utils.py`): it takes a
#   `torch.dtype`, `"auto"`, `"bfloat16"`, `"float16"` or `"float32"`.
# * **The legacy key `torch_dtype` is ignored**: the same function sets `dtype=float32` when
#   `model_init_kwargs` has no `dtype`, and transformers 5.23.0's `PreTrainedModel.from_pretrained`
#   (`modeling_utils.py`) uses `torch_dtype` only when `dtype` is None. That default arrived in TRL 0.27.0;
#   TRL 0.26.2's `create_model_from_path` defaults to `"auto"` and leaves `torch_dtype` alone.
# * **`"auto"` keeps the checkpoint's dtype**: on a checkpoint stored in fp16 it gives fp16 trainable weights,
#   the report's situation without anyone asking for half precision.
#
# ## 3. The first non-finite tensor, and AdamW's state behind it
#
# `NonFiniteProbe` (`trl_clinic.probes.nonfinite`) checks every trainable tensor's gradient before each
# optimizer step and its value after it, and stops training at the first NaN or inf:

# %%
probe_trainer = quiet(reward_trainer(run, pairs, torch.float16, "probe", bf16=False,
                                     **{**report_settings, "logging_strategy": "no"}))
probe = NonFiniteProbe()
probe_trainer.add_callback(probe)
probe_trainer.train()
finding = probe.finding
print(f"first non-finite {finding.where} after optimizer step {finding.step}: {', '.join(finding.names)}"
      if finding else f"no non-finite tensor in {sizes.train_steps} steps")
dtypes = {name: str(p.dtype) for name, p in probe_trainer.model.named_parameters() if p.requires_grad}
print("trainable tensors and their dtypes:", dtypes)

# %%
score = next(p for n, p in probe_trainer.model.named_parameters() if "score" in n and p.requires_grad)
adam = adam_state(probe_trainer.optimizer, score)
print(f"AdamW's state in {adam['state_dtype']}: v = 0 for {adam['v_underflowed']} of {adam['weights']} weights, "
      f"m = 0 for {adam['m_underflowed']}; the weights now hold {adam['inf_weights']} inf and {adam['nan_weights']} NaN")
print(f"inf exactly where only v underflowed: {adam['inf_where_only_v_underflowed']}; NaN exactly where m "
      f"underflowed too: {adam['nan_where_m_underflowed_too']}")
print(f"|g| where v underflowed: at most {adam['largest_underflowed_gradient']}; elsewhere at least "
      f"{adam['smallest_kept_gradient']:.2e}; predicted thresholds: v {adam['v_threshold']:.2e}, m {adam['m_threshold']:.1e}")

# %% [markdown]
# torch 2.13's AdamW (`torch/optim/adam.py`: `_single_tensor_adam` on the CPU, `_multi_tensor_adam` on CUDA, as
# `_default_to_fused_or_foreach` in `torch/optim/optimizer.py` picks)
# keeps `exp_avg` and `exp_avg_sq` in the parameter's dtype (`zeros_like(p)` in `_init_group`) and divides by
# `sqrt(exp_avg_sq) / sqrt(1 − β₂) + eps`. In fp16 `eps` rounds to 0 and `(1 − β₂)·g²` to 0 below the v
# threshold printed above: the weight is divided by 0 and becomes ±inf, or 0/0 = NaN where `m = (1 − β₁)·g`
# underflowed too (below the m threshold, or `g = 0`). Either way it is non-finite after one step.
#
# ## 4. The log's arithmetic, and what accumulation changes
#
# The report blamed accumulation for amplifying fp16 problems. The same fp16 run with accumulation 1, 8 and
# 32, one log at the last step, and the Trainer's NaN filter replayed on the raw losses (`replay_nan_filter`,
# `trl_clinic.probes.recording`):

# %%
sweep, sweep_trainers = {}, {}
for accumulation in sizes.accumulation_sweep:
    sweep_trainers[accumulation] = reward_trainer(run, pairs, torch.float16, f"accumulation-{accumulation}", bf16=False,
                                                  **{**report_settings, "gradient_accumulation_steps": accumulation})
    sweep[accumulation] = accumulation_run(sweep_trainers[accumulation])
    print(f"accumulation {accumulation:>2}: raw loss non-finite from step {sweep[accumulation]['first_nonfinite_step']}; "
          f"logged {sweep[accumulation]['logged'][0]:.4g}, replayed {sweep[accumulation]['replayed'][0]:.4g}, "
          f"grad norm {sweep[accumulation]['logged_grad_norm'][0]}")

# %% [markdown]
# With `logging_nan_inf_filter=True` (the default), transformers 5.23.0's `Trainer._run_epoch` (`trainer.py`)
# adds, for a NaN or inf micro-batch loss, `tr_loss / (1 + global_step − last_logged_step)` instead; the
# report's transformers 4.46.2 has the same lines in `Trainer._inner_training_loop`. During step *s*
# (global_step *s* − 1) that multiplies the running sum by 1 + 1/*s*, once per micro-batch. If only step 1
# was finite, the log at step 25 is step 1's loss times (26/2)^accumulation / 25: 13/25 of it at
# accumulation 1 (a plausible loss), 13³²/25 ≈ 1e34 times at 32. After the log the sum restarts at 0, and
# `0 · (1 + 1/s)` stays 0. Every accumulation count breaks at the same step: accumulation does not cause
# the NaN, fp16 AdamW does; it only changes the number in the log.
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
clip_spreads_nan = bool(torch.isnan(good.grad).all())
print(f"clip_grad_norm_ with one NaN gradient: total norm {total.item()}, the finite gradient becomes {good.grad.tolist()}")
poisoned_run = sweep_trainers[32]
trainable = {n: p for n, p in poisoned_run.model.named_parameters() if p.requires_grad}
poisoned = [n for n, p in trainable.items() if not torch.isfinite(p).all()]
print(f"after the accumulation-32 run: {len(poisoned)} of {len(trainable)} trainable tensors non-finite")

# %% [markdown]
# ## 6. Mixed precision does not rescue fp16 weights
#
# The report's run with `fp16=True` added, then torch's gradient scaler given the gradients of an fp16 weight:

# %%
amp_trainer = reward_trainer(run, pairs, torch.float16, "amp", bf16=False, fp16=True, **{**report_settings, "max_steps": 4})
amp = StepRecorder().watch(amp_trainer)
try:
    amp_trainer.train()
    amp_outcome = "trained"
except (ValueError, RuntimeError) as error:
    amp_outcome = f"{type(error).__name__}: {error}"
amp_raw = amp.series("raw_loss")[1]
print(f"fp16=True on {run.device.type}: gradient scaler {type(amp_trainer.accelerator.scaler).__name__}; "
      f"{amp_outcome}; raw loss per step {[f'{v:.4g}' for v in amp_raw]}")
scaler = torch.amp.GradScaler(run.device.type)
weight = torch.nn.Parameter(torch.ones(4, dtype=torch.float16, device=run.device))
scaler.scale(weight.float().sum()).backward()
try:
    scaler.unscale_(torch.optim.AdamW([weight]))
    scaler_outcome = "unscaled"
except ValueError as error:
    scaler_outcome = f"ValueError: {error}"
print(f"torch.amp.GradScaler({run.device.type!r}).unscale_ on {weight.grad.dtype} gradients: {scaler_outcome}")

# %% [markdown]
# accelerate 1.15.0 makes a gradient scaler for fp16 only off the CPU (`accelerator.py`, `Accelerator.__init__`:
# its fp16 branch requires `device.type != "cpu"`), so on the cpu profile `fp16=True` changes nothing and the
# run goes non-finite as before. On CUDA it makes one, and the Trainer's clipping has it unscale the gradients
# first (`Accelerator.clip_grad_norm_` calls `unscale_gradients`), where torch 2.13 refuses fp16 gradients
# (`torch/amp/grad_scaler.py`, `GradScaler._unscale_grads_`, called by `unscale_` with `allow_fp16=False`).
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

# %% [markdown]
# Training is stable, so nothing looks wrong, but the head is not among the trainable parameters, not in the
# saved adapter, and the "same" reward model gives other rewards once reloaded on a base whose head was drawn
# under another seed, as `from_pretrained` draws one for a checkpoint without `score` weights (transformers
# 5.23.0, `modeling_utils.py`, `_initialize_missing_keys`). Reloading under the *same* seed draws the same
# random head and hides it. peft 0.21.2 adds `score` to `modules_to_save` for SEQ_CLS (`peft_model.py`,
# `PeftModelForSequenceClassification.__init__`). Held-out pair accuracy of the three set-ups:

# %%
accuracy = {"fp16 weights (report)": sweep_trainers[32].evaluate()["eval_accuracy"],
            "no SEQ_CLS (frozen head)": head_runs["without SEQ_CLS"].evaluate()["eval_accuracy"],
            "float32 + SEQ_CLS (fixed)": head_runs["with SEQ_CLS"].evaluate()["eval_accuracy"]}
print({name: f"{value:.1%}" for name, value in accuracy.items()},
      "(a frozen random head over a trained body can still rank pairs; its gap to the fixed run changes sign "
      "from seed to seed, so it is shown, not checked: the reload above is the frozen head's damage)")
plot_deeper(sweep, accuracy, run.output_dir);

# %% [markdown]
# ## Checks
#
# The claims above, asserted on this run's numbers.

# %% jupyter={"source_hidden": true} tags=["checks"]
def today_checks(n: dict) -> dict:
    """What today's stack does with the report's settings: the optimizer default and the dtype spellings."""
    spellings, step = n["legacy_spellings"], n["one_fp16_step"]
    return {
        "transformers' default optimizer is the fused AdamW": n["default_optim"] == "adamw_torch_fused",
        "one fused AdamW step keeps an fp16 weight finite where the non-fused one does not":
            all(math.isfinite(step[f"fused=True g={g}"]) for g in ("0.001", "1e-07", "0"))
            and not any(math.isfinite(step[f"fused=False g={g}"]) for g in ("0.001", "1e-07", "0")),
        "legacy torch_dtype is ignored (the weights stay fp32)": "float32" in spellings["{'torch_dtype': 'float16'}"],
        "'half' is rejected": spellings["{'dtype': 'half'}"].startswith("ValueError"),
        "dtype='float16' gives fp16 weights": "float16" in spellings["{'dtype': 'float16'}"],
        "dtype='auto' on an fp16 checkpoint gives fp16 weights": "float16" in spellings["{'dtype': 'auto'}"],
    }


# %% jupyter={"source_hidden": true} tags=["checks"]
def mechanism_checks(n: dict) -> dict:
    """The first bad tensor, AdamW's fp16 state, the spread through clipping."""
    adam = n["adam_state"]
    return {
        "the first bad tensor is the fp16 score head, made so by the update":
            n["first_nonfinite_where"] == "weight" and bool(n["first_nonfinite_tensor"])
            and all("score" in name for name in n["first_nonfinite_tensor"]),
        "the inf weights are exactly those whose v underflowed and m did not": adam["inf_where_only_v_underflowed"],
        "the NaN weights are exactly those whose m underflowed too": adam["nan_where_m_underflowed_too"],
        "some of the head's weights went non-finite": adam["inf_weights"] + adam["nan_weights"] > 0,
        "the v threshold separates the underflowed weights from the others":
            (adam["largest_underflowed_gradient"] is None or adam["largest_underflowed_gradient"] <= adam["v_threshold"] * 1.01)
            and adam["smallest_kept_gradient"] >= adam["v_threshold"] * 0.99,
        "gradient clipping turns a finite gradient NaN when one gradient is NaN": n["clip_spreads_nan"],
        "the NaN spread to every trainable tensor": n["poisoned_tensors"] == n["trainable_tensors"],
    }


# %% jupyter={"source_hidden": true} tags=["checks"]
def log_checks(n: dict) -> dict:
    """The NaN filter's arithmetic, accumulation, mixed precision and the frozen head."""
    sweep = n["fp16_by_accumulation"]
    counts = sorted(sweep, key=int)
    frozen = n["heads"]["without SEQ_CLS"]
    return {
        "the NaN filter's replay gives every logged number (within 1e-2)": all(
            len(row["replayed"]) == len(row["logged"]) and all(abs(p - g) <= 1e-2 * abs(p) for p, g in
                                                              zip(row["replayed"], row["logged"])) for row in sweep.values()),
        "fp16 breaks at every accumulation count: accumulation does not cause the NaN":
            all(row["first_nonfinite_step"] is not None for row in sweep.values()),
        "more accumulation inflates the first logged loss (the NaN filter works per micro-batch)":
            all(sweep[a]["logged"][0] < sweep[b]["logged"][0] for a, b in zip(counts, counts[1:])),
        "at accumulation 32 the log is a huge finite number (> 1e30)": 1e30 < sweep["32"]["logged"][0] < math.inf,
        "torch's gradient scaler refuses to unscale fp16 gradients":
            n["grad_scaler"] == "ValueError: Attempting to unscale FP16 gradients.",
        "fp16=True does not rescue fp16 weights (an error or a non-finite loss)": n["fp16_amp"] != "trained"
            or not all(math.isfinite(v) for v in n["fp16_amp_raw_loss"]),
        "the fp16 run's eval accuracy is 0": n["eval_accuracy"]["fp16 weights (report)"] == 0.0,
        "without SEQ_CLS the head is frozen and not saved": not frozen["head_trainable"] and not frozen["score_saved"],
        "without SEQ_CLS a reload under another seed changes the rewards": frozen["reload_max_reward_change"] > 1e-3,
    }


# %% jupyter={"source_hidden": true} tags=["checks"]
def fix_checks(n: dict) -> dict:
    """The fused optimizer over its run, and the fixed head: finite, trained, saved and reloaded."""
    fixed = n["heads"]["with SEQ_CLS"]
    return {
        "fused AdamW kept the fp16 run finite over its steps": bool(n["fused_adamw_raw_loss"])
            and all(math.isfinite(v) for v in n["fused_adamw_raw_loss"]),
        "float32 + SEQ_CLS is finite throughout": all(math.isfinite(v) for v in fixed["raw_loss"]),
        "the fixed head is trained and saved": fixed["head_trainable"] and fixed["score_saved"],
        "the fixed reload reproduces the rewards (within 1e-4)": fixed["reload_max_reward_change"] < 1e-4,
    }


def checks(n: dict) -> tuple[dict, dict]:
    """Today's settings, the mechanism and the log; then the fused optimizer and the fix. All on the real code path."""
    symptom = {**today_checks(n), **mechanism_checks(n), **log_checks(n)}
    return ({name: measured(ok) for name, ok in symptom.items()},
            {name: measured(ok) for name, ok in fix_checks(n).items()})


# %% jupyter={"source_hidden": true}
numbers = {
    "default_optim": default_optim, "fused_adamw_raw_loss": fused_raw, "one_fp16_step": one_fp16_step,
    "legacy_spellings": spellings, "first_nonfinite_tensor": finding.names if finding else None,
    "first_nonfinite_where": finding.where if finding else None, "adam_state": adam,
    "clip_spreads_nan": clip_spreads_nan, "poisoned_tensors": len(poisoned), "trainable_tensors": len(trainable),
    "fp16_by_accumulation": sweep, "fp16_amp": amp_outcome, "fp16_amp_raw_loss": amp_raw,
    "grad_scaler": scaler_outcome, "heads": heads, "eval_accuracy": accuracy,
}
counts = sorted(sweep)
summary = (f"Today's default fused AdamW kept fp16 weights finite; the non-fused one made {adam['inf_weights']} inf and "
           f"{adam['nan_weights']} NaN weights of the fp16 score head in one step. The NaN filter logged "
           + ", ".join(f"{sweep[k]['logged'][0]:.2g} (accumulation {k})" for k in counts)
           + " for the same NaN run. Without SEQ_CLS the head stayed random and unsaved.")
metrics = save_metrics(run, "03-deeper", numbers, checks, summary=summary)
print(summary)
conclude(metrics, run.output_dir)
