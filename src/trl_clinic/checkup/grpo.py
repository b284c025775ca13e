"""Probe 5 (lesson 05): GRPO groups whose rewards are all equal.

A group whose completions all get the same reward has advantage 0 everywhere: it teaches nothing. GRPO's
batch rules are not a probe here: TRL validates them itself (``GRPOConfig.__post_init__``), so a built
trainer always passes them, and ``trl-clinic checkup grpo`` reports a config TRL refuses as the
``grpo_config`` fail with TRL's message (``command.py``).
"""

from __future__ import annotations

import torch
from torch import nn

from trl_clinic.checkup.engine import Skip, probe
from trl_clinic.checkup.view import TrainerView
from trl_clinic.probes.finding import Finding

MAX_PROMPTS = 4
MAX_NEW_TOKENS = 32


def _grpo(view: TrainerView) -> None:
    if view.kind != "grpo":
        raise Skip(f"not a GRPO trainer ({view.kind})")


def _prompt_text(view: TrainerView, prompt) -> str:
    if isinstance(prompt, str):
        return prompt
    return view.tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=False)


@torch.no_grad()
def group_rewards(view: TrainerView) -> list[list[float]]:
    """Rewards of ``num_generations`` sampled completions for each of the first prompts, from the
    trainer's own reward functions and weights, sampled with its temperature."""
    trainer, args, tokenizer = view.trainer, view.args, view.tokenizer
    if any(isinstance(f, nn.Module) for f in trainer.reward_funcs):
        raise Skip("a reward model is among the reward functions: only reward functions are called here")
    rows = view.grpo_prompts(MAX_PROMPTS)
    prompts = [_prompt_text(view, row["prompt"]) for row in rows]
    side, tokenizer.padding_side = tokenizer.padding_side, "left"
    try:
        encoded = tokenizer(prompts, return_tensors="pt", padding=True)
        inputs = {key: encoded[key].to(view.device) for key in ("input_ids", "attention_mask")}  # no token_type_ids
    finally:
        tokenizer.padding_side = side
    view.model.eval()
    out = view.model.generate(
        **inputs,
        do_sample=True,
        temperature=args.temperature,
        top_p=args.top_p,
        max_new_tokens=min(args.max_completion_length or MAX_NEW_TOKENS, MAX_NEW_TOKENS),
        num_return_sequences=args.num_generations,
        pad_token_id=tokenizer.pad_token_id,
    )
    ids = out[:, inputs["input_ids"].shape[1] :]
    completions = tokenizer.batch_decode(ids, skip_special_tokens=True)
    repeat = [row for row in rows for _ in range(args.num_generations)]
    columns = {key: [row[key] for row in repeat] for key in rows[0] if key != "prompt"}
    weights = args.reward_weights or [1.0] * len(trainer.reward_funcs)
    total = torch.zeros(len(completions))
    for weight, function in zip(weights, trainer.reward_funcs):
        scores = function(
            prompts=[r["prompt"] for r in repeat], completions=completions, completion_ids=ids.tolist(), **columns
        )
        total += weight * torch.tensor([float("nan") if s is None else s for s in scores])
    return total.view(len(rows), args.num_generations).tolist()


@probe(
    "equal_rewards",
    "05",
    "GRPO groups whose completions all get the same reward: their advantages are 0, so "
    "they teach nothing (a 0/1 reward a weak policy never earns, a reward that ignores the completion).",
)
def equal_rewards(view: TrainerView) -> Finding:
    _grpo(view)
    groups = group_rewards(view)
    equal = sum(max(g) - min(g) < 1e-8 for g in groups)
    share = equal / len(groups)
    measured = f"{equal} of {len(groups)} groups with equal rewards"
    if share == 1:
        return Finding(
            "equal_rewards",
            "fail",
            measured,
            value=share,
            decided="measured",
            fix="every group has equal rewards, so no learning signal: give partial credit, warm the "
            "policy up with SFT, or raise num_generations/temperature",
        )
    if share >= 0.5:
        return Finding(
            "equal_rewards",
            "warn",
            measured,
            value=share,
            decided="measured",
            fix="most groups teach nothing: give partial credit or warm the policy up with SFT",
        )
    return Finding(
        "equal_rewards", "ok", measured, value=share, decided="measured", reason="most groups have a reward spread"
    )
