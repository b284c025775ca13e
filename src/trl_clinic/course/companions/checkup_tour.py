"""Companion of notebooks/06_checkup_your_trainer.py: the bookkeeping around the check-up that a learner
need not read (the byte-for-byte fingerprint, the local files a recipe points at, the command's run, the
findings as numbers).

The traps themselves (``padding_free=True`` on OPT, ``optim="adamw_torch"`` on fp16 weights, a LoRA
config without ``task_type="SEQ_CLS"``, ...) and every ``checkup(...)`` call stay in the notebook.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import yaml

from trl_clinic.checkup.engine import Report
from trl_clinic.course.data import instruction_pairs


def fingerprint(trainer) -> str:
    """A hash of what the check-up promises not to change (section 8): every weight's bytes, the optimizer
    state, the torch, Python and NumPy random generators, the modules' train/eval modes and the trainer's
    attribute names. Two equal fingerprints mean byte-for-byte equal state."""
    digest = hashlib.sha256()
    for name, tensor in trainer.model.state_dict().items():
        digest.update(name.encode() + tensor.detach().cpu().contiguous().flatten().view(torch.uint8).numpy().tobytes())
    if trainer.optimizer is not None:
        digest.update(repr(trainer.optimizer.state_dict()).encode())
    digest.update(torch.get_rng_state().numpy().tobytes() + repr(random.getstate()).encode())
    digest.update(repr(np.random.get_state()).encode())
    digest.update(repr([m.training for m in trainer.model.modules()] + sorted(vars(trainer))).encode())
    return digest.hexdigest()


def finding(report: Report, probe: str) -> dict:
    """The last finding of ``probe`` as plain numbers (section checks read these)."""
    found = report.by_probe(probe)[-1]
    return {"status": found.status, "value": found.value, "measured": found.measured, "fix": found.fix,
            "reason": found.reason}


def worst(rows: list[tuple[str, str]]) -> dict[str, str]:
    """probe -> status from (probe, status) rows, the worst one where a probe left several findings."""
    order = ("skipped", "ok", "warn", "fail")
    result: dict[str, str] = {}
    for probe, status in rows:
        result[probe] = max(result.get(probe, "skipped"), status, key=order.index)
    return result


def statuses(report: Report) -> dict[str, str]:
    return worst([(f.probe, f.status) for f in report.findings])


def write_recipe(folder: Path, model, tokenizer, rows: int, seed: int, **settings) -> Path:
    """A local model folder, a local ``train.jsonl`` and a ``trl sft`` recipe pointing at both (section 9).
    ``settings`` are the recipe's own keys (TRL's ``SFTConfig`` and ``ModelConfig`` fields)."""
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder / "model")
    tokenizer.save_pretrained(folder / "model")
    (folder / "data").mkdir(exist_ok=True)
    instruction_pairs(rows, seed=seed).to_json(folder / "data" / "train.jsonl")
    recipe = {"model_name_or_path": str(folder / "model"), "dataset_name": str(folder / "data"),
              "output_dir": str(folder / "out"), "report_to": "none", "seed": seed, **settings}
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
    """``trl-clinic ARGS`` as a user types it: the installed console script beside this Python, in a child process."""
    done = subprocess.run([str(Path(sys.executable).with_name("trl-clinic")), *args], capture_output=True, text=True,
                          timeout=timeout)
    return Command(["trl-clinic", *args], done.returncode, done.stdout, done.stderr)


TABLE_ROW = re.compile(r"^\W\s*([a-z0-9_]+)\s*\W\s*(ok|warn|fail|skipped)\s*\W", re.M)


def command_numbers(command: Command) -> dict:
    """The exit code and probe -> status of a command's report, read from its ``--json`` output or, without
    ``--json``, from the rows of its table (the worst status where a probe has several rows)."""
    if "--json" in command.argv:
        findings = json.loads(command.stdout[command.stdout.index("{"):])["findings"]
        rows = [(f["probe"], f["status"]) for f in findings]
    else:
        rows = TABLE_ROW.findall(re.sub(r"\x1b\[[0-9;]*m", "", command.stdout))  # without rich's colour codes
    return {"returncode": command.returncode, "statuses": worst(rows)}


def plot_traps_and_fixes(accumulation: dict[str, dict], packing: dict[str, dict], output_dir: Path,
                         threshold: float = 1e-3) -> Path:
    """Sections 2 and 3 side by side: the probes' own numbers for the traps (bad) and the fixes, with the
    threshold a finding fails above. ``accumulation``: findings "symptom", "old path", "fixed";
    ``packing``: findings "opt", "llama"."""
    from trl_clinic.course import plotting

    fig, (grad, pack) = plotting.figure(2, "The check-up's numbers: each trap fails, each fix passes")
    rows = [("custom loss\n(trap)", accumulation["symptom"], "bad"),
            ("old path\n(trap)", accumulation["old path"], "bad"),
            ("÷ num_items\n(fix)", accumulation["fixed"], "fixed")]
    floor = 1e-12  # a log axis cannot show 0: such a bar is drawn at the floor and labelled with its value
    plotting.bars(grad, [r[0] for r in rows], [max(r[1]["value"], floor) for r in rows], [r[2] for r in rows],
                  texts=[f"{r[1]['value']:.3g}" for r in rows])
    values = [packing[family]["value"] for family in ("opt", "llama")]
    plotting.bars(pack, ["OPT\n(trap)", "Llama"], [max(v, floor) for v in values], ["bad", "fixed"],
                  texts=[f"{v:.3g}" for v in values])
    for ax in (grad, pack):
        ax.axhline(threshold, color="grey", linestyle=":", label=f"fails above {threshold:g}")
    plotting.label(grad, "", "relative gradient error vs one big batch", "accumulation probe (lesson 02)", log_y=True)
    plotting.label(pack, "", "loss change, packed vs alone", "packing probe, padding_free=True (lesson 01)",
                   log_y=True)
    return plotting.save(fig, output_dir, "checkup_traps_vs_fixes")
