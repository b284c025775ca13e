"""Probe: DPO pairs whose chosen and rejected completions are the same tokens once the collator has truncated them.

TRL 1.16.0's ``DataCollatorForPreference`` cuts prompt+chosen and prompt+rejected to ``max_length`` (keep_start) in
the collator, and the trainer drops only rows whose prompt alone fills ``max_length``. A pair whose difference lies
past ``max_length`` reaches the loss as two identical sequences: their log-ratios are equal, the DPO loss is
exactly ln 2 and its gradient exactly 0 (measured: margins 0.0, rewards/accuracies 0.0, loss 0.6931472 at every
step, grad_norm 2e-6, when every pair was cut so). The probe reads the trainer's own collated batches.
"""

from __future__ import annotations

import torch

from trl_clinic.checkup.engine import Skip, probe
from trl_clinic.checkup.view import TrainerView
from trl_clinic.probes.finding import Finding

BATCHES = 4  # the first batches of the trainer's collator
FAIL_SHARE = 0.5  # half the pairs teach nothing: fail; any identical pair: warn


def identical(batch: dict) -> tuple[int, int]:
    """(identical pairs, pairs) of a preference batch: chosen rows first, rejected rows second, completion tokens
    where ``completion_mask`` is 1."""
    ids, mask = batch["input_ids"], batch["completion_mask"].bool()
    n = ids.shape[0] // 2
    same = sum(torch.equal(ids[i][mask[i]], ids[n + i][mask[n + i]]) for i in range(n))
    return same, n


def _longest(view: TrainerView, rows: list[dict]) -> int | None:
    """The longest prompt + completion of the rows before truncation (TRL's tokenized columns), if readable."""
    keys = ("prompt_ids", "chosen_ids", "rejected_ids")
    if not all(key in rows[0] for key in keys):
        return None
    return max(len(r["prompt_ids"]) + max(len(r["chosen_ids"]), len(r["rejected_ids"])) for r in rows)


@probe(
    "identical_pairs",
    "-",
    "DPO pairs whose chosen and rejected completions are identical after the collator's max_length truncation "
    "(their difference lies past max_length): each gives loss ln 2 and zero gradient, and a run made of them logs "
    "rewards/margins 0 and rewards/accuracies 0 for every step.",
)
def identical_pairs(view: TrainerView) -> Finding:
    if view.kind != "dpo":
        raise Skip("not a DPO trainer")
    b = view.args.per_device_train_batch_size
    n = min(BATCHES, len(view.rows) // b)
    if n == 0:
        raise Skip(f"fewer rows than one batch of {b}")
    rows = view.samples(n * b)
    batches = [view.trainer.data_collator(rows[i * b : (i + 1) * b]) for i in range(n)]
    if "completion_mask" not in batches[0]:
        raise Skip("the preference batches carry no completion_mask to tell the completions apart")
    counts = [identical(batch) for batch in batches]
    same, pairs = sum(c[0] for c in counts), sum(c[1] for c in counts)
    share = same / pairs
    longest, limit = _longest(view, rows), getattr(view.args, "max_length", None)
    measured = f"{same} of {pairs} pairs identical after truncation (max_length {limit}" + (
        f"; longest prompt+completion {longest} tokens)" if longest is not None else ")"
    )
    if same == 0:
        return Finding(
            "identical_pairs", "ok", measured, value=0.0, decided="measured", reason="chosen and rejected differ"
        )
    return Finding(
        "identical_pairs",
        "fail" if share >= FAIL_SHARE else "warn",
        measured,
        value=share,
        decided="measured",
        fix=f"raise max_length to at least {longest} (their difference lies past it), or drop pairs whose chosen and "
        "rejected differ only after max_length"
        if longest is not None and limit is not None and longest > limit
        else "drop pairs whose chosen and rejected completions are the same text",
    )
