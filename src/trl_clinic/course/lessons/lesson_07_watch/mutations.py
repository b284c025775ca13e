"""Lesson 07 (one notebook: the watch on a user's run). The lesson records both runs side by side
(``numbers["runs"]``): ``fp16`` (the reward model's weights in fp16 with the non-fused AdamW) and ``float32`` (only the
dtype changed), each with the same measurements: its log rows without and with the watch, the raw loss per step,
the NaN filter's replay of it, the watch's findings, the trainable tensors' float32 sums, where ``stop_on="nonfinite"``
and the pasted callback stopped, and the check-up's ``fp16_adamw`` verdict before training. ``identical`` (watched
against unwatched weights, bit for bit) is the watch's promise: only the float32 pair can show it (NaN from step 2 in
both fp16 runs), so it is SHARED.

Margins (spread over seeds 0-5, one thread, cpu profile, in ``SPREAD``):
- "the NaN filter's arithmetic on them gives every logged loss (within 1e-3)": the Trainer adds float32 tensors and
  divides; the replay does the same in float64: ten additions a log, a relative difference of order 1e-7 (0 at every
  seed here). The line is argued 100x above that; the float32 run has no NaN, so the check cannot pass there, and it
  is held against its mutation instead: a Trainer whose filter doubled the first log, 100 % off, 1e3x the line (500x
  argued, which a line loosened tenfold breaks).
- "the float32 run learns: its last 10 steps' mean loss is below its first 10 steps'": the first ten steps sit at
  ln 2 (a random head cannot tell the answers apart) and the last ten fall as the head learns; the line (the first ten
  steps' own mean, 0.69-0.70) sat 1.27x to 1.75x above the last ten's mean (0.40-0.55), 1.1x argued. The fp16 run's
  last ten are NaN: it cannot pass, and gives no number to hold the line against, so the line is bounded from its
  own run: at most 3x above the last ten's mean (1.75x at the best seed; a line loosened tenfold sits 14x above).

The gpu profile trains SmolLM2-135M-Instruct with a new score head (576 weights instead of 64) and LoRA r=8 on
q_proj and v_proj of its 30 layers (120 adapter tensors instead of 4), 100 steps of batch 8, a log every 10 steps, no
mixed precision in either run (the notebook passes bf16=False to both, so the fix changes only the dtype). Not run on
a GPU (no task had one): ``gpu_shape`` tests the checks' indexing at those sizes (100 steps, 10 logs, 121 tensors)
and models the logs from the raw losses with the Trainer's own arithmetic (``replay_nan_filter``), never by copying
the cpu run's logged values. The arguments for the thresholds there:
- the head breaks at step 1 when one head weight's step-1 gradient is small enough for fp16 AdamW's second moment
  to underflow (|g| below about 5.5e-3, lesson 03). On the cpu profile the head broke at step 1 at seeds 0-5; lesson
  03 measured 22 of SmolLM2's 576 head weights below that bar after one batch of 8 on a CPU. On CUDA torch's
  non-fused AdamW is the foreach kernel, whose state is also kept in the weight's dtype (torch 2.13
  ``torch/optim/adam.py``): the same arithmetic. "before the first log" is step 1 < 10 at any size.
- the first log is then step 1's loss x 5.5 / 10 (the filter's arithmetic, replayed): finite whenever step 1's fp16
  forward is. SmolLM2's fp16 first losses on these pairs were 0.69 to 0.79 in lesson 03 (on a CPU).
- "the float32 run learns": SmolLM2 is pretrained, the answer is in its passage and the head starts random, so its
  first steps sit near ln 2 too; lr 2e-4 over 100 steps of 8 pairs must move the mean of ten steps. Not measured on
  a GPU.
"""

import math

from trl_clinic.course.mutations import cycled, log, other_run
from trl_clinic.probes.recording import replay_nan_filter

# seeds 0-5, one thread, cpu profile (min, max over the six runs)
SPREAD = {
    "the NaN filter's replay against the logged losses (relative)": (0.0, 0.0),
    "float32: first 10 steps' mean loss": (0.688, 0.705),
    "float32: last 10 steps' mean loss": (0.399, 0.552),  # the first ten's mean is 1.27x to 1.75x above it
    "fp16: first logged loss": (0.382, 0.392),
}


OTHER_RUN = other_run("fp16", "float32")

SHARED = {
    "float32 runs end with bit-identical weights": "the watch's promise, the same for both runs; only the float32 pair "
    "can show it (the fp16 pair's weights are NaN from step 2 in both runs, whatever the watch did)",
}

MUTATIONS = {
    # a watch that changed what the trainer computes (a check that wrote a gradient or drew a random number)
    "float32 runs end with bit-identical weights": lambda n: n["identical"].update(float32=False),
    # a Trainer whose NaN filter differs from the replay: twice the first logged loss
    "the NaN filter's arithmetic on them": lambda n: n["runs"]["fp16"]["plain_logged"][0].update(
        loss=2 * n["runs"]["fp16"]["plain_logged"][0]["loss"]
    ),
}

MARGINS = {
    "the NaN filter's arithmetic on them": log(100, 500),
    "the float32 run learns": log(1.1, 1, at_most=3),
}

LORA = [
    f"base_model.model.model.layers.{layer}.self_attn.{proj}.lora_{ab}.default.weight"
    for layer in range(30)
    for proj in ("q_proj", "v_proj")
    for ab in "AB"
]


def gpu_shape(numbers: dict, sizes: dict) -> dict:
    """Both runs at the gpu profile's sizes: a raw loss per step for its 100 steps (the fp16 run NaN from step 2, the
    float32 run's cpu losses cycled), a log every 10 steps whose loss is what the Trainer's arithmetic makes of those
    raw losses, and SmolLM2's trainable tensors: LoRA A and B on q_proj and v_proj of 30 layers (float32) beside the
    score head (fp16 and NaN in the fp16 run, float32 and finite in the other)."""
    steps = sizes["train_steps"]
    numbers["train_steps"] = steps
    for name, run in numbers["runs"].items():
        raw = run["raw_loss"]
        run["raw_loss"] = [raw[0]] + [math.nan] * (steps - 1) if name == "fp16" else cycled(raw, steps)
        run["replayed_logs"] = replay_nan_filter(run["raw_loss"], 1, 10)
        for key in ("plain_logged", "watched_logged"):
            first, last = run[key][0], run[key][-1]
            rows = [{**(first if i == 0 else last), "step": 10 * (i + 1)} for i in range(steps // 10)]
            run[key] = [{**row, "loss": loss} for row, loss in zip(rows, run["replayed_logs"])]
        head = [name for name, (_, total) in run["weight_sums"].items() if "score" in name]
        run["weight_sums"] = {name: ["float32", 0.1] for name in LORA}
        run["weight_sums"].update({h: ["float16", math.nan] if name == "fp16" else ["float32", 0.1] for h in head})
        if name == "float32":
            run["stopped_step"] = steps
    return numbers
