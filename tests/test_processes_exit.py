"""`trl-clinic watch` and `trl-clinic checkup` launched on two processes (torchrun and accelerate launch, gloo, CPU)
with a finding: every process ends with exit code 1, together, and no process is killed by the launcher.

Before, each process returned its own exit code when it was done: the launcher's agent (torch 2.13
``SubprocessContext._poll``, every 0.1 s) saw the first process exit 1 while the other still wrote its summary or
saved the model, and sent it SIGTERM ("Sending process ... closing signal SIGTERM"; rank 0 then ended by the signal),
in 1 of 2 launches of `trl-clinic watch` here. The launcher still ends with its own summary of a non-zero exit
(torchrun's ``ChildFailedError`` and its traceback, the launcher's and not a process's): that is what the tests
read every process's exit code from. It is a race, so the launch is repeated."""

import re

import pytest
from test_checkup_cli import local, recipe  # noqa: F401 (local: the saved tiny models and train.jsonl files)
from test_processes import launch

BROKEN = {  # OPT packs its rows without a per-sequence mask: the watch's packing finding at step 1
    "max_steps": 2,
    "logging_steps": 1,
    "save_strategy": "no",
    "activation_checkpointing": False,
    "disable_tqdm": True,
    "padding_free": True,
    "max_length": None,
    "per_device_train_batch_size": 4,
    "gradient_accumulation_steps": 1,
}
SIGNALLED = ("SIGTERM", "SignalException", "terminate called", "Signal ")


def ended_together(tmp_path, launcher: str, command: list[str]) -> None:
    """One launch of ``trl-clinic COMMAND`` on two processes that must end with 1 on both, none signalled."""
    config = "multi_gpu.yaml" if launcher == "accelerate" else None
    _, outs, done = launch(
        tmp_path, *command, script="-m trl_clinic.cli", launcher=launcher, config=config, returncode=1
    )
    said = done.stdout + done.stderr
    assert not [word for word in SIGNALLED if word in said], said[-4000:]
    # every process says its code (on stderr, which the launcher passes through), and the launcher's summary lists
    # every process's exit code
    assert sorted(re.findall(r"trl-clinic: process (\d) of 2 exits with (\d)", said)) == [("0", "1"), ("1", "1")]
    assert sorted(re.findall(r"rank\s+: (\d) \(local_rank: \d\)\n\s+exitcode\s+: (-?\d+)", said)) == [
        ("0", "1"),
        ("1", "1"),
    ], said[-3000:]


def watch_command(local) -> list[str]:  # noqa: F811
    config = recipe(local, "sft", **BROKEN, model_name_or_path=str(local / "opt"))
    return ["watch", "sft", "--config", config, "--stop-on", "packing"]


def checkup_command(local) -> list[str]:  # noqa: F811
    config = recipe(local, "sft", **BROKEN, model_name_or_path=str(local / "opt"))
    return ["checkup", "sft", "--config", config, "--only", "packing"]


@pytest.mark.parametrize("launcher", ["torchrun", "accelerate"])
@pytest.mark.parametrize("command", [watch_command, checkup_command], ids=["watch", "checkup"])
def test_every_process_ends_with_the_same_code_unsignalled(tmp_path, local, launcher, command):  # noqa: F811
    ended_together(tmp_path, launcher, command(local))


@pytest.mark.slow
@pytest.mark.parametrize("launcher", ["torchrun", "accelerate"])
def test_every_process_ends_together_launch_after_launch(tmp_path, local, launcher):  # noqa: F811
    """The race, repeated: 5 launches of each command under each launcher."""
    for command in (watch_command, checkup_command):
        for _ in range(5):
            ended_together(tmp_path, launcher, command(local))
