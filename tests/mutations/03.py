"""Lesson 03: how a run without the bug, or without the fix, changes the numbers, one mutation per check
(the part of the check's name it matches -> a change of the numbers such a run could produce)."""

import math  # noqa: F401

from mutation_helpers import set_all  # noqa: F401


MUTATIONS = {
    "non-finite raw loss": lambda n: n.update(report_raw_loss=[1.0] * len(n["report_raw_loss"])),
    "huge finite number": lambda n: n["report_logged_loss"].__setitem__(0, 0.7),
    "exactly 0 after the blow-up": lambda n: n.update(report_logged_loss=[n["report_logged_loss"][0]]
                                                      + [0.5] * (len(n["report_logged_loss"]) - 1)),
    "grad norm is NaN": lambda n: n.update(report_logged_grad_norm=[1.0] * len(n["report_logged_grad_norm"])),
    "eval accuracy is 0": lambda n: n["eval_accuracy"].update({"fp16 weights (report)": 0.5}),
    "first bad tensor is the fp16 score head": lambda n: n.update(first_nonfinite_where="gradient"),
    "exactly those whose Adam second moment": lambda n: n.update(inf_weights_are_underflowed=False),
    "threshold separates": lambda n: n.update(largest_underflowed_gradient=2 * n["underflow_threshold"]),
    "spread to every trainable tensor": lambda n: n.update(poisoned_tensors=n["trainable_tensors"] - 1),
    "replay gives every logged number": lambda n: n["replayed_logs"].__setitem__(0, 2 * n["replayed_logs"][0]),
    "head is frozen and not saved": lambda n: n["heads"]["without SEQ_CLS"].update(head_trainable=True),
    "reload under another seed changes": lambda n: n["heads"]["without SEQ_CLS"].update(reload_max_reward_change=0.0),
    "legacy torch_dtype": lambda n: n["legacy_spellings"].update(
        {"{'torch_dtype': 'float16'}": "loads with weights in torch.float16"}),
    "'half' is rejected": lambda n: n["legacy_spellings"].update(
        {"{'dtype': 'half'}": "loads with weights in torch.float16"}),
    "dtype='auto' on an fp16 checkpoint": lambda n: n["legacy_spellings"].update(
        {"{'dtype': 'auto'}": "loads with weights in torch.float32"}),
    "fp16 breaks at every accumulation count": lambda n: n["fp16_by_accumulation"]["1"].update(
        first_nonfinite_step=None),
    "more accumulation inflates the first logged loss": lambda n: n["fp16_by_accumulation"]["32"].update(
        first_log=0.5),
    "fused AdamW keeps": lambda n: n["fused_adamw_raw_loss"].__setitem__(-1, math.nan),
    "default optimizer is the fused AdamW": lambda n: n.update(default_optim="adamw_torch"),
    "clipping turns a finite gradient NaN": lambda n: n.update(clip_spreads_nan=False),
    "gradient scaler refuses": lambda n: n.update(grad_scaler="unscaled"),
    "fp16=True does not rescue": lambda n: n.update(fp16_amp="trained", fp16_amp_raw_loss=[0.69, 0.68]),
    "fixed run finite": lambda n: n["fixed_raw_loss"].__setitem__(-1, math.inf),
    "fixed head is trained and saved": lambda n: n["heads"]["with SEQ_CLS"].update(score_saved=False),
    "fixed reload reproduces": lambda n: n["heads"]["with SEQ_CLS"].update(reload_max_reward_change=0.1),
}
