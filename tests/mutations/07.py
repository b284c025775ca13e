"""Lesson 07 (one notebook: the watch on a user's run): how a run without the bug, or without the fix, or a watch that
looked too late, changes the numbers, one mutation per check (the part of the check's name it matches -> a change
of the numbers such a run could produce; the comment names the real run it stands for).

The gpu profile trains SmolLM2-135M-Instruct with a new score head (576 weights instead of 64) and LoRA r=8 on
q_proj and v_proj of its 30 layers (120 adapter tensors instead of 4), the same 100 steps of batch 8 with a log every
10 steps, passages of about 150 tokens, no mixed precision in either run (the notebook passes bf16=False to both, so
the fix changes only the dtype). Each threshold, argued for those sizes (not run on a GPU: this task had none):
- "the watch finds nonfinite at the step the pasted callback stops, before the first log", "finite up to the
  finding's step": both need one head weight whose step-1 gradient is small enough for fp16 AdamW's second moment to
  underflow (|g| below about 5.5e-3, lesson 03). On the cpu profile the head broke at step 1 at seeds 0-5; lesson 03
  measured 22 of SmolLM2's 576 head weights below that bar after one batch of 8 on a CPU. On CUDA torch's non-fused
  AdamW is the foreach kernel, whose state is also kept in the weight's dtype (torch 2.13 torch/optim/adam.py, read
  for lesson 03): the same arithmetic. "before the first log" is step 1 < 10 at any size.
- "the first logged loss is finite and below ln 2, with a NaN grad norm": the first log is step 1's loss x 5.5 / 10
  (the filter's arithmetic, replayed by a check); finite whenever step 1's fp16 forward is, and below ln 2 while step
  1's loss is below 1.26: SmolLM2's fp16 first losses on these pairs were 0.69 to 0.79 in lesson 03 (on a CPU), the
  cpu profile's 0.69-0.71 (logged 0.382-0.392 at seeds 0-5).
- "within 1e-3" for the replay: the Trainer adds fp32 tensors, the replay float64; ten additions a log at any size.
- "the float32 run learns: its last 10 steps' mean loss is below its first 10 steps'": on the cpu profile (80K
  parameters, random init, lr 1e-2) the first ten steps averaged about 0.70 and the last ten about 0.5 at seeds 0-5.
  SmolLM2 is pretrained, the answer is in its passage and the head starts random, so its first steps sit near ln 2
  too; lr 2e-4 over 100 steps of 8 pairs must move the mean of ten steps (80 pairs each). Not measured on a GPU.
- "bit-identical", "no finding", "exactly 0", the names and statuses: equalities, the same at any size.
"""

import math

from mutation_helpers import cycled

FIXED_FIRST_LOG = {"loss": 0.6988, "grad_norm": 0.3387}  # the float32 run's first log row, seed 0

MUTATIONS = {
    # a run without the bug (float32 weights): its first log row, above ln 2 with a finite grad norm, which the
    # filter's replay of the fp16 raw losses does not give
    ("with a NaN grad norm", "arithmetic on the raw losses"): lambda n: n["plain_logged"][0].update(FIXED_FIRST_LOG),
    # a run without the bug: the float32 run's later logs (about 0.69), not 0: no log of 0 for zero_loss either, and
    # the replay of the fp16 raw losses no longer matches them
    ("exactly 0", "arithmetic on the raw losses", "first log of 0"): lambda n: [
        row.update(loss=0.69) for row in n["plain_logged"][1:]
    ],
    # a Trainer whose filter differs from the replay (one without the filter logs NaN: exercise 3)
    "arithmetic on the raw losses": lambda n: n["replayed_logs"].__setitem__(0, 2 * n["replayed_logs"][0]),
    # a run without the bug: the float32 run's clinic/raw_loss in the first row
    "clinic/raw_loss is NaN": lambda n: n["watched_logged"][0].update({"clinic/raw_loss": FIXED_FIRST_LOG["loss"]}),
    # the run with logging_nan_inf_filter=False (exercise 3): no logged loss is exactly 0, so no zero_loss finding
    "zero_loss is found": lambda n: n["findings"].pop("zero_loss"),
    # a watch that read the weights only when the trainer logs (step 10): late, and stop_on stops at step 1 anyway
    (
        "at the step the pasted callback stops",
        "finite up to the finding's step",
        "stop_on='nonfinite' ends",
    ): lambda n: n["findings"].update(nonfinite=10),
    # a run without the bug (exercise 1, the fused AdamW): every raw loss finite
    "finite up to the finding's step": lambda n: n.update(raw_loss=[0.69] * len(n["raw_loss"])),
    # a run without the bug: every trainable tensor's float32 sum finite
    "exactly the pasted callback's": lambda n: [
        n["weight_sums"].__setitem__(name, [dtype, 0.5]) for name, (dtype, _) in list(n["weight_sums"].items())
    ],
    # a run without the bug: stop_on never fires and the run goes to its last step
    "stop_on='nonfinite' ends": lambda n: n.update(stopped_step=n["train_steps"]),
    # a watch that changed what the trainer computes (a check that wrote a gradient or drew a random number)
    "fp16 runs end with bit-identical": lambda n: n["identical"].update(fp16=False),
    # the trainer with the fused AdamW (exercise 1): the probe's one step stays finite
    "fp16_adamw probe fails": lambda n: n.update(checkup_fp16_adamw="ok"),
    # a run without the fix: the fp16 run's findings
    "no finding on the float32 run": lambda n: n.update(fixed_findings=["nonfinite", "zero_loss"]),
    # a run without the fix: the fp16 run's raw losses (NaN from step 2), which also learn nothing
    ("raw loss is finite at every step", "the float32 run learns"): lambda n: n.update(
        fixed_raw_loss=list(n["raw_loss"])
    ),
    # a float32 run that learns nothing (learning rate 0): the same loss at every step
    "the float32 run learns": lambda n: n.update(fixed_raw_loss=[0.69] * len(n["fixed_raw_loss"])),
    # a watch that changed what the trainer computes
    "float32 runs end with bit-identical": lambda n: n["identical"].update(float32=False),
}


def gpu_shape(numbers: dict, sizes: dict) -> dict:
    """The cpu numbers at the gpu profile's sizes: a raw loss per step and a log row every 10 steps (the same 100
    steps), and SmolLM2's trainable tensors: LoRA A and B on q_proj and v_proj of 30 layers (float32) beside the fp16
    score head."""
    steps = sizes["train_steps"]
    raw, fixed = numbers["raw_loss"], numbers["fixed_raw_loss"]
    numbers["raw_loss"] = [raw[0]] + [math.nan] * (steps - 1)
    numbers["fixed_raw_loss"] = cycled(fixed, steps)
    logs = steps // 10
    for key in ("plain_logged", "watched_logged"):
        rows = numbers[key]
        numbers[key] = [rows[0]] + [{**rows[-1], "step": 10 * i} for i in range(2, logs + 1)]
    numbers["replayed_logs"] = [row["loss"] for row in numbers["plain_logged"]]
    numbers["train_steps"] = steps
    head = [name for name, (_, total) in numbers["weight_sums"].items() if not math.isfinite(total)]
    numbers["weight_sums"] = {
        f"base_model.model.model.layers.{layer}.self_attn.{proj}.lora_{ab}.default.weight": ["float32", 0.1]
        for layer in range(30)
        for proj in ("q_proj", "v_proj")
        for ab in "AB"
    }
    numbers["weight_sums"].update({name: ["float16", math.nan] for name in head})
    return numbers
