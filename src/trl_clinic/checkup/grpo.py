"""Probe 5 (lesson 05): GRPO groups whose rewards are all equal.

A group whose completions all get the same reward has advantage 0 everywhere: it teaches nothing. GRPO's
batch rules are not a probe here: TRL validates them itself (``GRPOConfig.__post_init__``), so a built
trainer always passes them, and ``trl-clinic checkup grpo`` reports a config TRL refuses as the
``grpo_config`` fail with TRL's message (``command.py``).
"""

from __future__ import annotations

import inspect
import re
import sys
import traceback

import torch
from torch import nn

from trl_clinic.checkup.engine import Skip, probe
from trl_clinic.checkup.view import TrainerView
from trl_clinic.probes.finding import Finding

MAX_PROMPTS = 4  # prompts generated for, each num_generations times (at most one generation batch)
MAX_NEW_TOKENS = 32  # only where the config has no max_completion_length (TRL < 0.16's fallback path)


def _grpo(view: TrainerView) -> None:
    if view.kind != "grpo":
        raise Skip(f"not a GRPO trainer ({view.kind})")


def _prompt_text(view: TrainerView, prompt) -> str:
    if isinstance(prompt, str):
        return prompt
    return view.tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=False)


def _takes(function, name: str) -> bool:
    """Whether a reward function accepts ``name``: TRL passes ``completion_ids`` from some version between 0.17.0 and
    0.21.0 on (read in both wheels' ``grpo_trainer.py``), and a function written for trl 0.14.0 (``prompts,
    completions``) would fail on it here although its own trainer never passes it."""
    try:
        parameters = inspect.signature(function).parameters.values()
    except (TypeError, ValueError):  # a builtin or C callable without a signature: pass only what every version does
        return False
    return any(p.name == name or p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters)


def refused_keyword(error: BaseException, trainer: object) -> str | None:
    """The keyword a reward function refused, where ``error`` is the TypeError of the call itself: raised in the
    frame that calls the function (the trainer's classes, TRL's ``grpo_trainer.py``, or ``group_rewards`` here),
    not inside the function's body. On today's TRL a reward written ``(prompts, completions)`` refuses
    ``completion_ids``, and the trainer's first step raises the same."""
    named = re.search(r"unexpected keyword argument '(\w+)'", str(error))
    if not isinstance(error, TypeError) or not named or not error.__traceback__:
        return None
    callers = {__file__} | {getattr(sys.modules.get(c.__module__), "__file__", None) for c in type(trainer).__mro__}
    return named.group(1) if traceback.extract_tb(error.__traceback__)[-1].filename in callers else None


def _prompt_inputs(view: TrainerView, rows: list[dict]) -> dict[str, torch.Tensor]:
    """The ids and mask the trainer generates from for ``rows``, built as the first GRPOTrainer's ``compute_loss``
    builds them (compared with it in its era by tests/test_checkup_eras.py): padded left, no special tokens added,
    since a chat template writes its own BOS and a tokenizer adding one more (Llama 3's) would sample from a prompt
    the trainer never sees, then cut to the last ``max_prompt_length`` tokens. No token_type_ids: some models'
    generate refuses them."""
    tokenizer = view.tokenizer
    texts = [_prompt_text(view, row["prompt"]) for row in rows]
    side, tokenizer.padding_side = tokenizer.padding_side, "left"
    try:
        encoded = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    finally:
        tokenizer.padding_side = side
    limit = getattr(view.args, "max_prompt_length", None)
    kept = slice(-limit, None) if limit else slice(None)
    return {key: encoded[key][:, kept].to(view.device) for key in ("input_ids", "attention_mask")}


@torch.no_grad()
def group_rewards(view: TrainerView) -> list[list[float]]:
    """Rewards of ``num_generations`` sampled completions for each of the first prompts, from the
    trainer's own reward functions and weights, sampled with its temperature from the prompt ids it builds."""
    trainer, args, tokenizer = view.trainer, view.args, view.tokenizer
    if any(isinstance(f, nn.Module) for f in trainer.reward_funcs):
        raise Skip("a reward model is among the reward functions: only reward functions are called here")
    rows = view.grpo_prompts(MAX_PROMPTS)
    inputs = _prompt_inputs(view, rows)
    view.model.eval()
    out = view.model.generate(
        **inputs,
        do_sample=True,
        temperature=args.temperature,
        top_p=getattr(args, "top_p", 1.0),  # trl 0.14.0 has no top_p: its GenerationConfig keeps the default, 1.0
        max_new_tokens=args.max_completion_length or MAX_NEW_TOKENS,
        num_return_sequences=args.num_generations,
        pad_token_id=tokenizer.pad_token_id,
    )
    ids = out[:, inputs["input_ids"].shape[1] :]
    completions = tokenizer.batch_decode(ids, skip_special_tokens=True)
    if not isinstance(rows[0]["prompt"], str):  # conversational: completions as TRL passes them, as messages
        completions = [[{"role": "assistant", "content": text}] for text in completions]
    repeat = [row for row in rows for _ in range(args.num_generations)]
    columns = {key: [row[key] for row in repeat] for key in rows[0] if key != "prompt"}
    # trl 0.14.0 has no reward_weights: it sums the rewards (grpo_trainer.py:498)
    weights = getattr(args, "reward_weights", None) or [1.0] * len(trainer.reward_funcs)
    total = torch.zeros(len(completions))
    for weight, function in zip(weights, trainer.reward_funcs):
        extra = {"completion_ids": ids.tolist()} if _takes(function, "completion_ids") else {}
        scores = function(prompts=[r["prompt"] for r in repeat], completions=completions, **extra, **columns)
        total += weight * torch.tensor([float("nan") if s is None else s for s in scores])
    return total.view(len(rows), args.num_generations).tolist()


def generated(trainer, rows: list[dict]) -> dict:
    """TRL's own ``_generate_and_score_completions`` on ``rows`` (TRL >= 0.16). Under ZeRO-3 the check-up has gathered
    the weights already (``checkup.sharded.gathered``), and TRL's own gather for generation
    (``unwrap_model_for_generation``, ``ds3_gather_for_generation``) would nest inside it, which DeepSpeed refuses
    ("Nested GatheredParameters contexts cannot overlap parameters"): TRL is told not to gather while it runs here, and
    the setting is put back."""
    settings = vars(trainer.args)  # past a frozen TrainingArguments' __setattr__, as checkup.step.window writes
    own = settings.get("ds3_gather_for_generation")
    if own is not None:
        settings["ds3_gather_for_generation"] = False
    try:
        return trainer._generate_and_score_completions(rows)
    finally:
        if own is not None:
            settings["ds3_gather_for_generation"] = own


def trl_groups(view: TrainerView) -> tuple[list[bool], float | None]:
    """Whether each group's completions got equal rewards, and the share of completions cut at
    ``max_completion_length``, from one call of TRL's own ``_generate_and_score_completions`` (TRL >= 0.16)
    on the first ``MAX_PROMPTS`` prompts, each ``num_generations`` times as GRPO's sampler repeats them: TRL's
    generation (the user's ``max_completion_length``, sampling settings, chat template) and TRL's reward calls
    (conversational
    completions as messages, reward models, the extra keyword arguments). A group teaches nothing when all its
    advantages are 0 (TRL zeroes a group with equal rewards)."""
    from trl_clinic.checkup.step import window

    trainer, args = view.trainer, view.args
    generations = args.num_generations
    prompts = view.samples(min(MAX_PROMPTS, len(view.rows)))
    rows = [row for row in prompts for _ in range(generations)]
    view.model.train()  # the mode the training loop generates in
    with window(trainer, args.gradient_accumulation_steps):
        output = generated(trainer, rows)
    groups = output["advantages"].detach().reshape(-1, generations)
    equal = (groups.abs().amax(dim=1) == 0).tolist()
    clipped = trainer._metrics["train"].get("completions/clipped_ratio") or [None]
    return equal, clipped[-1]


@probe(
    "equal_rewards",
    "05",
    "GRPO groups whose completions all get the same reward: their advantages are 0, so "
    "they teach nothing (a 0/1 reward a weak policy never earns, a reward that ignores the completion).",
)
def equal_rewards(view: TrainerView) -> Finding:
    _grpo(view)
    clipped = None
    try:
        if hasattr(view.trainer, "_generate_and_score_completions"):
            flags, clipped = trl_groups(view)
        else:
            flags = [max(g) - min(g) < 1e-8 for g in group_rewards(view)]
    except TypeError as error:
        keyword = refused_keyword(error, view.trainer)
        if keyword is None:
            raise
        return Finding(
            "equal_rewards",
            "fail",
            f"the trainer's call of its reward functions raised: {error}",
            decided="measured",
            fix=f"give the reward function **kwargs (def reward(prompts, completions, **kwargs)): the trainer passes "
            f"{keyword} and the dataset's other columns by keyword, and its first step raises the same",
        )
    equal, groups = sum(flags), len(flags)
    share = equal / groups
    limit = getattr(view.args, "max_completion_length", None)
    measured = f"{equal} of {groups} groups with equal rewards (completions up to {limit} tokens" + (
        f", {clipped:.0%} cut at that limit)" if clipped is not None else ")"
    )
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
