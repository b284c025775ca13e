"""Companion of lesson 06 (the check-up on your own trainer): the bookkeeping around the check-up that a
learner need not read (the local files a user's trainer loads, the fingerprint that proves the check-up
changed nothing, the command's run, the findings as numbers, the figure).

The traps themselves (``padding_free=True`` on OPT, fp16 weights with ``optim="adamw_torch"``, a LoRA
config without ``task_type="SEQ_CLS"``, ...) and every ``checkup(...)`` call stay in the notebooks.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import yaml

from trl_clinic.checkup.engine import Report
from trl_clinic.course.data import instruction_pairs


def local_files(folder: Path, model, tokenizer, rows: int, seed: int) -> tuple[Path, Path]:
    """A model folder (``save_pretrained``) and a ``train.jsonl`` of prompt/completion rows: what a user's
    script loads from disk, offline."""
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder / "model")
    tokenizer.save_pretrained(folder / "model")
    instruction_pairs(rows, seed=seed).to_json(folder / "data" / "train.jsonl")
    return folder / "model", folder / "data" / "train.jsonl"


def _tensor_bytes(tensor: torch.Tensor) -> bytes:
    return tensor.detach().cpu().contiguous().flatten().view(torch.uint8).numpy().tobytes()


def _update(digest, value) -> None:
    """Hash a state_dict-like value: tensors by their bytes, containers item by item, the rest by repr."""
    if isinstance(value, torch.Tensor):
        digest.update(str((value.dtype, tuple(value.shape))).encode() + _tensor_bytes(value))
    elif isinstance(value, dict):
        for key in sorted(value, key=repr):
            digest.update(repr(key).encode())
            _update(digest, value[key])
    elif isinstance(value, (list, tuple)):
        for item in value:
            _update(digest, item)
    else:
        digest.update(repr(value).encode())


def fingerprint(trainer) -> dict[str, str]:
    """A hash per part of what the check-up promises not to change: the weights and buffers (their bytes), the
    ``requires_grad`` flags and gradients, the modules' train/eval modes, the model's config, the optimizer's
    state and groups and the scheduler's state (their tensors' bytes), the torch (CPU and CUDA), Python and NumPy
    random generators, the tokenizer's padding side, and the trainer's and its arguments' attributes (each value's
    repr: an attribute replaced by another object changes it). Equal dicts mean equal state, part by part."""
    model, parts = trainer.model, {}
    pieces = {
        "weights and buffers": model.state_dict(),
        "flags and gradients": {name: (p.requires_grad, p.grad) for name, p in model.named_parameters()},
        "train/eval modes": [m.training for m in model.modules()],
        "model config": model.config.to_json_string(),
        "optimizer": None if trainer.optimizer is None else trainer.optimizer.state_dict(),
        "scheduler": None if trainer.lr_scheduler is None else trainer.lr_scheduler.state_dict(),
        "random generators": [
            torch.get_rng_state(),
            repr(random.getstate()),
            repr(np.random.get_state()),
            torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        ],
        "tokenizer padding side": getattr(trainer.processing_class, "padding_side", None),
        "trainer attributes": {key: repr(value) for key, value in vars(trainer).items()},
        "arguments": {key: repr(value) for key, value in vars(trainer.args).items()},
    }
    for part, value in pieces.items():
        digest = hashlib.sha256()
        _update(digest, value)
        parts[part] = digest.hexdigest()
    return parts


def finding(report: Report, probe: str) -> dict:
    """The last finding of ``probe`` as plain numbers (section checks read these)."""
    found = report.by_probe(probe)[-1]
    return {
        "status": found.status,
        "decided": found.decided,
        "value": found.value,
        "measured": found.measured,
        "fix": found.fix,
        "reason": found.reason,
        "lesson": found.lesson,
    }


def worst(rows: list[tuple[str, str]]) -> dict[str, str]:
    """probe -> status from (probe, status) rows, the worst one where a probe left several findings."""
    order = ("skipped", "ok", "warn", "error", "fail")
    result: dict[str, str] = {}
    for probe, status in rows:
        result[probe] = max(result.get(probe, "skipped"), status, key=order.index)
    return result


def statuses(report: Report) -> dict[str, str]:
    return worst([(f.probe, f.status) for f in report.findings])


def write_recipe(folder: Path, model, tokenizer, rows: int, seed: int, **settings) -> Path:
    """``local_files`` and a ``trl sft`` recipe pointing at both. ``settings`` are the recipe's own keys (TRL's
    ``SFTConfig`` and ``ModelConfig`` fields)."""
    model_dir, data_file = local_files(folder, model, tokenizer, rows, seed)
    recipe = {
        "model_name_or_path": str(model_dir),
        "dataset_name": str(data_file.parent),
        "output_dir": str(folder / "out"),
        "report_to": "none",
        "seed": seed,
        **settings,
    }
    path = folder / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    return path


@dataclass
class Command:
    argv: list[str]
    returncode: int
    stdout: str
    stderr: str


def trl_clinic(*args: str, timeout: int = 600) -> Command:
    """``trl-clinic ARGS`` as a user types it: the installed console script beside this Python, in a child process.
    Where the package runs from its source on ``PYTHONPATH`` without being installed (the GPU machine's run,
    tools/gpu_run) no script is there, and the child runs the same ``main`` as ``python -m trl_clinic.cli``."""
    script = Path(sys.executable).with_name("trl-clinic")
    program = [str(script)] if script.is_file() else [sys.executable, "-m", "trl_clinic.cli"]
    done = subprocess.run([*program, *args], capture_output=True, text=True, timeout=timeout)
    return Command(["trl-clinic", *args], done.returncode, ANSI.sub("", done.stdout), done.stderr)


ANSI = re.compile(r"\x1b\[[0-9;]*m")  # rich's colour codes, where the child's console forces colour
TABLE_ROW = re.compile(r"^\W\s*([a-z0-9_]+)\s*\W\s*(ok|warn|fail|skipped|error)\s*\W", re.M)


def json_findings(command: Command) -> list[dict]:
    """The findings of a ``--json`` command's report (the JSON object is the last thing it prints)."""
    return json.loads(command.stdout[command.stdout.index("{") :])["findings"]


def command_numbers(command: Command) -> dict:
    """The exit code and probe -> status of a command's report, read from its ``--json`` output or, without
    ``--json``, from the rows of its table (the worst status where a probe has several rows)."""
    if "--json" in command.argv:
        rows = [(f["probe"], f["status"]) for f in json_findings(command)]
    else:
        rows = TABLE_ROW.findall(command.stdout)
    return {"returncode": command.returncode, "statuses": worst(rows)}


UNITS = {
    "packing": "largest logit change vs alone",
    "fp16_adamw": "fp16 tensors inf/NaN after a step",
    "accumulation": "relative gradient error",
    "reward_head": "trainable head tensors",
    "padding_cache": "right-padded forwards with a cache",
    "equal_rewards": "share of groups all equal",
}


def deeper_numbers(cli: dict, grpo: dict, found: dict, accepts: dict, families: dict, table: dict, dpo: dict) -> dict:
    """Deep dive: its numbers for the checks (the lesson's checks_deeper.py), each experiment's two sides with the
    same fields (the failing recipe, trainer or versions; then the fixed one), and today's gradients and DPO."""
    listed, keywords = (found[f"accumulation, {name}"] for name in ("ListedArgumentsLlama", "KeywordsLlama"))
    runs = {
        "without_fix": {
            "cli": cli["padding_free: true"],
            "grpo": grpo["groups of 4, 3 completions"],
            "labels": found["labels, cut"],
            "eos": found["eos, pad == eos"],
            "accepts_loss_kwargs": accepts["ListedArgumentsLlama"],
            "accumulation": listed,
            "packing": {"opt": families["opt"]},
            "table": table["the report's versions"],
        },
        "with_fix": {
            "cli": cli["padding_free: false"],
            "grpo": grpo["groups of 4, 4 completions"],
            "labels": found["labels, long enough"],
            "eos": found["eos, own pad"],
            "accepts_loss_kwargs": accepts["KeywordsLlama"],
            "accumulation": keywords,
            "packing": {family: families[family] for family in ("llama", "qwen2")},
            "table": table["installed versions"],
        },
    }
    today = {"gradients": {name: f for name, f in found.items() if name.startswith("gradients")}, "dpo": dpo}
    return {"runs": runs, "today": today}


def verdict_text(probe: str, found: dict) -> str:
    """A finding in a figure's cell: its status, how it was decided, and its number with its unit (or why it
    was skipped)."""
    if found["status"] == "skipped":
        return "skipped:\n" + textwrap.fill(found["reason"].split(" (")[0], 34)
    number = "" if found["value"] is None else f"\n{found['value']:.3g} {UNITS.get(probe, '')}"
    return f"{found['status']} ({found['decided']}){number}"


def plot_verdicts(rows: dict[str, tuple[dict, dict]], title: str, output_dir: Path) -> Path:
    """One row per trap (``rows``: "NN probe: what" -> (finding with the trap, finding with the fix line)),
    coloured by status (fail red, ok green, warn orange, skipped grey) and labelled with the probe's number."""
    from trl_clinic.course import plotting

    colours = {
        "fail": plotting.BAD,
        "ok": plotting.FIXED,
        "warn": "#ff7f0e",
        "skipped": plotting.REFERENCE,
        "error": "#9467bd",
    }
    fig, [ax] = plotting.figure(1, title, width=8.0, height=0.75 * len(rows) + 1.2)
    ax.grid(False)
    for y, (label, pair) in enumerate(rows.items()):
        for x, found in enumerate(pair):
            ax.add_patch(_cell(x, y, colours[found["status"]]))
            probe = label.split()[1].rstrip(":")
            ax.text(x + 0.5, y + 0.5, verdict_text(probe, found), ha="center", va="center", fontsize=8, color="white")
    ax.set(xlim=(0, 2), ylim=(len(rows), 0), xticks=[0.5, 1.5], yticks=[y + 0.5 for y in range(len(rows))])
    ax.set_xticklabels(["with the trap", "with the fix line"])
    ax.set_yticklabels(list(rows))
    ax.xaxis.tick_top()
    return plotting.save(fig, output_dir, "checkup_traps_vs_fixes")


def _cell(x: float, y: float, colour: str):
    """One cell of the verdict grid, with a thin gap to its neighbours."""
    from matplotlib.patches import Rectangle

    return Rectangle((x + 0.02, y + 0.04), 0.96, 0.92, color=colour)


def plot_deeper(families: dict[str, dict], accumulation: dict[str, dict], output_dir: Path) -> Path:
    """The deep dive's two measured traps side by side, on a log axis with each probe's line: the packing probe's
    logit change by model family (``families``: family -> finding), and the accumulation probe's gradient error
    for a forward with and without ``**kwargs`` (``accumulation``: class name -> finding)."""
    from trl_clinic.course import plotting

    bad_families = [f for f, found in families.items() if found["status"] == "fail"]
    fig, (pack, grad) = plotting.figure(
        2,
        f"Padding-free fails on {', '.join(bad_families) or 'no family'}; a forward "
        "without **kwargs fails accumulation",
    )
    plotting.bars(
        pack,
        list(families),
        [f["value"] for f in families.values()],
        ["bad" if f["status"] == "fail" else "fixed" for f in families.values()],
    )
    plotting.label(
        pack,
        "model family, padding_free=True",
        "later sequences' logit change vs alone",
        "packing probe (lesson 01)",
        log_y=True,
    )
    plotting.bars(
        grad,
        list(accumulation),
        [f["value"] for f in accumulation.values()],
        ["bad" if f["status"] == "fail" else "fixed" for f in accumulation.values()],
    )
    grad.axhline(1e-3, color=plotting.REFERENCE, linestyle=":", label="fails above 1e-3")
    plotting.label(
        grad,
        "the model's forward",
        "relative gradient error vs one big batch",
        "accumulation probe (lesson 02)",
        log_y=True,
    )
    return plotting.save(fig, output_dir, "checkup_deeper_families_and_forward")
