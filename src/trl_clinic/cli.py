"""The ``trl-clinic`` command: list, run and report the workbook's lessons, and check the environment.

``make workbook`` calls ``run`` then ``report``. ``checkup`` is the library's and needs only its dependencies:
the course's commands import the course when they run (importing it sets offline mode, which a user's
``trl-clinic checkup`` on a hub model must not get).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

from trl_clinic.bisect.command import add_parser as add_bisect  # stdlib and yaml: torch loads in the side envs
from trl_clinic.checkup.command import add_parser as add_checkup  # stdlib only: torch loads when it runs
from trl_clinic.watch.command import add_parser as add_watch  # torch loads when it runs


class _Profiles:
    """The course's profile names for ``--profile``'s choices, read from the course only when argparse checks or
    prints them (never for ``checkup``)."""

    def _names(self) -> tuple[str, ...]:
        from trl_clinic.course.lessons import PROFILE_NAMES

        return tuple(PROFILE_NAMES)

    def __contains__(self, value: object) -> bool:
        return value in self._names()

    def __iter__(self):
        return iter(self._names())


def _writable_out(value: Path) -> Path:
    """The output folder, created; a ValueError (one line, exit code 2) for any reason it cannot be."""
    out = Path(value).expanduser().resolve()
    if not out.parent.is_dir():
        raise ValueError(f"the parent folder of {out} does not exist")
    if out.exists() and not out.is_dir():
        raise ValueError(f"{out} is a file, not a folder")
    probe = out / ".write-test"
    try:
        out.mkdir(exist_ok=True)
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise ValueError(f"cannot write to {out}: {exc.strerror or exc}") from exc
    return out


def _run(args: argparse.Namespace) -> int:
    from trl_clinic.course.workbook import (
        check_parameters,
        default_jobs,
        find_lessons,
        run_lessons,
        said,
        select,
        write_summary,
    )

    lessons = select(find_lessons(args.notebooks), args.lessons, cores_only=args.cores)
    args.out = _writable_out(args.out)
    parameters: dict[str, object] = {"profile": args.profile, "seed": args.seed}
    # papermill's own -p convention: values are read as YAML, so 3 is an int and "3" stays a string
    parameters.update({name: yaml.safe_load(value) for name, value in args.parameter})
    for path in lessons.values():
        check_parameters(path, parameters)
    jobs = min(args.jobs or default_jobs(args.profile), len(lessons))
    print(f"== {', '.join(lessons)}" + (f" ({jobs} at once, one process each)" if jobs > 1 else ""), flush=True)
    results = run_lessons(
        list(lessons.values()), args.out, parameters, jobs=jobs, progress_bar=not args.no_progress, on_done=said
    )
    write_summary(args.out, results, {**parameters, "jobs": jobs})
    print(f"wrote {args.out}", flush=True)
    return 0 if all(r.status == "passed" for r in results) else 1


def _list(args: argparse.Namespace) -> int:
    """Each lesson, its parameters, and what every profile will run (from each lesson's lesson.yaml)."""
    from trl_clinic.course.lessons import CONCRETE_PROFILES, describe_shape, find_lesson
    from trl_clinic.course.workbook import find_lessons, notebook_parameters

    for name, path in find_lessons(args.notebooks).items():
        parameters = ", ".join(f"{p}={info['default']}" for p, info in notebook_parameters(path).items())
        lesson = find_lesson(name)
        print(
            f"{name}: {lesson.title}\n  report: {lesson.report}\n  runs on: {', '.join(lesson.accelerators)}"
            f"\n  parameters: {parameters}"
        )
        for profile in CONCRETE_PROFILES:
            print(f"  {describe_shape(lesson, profile)}")
    return 0


def _report(args: argparse.Namespace) -> int:
    from trl_clinic.course.report import build_report

    print(f"wrote {build_report(args.out)}")
    return 0


def _doctor(args: argparse.Namespace) -> int:
    from trl_clinic.course.doctor import doctor

    print(doctor())
    return 0


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="trl-clinic", description=__doc__)
    commands = top.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="execute lessons with papermill into one output folder")
    run.add_argument("lessons", nargs="*", help="lesson numbers or names (default: all)")
    run.add_argument(
        "--profile",
        choices=_Profiles(),
        default="auto",
        metavar="PROFILE",
        help="a profile of profiles.yaml: auto (gpu when CUDA is present), cpu or gpu",
    )
    run.add_argument("--seed", type=int, default=0)
    run.add_argument("--out", type=Path, default=Path("workbook-output"))
    run.add_argument(
        "-p",
        "--parameter",
        nargs=2,
        action="append",
        default=[],
        metavar=("NAME", "VALUE"),
        help="another notebook parameter, as papermill's -p",
    )
    run.add_argument("--notebooks", default="notebooks", help="folder holding the lesson notebooks")
    run.add_argument("--no-progress", action="store_true", help="no per-cell progress bar")
    run.add_argument("--cores", action="store_true", help="the cores only, without their deep dives (a workshop)")
    run.add_argument(
        "--jobs",
        type=int,
        default=0,
        help="lessons at once, each in its own process (default: one per core on the cpu profile, "
        "where each lesson uses one torch thread; one at a time on a GPU)",
    )
    run.set_defaults(handler=_run)
    listing = commands.add_parser("list", help="the lessons, their parameters, and what each profile runs")
    listing.add_argument("--notebooks", default="notebooks", help="folder holding the lesson notebooks")
    listing.set_defaults(handler=_list)
    report = commands.add_parser("report", help="one self-contained HTML page for a run's output folder")
    report.add_argument("out", type=Path, help="the folder `trl-clinic run --out` wrote")
    report.set_defaults(handler=_report)
    doctor = commands.add_parser("doctor", help="versions, device, attention kernels and the traps that apply here")
    doctor.set_defaults(handler=_doctor)
    add_checkup(commands)
    add_watch(commands)
    add_bisect(commands)
    return top


def main(argv: list[str] | None = None) -> int:
    """Run the command and return its exit code; a process of several launched together (``torchrun``,
    ``accelerate launch``) ends here instead, every process with the same code at the same moment
    (``probes.processes.leave_together``: a process that returned alone was killed by the launcher)."""
    args = parser().parse_args(argv)
    try:
        code = args.handler(args)
    except (ValueError, FileNotFoundError) as exc:
        print(f"trl-clinic: {exc}", file=sys.stderr)
        code = 2
    if launched():
        from trl_clinic.probes.processes import leave_together

        leave_together(code)
    return code


def launched() -> bool:
    """Whether ``torch.distributed`` joins this process to a group (a launch of several, or of one by torchrun);
    never imports torch (a command that did not load it was not launched)."""
    distributed = sys.modules.get("torch.distributed")
    return bool(distributed is not None and distributed.is_available() and distributed.is_initialized())


if __name__ == "__main__":
    sys.exit(main())
