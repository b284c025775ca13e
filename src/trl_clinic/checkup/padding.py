"""Probe 4 (lesson 04): right-padded forwards with a KV cache, where a version and kernel make them fail.

Lesson 04's ``ForwardAudit`` counts the forwards one training loss and one evaluation step really
make on a batch from the trainer's own collator: how many are right-padded with a cache on. That
combination raised for Qwen2 + FlashAttention-2 in transformers 4.49.0-4.52.4 (met by TRL 0.17's
DPO evaluation) and in 4.37.0-4.41.2; the version windows are the entries of ``known_bugs.yaml`` whose
``probe`` is ``padding_cache``.
"""

from __future__ import annotations

import torch

from trl_clinic.checkup.engine import Finding, Skip, probe
from trl_clinic.checkup.view import TrainerView
from trl_clinic.probes.padding import ForwardAudit


@torch.no_grad()
def audit(view: TrainerView, batch: dict) -> dict[str, dict[str, dict]]:
    """The forwards of one training loss and one evaluation step on ``batch``, as ForwardAudit counts them
    (the policy's, and the reference model's where the trainer has one)."""
    trainer, model = view.trainer, view.model
    models = {"policy": view.base_model}
    if getattr(trainer, "ref_model", None) is not None:
        models["reference"] = trainer.ref_model
    recorder = ForwardAudit(**models)
    try:
        model.train()
        trainer.compute_loss(model, view.to_device(dict(batch)))
        model.eval()
        trainer.prediction_step(model, view.to_device(dict(batch)), prediction_loss_only=True)
    finally:
        recorder.remove()
    return recorder.summary()


@probe("padding_cache", "04", "right-padded rows run with a KV cache on versions and kernels where that raises "
       "(Qwen2 + FlashAttention-2 on transformers 4.37.0-4.41.2 and 4.49.0-4.52.4, met by TRL 0.17's DPO evaluation); "
       "the forwards are counted "
       "on one training and one evaluation step.")
def padding_cache(view: TrainerView) -> Finding:
    if view.kind == "grpo":
        raise Skip("GRPO pads prompts left itself for generation (trl 1.16 grpo_trainer.py, padding_side='left')")
    table = audit(view, view.batch(max(2, view.args.per_device_train_batch_size)))
    rows = [row for modes in table.values() for row in modes.values()]
    risky = sum(row["right_padded_with_cache"] for row in rows)
    measured = f"{risky} of {sum(row['forwards'] for row in rows)} forwards right-padded with a cache built"
    from trl_clinic.checkup.known_bugs import Facts, matching  # registered after this probe: the table's order

    windows = matching(Facts.from_view(view), probe_name="padding_cache")
    if risky and windows:
        entry = windows[0]
        return Finding("padding_cache", "fail", measured, value=risky, fix=f"{entry['fix']} ({entry['bug']})")
    reason = ("no known-bugs window applies to these versions, model and kernel" if risky
              else "no right-padded forward builds a cache")
    return Finding("padding_cache", "ok", measured, value=risky, reason=reason)
