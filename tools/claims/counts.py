"""The scripts behind counts in prose: each function takes a reader of one wheel's files and returns the number
the sentence states. The register names the function (`counts: - script: NAME`); `check` compares."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable

# a wheel's file names, and a reader of one file's text
Files = Iterable[str]
Reader = Callable[[str], str | None]

_DECLARES_NO_LOSS_KWARGS = re.compile(r"^\s+accepts_loss_kwargs\s*=\s*False\b", re.MULTILINE)
_CLASS = re.compile(r"^class (\w+)\(", re.MULTILINE)


def _classes_declaring_no_loss_kwargs(files: Files, read: Reader) -> list[str]:
    """Names of the classes whose body sets `accepts_loss_kwargs = False` (the Trainer then divides the loss by
    the accumulation steps itself), in every transformers/models/*/modeling_*.py."""
    found = []
    for path in sorted(files):
        if not re.match(r"transformers/models/[^/]+/modeling_[^/]+\.py$", path):
            continue
        text = read(path) or ""
        for match in _DECLARES_NO_LOSS_KWARGS.finditer(text):
            owners = [c for c in _CLASS.finditer(text) if c.start() < match.start()]
            if owners:
                found.append(owners[-1].group(1))
    return found


def accepts_loss_kwargs_false(files: Files, read: Reader) -> int:
    """How many model classes of transformers declare `accepts_loss_kwargs = False`."""
    return len(_classes_declaring_no_loss_kwargs(files, read))


def accepts_loss_kwargs_false_conditional_generation(files: Files, read: Reader) -> int:
    """How many of those are `*ForConditionalGeneration` classes."""
    return sum(n.endswith("ForConditionalGeneration") for n in _classes_declaring_no_loss_kwargs(files, read))


SCRIPTS: dict[str, Callable[[Files, Reader], int]] = {
    "accepts_loss_kwargs_false": accepts_loss_kwargs_false,
    "accepts_loss_kwargs_false_conditional_generation": accepts_loss_kwargs_false_conditional_generation,
}
