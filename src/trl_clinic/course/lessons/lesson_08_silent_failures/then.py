"""Lesson 08 then: two of today's silent failures where they lived, and the check-up run on them there.

Era 06-trl-0.24 (trl 0.24.0 + transformers 5.5.0), part ``prompt`` (TRL #6105): ``SFTTrainer`` tokenizes a
conversational prompt with ``apply_chat_template(example["prompt"], tokenize=True, add_generation_prompt=True)``
and no ``return_dict`` (trl/trainer/sft_trainer.py); from transformers 5.0.0 that returns a ``BatchEncoding``, so
``len(prompt_ids)`` is its number of keys (2) and ``completion_mask = [0] * len(prompt_ids) + [1] * ...`` trains
every prompt token from the third on. Every row warns "Mismatch between tokenized prompt...".

Era 08-trl-1.14 (trl 1.14.2, bitsandbytes' 4-bit on the CPU), part ``qdora`` (TRL #7268): ``SFTTrainer`` casts
every trainable tensor of a quantized model to bfloat16, DoRA's ``lora_magnitude_vector`` included; AdamW's steps
of about the learning rate (2e-4) are below half a bfloat16 unit of a magnitude near 0.1-1, so the magnitude never
moves and the DoRA asked for trains as LoRA. Nothing warns. The workaround for a run pinned there: the magnitude
cast back to float32 after the trainer is built (``to_float32``), before ``train()`` makes the optimizer. Era
08-trl-1.16, the same stack with today's trl 1.16.0, runs the same part as the fix: only TRL moved.

Usage: ``python then.py SPEC.json RESULT.json`` with the era's interpreter (``run_in_era``). The spec holds ``part``,
``seed``, ``threads``, ``tokenizer`` (a tokenizer folder: today's ChatML tokenizer, saved), ``config`` (a
LlamaConfig's fields), ``rows`` (conversational prompt-completion rows), ``steps``, ``batch_size``,
``learning_rate``, ``workaround`` (part qdora: run the workaround too) and ``library``: a folder whose ``trl_clinic``
is this checkout's or wheel's package, put on ``sys.path`` so that the check-up runs on the era's own trainer. It
imports only the library from trl_clinic (``trl_clinic.checkup``), never the course; the lesson's companion imports
the measurements below from here, so today's run and the era's are measured by the same lines.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import io
import json
import logging
import sys
import tempfile
import time
from pathlib import Path

import torch

MISMATCH = "Mismatch between tokenized prompt"  # trl 0.24.0's warning, once a row


def trained_prompt_tokens(tokenizer, rows: list[dict], input_ids: list[list[int]], masks: list[list[int]]) -> dict:
    """How many prompt tokens the trainer's completion masks train, row by row (``trained``), of how many
    (``prompt_tokens``), and how many tokens each mask leaves out before its first trained one (``masked``: the
    prompt's length as the trainer took it). A prompt's true length is what ``apply_chat_template(...,
    return_dict=False)`` gives (a list of ids on every transformers); the rendered prompt must open the row (else the
    row is not counted)."""
    trained, prompts, masked, skipped = [], [], [], 0
    for row, ids, mask in zip(rows, input_ids, masks):
        prompt = tokenizer.apply_chat_template(
            row["prompt"], tokenize=True, add_generation_prompt=True, return_dict=False
        )
        if list(ids[: len(prompt)]) != list(prompt):
            skipped += 1
            continue
        trained.append(int(sum(mask[: len(prompt)])))
        prompts.append(len(prompt))
        masked.append(next((i for i, flag in enumerate(mask) if flag), len(mask)))
    return {"trained": trained, "prompt_tokens": prompts, "masked": masked, "rows_not_read": skipped}


def trainer_masks(trainer) -> tuple[list[list[int]], list[list[int]]]:
    """The input ids and what the loss trains (1) in the trainer's own tokenized dataset: its ``completion_mask``
    (trl 0.24.0 keeps it as a column), or its ``labels`` where the trainer folded the mask into them (trl 1.16.0:
    -100 where not trained)."""
    data = trainer.train_dataset
    if "completion_mask" in data.column_names:
        masks = [list(mask) for mask in data["completion_mask"]]
    else:
        masks = [[int(label != -100) for label in labels] for labels in data["labels"]]
    return [list(ids) for ids in data["input_ids"]], masks


def magnitudes(model) -> dict[str, torch.Tensor]:
    """DoRA's magnitude vectors (``lora_magnitude_vector``), copied: the weights the bug freezes."""
    return {
        name: parameter.detach().float().clone()
        for name, parameter in model.named_parameters()
        if "lora_magnitude_vector" in name
    }


def adapters(model) -> dict[str, torch.Tensor]:
    """The LoRA B matrices, copied: the adapter weights that train in both runs."""
    return {name: p.detach().float().clone() for name, p in model.named_parameters() if "lora_B" in name}


def share_moved(before: dict[str, torch.Tensor], after: dict[str, torch.Tensor]) -> float:
    """The share of elements whose value changed."""
    moved = sum(int((after[name] != value).sum()) for name, value in before.items())
    return moved / max(1, sum(value.numel() for value in before.values()))


def dtypes(model, part: str) -> list[str]:
    return sorted({str(p.dtype).removeprefix("torch.") for n, p in model.named_parameters() if part in n})


def to_float32(model) -> None:
    """The workaround on trl 1.14.2: DoRA's magnitude back in float32 after ``SFTTrainer`` cast it, before
    ``train()`` builds the optimizer."""
    for name, parameter in model.named_parameters():
        if "lora_magnitude_vector" in name:
            parameter.data = parameter.data.float()


def losses(trainer) -> list[float]:
    return [row["loss"] for row in trainer.state.log_history if "loss" in row]


def config_kwargs(spec: dict, folder: str, **overrides) -> dict:
    return {
        "output_dir": folder,
        "report_to": "none",
        "use_cpu": True,
        "seed": spec["seed"],
        "per_device_train_batch_size": spec["batch_size"],
        "max_steps": spec["steps"],
        "learning_rate": spec["learning_rate"],
        "lr_scheduler_type": "constant",
        "logging_steps": 1,
        "save_strategy": "no",
        "disable_tqdm": True,
        "bf16": False,
        **overrides,
    }


def tiny_llama(spec: dict):
    from transformers import AutoModelForCausalLM, LlamaConfig

    torch.manual_seed(spec["seed"])
    return AutoModelForCausalLM.from_config(LlamaConfig(**spec["config"]), attn_implementation="sdpa")


def checkup_findings(trainer) -> list[dict]:
    """The whole check-up on the era's trainer (the library from ``spec["library"]``), each finding's record."""
    from trl_clinic import checkup

    with contextlib.redirect_stdout(io.StringIO()):
        return finding_records(checkup(trainer, show=False))


def finding_records(report) -> list[dict]:
    """A check-up report's findings as plain records: what the era's result and the notebook's numbers keep."""
    keys = ("probe", "status", "decided", "value", "measured", "fix", "lesson", "known_bug")
    return [{key: finding[key] for key in keys} for finding in report.to_dict()["findings"]]


class Warnings(logging.Handler):
    """The trainer's warnings, as a user's log shows them."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def prompt_part(spec: dict, folder: str) -> dict:
    """TRL #6105: the era's SFTTrainer on conversational prompt-completion rows; what its masks train."""
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    tokenizer = AutoTokenizer.from_pretrained(spec["tokenizer"])
    heard = Warnings()
    logging.getLogger("trl").addHandler(heard)
    trainer = SFTTrainer(
        model=tiny_llama(spec),
        args=SFTConfig(**config_kwargs(spec, folder)),
        train_dataset=Dataset.from_list(spec["rows"]),
        processing_class=tokenizer,
    )
    logging.getLogger("trl").removeHandler(heard)
    findings = checkup_findings(trainer)
    with contextlib.redirect_stdout(io.StringIO()):
        trainer.train()
    ids, masks = trainer_masks(trainer)
    return {
        "tokenizer": spec["tokenizer"],
        "warnings": [m for m in heard.messages if MISMATCH in m],
        "first_row": {"input_ids": ids[0], "completion_mask": masks[0]},
        "masks": trained_prompt_tokens(tokenizer, spec["rows"], ids, masks),
        "losses": losses(trainer),
        "checkup": findings,
    }


def qlora_trainer(spec: dict, folder: str):
    """SFTTrainer on a tiny Llama loaded in 4 bits (NF4 on the CPU) with DoRA on every linear layer, TRL #7268's
    setting: bf16 and a learning rate of 2e-4."""
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer, BitsAndBytesConfig
    from trl import SFTConfig, SFTTrainer

    saved = Path(folder) / "model"
    tiny_llama(spec).save_pretrained(saved)
    quantized = AutoModelForCausalLM.from_pretrained(
        saved,
        quantization_config=BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_compute_dtype=torch.bfloat16),
        dtype=torch.bfloat16,
    )
    return SFTTrainer(
        model=quantized,
        args=SFTConfig(**config_kwargs(spec, folder, bf16=True)),
        train_dataset=Dataset.from_list(spec["rows"]),
        processing_class=AutoTokenizer.from_pretrained(spec["tokenizer"]),
        peft_config=LoraConfig(r=8, target_modules="all-linear", use_dora=True),
    )


def trained_dora(trainer) -> dict:
    """Train, and say what moved: the magnitude vectors beside the LoRA matrices."""
    before, matrices = magnitudes(trainer.model), adapters(trainer.model)
    values = torch.cat([value.abs().flatten() for value in before.values()])
    kinds = {"magnitude": dtypes(trainer.model, "lora_magnitude_vector"), "lora_B": dtypes(trainer.model, "lora_B")}
    with contextlib.redirect_stdout(io.StringIO()):
        trainer.train()
    return {
        "dtypes": kinds,
        "magnitude_elements": values.numel(),
        "magnitude_range": [values.min().item(), values.max().item()],
        "magnitude_moved": share_moved(before, magnitudes(trainer.model)),
        "lora_B_moved": share_moved(matrices, adapters(trainer.model)),
        "losses": losses(trainer),
    }


def qdora_part(spec: dict, folder: str) -> dict:
    """TRL #7268: the era's QDoRA run as launched (checked up first), and, where ``spec["workaround"]``, the same
    run with the magnitude cast back to float32."""
    trainer = qlora_trainer(spec, folder)
    result = {"checkup": checkup_findings(trainer), "as_launched": trained_dora(trainer)}
    if spec.get("workaround"):
        patched = qlora_trainer(spec, folder)
        to_float32(patched.model)
        result["workaround"] = trained_dora(patched)
    return result


PARTS = {"prompt": prompt_part, "qdora": qdora_part}


def main(spec_path: str, result_path: str) -> None:
    start = time.perf_counter()
    spec = json.loads(Path(spec_path).read_text())
    torch.set_num_threads(spec.get("threads", 1))
    sys.path.insert(0, spec["library"])
    with tempfile.TemporaryDirectory(prefix="then_08_") as folder:
        result = PARTS[spec["part"]](spec, folder)
    result["era_versions"] = {
        name: importlib.metadata.version(name) for name in ("torch", "transformers", "trl", "peft", "accelerate")
    }
    result["seconds"] = time.perf_counter() - start
    Path(result_path).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
