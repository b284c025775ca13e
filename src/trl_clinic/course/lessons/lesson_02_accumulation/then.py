"""Lesson 02 then: gradient accumulation on transformers 4.45.2 + trl 0.11.4 (era 02-transformers-4.45).

The real old code: ``transformers.Trainer.training_step`` of 4.45 computes each micro-batch's loss as
the model's mean over *its own* label tokens and ``accelerator.backward`` divides it by the
accumulation steps, so batch 1 x accumulation N accumulates the mean of per-micro-batch means; TRL
0.11.4's ``SFTTrainer`` inherits that step. The fix (``num_items_in_batch``) arrived in 4.46.

Usage: ``python then.py SPEC.json RESULT.json`` with the era's interpreter. The spec
(``trl_clinic.course.handshake.accumulation_spec`` writes it) holds a version-neutral model ``config``, the
initial ``weights`` (a ``torch.save``d state dict), the ``examples`` as token ids (``input_ids`` and
``labels``, -100 where no loss), ``accumulation`` and ``gradients_out`` (where the gradients go).

The script takes one optimizer step (``max_grad_norm=0``: nothing clipped) with the real ``Trainer``
and the real ``SFTTrainer``, batch 1 x accumulation N, captures the accumulated gradient just before
the optimizer step, and compares it with two gradients computed by hand on the same weights: the
mean of per-micro-batch means, and the full-batch mean over all label tokens. It writes the
gradients (flattened in ``model.parameters()`` order, float64) to ``gradients_out`` and the numbers
to RESULT.json. Standalone: it must not import ``trl_clinic``.
"""

from __future__ import annotations

import importlib.metadata
import inspect
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

NO_LOSS = -100


def build_model(spec: dict) -> torch.nn.Module:
    from transformers import AutoConfig, AutoModelForCausalLM

    config = dict(spec["config"])
    config = AutoConfig.for_model(config.pop("model_type"), **config)
    model = AutoModelForCausalLM.from_config(
        config, attn_implementation=spec.get("attn_implementation", "eager"), torch_dtype=torch.float32
    )
    state = torch.load(spec["weights"], map_location="cpu", weights_only=True)
    model.load_state_dict(state, strict=True)
    return model


def tiny_tokenizer(vocab_size: int, pad_id: int, eos_id: int):
    """A word-level tokenizer whose token ``t<i>`` has id i: the old SFTTrainer needs a tokenizer
    object (it would fetch one from the hub without), the data are already token ids."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(WordLevel({f"t{i}": i for i in range(vocab_size)}, unk_token=f"t{pad_id}"))
    tokenizer.pre_tokenizer = WhitespaceSplit()
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, pad_token=f"t{pad_id}", eos_token=f"t{eos_id}", unk_token=f"t{pad_id}"
    )


class Collator:
    """Right-pads ``input_ids`` (pad id) and ``labels`` (-100) and adds the attention mask."""

    def __init__(self, pad_id: int) -> None:
        self.pad_id = pad_id

    def __call__(self, rows: list[dict]) -> dict[str, torch.Tensor]:
        width = max(len(row["input_ids"]) for row in rows)
        ids = [list(row["input_ids"]) + [self.pad_id] * (width - len(row["input_ids"])) for row in rows]
        labels = [list(row["labels"]) + [NO_LOSS] * (width - len(row["labels"])) for row in rows]
        mask = [[1] * len(row["input_ids"]) + [0] * (width - len(row["input_ids"])) for row in rows]
        return {"input_ids": torch.tensor(ids), "labels": torch.tensor(labels), "attention_mask": torch.tensor(mask)}


def flat_gradient(model: torch.nn.Module) -> torch.Tensor:
    return (
        torch.cat([p.grad.detach().flatten() for p in model.parameters() if p.requires_grad and p.grad is not None])
        .double()
        .cpu()
    )


def trainer_gradient(spec: dict, trainer_kind: str, workdir: Path) -> torch.Tensor:
    """One optimizer step of the real old Trainer (or SFTTrainer), batch 1 x accumulation N."""
    from datasets import Dataset
    from transformers import Trainer, TrainerCallback, TrainingArguments

    captured: dict[str, torch.Tensor] = {}

    class Capture(TrainerCallback):
        def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
            captured.setdefault("gradient", flat_gradient(model))
            control.should_training_stop = True
            return control

    model = build_model(spec)
    rows = [{"input_ids": row["input_ids"], "labels": row["labels"]} for row in spec["examples"]]
    common = dict(
        output_dir=str(workdir / trainer_kind),
        per_device_train_batch_size=1,
        gradient_accumulation_steps=spec["accumulation"],
        max_steps=1,
        max_grad_norm=0,
        learning_rate=1e-3,
        report_to=[],
        use_cpu=True,
        save_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
        seed=spec.get("seed", 0),
        dataloader_num_workers=0,
    )
    collator = Collator(spec["pad_token_id"])
    if trainer_kind == "trainer":
        trainer = Trainer(model=model, args=TrainingArguments(**common), train_dataset=rows, data_collator=collator)
    else:
        from trl import SFTConfig, SFTTrainer

        tokenizer = tiny_tokenizer(spec["config"]["vocab_size"], spec["pad_token_id"], spec["eos_token_id"])
        args = SFTConfig(**common, dataset_kwargs={"skip_prepare_dataset": True}, max_seq_length=4096)
        trainer = SFTTrainer(
            model=model, args=args, train_dataset=Dataset.from_list(rows), data_collator=collator, tokenizer=tokenizer
        )
    trainer.add_callback(Capture())
    trainer.train()
    return captured["gradient"]


def manual_gradients(spec: dict) -> dict[str, torch.Tensor]:
    """The two objectives by hand, same weights: mean of per-example means, and one mean over all tokens."""
    model = build_model(spec)
    params = [p for p in model.parameters() if p.requires_grad]
    means, sums, counts = [], [], []
    for row in spec["examples"]:
        ids = torch.tensor([row["input_ids"]])
        labels = torch.tensor([row["labels"]])
        logits = model(input_ids=ids).logits.float()
        shift_logits, shift_labels = logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten()
        token_sum = torch.nn.functional.cross_entropy(shift_logits, shift_labels, ignore_index=NO_LOSS, reduction="sum")
        n = int((shift_labels != NO_LOSS).sum())
        means.append(token_sum / n)
        sums.append(token_sum)
        counts.append(n)
    objectives = {"mean_of_means": torch.stack(means).mean(), "full_batch": torch.stack(sums).sum() / sum(counts)}
    gradients = {}
    for name, objective in objectives.items():
        grads = torch.autograd.grad(objective, params, retain_graph=True)
        gradients[name] = torch.cat([g.flatten() for g in grads]).double()
    gradients["label_counts"] = torch.tensor(counts)
    return gradients


def relative_error(gradient: torch.Tensor, reference: torch.Tensor) -> float:
    return ((gradient - reference).norm() / reference.norm()).item()


def cosine(gradient: torch.Tensor, reference: torch.Tensor) -> float:
    return torch.nn.functional.cosine_similarity(gradient, reference, dim=0).item()


def main(spec_path: str, result_path: str) -> None:
    start = time.perf_counter()
    spec = json.loads(Path(spec_path).read_text())
    torch.set_num_threads(int(spec.get("threads", 1)))
    spec.setdefault("accumulation", len(spec["examples"]))
    spec.setdefault("pad_token_id", spec["config"].get("pad_token_id") or 0)
    spec.setdefault("eos_token_id", spec["config"].get("eos_token_id") or 0)
    from transformers import Trainer

    manual = manual_gradients(spec)
    with tempfile.TemporaryDirectory() as scratch:
        gradients = {kind: trainer_gradient(spec, kind, Path(scratch)) for kind in ("trainer", "sft_trainer")}
    gradients.update({"mean_of_means": manual["mean_of_means"], "full_batch": manual["full_batch"]})
    model = build_model(spec)
    names = [name for name, p in model.named_parameters() if p.requires_grad]
    out = Path(spec.get("gradients_out") or Path(result_path).with_suffix(".gradients.pt"))
    torch.save({**gradients, "names": names}, out)

    paths = {}
    for kind in ("trainer", "sft_trainer"):
        gradient = gradients[kind]
        paths[kind] = {
            "vs_mean_of_means": relative_error(gradient, gradients["mean_of_means"]),
            "vs_full_batch": relative_error(gradient, gradients["full_batch"]),
            "cosine_full_batch": cosine(gradient, gradients["full_batch"]),
        }
    result = {
        "era_versions": {
            name: importlib.metadata.version(name) for name in ("torch", "transformers", "trl", "peft", "accelerate")
        },
        "accumulation": spec["accumulation"],
        "label_counts": manual["label_counts"].tolist(),
        "paths": paths,
        "mean_of_means_vs_full_batch": {
            "relative_error": relative_error(gradients["mean_of_means"], gradients["full_batch"]),
            "cosine": cosine(gradients["mean_of_means"], gradients["full_batch"]),
        },
        # the evidence in the library's own code: the old training_step has no token count to divide by
        "training_step_knows_num_items_in_batch": "num_items_in_batch" in inspect.getsource(Trainer.training_step),
        "trainer_file": inspect.getsourcefile(Trainer),
        "gradients_file": str(out),
        "gradient_keys": ["trainer", "sft_trainer", "mean_of_means", "full_batch"],
        "seconds": time.perf_counter() - start,
    }
    Path(result_path).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
