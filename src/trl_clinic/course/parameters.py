"""Checking a notebook's papermill parameters and turning them into the run's context.

Papermill injects whatever the caller passes, so a typo must fail loudly here, in the notebook's
second cell, rather than produce a silently different run. Everything about the run's shape comes
from the profile (``lessons.yaml``), so a notebook never asks which device it is on.
"""

from __future__ import annotations

import hashlib
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch

from trl_clinic.course import OFFLINE
from trl_clinic.course.eras import repo_root
from trl_clinic.course.lessons import Sizes, find_lesson, profile_settings
from trl_clinic.course.profiles import gpu_profile_note, resolve_profile
from trl_clinic.course.runtime import (
    best_attention,
    bf16_supported,
    cpu_flags,
    device_report,
    freeze_what_is_loaded,
    no_activation_checkpointing,
    precision_flags,
    quiet_library_noise,
    seed_everything,
    set_threads,
    show_progress,
    versions,
)

OUTPUTS = "outputs"


@dataclass(frozen=True)
class Run:
    """What every cell after the parameters needs: the lesson's sizes, device, precision, seed, folder."""

    lesson: str
    profile: str  # "cpu" or "gpu"
    device: torch.device
    precision: str  # "fp32" or "bf16": what the trainers' autocast uses
    attention: str  # the attn_implementation this profile resolved to on this machine
    sizes: Sizes
    seed: int
    output_dir: Path
    versions: dict[str, str] = field(default_factory=dict)

    def subseed(self, name: str) -> int:
        """A seed for one part of the lesson ("eval data", "warm-up"), derived from the run's seed and
        the part's name, so parts never share a draw by accident and no offsets are picked by hand."""
        return int.from_bytes(hashlib.sha256(f"{self.seed}/{name}".encode()).digest()[:4], "little")

    def trainer_kwargs(self, name: str, logging: bool = True, progress: bool = True) -> dict[str, object]:
        """Arguments every lesson's TRL config shares; ``name`` separates the runs' folders.

        What a lesson is about is never in here: each notebook passes those flags itself, visibly.
        ``logging=False`` is for probe runs of a step or two whose logs nobody reads; ``progress=False``
        for runs inside a sweep that has its own bar.
        """
        return {
            "output_dir": str(self.output_dir / "runs" / name),
            "seed": self.seed,
            "report_to": "none",
            "save_strategy": "no",
            **({"logging_steps": 1} if logging else {"logging_strategy": "no"}),
            "disable_tqdm": not (progress and show_progress()),
            "dataloader_num_workers": 0,
            # TRL turns it on by default; it only slows the small models used here.
            **no_activation_checkpointing(),
            **precision_flags(self.device, self.precision),
        }

    def cpu_flags(self) -> dict[str, bool]:
        """``use_cpu=True`` on the cpu profile, for a config that sets its own precision."""
        return cpu_flags(self.device)

    def device_report(self) -> dict[str, object]:
        return {
            "profile": self.profile,
            "precision": self.precision,
            "attention": self.attention,
            **device_report(self.device),
        }

    def describe(self) -> str:
        lines = [f"lesson {self.lesson}, profile {self.profile}, seed {self.seed}"]
        lines += [f"{key}: {value}" for key, value in self.versions.items()]
        lines += [f"{key}: {value}" for key, value in self.device_report().items()]
        lines.append("sizes: " + ", ".join(f"{key}={value}" for key, value in self.sizes.items()))
        lines.append(f"output_dir: {self.output_dir}")
        if self.profile == "gpu":
            lines.append(gpu_profile_note(repo_root()))
        return "\n".join(lines)

    def to_spec(self) -> dict[str, object]:
        """The resolved run, for a child process: it must not resolve the profile again."""
        return {
            "lesson": self.lesson,
            "profile": self.profile,
            "device": str(self.device),
            "precision": self.precision,
            "attention": self.attention,
            "sizes": dict(self.sizes),
            "seed": self.seed,
            "output_dir": str(self.output_dir),
        }

    @classmethod
    def from_spec(cls, spec: dict) -> Run:
        run = cls(
            lesson=spec["lesson"],
            profile=spec["profile"],
            device=torch.device(spec["device"]),
            precision=spec["precision"],
            attention=spec["attention"],
            sizes=Sizes(spec["sizes"]),
            seed=spec["seed"],
            output_dir=Path(spec["output_dir"]),
            versions=versions(),
        )
        _prepare(run)
        return run


def default_output_dir(notebook: str, start: Path | None = None) -> Path:
    """``outputs/<notebook>`` at the repository root, wherever the kernel started (JupyterLab starts it
    in ``notebooks/``, papermill and scripts often at the root); the current folder outside a checkout."""
    here = (start or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        if (folder / "notebooks" / f"{notebook}.ipynb").exists():
            return folder / OUTPUTS / Path(notebook).name
    return here / OUTPUTS / Path(notebook).name


def go_offline() -> None:
    """Offline, even when the notebook imported transformers before the course: huggingface_hub read the
    variable at its own import (constants.py, ``HF_HUB_OFFLINE``) and ``is_offline_mode()`` returns that."""
    os.environ.update(OFFLINE)
    hub = sys.modules.get("huggingface_hub.constants")
    if hub is not None:
        hub.HF_HUB_OFFLINE = True


def _prepare(run: Run) -> None:
    go_offline()
    set_threads(profile_settings(run.profile).torch_threads)
    seed_everything(run.seed)
    quiet_library_noise()
    freeze_what_is_loaded()


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
    _prepare(run)
    return run
