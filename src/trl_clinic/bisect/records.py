"""Running the first-step script (``first_step.py``) in a side environment and reading its record.

The script is standalone (it cannot import ``trl_clinic``), so it runs as a file with the side environment's
interpreter, offline and without GPUs; the spec goes in as JSON and the record comes back as JSON. A script
that fails leaves ``None`` and what it said last.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from pathlib import Path

from trl_clinic.bisect.environments import CHILD_ENV

TRAINER_KINDS = ("sft", "dpo", "reward", "grpo")  # what first_step.py builds (its TRAINERS)

SCRIPT = Path(__file__).with_name("first_step.py")
PACKAGE = Path(__file__).parents[1]  # trl_clinic's folder: the script runs the check-up from it


DATA = ("text", "conversational")  # the data first_step.py trains on (its DATA); conversational: SFT only


def first_step_spec(
    kind: str, recipe: dict, *, seed: int = 0, threads: int = 1, checkup: bool = True, data: str = "text"
) -> dict:
    """What the script reads: the trainer kind, the user's config as a dict, the seed, torch's threads, whether to
    run the check-up first (``record_first_step`` says where it is) and the data (``DATA``; a ValueError, a usage
    error, for conversational data on a trainer other than SFT)."""
    if data not in DATA or (data == "conversational" and kind != "sft"):
        raise ValueError(f"--data {data}: bisect trains on {', '.join(DATA)} data, conversational for sft only")
    return {"kind": kind, "recipe": recipe, "seed": seed, "threads": threads, "checkup": checkup, "data": data}


def checkup_source(folder: Path) -> str:
    """A folder holding only a link named ``trl_clinic`` to this package, for the script's path: the folder that
    holds the package itself may be a site-packages, whose other libraries must not shadow the side
    environment's."""
    source = folder / "source"
    source.mkdir()
    (source / "trl_clinic").symlink_to(PACKAGE, target_is_directory=True)
    return str(source)


def record_first_step(python: Path, spec: dict, *, timeout: float = 900) -> tuple[dict | None, str]:
    """``(record, "")`` from the script run by ``python``, or ``(None, why)`` when it failed."""
    with tempfile.TemporaryDirectory(prefix="trl-clinic-bisect-") as folder:
        spec_path, result_path = Path(folder) / "spec.json", Path(folder) / "record.json"
        source = checkup_source(Path(folder)) if spec.get("checkup") else None
        spec_path.write_text(json.dumps(spec | {"checkup_source": source}))
        try:
            done = subprocess.run(
                [str(python), str(SCRIPT), str(spec_path), str(result_path)],
                capture_output=True,
                text=True,
                timeout=timeout,
                cwd=folder,
                env={**os.environ, **CHILD_ENV},
            )
        except subprocess.TimeoutExpired:
            return None, f"the first step ran past {timeout:.0f} s"
        if done.returncode != 0 or not result_path.is_file():
            said = done.stderr.strip().splitlines() or ["(nothing on stderr)"]
            # the exception's own line first (the progress line shows it), then the traceback's end
            return None, f"the first step failed (exit code {done.returncode}): {said[-1]}\n" + "\n".join(said[-25:])
        return json.loads(result_path.read_text()), ""
