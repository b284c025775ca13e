"""Tiny real trainers to check: healthy ones, and ones carrying one lesson's trap each.

Built from local configs and the seeded synthetic data (``trl_clinic.course.models``, ``trl_clinic.course.data``),
so the check-up's tests and a lesson can show every probe trip and pass in seconds on a CPU. The
traps are real settings of today's libraries (``padding_free=True`` on OPT, ``optim="adamw_torch"``
with fp16 weights, ``model_accepts_loss_kwargs = False``...), nothing re-created.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from transformers import Trainer, TrainingArguments

from trl_clinic.course.data import category_reward, instruction_pairs, preference_pairs, reward_prompts
from trl_clinic.course.models import make_causal_lm, make_reward_model
from trl_clinic.course.runtime import cpu_flags, no_activation_checkpointing


def config_kwargs(out: str | Path, device: torch.device = torch.device("cpu"), **overrides) -> dict:  # noqa: B008 (immutable)
    """Arguments every example trainer shares: one step, no saving or reporting, fp32 on ``device``."""
    return {
        "output_dir": str(out),
        "report_to": "none",
        "per_device_train_batch_size": 2,
        "max_steps": 1,
        "save_strategy": "no",
        "seed": 0,
        "bf16": False,
        "disable_tqdm": True,
        **cpu_flags(device),
        **no_activation_checkpointing(),
        **overrides,
    }


def sft_trainer(tokenizer, out, *, family: str = "llama", rows: int = 16, model=None, peft_config=None, **config):
    from trl import SFTConfig, SFTTrainer

    model = model if model is not None else make_causal_lm(tokenizer, family)
    return SFTTrainer(
        model=model,
        args=SFTConfig(**config_kwargs(out, **config)),
        processing_class=tokenizer,
        train_dataset=instruction_pairs(rows, seed=0),
        peft_config=peft_config,
    )


def dpo_trainer(tokenizer, out, *, family: str = "llama", rows: int = 16, **config):
    from trl import DPOConfig, DPOTrainer

    # a model instance needs its reference given: the same seed builds the same starting weights
    return DPOTrainer(
        model=make_causal_lm(tokenizer, family),
        ref_model=make_causal_lm(tokenizer, family),
        args=DPOConfig(**config_kwargs(out, **config)),
        processing_class=tokenizer,
        train_dataset=preference_pairs(rows, seed=0),
    )


def reward_trainer(tokenizer, out, *, rows: int = 16, model=None, peft_config=None, **config):
    from trl import RewardConfig, RewardTrainer

    model = model if model is not None else make_reward_model(tokenizer)
    return RewardTrainer(
        model=model,
        args=RewardConfig(**config_kwargs(out, **config)),
        processing_class=tokenizer,
        train_dataset=preference_pairs(rows, seed=0),
        peft_config=peft_config,
    )


def grpo_trainer(tokenizer, out, *, rows: int = 16, reward=category_reward, **config):
    from trl import GRPOConfig, GRPOTrainer

    settings = {"num_generations": 4, "per_device_train_batch_size": 4, "max_completion_length": 8, **config}
    return GRPOTrainer(
        model=make_causal_lm(tokenizer),
        reward_funcs=reward,
        args=GRPOConfig(**config_kwargs(out, **settings)),
        processing_class=tokenizer,
        train_dataset=reward_prompts(rows, seed=0),
    )


def length_reward(completions: list[str], **kwargs) -> list[float]:
    """A reward that differs between the completions of one prompt, so no group is all-equal (a healthy
    signal for the equal_rewards probe; a random policy rarely earns ``all_in_category_reward``)."""
    return [float(len(c)) for c in completions]


class SumLossTrainer(Trainer):
    """A custom compute_loss as the Trainer expects it: the summed token loss divided by ``num_items_in_batch`` when
    the Trainer gives it (its mean-taking counterpart, a fault set on purpose, is ``stand_ins.MeanLossTrainer``)."""

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        labels = inputs.pop("labels")
        outputs = model(**inputs)
        loss = F.cross_entropy(
            outputs.logits[:, :-1].flatten(0, 1).float(), labels[:, 1:].flatten(), ignore_index=-100, reduction="sum"
        )
        loss = loss / (num_items_in_batch if num_items_in_batch is not None else (labels[:, 1:] != -100).sum())
        return (loss, outputs) if return_outputs else loss


def custom_trainer(
    tokenizer,
    out,
    trainer_class: type[Trainer] = SumLossTrainer,
    *,
    rows: int = 16,
    family: str = "llama",
    model=None,
    data_collator=None,
    optimizers=(None, None),
    **config,
):
    """A transformers Trainer subclass with its own compute_loss, on prompt+completion text (loss on every token);
    ``optimizers`` as Trainer takes it (an optimizer built by the user)."""
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    texts = instruction_pairs(rows, seed=0).map(
        lambda row: {"input_ids": tokenizer(row["prompt"] + row["completion"])["input_ids"] + [tokenizer.eos_token_id]},
        remove_columns=["prompt", "completion"],
    )
    model = model if model is not None else make_causal_lm(tokenizer, family)
    collator = data_collator or DataCollatorForLanguageModeling(pad_token_id=tokenizer.pad_token_id)
    return trainer_class(
        model=model,
        args=TrainingArguments(**config_kwargs(out, **config)),
        train_dataset=texts,
        processing_class=tokenizer,
        data_collator=collator,
        optimizers=optimizers,
    )
