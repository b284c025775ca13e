"""Lesson 03 (core): the other run's numbers for each group, the one check both runs share, and the margins.

The lesson trains the report's run twice, differing only in the weights' dtype: fp16 (without the fix) and
float32 (with it); both with the non-fused AdamW, ``bf16=False``, batch x accumulation 32. Each records the same
fields (``numbers["runs"]``): its log and raw losses, the NaN filter replayed on them, one AdamW step on a weight of
its dtype, what ``check_trainable`` and the check-up say around one optimizer step, its held-out accuracy.

Margins, with the values of seeds 0-5 (cpu profile, one thread) where they vary:
- "huge finite number (> 1e30)": the log at step 25 is step 1's loss x 13**32 / 25 (the NaN filter's arithmetic,
  replayed by a shared check) once step 2 is NaN: a random head's first loss is near ln 2 = 0.69, so the log is
  near 1.2e34, four orders above the line (1.2e34-1.3e34 at seeds 0-5); it would take a first loss below 1e-4 to
  come within 1e3 of it. The float32 run logs its mean loss, under 1, so the line sits over 1e30x above it (1.5e30x at
  seed 0; a line loosened tenfold would sit 1.5e29x above): log(1e3, 1e30).
- "replayed ... (within 1e-2)": the Trainer adds the micro-batch losses as fp32 tensors and the replay in float64;
  they met to 1e-4 relative or better at seeds 0-5, on the fp16 run's 1.2e34 as on the float32 run's means: a
  tenfold margin on the run's own side (shared: both runs pass it). Against its mutation, a filter that doubled the
  running sum (100 % off, 100x the line): log(10, 50).
- "accuracy > 0.6": the float32 run ranked 0.66-0.84 of 128 held-out pairs at seeds 0-5 (0.6 is 2.3 standard
  deviations of a chance ranker above 0.5 with 128 pairs); the fp16 run's rewards are NaN and rank none (0.0).
  linear(0.05, 0.5).
The rest are equalities on NaN arithmetic, names, dtypes and statuses.

The gpu profile trains SmolLM2-135M-Instruct with a new score head (576 weights instead of 64), batch 8 with
passages of about 150 tokens, the same 50 steps of accumulation 32 with logs at 25 and 50, ``bf16=False`` in both
runs. At those sizes:
- the log at step 25 is the same arithmetic: SmolLM2's fp16 first loss on these pairs was 0.69 to 0.79 on a CPU
  (batch 1 x 4, and one batch of 8), so about 1.2e34 to 1.4e34.
- "finite at step 1 and non-finite at every later step" needs one head weight with |g| below 5.5e-3 at step 1: 30
  of 64 on the cpu profile (seed 0); on SmolLM2 63 of 576 after one step of batch 1 x 4 on a CPU
  (tests/test_gpu_paths.py checks that some do), 22 of 576 on one batch of 8.
- "one AdamW step": torch's non-fused AdamW on CUDA is ``_multi_tensor_adam``; it keeps the state in the
  parameter's dtype and adds eps in it too (torch 2.13 torch/optim/adam.py): the same arithmetic.
- "accuracy > 0.6": SmolLM2 is pretrained and reads the answer in the passage, with 8 times the pairs a step; 0.6
  is 4.5 standard deviations of a chance ranker above 0.5 with the gpu profile's 512 pairs.
"""

import math

from trl_clinic.course.mutations import cycled, linear, log, other_run

OTHER_RUN = other_run("without_fix", "with_fix")

SHARED = {
    "arithmetic, replayed": "the Trainer logs by the same arithmetic in both runs: replayed on the float32 run's "
    "finite losses it gives their mean, which the Trainer logs too",
}

MUTATIONS = {
    # a Trainer whose filter differs from the replay: twice the running sum at the first log
    "arithmetic, replayed": lambda n: n["runs"]["without_fix"]["logged_loss"].__setitem__(
        0, 2 * n["runs"]["without_fix"]["logged_loss"][0]
    ),
}

MARGINS = {
    "huge finite number": log(1e3, 1e30),
    "arithmetic, replayed": log(10, 50),
    "above chance": linear(0.05, 0.5),
}


def gpu_shape(numbers: dict, sizes: dict) -> dict:
    """The cpu numbers at the gpu profile's lengths (the checks' indexing): a raw loss per step, a log every 25
    steps, a grad norm per log. The fp16 run's raw loss is finite at step 1 and NaN after (the arithmetic above);
    the float32 run's raw losses are its cpu series repeated (a finite loss a step, at any size). The logged
    numbers stay the cpu run's real Trainer logs, repeated per log; the replay is recomputed on the reshaped raw
    losses, as the notebook computes it."""
    from trl_clinic.probes.recording import replay_nan_filter

    steps, logs = sizes["train_steps"], sizes["train_steps"] // 25
    for name, run in numbers["runs"].items():
        raw = run["raw_loss"]
        run["raw_loss"] = [raw[0]] + [math.nan] * (steps - 1) if name == "without_fix" else cycled(raw, steps)
        run["replayed_logs"] = replay_nan_filter(run["raw_loss"], 32, 25)
        run["logged_loss"] = cycled(run["logged_loss"][:1], 1) + cycled(run["logged_loss"][1:], logs - 1)
        run["logged_grad_norm"] = cycled(run["logged_grad_norm"], logs)
    return numbers
