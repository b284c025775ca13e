"""The resolved run: what every cell after a notebook's parameters needs, and the process set up for it.

``Run`` is a plain record (the lesson's sizes, device, precision, attention, seed, folder). It lives apart
from ``parameters.start_run``, which resolves it from a notebook's parameters, because a child process
(``trl_clinic.course.child``) rebuilds it from the parent's spec (``Run.from_spec``) and must not resolve
the profile again. ``prepare`` sets up the process the same way in both: offline, threads, seeds, quiet
libraries, the imports frozen out of the garbage collector's walk.
"""

from __future__ import annotations

import hashlib
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch

from trl_clinic.course import OFFLINE
from trl_clinic.course.lessons import Sizes, profile_settings
from trl_clinic.course.paths import repo_root
from trl_clinic.course.profiles import gpu_profile_note
from trl_clinic.course.runtime import (
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
        """One line a learner reads at the top of a lesson (under 120 characters for every lesson's default folder):
        the lesson, its profile (precision, attention kernel), seed and output folder. The
        environment (every library's version, the device, the sizes) is kept in ``metrics.json`` and the report,
        not on the screen. On the gpu profile a second line says whether that profile was verified on a GPU."""
        where = self.output_dir
        root = repo_root()
        if where.is_absolute() and where.is_relative_to(root):
            where = where.relative_to(root)  # the folder as the learner sees it in the file browser
        line = (
            f"lesson {self.lesson}: {self.profile} profile ({self.precision}, {self.attention}), "
            f"seed {self.seed}; outputs in {where}"
        )
        return line if self.profile != "gpu" else f"{line}\n{gpu_profile_note(repo_root())}"

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
        prepare(run)
        return run


def go_offline() -> None:
    """Offline, even when the notebook imported transformers before the course: huggingface_hub read the
    variable at its own import (constants.py, ``HF_HUB_OFFLINE``) and ``is_offline_mode()`` returns that."""
    os.environ.update(OFFLINE)
    hub = sys.modules.get("huggingface_hub.constants")
    if hub is not None:
        hub.HF_HUB_OFFLINE = True


def prepare(run: Run) -> None:
    """Set up this process for ``run``: what ``start_run`` does in a notebook and a child does from its spec."""
    go_offline()
    set_threads(profile_settings(run.profile).torch_threads)
    seed_everything(run.seed)
    quiet_library_noise()
    freeze_what_is_loaded()
