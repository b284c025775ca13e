"""Where the course keeps its files: the checkout it runs from, or the clinic's cache folder outside one.

A module of its own, imported by the eras, the run and the reports alike, so that finding the root
pulls in nothing else (no torch, no uv). In a checkout (an editable install, as ``make`` does) the root
is the repository: ``.eras/``, ``notebooks/``, ``docs/gpu-runs/``. Installed from a wheel (``pip install
"trl-clinic[course]"``, a hosted notebook) there is no repository: the cache folder stands in, and the
eras build there on first use. ``TRL_CLINIC_ROOT`` overrides the root, as the eras' tests do with a fake
checkout; ``TRL_CLINIC_CACHE`` moves the cache.
"""

from __future__ import annotations

import os
from pathlib import Path

ROOT_ENV = "TRL_CLINIC_ROOT"
CACHE_ENV = "TRL_CLINIC_CACHE"


def cache_dir() -> Path:
    """The clinic's cache: the lessons' tokenizer, SmolLM2's weights, and the eras outside a checkout."""
    return Path(os.environ.get(CACHE_ENV, Path.home() / ".cache" / "trl_clinic"))


def checkout() -> Path | None:
    """The repository this package runs from (``src/trl_clinic/course/paths.py`` inside it), or None when the
    package was installed from a wheel, where the same three parents lead into site-packages' parents."""
    root = Path(__file__).resolve().parents[3]
    return root if (root / "pyproject.toml").is_file() and (root / "src" / "trl_clinic").is_dir() else None


def repo_root() -> Path:
    """``$TRL_CLINIC_ROOT``, else the checkout, else (a wheel install) the cache folder."""
    override = os.environ.get(ROOT_ENV)
    if override:
        return Path(override).resolve()
    return checkout() or cache_dir()
