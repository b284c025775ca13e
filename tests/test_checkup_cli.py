"""`trl-clinic checkup sft|dpo|reward|grpo`: TRL's own parser and script build the trainer from a local model
folder and local jsonl files (offline), the check-up runs on it, and the exit code says whether it failed."""

import json
import subprocess
import sys

import pytest
import yaml

from trl_clinic import cli
from trl_clinic.course.data import instruction_pairs, preference_pairs, reward_prompts
from trl_clinic.course.models import make_causal_lm

DATA = {"sft": instruction_pairs, "dpo": preference_pairs, "reward": preference_pairs, "grpo": reward_prompts}


@pytest.fixture(scope="module")
def local(tokenizer, tmp_path_factory):
    """A saved tiny model with its tokenizer, and one folder of train.jsonl per trainer kind."""
    root = tmp_path_factory.mktemp("checkup-cli")
    for family, folder in (("llama", "model"), ("opt", "opt")):
        make_causal_lm(tokenizer, family).save_pretrained(root / folder)
        tokenizer.save_pretrained(root / folder)
    for kind, make in DATA.items():
        (root / kind).mkdir()
        make(16, seed=0).to_json(root / kind / "train.jsonl")
    return root


def recipe(local, kind, **settings):
    path = local / f"{kind}-{len(settings)}.yaml"
    config = {
        "model_name_or_path": str(local / "model"),
        "dataset_name": str(local / kind),
        "output_dir": str(local / "out"),
        "use_cpu": True,
        "bf16": False,
        "report_to": "none",
        "per_device_train_batch_size": 2,
        "gradient_accumulation_steps": 2,
        **settings,
    }
    path.write_text(yaml.safe_dump(config))
    return str(path)


def run_json(capsys, argv):
    code = cli.main(argv)
    out = capsys.readouterr().out
    return code, json.loads(out[out.index("{") :])


@pytest.mark.parametrize(
    "kind,extra",
    [
        ("sft", {}),
        ("dpo", {}),
        ("reward", {}),
        (
            "grpo",
            {
                "reward_funcs": ["trl_clinic.course.examples.length_reward"],
                "num_generations": 4,
                "per_device_train_batch_size": 4,
                "max_completion_length": 8,
            },
        ),
    ],
)
def test_each_trainer_kind_builds_from_local_files_and_passes(local, capsys, kind, extra):
    code, report = run_json(capsys, ["checkup", kind, "--config", recipe(local, kind, **extra), "--json"])
    trainer = {"sft": "SFTTrainer", "dpo": "DPOTrainer", "reward": "RewardTrainer", "grpo": "GRPOTrainer"}[kind]
    assert report["subject"].startswith(trainer)
    from trl_clinic.checkup import load_probes

    statuses = {f["probe"]: f["status"] for f in report["findings"]}
    assert code == 0 and report["exit_code"] == 0 and not {"fail", "error"} & set(statuses.values()), report
    assert list(statuses) == list(load_probes()) and any(s == "ok" for s in statuses.values())
    assert all(f["decided"] in ("measured", "config", "table") for f in report["findings"] if f["status"] == "ok")


def test_a_failing_recipe_exits_1_and_only_limits_the_probes(local, capsys):
    config = recipe(
        local,
        "sft",
        model_name_or_path=str(local / "opt"),
        padding_free=True,
        max_length=None,
        per_device_train_batch_size=4,
    )
    code, report = run_json(capsys, ["checkup", "sft", "--config", config, "--only", "packing", "known_bugs", "--json"])
    assert code == 1
    assert [(f["probe"], f["status"], f["decided"]) for f in report["findings"]] == [
        ("packing", "fail", "measured"),
        ("known_bugs", "ok", "table"),
    ]  # measured, never failed by the family's name


def test_a_warning_does_not_fail_the_checkup(local, capsys):
    """TRL 1.16's `trl sft` puts ModelConfig's dtype (float32 by default) beside the recipe's model_init_kwargs,
    and from_pretrained takes dtype over the legacy torch_dtype: the model is float32, read from the built model."""
    config = recipe(local, "sft", model_init_kwargs={"torch_dtype": "bfloat16"})
    code, report = run_json(capsys, ["checkup", "sft", "--config", config, "--only", "init_dtype", "--json"])
    (finding,) = report["findings"]
    assert (code, finding["status"], finding["decided"], finding["known_bug"]) == (
        0,
        "warn",
        "config",
        "03-torch-dtype-init-kwarg-ignored",
    )
    assert "torch_dtype=bfloat16" in finding["measured"] and "torch.float32" in finding["measured"]


def test_grpo_config_that_trl_refuses_is_a_fail_with_trls_message(local, capsys):
    config = recipe(
        local,
        "grpo",
        reward_funcs=["trl_clinic.course.data.category_reward"],
        num_generations=3,
        per_device_train_batch_size=4,
    )
    code, report = run_json(capsys, ["checkup", "grpo", "--config", config, "--json"])
    assert code == 1
    (finding,) = report["findings"]
    assert (finding["probe"], finding["status"], finding["decided"]) == ("grpo_config", "fail", "config")
    assert "divisible by num_generations" in finding["fix"]


def test_any_other_build_error_is_an_error_not_a_config_fail(local, capsys):
    """Only what TRL's config classes refuse is the config's fail; a model folder that does not exist
    stops the build elsewhere, which is an error (exit code 3), never a grpo_config fail."""
    config = recipe(
        local,
        "grpo",
        reward_funcs=["trl_clinic.course.examples.length_reward"],
        num_generations=4,
        per_device_train_batch_size=4,
        model_name_or_path=str(local / "no-such-model"),
    )
    code, report = run_json(capsys, ["checkup", "grpo", "--config", config, "--json"])
    (finding,) = report["findings"]
    assert (code, finding["probe"], finding["status"]) == (3, "build", "error")
    assert "could not be built" in finding["reason"]


def test_flags_after_the_kind_and_a_table_by_default(local, capsys):
    code = cli.main(
        [
            "checkup",
            "sft",
            "--model_name_or_path",
            str(local / "model"),
            "--dataset_name",
            str(local / "sft"),
            "--output_dir",
            str(local / "out"),
            "--use_cpu",
            "--bf16",
            "False",
            "--report_to",
            "none",
            "--skip",
            "accumulation",
            "padding_cache",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0 and "labels_present" in out and "padding_cache" not in out


def test_help_explains_every_probe_and_the_top_level_command_stays_light():
    from trl_clinic.checkup import load_probes, probe_catalogue

    assert probe_catalogue() == [(p.name, p.lesson, p.explains) for p in load_probes().values()]
    code = (
        "import sys, contextlib, io\nfrom trl_clinic.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()) as out, contextlib.suppress(SystemExit):\n"
        "    main(['checkup', '--help'])\n"
        "print(sorted(m for m in ('torch', 'trl', 'transformers') if m in sys.modules), out.getvalue())"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.startswith("[]"), result.stdout[:300]  # answered without importing torch
    assert all(name in result.stdout for name in load_probes())
    assert all(word in result.stdout for word in ("measured", "config", "table", "exit code", "error"))
    light = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from trl_clinic.cli import parser; parser(); "
            "print(sorted(m for m in ('torch', 'trl', 'transformers', 'trl_clinic.course') "
            "if m in sys.modules))",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert light.stdout.strip() == "[]"  # nor the course, whose import sets offline mode
