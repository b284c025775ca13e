"""Lesson 06: how a run without the bug, or without the fix, changes the numbers, one mutation per check
(the part of the check's name it matches -> a change of the numbers such a run could produce)."""

import math  # noqa: F401

from mutation_helpers import set_all  # noqa: F401


MUTATIONS = {
    "custom compute_loss fails the accumulation probe": lambda n: n["findings"]["symptom"].update(
        status="ok", value=1e-7),
    "model_accepts_loss_kwargs=False (set by hand) fails it too": lambda n: n["findings"]["old path"].update(
        status="ok"),
    "OPT padding-free fails the packing probe": lambda n: n["packing"]["opt"].update(status="ok", value=1e-6),
    "fp16 weights with adamw_torch": lambda n: n["findings"]["fp16 adamw"].update(status="warn"),
    "without SEQ_CLS fails the reward_head": lambda n: n["reward"]["no task_type"].update(status="ok"),
    "runs right-padded forwards with a cache": lambda n: n["cache"]["qwen2, use_cache=True"].update(value=0),
    "all-or-nothing reward leaves every group equal": lambda n: n["groups"]["all or nothing"].update(
        status="warn", value=0.75),
    "fail labels_present": lambda n: n["findings"]["labels"].update(status="ok"),
    "leaves no EOS target": lambda n: n["findings"]["eos"].update(status="ok"),
    "leaves tensors without a gradient": lambda n: n["findings"]["gradients"].update(status="ok"),
    "command line fails the OPT padding-free recipe": lambda n: n["command"].update(returncode=0),
    "divided by num_items_in_batch passes": lambda n: n["findings"]["fixed"].update(status="fail", value=0.3),
    "Llama padding-free passes": lambda n: n["packing"]["llama"].update(status="fail", value=0.1),
    "with SEQ_CLS passes the reward_head": lambda n: n["reward"]["SEQ_CLS"].update(status="fail"),
    "TRL's DPO builds no cache": lambda n: n["cache"]["dpo"].update(value=2),
    "differs within groups passes": lambda n: n["groups"]["length"].update(status="fail"),
    "healthy SFTTrainer has no warn or fail": lambda n: n["healthy"].update(accumulation="fail"),
    "byte for byte as it was": lambda n: n.update(untouched=False),
    "fixed recipe passes on the command line": lambda n: n["fixed_command"].update(returncode=1),
}
