"""Lesson 04: how a run without the bug, or without the fix, changes the numbers, one mutation per check
(the part of the check's name it matches -> a change of the numbers such a run could produce)."""

import math  # noqa: F401

from mutation_helpers import set_all  # noqa: F401


def _04_era(era: str, group: str, name: str, **change):
    """Lesson 04: change one outcome an era script recorded (``numbers["then"][era][group][name]``)."""
    return lambda n: n["then"][era][group][name].update(**change)


MUTATIONS = {
    "has right-padded forwards": lambda n: n["audits"]["1"]["policy"]["eval"].update(right_padded=0),
    "the reference model runs its own DPO forwards": lambda n: n["audits"]["2"].pop("reference"),
    "no DPO forward of the policy or the reference model built": lambda n: n["audits"]["2"]["reference"][
        "eval"].update(cache_built=1),
    "use_cache=False from _compute_loss": lambda n: n["audits"]["1"]["reference"]["eval"].update(
        asked={"use_cache=None from dpo_trainer.py:_compute_loss": 1}),
    "right-padded batched generation differs": lambda n: n["changed_outputs"].update(right=0),
    "right padding shifts the first-token": lambda n: n["smollm2_first_token_logit_shift"].update(right=0.0),
    "padding_free is temporarily unavailable": lambda n: n["padding_free"].update(warnings=[]),
    "even with a left-padding tokenizer": lambda n: n.update(dpo_ignores_padding_side=False),
    "scoring differences below": lambda n: n["scoring"]["fp32"].update(right=1e-3),
    "left-padded batched generation equals": lambda n: n["changed_outputs"].update(left=1),
    "SmolLM2: left-padded generation": lambda n: n["smollm2_changed_outputs"].update(left=1),
    "raises the padding_side='right' ValueError": _04_era("4.51", "scenarios", "as_reported", error=None),
    "a left-padding tokenizer does not avoid it": _04_era("4.51", "scenarios", "tokenizer_left", passed_guard=True),
    "use_cache=False gets past the check": _04_era("4.51", "scenarios", "use_cache_false", passed_guard=False),
    "raises it from Qwen2Model.forward": _04_era("4.40", "direct_forward", "right", passed_guard=True),
    "use_cache=False or left padding gets past": _04_era("4.40", "direct_forward", "left", passed_guard=False),
    "DPOTrainer.evaluate() gets past the check": _04_era("4.40", "scenarios", "as_reported", passed_guard=False),
    "eval batch 2 pads every batch on the right": lambda n: n["sft_eval"]["2"].update(right_padded=0),
    "hands attention a padding mask": lambda n: n["sft_eval"]["2"].update(mask_to_attention=0),
    "vanish in fp32": lambda n: n["scoring"].update(bf16=dict(n["scoring"]["fp32"])),
    "within 2x bf16's own rounding error": lambda n: n.update(bf16_error=max(n["scoring"]["bf16"].values()) / 3),
    "SFTTrainer builds no cache in evaluation": lambda n: n["sft_eval"]["2"].update(cache_built=1),
    "matches the one predicted from rows scored alone": lambda n: n["sft_eval_gap"].update({"2": 1e-3}),
}
