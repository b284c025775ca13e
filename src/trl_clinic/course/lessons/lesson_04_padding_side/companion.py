"""Companion of lesson 04 (core.py and its deep dive): the eras' printouts, the
models and trainers the lesson builds, the padding grid, the printed tables and the figures, which the
notebooks call in one line each.

The lines that show the bug and the fix stay in the notebooks: the era's error and the config that raised it,
``padding_side`` of each batch, ``use_cache`` in the config or ``DPOConfig(model_init_kwargs=...)``, the
portable forward hook and the ``ForwardAudit`` of the policy and the reference model.
"""

from __future__ import annotations

import contextlib
import logging
import textwrap
from collections.abc import Iterator
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, GPT2Config, PreTrainedModel, PreTrainedTokenizerBase
from trl import DPOConfig, DPOTrainer, SFTConfig, SFTTrainer

from trl_clinic.course import data, plotting
from trl_clinic.course.eras import EraRun

# the deep dive calls companion.guard_families(): today's transformers read as the era script reads its own
from trl_clinic.course.lessons.lesson_04_padding_side.then import guard_families  # noqa: F401
from trl_clinic.course.models import MODEL_SIZES, make_causal_lm, trained_model
from trl_clinic.course.run import Run
from trl_clinic.course.runtime import checkpointing_flag
from trl_clinic.probes.padding import completion_logprob
from trl_clinic.probes.recording import StepRecorder, quiet

# the era's runs that fail, each beside the same run with the fix and nothing else changed (the core's checks
# read them as the run without and with the fix); the core runs them all, the deep dive the rest
PAIRS = {
    "evaluate": ("as_reported", "as_reported_no_cache"),
    "train_step": ("train_defaults", "train_defaults_no_cache"),
    "train_checkpointing": ("train_checkpointing", "train_checkpointing_no_cache"),
    "tokenizer_left": ("tokenizer_left", "tokenizer_left_no_cache"),
    "model_path": ("path_defaults", "path_model_init_kwargs"),
    "explicit_ref": ("explicit_ref_path", "explicit_ref_path_fixed"),
}
CORE_SCENARIOS = [name for pair in PAIRS.values() for name in pair] + ["cache_audit"]
GRID_PROMPTS = ["A, B, C,", "A, B,"]  # the mechanism: one row two tokens shorter than the other
# chat questions of different lengths for SmolLM2 (the longest is the one that gets no padding)
QUESTIONS = [
    "What is the capital of France?",
    "Name a colour.",
    "In one short sentence, what does a baker make every morning?",
    "Say hello.",
    "Which animal says moo?",
    "What is two plus two? Answer with a number.",
]
VERDICTS = {
    "guard": "raises the padding_side='right' ValueError",
    "missing_flash_kernel": "gets past the check (then stops at the first flash kernel call *)",
    "finished": "gets past the check and finishes",
}
# said once under a table that has it, not after every run
KERNEL_NOTE = "* {error} (flash-attn, which needs a CUDA GPU, is not installed)"
SHOWN: set[str] = set()  # the kernel errors this process has printed


# ---- the eras --------------------------------------------------------------------------------------------


def descriptions(era: EraRun, group: str) -> dict[str, str]:
    """What each of the era script's runs did, in words (``scenarios`` or ``direct_forward``)."""
    return era.result.get("scenario_descriptions" if group == "scenarios" else "direct_forward_descriptions", {})


def show_error(era: EraRun, name: str = "as_reported", group: str = "scenarios") -> None:
    """The era's real error as the user's traceback showed it (the library frames), or why the era part
    did not run (``skipped: ... run `make eras```), which never stops the lesson."""
    print(era.describe())
    if era.finished:
        outcome = era.result[group][name]
        shown = (outcome.get("user_traceback") or "nothing raised").splitlines()
        last = textwrap.fill(shown[-1], width=116, subsequent_indent="    ")  # the message, folded to the screen
        print(f"\n{descriptions(era, group).get(name, name)}:\n\n" + "\n".join([*frames(shown[:-1]), last]))


def frames(traceback: list[str], first: int = 2, last: int = 3) -> list[str]:
    """A traceback's header, its ``first`` frames (the user's call into the trainer) and its ``last`` ones (where it
    raised), the frames between counted in one line: the whole stack is 40 lines, more than a screen."""
    header, body = traceback[:1], traceback[1:]
    starts = [i for i, line in enumerate(body) if line.lstrip().startswith("File ")] + [len(body)]
    stack = [body[a:b] for a, b in zip(starts, starts[1:])]
    if len(stack) <= first + last:
        return traceback
    hidden = len(stack) - first - last
    return [
        *header,
        *sum(stack[:first], []),
        f"  ... {hidden} frames in torch and transformers ...",
        *sum(stack[-last:], []),
    ]


def said(outcome: dict) -> str:
    """What one outcome of the era script was, in words."""
    return VERDICTS.get(outcome["verdict"], "other error: {error}").format(error=outcome["error"])


def show_scenarios(era: EraRun, names: list[str] | None = None, group: str = "scenarios") -> None:
    """Each run of the era script, one line each, with the reference model's forward or the evaluation that
    followed where the scenario ran one (``cache_audit``: its counted forwards); the missing kernel's error once,
    under the runs it ended."""
    if not era.finished:
        print(f"not run ({era.status})")
        return
    kernel = None
    for name in names or list(era.result[group]):
        if name == "cache_audit":  # counts, not a verdict: its own lines
            show_cache_audit(era)
            continue
        outcome = era.result[group][name]
        line = f"{descriptions(era, group).get(name, name)}: {said(outcome)}"  # one line where it fits the screen
        print(line if len(line) <= 120 else f"{descriptions(era, group).get(name, name)}:\n    {said(outcome)}")
        for step, what in (
            ("then_evaluate", "then evaluate()"),
            ("reference_forward", "the reference model's forward"),
        ):
            if step in outcome:
                print(f"    {what}: {said(outcome[step])}")
        found = [o for o in (outcome, outcome.get("then_evaluate"), outcome.get("reference_forward")) if o]
        kernel = kernel or next((o["error"] for o in found if o["verdict"] == "missing_flash_kernel"), None)
    if kernel:  # the same error once on a learner's screen, referred to after
        print(KERNEL_NOTE.format(error=kernel) if kernel not in SHOWN else "* the missing kernel's error, shown above")
        SHOWN.add(kernel)


# the runs of the fix table, each a failing run and the same run with the fix (PAIRS), in a few words
FIX_ROWS = {
    "evaluate": "evaluate(), DPOConfig defaults",
    "train_step": "train(), its first step",
    "train_checkpointing": "train(gradient_checkpointing=True), then evaluate()",
    "model_path": "evaluate(), a model path (policy; reference)",
    "explicit_ref": "evaluate(), ref_model=<path> (policy; reference)",
}
SHORT = {"guard": "ValueError", "missing_flash_kernel": "past the check *", "finished": "finishes"}


def brief_said(outcome: dict) -> str:
    """One outcome in a table cell: the ValueError, past the check, or the other error's type; with what followed
    it (then evaluate(), the reference model's forward) after a semicolon."""
    words = [SHORT.get(outcome["verdict"], outcome.get("error_type") or "other error")]
    words += [brief_said(outcome[step]) for step in ("then_evaluate", "reference_forward") if step in outcome]
    return "; ".join(words)


def show_fixes(era: EraRun) -> None:
    """Each failing run beside the same run with the fix, as one small table (the fix is the only change), and the
    missing kernel's error once under it."""
    if not era.finished:
        print(f"not run ({era.status})")
        return
    runs = era.result["scenarios"]
    rows = [(FIX_ROWS[pair], *(brief_said(runs[name]) for name in PAIRS[pair])) for pair in FIX_ROWS]
    head = (
        f"TRL {era.versions.get('trl')}, transformers {era.versions.get('transformers')}",
        "without the fix",
        "with the fix",
    )
    widths = [max(len(row[i]) for row in [head, *rows]) for i in range(3)]
    for row in [head, tuple("-" * width for width in widths), *rows]:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip())
    kernel = next(
        (o["error"] for o in runs.values() if isinstance(o, dict) and o.get("verdict") == "missing_flash_kernel"), None
    )
    if kernel:  # the missing kernel's error once on a learner's screen
        note = "the error shown above" if kernel in SHOWN else KERNEL_NOTE.format(error=kernel)[2:]
        print(textwrap.fill(f"* then stopped at the first flash kernel call: {note}", 116, subsequent_indent="    "))
        SHOWN.add(kernel)


def show_cache_audit(era: EraRun) -> None:
    """The era's real DPO evaluation of a plain Qwen2, counted by forward hooks: the cache nobody reads."""
    print("evaluate() of a plain Qwen2 (nothing re-created), its forwards counted:")
    if not era.finished:
        print(f"not run ({era.status})")
        return
    audit = era.result["scenarios"]["cache_audit"]
    for model, counts in audit["counts"].items():
        print(f"{model:>9}: {counts}; passed: {audit['asked'][model]}")


def era_record(era: EraRun) -> dict:
    """The era's numbers the checks read: status, versions, guard function and each outcome's verdict."""
    record = {"status": era.status}
    if not era.finished:
        return record

    def brief(outcome: dict) -> dict:
        row = {key: outcome.get(key) for key in ("verdict", "error_type", "message", "function", "in_training_step")}
        row["file"] = Path(outcome["file"]).name if outcome.get("file") else None
        row.update({step: brief(outcome[step]) for step in ("then_evaluate", "reference_forward") if step in outcome})
        row.update({key: outcome[key] for key in ("use_cache", "counts", "asked") if key in outcome})
        return row

    record.update(
        transformers=era.result["era_versions"]["transformers"],
        trl=era.result["era_versions"]["trl"],
        guard_function=era.result["guard_function"],
        guard_families=era.result["guard_families"],
        scenarios={name: brief(row) for name, row in era.result["scenarios"].items()},
        direct_forward={name: brief(row) for name, row in era.result["direct_forward"].items()},
    )
    return record


def era_sides(record: dict) -> tuple[dict, dict]:
    """The era's runs as the core's checks read them: each failing run (without the fix) and the same run with it,
    keyed by ``PAIRS``; empty when the era did not run."""
    if record["status"] != "finished":
        return {}, {}
    scenarios = record["scenarios"]
    return tuple({key: scenarios[pair[i]] for key, pair in PAIRS.items() if pair[i] in scenarios} for i in (0, 1))


def cache_audit_counts(record: dict) -> dict | None:
    """The era's DPO evaluation of a plain Qwen2, counted per model (``cache_audit``); None when it did not run."""
    if record["status"] != "finished" or "cache_audit" not in record["scenarios"]:
        return None
    return record["scenarios"]["cache_audit"]["counts"]


# ---- the models and trainers -----------------------------------------------------------------------------


def sft_checkpoint(run: Run, tokenizer: PreTrainedTokenizerBase) -> tuple[PreTrainedModel, Path]:
    """Deep dive: a Qwen2 trained briefly by SFT on the fixed-world instructions (so its generations mean
    something), saved so that DPO loads the policy and the reference model from it."""
    sizes = run.sizes
    sft = SFTTrainer(
        model=make_causal_lm(tokenizer, "qwen2", size=sizes.model_size, seed=run.seed),
        args=SFTConfig(
            **run.trainer_kwargs("sft"),
            per_device_train_batch_size=sizes.sft_batch_size,
            learning_rate=3e-3,
            max_steps=sizes.sft_steps,
        ),
        train_dataset=data.instruction_pairs(
            sizes.sft_batch_size * sizes.sft_steps, seed=run.subseed("sft"), max_people=2
        ),
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


def dpo_trainer(
    run: Run, checkpoint: Path, tokenizer: PreTrainedTokenizerBase, eval_batch_size: int, **config
) -> DPOTrainer:
    """Today's real DPOTrainer on ``checkpoint`` (a path: TRL loads the policy and the reference model),
    with activation checkpointing on (TRL's default), evaluating once at the end of ``dpo_steps`` steps."""
    sizes = run.sizes
    args = DPOConfig(
        **{**run.trainer_kwargs(f"dpo-{eval_batch_size}", logging=False), checkpointing_flag(): True},
        per_device_train_batch_size=4,
        per_device_eval_batch_size=eval_batch_size,
        max_steps=sizes.dpo_steps,
        eval_strategy="steps",
        eval_steps=sizes.dpo_steps,
        learning_rate=1e-4,
        **config,
    )
    return quiet(
        DPOTrainer(
            model=str(checkpoint),
            args=args,
            processing_class=tokenizer,
            train_dataset=data.preference_pairs(4 * sizes.dpo_steps, seed=run.subseed("dpo train")),
            eval_dataset=data.preference_pairs(sizes.dpo_eval_pairs, seed=run.subseed("dpo eval")),
        )
    )


def llama_sft_trainer(run: Run, tokenizer: PreTrainedTokenizerBase) -> SFTTrainer:
    """Deep dive: today's SFTTrainer with a tiny Llama, in fp32 on every profile so rounding cannot blur the
    eval-batch comparison. The eval rows alternate one-word answers and biographies
    (``data.instruction_pairs``), so every batch of 2 holds rows of different lengths."""
    sizes = run.sizes
    return quiet(
        SFTTrainer(
            model=make_causal_lm(tokenizer, "llama", size=sizes.model_size, seed=run.seed),
            args=SFTConfig(
                **{**run.trainer_kwargs("llama-sft", logging=False), "bf16": False},
                learning_rate=3e-3,
                per_device_train_batch_size=sizes.sft_batch_size,
                max_steps=sizes.llama_sft_steps,
            ),
            train_dataset=data.instruction_pairs(
                sizes.sft_batch_size * sizes.llama_sft_steps, seed=run.subseed("llama sft"), max_people=2
            ),
            eval_dataset=data.instruction_pairs(sizes.sft_eval_rows, seed=run.subseed("llama eval"), max_people=2),
            processing_class=tokenizer,
        )
    )


def tiny_gpt2(run: Run, tokenizer: PreTrainedTokenizerBase) -> PreTrainedModel:
    """Deep dive: a GPT-2 of the lesson's size (random init), a family that adds learned absolute position
    embeddings to the tokens instead of rotating queries and keys."""
    size = MODEL_SIZES[run.sizes.model_size]
    config = GPT2Config(
        vocab_size=len(tokenizer),
        n_embd=size["hidden_size"],
        n_layer=size["num_hidden_layers"],
        n_head=size["num_attention_heads"],
        n_positions=4096,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
    )
    torch.manual_seed(run.seed)
    return AutoModelForCausalLM.from_config(config).to(run.device).eval()


def core_numbers(
    report: EraRun, grid: dict, generation: dict, lengths: list[int], portable: dict, checkup_found, dpo_padding: dict
) -> dict:
    """The core's numbers for its checks (the lesson's checks.py): each side (right padding and the era's failing
    runs without the fix; left padding, the era's runs with it and today's DPO evaluation with it) with the same
    fields, and DPO's batches."""
    record = era_record(report)
    bad_era, fixed_era = era_sides(record)
    today = {
        "policy": portable["DPO evaluate(), policy"],
        "reference": portable["DPO evaluate(), reference"],
        "checkup": {"status": checkup_found.status, "value": checkup_found.value},
    }

    def side(name: str, era: dict, dpo_eval: dict | None) -> dict:
        shorter = shorter_rows(generation, lengths, name)
        changed = sum(generation[name]["changed"])
        return {
            "era": era,
            "dpo_eval": dpo_eval,
            "grid": grid[name],
            "hook": portable[f"generate(), {name} padding"],
            "generation": {"changed": changed, "shorter": shorter},
        }

    numbers = {
        "then": record,
        "prompts": len(lengths),
        "lengths": lengths,
        "dpo_padding": dpo_padding,
        "runs": {
            "without_fix": side("right", bad_era, cache_audit_counts(record)),
            "with_fix": side("left", fixed_era, today),
        },
        "shift": {s: generation[s]["first_token_logit_shift"] for s in ("left", "right")},
    }
    return numbers


@contextlib.contextmanager
def warnings_of(logger_name: str) -> Iterator[list[str]]:
    """The messages a library logs to ``logger_name`` while the block runs (TRL logs through ``logging``,
    which ``warnings.catch_warnings`` does not see)."""
    messages: list[str] = []
    handler = logging.Handler(level=logging.WARNING)
    handler.emit = lambda record: messages.append(record.getMessage())
    logger = logging.getLogger(logger_name)
    logger.addHandler(handler)
    try:
        yield messages
    finally:
        logger.removeHandler(handler)


# ---- the mechanism: one batched generate(), slot by slot -------------------------------------------------


@torch.no_grad()
def padding_grid(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, prompts: list[str], side: str, shown: int = 3
) -> list[dict]:
    """One batched greedy ``generate()`` of ``prompts`` padded on ``side``, as the model saw it, per row: each
    slot's token, whether it is a pad, the position the model was given (the prompt's forward, then each new
    token's forward), the slot whose logits gave the first new token (the cache-free forward of the same
    batch and positions, matched against the first step's logits: ``match_gap`` is the distance), and the
    first ``shown`` new tokens."""
    batch = tokenizer(prompts, padding=True, padding_side=side, return_tensors="pt").to(model.device)
    positions = []
    handle = model.base_model.register_forward_pre_hook(
        lambda module, args, kwargs: positions.append(kwargs.get("position_ids")), with_kwargs=True
    )
    try:
        out = model.generate(
            **batch,
            max_new_tokens=shown + 1,
            do_sample=False,
            output_logits=True,
            return_dict_in_generate=True,
            pad_token_id=tokenizer.pad_token_id,
        )
    finally:
        handle.remove()
    if any(p is None for p in positions):
        raise RuntimeError("generate() passed no position_ids to the model: this grid reads them")
    slots = (
        (model(**batch, position_ids=positions[0], use_cache=False).logits.float() - out.logits[0].float()[:, None, :])
        .abs()
        .amax(-1)
    )  # rows x slots
    width = batch["input_ids"].shape[1]
    rows = []
    for r in range(len(prompts)):
        best = slots[r].min().item()
        rows.append(
            {
                "tokens": [tokenizer.decode([t]) for t in batch["input_ids"][r].tolist()],
                "pad": (batch["attention_mask"][r] == 0).tolist(),
                "positions": positions[0][r].tolist(),
                "new_tokens": [tokenizer.decode([t]) for t in out.sequences[r, width : width + shown].tolist()],
                "new_positions": [p[r, -1].item() for p in positions[1 : shown + 1]],
                "predicted_from": max(i for i in range(width) if slots[r, i].item() <= best + 1e-3),
                "match_gap": best,
            }
        )
    return rows


def padding_grids(run: Run, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> dict[str, list[dict]]:
    """The mechanism: ``padding_grid`` of the two ``GRID_PROMPTS`` padded right and left, drawn and explained."""
    grid = {side: padding_grid(model, tokenizer, GRID_PROMPTS, side) for side in ("right", "left")}
    draw_grid(run, grid)
    explain_grid(grid)
    return grid


def explain_grid(grid: dict[str, list[dict]]) -> None:
    """The grid's finding for the shorter row, in a sentence per padding side, from the measured numbers."""
    for side, rows in grid.items():
        row = rows[-1]
        slot = row["predicted_from"]
        real = [p for p, pad in zip(row["positions"], row["pad"]) if not pad]
        print(
            f"{side} padding, row 2: first new token {row['new_tokens'][0]!r} predicted from slot {slot} "
            f"({'a pad' if row['pad'][slot] else repr(row['tokens'][slot])});\n    new tokens at positions "
            f"{row['new_positions']}, its prompt's real tokens at {real}"
        )


def draw_grid(run: Run, grid: dict[str, list[dict]]) -> None:
    """The mechanism: both padded batches as grids of slots (pads grey, new tokens blue), each slot with its
    position, and the slot each row's first new token was predicted from framed (red when it is a pad)."""
    right, left = grid["right"][-1], grid["left"][-1]
    fig, axes = plotting.figure(
        2,
        title=f"Right padding: the short row's first new token comes from a pad "
        f"({right['new_tokens'][0]!r} instead of {left['new_tokens'][0]!r})",
        height=2.6,
    )
    for ax, (side, rows) in zip(axes, grid.items()):
        for y, row in enumerate(rows):
            cells = [(t, p, pad, False) for t, p, pad in zip(row["tokens"], row["positions"], row["pad"])]
            cells += [(t, p, False, True) for t, p in zip(row["new_tokens"], row["new_positions"])]
            for x, (token, position, pad, new) in enumerate(cells):
                x += new  # a gap between the prompt's slots and the new tokens
                framed = not new and x == row["predicted_from"]
                edge = (plotting.BAD if pad else plotting.FIXED) if framed else plotting.REFERENCE
                ax.add_patch(
                    plotting.plt.Rectangle(
                        (x, -y),
                        0.95,
                        0.9,
                        facecolor="#dddddd" if pad else ("#cfe3f5" if new else "white"),
                        edgecolor=edge,
                        linewidth=3 if framed else 0.8,
                    )
                )
                ax.text(x + 0.47, -y + 0.55, "pad" if pad else token.strip() or repr(token), ha="center", fontsize=9)
                ax.text(x + 0.47, -y + 0.15, f"pos {position}", ha="center", fontsize=7, color=plotting.REFERENCE)
            ax.text(-0.15, -y + 0.45, f"row {y + 1}", ha="right", va="center", fontsize=8)
        ax.set_xlim(-1.0, len(cells) + 1.2)
        ax.set_ylim(-len(rows) + 0.8, 1.1)
        ax.set_axis_off()
        ax.set_title(f"{side} padding: prompt slots | new tokens", fontsize=10)
    plotting.save(fig, run.output_dir, "padding_grid")


def print_generation(generation: dict, lengths: list[int]) -> None:
    """Each prompt's answer one at a time and in the right- and left-padded batches."""
    for i, question in enumerate(QUESTIONS[: len(lengths)]):
        shift = {side: generation[side]["first_token_logit_shift"][i] for side in ("right", "left")}
        print(
            f"[{lengths[i]} tokens] {question}\n    alone: {generation['single']['outputs'][i]!r}\n"
            f"    right-padded batch: {generation['right']['outputs'][i]!r} "
            f"(first-token logits moved {shift['right']:.2g})"
            f"\n    left-padded batch:  {generation['left']['outputs'][i]!r} (moved {shift['left']:.2g})"
        )


def shorter_rows(generation: dict, lengths: list[int], side: str = "right") -> dict:
    """The padded rows (shorter than the longest prompt) against the unpadded ones: first-token logit shifts
    and changed outputs for ``side`` (in a left-padded batch the same rows carry their pads first)."""
    longest = max(lengths)
    shift, changed = generation[side]["first_token_logit_shift"], generation[side]["changed"]
    padded = [i for i, n in enumerate(lengths) if n < longest]
    full = [i for i, n in enumerate(lengths) if n == longest]
    return {
        "padded_rows": len(padded),
        "min_shift_padded": min((shift[i] for i in padded), default=None),
        "max_shift_unpadded": max(shift[i] for i in full),
        "changed_unpadded": sum(changed[i] for i in full),
        "changed_padded": sum(changed[i] for i in padded),
    }


# ---- the deep dive's tables ---------------------------------------------------------------------------------


def print_audit(name: str, summary: dict) -> None:
    """One line per model and mode of a ``ForwardAudit.summary()``, then who asked for what."""
    for model, modes in summary.items():
        for mode, row in modes.items():
            print(
                f"{name} | {model:>9} {mode:>5}: {row['forwards']:>3} forwards, {row['right_padded']:>3} right-padded, "
                f"{row['cache_built']:>3} built a cache, {row['right_padded_with_cache']:>3} right-padded with a cache"
            )
            for asked, count in row["asked"].items():
                print(f"{'':>24}{count:>3} x {asked}")


def explain_batch_effect(sft_eval: dict, predicted: dict, gap: dict) -> None:
    """The measured eval-batch effect against the one predicted from rows scored alone."""
    effect = sft_eval[2]["eval_loss"] - sft_eval[1]["eval_loss"]
    padding_changes_nothing = gap[2] < 1e-5
    print(f"eval batch 2 vs 1: {effect:+.2e}; predicted from rows scored alone: {predicted[2] - predicted[1]:+.2e}")
    print(
        f"evaluate() vs the prediction: batch 1 off by {gap[1]:.1e}, batch 2 (right-padded) off by {gap[2]:.1e}: "
        f"the padding changes {'nothing' if padding_changes_nothing else 'the loss'}; the {abs(effect):.1e} "
        "difference is "
        + ("how evaluate() weights rows" if padding_changes_nothing else "not explained by the weighting")
    )


def explain_rounding(worst: dict, bf16_error: float, typical_logprob: float) -> None:
    """The batching differences against each precision's unit roundoff and bf16's own error."""
    print(
        f"largest batching difference: fp32 {worst['fp32']:.1e} nats, bf16 {worst['bf16']:.1e} nats "
        f"({worst['bf16'] / max(worst['fp32'], 1e-12):.0f}x more), on completions of {typical_logprob:.1f} nats"
    )
    print(
        f"relative to the completion's log-prob: fp32 {worst['fp32'] / typical_logprob:.1e} (unit roundoff "
        f"{2**-24:.1e}), bf16 {worst['bf16'] / typical_logprob:.1e} (unit roundoff {2**-8:.1e})"
    )
    print(
        f"bf16 vs fp32, the same sequences one at a time: up to {bf16_error:.1e} nats; batching moves bf16 "
        f"log-probs by {worst['bf16'] / bf16_error:.1f}x that: "
        + (
            "the size of bf16's own rounding, not a padding bug"
            if worst["bf16"] <= 2 * bf16_error
            else "more than bf16's own rounding explains"
        )
    )


@torch.no_grad()
def tokenizer_batch_logprobs(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, prompts: list[str], completions: list[str], side: str
) -> tuple[list[float], list[list[int]]]:
    """Each completion's summed log-prob from one batch padded by the tokenizer on ``side`` and scored with
    ``model(**batch, use_cache=False)``, no ``position_ids``: what a hand-written scoring loop does. Also the
    positions the model used (read where they enter it: the rotary embedding, or GPT-2's position embedding)."""
    prompt_ids = [tokenizer(p)["input_ids"] for p in prompts]
    full = [p + tokenizer(c)["input_ids"] for p, c in zip(prompt_ids, completions)]
    batch = tokenizer.pad({"input_ids": full}, padding=True, padding_side=side, return_tensors="pt").to(model.device)
    seen = []
    entry = getattr(model.base_model, "rotary_emb", None) or model.base_model.wpe
    handle = entry.register_forward_pre_hook(
        lambda module, args, kwargs: seen.append(kwargs.get("position_ids", args[-1])), with_kwargs=True
    )
    try:
        logits = model(**batch, use_cache=False).logits
    finally:
        handle.remove()
    width = batch["input_ids"].shape[1]
    offsets = [width - len(ids) if side == "left" else 0 for ids in full]
    scores = [
        completion_logprob(logits[i, o : o + len(ids)], ids, len(p))
        for i, (ids, p, o) in enumerate(zip(full, prompt_ids, offsets))
    ]
    first_positions = [seen[0].expand(len(full), -1)[i, o].item() for i, o in enumerate(offsets)]
    return scores, first_positions


def print_scoring(scoring: dict) -> None:
    """Deep dive: the largest log-prob difference from one at a time, per precision and batching mode."""
    for name, diffs in scoring.items():
        print(f"{name}: " + ", ".join(f"{mode} {diff:.1e}" for mode, diff in diffs.items()) + " (nats)")


def deeper_numbers(
    first: EraRun,
    report: EraRun,
    families_today: list[str],
    audits: dict,
    generation: dict,
    lengths: list[int],
    no_positions: dict,
    gpt2_positioned: dict,
    scoring: dict,
    sft_eval: dict,
    bf16_error: float,
    flash: dict | None,
    predicted: dict,
    sft_eval_gap: dict,
    padding_free: tuple,
) -> dict:
    """The deep dive's numbers: each experiment's two sides with the same fields (``runs``). Without the fix: the
    right-padded forward with the cache (both windows, for either fix), a forward keeping the cache on 4.40 beside TRL
    0.17's ``evaluate()`` on 4.51, the families with the check on 4.51, TRL 0.17's DPO evaluation of a plain Qwen2,
    GPT-2 scored without ``position_ids``, right-padded generation, SFT evaluation at eval batch 2. With it: the same
    forward without the cache and left-padded, TRL 0.8.6's ``evaluate()`` and ``padding_free=True`` on 0.17, today's
    families, today's DPO evaluation (eval batch 1), positions from the mask, left-padded generation, eval batch 1.
    Then the numbers the checks read beside the sides: the scoring table, bf16's error, FlashAttention's run (None
    without one), ``padding_free`` (today's ``padding_free=True`` trainer, TRL's warnings and its training batch), and
    the SFT eval losses predicted from rows scored alone, by eval batch size, and the gaps to them."""
    trainer, warned, batch = padding_free
    records = {"4.40": era_record(first), "4.51": era_record(report)}
    direct = {era: (r["direct_forward"] if r["status"] == "finished" else None) for era, r in records.items()}
    sides: dict[str, dict] = {"without_fix": {}, "with_fix": {}}
    sides["without_fix"]["direct"] = {e: {"cache": d["right"], "side": d["right"]} for e, d in direct.items() if d}
    sides["with_fix"]["direct"] = {e: {"cache": d["right_no_cache"], "side": d["left"]} for e, d in direct.items() if d}
    scenarios = {era: r.get("scenarios", {}) for era, r in records.items()}
    sides["without_fix"]["dpo"] = {
        **({"4.40": direct["4.40"]["right"]} if direct["4.40"] else {}),
        **({"4.51": scenarios["4.51"]["as_reported"]} if "as_reported" in scenarios["4.51"] else {}),
    }
    sides["with_fix"]["dpo"] = {
        **({"4.40": scenarios["4.40"]["as_reported"]} if "as_reported" in scenarios["4.40"] else {}),
        **({"4.51": scenarios["4.51"]["padding_free"]} if "padding_free" in scenarios["4.51"] else {}),
    }
    sides["without_fix"]["families"] = records["4.51"].get("guard_families")
    sides["with_fix"]["families"] = families_today
    audit = scenarios["4.51"].get("cache_audit")
    sides["without_fix"]["dpo_cache"] = (
        {m: {**audit["counts"][m], "asked": audit["asked"][m]} for m in audit["counts"]} if audit else None
    )
    sides["with_fix"]["dpo_cache"] = {m: audits[1][m]["eval"] for m in ("policy", "reference")}
    sides["without_fix"]["scoring"] = {"gpt2": no_positions["gpt2 (random init), left"]["diff"]}
    sides["with_fix"]["scoring"] = {
        "qwen2": max(scoring["fp32"][m] for m in ("left", "right")),
        "gpt2": max(gpt2_positioned.values()),
    }
    for side, padding, size in (("without_fix", "right", "2"), ("with_fix", "left", "1")):
        sides[side]["changed"] = sum(generation[padding]["changed"])
        sides[side]["shorter"] = shorter_rows(generation, lengths, padding)
        sides[side]["sft"] = sft_eval[int(size)]
    return {
        "then": records,
        "runs": sides,
        "audits": {str(size): audit_ for size, audit_ in audits.items()},
        "generation": generation,
        "lengths": lengths,
        "no_position_ids": no_positions,
        "scoring": scoring,
        "bf16_error": bf16_error,
        "flash_attention": flash,
        "padding_free_today": {
            "honoured": trainer.padding_free,
            "warnings": warned,
            "batch_has_attention_mask": "attention_mask" in batch,
        },
        "sft_eval_predicted": {str(size): loss for size, loss in predicted.items()},
        "sft_eval_gap": {str(size): gap for size, gap in sft_eval_gap.items()},
    }


def figure(run: Run, generation: dict, lengths: list[int], portable: dict[str, dict], era: EraRun) -> None:
    """Core: SmolLM2's first-token logit shift per prompt by padding side, and the portable hook's counts on each
    run (the era's DPO evaluation of a plain Qwen2, counted by the same hook, then today's runs)."""
    counts = cache_audit_counts(era_record(era)) or {}
    hook = {f"TRL {era.versions.get('trl')}: DPO evaluate(), {m}": c for m, c in counts.items()}
    hook.update({f"today: {name}": c for name, c in portable.items()})
    changed = {side: sum(generation[side]["changed"]) for side in ("right", "left")}
    fig, (ax_shift, ax_hook) = plotting.figure(
        2,
        title=f"Right padding changed {changed['right']}/{len(lengths)} answers, left {changed['left']}/{len(lengths)}"
        "\nRight-padded forwards that built a KV cache: TRL 0.17's DPO evaluation did, today's does not",
        height=4.0,
    )
    for side, kind, size in (("right", "bad", 10), ("left", "fixed", 5)):
        plotting.line(
            ax_shift,
            lengths,
            [max(v, 1e-6) for v in generation[side]["first_token_logit_shift"]],
            kind,
            f"{side} padding",
            linestyle="none",
            markersize=size,
        )
    plotting.label(
        ax_shift,
        "prompt length (tokens; the longest gets no pad)",
        "first-token max |logit shift|",
        "batched generate() vs one prompt at a time",
        log_y=True,
    )
    names = list(hook)[::-1]  # the era's runs on top, read downwards; horizontal bars keep each run's label whole
    y = range(len(names))
    ax_hook.barh(
        [i + 0.2 for i in y],
        [hook[n]["right_padded"] for n in names],
        height=0.4,
        color=plotting.REFERENCE,
        label="right-padded forwards",
    )
    ax_hook.barh(
        [i - 0.2 for i in y],
        [hook[n]["right_padded_with_cache"] for n in names],
        height=0.4,
        color=plotting.BAD,
        label="... that built a KV cache",
    )
    ax_hook.set_yticks(list(y), names, fontsize=7)
    plotting.label(ax_hook, "forwards", "", "the portable hook on each run")
    plotting.save(fig, run.output_dir, "padding_side")


def figure_deeper(run: Run, scoring: dict, generation: dict, audits: dict) -> None:
    """Deep dive: cache-free scoring differences by batching mode and precision, first-token logit shifts by
    padding side on the trained Qwen2, and today's DPO evaluation forwards (policy and reference)."""
    fig, (ax_score, ax_shift, ax_audit) = plotting.figure(
        3, title="Padding side: harmless for cache-free scoring, harmful for cached generation"
    )
    modes = list(scoring["fp32"])
    x = range(len(modes))
    for offset, precision, kind in ((-0.2, "fp32", plotting.FIXED), (0.2, "bf16", plotting.OTHER)):
        ax_score.bar(
            [i + offset for i in x],
            [max(scoring[precision][m], 1e-9) for m in modes],
            width=0.4,
            color=kind,
            label=precision,
        )
    ax_score.set_xticks(list(x), [m.replace("_", "\n") for m in modes], fontsize=8)
    plotting.label(
        ax_score, "batching (no cache)", "max |log-prob difference| (nats)", "scoring vs one at a time", log_y=True
    )
    prompts = range(len(generation["single"]["outputs"]))
    for side, kind in (("right", "bad"), ("left", "fixed")):
        plotting.line(
            ax_shift,
            list(prompts),
            [max(v, 1e-9) for v in generation[side]["first_token_logit_shift"]],
            kind,
            f"{side} padding",
            linestyle="none",
        )
    plotting.label(ax_shift, "prompt", "first-token max |logit shift|", "batched greedy generate()", log_y=True)
    labels, values, kinds = [], [], []
    for batch, audit in audits.items():
        for model, modes_of in audit.items():
            labels += [f"batch {batch}\n{model[:3]} pad", f"batch {batch}\n{model[:3]} +cache"]
            values += [modes_of["eval"]["right_padded"], modes_of["eval"]["right_padded_with_cache"]]
            kinds += ["other", "bad"]
    plotting.bars(ax_audit, labels, values, kinds, fmt="{:.0f}")
    plotting.label(ax_audit, "DPO evaluation today", "forwards", "right padding, but no cache")
    ax_audit.tick_params(axis="x", labelsize=7)
    plotting.save(fig, run.output_dir, "padding_side_deeper")
