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
_MODELING = re.compile(r"transformers/models/([^/]+)/modeling_[^/]+\.py$")
_RIGHT_PADDING_GUARD = "You are attempting to perform batched generation with padding_side='right'"


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


def right_padding_guard_families(files: Files, read: Reader) -> int:
    """How many model families (folders of transformers/models/) raise the FlashAttention-2 right-padding
    `ValueError` somewhere in their modeling files: "no family has the check" is this count at 0, and a list of
    families in prose is as long as this count."""
    families = set()
    for path in files:
        match = _MODELING.match(path)
        if match and match.group(1) not in families and _RIGHT_PADDING_GUARD in (read(path) or ""):
            families.add(match.group(1))
    return len(families)


SCRIPTS: dict[str, Callable[[Files, Reader], int]] = {
    "accepts_loss_kwargs_false": accepts_loss_kwargs_false,
    "accepts_loss_kwargs_false_conditional_generation": accepts_loss_kwargs_false_conditional_generation,
    "right_padding_guard_families": right_padding_guard_families,
}
