"""Lesson 03's deep dive: the other run's numbers for each group, the checks both runs share, and the margins.

Every section runs the report's settings twice, fp16 weights (without the fix) and float32 weights (with it), and
records the same fields for both (``numbers["runs"]``): the fused default's run and one step of each AdamW kernel on
a weight of the run's dtype, the dtype each spelling of it loads, the first non-finite tensor and AdamW's state
after step 1 against the step's real gradient, the accumulation sweep with the NaN filter replayed, the tensors left
non-finite, ``fp16=True`` and torch's gradient scaler. The head section pairs the frozen head (no ``SEQ_CLS``,
without the fix) with the trained one (with it), both in float32. Whole runs: the symptom's checks read the float32
run in place of the fp16 one, the fix's checks the other way round.

Margins, with the values of seeds 0-5 (cpu profile, one thread; see the issue-37 report for the table):
- "v is 0 exactly for the weights whose |g| is below the v threshold (no mismatch)": a count of weights where fp16
  AdamW's v being 0 and the step's real |g| being below (2**-25 / (1 - beta2)) ** 0.5 disagree. fp16 state: 0 at
  every seed (v = fp16((1 - beta2) * g**2) in fp32 arithmetic, so the threshold is exact but for a gradient within
  fp32 rounding of it); float32 state keeps every one of them, so its count is the weights below the threshold:
  MISMATCHES_FP32 at seeds 0-5. The line at 0.5 is as far as an integer count allows from 0 and from the smallest
  failure, one mismatch (the mutation; the float32 run's 17 at seed 0 would let the line move to 5 unseen):
  linear(0.5, 0.5).
- "replay gives every logged number (within 1e-2)": the Trainer adds fp32 tensors, the replay float64; they met to
  REPLAY at seeds 0-5 (fp16 and float32 runs alike), shared; a filter that doubled the running sum (the mutation) is
  100 % off, 100x the line: log(10, 50).
- "more accumulation inflates ... (over 1e3x each step of the sweep)": the filter's log is 13**a / 25 x step 1's loss,
  so 1 -> 8 multiplies it by about 13**7 = 6e7 and 8 -> 32 by 13**24 (INFLATE at seeds 0-5); float32's log is the mean
  loss at every count, ratios near 1 (FP32_RATIO; 0.96 at seed 0, 1e3x under the line): log(1e3, 500).
- "at accumulation 32 the log is a huge finite number (> 1e30)": 13**32 / 25 x a first loss near 0.69: 1.2e34 or so
  (HUGE at seeds 0-5); float32 logs its mean loss, under 1, over 1e30x under the line: log(1e3, 1e30).
- "reload under another seed changes the rewards (> 1e-3)" and "the fixed reload reproduces the rewards (within
  1e-4)": a reload on a base with another random head moved the frozen head's rewards by RELOAD_FROZEN at seeds 0-5;
  the saved head reloads to RELOAD_FIXED (the same fp32 arithmetic). "within 1e-4" sits 3.5e3x under the frozen
  head's 0.35 at seed 0: log(10, 1e3). The fixed reload's 0 is infinitely far on a log scale, so the "> 1e-3" line is
  bounded from its own run instead: 0.35 sits 348x above it, log(10, 10, at_most=2e3) (loosened tenfold, 3.5e3x).
The rest are equalities on names, dtypes, statuses, error messages and NaN arithmetic.
"""

import math

from trl_clinic.course.mutations import cycled, linear, log, other_run

OTHER_RUN = other_run("without_fix", "with_fix")

SHARED = {
    "default optimizer is the fused AdamW": "the stack's default, read from the trainers both runs build",
    "legacy torch_dtype is ignored": "today's TRL's loading, on the same float32 checkpoint for both runs",
    "'half' is rejected": "today's TRL's loading, on the same float32 checkpoint for both runs",
    "replay gives every logged number": "the Trainer logs by the same arithmetic in both runs: on the float32 run's "
    "finite losses the replay gives their mean, which the Trainer logs too",
}

MUTATIONS = {
    # transformers <= 4.53.3, or torch < 2.8: the default is the non-fused "adamw_torch"
    "default optimizer is the fused AdamW": lambda n: n.update(default_optim="adamw_torch"),
    # TRL 0.26.2: create_model_from_path defaults to "auto" and the legacy key reaches from_pretrained
    "legacy torch_dtype": lambda n: n["spellings"].update(
        {"{'torch_dtype': 'float16'} on checkpoint-float32": "loads with weights in torch.float16"}
    ),
    # the report's TRL 0.12 example script: getattr(torch, "half") is torch.float16
    "'half' is rejected": lambda n: n["spellings"].update(
        {"{'dtype': 'half'} on checkpoint-float32": "loads with weights in torch.float16"}
    ),
    # fp16 AdamW whose v kept one weight below the threshold (or lost one above it): the smallest mismatch
    "no mismatch": lambda n: n["runs"]["without_fix"]["adam"].update(mismatches=1),
    # a Trainer whose filter differs from the replay: twice the running sum at the log of accumulation 32
    "replay gives every logged number": lambda n: n["runs"]["without_fix"]["sweep"]["32"]["logged"].__setitem__(
        0, 2 * n["runs"]["without_fix"]["sweep"]["32"]["logged"][0]
    ),
}

MARGINS = {
    "no mismatch": linear(0.5, 0.5),
    "replay gives every logged number": log(10, 50),
    "more accumulation inflates": log(1e3, 500),
    "huge finite number": log(1e3, 1e30),
    "reload under another seed changes": log(10, 10, at_most=2e3),
    "fixed reload reproduces": log(10, 1e3),
}


def gpu_shape(numbers: dict, sizes: dict) -> dict:
    """The cpu numbers at the gpu profile's lengths (the checks' indexing): the sweep keyed by the gpu accumulation
    counts, a raw loss per step of each run, the fused and head runs as long as their gpu step counts. The fp16
    sweep's raw loss is finite at step 1 and NaN after (the filter's arithmetic above, whatever the model); the
    float32 runs' raw losses are their cpu series repeated. The logged numbers stay the cpu runs' real Trainer logs;
    the checks' thresholds are argued for SmolLM2 in the module docstring and mutations.py."""
    for name, run in numbers["runs"].items():
        rows = [run["sweep"][key] for key in sorted(run["sweep"], key=int)]
        run["sweep"] = {}
        for i, accumulation in enumerate(sizes["accumulation_sweep"]):
            row = dict(rows[min(i, len(rows) - 1)])
            raw = row["raw_loss"]
            steps = sizes["train_steps"]
            row["raw_loss"] = [raw[0]] + [math.nan] * (steps - 1) if name == "without_fix" else cycled(raw, steps)
            run["sweep"][str(accumulation)] = row
        run["fused_raw_loss"] = cycled(run["fused_raw_loss"], sizes["fused_steps"])
        run["head"]["raw_loss"] = cycled(run["head"]["raw_loss"], sizes["head_steps"])
    return numbers
