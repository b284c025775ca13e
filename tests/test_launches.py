"""The check-up under the launches its users train with: DDP, DeepSpeed ZeRO-2, ZeRO-3 (the model built partitioned,
``zero3_init_flag``), FSDP2 (the model sharded at load by transformers, ``DistributedConfig(fsdp_size=2)``: accelerate
builds no FSDP on CPU processes, docs/checkup.md "Launches") and one process, each a 2-process ``accelerate launch`` on
this CPU (gloo; DeepSpeed's accelerator falls back to the CPU), gives the verdict one process gives on the same recipe;
where the weights are sharded it measures on them whole, leaves every shard as it was, and computes the gradient the
engine's first optimizer step is given.

The recipes are ``trl sft`` YAML files run through ``trl-clinic checkup sft --config`` (TRL's own script builds the
trainer) on a tiny Llama and a tiny OPT saved with the course tokenizer. Every launch has a timeout, so a process
left alone in a collective fails the test instead of hanging it.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from transformers import AutoModelForCausalLM, AutoTokenizer

from trl_clinic.checkup.step import size
from trl_clinic.course.launch import free_port
from trl_clinic.course.models import make_causal_lm

SCRIPTS = Path(__file__).parent / "launches"
# seconds: a launch takes 30-60 s on two cores (most of it two processes importing DeepSpeed, TRL and transformers);
# the first DeepSpeed launch on a machine also compiles DeepSpeed's shared-memory op once (about 2.5 min here)
LAUNCH_TIMEOUT = 420
# ChatML whose last turn ends on <|im_end|>: the course template writes a newline after it, which turn_end fails
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' }}"
    "{% if not loop.last %}{{ '\\n' }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '\\n<|im_start|>assistant\\n' }}{% endif %}"
)
WORDS = "the a cat dog sat on mat ran fast slow red blue green under over".split()
DEEPSPEED = {"offload_optimizer_device": "none", "offload_param_device": "none"}
MULTI = {"distributed_type": "MULTI_GPU", "use_cpu": False}  # on CPU processes with use_cpu=True: gloo
ENGINES = {  # accelerate's config for each launch
    "ddp": MULTI,
    "zero2": {"distributed_type": "DEEPSPEED", "use_cpu": True, "deepspeed_config": {"zero_stage": 2, **DEEPSPEED}},
    "zero3": {
        "distributed_type": "DEEPSPEED",
        "use_cpu": True,
        "deepspeed_config": {"zero_stage": 3, "zero3_init_flag": True, **DEEPSPEED},
    },
    "fsdp2": MULTI,
}
SHARDING = {"fsdp2": {"model_init_kwargs": {"distributed_config": {"fsdp_size": 2}}}}  # the recipe's line per launch
# float32 throughout: with bf16 DeepSpeed builds the weights in bfloat16 under ZeRO-3 (its Init's dtype) and steps
# float32 masters of them, which stalled_update and init_dtype do not read yet (docs/checkup.md, "Launches")
FLOAT32 = {"bf16": False, "dtype": "float32"}
RECIPES = {
    # padded rows, an accumulation window of 2: every probe that runs a forward and a backward measures
    "padded": {"model": "llama", "gradient_accumulation_steps": 2, "max_length": 64},
    # one line apart: Llama's mask reads position_ids, OPT's ignores them (packing fails, measured); one micro-batch
    # a window, since the accumulation probe's packed reference omits the processes' factor (reported)
    "packed": {"model": "llama", "padding_free": True, "max_length": None, "attn_implementation": "eager"},
    "packed-opt": {"model": "opt", "padding_free": True, "max_length": None, "attn_implementation": "eager"},
}
FORWARDS = {"accumulation", "padding_cache", "gradients_reach"}  # the padded recipe's probes that run the model


def make_materials(folder: Path, tokenizer) -> Path:
    """A Llama and an OPT of the brief's sizes (hidden 64, 2 layers, 4 heads, tied embeddings) saved with the course
    tokenizer and the template above, and 32 chat rows as JSONL, under ``folder``."""
    tokenizer.save_pretrained(folder / "tokenizer")
    chat = AutoTokenizer.from_pretrained(folder / "tokenizer")
    chat.chat_template = CHAT_TEMPLATE
    for family in ("llama", "opt"):
        model = make_causal_lm(chat, family, size="micro", num_hidden_layers=2)
        model.save_pretrained(folder / family)
        chat.save_pretrained(folder / family)
    rows = [
        {
            "messages": [
                {"role": "user", "content": " ".join(WORDS[(i * 7 + j) % len(WORDS)] for j in range(2 + i % 7))},
                {"role": "assistant", "content": " ".join(WORDS[(i * 5 + j) % len(WORDS)] for j in range(2 + i % 11))},
            ]
        }
        for i in range(32)
    ]
    pairs = [
        {
            "prompt": " ".join(WORDS[(i * 7 + j) % len(WORDS)] for j in range(2 + i % 5)),
            "chosen": " ".join(WORDS[(i * 5 + j) % len(WORDS)] for j in range(2 + i % 7)),
            "rejected": " ".join(WORDS[(i * 3 + j) % len(WORDS)] for j in range(3 + i % 4)),
        }
        for i in range(32)
    ]
    for name, lines in (("data", rows), ("pairs", pairs)):
        (folder / name).mkdir(exist_ok=True)
        (folder / name / "train.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    return folder


@pytest.fixture(scope="module")
def materials(tmp_path_factory, tokenizer):
    return make_materials(tmp_path_factory.mktemp("launches"), tokenizer)


def recipe(materials: Path, name: str, data: str = "data", **overrides) -> Path:
    """The ``trl sft`` (or ``trl dpo``) YAML of ``RECIPES[name]`` on the rows of ``data``: one step, no reporting, on
    the CPU, float32 unless overridden."""
    settings = dict(RECIPES[name])
    model = settings.pop("model")
    config = {
        "model_name_or_path": str(materials / model),
        "dataset_name": str(materials / data),
        "output_dir": str(materials / "out"),
        "use_cpu": True,
        "max_steps": 1,
        "report_to": "none",
        "save_strategy": "no",  # a model sharded at load time cannot save its optimizer (transformers 5.23.0)
        "per_device_train_batch_size": 2,
        "seed": 0,
        **FLOAT32,
        **settings,
        **overrides,
    }
    path = materials / f"{name}-{abs(hash(json.dumps(config, sort_keys=True)))}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def accelerate_config(materials: Path, engine: str, mixed_precision: str = "no") -> Path:
    config = {
        "compute_environment": "LOCAL_MACHINE",
        "machine_rank": 0,
        "main_process_port": free_port(),
        "main_training_function": "main",
        "mixed_precision": mixed_precision,
        "num_machines": 1,
        "num_processes": 2,
        **ENGINES[engine],
    }
    path = materials / f"accelerate-{engine}-{config['main_process_port']}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def run(command: list[str]) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "DS_ACCELERATOR": "cpu", "PYTHONUNBUFFERED": "1"}
    return subprocess.run(command, capture_output=True, text=True, timeout=LAUNCH_TIMEOUT, env=env)


def launch(config: Path, *command: str) -> subprocess.CompletedProcess:
    """``accelerate launch --config_file CONFIG COMMAND...``: two processes."""
    return run([sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(config), *command])


def checkup(kind: str = "sft") -> tuple[str, ...]:
    """``trl-clinic checkup KIND --json --config``, the recipe's path to follow."""
    return ("-m", "trl_clinic.cli", "checkup", kind, "--json", "--config")


def report(done: subprocess.CompletedProcess) -> dict:
    """The JSON report the check-up printed (once, by the main process); exit 0 or 1 (a probe failed) only."""
    assert done.returncode in (0, 1) and "\n{\n" in f"\n{done.stdout}", done.stderr[-4000:]
    text = f"\n{done.stdout}"
    return json.loads(text[text.index("\n{\n") + 1 :])


def scripted(materials: Path, engine: str, script: str, *args: str, mixed_precision: str = "no") -> list[dict]:
    """Run ``tests/launches/SCRIPT RECIPE OUT ARGS...`` in both processes of a launch; each process's result, in
    process order (each writes its own file: two processes' lines on one pipe can interleave)."""
    out = materials / f"out-{free_port()}"
    out.mkdir()
    config = accelerate_config(materials, engine, mixed_precision)
    done = launch(config, str(SCRIPTS / script), args[0], str(out), *args[1:])
    assert done.returncode == 0, done.stderr[-4000:]
    return [json.loads((out / f"result-{process}.json").read_text()) for process in range(2)]


ACROSS_PROCESSES = ("replicas",)  # reads whether several processes' models are wrapped: one process skips it


def verdict(report: dict) -> list[tuple[str, str, str]]:
    """Each finding's probe, status and how it was decided: what a launch must not change. A probe that exists for
    several processes is left out (in one process it skips, saying why) and ``across`` reads it apart."""
    return [(f["probe"], f["status"], f["decided"]) for f in report["findings"] if f["probe"] not in ACROSS_PROCESSES]


def across(report: dict) -> list[tuple[str, str, str]]:
    """The probes of several processes: ok and decided from the launch's config under every engine here (each wraps
    the model: DDP, DeepSpeed's engine, FSDP), skipped in one process."""
    return [(f["probe"], f["status"], f["decided"]) for f in report["findings"] if f["probe"] in ACROSS_PROCESSES]


_one_process: dict[Path, dict] = {}


def one_process(path: Path, kind: str = "sft") -> dict:
    """``trl-clinic checkup KIND --config PATH --json`` in one process, once per recipe."""
    if path not in _one_process:
        _one_process[path] = report(run([sys.executable, *checkup(kind), str(path)]))
    return _one_process[path]


@pytest.mark.slow
@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("name", RECIPES)
def test_each_launch_gives_the_one_process_verdict(materials, engine, name):
    path = recipe(materials, name, **SHARDING.get(engine, {}))
    launched = report(launch(accelerate_config(materials, engine), *checkup(), str(path)))
    single = one_process(recipe(materials, name))
    assert (launched["processes"], single["processes"]) == (2, 1)
    assert verdict(launched) == verdict(single), (launched["findings"], single["findings"])
    assert across(launched) == [("replicas", "ok", "config")] and across(single) == [("replicas", "skipped", "")]
    assert not launched["errors"]
    packing = next(f for f in launched["findings"] if f["probe"] == "packing")
    if name == "packed-opt":
        assert (packing["status"], packing["known_bug"]) == ("fail", "01-family-mask-ignores-position-ids")
    if name == "padded":
        measured = {f["probe"] for f in launched["findings"] if f["decided"] == "measured"}
        assert FORWARDS <= measured, launched["findings"]


@pytest.mark.slow
def test_dpo_under_zero3_gives_the_one_process_verdict(materials):
    """TRL wraps DPO's reference model in a DeepSpeed engine of its own under ZeRO-3 (trl 1.16.0 ``models/utils.py``
    ``prepare_deepspeed``), which gathers its weights in its forward: the check-up gathers the policy's only."""
    path = recipe(materials, "padded", data="pairs")
    launched = report(launch(accelerate_config(materials, "zero3"), *checkup("dpo"), str(path)))
    single = one_process(path, "dpo")
    assert verdict(launched) == verdict(single), (launched["findings"], single["findings"])
    assert across(launched) == [("replicas", "ok", "config")]
    measured = {f["probe"] for f in launched["findings"] if f["decided"] == "measured"}
    assert FORWARDS <= measured and not launched["errors"], launched["findings"]


def saved_llama(materials: Path) -> tuple[int, int, int]:
    """The saved Llama as one process loads it, float32: its tensors (the tied embedding once), elements, and the
    bytes of it whole with the gradient of each tensor."""
    params = list(AutoModelForCausalLM.from_pretrained(materials / "llama", dtype="float32").parameters())
    elements = sum(p.numel() for p in params)
    return len(params), elements, 2 * 4 * elements


def test_zero3_measures_on_gathered_weights_and_leaves_every_partition_as_it_was(materials):
    """The brief's recipe under ZeRO-3 in bfloat16 (every weight built partitioned and empty): before, every probe
    that runs the model raised "'weight' must be 2-D"; now they measure, and afterwards each partition's bytes,
    status and empty data, the flags, gradients, buffers, optimizer, random state and trainer are as they were."""
    path = recipe(materials, "padded", bf16=True, dtype="bfloat16")
    tensors, elements, _ = saved_llama(materials)
    for result in scripted(materials, "zero3", "untouched.py", str(path), mixed_precision="bf16"):
        assert result["changed"] == [], result["changed"]
        assert (result["sharded"], result["numel"]) == (tensors, 0)  # every tensor partitioned, empty again
        assert result["parameters"] == elements  # counted whole, not as the empty tensors it holds
        statuses = {probe: status for probe, status, _, _ in result["findings"]}
        assert "error" not in statuses.values(), result["findings"]
        assert all(statuses[probe] in ("ok", "warn", "fail") for probe in FORWARDS), result["findings"]
        assert statuses["accumulation"] == "ok", result["findings"]


@pytest.mark.slow
def test_fsdp2_measures_on_unsharded_weights_and_leaves_every_shard_as_it_was(materials):
    """Sharded at load by transformers, every weight is a DTensor shard whose forward all-gathers and whose backward
    reduce-scatters the processes' mean gradient: the check-up unshards each module once, sets FSDP's hooks aside,
    measures this process's gradient, then puts the hooks back and reshards; each local shard, the flags, gradients,
    buffers, optimizer, random state and trainer are as they were."""
    path = recipe(materials, "padded", **SHARDING["fsdp2"])
    tensors, elements, _ = saved_llama(materials)
    for result in scripted(materials, "fsdp2", "untouched.py", str(path)):
        assert result["changed"] == [], result["changed"]
        assert (result["sharded"], result["parameters"]) == (tensors, elements)
        statuses = {probe: status for probe, status, _, _ in result["findings"]}
        assert "error" not in statuses.values(), result["findings"]
        assert all(statuses[probe] == "ok" for probe in FORWARDS), result["findings"]
        reach = next(measured for probe, _, _, measured in result["findings"] if probe == "gradients_reach")
        assert f"of {tensors} trainable tensors" in reach  # the tied embedding is one tensor while whole, too


@pytest.mark.slow
@pytest.mark.parametrize("engine", ["zero3", "fsdp2"])
def test_over_budget_the_forwards_skip_saying_what_they_needed(materials, engine):
    path, budget = recipe(materials, "padded", **SHARDING.get(engine, {})), 100_000
    _, _, whole = saved_llama(materials)
    holds = {"zero3": "DeepSpeed ZeRO-3", "fsdp2": "torch's fully_shard (FSDP2)"}[engine]
    for result in scripted(materials, engine, "untouched.py", str(path), str(budget)):
        assert result["changed"] == [], result["changed"]
        findings = {probe: (status, why) for probe, status, _, why in result["findings"]}
        assert not [f for f in result["findings"] if f[1] == "error"], result["findings"]
        for probe in FORWARDS:
            status, why = findings[probe]
            assert status == "skipped" and f"{holds} holds the model sharded across 2 processes" in why, why
            assert f"{size(whole)} (every weight" in why and f"budget of {size(budget)}" in why, why


@pytest.mark.slow
@pytest.mark.parametrize("engine", ["zero2", "zero3", "fsdp2"])
def test_the_first_window_gradient_is_the_one_the_engine_steps_with(materials, engine):
    """The window's gradient the check-up computes (on the whole weights where they are sharded), averaged over the
    processes, equals the gradient the engine holds when its first optimizer step begins, tensor by tensor; clipping
    off, since transformers clips before the step's callback."""
    path = recipe(materials, "padded", max_grad_norm=0, **SHARDING.get(engine, {}))
    for result in scripted(materials, engine, "gradient.py", str(path)):
        assert result["tensors"] == saved_llama(materials)[0]
        worst = max(result["differences"].items(), key=lambda item: item[1])
        assert worst[1] < 1e-5, worst
