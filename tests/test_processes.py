"""The check-up and the watch in a run of two processes (torchrun, gloo, CPU): one stop at the same step on both,
a finding one process saw printed once and in the summary, the check-up's verdict the one-process verdict.
Each launch has a timeout: a process left waiting in a collective fails the test, never hangs the suite."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from trl_clinic.course.launch import free_port

SCRIPT = Path(__file__).parent / "processes" / "run.py"
MASKED = 5  # the row with every label masked; with seed 0 it reaches process 1
LAUNCH_TIMEOUT = 180  # seconds: a launch takes about 10 s here (most of it imports)


def launch(tmp_path, *args: str, processes: int = 2) -> tuple[list[dict], str]:
    command = [sys.executable, str(SCRIPT), *args]
    if processes > 1:
        command[1:1] = [
            "-m",
            "torch.distributed.run",
            "--nproc_per_node",
            str(processes),
            "--master_addr",
            "127.0.0.1",
            "--master_port",
            str(free_port()),
        ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "RUN_OUT": str(tmp_path)}
    done = subprocess.run(command, capture_output=True, text=True, timeout=LAUNCH_TIMEOUT, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    # two processes may write to the same stdout between each other's newline: find the records, not lines
    results = [json.loads(found) for found in re.findall(r"RESULT (\{[^{}]*\})", done.stdout)]
    assert len(results) == processes, done.stdout
    return sorted(results, key=lambda r: r["process"]), done.stdout


def test_stop_on_ends_every_process_at_the_same_step(tmp_path):
    results, out = launch(tmp_path, "stop", str(MASKED))
    (seen,) = {tuple(map(tuple, r["findings"])) for r in results}  # both processes hold the same findings
    probe, step, process = seen[0]
    assert (probe, process) == ("no_labels", 1)
    assert [r["step"] for r in results] == [step, step] and step < 16  # stopped after the finding's step, not at 16


def test_a_finding_of_one_process_is_printed_once_and_summarised(tmp_path):
    results, out = launch(tmp_path, "watch", str(MASKED))
    assert [r["step"] for r in results] == [16, 16]
    lines = [line for line in out.splitlines() if line.startswith("[trl-clinic watch] step")]
    assert len(lines) == 1 and "(process 1): no_labels" in lines[0]
    assert "16 optimizer steps watched: 1 finding(s)" in out and "(process 1) no_labels" in out
    assert "every step had label tokens" not in out


@pytest.mark.parametrize("masked", [MASKED, -1])
def test_the_checkup_in_two_processes_gives_the_one_process_verdict(tmp_path, masked):
    two, _ = launch(tmp_path, "checkup", str(masked))
    one, _ = launch(tmp_path, "checkup", str(masked), processes=1)
    report, single = (json.loads((tmp_path / f"report-{n}.json").read_text()) for n in (2, 1))
    assert (report["processes"], single["processes"]) == (2, 1)
    verdict = lambda r: [(f["probe"], f["status"], f["value"]) for f in r["findings"]]  # noqa: E731
    assert verdict(report) == verdict(single)
    assert {r["exit_code"] for r in two} == {one[0]["exit_code"]} == {1 if masked >= 0 else 0}
