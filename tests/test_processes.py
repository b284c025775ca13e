"""The check-up and the watch in a run of two processes (torchrun, gloo, CPU): one stop at the same step on both,
a finding one process saw printed once and in the summary, the check-up's verdict the one-process verdict.
Each launch has a timeout: a process left waiting in a collective fails the test, never hangs the suite."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from trl_clinic.course.launch import distributed_args, free_port

HERE = Path(__file__).parent / "processes"
SCRIPT = HERE / "run.py"
MASKED = 5  # the row with every label masked; with seed 0 it reaches process 1
LAUNCH_TIMEOUT = 180  # seconds: a launch takes about 10 s here (most of it imports)


def launch(
    tmp_path,
    *args: str,
    processes: int = 2,
    script: Path | str = SCRIPT,
    launcher: str = "torchrun",
    config: str | None = None,
    returncode: int = 0,
    env: dict | None = None,
) -> tuple[list[dict], list[str], subprocess.CompletedProcess]:
    """Each process's ``RESULT``, what it printed, in process order, and the launch itself (the launcher's exit
    status and what it wrote). Each process's stdout goes to its own file (torchrun ``--redirects 1``, accelerate
    ``--tee 1``): on one shared pipe two processes' lines interleave, since an unbuffered ``print``
    (``PYTHONUNBUFFERED``) writes its text and its newline in two writes, and another process's line can land
    between them. ``script``: a path, or ``-m module``; ``launcher``: ``torchrun`` (the course's own launch over
    gloo) or ``accelerate`` (``accelerate launch --config_file config``, a file under tests/processes)."""
    logs = tmp_path / f"logs-{free_port()}"
    target = ["-m", script[3:]] if isinstance(script, str) and script.startswith("-m ") else [str(script)]
    command = [sys.executable, *target, *args]
    if processes > 1 and launcher == "torchrun":
        command = [
            sys.executable,
            *distributed_args(["--log-dir", str(logs), "--redirects", "1", *target, *args], processes, cpu=True),
        ]
    elif processes > 1:
        command = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(HERE / config)]
        command += ["--num_processes", str(processes), "--main_process_port", str(free_port())]
        command += ["--tee", "1", "--log_dir", str(logs), *target, *args]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "RUN_OUT": str(tmp_path), **(env or {})}
    done = subprocess.run(command, capture_output=True, text=True, timeout=LAUNCH_TIMEOUT, env=env)
    assert done.returncode == returncode, done.stdout[-3000:] + done.stderr[-3000:]
    if processes == 1:
        outs = [done.stdout]
    else:  # <log-dir>/<run id>/attempt_0/<local rank>/stdout.log
        outs = [next(logs.glob(f"*/attempt_*/{rank}/stdout.log")).read_text() for rank in range(processes)]
    results = [
        json.loads(line[len("RESULT ") :]) for out in outs for line in out.splitlines() if line.startswith("RESULT ")
    ]
    return results, outs, done


def launched(tmp_path, *args: str, processes: int = 2, **options) -> tuple[list[dict], list[str]]:
    """``launch``, where every process printed its ``RESULT``, in process order."""
    results, outs, _ = launch(tmp_path, *args, processes=processes, **options)
    assert [r["process"] for r in results] == list(range(processes)), outs
    return results, outs


def test_stop_on_ends_every_process_at_the_same_step(tmp_path):
    results, _ = launched(tmp_path, "stop", str(MASKED))
    (seen,) = {tuple(map(tuple, r["findings"])) for r in results}  # both processes hold the same findings
    probe, step, process = seen[0]
    assert (probe, process) == ("no_labels", 1)
    assert [r["step"] for r in results] == [step, step] and step < 16  # stopped after the finding's step, not at 16


def test_a_finding_of_one_process_is_printed_once_and_summarised(tmp_path):
    results, (main, other) = launched(tmp_path, "watch", str(MASKED))
    assert [r["step"] for r in results] == [16, 16]
    lines = [line for line in main.splitlines() if line.startswith("[trl-clinic watch] step")]
    assert len(lines) == 1 and "(process 1): no_labels" in lines[0]  # printed by the main process, once
    assert "16 optimizer steps watched: 1 finding(s)" in main and "(process 1) no_labels" in main
    assert "every step had label tokens" not in main
    assert "[trl-clinic watch]" not in other  # the process that saw it prints nothing itself


@pytest.mark.parametrize("masked", [MASKED, pytest.param(-1, marks=pytest.mark.slow)])  # healthy: the DDP test below
def test_the_checkup_in_two_processes_gives_the_one_process_verdict(tmp_path, masked):
    two, _ = launched(tmp_path, "checkup", str(masked))
    one, _ = launched(tmp_path, "checkup", str(masked), processes=1)
    report, single = (json.loads((tmp_path / f"report-{n}.json").read_text()) for n in (2, 1))
    assert (report["processes"], single["processes"]) == (2, 1)
    verdict = lambda r: [(f["probe"], f["status"], f["value"]) for f in r["findings"]]  # noqa: E731
    assert verdict(report) == verdict(single)
    assert {r["exit_code"] for r in two} == {one[0]["exit_code"]} == {1 if masked >= 0 else 0}


# -- the check-up's replicas probe: a launch whose model will never be wrapped ---------------------------------------
@pytest.mark.parametrize("launcher", [pytest.param("torchrun", marks=pytest.mark.slow), "accelerate"])
def test_the_checkup_fails_processes_whose_model_will_not_be_wrapped(tmp_path, launcher):
    """ddp_backend="gloo" without use_cpu on a CPU (under accelerate launch: TRL's FSDP2 config): accelerate's
    distributed_type NO, two processes each training its own model. Before, the check-up had no probe for it."""
    options = json.dumps({"use_cpu": False, "ddp_backend": "gloo", "only": ["replicas"]})
    config = "fsdp2.yaml" if launcher == "accelerate" else None
    results, _ = launched(tmp_path, "checkup", "-1", options, launcher=launcher, config=config)
    (finding,) = json.loads((tmp_path / "report-2.json").read_text())["findings"]
    assert (finding["probe"], finding["status"], finding["decided"], finding["process"]) == (
        "replicas",
        "fail",
        "config",
        None,
    )
    assert "distributed_type NO on every one" in finding["measured"] and "2x a process's own" in finding["measured"]
    assert finding["fix"].startswith("use_cpu=True on CPU processes")
    assert {r["exit_code"] for r in results} == {1}


def test_the_checkup_passes_ddp_replicas_and_skips_one_process(tmp_path):
    options = json.dumps({"only": ["replicas"]})
    two, _ = launched(tmp_path, "checkup", "-1", options)
    one, _ = launched(tmp_path, "checkup", "-1", options, processes=1)
    (ddp,) = json.loads((tmp_path / "report-2.json").read_text())["findings"]
    (single,) = json.loads((tmp_path / "report-1.json").read_text())["findings"]
    assert (ddp["status"], single["status"]) == ("ok", "skipped")
    assert ddp["measured"].startswith("DistributedDataParallel over 2 processes (accelerate's MULTI_CPU)")
    assert "counts the label tokens of every process" in ddp["measured"]
    assert single["reason"] == "one process: no replicas to compare"
    assert {r["exit_code"] for r in two + one} == {0}
