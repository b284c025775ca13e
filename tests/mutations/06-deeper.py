"""Lesson 06, deeper: how a run without the bug, or without the fix, changes the numbers, one mutation per check
(the part of the check's name it matches -> a change of the numbers such a run could produce; the comment names
the real run it stands for).

The gpu profile runs the same tiny trainers, recipes and sizes on a GPU (the command line's recipes keep
`use_cpu` only on the cpu profile). Each threshold, argued for that profile:
- "gradient error > 1e-3" / "<= 1e-3" (accumulation): the probe's own fp32 tolerance; the models stay fp32 on the
  GPU (examples.config_kwargs sets bf16=False). The listed-arguments model's error, 0.2 on the cpu run, is the
  reweighting of micro-batches of unequal label counts, the same data on any device; the keyword model's 1.2e-7
  is fp32 rounding, orders of magnitude below 1e-3 on any device.
- the statuses, exit codes, counts and the table's ids: verdicts of the probes and the matcher, the same at any
  size and on any device.
"""

CLEAN = {"returncode": 0, "statuses": {"packing": "skipped", "accumulation": "ok", "fp16_adamw": "ok"}}
TRAP = {"returncode": 1, "statuses": {"packing": "fail", "accumulation": "ok", "fp16_adamw": "ok"}}


def accepted(n: dict) -> None:
    """A class that declares accepts_loss_kwargs = True (transformers reads it before the signature): the Trainer
    hands num_items_in_batch on, and the probe measures the keyword model's error."""
    n["accepts"]["ListedArgumentsLlama"] = True
    n["found"]["accumulation, ListedArgumentsLlama"].update(status="ok", value=1.2e-7)


MUTATIONS = {
    # the recipe with padding_free: false (the fixed command's numbers)
    "checkup sft fails the OPT padding-free recipe": lambda n: n["cli"].update({"padding_free: true": CLEAN}),
    # a recipe TRL accepts (per_device_train_batch_size: 4, tests/test_checkup_cli.py): no config fail, exit 0
    "reports GRPOConfig's refusal": lambda n: (
        n.update(grpo_finding=["equal_rewards", "ok", "measured", ""]),
        n["cli"]["grpo, 3 completions, groups of 4"].update(returncode=0),
    ),
    # max_length longer than the prompts: the fixed run's finding
    "labels cut away": lambda n: n["found"]["labels, cut"].update(status="ok", value=0),
    # a pad token of its own: the fixed run's finding
    "pad == eos with the language-modeling": lambda n: n["found"]["eos, pad == eos"].update(status="ok", value=8),
    ("sets model_accepts_loss_kwargs=False", "accumulation probe fails it"): accepted,
    # OPT on FlashAttention-2 with position_ids (docs/checkup.md: the kernel reads sequence boundaries): Llama's number
    "OPT padding-free fails": lambda n: n["families"]["opt"].update(status="ok", value=3.6e-7),
    # the report's versions stated as transformers 4.53.0 and trl 0.18.0: both windows closed, nothing matches
    "the table names the Qwen2": lambda n: n["table"].update({"the report's versions": []}),
    # a fix that kept padding_free: true: the trap's command
    "padding_free: false exits 0": lambda n: n["cli"].update({"padding_free: false": TRAP}),
    # max_length still at the shortest prompt: the trap's finding
    "longer than the prompts passes": lambda n: n["found"]["labels, long enough"].update(status="fail", value=2),
    # pad == eos kept: the trap's finding
    "a pad token of its own passes": lambda n: n["found"]["eos, own pad"].update(status="fail", value=0),
    # input embeddings without requires_grad (the old lesson's disable_input_require_grads: 8 of 8 without a gradient)
    "in either order, gets every gradient": lambda n: n["found"]["gradients, LoRA, then checkpointing"].update(
        status="fail", value=8
    ),
    # the keyword model's accumulation at the listed-arguments model's number (its forward lost **kwargs)
    "a forward with **kwargs passes": lambda n: n["found"]["accumulation, KeywordsLlama"].update(
        status="fail", value=0.2
    ),
    # TRL 0.21's padding-free batches on sdpa (all-ones mask, no position_ids): 0.205 in that version (docs/checkup.md)
    "Llama and Qwen2 padding-free pass": lambda n: n["families"]["llama"].update(status="fail", value=0.205),
    # TRL 0.17's DPO, which kept the cache (lesson 04's version; docs/checkup.md: 4 cached right-padded forwards)
    "DPO builds no cache": lambda n: n["dpo"].update(value=4),
    # lesson 04's installed versions (transformers 4.51.3): the Qwen2 window matches
    "installed versions match no": lambda n: n["table"].update(
        {"installed versions": ["04-qwen2-fa2-right-padding-4.49"]}
    ),
}


def gpu_shape(numbers: dict, sizes: dict) -> dict:
    """The gpu profile has the cpu profile's sizes (rows, batches, accumulation): the same shape."""
    assert {k: sizes[k] for k in ("rows", "batch_size", "accumulation", "packed_batch_size")} == {
        "rows": 16,
        "batch_size": 2,
        "accumulation": 4,
        "packed_batch_size": 4,
    }
    return numbers
