"""Today's side of an era comparison: the same weights and token ids handed to the old code, and back.

An era script cannot unpickle today's objects, and a model's config written by transformers 5 has keys
that 4.45 does not know (``rope_parameters``). So the handshake carries only what both sides read:

* ``config``: a version-neutral dict of the architecture (``neutral_config``), rebuilt with
  ``AutoConfig.for_model(model_type, **rest)`` on both sides;
* ``weights``: the initial ``state_dict`` saved with ``torch.save`` to a file (loaded with
  ``strict=True``, so both sides start from exactly the same numbers; no seed-order assumptions);
* ``examples``: token ids, ``{"input_ids": [...], "labels": [...]}`` with -100 where there is no loss;
* ``gradients_out``: where the era writes its gradients (float64, flattened in ``model.parameters()``
  order, the order ``trl_clinic.probes.gradients.first_step_gradient`` uses), read by ``load_era_gradients``.

``today_gradient`` rebuilds the same model with today's libraries and takes the same step with
today's ``Trainer``; with ``recreate_old=True`` it sets ``trainer.model_accepts_loss_kwargs = False``,
the re-creation lesson 02 uses, so the notebook can say to what tolerance it matches the real 4.45.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch
    from transformers import PretrainedConfig, PreTrainedModel

NO_LOSS = -100
# The architecture keys of llama and qwen2 that transformers 4.45 and today's both accept. 4.45's Qwen2Config takes
# head_dim, attention_bias and mlp_bias only through **kwargs, and its Qwen2Attention does not read them (its
# head_dim is hidden_size // num_attention_heads).
NEUTRAL_KEYS = (
    "model_type",
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "hidden_act",
    "max_position_embeddings",
    "rms_norm_eps",
    "tie_word_embeddings",
    "attention_bias",
    "mlp_bias",
    "head_dim",
    "pad_token_id",
    "bos_token_id",
    "eos_token_id",
    "initializer_range",
)


def neutral_config(config: PretrainedConfig) -> dict:
    """The architecture as plain JSON that old and new transformers both turn into the same model."""
    values = config.to_dict()
    neutral = {key: values[key] for key in NEUTRAL_KEYS if key in values}
    rope = values.get("rope_parameters") or {"rope_theta": values.get("rope_theta", 10000.0), "rope_type": "default"}
    if rope.get("rope_type", "default") != "default":
        raise ValueError(f"only default RoPE survives the handshake, got {rope}")
    neutral["rope_theta"] = rope["rope_theta"]
    return neutral


def build_from_spec(spec: dict, attn_implementation: str | None = None) -> PreTrainedModel:
    """Today's model from a handshake spec: the same config and the same weights the era loads."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = dict(spec["config"])
    rope_theta = config.pop("rope_theta", None)
    config = AutoConfig.for_model(config.pop("model_type"), **config)
    if rope_theta is not None:
        if getattr(config, "rope_parameters", None) is not None:
            config.rope_parameters = {**config.rope_parameters, "rope_theta": rope_theta}
        else:
            config.rope_theta = rope_theta
    model = AutoModelForCausalLM.from_config(
        config, attn_implementation=attn_implementation or spec.get("attn_implementation", "eager"), dtype=torch.float32
    )
    model.load_state_dict(torch.load(spec["weights"], map_location="cpu", weights_only=True), strict=True)
    return model


def tiny_llama_config(vocab_size: int = 64) -> PretrainedConfig:
    """A 2-layer Llama of a few thousand parameters: an era step on it takes well under a second."""
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=True,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=None,
    )


def accumulation_examples(
    label_counts: tuple[int, ...] = (2, 4, 8, 16), prompt_length: int = 6, vocab_size: int = 64, seed: int = 0
) -> list[dict[str, list[int]]]:
    """Examples whose completions have the given numbers of label tokens (after the shift).

    The prompt's tokens carry no loss, so the first token is never a label (4.46's fixed path counts
    labels before the shift; a first-token label would make its scale off by a constant).
    """
    rng = random.Random(seed)
    examples = []
    for count in label_counts:
        ids = [rng.randrange(2, vocab_size) for _ in range(prompt_length + count)]
        examples.append({"input_ids": ids, "labels": [NO_LOSS] * prompt_length + ids[prompt_length:]})
    return examples


def accumulation_spec(
    workdir: str | Path,
    *,
    model: PreTrainedModel | None = None,
    examples: list[dict[str, list[int]]] | None = None,
    accumulation: int | None = None,
    seed: int = 0,
    attn_implementation: str = "eager",
) -> dict:
    """The spec of lesson 02's era script (its ``then.py``): writes ``then_02_weights.pt`` into ``workdir``.

    ``model``: today's model whose initial weights both sides use (default: ``tiny_llama_config`` built
    from ``seed``). ``examples``: token ids (default: ``accumulation_examples``). ``accumulation``:
    the micro-batches per optimizer step (default: all examples in one step).
    """
    import torch
    from transformers import AutoModelForCausalLM

    workdir = Path(workdir).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    if model is None:
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(
            tiny_llama_config(), attn_implementation=attn_implementation, dtype=torch.float32
        )
    config = neutral_config(model.config)
    examples = examples if examples is not None else accumulation_examples(vocab_size=config["vocab_size"], seed=seed)
    weights = workdir / "then_02_weights.pt"
    torch.save(
        {name: tensor.detach().float().cpu().contiguous() for name, tensor in model.state_dict().items()}, weights
    )
    return {
        "config": config,
        "weights": str(weights),
        "examples": examples,
        "accumulation": accumulation or len(examples),
        "attn_implementation": attn_implementation,
        "pad_token_id": config.get("pad_token_id") or 0,
        "eos_token_id": config.get("eos_token_id") if isinstance(config.get("eos_token_id"), int) else 0,
        "gradients_out": str(workdir / "then_02_gradients.pt"),
        "seed": seed,
        "threads": 1,
    }


def load_era_gradients(path: str | Path) -> dict[str, torch.Tensor]:
    """The era's gradients by path: ``trainer``, ``sft_trainer``, ``mean_of_means``, ``full_batch``."""
    import torch

    return torch.load(path, map_location="cpu", weights_only=True)


class _Collator:
    def __init__(self, pad_id: int) -> None:
        self.pad_id = pad_id

    def __call__(self, rows: list[dict]) -> dict:
        import torch

        width = max(len(row["input_ids"]) for row in rows)
        gaps = [width - len(row["input_ids"]) for row in rows]
        return {
            "input_ids": torch.tensor([r["input_ids"] + [self.pad_id] * gap for r, gap in zip(rows, gaps)]),
            "labels": torch.tensor([r["labels"] + [NO_LOSS] * gap for r, gap in zip(rows, gaps)]),
            "attention_mask": torch.tensor([[1] * (width - gap) + [0] * gap for gap in gaps]),
        }


def today_gradient(spec: dict, workdir: str | Path, *, recreate_old: bool = True, batch_size: int = 1) -> torch.Tensor:
    """The first-step gradient of today's ``Trainer`` on the spec's weights and examples.

    ``recreate_old=True``: ``trainer.model_accepts_loss_kwargs = False`` (lesson 02's re-creation of
    the per-micro-batch mean). ``batch_size=len(examples)`` with ``recreate_old=False`` gives today's
    full-batch reference.
    """
    from transformers import Trainer, TrainingArguments

    from trl_clinic.course.stand_ins import recreate_pre_446_loss
    from trl_clinic.probes.gradients import first_step_gradient

    examples = [{"input_ids": list(row["input_ids"]), "labels": list(row["labels"])} for row in spec["examples"]]
    accumulation = max(1, spec.get("accumulation", len(examples)) // batch_size)
    args = TrainingArguments(
        output_dir=str(Path(workdir) / "today"),
        per_device_train_batch_size=batch_size,
        gradient_accumulation_steps=accumulation,
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
    trainer = Trainer(
        model=build_from_spec(spec),
        args=args,
        train_dataset=examples,
        data_collator=_Collator(spec.get("pad_token_id", 0)),
    )
    if recreate_old:
        recreate_pre_446_loss(trainer)
    return first_step_gradient(trainer)


def compare_gradients(gradient: torch.Tensor, reference: torch.Tensor) -> dict[str, float]:
    """Relative error, cosine and largest absolute difference of two flat gradients."""
    from trl_clinic.probes.gradients import cosine, relative_error

    gradient, reference = gradient.double(), reference.double()
    return {
        "relative_error": relative_error(gradient, reference),
        "cosine": cosine(gradient, reference),
        "max_abs": (gradient - reference).abs().max().item(),
    }
