"""Where the checkout is: the folder that holds ``eras/``, ``.eras/``, ``notebooks/`` and ``docs/gpu-runs/``.

A module of its own, imported by the eras, the run and the reports alike, so that finding the root
pulls in nothing else (no torch, no uv). The course works from a checkout (an editable install, as
``make`` does); ``TRL_CLINIC_ROOT`` overrides the root, as the eras' tests do with a fake checkout.
"""

from __future__ import annotations

import os
from pathlib import Path

ROOT_ENV = "TRL_CLINIC_ROOT"


def repo_root() -> Path:
    """The checkout this module lies in (``src/trl_clinic/course/paths.py``), or ``$TRL_CLINIC_ROOT``."""
    override = os.environ.get(ROOT_ENV)
    return Path(override).resolve() if override else Path(__file__).resolve().parents[3]
