"""Lesson 03 (core): how a run without the bug, or without the fix, changes the numbers, one mutation per check
(the part of the check's name it matches -> a change of the numbers such a run could produce; the comment names
the real run it stands for).

The gpu profile trains SmolLM2-135M-Instruct with a new score head (576 weights instead of 64), batch 8
with passages of about 150 tokens, the same 50 steps of accumulation 32 with logs at 25 and 50, and no mixed
precision in the report's run (the fix adds the profile's bf16 autocast over float32 weights). Each threshold,
argued for those sizes:
- "huge finite number (> 1e30)": the log at step 25 is step 1's loss x 13**32 / 25 (the NaN filter's arithmetic,
  which the deep dive replays), whatever the model and batch, once step 2 is NaN. SmolLM2's fp16 first loss on these
  pairs was 0.69 to 0.79 on a CPU (batch 1 x 4, and one batch of 8), so about 1.2e34 to 1.4e34: four orders above
  the bar. It fails only if step 1 itself were NaN (an fp16 overflow in the forward; SmolLM2's fp16 rewards were
  finite and below 1 in size).
- "finite at step 1 and non-finite at every later step": needs one head weight with |g| below 5.5e-3 at step 1. On
  the cpu profile 30 of the 64 were (seed 0); on SmolLM2, 63 of 576 after one step of batch 1 x 4 on a CPU
  (tests/test_gpu_paths.py checks that some do), 22 of 576 on one batch of 8: batch 8 x 32 averages more pairs,
  which shrinks the noise in g, not the count below the threshold to zero.
- "one fp16 AdamW step": the profile runs it on CUDA, where torch's non-fused AdamW is `_multi_tensor_adam`; it
  keeps the state in the parameter's dtype and adds eps in it too (torch 2.13 torch/optim/adam.py), so the table
  is the same arithmetic. Only a kernel that computes in fp32 (the fused one) changes it.
- "fixed ... accuracy > 0.6": the cpu model (80K parameters, one layer, random init) reached 0.66 to 0.84 at seeds
  0-5 in 50 steps; SmolLM2 is pretrained and reads the answer in the passage, with 8 times the pairs a step. 0.6
  stays: 2.3 standard deviations of a chance ranker above 0.5 with the cpu profile's 128 pairs, 4.5 with the gpu
  profile's 512.
- "replayed ... (within 1e-2)": the replay adds each step's raw loss in float64 where the Trainer adds fp32 tensors
  (they agreed to 1e-4 relative at 1.2e34 on the CPU); the gpu run's sums are of the same kind, 25 x 32 additions.
- "exactly 0", "NaN at every log", "ranks no held-out pair", "only non-finite ... score head", the probes' statuses:
  equalities on NaN arithmetic or on names, not on magnitudes: the same at any size.
"""

import math

from mutation_helpers import cycled

FUSED_STEP = {
    "0.01 float16": -0.0010004043579101562,
    "0.001 float16": -0.0010004043579101562,
    "1e-07 float16": -0.0009226799011230469,
    "0 float16": 0.0,
}  # fused=True on fp16, measured (deep dive)

MUTATIONS = {
    # the same NaN run at accumulation 1: the filter logs 13/25 of step 1's loss (0.36, deep dive)
    "huge finite number": lambda n: [n[key].__setitem__(0, 0.36) for key in ("report_logged_loss", "replayed_logs")],
    # the report's run with logging_nan_inf_filter=False (exercise 1): the NaN itself at every log, not the replay
    ("huge finite number", "exactly 0", "arithmetic, replayed"): lambda n: n.update(
        report_logged_loss=[math.nan] * len(n["report_logged_loss"])
    ),
    # a Trainer whose filter differs from the replay (one without the filter logs NaN: the mutation above)
    "arithmetic, replayed": lambda n: n["replayed_logs"].__setitem__(0, 2 * n["replayed_logs"][0]),
    # a run without the bug (float32 weights): the fixed run's grad norms
    "grad norm is NaN": lambda n: n.update(report_logged_grad_norm=[0.74, 0.72][: len(n["report_logged_grad_norm"])]),
    # a run without the bug: today's default fused AdamW keeps every raw loss finite (deep dive, 0.69)
    "finite at step 1 and non-finite": lambda n: n.update(report_raw_loss=[0.69] * len(n["report_raw_loss"])),
    # the fused run evaluated: a finite reward model ranks about as many pairs right as chance
    "ranks no held-out pair": lambda n: n["eval_accuracy"].update({"fp16 (report)": 0.5}),
    # the same step with fused=True (today's default), as measured in the deep dive
    "one fp16 AdamW step": lambda n: n["one_adam_step"].update(FUSED_STEP),
    # a run without the bug: nothing non-finite after one step
    "only non-finite trainable tensors": lambda n: n.update(one_step_nonfinite={}),
    # the report's model under the fused default: the probe's one step stays finite
    "fp16_adamw probe fails": lambda n: n["checkup_report"].update(fp16_adamw="ok"),
    # a run without the fix: the fp16 run's raw losses
    "fixed run's raw loss is finite": lambda n: n.update(fixed_raw_loss=list(n["report_raw_loss"])),
    # a run without the fix: the fp16 run's accuracy
    "above chance": lambda n: n["eval_accuracy"].update({"float32 (fixed)": 0.0}),
    # a run without the fix: what check_trainable said of the one-step fp16 model
    "check_trainable finds nothing": lambda n: n.update(
        fixed_problems=["base_model.model.score.modules_to_save.default.weight: 11 inf, 0 NaN (torch.float16)"]
    ),
    # a run without the fix: the report's trainer
    "probes are ok on the fixed trainer": lambda n: n.update(checkup_fixed={"fp16_adamw": "fail", "reward_head": "ok"}),
}


def gpu_shape(numbers: dict, sizes: dict) -> dict:
    """The cpu numbers at the gpu profile's lengths: a raw loss per step, a log every 25 steps (the first the huge
    number, then 0s), a grad norm per log. The head's names and the one-step table do not depend on the sizes."""
    steps, logs = sizes["train_steps"], sizes["train_steps"] // 25
    raw, fixed = numbers["report_raw_loss"], numbers["fixed_raw_loss"]
    numbers["report_raw_loss"] = [raw[0]] + [math.nan] * (steps - 1)
    numbers["fixed_raw_loss"] = cycled(fixed, steps)
    numbers["report_logged_loss"] = [numbers["report_logged_loss"][0]] + [0.0] * (logs - 1)
    numbers["report_logged_grad_norm"] = [math.nan] * logs
    numbers["replayed_logs"] = numbers["report_logged_loss"][:]
    return numbers
