"""Checking a notebook's papermill parameters and turning them into the run's context.

Papermill injects whatever the caller passes, so a typo must fail loudly here, in the notebook's
second cell, rather than produce a silently different run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from trl_clinic.profiles import Profile, resolve_profile
from trl_clinic.runtime import (
    detect_device,
    device_report,
    no_activation_checkpointing,
    precision_flags,
    quiet_progress_bars,
    seed_everything,
    set_threads,
    versions,
)


@dataclass(frozen=True)
class Run:
    """What every cell after the parameters needs: the profile, the device, the seed, where to write."""

    profile: Profile
    device: torch.device
    seed: int
    output_dir: Path
    versions: dict[str, str] = field(default_factory=dict)

    @property
    def on_gpu(self) -> bool:
        return self.device.type == "cuda"

    def trainer_kwargs(self, name: str, logging: bool = True) -> dict[str, object]:
        """Arguments every lesson's TRL config shares; ``name`` separates the runs' folders.

        What a lesson is about is never in here: each notebook passes those flags itself, visibly.
        ``logging=False`` is for probe runs of a step or two whose logs nobody reads.
        """
        return {
            "output_dir": str(self.output_dir / "runs" / name),
            "seed": self.seed,
            "report_to": "none",
            "save_strategy": "no",
            **({"logging_steps": 1} if logging else {"logging_strategy": "no"}),
            "disable_tqdm": True,
            "dataloader_num_workers": 0,
            # TRL turns it on by default; it only slows the small models used here.
            **no_activation_checkpointing(),
            **precision_flags(self.device),
        }

    def describe(self) -> str:
        lines = [f"profile: {self.profile.name} (model size {self.profile.model_size})", f"seed: {self.seed}"]
        lines += [f"{key}: {value}" for key, value in self.versions.items()]
        lines += [f"{key}: {value}" for key, value in device_report(self.device).items()]
        lines.append(f"output_dir: {self.output_dir}")
        return "\n".join(lines)


def start_run(profile: object, seed: object, output_dir: object) -> Run:
    """Validate the parameters, create ``output_dir``, set threads and seeds."""
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed must be an integer, got {seed!r} ({type(seed).__name__})")
    if not isinstance(output_dir, (str, Path)) or not str(output_dir):
        raise TypeError(f"output_dir must be a path, got {output_dir!r} ({type(output_dir).__name__})")
    device = detect_device()
    chosen = resolve_profile(profile, cuda_available=device.type == "cuda")
    out = Path(output_dir).expanduser().resolve()
    if not out.parent.is_dir():
        raise FileNotFoundError(f"output_dir's parent folder does not exist: {out.parent}")
    out.mkdir(exist_ok=True)
    set_threads(chosen.torch_threads)
    seed_everything(seed)
    quiet_progress_bars()
    return Run(profile=chosen, device=device, seed=seed, output_dir=out, versions=versions())
