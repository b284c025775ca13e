"""Each recipe's broken twins: the adapted recipe with the one change that breaks what a probe checks, as users have
broken it (the bug each stands for is in ``TWINS``). A twin runs in one process and is caught when its probe says
``expect`` (``fail``; ``warn`` for the probes that only warn).

Which twins a recipe has (``applicable``): those whose change means something for it on today's stack (TRL 1.16,
transformers 5.23). Probes whose failure lives only in old releases (``padding_cache``: transformers 4.37-4.41 and
4.49-4.52, plus the few families and TRL forwards its known-bugs entries name; ``prompt_in_loss``: trl 0.19-0.27
on transformers 5) are tested in their eras (tests/test_checkup_eras.py), not here; so is ``eos_label``, whose trap
TRL 1.16 closes for every format the zoo's recipes use (it appends EOS to every non-conversational row, and a chat
template ends conversational ones).

Most twins change the recipe's config, data or template; two need what no config reaches, a change to the built
trainer (``HOOKS``, applied by ``hooked.py`` between building and checking): a ``compute_loss`` override that
drops ``num_items_in_batch``, and a LoRA adapter loaded frozen.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import families

# the largest learning rate at which a bfloat16 full fine-tune under a plain launch is broken, measured
# (benchmarks/bf16_updates.py: at 2e-5 70% of the parameters never moved and the run lost 59% of the float32 run's
# improvement; at 1e-4, 12% and 15%: a run that still trains, which the probe warns of)
STALLED_LR = 2e-5


@dataclass(frozen=True)
class Twin:
    probe: str
    expect: str  # the status that catches it
    bug: str  # what users did, and where it was reported


TWINS = {
    "turn_end": Twin(
        "turn_end",
        "fail",
        "assistant_only_loss with a chat template whose {% generation %} block leaves the turn end out (TRL PR #5988: "
        "GLM's template; #7230: a QLoRA run lost to it)",
    ),
    "stalled_update": Twin(
        "stalled_update",
        "fail",
        "bfloat16 weights (dtype: bfloat16) fully fine-tuned under a plain launch (one process or DDP), where AdamW "
        "steps the bfloat16 tensors themselves at the recipe's learning rate",
    ),
    "fp16_adamw": Twin(
        "fp16_adamw",
        "fail",
        "float16 weights (dtype: float16) with the non-fused AdamW (optim: adamw_torch): eps and small squared "
        "gradients round to 0 in its float16 state (lesson 03, TRL #2367)",
    ),
    "reward_head": Twin(
        "reward_head",
        "fail",
        "a LoRA reward model without a task type (lora_task_type: null): PEFT wraps it as a plain model, so the score "
        "head stays random, frozen and unsaved (lesson 03)",
    ),
    "equal_rewards": Twin(
        "equal_rewards",
        "fail",
        "a reward that ignores the completion (TRL #3857): every group's rewards equal, every advantage 0",
    ),
    "identical_pairs": Twin(
        "identical_pairs",
        "fail",
        "a max_length that cuts every pair inside its shared prompt: chosen and rejected identical, DPO learns nothing",
    ),
    "accumulation": Twin(
        "accumulation",
        "fail",
        "a compute_loss override that does not pass num_items_in_batch on (lesson 02, TRL #2175): each micro-batch's "
        "loss is a mean over its own tokens, not over the window's",
    ),
    "accumulation_sft_term": Twin(
        "accumulation",
        "fail",
        "DPO with loss_type [sigmoid, sft] and accumulation: TRL 1.16 averages the sft term over each micro-batch's "
        "chosen tokens",
    ),
    "gradients_reach": Twin(
        "gradients_reach",
        "fail",
        "a LoRA adapter loaded for inference (PeftModel.from_pretrained without is_trainable=True, TRL #3926): every "
        "adapter tensor frozen, the optimizer updates nothing",
    ),
    "gspo_loss": Twin(
        "gspo_loss",
        "warn",
        "GSPO's sequence-level importance sampling with a loss that sums tokens (loss_type: dapo, GRPOConfig's "
        "default; TRL #3823)",
    ),
}


def _full(recipe: dict) -> bool:
    settings = recipe["settings"] or {}
    return not settings.get("use_peft")


def _conversational(recipe: dict) -> bool:
    return recipe["data"] in ("messages", "prompt-completion-conversational")


def _lr(recipe: dict) -> float:
    return float((recipe["settings"] or {}).get("learning_rate", 5e-5))  # TrainingArguments' default


def applicable(recipe: dict) -> list[str]:
    """The twins recipe ``recipe`` has (keys of ``TWINS``)."""
    kind, settings = recipe["kind"], recipe["settings"] or {}
    found = []
    if kind == "sft" and _conversational(recipe):
        found.append("turn_end")
    if _full(recipe) and _lr(recipe) <= STALLED_LR:
        found.append("stalled_update")
    if _full(recipe) and kind in ("sft", "dpo", "reward", "kto"):
        found.append("fp16_adamw")
    if kind == "reward" and settings.get("use_peft"):
        found.append("reward_head")
    if kind == "grpo":
        found.append("equal_rewards")
    if kind == "grpo" and settings.get("importance_sampling_level") == "sequence":
        found.append("gspo_loss")
    # a mean per micro-batch weighs tokens as the window's token sum does when the micro-batches hold as many label
    # tokens: the accumulation twins need small unpacked micro-batches (at 8 pairs a micro-batch, zephyr-7b-beta-dpo-
    # full's sft term was 0.029 off, under the probe's 0.05; packed rows hold about max_length tokens each)
    small = int(settings.get("per_device_train_batch_size", 8)) <= 2 and not settings.get("packing")
    accumulates = int(settings.get("gradient_accumulation_steps", 1)) > 1
    if kind == "dpo":
        found += ["identical_pairs"] + (["accumulation_sft_term"] if small and accumulates else [])
    if kind == "sft" and small and accumulates:  # a reward loss is a mean over pairs: no token weights to get wrong
        found.append("accumulation")
    # not DPO, KTO or GRPO: their reference pass leaves PEFT's disable_adapter(), whose enable_adapters(True) calls
    # set_adapter(active_adapters) without inference mode, and that sets the active adapter trainable again (peft
    # 0.21.2 tuners/tuners_utils.py): a frozen adapter trains there from the first step (measured: KTO, 28 of 28 LoRA
    # tensors trainable again after the check-up's first forward), so that twin would not be broken
    if settings.get("use_peft") and kind in ("sft", "reward"):
        found.append("gradients_reach")
    return found


# -- the hooks: a change to the built trainer (hooked.py applies one before the check-up) ----------------------------
def own_compute_loss(trainer) -> None:
    """A user's ``compute_loss`` override that calls the trainer's without ``num_items_in_batch``. (Setting
    ``model_accepts_loss_kwargs = False``, lesson 02's other case, breaks the same arithmetic on TRL 1.16's
    SFTTrainer: transformers 5.23 then counts no ``num_items_in_batch`` (trainer.py, ``_get_num_items_in_batch``),
    so the SFTTrainer's ``compute_loss`` divides by the micro-batch's own tokens (sft_trainer.py, "num_tokens =
    outputs.label_mask.sum() if num_items_in_batch is None else num_items_in_batch") and ``training_step`` divides
    that by the accumulation steps.)"""
    compute = trainer.compute_loss

    def compute_loss(model, inputs, return_outputs=False, num_items_in_batch=None):
        return compute(model, inputs, return_outputs=return_outputs)

    trainer.compute_loss = compute_loss


def frozen_adapter(trainer) -> None:
    """What ``PeftModel.from_pretrained`` without ``is_trainable=True`` leaves: the adapter's config in inference
    mode and its tensors frozen."""
    for config in trainer.model.peft_config.values():
        config.inference_mode = True
    for parameter in trainer.model.parameters():  # the adapter and its saved modules (a reward model's score head)
        parameter.requires_grad_(False)


HOOKS = {"own_compute_loss": own_compute_loss, "frozen_adapter": frozen_adapter}


# -- the turn end outside the generation block ------------------------------------------------------------------------
CHATML_TRAINING = (
    "{% for message in messages %}{% if message['role'] == 'assistant' %}{{ '<|im_start|>assistant\\n' }}"
    "{% generation %}{{ message['content'] + '<|im_end|>' }}{% endgeneration %}{{ '\\n' }}{% else %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
EOS_TRAINING = (  # the alignment-handbook's zephyr template, generation-tagged: every turn ends with EOS
    "{% for message in messages %}{{ '<|' + message['role'] + '|>\\n' }}{% if message['role'] == 'assistant' %}"
    "{% generation %}{{ message['content'] + eos_token }}{% endgeneration %}{% else %}"
    "{{ message['content'] + eos_token }}{% endif %}{{ '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
)
BLOCK = re.compile(r"(\{%-?\s*generation\s*-?%\})(.*?)(\{%-?\s*endgeneration\s*-?%\})", re.DOTALL)


def training_template(tokenizer) -> str:
    """A generation-tagged form of the tokenizer's template: its own when tagged, TRL's training variant where TRL
    has one, else ChatML's or the EOS-ended (zephyr) layout the template uses."""
    from trl.chat_template_utils import get_training_chat_template, has_generation_markers

    template = tokenizer.chat_template
    if has_generation_markers(template):
        return template
    try:
        patched = get_training_chat_template(tokenizer)
    except ValueError:  # TRL has no training variant of this template (trl 1.16 raises rather than return None)
        patched = None
    if patched is not None:
        return patched
    return CHATML_TRAINING if "<|im_end|>" in template else EOS_TRAINING


def turn_end_outside(template: str, stops: list[str]) -> str:
    """``template`` with every token that ends an assistant turn (``stops``: the template's turn end and EOS, as a
    string or as the ``eos_token`` variable) moved out of each ``{% generation %}`` block, just after it, in the order
    the block wrote them: the answers are still trained, no token that ends them is."""

    def move(match: re.Match) -> str:
        body, moved = match.group(2), []
        for stop in sorted(stops, key=lambda t: body.find(t) if t in body else len(body)):
            if stop == "eos_token" and re.search(r"\+\s*eos_token", body):
                body = re.sub(r"\s*\+\s*eos_token", "", body)
                moved.append("{{ eos_token }}")
            elif stop != "eos_token" and stop in body:
                body = body.replace(stop, "")
                moved.append("{{ '" + stop + "' }}")
        return match.group(1) + body + match.group(3) + "".join(moved)

    moved, count = BLOCK.subn(move, template)
    if count == 0 or moved == template:
        raise ValueError("no generation block holds a turn end")
    return moved


def stop_strings(tokenizer, template: str) -> list[str]:
    """What may end an assistant turn the template writes: the first special token after its content, and EOS (as
    the template writes it: the token, or the ``eos_token`` variable)."""
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "q"}, {"role": "assistant", "content": "ANSWER"}],
        chat_template=template,
        tokenize=False,
    )
    tail = text[text.index("ANSWER") + len("ANSWER") :]
    special = [t for t in tokenizer.all_special_tokens + list(tokenizer.get_added_vocab()) if t and t in tail]
    found = [min(special, key=tail.find)] if special else []
    eos = tokenizer.eos_token
    found += ["eos_token"] if "eos_token" in template else [eos] if eos and eos in tail and eos not in found else []
    return found


PREFACE = (
    "Thank you for the question, which is a good one and deserves a careful answer, so here is what the record says "
    "about it, told in full and with every detail that matters to it."
)


def shared_preface(adapted, recipe: dict) -> int:
    """Give every pair's two answers the same opening sentence (preference data often does: "Thank you for the
    question...") and return a max_length that ends inside it for every row: the longest prompt plus 8 tokens. TRL
    1.16's DPOTrainer drops a row whose prompt alone fills max_length, so the cut must fall in the completions."""
    import json

    from transformers import AutoTokenizer

    path = adapted.folder / "data" / "train.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    tokenizer = AutoTokenizer.from_pretrained(adapted.config["model_name_or_path"])
    longest = 0
    for row in rows:
        for side in ("chosen", "rejected"):
            if isinstance(row[side], list):
                row[side][-1]["content"] = PREFACE + " " + row[side][-1]["content"]
            else:
                row[side] = " " + PREFACE + row[side]
        prompt = row["prompt"] if "prompt" in row else row["chosen"][:-1]
        if isinstance(prompt, list):
            ids = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True, return_dict=False)
        else:
            ids = tokenizer(prompt)["input_ids"]
        longest = max(longest, len(ids))
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return longest + 8


def apply(adapted, name: str, recipe: dict) -> None:
    """Turn ``adapted`` (an adapted recipe, before it is written) into its ``name`` twin: one process, one change."""
    from transformers import AutoTokenizer

    twin = TWINS[name]
    config, changes = adapted.config, adapted.changes
    adapted.twin = name
    adapted.launch = {"engine": "single", "processes": 1}
    for key in ("fsdp", "fsdp_config"):  # FSDP set in TrainingArguments needs several processes
        if config.get(key):
            from adapt import Change

            changes.append(Change(key, config.pop(key), None, "twin", "a twin runs in one process"))

    def change(key, after, note=twin.bug):
        from adapt import Change

        changes.append(Change(key, config.get(key), after, "twin", note))
        config[key] = after

    if name == "turn_end":
        tokenizer = AutoTokenizer.from_pretrained(config["model_name_or_path"])
        template = training_template(tokenizer)
        bad = turn_end_outside(template, stop_strings(tokenizer, template))
        built = families.build(adapted.family, recipe["model"], bad, Path(config["model_name_or_path"]).parent)
        change("model_name_or_path", str(built.folder), "the tiny model with the turn end outside {% generation %}")
        change("assistant_only_loss", True)
        if config.get("completion_only_loss"):
            change("completion_only_loss", False)
    elif name == "stalled_update":
        change("dtype", "bfloat16")
    elif name == "fp16_adamw":
        change("dtype", "float16")
        change("optim", "adamw_torch")
        for key in ("bf16", "fp16"):
            if config.get(key):
                change(key, False, "no autocast: the weights themselves are float16")
    elif name == "reward_head":
        change("lora_task_type", None)
    elif name == "equal_rewards":
        change("reward_funcs", ["zoo_rewards.constant"])
        config.pop("reward_weights", None)
    elif name == "gspo_loss":
        change("loss_type", "dapo")
    elif name == "identical_pairs":
        change("max_length", shared_preface(adapted, recipe), "max_length ends inside the answers' shared preface")
    elif name == "accumulation_sft_term":
        change("loss_type", ["sigmoid", "sft"])
    elif name == "accumulation":
        adapted.hook = "own_compute_loss"
    elif name == "gradients_reach":
        adapted.hook = "frozen_adapter"
    else:
        raise ValueError(f"unknown twin {name!r}: one of {', '.join(TWINS)}")
