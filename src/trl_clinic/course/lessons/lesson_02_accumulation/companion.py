"""Companion of lesson 02's core (core.py) and its deep dive: the model, the
one-step trainers, the objectives computed by hand, the sweep and the figure, so that the notebook keeps the
settings, the line that fixes the bug and the numbers.

The core's model is Qwen2.5-VL built small from its config: transformers ships the class with
``accepts_loss_kwargs = False`` (``models/qwen2_5_vl/modeling_qwen2_5_vl.py``), so today's Trainer counts no
tokens for it and takes the pre-4.46 arithmetic for real. The deep dive's re-creation of that arithmetic
on a model that does accept loss kwargs is ``stand_ins.recreate_pre_446_loss``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import torch
import torch.nn.functional as F
from datasets import Dataset
from transformers import PreTrainedModel, PreTrainedTokenizerBase, Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration
from trl import SFTConfig, SFTTrainer

from trl_clinic.course import plotting
from trl_clinic.course.models import MODEL_SIZES
from trl_clinic.course.run import Run
from trl_clinic.course.stand_ins import recreate_pre_446_loss
from trl_clinic.course.tokenizer import build_tokenizer
from trl_clinic.probes.gradients import GradientCapture, first_step_gradient
from trl_clinic.probes.labels import IGNORE_INDEX, targets
from trl_clinic.probes.recording import StepRecorder, quiet


def vision_language_model_maker(
    size: str,
    *,
    seed: int = 0,
) -> tuple[Callable[[], PreTrainedModel], PreTrainedTokenizerBase]:
    """The clinic tokenizer, and a function giving a fresh Qwen2.5-VL of the same random weights at every call.

    Its language model has the ``MODEL_SIZES[size]`` shape; its vision tower is one small block, never used
    (the rows are text). Multimodal RoPE splits each head's rotary frequencies in three sections (time,
    height, width); text tokens carry the same position in all three.
    """
    if size not in MODEL_SIZES:
        raise ValueError(f"unknown model size {size!r}: choose one of {', '.join(MODEL_SIZES)}")
    tokenizer, shape = build_tokenizer(), MODEL_SIZES[size]
    half = shape["hidden_size"] // shape["num_attention_heads"] // 2
    rope = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [half // 4, 3 * half // 8, 3 * half // 8]}
    text = dict(
        vocab_size=len(tokenizer),
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        bos_token_id=None,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        rope_parameters=rope,
        **shape,
    )
    vision = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=shape["hidden_size"])
    config = Qwen2_5_VLConfig(text_config=text, vision_config=vision, tie_word_embeddings=True)

    def make_model() -> PreTrainedModel:
        torch.manual_seed(seed)
        return Qwen2_5_VLForConditionalGeneration._from_config(config, attn_implementation="sdpa", dtype=torch.float32)

    return make_model, tokenizer


class FirstStep:
    """One optimizer step of the real SFTTrainer over the first samples, from the same initial weights.

    ``train_sampling_strategy="sequential"`` feeds the first samples in order, so batch b x accumulation k and
    batch b*k x 1 see the same rows and every window mixes short and long answers; ``max_grad_norm=0`` leaves
    the gradient as accumulation built it; fp32 on every device (under bf16 autocast a big batch and its
    micro-batches round differently, about 1e-3).
    """

    def __init__(
        self,
        run: Run,
        make_model: Callable[[], PreTrainedModel],
        tokenizer: PreTrainedTokenizerBase,
        train_set: Dataset,
        packing_length: int | None = None,
    ) -> None:
        self.run, self.make_model, self.tokenizer, self.train_set = run, make_model, tokenizer, train_set
        self.packing_length = packing_length

    def trainer(
        self,
        batch_size: int,
        accumulation: int,
        *,
        fixed: bool = False,
        logging: bool = False,
        trainer_class: type[SFTTrainer] = SFTTrainer,
        train_set: Dataset | None = None,
        packing: bool = False,
        order: str = "sequential",
    ) -> SFTTrainer:
        """Today's trainer for batch ``batch_size`` x accumulation ``accumulation``, not yet trained.

        ``fixed=True`` applies the core's fix (``trainer.model_accepts_loss_kwargs = True``); ``logging=True``
        logs the step (``logged_first_step`` reads the row; the Trainer prints nothing); ``train_set`` replaces
        the lesson's rows; ``order="random"`` reads them in the seed's random order (the same for every batching,
        so the first window holds the same rows).
        """
        name = f"step-{trainer_class.__name__}-{batch_size}x{accumulation}{'-packed' * packing}{'-fixed' * fixed}"
        args = SFTConfig(
            **{**self.run.trainer_kwargs(name, logging=logging, progress=False), "bf16": False},
            per_device_train_batch_size=batch_size,
            gradient_accumulation_steps=accumulation,
            max_grad_norm=0,
            train_sampling_strategy=order,
            max_steps=1,
            **({"packing": True, "max_length": self.packing_length} if packing else {}),
        )
        trainer = trainer_class(
            model=self.make_model(),
            args=args,
            processing_class=self.tokenizer,
            train_dataset=self.train_set if train_set is None else train_set,
        )
        if fixed:
            trainer.model_accepts_loss_kwargs = True  # the core's fix: the Trainer counts the window's label tokens
        return quiet(trainer)

    def run_step(
        self,
        batch_size: int,
        accumulation: int,
        normalisation: str = "today",
        trainer_class: type[SFTTrainer] = SFTTrainer,
        packing: bool = False,
        order: str = "sequential",
    ) -> tuple[torch.Tensor, float]:
        """The deep dive's step: the first gradient and the training loss the Trainer reports for it;
        ``normalisation="old"`` re-creates the pre-4.46 path (``recreate_pre_446_loss``)."""
        trainer = self.trainer(batch_size, accumulation, trainer_class=trainer_class, packing=packing, order=order)
        if normalisation == "old":
            recreate_pre_446_loss(trainer)
        recorder = StepRecorder().watch(trainer)  # keeps what the Trainer logs (and stops it printing raw dicts)
        gradient = first_step_gradient(trainer)
        return gradient, recorder.last("train_loss")


def logged_first_step(trainer: SFTTrainer) -> tuple[torch.Tensor, dict]:
    """Train one step (the Trainer's printed rows left out); the step's gradient and the row it logged."""
    capture = GradientCapture()
    trainer.add_callback(capture)
    trainer.train()
    return capture.gradient, next(row for row in trainer.state.log_history if "loss" in row)


def window(trainer: SFTTrainer, micro_batches: int) -> list[dict]:
    """The first ``micro_batches`` batches of the trainer's own dataloader: what its first window trains on."""
    return [batch for batch, _ in zip(trainer.get_train_dataloader(), range(micro_batches))]


def label_tokens(batch: dict) -> int:
    """Label tokens the loss sees in a batch: a causal LM's loss shifts the labels, so position 0 never counts."""
    return int(targets(batch).sum())


def weighted_token_gradient(model: PreTrainedModel, batches: Sequence[dict], weights: Sequence[float]) -> torch.Tensor:
    """In plain torch: the gradient of sum_i w_i x (summed token loss of micro-batch i), on the model's current
    weights. Weights 1/(N n_i) give the mean of per-micro-batch means, 1/sum(n) the mean over all label tokens."""
    model.zero_grad()
    for batch, weight in zip(batches, weights):
        logits = model(input_ids=batch["input_ids"], attention_mask=batch.get("attention_mask")).logits[..., :-1, :]
        labels = batch["labels"][..., 1:]
        token_sum = F.cross_entropy(
            logits.flatten(0, 1).float(), labels.flatten(), ignore_index=IGNORE_INDEX, reduction="sum"
        )
        (weight * token_sum).backward()
    return torch.cat([p.grad.flatten() for p in model.parameters() if p.requires_grad and p.grad is not None]).double()


def held_out_curve(trainer: SFTTrainer) -> dict[str, list[float]]:
    """Train (without the Trainer printing its rows), then what it logged: the held-out loss at each evaluation
    and the training loss at each step."""
    quiet(trainer).train()
    history = trainer.state.log_history
    evaluations = [row for row in history if "eval_loss" in row]
    return {
        "steps": [row["step"] for row in evaluations],
        "held_out": [row["eval_loss"] for row in evaluations],
        "training_loss": [row["loss"] for row in history if "loss" in row],
    }


def plot_core(counts: Sequence[int], curves: dict[str, dict], output_dir: Path) -> Path:
    """The core's figure: each micro-batch's token weight against its label count, old and right, and the held-out
    loss of the report's run without and with the fix."""
    n = len(counts)
    bad, good = curves["without_fix"], curves["with_fix"]
    fig, (ax_weight, ax_loss) = plotting.figure(
        2,
        title=f"Batch 1 x {n} without the fix: a short answer's tokens weigh {max(counts) / min(counts):.0f}x a long "
        f"one's,\nand {bad['steps'][-1]} steps end at held-out loss {bad['held_out'][-1]:.2f} against "
        f"{good['held_out'][-1]:.2f} with it",
    )
    shown = sorted(set(counts))
    plotting.line(ax_weight, shown, [1 / (n * c) for c in shown], "bad", f"without the fix: 1/({n} n)")
    plotting.line(ax_weight, shown, [1 / sum(counts)] * len(shown), "fixed", f"with it, as one batch: 1/{sum(counts)}")
    ax_weight.set_xscale("log")
    plotting.label(
        ax_weight,
        f"label tokens n in the micro-batch (window of {n})",
        "weight of one token",
        "who gets which weight",
        log_y=True,
    )
    plotting.line(ax_loss, bad["steps"], bad["held_out"], "bad", f"batch 1 x {n}, without the fix")
    plotting.line(ax_loss, good["steps"], good["held_out"], "fixed", f"batch 1 x {n}, with it (= batch {n})")
    plotting.label(ax_loss, "optimizer step", "held-out loss (nats/token)", "the report's run")
    return plotting.save(fig, output_dir, "gradient_accumulation")
