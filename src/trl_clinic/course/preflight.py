"""A learner's check the day before a workshop (``make preflight``), ending in one line to paste to the facilitator.

``make preflight`` builds the venv and every era first (from PyPI, or from a shared wheelhouse); this module then
runs, on the cpu profile, the three cores that use what a laptop can lack: lesson 04's era cell (today's code
beside transformers 4.51 in its side environment), lesson 02b's two processes (gloo over local sockets) and
lesson 05's child that dies by a signal. It names them as it starts and prints a line as each ends (the line of
``trl-clinic run``): a room waits minutes on it. The last line says the machine, each of the three, how many eras are
ready, whether the worked solutions are hidden (``make preflight`` hides them unless ``ROOM_SOLUTIONS=shown``), and the
time since ``make preflight`` began; the exit status is 1 when anything failed.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

from trl_clinic.course.eras import era_names, era_state
from trl_clinic.course.results import load_metrics
from trl_clinic.course.workbook import LessonResult, default_jobs, find_lessons, run_lessons, said, select

# what each lesson is here to prove, in the line's words
PARTS = {
    "04": "04 era cell",
    "02b": "02b two processes",
    "05": "05 crashing child",
}


def verdict(key: str, result: LessonResult, out: Path) -> str:
    """ "ok", or why not in a few words: the lesson's status, or (04) an era that did not run."""
    if result.status != "passed":
        return f"{result.status}: {(result.error or ', '.join(result.failed or []))[:120]}"
    if key == "04":
        eras = load_metrics(out / result.lesson)["eras"]
        missing = [record["era"] for record in eras if record["status"] != "finished"]
        if not eras or missing:
            return f"era not run ({', '.join(missing) or 'none recorded'})"
    return "ok"


def machine() -> str:
    import torch

    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30 if hasattr(os, "sysconf") else 0
    return (
        f"{platform.system()} {platform.machine()} | CPython {platform.python_version()} | torch {torch.__version__}"
        f" | {os.cpu_count()} cores, {memory:.0f} GiB"
    )


def sorted_by_key(results: list[LessonResult]) -> list[LessonResult]:
    """The results in PARTS' order (the runner returns them in the notebooks' order: 02b, 04, 05)."""
    by_key = {result.lesson.split("_", 1)[0]: result for result in results}
    return [by_key[key] for key in PARTS]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trl_clinic.course.preflight", description=__doc__)
    parser.add_argument("--started", type=float, default=None, help="when make preflight began (epoch seconds)")
    parser.add_argument("--out", type=Path, default=Path("outputs") / "preflight")
    parser.add_argument("--notebooks", type=Path, default=Path("notebooks"))
    args = parser.parse_args(argv)
    started, out = args.started or time.time(), args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    chosen = select(find_lessons(args.notebooks), list(PARTS), cores_only=True)
    jobs = min(len(PARTS), default_jobs("cpu"))
    print(f"preflight: lessons {', '.join(PARTS)} on the cpu profile, {jobs} at once; a line as each ends", flush=True)
    results = run_lessons(
        list(chosen.values()), out, {"profile": "cpu", "seed": 0}, jobs=jobs, progress_bar=False, on_done=said
    )
    words = {key: verdict(key, result, out) for key, result in zip(PARTS, sorted_by_key(results))}
    ready = sum(era_state(name)[0] for name in era_names())
    passed = all(word == "ok" for word in words.values()) and ready == len(era_names())
    minutes, seconds = divmod(round(time.time() - started), 60)
    line = " | ".join(
        [
            f"TRL Clinic preflight: {'PASSED' if passed else 'FAILED'}",
            machine(),
            f"eras {ready}/{len(era_names())} ready",
            f"solutions {'shown' if (args.notebooks / 'solutions').is_dir() else 'hidden'}",
            *(f"{PARTS[key]}: {word}" for key, word in words.items()),
            f"{minutes} min {seconds:02d} s",
        ]
    )
    print("\nPaste this line to the facilitator:\n" + line)
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
