"""Checking a notebook's papermill parameters and turning them into the run's context.

Papermill injects whatever the caller passes, so a typo must fail loudly here, in the notebook's
second cell, rather than produce a silently different run. Everything about the run's shape comes
from the profile (the lesson's ``lesson.yaml``), so a notebook never asks which device it is on.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from trl_clinic.course.lessons import find_lesson, profile_settings
from trl_clinic.course.profiles import resolve_profile
from trl_clinic.course.run import Run, prepare
from trl_clinic.course.runtime import best_attention, bf16_supported, versions

OUTPUTS = "outputs"


def default_output_dir(notebook: str, start: Path | None = None) -> Path:
    """``outputs/<notebook>`` at the repository root, wherever the kernel started (JupyterLab starts it
    in ``notebooks/``, papermill and scripts often at the root); the current folder outside a checkout."""
    here = (start or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        if (folder / "notebooks" / f"{notebook}.ipynb").exists():
            return folder / OUTPUTS / Path(notebook).name
    return here / OUTPUTS / Path(notebook).name


def start_run(lesson: str, profile: object, seed: object, output_dir: object = None) -> Run:
    """Validate the parameters, resolve the profile on this machine, create ``output_dir``, set threads
    and seeds. ``output_dir=None`` means the repository's ``outputs/<notebook>``, created as needed."""
    entry = find_lesson(lesson)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed must be an integer, got {seed!r} ({type(seed).__name__})")
    name = resolve_profile(profile, cuda_available=torch.cuda.is_available())
    if output_dir is None:
        out = default_output_dir(entry.notebook)
        out.mkdir(parents=True, exist_ok=True)
    elif not isinstance(output_dir, (str, Path)) or not str(output_dir):
        raise TypeError(f"output_dir must be a path or None, got {output_dir!r} ({type(output_dir).__name__})")
    else:
        out = Path(output_dir).expanduser().resolve()
        if not out.parent.is_dir():
            raise FileNotFoundError(f"output_dir's parent folder does not exist: {out.parent}")
        out.mkdir(exist_ok=True)
    if not os.access(out, os.W_OK):
        raise PermissionError(f"output_dir is not writable: {out}")
    settings = profile_settings(name)
    device = torch.device(settings.device)
    precision = settings.precision if settings.precision != "bf16" or bf16_supported(device) else "fp32"
    attention = best_attention(device) if settings.attention == "best" else settings.attention
    run = Run(
        lesson=entry.key,
        profile=name,
        device=device,
        precision=precision,
        attention=attention,
        sizes=entry.sizes(name),
        seed=seed,
        output_dir=out,
        versions=versions(),
    )
    prepare(run)
    return run
