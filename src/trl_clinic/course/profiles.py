"""Choosing a profile: the learner's ``profile`` parameter turned into "cpu" or "gpu".

What each profile means (device, precision, attention, sizes) is data in ``lessons.yaml``; this
module only decides which one applies, without importing torch.
"""

from __future__ import annotations

from trl_clinic.course.lessons import PROFILE_NAMES


def resolve_profile(name: object, cuda_available: bool) -> str:
    """"cpu" or "gpu" for the parameter ``name`` ("auto", "cpu" or "gpu").

    "cpu" is the CPU in fp32 even where CUDA is present. An explicit "gpu" on a machine without
    CUDA is an error rather than a slow CPU run of the big configuration: the learner asked for
    something this machine cannot give.
    """
    if not isinstance(name, str):
        raise TypeError(f"profile must be a string, one of {PROFILE_NAMES}; got {name!r} ({type(name).__name__})")
    if name not in PROFILE_NAMES:
        raise ValueError(f"unknown profile {name!r}: choose one of {', '.join(PROFILE_NAMES)}")
    if name == "auto":
        return "gpu" if cuda_available else "cpu"
    if name == "gpu" and not cuda_available:
        raise ValueError("profile 'gpu' needs a CUDA device and torch sees none: use profile 'cpu' or 'auto'")
    return name
