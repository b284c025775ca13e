"""What one learner costs a shared box on the cpu profile: memory and cores per lesson, and JupyterLab's own.

    .venv/bin/python benchmarks/room_sizing.py [--lessons 01 02 ...] [--out sizing.json]

(on this project's shared machine, under ``cpu-slot``). Each core runs alone (``trl-clinic run NN --cores
--jobs 1 --profile cpu``) while the processes below the runner (the lesson's kernel and whatever it starts: an
era's script, 02b's two ranks, 05's crashing child) are sampled every 0.1 s: the peak of their summed resident
memory; and the CPU seconds of the run and all it waited for (``getrusage``, the runner's own few seconds
included) over the lesson's wall seconds: the cores it kept busy on average. RSS sums
count the libraries two processes share twice: an upper bound, which is what a box needs when each learner has
a venv of their own. JupyterLab's server is measured idle, once started. Prints a markdown table; docs/workshop.md
holds the last one.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import secrets
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

BIN = Path(sys.executable).parent
CORES = ["01", "02", "02b", "03", "04", "05", "06", "07"]


def tree(root: psutil.Process) -> list[psutil.Process]:
    try:
        return root.children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def peak_rss(process: subprocess.Popen) -> int:
    """Peak summed RSS (MiB) of everything below ``process``, sampled until it ends."""
    root = psutil.Process(process.pid)
    peak = 0.0
    while process.poll() is None:
        rss = 0
        for child in tree(root):
            try:
                rss += child.memory_info().rss
            except psutil.NoSuchProcess:
                continue
        peak = max(peak, rss / 2**20)
        time.sleep(0.1)
    return round(peak)


def cpu_seconds() -> float:
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


def lesson(key: str, out: Path) -> dict:
    start, cpu = time.perf_counter(), cpu_seconds()
    command = [str(BIN / "trl-clinic"), "run", key, "--cores", "--jobs", "1", "--profile", "cpu", "--no-progress"]
    process = subprocess.Popen([*command, "--out", str(out)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    peak = peak_rss(process)
    wall, cpu = time.perf_counter() - start, cpu_seconds() - cpu
    status = json.loads((out / "summary.json").read_text())["lessons"][0]["status"]
    row = {"lesson": key, "status": status, "wall_s": round(wall, 1), "cpu_s": round(cpu, 1)}
    return {**row, "cores": round(cpu / wall, 2), "peak_rss_mib": peak}


def jupyterlab_idle() -> int:
    """RSS (MiB) of a JupyterLab server 15 s after it started, no kernel open."""
    with tempfile.TemporaryDirectory() as runtime:
        server = subprocess.Popen(
            [
                str(BIN / "jupyter"),
                "lab",
                "--no-browser",
                "--allow-root",
                "--ServerApp.port=0",
                f"--IdentityProvider.token={secrets.token_hex(8)}",
            ],
            env={**os.environ, "JUPYTER_RUNTIME_DIR": runtime},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            time.sleep(15)
            return round(psutil.Process(server.pid).memory_info().rss / 2**20)
        finally:
            server.terminate()
            server.wait(timeout=30)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--lessons", nargs="*", default=CORES)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for key in args.lessons:
            rows.append(lesson(key, Path(folder) / key))
            print(rows[-1], flush=True)
    lab = jupyterlab_idle()
    print("\n| lesson | status | wall s | CPU s | cores busy (mean) | peak RSS MiB (kernel and children) |")
    print("|---|---|---|---|---|---|")
    for row in rows:
        columns = ("lesson", "status", "wall_s", "cpu_s", "cores", "peak_rss_mib")
        print("| " + " | ".join(str(row[column]) for column in columns) + " |")
    print(f"\nJupyterLab server, idle: {lab} MiB RSS; CPU cores here: {psutil.cpu_count()}")
    if args.out:
        args.out.write_text(json.dumps({"lessons": rows, "jupyterlab_idle_rss_mib": lab}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
