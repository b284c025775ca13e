"""`trl-clinic watch sft|dpo|reward|grpo`: TRL's own parser and script train, for real and offline, from a local
model folder and local jsonl files, with the watch added; the exit code says whether it found something."""

import subprocess
import sys

import pytest
from test_checkup_cli import local, recipe  # noqa: F401 (local: the saved tiny models and train.jsonl files)
from test_watch import one_thread, warm_up  # noqa: F401 (one_thread: a module fixture, autouse)

from trl_clinic import cli

TRAIN = {
    "max_steps": 2,
    "logging_steps": 1,
    "save_strategy": "no",
    "activation_checkpointing": False,
    "disable_tqdm": True,
}


@pytest.fixture(scope="module")
def policy(local, tokenizer):
    """A warmed-up policy beside the check-up's local files: its completions end, so GRPO is healthy."""
    return warm_up(tokenizer, local / "warm")


@pytest.mark.parametrize(
    "kind,extra",
    [
        ("sft", {}),
        ("dpo", {}),
        ("reward", {}),
        (
            "grpo",
            {
                "reward_funcs": ["trl_clinic.course.data.category_reward"],
                "num_generations": 4,
                "per_device_train_batch_size": 4,
                "max_completion_length": 16,
                "model_name_or_path": "policy",
            },
        ),
    ],
)
def test_each_trainer_kind_trains_with_the_watch_and_passes(local, policy, capsys, kind, extra):
    if extra.get("model_name_or_path") == "policy":
        extra = {**extra, "model_name_or_path": str(policy)}
    code = cli.main(["watch", kind, "--config", recipe(local, kind, **TRAIN, **extra)])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "[trl-clinic watch] 2 optimizer steps watched: no findings" in out
    assert "Model saved to" in out  # TRL's script went on to save the model


def test_a_broken_recipe_is_named_stopped_and_reported(local, capsys):
    config = recipe(
        local,
        "sft",
        **{**TRAIN, "max_steps": 3},
        model_name_or_path=str(local / "opt"),
        padding_free=True,
        max_length=None,
        per_device_train_batch_size=4,
    )
    page = local / "watch.html"
    code = cli.main(["watch", "sft", "--config", config, "--stop-on", "packing", "--report", str(page)])
    out = capsys.readouterr().out
    assert code == 1
    assert "[trl-clinic watch] step 1: packing:" in out and "lesson 01 (padding-free contamination)" in out
    assert "1 optimizer steps watched" in out  # stopped at the step of the finding, not after 3
    assert "1 finding(s) in 1 steps" in page.read_text()


def test_an_unknown_finding_is_one_clear_error(local, capsys):
    code = cli.main(["watch", "sft", "--config", recipe(local, "sft", **TRAIN), "--stop-on", "nan"])
    assert code == 2 and "unknown finding(s) nan" in capsys.readouterr().err
    code = cli.main(["watch", "sft", "--config", recipe(local, "sft", **TRAIN), "--window", "0"])
    assert code == 2 and "window must be at least 1 step" in capsys.readouterr().err


def test_the_watch_help_stays_light_and_lists_every_finding():
    from trl_clinic.watch import CATALOGUE

    code = (
        "import sys, contextlib, io\nfrom trl_clinic.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()) as out, contextlib.suppress(SystemExit):\n"
        "    main(['watch', '--help'])\n"
        "print(sorted(m for m in ('torch', 'trl', 'transformers') if m in sys.modules), out.getvalue())"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.startswith("[]"), result.stdout[:300]
    assert all(f"{key}, lesson" in result.stdout or f"{key}, no lesson" in result.stdout for key in CATALOGUE)
