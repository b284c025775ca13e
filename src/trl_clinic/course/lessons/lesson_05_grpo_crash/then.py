"""Lesson 05 then: the report's own GRPOConfig on trl 0.14.0 + transformers 4.48.3 (era 01-trl-0.14).

TRL #2906 was written against trl 0.14.0, the first release with ``GRPOTrainer``: there
``per_device_train_batch_size`` counts prompts (each gets ``num_generations`` completions), and
``max_prompt_length`` and ``warmup_ratio`` still exist, so the report's config is accepted as written
(today's TRL rejects it three times). This script builds ``trl.GRPOConfig`` from the report's
arguments exactly (adding only ``output_dir`` and ``use_cpu``), records the ``bf16`` of a
``GRPOConfig`` that does not name it (0.14.0's ``grpo_config.py`` has no ``bf16`` field of its own) and
the help of its ``per_device_train_batch_size`` ("Number of prompts sampled per device"), then trains a tiny
random Qwen2 policy with the real ``trl.GRPOTrainer`` of 0.14.0 for a few optimizer steps with that config. For the run
only ``max_steps`` (a few steps instead of an epoch) and ``report_to`` (tensorboard is not installed
in the era) are changed; everything else, ``bf16=True`` and 16 generations of up to 200 tokens
included, runs as written; the reward function records how many completions each call scored (the
micro-batch: per-device prompts x ``num_generations``). On CPU it does not crash: the report's SIGFPE
needs an H20 GPU and an old cuBLAS.

Usage: ``python then.py SPEC.json RESULT.json`` with the era's interpreter. The spec
gives ``reported`` (the config's arguments, as lesson 05 quotes them from the report) and may set
``max_steps`` (default 2), ``seed`` and ``threads``. The reward is the share of a completion's words
that are "yes": a random policy gives different rewards within a group, so GRPO has an advantage to
follow. Standalone: it must not import ``trl_clinic``.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import json
import random
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch

WORDS = "yes no maybe the a cat dog red blue one two three say answer please".split()


def tiny_tokenizer():
    from tokenizers import Tokenizer
    from tokenizers.decoders import WordPiece
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit
    from transformers import PreTrainedTokenizerFast

    vocab = {token: i for i, token in enumerate(["<pad>", "<eos>", "<unk>", *WORDS])}
    tokenizer = Tokenizer(WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = WhitespaceSplit()
    tokenizer.decoder = WordPiece(prefix="##")  # joins words with spaces
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        pad_token="<pad>",
        eos_token="<eos>",
        unk_token="<unk>",
        padding_side="left",
        model_input_names=["input_ids", "attention_mask"],
    )


def tiny_policy(tokenizer, seed: int):
    from transformers import AutoModelForCausalLM, Qwen2Config

    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
        tie_word_embeddings=True,
    )
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(config, attn_implementation="sdpa", torch_dtype=torch.float32)


COMPLETIONS_PER_CALL: list[int] = []  # how many completions each reward call scored: 0.14.0's micro-batch


def yes_share(completions: list[str], **kwargs) -> list[float]:
    """The share of a completion's words that are "yes"."""
    COMPLETIONS_PER_CALL.append(len(completions))
    return [sum(word == "yes" for word in text.split()) / max(1, len(text.split())) for text in completions]


def main(spec_path: str, result_path: str) -> None:
    start = time.perf_counter()
    spec = json.loads(Path(spec_path).read_text())
    torch.set_num_threads(int(spec.get("threads", 1)))
    seed = int(spec.get("seed", 0))
    reported = dict(spec["reported"])
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    with tempfile.TemporaryDirectory() as scratch:
        try:
            config = GRPOConfig(output_dir=str(Path(scratch) / "as-written"), use_cpu=True, **reported)
        except Exception as error:  # what the report's config met on its own version
            accepted, error_text, as_read = False, f"{type(error).__name__}: {error}", {}
        else:
            accepted, error_text = True, None
            as_read = {key: getattr(config, key) for key in reported}
        default_bf16 = GRPOConfig(output_dir=str(Path(scratch) / "default"), use_cpu=True).bf16
        changed = {"max_steps": int(spec.get("max_steps", 2)), "report_to": []}
        steps, log = [], []
        if accepted:
            tokenizer = tiny_tokenizer()
            rng = random.Random(seed)
            prompts = [" ".join(rng.choice(WORDS) for _ in range(4)) + " say" for _ in range(32)]
            args = dataclasses.replace(config, output_dir=str(Path(scratch) / "run"), **changed)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                trainer = GRPOTrainer(
                    model=tiny_policy(tokenizer, seed),
                    reward_funcs=yes_share,
                    args=args,
                    train_dataset=Dataset.from_dict({"prompt": prompts}),
                    processing_class=tokenizer,
                )
                trainer.train()
            log = [
                {k: v for k, v in entry.items() if isinstance(v, (int, float))} for entry in trainer.state.log_history
            ]
            steps = [entry for entry in log if "loss" in entry]
    result = {
        "era_versions": {
            name: importlib.metadata.version(name) for name in ("torch", "transformers", "trl", "peft", "accelerate")
        },
        "config_accepted_as_written": accepted,
        "default_bf16": default_bf16,
        "batch_help": GRPOConfig.__dataclass_fields__["per_device_train_batch_size"].metadata["help"],
        "completions_per_call": COMPLETIONS_PER_CALL,
        "error": error_text,
        "reported": reported,
        "config_as_read": {
            k: (v if isinstance(v, (int, float, str, bool, type(None))) else str(v)) for k, v in as_read.items()
        },
        "changed_for_the_run": changed,
        "optimizer_steps": len(steps),
        "steps": steps,
        "log_history": log,
        "rewards": [entry.get("reward") for entry in steps],
        "seconds": time.perf_counter() - start,
    }
    Path(result_path).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
