"""The zoo's recipes as data: each public recipe's training settings transcribed from its upstream file, with where
they were read (repository, path, commit, the file's sha256, the lines of an excerpt).

The upstream files themselves are not committed: this project commits nothing fetched from another repository (the
tools' rule), so a recipe here is the record of what its author wrote, checkable against the source by anyone who
fetches it:

    python zoo/transcribe.py write FOLDER MIRRORS   # FOLDER: recipes as fetched (verbatim files + a recipe.yaml
                                              # each); writes zoo/recipes/<collection>/<name>.yaml and launches.yaml
    python zoo/transcribe.py check MIRRORS    # MIRRORS: folder of fetched git snapshots (owner+name/repo); reads
                                              # every source at its commit, checks its sha256 and the settings

What is transcribed: every key of a TRL-shaped config (a ``--config`` YAML, or the flags of a command line), but
those that only name where a run writes or reports (``NOT_TRAINING``: output folders, the Hub, trackers, logging,
saving, evaluation), and the dataset mixtures, whose format the record keeps in ``data`` (the zoo trains on data
of that format generated from a seed). Configs that are not TRL's (axolotl, LLaMA-Factory, a course's notebook
cell) carry a hand translation into TRL's arguments, each key with the source key it came from, kept as written.
Launch configs (accelerate YAML, DeepSpeed JSON) keep the keys that decide the launch (``LAUNCH_KEYS``).
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import yaml

ZOO = Path(__file__).resolve().parent
RECIPES = ZOO / "recipes"
# keys that name where a run writes, reports, saves or evaluates: the zoo replaces them, and they shape no step
NOT_TRAINING = re.compile(
    r"^(output_dir|overwrite_output_dir|hub_.*|push_to_hub|report_to|logging_.*|log_level|log_completions|save_.*|"
    r"run_name|do_eval|do_train|eval_.*|per_device_eval_batch_size|load_best_model_at_end|metric_for_best_model|"
    r"wandb_.*|callbacks|benchmarks|ddp_timeout|dataset_num_proc|dataset_mixture|dataset_mixer|dataset_splits|"
    r"resume_from_checkpoint|num_completions_to_print|dataloader_num_workers)$"
)
LAUNCH_KEYS = ("distributed_type", "mixed_precision", "num_processes", "use_cpu", "downcast_bf16")
DEEPSPEED_KEYS = ("zero_stage", "zero3_init_flag", "offload_optimizer_device", "offload_param_device")


class _Dumper(yaml.SafeDumper):
    """Multi-line strings (a chat template, a command line) as literal blocks, as their authors wrote them."""


_Dumper.add_representer(
    str,
    lambda dumper, text: dumper.represent_scalar("tag:yaml.org,2002:str", text, style="|" if "\n" in text else None),
)


def dump(data: dict) -> str:
    return yaml.dump(data, Dumper=_Dumper, sort_keys=False, allow_unicode=True, width=120)


def sha256(text: str | bytes) -> str:
    return hashlib.sha256(text.encode() if isinstance(text, str) else text).hexdigest()


TRAINING_COMMANDS = {"sft", "dpo", "grpo", "kto", "reward"}  # `trl sft ...` and its siblings


def command_settings(text: str) -> dict:
    """The ``--key value`` flags a command line gives its training script (``--flag`` alone is true, a flag followed
    by several words a list, as argparse's ``nargs="+"`` reads it), values read as YAML scalars; the launcher's own
    flags before the script (``accelerate launch --config_file``, ``hf jobs``) are the launch's, not the recipe's."""
    words = shlex.split(text.replace("\\\n", " "), comments=True)
    script = next(
        (i for i, w in enumerate(words) if w.endswith(".py") or (w in TRAINING_COMMANDS and words[i - 1] == "trl")),
        -1,
    )
    words = words[script + 1 :]
    settings, i = {}, 0
    while i < len(words):
        word = words[i]
        if word.startswith("--") and word != "--":
            key, _, value = word[2:].partition("=")
            values = [value] if value else []
            while not value and i + 1 < len(words) and not words[i + 1].startswith("--"):  # nargs="+": every word
                i += 1
                values.append(words[i])
            parsed = [yaml.safe_load(v) if v else v for v in values] or [True]
            settings[key.replace("-", "_")] = parsed[0] if len(parsed) == 1 else parsed
        i += 1
    return settings


def training(settings: dict) -> dict:
    """``settings`` without the keys that shape no training step (``NOT_TRAINING``)."""
    return {key: value for key, value in settings.items() if not NOT_TRAINING.match(key)}


def launch_settings(text: str, name: str) -> dict:
    """The keys that decide a launch, from an accelerate YAML or a DeepSpeed JSON."""
    if name.endswith(".json"):
        config = json.loads(text)
        zero = config.get("zero_optimization", {})
        return {
            "deepspeed": {
                "zero_stage": zero.get("stage", 0),
                **{f"offload_{k}": zero[f"offload_{k}"].get("device") for k in ("optimizer", "param") if k in zero},
                **{k: config[k].get("enabled") for k in ("bf16", "fp16") if isinstance(config.get(k), dict)},
            }
        }
    config = yaml.safe_load(text)
    found = {key: config[key] for key in LAUNCH_KEYS if key in config}
    if "deepspeed_config" in config:
        found["deepspeed_config"] = {k: v for k, v in config["deepspeed_config"].items() if k in DEEPSPEED_KEYS}
    if "fsdp_config" in config:
        found["fsdp_config"] = dict(config["fsdp_config"])
    return found


def excerpt_lines(whole: bytes, part: bytes) -> str | None:
    """The lines ``part`` is of ``whole`` ("27-39", counted from 1), or None where it is not a run of whole lines."""
    start = whole.find(part)
    if start < 0 or (start and whole[start - 1 : start] != b"\n"):
        return None
    first = whole[:start].count(b"\n") + 1
    last = first + part.rstrip(b"\n").count(b"\n")
    return f"{first}-{last}"


def record(folder: Path, mirrors: Path) -> tuple[dict, str | None]:
    """A fetched recipe folder's record, and its translation block as written (with its ``# from:`` comments)."""
    meta_text = (folder / "recipe.yaml").read_text()
    meta = yaml.safe_load(meta_text)
    files = {}
    for name, local in meta["source"]["files"].items():
        mine = (folder / local).read_bytes()
        files[name] = {"sha256": sha256(mine)}
        whole = upstream(mirrors, meta["source"]["repo"], meta["source"]["commit"], name)
        if whole != mine:
            lines = excerpt_lines(whole, mine)
            if lines is None:
                raise ValueError(f"{folder}: {local} is neither {name} nor a run of its lines")
            files[name]["lines"] = lines
    config = (folder / meta["config"]).read_text()
    translated = None
    if meta["format"] == "trl-yaml":
        settings = training(yaml.safe_load(config))
    elif meta["format"] == "trl-command":
        settings = training(command_settings(config))
    else:
        settings = None
        block = re.search(r"^translated:\n((?:  .*\n?)+)", meta_text, flags=re.M)
        translated = block.group(1).rstrip("\n") if block else None
    launch = dict(meta["launch"])
    for key in ("accelerate", "deepspeed"):
        if launch.get(key):
            launch[key] = Path(launch[key]).name
    out = {
        "kind": meta["kind"],
        "family": meta["family"],
        "model": meta["model"],
        "source": {"repo": meta["source"]["repo"], "commit": meta["source"]["commit"], "files": files},
        "format": meta["format"],
        "cell": meta.get("cell"),
        "launch": launch,
        "data": meta["data"],
        "data_source": meta.get("data_source"),
        "settings": settings,
        "notes": " ".join(str(meta.get("notes") or "").split()),
    }
    return out, translated


def write(fetched: Path, mirrors: Path) -> None:
    """Write zoo/recipes/ from a folder of fetched recipes (one-off, or after fetching a new recipe)."""
    for collection in sorted(p for p in fetched.iterdir() if p.is_dir()):
        launches = {}
        for folder in sorted(p for p in collection.iterdir() if (p / "recipe.yaml").exists()):
            out, translated = record(folder, mirrors)
            text = dump(out)
            if translated is not None:
                text = text.replace("settings: null\n", "settings:\n" + translated + "\n")
            target = RECIPES / collection.name / f"{folder.name}.yaml"
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text)
        for sub in ("accelerate_configs", "deepspeed"):
            for path in sorted((collection / sub).glob("*")) if (collection / sub).is_dir() else []:
                settings = launch_settings(path.read_text(), path.name)
                launches[path.name] = {"sha256": sha256(path.read_bytes()), **settings}
        if launches:
            (RECIPES / collection.name / "launches.yaml").write_text(dump(launches))


def upstream(mirrors: Path, repo: str, commit: str, path: str) -> bytes:
    git = mirrors / repo.replace("/", "+") / "repo"
    return subprocess.run(["git", "-C", str(git), "show", f"{commit}:{path}"], capture_output=True, check=True).stdout


def check(mirrors: Path) -> int:
    """Every recipe's sources at their commits: the sha256 of the whole file, or of a run of its lines (an excerpt:
    a docstring's command, a notebook's cell); prints what differs, returns the number of differences."""
    bad = 0
    for path in sorted(RECIPES.glob("*/*.yaml")):
        if path.name == "launches.yaml":
            continue
        recipe = yaml.safe_load(path.read_text())
        for name, file in recipe["source"]["files"].items():
            try:
                text = upstream(mirrors, recipe["source"]["repo"], recipe["source"]["commit"], name)
            except (subprocess.CalledProcessError, FileNotFoundError) as error:
                print(f"{path.relative_to(ZOO)}: {name} not readable: {error}")
                bad += 1
                continue
            if "lines" in file:
                first, last = (int(n) for n in file["lines"].split("-"))
                text = b"".join(text.splitlines(keepends=True)[first - 1 : last])
            if sha256(text) != file["sha256"]:
                print(f"{path.relative_to(ZOO)}: {name} at {recipe['source']['commit'][:7]} differs")
                bad += 1
    return bad


if __name__ == "__main__":
    verb, where = sys.argv[1], Path(sys.argv[2])
    if verb == "write":
        write(where, Path(sys.argv[3]))
    elif verb == "check":
        sys.exit(1 if check(where) else 0)
    else:
        raise SystemExit(f"usage: {__doc__.splitlines()[7]}")
