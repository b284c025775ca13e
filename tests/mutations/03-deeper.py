"""Lesson 03's deep dive: how a run without the bug, or without the fix, changes the numbers, one mutation per check
(the part of the check's name it matches -> a change of the numbers such a run could produce; the comment names
the real run it stands for).

The gpu profile runs SmolLM2-135M-Instruct with a new score head (576 weights), batch 8 with passages,
the same 25-step runs and accumulation sweep [1, 8, 32], on CUDA. Each threshold, argued for those sizes:
- "replay gives every logged number (within 1e-2)": the replay adds each step's raw loss in float64 where the
  Trainer adds fp32 tensors; on the CPU they agreed to 4e-4 relative at 1.2e34. The gpu run logs the same kind of
  sums (fp32 tr_loss on the GPU, the same 25 x accumulation additions), so 1e-2 keeps a 25-fold margin.
- "huge finite number (> 1e30)" at accumulation 32: 13**32 / 25 x step 1's loss (0.69 to 0.79 for SmolLM2 in fp16
  on a CPU): 1.2e34 to 1.4e34 whatever the size.
- "more accumulation inflates": 13**accumulation / 25 x the first loss: about 0.4, 2e7 and 1e34, orders apart.
- "the v threshold separates (1 %)": the read-back |g| = |m| / (1 - beta1) carries fp16's relative rounding
  (2**-11, 0.05 %), on any device; the threshold (2**-25 / (1 - beta2)) ** 0.5 is arithmetic.
- "some of the head's weights went non-finite": 30 of 64 on the cpu profile (seed 0); 63 of SmolLM2's 576 after one
  step of batch 1 x 4 on a CPU, 22 on one batch of 8 pairs.
- "reload under another seed changes the rewards (> 1e-3)": SmolLM2's rewards from a freshly drawn head already spread
  from -0.73 to 0.42 over 16 texts on a CPU, so another draw moves them by tenths; the cpu model moved 0.35 (seed 0).
  "reproduces (< 1e-4)": the fp32 reload of the same saved head; the gpu run trains under bf16 autocast, and
  `trained_model` scores both sides without it (without it an earlier gpu run differed by 3e-3).
- "fp16=True does not rescue": on CUDA accelerate makes a scaler and torch refuses fp16 gradients (a ValueError),
  on the CPU the run goes NaN: the check accepts either.
- names, dtypes, strings and statuses: the same at any size.
"""

import math

from mutation_helpers import cycled

MUTATIONS = {
    # transformers <= 4.53.3, or torch < 2.8: the default is the non-fused "adamw_torch"
    "default optimizer is the fused AdamW": lambda n: n.update(default_optim="adamw_torch"),
    # bfloat16 weights (exercise 2 of the core): the non-fused step stays finite as well
    "one fused AdamW step keeps an fp16 weight finite": lambda n: n["one_fp16_step"].update(
        {"fused=False g=0.001": -0.001, "fused=False g=1e-07": -0.001, "fused=False g=0": 0.0}
    ),
    # TRL 0.26.2: create_model_from_path defaults to "auto" and the legacy key reaches from_pretrained
    "legacy torch_dtype": lambda n: n["legacy_spellings"].update(
        {"{'torch_dtype': 'float16'}": "loads with weights in torch.float16"}
    ),
    # the report's TRL 0.12 example script: getattr(torch, "half") is torch.float16
    "'half' is rejected": lambda n: n["legacy_spellings"].update(
        {"{'dtype': 'half'}": "loads with weights in torch.float16"}
    ),
    # a model passed as an instance: TRL ignores model_init_kwargs and the weights stay as built (fp32)
    "dtype='float16' gives": lambda n: n["legacy_spellings"].update(
        {"{'dtype': 'float16'}": "loads with weights in torch.float32"}
    ),
    # "auto" on the fp32 checkpoint
    "dtype='auto' on an fp16 checkpoint": lambda n: n["legacy_spellings"].update(
        {"{'dtype': 'auto'}": "loads with weights in torch.float32"}
    ),
    # an fp16 forward that overflows first: the gradient goes NaN before any update
    "first bad tensor is the fp16 score head": lambda n: n.update(first_nonfinite_where="gradient"),
    # a kernel whose update is not m / (sqrt(v) + eps) in fp16: the inf weights are not the underflowed ones
    "inf weights are exactly those": lambda n: n["adam_state"].update(inf_where_only_v_underflowed=False),
    "NaN weights are exactly those": lambda n: n["adam_state"].update(nan_where_m_underflowed_too=False),
    # a head whose every |g| is above the threshold at step 1 (larger hidden states): nothing underflows
    "some of the head's weights went non-finite": lambda n: n["adam_state"].update(inf_weights=0, nan_weights=0),
    # a state kept in another format (bf16: v survives): the underflowed |g| are not below the fp16 threshold
    "v threshold separates": lambda n: n["adam_state"].update(
        largest_underflowed_gradient=2 * n["adam_state"]["v_threshold"]
    ),
    # the same call with error_if_nonfinite=True: it raises before scaling, and the finite gradient stays finite
    "clipping turns a finite gradient NaN": lambda n: n.update(clip_spreads_nan=False),
    # the probe's run, stopped after step 1: only the head is non-finite yet
    "spread to every trainable tensor": lambda n: n.update(poisoned_tensors=1),
    # a Trainer whose filter differs from the replay
    "replay gives every logged number": lambda n: n["fp16_by_accumulation"]["32"]["replayed"].__setitem__(
        0, 2 * n["fp16_by_accumulation"]["32"]["replayed"][0]
    ),
    # the accumulation-1 run under the fused default: never non-finite
    "fp16 breaks at every accumulation count": lambda n: n["fp16_by_accumulation"]["1"].update(
        first_nonfinite_step=None
    ),
    # the accumulation-32 run breaking only at step 26: a normal loss logged at 25, and the replay agrees
    ("huge finite number", "more accumulation inflates"): lambda n: n["fp16_by_accumulation"]["32"].update(
        first_nonfinite_step=26, logged=[0.66], replayed=[0.66]
    ),
    # a scaler that unscales fp16 gradients
    "gradient scaler refuses": lambda n: n.update(grad_scaler="unscaled"),
    # fp16=True over float32 weights: trains finite
    "fp16=True does not rescue": lambda n: n.update(fp16_amp="trained", fp16_amp_raw_loss=[0.69, 0.68, 0.69, 0.68]),
    # the fused run evaluated
    "fp16 run's eval accuracy is 0": lambda n: n["eval_accuracy"].update({"fp16 weights (report)": 0.5}),
    # modules_to_save=["score"] without SEQ_CLS: the head trains and is saved
    "head is frozen and not saved": lambda n: n["heads"]["without SEQ_CLS"].update(
        head_trainable=True, score_saved=True
    ),
    # a reload under the same seed draws the same random head
    "reload under another seed changes": lambda n: n["heads"]["without SEQ_CLS"].update(reload_max_reward_change=0.0),
    # a fused run that broke later than its steps showed
    "fused AdamW kept the fp16 run finite": lambda n: n["fused_adamw_raw_loss"].__setitem__(-1, math.nan),
    # fp16 weights with SEQ_CLS: the report's run
    "float32 + SEQ_CLS is finite": lambda n: n["heads"]["with SEQ_CLS"]["raw_loss"].__setitem__(-1, math.nan),
    # the frozen-head run's adapter
    "fixed head is trained and saved": lambda n: n["heads"]["with SEQ_CLS"].update(score_saved=False),
    # the frozen-head run's reload
    "fixed reload reproduces": lambda n: n["heads"]["with SEQ_CLS"].update(reload_max_reward_change=0.35),
}


def gpu_shape(numbers: dict, sizes: dict) -> dict:
    """The cpu numbers at the gpu profile's lengths: the accumulation sweep keyed by the gpu counts, a raw loss
    per step of each run, the fused and head runs as long as their gpu step counts."""
    sweep = numbers["fp16_by_accumulation"]
    rows = [sweep[key] for key in sorted(sweep, key=int)]
    numbers["fp16_by_accumulation"] = {}
    for i, accumulation in enumerate(sizes["accumulation_sweep"]):
        row = dict(rows[min(i, len(rows) - 1)])
        row["raw_loss"] = [row["raw_loss"][0]] + [math.nan] * (sizes["train_steps"] - 1)
        numbers["fp16_by_accumulation"][str(accumulation)] = row
    numbers["fused_adamw_raw_loss"] = cycled(numbers["fused_adamw_raw_loss"], sizes["fused_steps"])
    for head in numbers["heads"].values():
        head["raw_loss"] = cycled(head["raw_loss"], sizes["head_steps"])
    return numbers
