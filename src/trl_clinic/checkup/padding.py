"""Probe 4 (lesson 04): right-padded forwards with a KV cache, where a version and kernel make them raise.

Lesson 04's ``ForwardAudit`` counts the forwards the trainer really makes and how many run right-padded
rows with a cache built: one training loss and one evaluation step on a batch of its own collator, or for
GRPO one generation of the trainer's own (prompts padded left) and the loss on it (prompt + completions,
right-padded). With FlashAttention-2 set, transformers 4.37.0-4.41.2 and 4.49.0-4.52.4 raise on such a
forward for Qwen2 (and other families, ``known_bugs.yaml``) before any kernel runs, so on those versions
the probe meets the error itself: a measured fail. Elsewhere the count is information (a scoring forward
with a cache gives the same logits); where the table says this family and version would raise with
FlashAttention-2 but the model runs another kernel, it warns.
"""

from __future__ import annotations

import traceback

import torch

from trl_clinic.checkup.engine import Skip, probe
from trl_clinic.checkup.grpo import generated, refused_keyword
from trl_clinic.checkup.known_bugs import Facts, matching
from trl_clinic.checkup.step import window
from trl_clinic.checkup.view import TrainerView
from trl_clinic.probes.finding import Finding
from trl_clinic.probes.padding import ForwardAudit

GUARD = "padding_side='right'"  # the words of transformers' own ValueError (modeling_qwen2.py and the others)
MAX_PROMPTS = 2


def _grpo_rows(view: TrainerView) -> list[dict]:
    """Prompts as GRPO's sampler hands them to the trainer: each repeated num_generations times (trl 0.14.0: once,
    its loss generates the num_generations completions)."""
    repeat = 1 if view.grpo_batch_counts_prompts else view.args.num_generations
    return [row for row in view.grpo_prompts(MAX_PROMPTS) for _ in range(repeat)]


def _extreme_batch(view: TrainerView) -> dict:
    """Two rows of the first max(2, b) through the trainer's collator, the shortest and the longest, where each row
    is one token list (``input_ids``: SFT, a plain Trainer): a collated batch is right-padded only where its rows
    differ in length, so these two pad exactly when the b rows do, at half the forwards' cost where b is 4. Rows of
    several lists (DPO's ``prompt_ids``, ``chosen_ids`` and ``rejected_ids``; a reward model's pair) are padded by
    their sums or by each list, so they keep all b rows, as does a dataset that cannot be read ahead (its
    dataloader's first batch)."""
    b = max(2, view.args.per_device_train_batch_size)
    try:
        rows = view.samples(b)
    except Skip:
        return view.batch(b)
    lists = [[key for key, value in row.items() if key.endswith("ids") and isinstance(value, list)] for row in rows]
    if b > 2 and all(keys == ["input_ids"] for keys in lists):
        lengths = [len(row["input_ids"]) for row in rows]
        shortest, longest = lengths.index(min(lengths)), lengths.index(max(lengths))
        rows = [rows[i] for i in sorted((shortest, longest))] if shortest != longest else rows[:2]
    return view.trainer.data_collator(rows)


def _steps(view: TrainerView) -> list[tuple[str, callable]]:
    """(phase, call) for the forwards the probe makes the trainer run."""
    trainer, model = view.trainer, view.model
    if view.kind == "grpo":
        rows = _grpo_rows(view)

        def grpo_step():
            model.train()
            with window(trainer, trainer.args.gradient_accumulation_steps):  # as the training loop sets it
                try:
                    grpo_loss()
                except TypeError as error:
                    if refused_keyword(error, trainer) is None:
                        raise
                    raise Skip(
                        "the trainer's call of its reward functions raised before its scoring forwards ran "
                        "(equal_rewards names the keyword and the fix)"
                    ) from error

        def grpo_loss():
            if hasattr(trainer, "_generate_and_score_completions"):  # trl >= 0.16
                inputs = generated(trainer, rows)
            else:  # 0.15 generates in _prepare_inputs, 0.14 in compute_loss
                inputs = trainer._prepare_inputs(rows)
            trainer.compute_loss(model, inputs)

        return [("a generation and its training loss", grpo_step)]
    batch = _extreme_batch(view)

    def train_step():
        model.train()
        trainer.compute_loss(model, view.to_device(dict(batch)))

    def eval_step():
        model.eval()
        trainer.prediction_step(model, view.to_device(dict(batch)), prediction_loss_only=True)

    return [("the training loss", train_step), ("the evaluation step", eval_step)]


@torch.no_grad()
def audit(view: TrainerView) -> tuple[dict[str, dict[str, dict]], list[str]]:
    """The forwards of the probe's steps as ForwardAudit counts them (the policy's, and the reference model's
    where the trainer has one), and the right-padding errors transformers raised, each with where."""
    trainer = view.trainer
    models = {"policy": view.base_model}
    if getattr(trainer, "ref_model", None) is not None:
        models["reference"] = trainer.ref_model
    recorder = ForwardAudit(**models)
    raised = []
    try:
        for phase, step in _steps(view):
            try:
                step()
            except ValueError as error:
                if GUARD not in str(error):
                    raise
                frame = traceback.extract_tb(error.__traceback__)[-1]
                raised.append(
                    f"{phase} raised transformers' ValueError ({frame.filename.rsplit('/', 1)[-1]}, "
                    f"{frame.name}): {str(error).split('.')[0]}"
                )
    finally:
        recorder.remove()
    return recorder.summary(), raised


@probe(
    "padding_cache",
    "04",
    "right-padded rows run with a KV cache where transformers raises on them with "
    "FlashAttention-2 (Qwen2 and other families on 4.37.0-4.41.2 and 4.49.0-4.52.4; met by TRL 0.12-0.17's DPO "
    "evaluation and 0.15-0.21's GRPO scoring): the forwards of one training and one evaluation step on the "
    "shortest and longest rows (GRPO: one generation and its loss) are counted, and the error is met for real where "
    "it exists.",
)
def padding_cache(view: TrainerView) -> Finding:
    table, raised = audit(view)
    rows = [row for modes in table.values() for row in modes.values()]
    risky = sum(row["right_padded_with_cache"] for row in rows)
    padded = sum(row["right_padded"] for row in rows)
    measured = (
        f"{risky} of {sum(row['forwards'] for row in rows)} forwards right-padded with a cache built "
        f"({padded} right-padded)"
    )
    facts = Facts.from_view(view)
    entries = matching(facts, probe_name="padding_cache")
    windows = [e for e in entries if "model_type" in e["when"]]  # where the guard lives
    causes = [e for e in entries if "model_type" not in e["when"]]  # who builds the cache
    cause = f"; {causes[0]['bug']} ({causes[0]['fix']})" if causes and windows else ""
    if raised:
        entry = windows[0] if windows else causes[0] if causes else None
        fix = (
            f"{entry['fix']} ({entry['bug']})" if entry else "pass use_cache=False in the scoring forwards, or pad left"
        )
        return Finding(
            "padding_cache",
            "fail",
            f"{measured}; {raised[0]}",
            value=len(raised),
            decided="measured",
            known_bug=entry["id"] if entry else "",
            fix=fix + cause,
        )
    if risky and windows and facts.attn_implementation != "flash_attention_2":
        entry = windows[0]
        return Finding(
            "padding_cache",
            "warn",
            f"{measured}; the model runs {facts.attn_implementation}",
            value=risky,
            decided="table",
            known_bug=entry["id"],
            fix=f"with attn_implementation='flash_attention_2' these forwards raise here: {entry['fix']} "
            f"({entry['bug']}){cause}",
        )
    reason = (
        "no version of the table raises on this family with this kernel"
        if risky
        else "no right-padded forward builds a cache"
    )
    return Finding("padding_cache", "ok", measured, value=risky, decided="measured", reason=reason)
