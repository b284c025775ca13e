"""Capturing the gradient a real Trainer step produced, and comparing two of them."""

from __future__ import annotations

import torch
from transformers import Trainer, TrainerCallback

from trl_clinic.probes.labels import targets
from trl_clinic.probes.recording import quiet


class GradientCapture(TrainerCallback):
    """Keeps a copy of the accumulated gradient just before the first optimizer step, then stops training.

    ``on_pre_optimizer_step`` runs after gradient clipping: pass ``max_grad_norm=0`` to the config to
    see the gradient exactly as accumulation produced it.
    """

    def __init__(self) -> None:
        self.gradient: torch.Tensor | None = None

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        if self.gradient is None:
            grads = [
                _whole(p.grad).detach().flatten() for p in model.parameters() if p.requires_grad and p.grad is not None
            ]
            self.gradient = torch.cat(grads).double().cpu()
        control.should_training_stop = True
        return control


def _whole(grad: torch.Tensor) -> torch.Tensor:
    """FSDP2 leaves each process its shard of a gradient (a DTensor): gather the whole one (a collective)."""
    return grad.full_tensor() if hasattr(grad, "full_tensor") else grad


def first_step_gradient(trainer: Trainer) -> torch.Tensor:
    """Train ``trainer`` for one optimizer step and return the gradient that step was given."""
    capture = GradientCapture()
    quiet(trainer).add_callback(capture)  # a one-step probe: its train metrics say nothing
    trainer.train()
    return capture.gradient


def relative_error(gradient: torch.Tensor, reference: torch.Tensor) -> float:
    return ((gradient - reference).norm() / reference.norm()).item()


def cosine(gradient: torch.Tensor, reference: torch.Tensor) -> float:
    return torch.nn.functional.cosine_similarity(gradient, reference, dim=0).item()


def label_counts(trainer: Trainer, batches: int | None = None) -> list[int]:
    """Label tokens the loss sees in each of the trainer's first ``batches`` training batches (all by default).

    Read from the trainer's own dataloader, so collation, packing and sampling are the real ones; counted as
    ``probes.labels.targets`` counts them (a causal LM's loss shifts the labels: the first position never counts).
    """
    loader = trainer.get_train_dataloader()
    return [int(targets(batch).sum()) for batch, _ in zip(loader, range(batches or len(loader)))]
