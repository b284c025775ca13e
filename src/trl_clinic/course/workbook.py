"""Running the lessons with papermill and summarising how each one ended.

One output folder per run: ``OUT/<lesson>/`` holds the executed notebook, its figures and its
``metrics.json``; ``OUT/summary.json`` and ``OUT/summary.md`` say what each lesson found.
"""

from __future__ import annotations

import ast
import json
import multiprocessing
import os
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass
from pathlib import Path

from trl_clinic.course.gpu_usage import GpuUsage
from trl_clinic.course.lessons import DEEPER
from trl_clinic.course.lessons import lessons as lesson_table
from trl_clinic.course.results import METRICS_FILE, eras_not_run, failed_checks, load_metrics
from trl_clinic.course.runtime import PROGRESS_ENV

SUMMARY_JSON, SUMMARY_MD = "summary.json", "summary.md"


@dataclass
class LessonResult:
    lesson: str
    status: str  # "passed", "incomplete" (checks passed, an era did not run), "failed checks", "error"
    seconds: float
    notebook: str
    symptom_reproduced: bool | None = None
    symptom_kind: str | None = None  # "measured", or the stand-ins it rests on ("recreated", "injected")
    fix_verified: bool | None = None
    failed: list[str] | None = None
    error: str | None = None
    summary: str = ""  # the lesson's own sentences, written from its numbers (save_metrics)
    # peak_gpu_memory_mib and mean_gpu_utilisation_pct over the lesson's run (gpu_usage), or why absent
    gpu: dict | None = None


def find_lessons(notebooks_dir: str | Path) -> dict[str, Path]:
    """Lesson notebooks by name (file stem), in order: the cores ``NN_*.ipynb`` (and parts such as
    ``NNb_*.ipynb``), then their deep dives ``deeper/NN_*.ipynb``."""
    folder = Path(notebooks_dir)
    if not folder.is_dir():
        raise FileNotFoundError(
            f"no notebooks folder at {folder.resolve()}: run from the repository root or pass --notebooks"
        )
    pattern = "[0-9][0-9]*_*.ipynb"
    found = sorted(folder.glob(pattern)) + sorted((folder / "deeper").glob(pattern))
    return {path.stem: path for path in found}


def is_deep_dive(path: Path) -> bool:
    return path.parent.name == "deeper"


def select(lessons: dict[str, Path], wanted: list[str], cores_only: bool = False) -> dict[str, Path]:
    """Pick lessons by number ("02": its core and its deep dive), by key ("02-deeper": the deep
    dive alone, as ``trl-clinic list`` names it) or full name; an unknown one is an error that lists the known.
    ``cores_only``: leave the deep dives out (a workshop's run)."""
    if cores_only:
        lessons = {name: path for name, path in lessons.items() if not is_deep_dive(path)}
    if not wanted:
        return lessons
    stems = {key: lesson.stem for key, lesson in lesson_table().items() if key.endswith(DEEPER)}
    chosen = {}
    for item in wanted:
        matches = [name for name in lessons if item in (name, name.split("_", 1)[0]) or name == stems.get(item)]
        if not matches:
            raise ValueError(f"unknown lesson {item!r}; known: {', '.join(lessons)}")
        chosen.update({name: lessons[name] for name in matches})
    return chosen


def notebook_parameters(path: Path) -> dict[str, dict]:
    """The names and defaults (as source text, ``'"auto"'``) of the notebook's ``parameters`` cell.

    Read with ``ast`` rather than ``papermill.inspect_notebook``, whose import (nbformat's validator) alone
    takes seconds: ``trl-clinic list`` and a bad ``-p`` answer at once.
    """
    cells = [
        cell
        for cell in json.loads(Path(path).read_text())["cells"]
        if "parameters" in cell.get("metadata", {}).get("tags", [])
    ]
    if len(cells) != 1:
        raise ValueError(f"{Path(path).stem} must have exactly one cell tagged 'parameters', it has {len(cells)}")
    source = "".join(cells[0]["source"])
    return {
        node.targets[0].id: {"default": ast.get_source_segment(source, node.value)}
        for node in ast.parse(source).body
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
    }


def check_parameters(path: Path, parameters: dict[str, object]) -> None:
    known = notebook_parameters(path)
    unknown = sorted(set(parameters) - set(known))
    if unknown:
        raise ValueError(f"{path.stem} has no parameter {', '.join(unknown)}; it takes {', '.join(known)}")


def run_lesson(path: Path, out: Path, parameters: dict[str, object], progress_bar: bool = True) -> LessonResult:
    """Execute one notebook; a failure is recorded, never raised, so the other lessons still run."""
    lesson_dir = out / path.stem
    lesson_dir.mkdir(parents=True, exist_ok=True)
    executed = lesson_dir / path.name
    start = time.perf_counter()
    error = None
    os.environ[PROGRESS_ENV] = "0"  # the kernel inherits it: no training progress bars in executed notebooks
    import papermill
    from traitlets.config import Config

    usage = GpuUsage().start()
    try:
        # IPC sockets in a private folder rather than TCP: nothing to eavesdrop on, and no "Kernel is
        # running over TCP without encryption" warning per lesson that a learner cannot act on
        with tempfile.TemporaryDirectory(prefix="trl-clinic-kernel-") as sockets:
            transport = Config({"KernelManager": {"transport": "ipc", "ip": str(Path(sockets) / "kernel")}})
            papermill.execute_notebook(
                str(path),
                str(executed),
                parameters={**parameters, "output_dir": str(lesson_dir)},
                progress_bar=progress_bar,
                cwd=str(path.parent),
                config=transport,
            )
    except papermill.PapermillExecutionError as exc:
        error = f"{exc.ename}: {exc.evalue}"
    finally:
        gpu = usage.stop()
    seconds = time.perf_counter() - start
    result = LessonResult(
        lesson=path.stem,
        status="error",
        seconds=round(seconds, 1),
        notebook=str(executed.relative_to(out)),
        error=error,
        gpu=gpu,
    )
    if (lesson_dir / METRICS_FILE).exists():
        metrics = load_metrics(lesson_dir)
        result.symptom_reproduced = metrics["symptom_reproduced"]
        result.symptom_kind = metrics["symptom_kind"]
        result.fix_verified = metrics["fix_verified"]
        result.failed = failed_checks(metrics)
        result.summary = metrics.get("summary", "")
        if error is None:
            result.status = "failed checks" if result.failed else "passed" if metrics["complete"] else "incomplete"
            result.error = "; ".join(eras_not_run(metrics)) or None
    elif error is None:
        result.error = f"the notebook finished without writing {METRICS_FILE}"
    return result


def default_jobs(profile: str) -> int:
    """How many lessons run at once by default: one per core on the cpu profile (each lesson's torch uses
    one thread there), one at a time on a GPU, where lessons would share the device and its numbers."""
    if profile == "auto":
        import torch

        profile = "gpu" if torch.cuda.is_available() else "cpu"
    return max(1, os.cpu_count() or 1) if profile == "cpu" else 1


def said(result: LessonResult) -> None:
    """One line per lesson as it ends: time, GPU use, and the verdict."""
    verdict = (
        ""
        if result.symptom_reproduced is None
        else (f" (symptom reproduced: {result.symptom_reproduced}, fix verified: {result.fix_verified})")
    )
    gpu = result.gpu or {}
    busy = (
        ""
        if gpu.get("peak_gpu_memory_mib") is None
        else f", GPU peak {gpu['peak_gpu_memory_mib']:.0f} MiB, {gpu['mean_gpu_utilisation_pct']:.0f} % busy"
    )
    print(f"{result.lesson}: {result.status} in {result.seconds:.0f} s{busy}{verdict}", flush=True)
    if result.error:
        print(f"  {result.error.splitlines()[0][:300]}", flush=True)


def run_lessons(
    lessons: list[Path],
    out: Path,
    parameters: dict[str, object],
    jobs: int = 1,
    progress_bar: bool = True,
    on_done: Callable[[LessonResult], None] | None = None,
) -> list[LessonResult]:
    """Every lesson, ``jobs`` at a time, each in its own process (a papermill kernel per lesson); results in
    the lessons' order, ``on_done`` called as each one ends. Per-cell progress bars only when one runs at
    a time: several would interleave."""
    if jobs < 1:
        raise ValueError(f"--jobs must be at least 1, got {jobs}")
    if jobs == 1:
        results = []
        for path in lessons:
            results.append(run_lesson(path, out, parameters, progress_bar=progress_bar))
            if on_done:
                on_done(results[-1])
        return results
    with ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = {
            path: pool.submit(run_lesson, path, out, parameters, False)
            for path in longest_first(lessons, str(parameters.get("profile", "cpu")))
        }
        for future in as_completed(futures.values()):
            if on_done:
                on_done(future.result())
        return [futures[path].result() for path in lessons]


def longest_first(lessons: list[Path], profile: str) -> list[Path]:
    """The lessons by their measured seconds (lesson.yaml), longest first: started last, the longest lesson
    would run alone on one core at the end (lesson 05 did, 311 s for 496 s of lessons at --jobs 2).
    The cpu seconds stand in where the profile's were not measured (gpu so far, or "auto"); a lesson
    measured under neither keeps its place after the others."""
    from trl_clinic.course.lessons import lessons as table

    measured = {lesson.stem: lesson.seconds for lesson in table().values()}

    def seconds(path: Path) -> float:
        row = measured.get(path.stem, {})
        return row.get(profile) or row.get("cpu") or 0

    return sorted(lessons, key=seconds, reverse=True)


def write_summary(out: Path, results: list[LessonResult], parameters: dict[str, object]) -> None:
    (out / SUMMARY_JSON).write_text(
        json.dumps({"parameters": parameters, "lessons": [asdict(result) for result in results]}, indent=2)
    )
    lines = [
        "| lesson | status | symptom reproduced | symptom kind | fix verified | seconds | peak GPU MiB "
        "| mean GPU % | what it showed |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        gpu = r.gpu or {}
        lines.append(
            f"| {r.lesson} | {r.status} | {r.symptom_reproduced} | {r.symptom_kind} | {r.fix_verified} "
            f"| {r.seconds} | {gpu.get('peak_gpu_memory_mib')} | {gpu.get('mean_gpu_utilisation_pct')} "
            f"| {r.summary.replace('|', '/')} |"
        )
        if r.error:
            lines.append(f"| | {r.error.splitlines()[0][:200]} | | | | | | | |")
    (out / SUMMARY_MD).write_text("\n".join(lines) + "\n")
