"""Running a lesson's era script (``then.py`` in its folder) in an era and reading its JSON result.

``run_in_era(name, script, spec, workdir)`` runs the script with the era's interpreter, through
``trl_clinic.course.child.run_child``, offline and without GPUs (``spec.CHILD_ENV``). An era that is not
built gives ``status="skipped"`` and a message that says to run ``make eras``; a script that fails gives
``status="failed"``; nothing here raises into the notebook. An era still being built in the background
(``make lab``, ``make test``) is waited for (``build.wait_for_builds``). Outside a checkout (a wheel
install: no ``make eras``) the era is built here on first use, from PyPI; where that fails (no network) the
era is skipped with what the build said, and the lesson reports that part as not run.
"""

from __future__ import annotations

import json
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

from trl_clinic.course.child import run_child
from trl_clinic.course.eras.build import EraBuildError, build_era, wait_for_builds
from trl_clinic.course.eras.spec import CHILD_ENV, builds_on_demand, era_dir, era_state, era_versions, python_in
from trl_clinic.course.lessons import THEN, lessons
from trl_clinic.course.paths import repo_root


@dataclass
class EraRun:
    """What running a script in an era gave: ``finished`` (``result`` holds its JSON), ``skipped``
    (the era is not built: nothing ran) or ``failed`` (the script or its environment broke)."""

    era: str
    script: str
    status: str
    message: str
    result: dict | None = None
    versions: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0
    stderr: str = ""

    @property
    def finished(self) -> bool:
        return self.status == "finished"

    @property
    def skipped(self) -> bool:
        return self.status == "skipped"

    def describe(self) -> str:
        versions = ", ".join(f"{k} {v}" for k, v in self.versions.items() if k != "torch")
        if self.finished:
            said = f"era {self.era}: {self.script} finished in {self.seconds:.1f} s ({versions})"
            return textwrap.fill(said, 120, subsequent_indent="    ", break_long_words=False)  # a notebook's width
        return self.message  # it starts with the status: "skipped: ..." or "failed: ..."

    def to_metrics(self) -> dict:
        """A JSON-safe record for ``metrics.json``: the era's results come from the real old code."""
        return {
            "era": self.era,
            "script": self.script,
            "status": self.status,
            "message": self.message,
            "kind": "measured",
            "versions": self.versions,
            "seconds": round(self.seconds, 2),
            "result": self.result,
        }


def then_script(script: str | Path) -> Path:
    """A lesson's era script by name, ``"then_<key>"`` (``"then_02"``: ``then.py`` in lesson 02's folder), or any
    path to a .py file."""
    path = Path(script)
    if path.suffix == ".py":
        return path
    lesson = lessons().get(path.name.removeprefix("then_")) if path.name.startswith("then_") else None
    return lesson.folder / THEN if lesson else path.with_suffix(".py")


def build_on_first_use(era: str) -> tuple[bool, str]:
    """Build the era now, in the cache folder, and say how that went (``era_state``'s pair)."""
    print(f"era {era}: not built yet; building it in {era_dir(era)} (first use: a few minutes, from PyPI)", flush=True)
    try:
        build_era(era)
    except EraBuildError as error:
        return False, f"era {era} could not be built here: {error}"
    return era_state(era)


def run_in_era(
    era: str, script: str | Path, spec: dict, workdir: str | Path, *, timeout: float = 600, root: Path | None = None
) -> EraRun:
    """Run ``script`` with era ``era``'s interpreter as ``script SPEC.json RESULT.json`` and read its result.

    ``spec`` is written to ``workdir/<script>.<era>.spec.json``; the script runs with ``workdir`` as its
    current folder, offline and without GPUs. Never raises: a missing era is ``skipped`` (with the
    message "era X is not installed, run `make eras`"), anything else that goes wrong is ``failed``.
    An era still being built in the background (``make lab``) is waited for, up to ``timeout``.
    """
    path = then_script(script)
    name = Path(script).stem  # then_02, or a path's file name
    try:
        ready, why = era_state(era, root)
        if not ready and wait_for_builds(root or repo_root(), timeout):
            ready, why = era_state(era, root)
        if not ready and builds_on_demand(root) and "not defined" not in why:
            ready, why = build_on_first_use(era)
        versions = era_versions(era, root)
        if not ready:
            return EraRun(era, name, "skipped", f"skipped: {why}", versions=versions)
        if not path.is_file():
            return EraRun(era, name, "failed", f"failed: no era script {path}", versions=versions)
        workdir = Path(workdir).resolve()
        workdir.mkdir(parents=True, exist_ok=True)
        spec_path = workdir / f"{name}.{era}.spec.json"
        result_path = workdir / f"{name}.{era}.result.json"
        result_path.unlink(missing_ok=True)
        spec_path.write_text(json.dumps(spec, indent=1, default=str))  # Paths as strings
        outcome = run_child(
            [str(path), str(spec_path), str(result_path)],
            timeout=timeout,
            cwd=workdir,
            env=CHILD_ENV,
            python=str(python_in(era_dir(era, root))),
        )
        if outcome.crashed:
            return EraRun(
                era,
                name,
                "failed",
                f"failed: {outcome.describe()}",
                versions=versions,
                seconds=outcome.seconds,
                stderr=outcome.stderr,
            )
        if not result_path.is_file():
            return EraRun(
                era,
                name,
                "failed",
                f"failed: {name} exited 0 but wrote no {result_path.name}",
                versions=versions,
                seconds=outcome.seconds,
                stderr=outcome.stderr,
            )
        result = json.loads(result_path.read_text())
        return EraRun(
            era,
            name,
            "finished",
            outcome.describe(),
            result=result,
            versions=versions,
            seconds=outcome.seconds,
            stderr=outcome.stderr,
        )
    except Exception as error:  # the notebook must go on: the era part is then reported as failed
        return EraRun(era, name, "failed", f"failed: {type(error).__name__}: {error}")
