"""Lesson 01 then: padding-free batches on the report's collator (TRL 0.14.0) and after (TRL 0.21.0).

Era 01-trl-0.14 (trl 0.14.0 + transformers 4.48.3): the real ``DataCollatorForCompletionOnlyLM(
padding_free=True)`` flattens the batch into one row and returns ``input_ids``, ``labels`` and
``position_ids`` with no attention mask. transformers 4.48's eager and sdpa attention know nothing of
``position_ids`` boundaries (they apply one causal mask over the whole row), so the second packed
sequence attends to the first: its logits differ from the same sequence run alone.

Era 01-transformers-4.55 (trl 0.21.0 + transformers 4.55.4): ``masking_utils._preprocess_mask_arguments``
(4.53.1 and later; 4.53.0's has no ``find_packed_sequence_indices``) builds a block mask from
``position_ids``, but only when there is no attention mask *and no cache*: a model in train mode whose config says ``use_cache=True`` makes a cache and is still
contaminated; ``use_cache=False`` keeps the sequences apart. trl 0.21's padding-free collator
(``trl.trainer.sft_trainer.DataCollatorForLanguageModeling``) sends an all-ones attention mask, which
turns the block mask off whatever the cache.

Usage: ``python then_01_padding_free.py SPEC.json RESULT.json`` with either era's interpreter. The
spec may set ``seed`` (default 0), ``lengths`` (default [7, 11, 5]) and ``threads``. A tiny random
Llama is built from a config; token ids are drawn from ``seed``. The result gives, per attention
implementation and mode, the largest absolute logit difference of the later packed sequences against
each run alone (0 up to float noise means isolated).

The loss by batch size (era 01-trl-0.14 only, where ``trl.DataCollatorForCompletionOnlyLM`` exists;
``null`` elsewhere): a tiny Llama is first trained briefly (plain torch, padded batches with their
masks) on a copy task, ``prompt, response template, the prompt again, eos``, so that its completion
can only be predicted by attending to its own prompt. Then the real ``trl.SFTTrainer`` runs one epoch
over 64 fresh examples at ``learning_rate=0`` (every step sees the same weights) twice per batch size:
with the real ``DataCollatorForCompletionOnlyLM`` (padded, with an attention mask) and with the same
collator ``padding_free=True``. The mean logged loss of each and their ratio (padding-free / padded)
are given per batch size: 1 at batch 1 (one sequence, nothing to leak), growing with the batch as
more foreign prompts sit in front of each sequence. The spec may set ``loss_batch_sizes`` (default
[1, 4, 16]). Standalone: it must not import ``trl_clinic``.
"""

from __future__ import annotations

import importlib.metadata
import json
import random
import shutil
import sys
import time
from pathlib import Path

import torch

VOCAB = 64
TEMPLATE = [3, 4]  # the response template's token ids: the completion starts after them
ISOLATED = 1e-4  # float noise of a 2-layer fp32 model is ~1e-6
COPY_PROMPT = (3, 8)  # the copy task's prompt lengths (inclusive)
PRETRAIN_STEPS, PRETRAIN_BATCH, PRETRAIN_LR = 200, 32, 3e-3
LOSS_EXAMPLES = 64  # one epoch of the trainer: 64 steps at batch 1, 4 at batch 16
LOSS_ATTENTION = "sdpa"  # as the lesson's own runs on today's stack


def tiny_llama(seed: int, attn_implementation: str, hidden_size: int = 32):
    from transformers import AutoModelForCausalLM, LlamaConfig

    config = LlamaConfig(vocab_size=VOCAB, hidden_size=hidden_size, intermediate_size=2 * hidden_size,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         tie_word_embeddings=True, pad_token_id=0, eos_token_id=1, bos_token_id=None, use_cache=True)
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(config, attn_implementation=attn_implementation, torch_dtype=torch.float32)


def sequences(spec: dict) -> list[list[int]]:
    rng = random.Random(spec.get("seed", 0))
    out = []
    for length in spec.get("lengths", [7, 11, 5]):
        prompt = [rng.randrange(5, VOCAB) for _ in range(2)]
        out.append(prompt + TEMPLATE + [rng.randrange(5, VOCAB) for _ in range(max(1, length - 4))])
    return out


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
                worst = max(worst, (packed[start:start + len(ids)] - alone).abs().max().item())
            start += len(ids)
    return worst


def flattened(seqs: list[list[int]]) -> dict:
    """What a padding-free collator without a mask sends: one row, restarting position ids."""
    return {"input_ids": torch.tensor([sum(seqs, [])]),
            "position_ids": torch.tensor([sum((list(range(len(ids))) for ids in seqs), [])])}


def tiny_tokenizer():
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(WordLevel({f"t{i}": i for i in range(VOCAB)}, unk_token="t2"))
    tokenizer.pre_tokenizer = WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="t0", eos_token="t1", unk_token="t2")


def real_collator(seqs: list[list[int]]) -> tuple[dict, dict]:
    """The era's own padding-free collator on the sequences: its batch and what it contains."""
    import trl

    examples = [{"input_ids": ids} for ids in seqs]
    if hasattr(trl, "DataCollatorForCompletionOnlyLM"):  # trl <= 0.19
        collator = trl.DataCollatorForCompletionOnlyLM(TEMPLATE, tokenizer=tiny_tokenizer(), padding_free=True)
        name = "trl.DataCollatorForCompletionOnlyLM(response_template, tokenizer, padding_free=True)"
    else:
        from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

        collator = DataCollatorForLanguageModeling(pad_token_id=0, padding_free=True)
        name = "trl.trainer.sft_trainer.DataCollatorForLanguageModeling(pad_token_id=0, padding_free=True)"
    batch = collator(examples)
    mask = batch.get("attention_mask")
    about = {"collator": name, "keys": sorted(batch.keys()), "has_attention_mask": mask is not None,
             "attention_mask_all_ones": bool(mask is not None and bool((mask == 1).all())),
             "shape": list(batch["input_ids"].shape),
             "position_ids": batch["position_ids"].tolist() if "position_ids" in batch else None}
    return batch, about


def copy_examples(rng: random.Random, count: int) -> list[list[int]]:
    """The copy task: k random tokens, the response template, the same k tokens again, eos."""
    out = []
    for _ in range(count):
        prompt = [rng.randrange(5, VOCAB) for _ in range(rng.randint(*COPY_PROMPT))]
        out.append(prompt + TEMPLATE + prompt + [1])
    return out


def pretrained_copier(seed: int) -> tuple[dict, dict]:
    """A tiny Llama trained briefly on the copy task (padded batches with their masks, loss on the
    completion only), so that context matters: its state dict and how far it got."""
    rng = random.Random(seed + 1)
    model = tiny_llama(seed, LOSS_ATTENTION, hidden_size=64)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=PRETRAIN_LR)
    losses = []
    for _ in range(PRETRAIN_STEPS):
        seqs = copy_examples(rng, PRETRAIN_BATCH)
        width = max(map(len, seqs))
        ids = torch.zeros(len(seqs), width, dtype=torch.long)
        mask = torch.zeros(len(seqs), width, dtype=torch.long)
        labels = torch.full((len(seqs), width), -100, dtype=torch.long)
        for i, seq in enumerate(seqs):
            ids[i, :len(seq)] = torch.tensor(seq)
            mask[i, :len(seq)] = 1
            completion = len(seq) // 2 + 1  # after prompt + template
            labels[i, completion:len(seq)] = ids[i, completion:len(seq)]
        loss = model(input_ids=ids, attention_mask=mask, labels=labels, use_cache=False).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    about = {"task": "copy: prompt (3-8 tokens), response template, the prompt again, eos",
             "steps": PRETRAIN_STEPS, "batch_size": PRETRAIN_BATCH, "learning_rate": PRETRAIN_LR,
             "hidden_size": 64, "first_loss": losses[0], "last_loss_mean_of_10": sum(losses[-10:]) / 10}
    return model.state_dict(), about


def loss_by_batch_size(spec: dict) -> dict | None:
    """The mean logged loss of the real ``trl.SFTTrainer`` at learning rate 0, padded against padding-free
    (both the real ``DataCollatorForCompletionOnlyLM``), per batch size; None where the era has no such
    collator (trl >= 0.20)."""
    import trl

    if not hasattr(trl, "DataCollatorForCompletionOnlyLM"):
        return None
    import tempfile

    import datasets
    from transformers import PrinterCallback
    from transformers.utils import logging as transformers_logging

    transformers_logging.set_verbosity_error()
    datasets.disable_progress_bars()
    seed = spec.get("seed", 0)
    state, pretraining = pretrained_copier(seed)
    dataset = datasets.Dataset.from_dict({"input_ids": copy_examples(random.Random(seed + 2), LOSS_EXAMPLES)})
    tokenizer = tiny_tokenizer()
    batch_sizes = [int(size) for size in spec.get("loss_batch_sizes", [1, 4, 16])]
    means: dict[str, list[float]] = {"padded": [], "padding_free": []}
    steps = []
    workdir = Path(tempfile.mkdtemp(prefix="then_01_sft_"))  # the trainers' output_dir; nothing is saved
    for size in batch_sizes:
        for name, padding_free in (("padded", False), ("padding_free", True)):
            model = tiny_llama(seed, LOSS_ATTENTION, hidden_size=64)
            model.load_state_dict(state)
            collator = trl.DataCollatorForCompletionOnlyLM(TEMPLATE, tokenizer=tokenizer, padding_free=padding_free)
            args = trl.SFTConfig(output_dir=str(workdir / f"sft_{name}_{size}"), learning_rate=0.0,
                                 per_device_train_batch_size=size, num_train_epochs=1, logging_steps=1,
                                 save_strategy="no", report_to="none", use_cpu=True, disable_tqdm=True,
                                 seed=seed, max_seq_length=64, dataloader_num_workers=0)
            trainer = trl.SFTTrainer(model=model, args=args, train_dataset=dataset, processing_class=tokenizer,
                                     data_collator=collator)
            trainer.remove_callback(PrinterCallback)  # disable_tqdm's printer: the losses are read from log_history
            trainer.train()
            losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
            means[name].append(sum(losses) / len(losses))
        steps.append(len(losses))
    shutil.rmtree(workdir, ignore_errors=True)
    return {"batch_sizes": batch_sizes, "padded": means["padded"], "padding_free": means["padding_free"],
            "ratio": [free / padded for free, padded in zip(means["padding_free"], means["padded"])],
            "attn_implementation": LOSS_ATTENTION, "steps": steps, "examples": LOSS_EXAMPLES,
            "learning_rate": 0.0,
            "collators": {"padded": "trl.DataCollatorForCompletionOnlyLM(response_template, tokenizer=tokenizer)",
                          "padding_free": "trl.DataCollatorForCompletionOnlyLM(response_template, "
                                          "tokenizer=tokenizer, padding_free=True)"},
            "trainer": "trl.SFTTrainer(model, SFTConfig(learning_rate=0.0, ...), data_collator=collator)",
            "pretraining": pretraining}


def main(spec_path: str, result_path: str) -> None:
    start = time.perf_counter()
    spec = json.loads(Path(spec_path).read_text())
    torch.set_num_threads(int(spec.get("threads", 1)))
    seqs = sequences(spec)
    batch, collator = real_collator(seqs)
    table = {}
    for implementation in ("eager", "sdpa"):
        model = tiny_llama(spec.get("seed", 0), implementation)
        rows = {}
        model.eval()
        rows["eval, use_cache=False, no mask"] = contamination(model, flattened(seqs), seqs, use_cache=False)
        model.train()  # dropout is 0: train mode changes only what the model does with its cache
        rows["train, config use_cache=True, no mask"] = contamination(model, flattened(seqs), seqs, use_cache=None)
        rows["train, use_cache=False, no mask"] = contamination(model, flattened(seqs), seqs, use_cache=False)
        rows["train, the era's collator batch"] = contamination(model, batch, seqs, use_cache=None)
        table[implementation] = rows
    result = {
        "era_versions": {name: importlib.metadata.version(name)
                         for name in ("torch", "transformers", "trl", "peft", "accelerate")},
        "lengths": [len(ids) for ids in seqs],
        "collator": collator,
        "max_abs_logit_difference": table,
        "isolated_below": ISOLATED,
        "isolated": {impl: {mode: diff < ISOLATED for mode, diff in rows.items()} for impl, rows in table.items()},
        "loss_by_batch_size": loss_by_batch_size(spec),
        "seconds": time.perf_counter() - start,
    }
    Path(result_path).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
