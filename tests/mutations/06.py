"""Lesson 06 (core): how a run without the bug, or without the fix, changes the numbers, one mutation per check
(the part of the check's name it matches -> a change of the numbers such a run could produce; the comment names
the real run it stands for).

The gpu profile runs the same tiny trainers and the same sizes on a GPU; your trainer runs under the
profile's bf16 autocast, as TRL's default bf16=True gives a GPU user. Each threshold, argued for that profile:
- "rounding only (<= 4 units in the last place at the logits' size)": the bound scales with the dtype's eps and the
  logits' size, both measured in the run (fp16 weights: eps 9.8e-4; the cpu run's first sequence differed by 5.2e-4
  against a bound of 3.4e-3). docs/checkup.md measured the first sequences' rounding of OPT at 3.6e-7 (fp32),
  5.2e-4 (fp16) and 4.0e-3 in bf16 against bf16's bound of about 3.5e-2: a GPU kernel's rounding stays inside.
- "second sequence's first token already differs beyond it": OPT's contamination is a change of what the token
  attends to, 0.61 in the logits in fp32, bf16 and fp16 alike (docs/checkup.md), two orders above any bound here.
- "the pasted check ... (> 1e-2) ... (< 1e-2)": the later sequence's 0.61 against 1e-2; the first sequence's
  rounding, 5.2e-4 in fp16, is 20 times below 1e-2 (bf16 autocast does not apply: the pasted check runs no
  autocast, the weights stay fp16).
- the probes' statuses, the exit codes, the counts (> 0, == 0) and the fingerprint's parts: verdicts and equalities
  of state, the same at any size and on any device (the fingerprint hashes the CUDA tensors' bytes after a copy).
"""

TRAPS = "02 accumulation: a loss that takes the mean", "03 reward_head: LoRA, no task_type"
CACHE, GROUPS = "04 padding_cache: Qwen2, use_cache", "05 equal_rewards: a reward never earned"
FP16 = "03 fp16_adamw: fp16 weights"


def fixed_trainer(n: dict) -> None:
    """Your trainer with both fix lines: what the fixed trainer's check-up measured."""
    n["mine"].update(packing="skipped ", fp16_adamw="ok config")
    n["exit_code"] = 0


def trap(n: dict, name: str, index: int, **finding) -> None:
    n["traps"][name][index].update(finding)


MUTATIONS = {
    # your trainer on a Llama model folder: packing ok, measured (lesson 01's families; exercise 2)
    "your trainer: packing fails": lambda n: n["mine"].update(packing="ok measured"),
    # your trainer loaded in bfloat16: no fp16 trainable tensor, decided from the dtypes
    "your trainer: fp16_adamw fails": lambda n: n["mine"].update(fp16_adamw="ok config"),
    # both fix lines: the fixed trainer's check-up
    ("your trainer: packing fails", "your trainer: fp16_adamw fails", "exits 1"): fixed_trainer,
    # a kernel whose own rounding on this row is larger than 4 ulps (the packing probe raises its floor with it)
    "first sequence differs by rounding only": lambda n: n["by_token"].update(
        first=[1e-2] * len(n["by_token"]["first"])
    ),
    # the row on Llama in fp16: rounding only (docs/checkup.md: 9.8e-4 for later sequences)
    "second sequence's first token": lambda n: n["by_token"].update(second=[4.9e-4] * len(n["by_token"]["second"])),
    # the pasted check on a Llama row in fp16 (docs/checkup.md: first 4.9e-4, later 9.8e-4)
    "pasted check sees the later sequence": lambda n: n.update(pasted=[4.9e-4, 9.8e-4]),
    # the custom loss divided by num_items_in_batch: the fixed run's number
    "custom loss fails the accumulation": lambda n: trap(n, TRAPS[0], 0, status="ok", value=1.2e-7),
    # LoRA with task_type="SEQ_CLS": the head trains
    "LoRA without SEQ_CLS fails": lambda n: trap(n, TRAPS[1], 0, status="ok", value=1),
    # Qwen2 with use_cache=False: the fixed run's count
    "Qwen2 with use_cache=True runs": lambda n: trap(n, CACHE, 0, value=0),
    # an all-or-nothing reward that one group of four earns once: 3 of 4 groups equal, a warn
    "all-or-nothing reward leaves every": lambda n: trap(n, GROUPS, 0, status="warn", value=0.75),
    # a fix that kept padding_free=True: the trap's packing finding and exit code
    "fixed trainer's check-up exits 0": lambda n: (n.update(fixed_exit_code=1), n["fixed"].update(packing="fail")),
    # the pasted check on the trap's trainer (a fix that kept padding_free=True)
    "pasted check finds no packed row": lambda n: n.update(pasted_fixed=[5.2e-4, 0.61]),
    # a fix that kept fp16 weights: the trap's finding
    "float32 weights pass fp16_adamw": lambda n: trap(n, FP16, 1, status="fail", decided="measured", value=36),
    # the mean loss again: the trap's number
    "divided by num_items_in_batch passes": lambda n: trap(n, TRAPS[0], 1, status="fail", value=2.9),
    # task_type left out: the trap's finding
    "task_type='SEQ_CLS' passes": lambda n: trap(n, TRAPS[1], 1, status="fail", value=0),
    # use_cache left True: the trap's count
    "use_cache=False: no right-padded forward": lambda n: trap(n, CACHE, 1, value=2),
    # the all-or-nothing reward again: the trap's finding
    "reward that differs within groups passes": lambda n: trap(n, GROUPS, 1, status="fail", value=1),
    # a training step at learning_rate=0: AdamW's state fills, the weights stay as they were
    "one training step changes the weights": lambda n: n["changed"]["training step"].remove("weights and buffers"),
    # the check-up at 10f24a0, whose untouched() did not restore model.config
    "check-up changed no part of the trainer": lambda n: n["changed"].update({"check-up": ["model config"]}),
}


def gpu_shape(numbers: dict, sizes: dict) -> dict:
    """The gpu profile has the cpu profile's sizes (rows, batches, accumulation, groups): the same shape."""
    assert {k: sizes[k] for k in ("rows", "batch_size", "accumulation", "packed_batch_size", "grpo_batch_size")} == {
        "rows": 16,
        "batch_size": 2,
        "accumulation": 4,
        "packed_batch_size": 4,
        "grpo_batch_size": 16,
    }
    return numbers
