"""Lesson 01 then: padding-free batches on the report's TRL (0.14.0) and on TRL 0.21.0, for real.

Era 01-trl-0.14 (trl 0.14.0 + transformers 4.48.3, the versions of TRL #2834's time): the real
``DataCollatorForCompletionOnlyLM(padding_free=True)`` (``trl/trainer/utils.py``) flattens the batch into one
row and returns ``input_ids``, ``labels`` and ``position_ids`` restarting at 0, with no attention mask.
transformers 4.48's eager and sdpa attention apply one causal mask over the whole row (they read no
boundaries from ``position_ids``), so every packed sequence attends to the ones before it.

Era 01-transformers-4.55 (trl 0.21.0 + transformers 4.55.4): ``masking_utils._preprocess_mask_arguments``
(4.53.1 and later; with torch 2.6 or later through 4.57.1) builds a block mask from ``position_ids``, but only
when there is no attention mask *and no cache*: a model in train mode whose config says ``use_cache=True`` makes a
cache and is still contaminated; ``use_cache=False`` keeps the sequences apart. TRL 0.21.0's ``SFTTrainer`` builds
its padding-free collator with ``return_position_ids`` only under FlashAttention (``sft_trainer.py``, the
``DataCollatorForLanguageModeling(...)`` call in ``__init__``): on sdpa/eager the packed row goes out with an
attention mask of ones and no ``position_ids``, so positions run on across the row and the mask is causal
over all of it.

Usage: ``python then.py SPEC.json RESULT.json`` with either era's interpreter. The spec
(the companion's ``start_era`` writes it) holds ``model`` (today's copy-task model: a version-neutral
``config`` and its ``weights``, a ``torch.save``d state dict), ``examples`` (token ids of the copy task,
``prompt, response template, the prompt again, eos``, and their ``completion_mask``) and may set
``seed`` (default 0), ``threads``, ``lengths`` (default [7, 11, 5]: the logit table's row), ``mask_lengths``
(default [3, 2, 3]: the row whose attention pattern is drawn) and ``loss_batch_sizes`` (default [1, 4, 16]).

The result:
* ``max_abs_logit_difference``: per attention implementation and mode, the largest absolute logit difference
  of the later packed sequences against each run alone, on a tiny random Llama (0 up to float noise means
  isolated);
* ``attention_pattern``: per mode, which key each query of the ``mask_lengths`` row attends to (1: an eager
  attention weight above 0 in the first layer's first head; the row goes in with ``position_ids`` restarting
  at 0 per sequence, as the padding-free collators send them);
* ``loss_by_batch_size``: the copy-task model is saved as a model folder with this era's transformers, and
  the era's real ``trl.SFTTrainer`` loads it *by path without* ``model_init_kwargs`` (as in the report, where
  the ``--attn_implementation`` flag never reached the model) and runs one epoch over the examples at
  ``learning_rate=0`` (every step sees the same weights), padded and padding-free, per batch size: on TRL
  0.14 with ``DataCollatorForCompletionOnlyLM``, on TRL 0.21 with ``SFTConfig(padding_free=...)``. It gives the
  mean logged loss of each, their ratio, the attention implementation the trainer's model really got, the
  trainer's own log lines at the largest batch size and the trainer's warnings about the attention kernel.
Standalone: it must not import ``trl_clinic``.
"""

from __future__ import annotations

import importlib.metadata
import json
import random
import shutil
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch

VOCAB = 64
TEMPLATE = [3, 4]  # the response template's token ids: the completion starts after them
ISOLATED = 1e-4  # float noise of a 2-layer fp32 model is ~1e-6
LOG_LINES = 4  # the trainer's log lines kept per run at the largest batch size
WAIT_FOR_WEIGHTS = 300  # seconds: today's side trains the copy-task model while this script loads its libraries


def tiny_llama(seed: int, attn_implementation: str, hidden_size: int = 32):
    from transformers import AutoModelForCausalLM, LlamaConfig

    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=True,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=None,
        use_cache=True,
    )
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(config, attn_implementation=attn_implementation, torch_dtype=torch.float32)


def sequences(seed: int, lengths: list[int]) -> list[list[int]]:
    """Random sequences of the given lengths; those of 5 tokens or more carry the response template."""
    rng = random.Random(seed)
    out = []
    for length in lengths:
        if length < 5:
            out.append([rng.randrange(5, VOCAB) for _ in range(length)])
            continue
        prompt = [rng.randrange(5, VOCAB) for _ in range(2)]
        out.append(prompt + TEMPLATE + [rng.randrange(5, VOCAB) for _ in range(length - 4)])
    return out


def flattened(seqs: list[list[int]]) -> dict:
    """What a padding-free collator without a mask sends: one row, restarting position ids."""
    return {
        "input_ids": torch.tensor([sum(seqs, [])]),
        "position_ids": torch.tensor([sum((list(range(len(ids))) for ids in seqs), [])]),
    }


def contamination(model, batch: dict, seqs: list[list[int]], *, use_cache: bool | None) -> float:
    """Largest |logit difference| of every packed sequence but the first against it run alone.

    The batch goes to the model as a trainer sends it: every key but ``labels`` (trl 0.14's collator
    also sends FlashAttention's ``cu_seq_lens_*``, which eager and sdpa ignore)."""
    kwargs = {k: v for k, v in batch.items() if k != "labels"}
    with torch.no_grad():
        packed = model(**kwargs, use_cache=use_cache).logits[0]
        worst, start = 0.0, 0
        for i, ids in enumerate(seqs):
            alone = model(input_ids=torch.tensor([ids]), use_cache=False).logits[0]
            if i > 0:
                worst = max(worst, (packed[start : start + len(ids)] - alone).abs().max().item())
            start += len(ids)
    return worst


@torch.no_grad()
def attention_pattern(model, seqs: list[list[int]], *, use_cache: bool | None) -> list[list[int]]:
    """1 where a query token of the packed row gives a key a weight above 0 (eager, layer 0, head 0)."""
    weights = model(**flattened(seqs), use_cache=use_cache, output_attentions=True).attentions[0][0, 0]
    return (weights > 0).int().tolist()


def tiny_tokenizer():
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(WordLevel({f"t{i}": i for i in range(VOCAB)}, unk_token="t2"))
    tokenizer.pre_tokenizer = WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="t0", eos_token="t1", unk_token="t2")


def old_trl() -> bool:
    """TRL 0.19 and earlier have ``DataCollatorForCompletionOnlyLM`` (the report's collator)."""
    import trl

    return hasattr(trl, "DataCollatorForCompletionOnlyLM")


def real_collator(seqs: list[list[int]]) -> tuple[dict, dict]:
    """The era's own padding-free collator, built as its trainer builds it on sdpa: its batch and what it holds."""
    examples = [{"input_ids": ids} for ids in seqs]
    if old_trl():
        import trl

        collator = trl.DataCollatorForCompletionOnlyLM(TEMPLATE, tokenizer=tiny_tokenizer(), padding_free=True)
        name = "trl.DataCollatorForCompletionOnlyLM(response_template, tokenizer, padding_free=True)"
    else:
        from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

        # SFTTrainer passes return_position_ids=use_flash_attention (trl 0.21.0 sft_trainer.py, __init__)
        collator = DataCollatorForLanguageModeling(pad_token_id=0, padding_free=True, return_position_ids=False)
        name = (
            "trl.trainer.sft_trainer.DataCollatorForLanguageModeling(pad_token_id, padding_free=True, "
            "return_position_ids=False), as SFTTrainer builds it on sdpa/eager"
        )
    batch = collator(examples)
    mask = batch.get("attention_mask")
    about = {
        "collator": name,
        "keys": sorted(batch.keys()),
        "has_attention_mask": mask is not None,
        "attention_mask_all_ones": bool(mask is not None and bool((mask == 1).all())),
        "has_position_ids": "position_ids" in batch,
        "shape": list(batch["input_ids"].shape),
    }
    return batch, about


def copier_from_spec(spec: dict):
    """Today's copy-task model on this era's transformers: the version-neutral config and the same weights, which
    today's side may still be training when this script starts (it writes the file whole, by a rename)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    weights, deadline = Path(spec["model"]["weights"]), time.monotonic() + WAIT_FOR_WEIGHTS
    while not weights.is_file():
        if weights.with_suffix(".failed").exists():
            raise RuntimeError(f"today's side failed to train the model ({weights.with_suffix('.failed')})")
        if time.monotonic() > deadline:
            raise TimeoutError(f"no weights at {weights} after {WAIT_FOR_WEIGHTS} s")
        time.sleep(0.2)
    config = dict(spec["model"]["config"])
    config = AutoConfig.for_model(config.pop("model_type"), **config)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa", torch_dtype=torch.float32)
    model.load_state_dict(torch.load(weights, map_location="cpu", weights_only=True), strict=True)
    return model


def sft_trainer(
    folder: Path, examples: dict[str, list[list[int]]], batch_size: int, padding_free: bool, seed: int, output_dir: Path
):
    """The era's real SFTTrainer on the saved model, loaded by path with no model_init_kwargs, at lr 0."""
    import datasets
    import trl

    common = dict(
        output_dir=str(output_dir),
        learning_rate=0.0,
        per_device_train_batch_size=batch_size,
        num_train_epochs=1,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        disable_tqdm=True,
        seed=seed,
        dataloader_num_workers=0,
    )
    if old_trl():  # trl 0.14: the report's collator
        dataset = datasets.Dataset.from_dict({"input_ids": examples["input_ids"]})  # it finds the template itself
        collator = trl.DataCollatorForCompletionOnlyLM(TEMPLATE, tokenizer=tiny_tokenizer(), padding_free=padding_free)
        args = trl.SFTConfig(**common, max_seq_length=64)
        return trl.SFTTrainer(
            model=str(folder),
            args=args,
            train_dataset=dataset,
            processing_class=tiny_tokenizer(),
            data_collator=collator,
        )
    dataset = datasets.Dataset.from_dict(examples)  # input_ids and completion_mask
    args = trl.SFTConfig(**common, padding_free=padding_free, completion_only_loss=True, max_length=64)
    return trl.SFTTrainer(model=str(folder), args=args, train_dataset=dataset, processing_class=tiny_tokenizer())


def loss_by_batch_size(spec: dict, folder: Path) -> dict:
    """The mean logged loss of the era's real ``trl.SFTTrainer`` at learning rate 0, padded against padding-free,
    per batch size, with the trainer's own log lines at the largest batch size and its warnings."""
    import datasets
    from transformers import PrinterCallback
    from transformers.utils import logging as transformers_logging

    transformers_logging.set_verbosity_error()
    datasets.disable_progress_bars()
    seed = spec.get("seed", 0)
    batch_sizes = [int(size) for size in spec.get("loss_batch_sizes", [1, 4, 16])]
    means: dict[str, list[float]] = {"padded": [], "padding_free": []}
    log: dict[str, list[dict]] = {}
    attention, caught = set(), []
    workdir = Path(tempfile.mkdtemp(prefix="then_01_sft_"))  # the trainers' output_dir; nothing is saved
    for size in batch_sizes:
        for name, padding_free in (("padded", False), ("padding_free", True)):
            with warnings.catch_warnings(record=True) as seen:
                warnings.simplefilter("always")
                trainer = sft_trainer(
                    folder, spec["examples"], size, padding_free, seed, workdir / f"sft_{name}_{size}"
                )
            caught += [str(w.message) for w in seen if "attention implementation" in str(w.message)]
            attention.add(trainer.model.config._attn_implementation)
            trainer.remove_callback(PrinterCallback)  # disable_tqdm's printer: the losses are read from log_history
            trainer.train()
            entries = [entry for entry in trainer.state.log_history if "loss" in entry]
            means[name].append(sum(entry["loss"] for entry in entries) / len(entries))
            if size == batch_sizes[-1]:
                log[name] = entries[:LOG_LINES]
    shutil.rmtree(workdir, ignore_errors=True)
    return {
        "batch_sizes": batch_sizes,
        "padded": means["padded"],
        "padding_free": means["padding_free"],
        "ratio": [free / padded for free, padded in zip(means["padding_free"], means["padded"])],
        "attn_implementation": sorted(attention),
        "log": log,
        "warnings": sorted(set(caught)),
        "examples": len(spec["examples"]["input_ids"]),
        "learning_rate": 0.0,
        "trainer": (
            "trl.SFTTrainer(model=<folder>, args=SFTConfig(learning_rate=0.0, ...), "
            + (
                "data_collator=DataCollatorForCompletionOnlyLM(response_template, tokenizer, padding_free=...))"
                if old_trl()
                else "SFTConfig(padding_free=..., completion_only_loss=True))"
            )
        ),
    }


def main(spec_path: str, result_path: str) -> None:
    start = time.perf_counter()
    spec = json.loads(Path(spec_path).read_text())
    torch.set_num_threads(int(spec.get("threads", 1)))
    from trl import SFTTrainer  # noqa: F401  the slow import, done while today's side still trains the model

    seed = spec.get("seed", 0)
    seqs = sequences(seed, spec.get("lengths", [7, 11, 5]))
    batch, collator = real_collator(seqs)
    table = {}
    for implementation in ("eager", "sdpa"):
        model = tiny_llama(seed, implementation)
        rows = {}
        model.eval()
        rows["eval, use_cache=False, no mask"] = contamination(model, flattened(seqs), seqs, use_cache=False)
        model.train()  # dropout is 0: train mode changes only what the model does with its cache
        rows["train, config use_cache=True, no mask"] = contamination(model, flattened(seqs), seqs, use_cache=None)
        rows["train, use_cache=False, no mask"] = contamination(model, flattened(seqs), seqs, use_cache=False)
        rows["train, the collator's batch as its trainer sends it"] = contamination(model, batch, seqs, use_cache=None)
        table[implementation] = rows
    eager = tiny_llama(seed, "eager")
    small = sequences(seed, spec.get("mask_lengths", [3, 2, 3]))
    patterns = {
        "eval, use_cache=False, no mask": attention_pattern(eager.eval(), small, use_cache=False),
        "train, config use_cache=True, no mask": attention_pattern(eager.train(), small, use_cache=None),
    }
    folder = Path(tempfile.mkdtemp(prefix="then_01_model_"))
    copier_from_spec(spec).save_pretrained(folder)  # with this era's transformers: the trainer loads it by path
    tiny_tokenizer().save_pretrained(folder)
    losses = loss_by_batch_size(spec, folder)
    shutil.rmtree(folder, ignore_errors=True)
    result = {
        "era_versions": {
            name: importlib.metadata.version(name) for name in ("torch", "transformers", "trl", "peft", "accelerate")
        },
        "lengths": [len(ids) for ids in seqs],
        "collator": collator,
        "max_abs_logit_difference": table,
        "isolated_below": ISOLATED,
        "isolated": {impl: {mode: diff < ISOLATED for mode, diff in rows.items()} for impl, rows in table.items()},
        "mask_lengths": [len(ids) for ids in small],
        "attention_pattern": patterns,
        "loss_by_batch_size": losses,
        "seconds": time.perf_counter() - start,
    }
    Path(result_path).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
