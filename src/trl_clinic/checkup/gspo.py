"""Probe: GSPO's sequence-level importance ratio under a loss that sums tokens.

``importance_sampling_level="sequence"`` gives each completion one ratio (shape (B, 1) in TRL 1.16.0's
``GRPOTrainer._compute_loss``), which the loss broadcasts over the completion's tokens; ``bnpo``, ``dr_grpo``,
``dapo`` (GRPOConfig's default) and ``cispo`` then sum over tokens, so a completion weighs by its length instead
of once (TRL #3823). Measured on a real GRPOTrainer: d loss / d advantage per completion was length / total tokens
with ``dapo`` (lengths 2-6: weights 0.057-0.171, spread 3.0 = the length spread) and 1/8 each with ``grpo``.
TRL 1.16.0 only logs a warning at the trainer's start (PR #6042).
"""

from __future__ import annotations

from trl_clinic.checkup.engine import Skip, probe
from trl_clinic.checkup.view import TrainerView
from trl_clinic.probes.finding import Finding

TOKEN_SUMMED = ("bnpo", "dr_grpo", "dapo", "cispo")  # the loss types of TRL's warning (grpo_trainer.py, 1.16.0)


@probe(
    "gspo_loss",
    "-",
    "GSPO (importance_sampling_level='sequence') with a loss_type that sums tokens (bnpo, dr_grpo, dapo: "
    "GRPOConfig's default, cispo): each completion's sequence-level term weighs by its length instead of once "
    "(TRL #3823, PR #6042).",
)
def gspo_loss(view: TrainerView) -> Finding:
    if view.kind != "grpo":
        raise Skip("not a GRPO trainer")
    level = getattr(view.args, "importance_sampling_level", "token")
    loss_type = getattr(view.args, "loss_type", None)
    if level != "sequence":
        raise Skip(f"importance_sampling_level={level!r}: token-level ratios, not GSPO")
    measured = f"importance_sampling_level='sequence' with loss_type={loss_type!r}"
    if loss_type not in TOKEN_SUMMED:
        return Finding(
            "gspo_loss", "ok", measured, decided="config", reason="each completion's sequence term counts once"
        )
    return Finding(
        "gspo_loss",
        "warn",
        measured + ": each completion weighs by its length",
        decided="config",
        fix="loss_type='grpo' (the GSPO paper's per-sequence objective)",
    )
