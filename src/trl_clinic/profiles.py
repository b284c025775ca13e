"""Run profiles: how big a lesson's models and runs are.

A lesson reads its sizes from the profile instead of hard-coding them, so the same notebook runs in a
few minutes on a 2-core laptop ("cpu") and does real work on a GPU ("gpu").
"""

from __future__ import annotations

from dataclasses import dataclass

PROFILE_NAMES = ("auto", "cpu", "gpu")


@dataclass(frozen=True)
class Profile:
    name: str
    model_size: str  # a key of trl_clinic.models.MODEL_SIZES
    train_steps: int  # optimizer steps of a lesson's training curve
    n_train: int  # samples in a lesson's training set
    n_eval: int  # samples in a lesson's held-out set
    torch_threads: int | None  # None: leave torch's default


PROFILES = {
    # One thread: on a loaded 2-core machine it was faster than two for tiny models.
    "cpu": Profile("cpu", model_size="tiny", train_steps=40, n_train=512, n_eval=64, torch_threads=1),
    "gpu": Profile("gpu", model_size="small", train_steps=200, n_train=4096, n_eval=256, torch_threads=None),
}


def resolve_profile(name: object, cuda_available: bool) -> Profile:
    """Turn a notebook's ``profile`` parameter into a Profile.

    An explicit "gpu" on a machine without CUDA is an error rather than a slow CPU run of the big
    configuration: the learner asked for something this machine cannot give.
    """
    if not isinstance(name, str):
        raise TypeError(f"profile must be a string, one of {PROFILE_NAMES}; got {name!r} ({type(name).__name__})")
    if name not in PROFILE_NAMES:
        raise ValueError(f"unknown profile {name!r}: choose one of {', '.join(PROFILE_NAMES)}")
    if name == "auto":
        name = "gpu" if cuda_available else "cpu"
    if name == "gpu" and not cuda_available:
        raise ValueError("profile 'gpu' needs a CUDA device and torch sees none: use profile 'cpu' or 'auto'")
    return PROFILES[name]
