"""Lesson 08's companion: the rows, the templates, the eras started in the background, and what the notebook
prints, draws and records. The measurements themselves are the era script's (``then.py``), so today's runs and the
eras' are counted by the same lines."""

from __future__ import annotations

import contextlib
import importlib.metadata
import logging
import random
import re
import textwrap
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import torch
from datasets import Dataset
from transformers import AutoTokenizer

import trl_clinic
from trl_clinic.course import eras, plotting
from trl_clinic.course.data import ATTRIBUTES, NAMES, QUESTIONS, fixed_world
from trl_clinic.course.eras import EraRun
from trl_clinic.course.handshake import neutral_config
from trl_clinic.course.lessons.lesson_08_silent_failures import then
from trl_clinic.course.models import model_config
from trl_clinic.course.run import Run

ERA_PROMPT, ERA_QDORA, ERA_QDORA_TODAY = "06-trl-0.24", "08-trl-1.14", "08-trl-1.16"

# ChatML with {% generation %} markers, as SFTTrainer's assistant_only_loss needs: the turn end outside the block
# (GLM's template before TRL PR #5988 had it so), then inside it
TURN_END_OUTSIDE = (
    "{% for m in messages %}{% if m['role'] == 'assistant' %}{{ '<|im_start|>assistant\n' }}"
    "{% generation %}{{ m['content'] }}{% endgeneration %}{{ '<|im_end|>\n' }}"
    "{% else %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
TURN_END_INSIDE = TURN_END_OUTSIDE.replace(
    "{{ m['content'] }}{% endgeneration %}{{ '<|im_end|>\n' }}",
    "{{ m['content'] + '<|im_end|>' }}{% endgeneration %}{{ '\n' }}",
)


def chat_rows(n: int, seed: int) -> list[dict]:
    """Conversational prompt-completion rows: a question about the fixed world, its one-sentence answer."""
    world, rng = fixed_world(), random.Random(seed)
    rows = []
    for _ in range(n):
        name, attribute = rng.choice(NAMES), rng.choice(list(ATTRIBUTES))
        rows.append(
            {
                "prompt": [{"role": "user", "content": QUESTIONS[attribute].format(name=name)}],
                "completion": [{"role": "assistant", "content": world.sentence(name, attribute)}],
            }
        )
    return rows


def conversations(rows: list[dict]) -> Dataset:
    """The same rows as whole conversations (``messages``), the form ``assistant_only_loss`` trains on."""
    return Dataset.from_list([{"messages": row["prompt"] + row["completion"]} for row in rows])


def library_folder(run: Run) -> Path:
    """A folder holding only this installation's ``trl_clinic`` (a link), for an era's ``sys.path``: the era's
    own torch, transformers and TRL stay the ones it imports."""
    folder = run.output_dir / "then" / "library"
    folder.mkdir(parents=True, exist_ok=True)
    link = folder / "trl_clinic"
    if not link.exists():
        link.symlink_to(Path(trl_clinic.__file__).resolve().parent, target_is_directory=True)
    return folder


def era_spec(run: Run, part: str, tokenizer, rows: list[dict], **extra) -> dict:
    """What ``then.py`` reads: the tokenizer saved once, a tiny Llama's config, the rows and the sizes."""
    folder = run.output_dir / "then" / "tokenizer"
    tokenizer.save_pretrained(folder)
    sizes = run.sizes
    return {
        "part": part,
        "seed": run.subseed(part),
        "threads": 1,
        "tokenizer": str(folder),
        "config": neutral_config(model_config(tokenizer, size=run.sizes.model_size)),
        "rows": rows,
        "library": str(library_folder(run)),
        "steps": sizes[f"{part}_steps"],
        "batch_size": sizes[f"{part}_batch_size"],
        "learning_rate": sizes[f"{part}_learning_rate"],
        **extra,
    }


def start_eras(run: Run, tokenizer, rows: list[dict]) -> dict[str, Future]:
    """The three era runs in two background threads, each with one torch thread: TRL #6105 in 06-trl-0.24 and
    QDoRA on trl 1.14.2 (with the workaround) at once, then QDoRA on trl 1.16.0; the notebook meanwhile trains on
    today's TRL."""
    runs = {
        "prompt": (ERA_PROMPT, era_spec(run, "prompt", tokenizer, rows)),
        "qdora": (ERA_QDORA, era_spec(run, "qdora", tokenizer, rows, workaround=True)),
        "qdora_today": (ERA_QDORA_TODAY, era_spec(run, "qdora", tokenizer, rows)),
    }
    pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="lesson-08-eras")
    futures = {
        name: pool.submit(eras.run_in_era, era, "then_08", spec, run.output_dir / "then" / name)
        for name, (era, spec) in runs.items()
    }
    pool.shutdown(wait=False)
    return futures


def marked(tokenizer, input_ids: list[int], trained: list[int]) -> str:
    """A row as text, each trained token in [brackets]."""
    pieces = [tokenizer.decode([token]) for token in input_ids]
    return "".join(f"[{piece}]" if flag else piece for piece, flag in zip(pieces, trained)).replace("\n", "⏎")


def show(subject) -> None:
    """What the lesson reads of a run: an era's (TRL #6105's warnings, loss and first row; or the QDoRA runs'
    dtypes and what moved), or today's prompt-completion trainer (its masks)."""
    if isinstance(subject, EraRun):
        print(subject.describe())
        if subject.finished:
            (_show_prompt_era if "masks" in subject.result else _show_dora_era)(subject.result)
        return
    ids, trained = then.trainer_masks(subject)
    masks = then.trained_prompt_tokens(subject.processing_class, subject.train_dataset.to_list(), ids, trained)
    print(
        f"trl {importlib.metadata.version('trl')}: {sum(masks['trained'])} of {sum(masks['prompt_tokens'])} prompt "
        f"tokens trained ({len(masks['trained'])} rows); the first row, [trained] tokens in brackets:"
    )
    print(_wrapped(marked(subject.processing_class, ids[0], trained[0])))


def _wrapped(row: str) -> str:
    """A marked row, indented, cut into lines of a notebook's width at token boundaries."""
    pieces = re.findall(r"\[[^\]]*\]|[^\[]+", row)
    lines, line = [], "   "
    for piece in pieces:
        if len(line) + len(piece) > 116:
            lines, line = [*lines, line], "   "
        line += piece
    return "\n".join([*lines, line])


def _show_prompt_era(result: dict) -> None:
    warnings = result["warnings"]
    print(f"  the trainer warned {len(warnings)} times ({len(result['masks']['trained'])} rows):")
    print(f"    {warnings[0].removeprefix('[RANK 0] ')[:110]}...")
    print("  logged loss by step:", ", ".join(f"{loss:.2f}" for loss in result["losses"]))
    row = result["first_row"]
    print("  the first row, [trained] tokens in brackets:")
    print(
        _wrapped(marked(AutoTokenizer.from_pretrained(result["tokenizer"]), row["input_ids"], row["completion_mask"]))
    )


def _show_dora_era(result: dict) -> None:
    for name in ("as_launched", "workaround"):
        if name in result:
            run = result[name]
            print(
                f"  {name.replace('_', ' ')}: magnitude {'/'.join(run['dtypes']['magnitude'])} "
                f"({run['magnitude_range'][0]:.2f} to {run['magnitude_range'][1]:.2f}), "
                f"{run['magnitude_moved']:.0%} of its {run['magnitude_elements']} elements moved; "
                f"lora_B {run['lora_B_moved']:.0%} moved; loss "
                f"{run['losses'][0]:.3f} -> {run['losses'][-1]:.3f}"
            )


@contextlib.contextmanager
def heard() -> Iterator[list[str]]:
    """TRL's warnings while the block runs (they still reach the screen): what a user's log showed."""
    listener = then.Warnings()
    logging.getLogger("trl").addHandler(listener)
    try:
        yield listener.messages
    finally:
        logging.getLogger("trl").removeHandler(listener)


def findings(source) -> list[dict]:
    """A check-up's findings as records: the era script's, or a report's here."""
    if isinstance(source, EraRun):
        return source.result["checkup"] if source.finished else []
    return then.finding_records(source)


def verdict(source, probe: str, label: str | None = None) -> str:
    """One probe's verdict in a check-up (an era's, or a report here), printed on one line; "not run" where the era
    did not run."""
    found = next((f for f in findings(source) if f["probe"] == probe), None)
    if label is None:
        label = f"trl {source.versions.get('trl', '?')}" if isinstance(source, EraRun) else "here"
    if found is None:
        print(f"  {label}: {probe} not run")
        return "not run"
    said = f"  {label}: {probe} {found['status']} ({found['decided']}): {found['measured']}"
    print(textwrap.fill(said, 116, subsequent_indent="    ", break_long_words=False))
    return found["status"]


@torch.no_grad()
def answers(label: str, trainer, rows: list[dict], max_new_tokens: int) -> dict:
    """The run's logged losses (five of them), then greedy answers to each row's question: how many end with
    ``<|im_end|>`` within ``max_new_tokens``."""
    model, tokenizer = trainer.model.eval(), trainer.processing_class
    losses = then.losses(trainer)
    shown = losses[len(losses) // 5 - 1 :: len(losses) // 5] if len(losses) >= 5 else losses
    print(f"{label}: logged loss " + ", ".join(f"{loss:.2f}" for loss in shown))
    turn_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    ended, said = 0, []
    for row in rows:
        prompt = tokenizer.apply_chat_template(row["prompt"], add_generation_prompt=True, return_tensors="pt")
        prompt = {k: v.to(model.device) for k, v in prompt.items()}
        out = model.generate(
            **prompt,
            max_new_tokens=max_new_tokens,
            do_sample=False,
            eos_token_id=turn_end,
            pad_token_id=tokenizer.pad_token_id,
        )
        new = out[0, prompt["input_ids"].shape[1] :].tolist()
        ended += turn_end in new
        said.append(tokenizer.decode(new))
    print(f"  {ended} of {len(rows)} answers ended with <|im_end|> within {max_new_tokens} tokens; the first:")
    print(f"    {said[0][:100]!r}")
    return {"ended": ended, "asked": len(rows)}


def figure(run: Run, numbers: dict) -> None:
    """Left: the turn-end runs' logged losses, which fall alike (nothing in the log tells them apart). Right: what
    each run as launched got wrong, beside its fix (a bar per failure; "not run" where its era did not run)."""
    bad, fixed = numbers["runs"]["without_fix"], numbers["runs"]["with_fix"]
    fig, (curves, wrong) = plotting.figure(2, "The loss falls either way; what each run got wrong", width=5.5)
    for run_numbers, kind, name in ((bad, "bad", "turn end outside the mask"), (fixed, "fixed", "inside")):
        losses = run_numbers["turn_losses"]
        step = run.sizes.turn_steps // len(losses)
        plotting.line(curves, [step * (i + 1) for i in range(len(losses))], losses, kind, name)
    plotting.label(curves, "optimizer step", "logged loss", "turn-end runs' logged loss")
    rows = [
        ("prompt tokens\ntrained (#6105)", "prompt_trained_share"),
        ("answers that\nnever end", "never_ended_share"),
        ("DoRA magnitude\nfrozen (#7268)", "magnitude_frozen_share"),
    ]
    for offset, (values, kind, name) in enumerate(((bad, "bad", "as launched"), (fixed, "fixed", "fixed"))):
        shares = [values.get(key) for _, key in rows]
        drawn = wrong.barh(
            [i + 0.4 * offset for i in range(len(rows))],
            [s or 0 for s in shares],
            height=0.4,
            color=plotting.STYLE[kind],
            label=name,
        )
        wrong.bar_label(drawn, labels=["not run" if s is None else f"{s:.0%}" for s in shares], fontsize=8, padding=2)
    wrong.set_yticks([i + 0.2 for i in range(len(rows))], [label for label, _ in rows])
    wrong.invert_yaxis()
    wrong.set_xlim(0, 1.2)
    plotting.label(wrong, "share gone wrong", "", "each failure, as launched and fixed")
    wrong.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.22), ncol=2)
    plotting.save(fig, run.output_dir, "silent_failures")


def share(part: int, whole: int) -> float | None:
    return part / whole if whole else None


def _prompt_numbers(masks: dict | None, warned: list[str]) -> dict:
    if masks is None:
        return {"prompt_trained_share": None}
    return {
        "prompt_trained_share": share(sum(masks["trained"]), sum(masks["prompt_tokens"])),
        "prompt_rows": len(masks["trained"]),
        "prompt_length_taken": masks["masked"],
        "mismatch_warnings": sum(then.MISMATCH in message for message in warned),
    }


def _dora_numbers(era: EraRun, key: str) -> dict:
    if not era.finished:
        return {"magnitude_frozen_share": None}
    run = era.result[key]
    return {
        "magnitude_frozen_share": 1 - run["magnitude_moved"],
        "lora_B_moved": run["lora_B_moved"],
        "magnitude_dtypes": run["dtypes"]["magnitude"],
        "stalled_update": next(f["status"] for f in era.result["checkup"] if f["probe"] == "stalled_update"),
        "dora_losses": run["losses"],
    }


def _turn_numbers(trainer, stopped: dict, warned: list[str], status: str) -> dict:
    return {
        "never_ended_share": 1 - stopped["ended"] / stopped["asked"],
        "turn_end": status,
        "turn_losses": then.losses(trainer),
        "trl_warned": any("end-of-turn" in message for message in warned),
    }


def record(
    prompt_era: EraRun,
    today,
    today_warned: list[str],
    today_report,
    turns: dict,
    qdora_era: EraRun,
    qdora_today: EraRun,
    precision: str,
) -> dict:
    """The numbers the checks read: one record per run (``without_fix``, ``with_fix``) with the same keys, and each
    era's status. ``turns``: for "outside" and "inside", the trainer, its answers, TRL's warnings and its verdict."""
    era_prompt = prompt_era.result if prompt_era.finished else {}
    today_masks = then.trained_prompt_tokens(
        today.processing_class, today.train_dataset.to_list(), *then.trainer_masks(today)
    )
    today_status = next(f["status"] for f in findings(today_report) if f["probe"] == "prompt_in_loss")
    runs = {
        "without_fix": {
            **_prompt_numbers(era_prompt.get("masks"), era_prompt.get("warnings", [])),
            "prompt_in_loss": next(
                (f["status"] for f in findings(prompt_era) if f["probe"] == "prompt_in_loss"), "not run"
            ),
            **_turn_numbers(*turns["outside"]),
            **_dora_numbers(qdora_era, "as_launched"),
            "workaround_frozen_share": _dora_numbers(qdora_era, "as_launched")["magnitude_frozen_share"],
        },
        "with_fix": {
            **_prompt_numbers(today_masks, today_warned),
            "prompt_in_loss": today_status,
            **_turn_numbers(*turns["inside"]),
            **_dora_numbers(qdora_today, "as_launched"),
            "workaround_frozen_share": _dora_numbers(qdora_era, "workaround")["magnitude_frozen_share"],
        },
    }
    eras = {"prompt": prompt_era, "qdora": qdora_era, "qdora_today": qdora_today}
    return {"precision": precision, "runs": runs, "eras": {name: era.status for name, era in eras.items()}}
