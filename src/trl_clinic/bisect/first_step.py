"""One recipe's first training step, recorded inside a side environment with that environment's own TRL.

Usage: ``python first_step.py SPEC.json RESULT.json`` with the side environment's interpreter. Standalone: it
imports torch, that environment's transformers, TRL and datasets, and the standard library, never
``trl_clinic`` (today's code needs today's libraries; the old ones cannot import it).

The spec holds the recipe (``kind``: sft or dpo, and the user's config as a dict), the seed and the thread count.
The trainer is built by the version's own config class from the recipe's fields that class knows (the others
are listed, not guessed at), on a tiny Llama built from a config whose weights are drawn here from the seed,
one generator per parameter name, so that every transformers version starts from the same numbers whatever
its own initialisation does. The data are synthetic sentences of varied length over a fixed word-level
vocabulary (no hub, no tokenizer download). What is changed in the recipe is what a record needs: learning
rate 0 (every version scores the same weights), one optimizer step, the CPU in float32, no checkpointing, no
NaN filter on the log.

Recorded: a hash of each tensor of the first collated batch (input ids, labels, position ids, attention mask:
"absent" where the collator sends none; a DPO batch's chosen and rejected tensors under their own names), the
label tokens over the first step's accumulation window (labels other than -100; where a batch has no labels, its
completion mask), the step's loss (the sum of what
``Trainer.training_step`` returned over the window: the number the Trainer logs, before its rounding) and
the gradient norm the Trainer logs (before clipping).
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import importlib.metadata
import inspect
import json
import random
import sys
import tempfile
import time
import zlib

import torch

BATCH_KEYS = ("input_ids", "labels", "position_ids", "attention_mask")  # always named, "absent" when not sent
WORDS = tuple(f"w{i}" for i in range(120))
SPECIALS = ("<pad>", "<eos>", "<bos>", "<unk>")
VERSIONS = ("torch", "transformers", "trl", "accelerate", "peft", "datasets", "tokenizers")
MODEL_KEYS = ("attn_implementation",)  # the recipe's model arguments the tiny model takes
MODEL_SIZE = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4}


def tokenizer():
    """A word-level tokenizer over a fixed vocabulary: the same ids on every tokenizers release."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit
    from transformers import PreTrainedTokenizerFast

    vocab = {token: i for i, token in enumerate(SPECIALS + WORDS)}
    inner = Tokenizer(WordLevel(vocab, unk_token="<unk>"))
    inner.pre_tokenizer = WhitespaceSplit()
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=inner, pad_token="<pad>", eos_token="<eos>", bos_token="<bos>", unk_token="<unk>"
    )
    wrapped.model_max_length = 512
    return wrapped


def texts(seed: int, count: int = 64) -> list[str]:
    """Sentences of 3 to 60 words: varied lengths, so padding and the label count per micro-batch vary."""
    draw = random.Random(seed)
    return [" ".join(draw.choice(WORDS) for _ in range(draw.randint(3, 60))) for _ in range(count)]


def tiny_llama(seed: int, vocab_size: int, attn_implementation: str):
    """A two-layer Llama whose every weight is drawn from ``seed`` and the parameter's name (norms at one)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=vocab_size,
        num_key_value_heads=2,
        max_position_embeddings=512,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=2,
        tie_word_embeddings=False,
        attn_implementation=attn_implementation,
        **MODEL_SIZE,
    )
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if parameter.ndim == 1:
                parameter.fill_(1.0)
                continue
            generator = torch.Generator().manual_seed(seed * 1_000_003 + zlib.crc32(name.encode()))
            parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.02)
    return model


def config_fields(config_class) -> set[str]:
    return {field.name for field in dataclasses.fields(config_class)}


def training_config(config_class, recipe: dict, seed: int, output_dir: str) -> tuple[object, dict]:
    """The version's own config from the recipe's fields it knows, with what a record needs set over them."""
    fields = config_fields(config_class)
    forced = {
        "output_dir": output_dir,
        "learning_rate": 0.0,
        "max_steps": 1,
        "seed": seed,
        "logging_steps": 1,
        "logging_nan_inf_filter": False,
        "report_to": "none",
        "save_strategy": "no",
        "use_cpu": True,
        "no_cuda": True,
        "bf16": False,
        "fp16": False,
        "gradient_checkpointing": False,
        "dataloader_num_workers": 0,
        "disable_tqdm": True,
        "warmup_steps": 0,
    }
    if "dataset_text_field" in fields and not recipe.get("dataset_text_field"):
        forced["dataset_text_field"] = "text"
    given = {key: value for key, value in recipe.items() if key in fields}
    chosen = given | {key: value for key, value in forced.items() if key in fields}
    if "use_cpu" in fields:
        chosen.pop("no_cuda", None)  # deprecated where use_cpu exists
    notes = {
        "ignored": sorted(key for key in recipe if key not in fields and key not in MODEL_KEYS),
        "overridden": sorted(key for key in given if key in forced and given[key] != forced[key]),
    }
    return config_class(**chosen), notes


def tensor_digest(tensor) -> str:
    """The tensor's shape and int64 values, hashed: a dtype change alone is not a change of the batch."""
    digest = hashlib.sha256(str(tuple(tensor.shape)).encode())
    digest.update(tensor.detach().to(torch.int64).cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


def pairs(seed: int, count: int = 64) -> dict[str, list[str]]:
    """Preference pairs: a prompt of 3 to 30 words, two answers of 1 to 30 (lengths vary, so padding does)."""
    draw = random.Random(seed)

    def words(low: int, high: int) -> str:
        return " ".join(draw.choice(WORDS) for _ in range(draw.randint(low, high)))

    rows = [(words(3, 30), " " + words(1, 30), " " + words(1, 30)) for _ in range(count)]
    return {"prompt": [r[0] for r in rows], "chosen": [r[1] for r in rows], "rejected": [r[2] for r in rows]}


def build(kind: str, recipe: dict, seed: int, output_dir: str):
    """The version's own trainer and config for ``kind``, on the tiny model, the tokenizer and the data."""
    import trl
    from datasets import Dataset

    config_class, trainer_class = {"sft": (trl.SFTConfig, trl.SFTTrainer), "dpo": (trl.DPOConfig, trl.DPOTrainer)}[kind]
    tok = tokenizer()
    model = tiny_llama(seed, len(tok), recipe.get("attn_implementation") or "sdpa")
    args, notes = training_config(config_class, recipe, seed, output_dir)
    takes = inspect.signature(trainer_class.__init__).parameters
    tokenizer_argument = "processing_class" if "processing_class" in takes else "tokenizer"
    data = Dataset.from_dict({"text": texts(seed)} if kind == "sft" else pairs(seed))
    given = {tokenizer_argument: tok}
    if kind == "dpo":  # the reference: the same weights (TRL would load it from the model's hub id, which has none)
        given["ref_model"] = copy.deepcopy(model)
    trainer = recording(trainer_class)(model=model, args=args, train_dataset=data, **given)
    return trainer, notes


def label_tokens(batch: dict) -> int:
    """Labels other than -100 (a DPO batch: chosen and rejected); a batch without labels: its completion mask."""
    counted = [key for key in batch if key.endswith("labels")] or [key for key in batch if "completion_mask" in key]
    return sum(int((batch[key] != -100).sum()) if key.endswith("labels") else int(batch[key].sum()) for key in counted)


def recording(trainer_class):
    """The version's trainer with ``training_step`` kept as is, its returned losses written down."""

    class Recording(trainer_class):
        def training_step(self, *args, **kwargs):
            loss = super().training_step(*args, **kwargs)
            self.recorded_losses.append(float(loss.detach().float()))
            return loss

    return Recording


def record(spec: dict) -> dict:
    torch.set_num_threads(spec.get("threads", 1))
    torch.manual_seed(spec["seed"])
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="trl-clinic-bisect-") as output_dir:
        trainer, notes = build(spec["kind"], spec["recipe"], spec["seed"], output_dir)
        trainer.recorded_losses = []
        batches = []
        collate = trainer.data_collator

        def collate_and_keep(features):
            batch = collate(features)
            batches.append({key: value.clone() for key, value in batch.items() if torch.is_tensor(value)})
            return batch

        trainer.data_collator = collate_and_keep
        trainer.train()
        window = batches[: trainer.args.gradient_accumulation_steps]
        logged = next((entry for entry in trainer.state.log_history if "loss" in entry), {})
    first = window[0]
    parts = {key: "absent" for key in BATCH_KEYS} | {key: tensor_digest(value) for key, value in first.items()}
    grad_norm = logged.get("grad_norm")
    return {
        "versions": {name: _version(name) for name in VERSIONS},
        "parts": parts,
        "batch_sha256": hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest(),
        "shape": {key: list(value.shape) for key, value in first.items() if "input_ids" in key},
        "label_tokens": sum(label_tokens(batch) for batch in window),
        "micro_batches": len(window),
        "loss": sum(trainer.recorded_losses),
        "logged_loss": logged.get("loss"),
        "grad_norm": None if grad_norm is None else float(grad_norm),
        "recipe_notes": notes,
        "seconds": round(time.perf_counter() - start, 2),
    }


def _version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def main(argv: list[str]) -> int:
    spec_path, result_path = argv
    with open(spec_path) as handle:
        spec = json.load(handle)
    result = record(spec)
    with open(result_path, "w") as handle:
        json.dump(result, handle, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
