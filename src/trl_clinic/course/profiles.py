"""Choosing a profile: the learner's ``profile`` parameter turned into "cpu" or "gpu".

What each profile means (device, precision, attention, sizes) is data in ``lessons/profiles.yaml`` and each
lesson's ``lesson.yaml``; this module only decides which one applies, without importing torch.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from trl_clinic.course.lessons import PROFILE_NAMES

GPU_RUNS = Path("docs") / "gpu-runs"  # one JSON record per real GPU run of the workbook, committed
# The room's setting: what "auto" (every notebook's default) means on this machine, for every notebook at once,
# as a facilitator sets it for a shared GPU box (TRL_CLINIC_PROFILE=cpu). A notebook's explicit "cpu" or "gpu" wins.
PROFILE_ENV = "TRL_CLINIC_PROFILE"


def resolve_profile(name: object, cuda_available: bool) -> str:
    """ "cpu" or "gpu" for the parameter ``name`` ("auto", "cpu" or "gpu").

    "auto" is ``$TRL_CLINIC_PROFILE`` where it is set, else "gpu" with CUDA and "cpu" without. "cpu" is the
    CPU in fp32 even where CUDA is present. An explicit "gpu" on a machine without CUDA is an error rather
    than a slow CPU run of the big configuration: the learner asked for something this machine cannot give.
    """
    if not isinstance(name, str):
        raise TypeError(f"profile must be a string, one of {PROFILE_NAMES}; got {name!r} ({type(name).__name__})")
    if name not in PROFILE_NAMES:
        raise ValueError(f"unknown profile {name!r}: choose one of {', '.join(PROFILE_NAMES)}")
    room = os.environ.get(PROFILE_ENV, "")
    if name == "auto" and room:
        if room not in PROFILE_NAMES:
            raise ValueError(f"{PROFILE_ENV}={room!r} is not a profile: set it to one of {', '.join(PROFILE_NAMES)}")
        name = room
    if name == "auto":
        return "gpu" if cuda_available else "cpu"
    if name == "gpu" and not cuda_available:
        raise ValueError("profile 'gpu' needs a CUDA device and torch sees none: use profile 'cpu' or 'auto'")
    return name


def gpu_profile_note(root: Path) -> str:
    """What a learner on a CUDA machine should know about the gpu profile, in one plain line.

    Until a real run of every lesson on a GPU is recorded under ``docs/gpu-runs/`` (a JSON file with
    ``"all_passed": true``, ``"device"`` and ``"date"``), the gpu profile is unverified, and the line says
    how to pick the cpu profile, which is; once one is, it names the run."""
    records = []
    for path in sorted((root / GPU_RUNS).glob("*.json")):
        record = json.loads(path.read_text())
        if record.get("all_passed") is True:
            records.append((path, record))
    if not records:
        return (
            "profile gpu is unverified: no run of every lesson on a real GPU is recorded in docs/gpu-runs/ yet. "
            "For the verified path pass profile='cpu' (trl-clinic run --profile cpu, TRL_CLINIC_PROFILE=cpu for "
            'every notebook, or profile = "cpu" in the notebook\'s first cell).'
        )
    path, record = records[-1]
    return f"profile gpu: every lesson passed on {record['device']} on {record['date']} ({GPU_RUNS / path.name})."
