"""The one script that adapts every recipe of the zoo to this machine: a tiny model of the recipe's family, only what
a CPU forces changed, each change recorded with its reason.

    python zoo/adapt.py COLLECTION/NAME [--twin PROBE] [--out FOLDER]   # writes the adapted recipe, prints its command

A recipe (``recipes/<collection>/<name>.yaml``) holds the settings its author wrote and the launch they used. Adapting
it writes a folder that ``trl <kind> --config config.yaml`` (and ``trl-clinic checkup|watch <kind>``) runs offline:

* ``model/``: the recipe's model as a tiny model of the same family (``families.build``): the family's own class at
  about 0.1M parameters, the checkpoint's special tokens, BOS/EOS/pad and chat template (the recipe's own where it
  sets one, as its author's script does: the alignment-handbook and open-r1 set ``chat_template`` on the tokenizer);
* ``data/train.jsonl``: rows in the format of the recipe's dataset (``data.rows``), enough for every process's
  batches;
* ``config.yaml``: every training setting the author wrote, but what ``CHANGES`` below says;
* ``accelerate.yaml`` (or ``deepspeed.json``): the author's launch with 2 processes on the CPU;
* ``adapted.yaml``: the recipe's name, the command, the launch, and every change (key, before, after, why).

What changes, and why (``Change.why`` holds one of these):

* ``model``: the checkpoint is a tiny model of its family (the only change every recipe gets);
* ``renamed``: a key or value today's TRL or transformers renamed (``torch_dtype`` is ``dtype`` in TRL 1.16's
  ModelConfig, ``max_seq_length`` is ``max_length``, ``warmup_ratio`` is a float ``warmup_steps`` in transformers 5,
  ``packing_strategy: ffd`` is ``bfd``);
* ``script``: a key the author's own script reads and TRL's does not (the handbook's ``chat_template``, open-r1's
  ``system_prompt`` and ``dataset_prompt_column``): applied as that script applies it, then left out;
* ``unknown``: a key no dataclass of ``trl <kind>`` 1.16 has; its script ignores it (``fail_with_unknown_args=False``
  in ``trl/scripts/<kind>.py``), and so does the zoo;
* ``cpu``: what a CPU cannot run: FlashAttention (``sdpa`` instead), Liger's Triton kernels, vLLM, TF32,
  bitsandbytes' paged and 8-bit optimizers (``adamw_torch``), 2 processes instead of 8;
* ``stack``: what today's libraries refuse that the author's accepted (a MoE LoRA's dropout, a KTO batch of 1);
* ``launch``: a one-process run drops what only several processes use (FSDP set in TrainingArguments);
* ``size``: lengths and steps cut so a check-up takes seconds: ``max_length`` at most ``MAX_LENGTH``, GRPO's
  completions ``COMPLETION_LENGTH`` tokens, 2 steps, no evaluation, saving or reporting;
* ``data``: the dataset is generated locally in the recipe's format (``data_source`` names the original);
* ``reward``: a reward function stands in from ``zoo_rewards`` (each labelled there): the authors' own code is not
  importable here, and their 0/1 rewards give a tiny random policy 0 everywhere, a run no author had; the stand-ins
  reward the same things with the partial credit a random policy earns.

Batch sizes, accumulation, learning rates, schedules, optimizers that run on a CPU, precision (``bf16``, ``dtype``),
LoRA and QLoRA settings, packing, padding-free, loss types and completion or assistant-only losses are kept.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import shlex
import sys
from dataclasses import asdict, dataclass, field
from functools import cache
from pathlib import Path

import yaml

ZOO = Path(__file__).resolve().parent
RECIPES = ZOO / "recipes"
sys.path.insert(0, str(ZOO))

import data  # noqa: E402
import families  # noqa: E402
import zoo_rewards  # noqa: E402

PROCESSES = 2  # a launch of several processes, on this machine's 2 cores
MAX_LENGTH = 2048  # the longest sequence a tiny model sees: every generated row fits (a cohere2 chat is ~1200 tokens)
# families whose model classes in transformers 5.23 take no sdpa (Gemma2ForSequenceClassification refuses it)
EAGER = ("gemma2",)
COMPLETION_LENGTH = 16  # GRPO's generations: tiny models on a CPU
STEPS = 2
RENAMED = {"torch_dtype": "dtype", "max_seq_length": "max_length", "warmup_ratio": "warmup_steps"}
# values TRL renamed: packing_strategy "ffd" is "bfd" since TRL PR #3696 ("First-fit decreasing" is actually
# "Best-fit-decreasing"); TRL 1.16's SFTConfig takes bfd, bfd_split or wrapped
RENAMED_VALUES = {("packing_strategy", "ffd"): "bfd"}
CPU_OPTIMS = ("paged_", "8bit", "bnb")
MOE = ("mixtral",)
FAST_ATTENTION = (
    "flash_attention_2",
    "flash_attention_3",
    "kernels-community/flash-attn",
    "kernels-community/vllm-flash-attn3",
)
# the keys a run writes its results with: replaced, never part of a recipe's training
RUN_SETTINGS = {
    "output_dir": "out",
    "report_to": "none",
    "save_strategy": "no",
    "eval_strategy": "no",
    "logging_steps": 1,
    "max_steps": STEPS,
    "use_cpu": True,
    "dataloader_num_workers": 0,
    "disable_tqdm": True,
}


@dataclass
class Change:
    key: str
    before: object
    after: object
    why: str  # model, renamed, script, unknown, cpu, stack, size, run, launch, data, reward, twin
    note: str = ""


@dataclass
class Adapted:
    name: str  # collection/name
    kind: str
    family: str
    folder: Path
    config: dict
    launch: dict  # engine (single, ddp, deepspeed, fsdp), processes, and the file that configures it
    changes: list[Change] = field(default_factory=list)
    twin: str | None = None
    hook: str | None = None  # a twin's change to the built trainer (twins.HOOKS), applied by hooked.py

    def command(self, tool: str = "checkup", json_report: bool = True) -> list[str]:
        """The command that runs ``trl-clinic <tool>`` on this recipe under its launch, from ``self.folder``."""
        inner = ["-m", "trl_clinic.cli", tool, self.kind, "--config", "config.yaml"] + (
            ["--json"] if json_report else []
        )
        if self.hook is not None:
            return [sys.executable, str(ZOO / "hooked.py"), self.hook, self.kind, *inner[4:]]
        processes = self.launch["processes"]
        if processes == 1:
            return [sys.executable, *inner]
        if self.launch.get("by_arguments"):  # DeepSpeed or FSDP set in TrainingArguments, launched as torchrun does
            return [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={processes}", *inner]
        return [
            sys.executable,
            "-m",
            "accelerate.commands.launch",
            "--config_file",
            str(self.folder / "accelerate.yaml"),
            *inner,
        ]

    def environment(self) -> dict[str, str]:
        """The command's environment: offline, one thread a process, the zoo's rewards importable."""
        path = os.pathsep.join(filter(None, [str(ZOO), os.environ.get("PYTHONPATH")]))
        return {
            **os.environ,
            "HF_HUB_OFFLINE": "1",
            "HF_DATASETS_OFFLINE": "1",
            "OMP_NUM_THREADS": "1",
            "PYTHONPATH": path,
        }


def load(name: str) -> dict:
    path = RECIPES / f"{name}.yaml"
    if not path.exists():
        raise FileNotFoundError(f"no recipe {name!r} in {RECIPES}: `python zoo/adapt.py --list` names them")
    return yaml.safe_load(path.read_text())


def names() -> list[str]:
    return sorted(
        str(p.relative_to(RECIPES).with_suffix("")) for p in RECIPES.glob("*/*.yaml") if p.name != "launches.yaml"
    )


@cache
def known_keys(kind: str) -> dict[str, object]:
    """The arguments ``trl <kind>`` takes and their defaults: its own parser's (``trl.scripts.<kind>.make_parser``)."""
    parser = importlib.import_module(f"trl.scripts.{kind}").make_parser()
    return {action.dest: action.default for action in parser._actions}


def launch_of(recipe: dict, collection: str) -> tuple[dict, dict | None]:
    """The author's launch (engine, processes) and the transcribed accelerate or DeepSpeed config it names."""
    launch = recipe["launch"]
    launches_file = RECIPES / collection / "launches.yaml"
    launches = yaml.safe_load(launches_file.read_text()) if launches_file.exists() else {}
    settings = launches.get(launch.get("accelerate") or launch.get("deepspeed") or "")
    processes = launch.get("processes")
    if settings and "deepspeed" in settings:
        return {"engine": "deepspeed", "processes": processes, "by_arguments": True}, settings
    if (recipe["settings"] or {}).get("fsdp"):  # FSDP set in TrainingArguments (axolotl's fsdp: keys)
        return {"engine": "fsdp", "processes": processes, "by_arguments": True}, settings
    kind = (settings or {}).get("distributed_type")
    engine = {"DEEPSPEED": "deepspeed", "FSDP": "fsdp", "MULTI_GPU": "ddp"}.get(kind)
    if engine is None:
        engine = "single" if processes == 1 else "ddp"
    return {"engine": engine, "processes": processes}, settings


def adapt(name: str, out: Path, twin: str | None = None, seed: int = 0, processes: int | None = None) -> Adapted:
    """Write recipe ``name`` adapted (see the module) under ``out``; with ``twin``, its broken twin for that probe;
    ``processes``: 1 runs any launch in one process (the twins' check-ups, and quick looks)."""
    recipe, out = load(name), out.resolve()
    collection = name.split("/")[0]
    processes = 1 if twin is not None else processes  # a twin runs in one process
    kind, family, model = recipe["kind"], recipe["family"], recipe["model"]
    settings = dict(recipe["settings"] or {})
    changes: list[Change] = []
    known = known_keys(kind)
    config: dict = {}

    def change(key, before, after, why, note=""):
        changes.append(Change(key, before, after, why, note))

    # keys the author's own script reads
    template = settings.pop("chat_template", None)
    if template is not None:
        change("chat_template", "(the recipe's)", "set on the tiny model's tokenizer", "script")
    system = settings.pop("system_prompt", None)
    column = settings.pop("dataset_prompt_column", None)
    if system is not None:
        change("system_prompt", bool(system), "the first message of every generated prompt", "script")
    if column is not None:
        change("dataset_prompt_column", column, "the generated rows' own prompt column", "data")
    if "no_remove_unused_columns" in settings:
        settings["remove_unused_columns"] = not settings.pop("no_remove_unused_columns")
    for key, value in settings.items():
        if key in RENAMED:
            change(key, value, f"{RENAMED[key]}: {value}", "renamed")
            key = RENAMED[key]
        if key in ("model_name_or_path", "dataset_name"):
            continue
        if key in ("dataset_config", "dataset_train_split", "dataset_test_split"):
            change(key, value, "the generated local dataset (one train split)", "data")
            continue
        if key not in known:
            change(key, value, None, "unknown")
            continue
        if isinstance(value, str) and (key, value) in RENAMED_VALUES:
            change(key, value, RENAMED_VALUES[key, value], "renamed")
            value = RENAMED_VALUES[key, value]
        config[key] = value
    # the model
    tokens = families.tokens_of(family, model)
    template = template if template is not None else families.template_text(tokens.template, RECIPES)
    built = families.build(family, model, template, out.parent / "models", seed=seed)
    change("model_name_or_path", model, f"tiny {family} ({families.TINY['hidden_size']} wide, 2 layers)", "model")
    config["model_name_or_path"] = str(built.folder)
    # what a CPU forces
    if config.get("attn_implementation") in FAST_ATTENTION:
        cpu_attention = "eager" if family in EAGER else "sdpa"
        change("attn_implementation", config["attn_implementation"], cpu_attention, "cpu")
        config["attn_implementation"] = cpu_attention
    for key in ("use_liger_kernel", "use_vllm", "tf32"):
        if config.get(key):
            change(key, True, False, "cpu")
            config[key] = False
    # what today's stack refuses that the author's accepted: transformers 5 holds a MoE's experts as fused parameters,
    # which peft 0.21.2 adapts with lora.ParamWrapper, and that refuses a dropout ("does not work with lora_dropout
    # != 0"); the recipe's LoRA targets them through all-linear
    if family in MOE and config.get("use_peft") and config.get("lora_dropout"):
        change("lora_dropout", config["lora_dropout"], 0.0, "stack", "peft 0.21.2's ParamWrapper refuses a dropout")
        config["lora_dropout"] = 0.0
    # TRL 1.16's KTOTrainer refuses a per-device batch of 1 when it computes its KL term (kto_trainer.py: "Actual (not
    # effective) batch size must be > 1"); LLaMA-Factory's own KTO takes one
    if kind == "kto" and int(config.get("per_device_train_batch_size", 8)) < 2:
        change("per_device_train_batch_size", config["per_device_train_batch_size"], 2, "stack", "KTO needs 2 rows")
        config["per_device_train_batch_size"] = 2
    optim = str(config.get("optim", ""))
    if any(part in optim for part in CPU_OPTIMS):
        change("optim", optim, "adamw_torch", "cpu", "bitsandbytes' paged and 8-bit optimizers need a GPU")
        config["optim"] = "adamw_torch"
    # sizes
    if kind == "grpo":
        length = config.get("max_completion_length")
        change("max_completion_length", length, COMPLETION_LENGTH, "size")
        config["max_completion_length"] = COMPLETION_LENGTH
    elif "max_length" in known:
        length = config.get("max_length", known["max_length"])
        if length is None or length > MAX_LENGTH:
            change("max_length", length, MAX_LENGTH, "size")
            config["max_length"] = MAX_LENGTH
    for key, value in RUN_SETTINGS.items():
        if config.get(key, known.get(key)) != value:
            change(key, config.get(key, known.get(key)), value, "size" if key == "max_steps" else "run")
        config[key] = value
    config["output_dir"] = str(out / "out")
    # the launch
    launch, launch_settings = launch_of(recipe, collection)
    if processes is None:
        processes = 1 if launch["engine"] == "single" else PROCESSES
    elif processes == 1:
        launch = {"engine": "single", "processes": 1}
    if processes == 1:
        for key in ("fsdp", "fsdp_config"):  # FSDP set in TrainingArguments needs several processes
            if config.get(key):
                change(key, config.pop(key), None, "launch", "one process: FSDP shards nothing there")
    if launch["processes"] != processes:
        change("num_processes", launch["processes"], processes, "cpu")
    launch["processes"] = processes
    # accelerate 1.15's FSDP plugin puts every parameter on the current accelerator to sync module states (and
    # efficient loading turns that on): "There are currently no available devices found" on a CPU
    if launch["engine"] == "fsdp" and processes > 1 and (launch_settings or {}).get("fsdp_config"):
        fsdp = dict(launch_settings["fsdp_config"])
        for key in ("fsdp_cpu_ram_efficient_loading", "fsdp_sync_module_states"):
            if fsdp.get(key):
                change(key, True, False, "cpu", "accelerate syncs module states on an accelerator device")
                fsdp[key] = False
        launch_settings = {**launch_settings, "fsdp_config": fsdp}
    if kind == "grpo":
        keep_generation_batch(
            config, known, launch_processes=recipe["launch"].get("processes"), here=processes, change=change
        )
    # the data: enough rows for the first batches of every process, whatever the accumulation
    batch = int(config.get("per_device_train_batch_size", 8))
    window = batch * int(config.get("gradient_accumulation_steps", 1)) * processes
    rows = max(64, 4 * window)
    data.write(recipe["data"], rows, out / "data", seed=seed, system=system)
    change("dataset_name", recipe.get("data_source"), f"{rows} rows of {recipe['data']}", "data")
    config["dataset_name"] = str(out / "data")
    if kind == "grpo":
        rewards = []
        for reward in config.get("reward_funcs") or ["accuracy_reward"]:
            stand_in = zoo_rewards.NAMES.get(reward, zoo_rewards.NAMES["accuracy"] if "accuracy" in reward else None)
            if stand_in is None and not reward.startswith("think_format"):
                raise ValueError(f"{name}: no stand-in for reward {reward!r} in zoo_rewards.NAMES")
            rewards.append(stand_in or reward)
            if stand_in:
                change("reward_funcs", reward, stand_in, "reward")
        config["reward_funcs"] = rewards
    adapted = Adapted(name, kind, family, out, config, launch, changes)
    if twin is not None:
        import twins

        twins.apply(adapted, twin, recipe)
    write(adapted, launch_settings)
    return adapted


def keep_generation_batch(config: dict, known: dict, launch_processes: int | None, here: int, change) -> None:
    """GRPO's generation batch (per-device batch x processes x accumulation) must be a multiple of num_generations
    (TRL 1.16's GRPOConfig refuses it otherwise): where the author's process count made it one and this machine's does
    not, the per-device batch takes the author's global batch over this machine's processes."""
    batch = int(config.get("per_device_train_batch_size", known.get("per_device_train_batch_size", 8)))
    steps = int(config.get("gradient_accumulation_steps", 1))
    generations = int(config.get("num_generations", known.get("num_generations", 8)))
    if not launch_processes or (batch * here * steps) % generations == 0:
        return
    scaled, left = divmod(batch * launch_processes, here)
    if left == 0 and (batch * launch_processes * steps) % generations == 0:
        change("per_device_train_batch_size", batch, scaled, "cpu", f"the author's global batch on {here} process(es)")
        config["per_device_train_batch_size"] = scaled


def write(adapted: Adapted, launch_settings: dict | None) -> None:
    out, launch = adapted.folder, adapted.launch
    out.mkdir(parents=True, exist_ok=True)
    if launch["processes"] > 1 and launch["engine"] == "deepspeed" and launch.get("by_arguments"):
        section = launch_settings["deepspeed"]
        config = {
            "zero_optimization": {"stage": section["zero_stage"]},
            "bf16": {"enabled": "auto"},
            "fp16": {"enabled": "auto"},
            "train_micro_batch_size_per_gpu": "auto",
            "gradient_accumulation_steps": "auto",
            "gradient_clipping": "auto",
        }
        for part in ("optimizer", "param"):
            device = section.get(f"offload_{part}")
            if device and device != "none":
                config["zero_optimization"][f"offload_{part}"] = {"device": device}
        (out / "deepspeed.json").write_text(json.dumps(config, indent=2))
        adapted.config["deepspeed"] = str(out / "deepspeed.json")
    elif launch["processes"] > 1 and not launch.get("by_arguments"):
        accelerate = {
            "compute_environment": "LOCAL_MACHINE",
            "distributed_type": {"deepspeed": "DEEPSPEED", "fsdp": "FSDP", "ddp": "MULTI_GPU"}[launch["engine"]],
            "mixed_precision": (launch_settings or {}).get("mixed_precision", "no"),
            "num_machines": 1,
            "num_processes": launch["processes"],
            "machine_rank": 0,
            "use_cpu": True,
        }
        for section in ("deepspeed_config", "fsdp_config"):
            if section in (launch_settings or {}):
                accelerate[section] = dict(launch_settings[section])
        (out / "accelerate.yaml").write_text(yaml.safe_dump(accelerate, sort_keys=False))
    (out / "config.yaml").write_text(yaml.safe_dump(adapted.config, sort_keys=False, allow_unicode=True))
    record = {
        "name": adapted.name,
        "twin": adapted.twin,
        "hook": adapted.hook,
        "kind": adapted.kind,
        "family": adapted.family,
        "launch": launch,
        "command": shlex.join(adapted.command()),
        "changes": [asdict(c) for c in adapted.changes],
    }
    (out / "adapted.yaml").write_text(yaml.safe_dump(record, sort_keys=False, allow_unicode=True, width=120))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("name", nargs="?", help="COLLECTION/NAME of a recipe")
    parser.add_argument("--twin", help="write the recipe's broken twin for this probe instead")
    parser.add_argument("--out", type=Path, help="the folder to write (default: zoo-output/<name>)")
    parser.add_argument("--list", action="store_true", help="list the recipes")
    options = parser.parse_args()
    if options.list or not options.name:
        print("\n".join(names()))
        return
    out = options.out or Path("zoo-output") / options.name.replace("/", "__")
    adapted = adapt(options.name, out, twin=options.twin)
    print(f"cd {out} && {shlex.join(adapted.command())}")


if __name__ == "__main__":
    main()
