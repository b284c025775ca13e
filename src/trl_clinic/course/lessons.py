"""The lesson table (``lessons.yaml``): what each profile means and what each lesson runs under it.

Declared once, as data, so that a reader, ``trl-clinic list`` and the notebooks all see the same
shape of a run without executing anything. Importing this module does not import torch: the
runner lists lessons instantly.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path

import yaml

PROFILE_NAMES = ("auto", "cpu", "gpu")
CONCRETE_PROFILES = ("cpu", "gpu")
_PROFILE_KEYS = {"device", "precision", "attention", "torch_threads"}
DEEPER = "-deeper"  # a deep dive's key is its core's key and this: "01-deeper"


class Sizes(dict):
    """A lesson's numbers for one profile, read as attributes (``run.sizes.grpo_steps``).

    A misspelt name is an error that lists the known ones, never a silent default.
    """

    def __getattr__(self, name: str) -> object:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(f"no size {name!r} in this lesson's profile; known: {', '.join(self)}") from None


@dataclass(frozen=True)
class ProfileSettings:
    name: str
    device: str  # "cpu" or "cuda"
    precision: str  # "fp32" or "bf16"
    attention: str  # an attn_implementation, or "best" (resolved on the machine)
    torch_threads: int | None


@dataclass(frozen=True)
class Lesson:
    key: str  # "01", "02b", ... for a core; "01-deeper" for its deep dive
    notebook: str  # path under notebooks/ without .ipynb: "01_padding_free_high_loss", "deeper/01_..._deeper"
    title: str
    report: str
    accelerators: tuple[str, ...]
    seconds: dict[str, float | None]  # measured duration per profile, None where not measured yet
    shapes: dict[str, Sizes]  # profile name -> sizes
    # a core's figure for the presenter's deck (trl_clinic.course.deck): the mechanism's where the lesson draws
    # one, else its one figure; a file under docs/executed/figures/<notebook>/
    figure: str | None = None

    def sizes(self, profile: str) -> Sizes:
        return self.shapes[profile]

    @property
    def stem(self) -> str:
        """The notebook's file name without .ipynb: the name of its output folder."""
        return Path(self.notebook).name

    @property
    def is_core(self) -> bool:
        """A core tells one failure's story; its deep dive (``notebooks/deeper/``) keeps the evidence."""
        return DEEPER not in self.key


def _read() -> dict:
    return yaml.safe_load(resources.files("trl_clinic.course").joinpath("lessons.yaml").read_text())


def _check(table: dict) -> None:
    """The table is edited by hand: catch a missing profile or a size declared for one profile only."""
    for name in CONCRETE_PROFILES:
        settings = table["profiles"].get(name) or {}
        if set(settings) != _PROFILE_KEYS:
            raise ValueError(f"lessons.yaml: profile {name!r} must declare exactly {sorted(_PROFILE_KEYS)}")
    for key, entry in table["lessons"].items():
        shapes = [entry.get(name) for name in CONCRETE_PROFILES]
        if not all(shapes):
            raise ValueError(f"lessons.yaml: lesson {key} must declare every profile: {', '.join(CONCRETE_PROFILES)}")
        if len({frozenset(shape) for shape in shapes}) != 1:
            raise ValueError(
                f"lessons.yaml: lesson {key} declares different sizes per profile: "
                f"{[sorted(shape) for shape in shapes]}"
            )


@cache
def _table() -> dict:
    table = _read()
    _check(table)
    return table


def profile_settings(name: str) -> ProfileSettings:
    return ProfileSettings(name=name, **_table()["profiles"][name])


def lessons() -> dict[str, Lesson]:
    """Every lesson by key, in order."""
    return {
        str(key): Lesson(
            key=str(key),
            notebook=entry["notebook"],
            title=entry["title"],
            report=entry["report"],
            accelerators=tuple(entry["accelerators"]),
            seconds=dict(entry["seconds"]),
            shapes={name: Sizes(entry[name]) for name in CONCRETE_PROFILES},
            figure=entry.get("figure"),
        )
        for key, entry in _table()["lessons"].items()
    }


def find_lesson(name: str) -> Lesson:
    """A lesson by key ("02b") or notebook name; an unknown one is an error that lists the known."""
    table = lessons()
    for lesson in table.values():
        if name in (lesson.key, lesson.notebook) or Path(name).stem in (lesson.key, lesson.stem):
            return lesson
    raise ValueError(f"unknown lesson {name!r}; known: {', '.join(table)}")


def describe_shape(lesson: Lesson, profile: str) -> str:
    """One line per profile for ``trl-clinic list``: how it runs and with which numbers."""
    settings = profile_settings(profile)
    sizes = lesson.sizes(profile)
    threads = "default threads" if settings.torch_threads is None else f"{settings.torch_threads} thread(s)"
    attention = "best FlashAttention, else sdpa" if settings.attention == "best" else settings.attention
    seconds = lesson.seconds.get(profile)
    took = f"about {seconds:.0f} s" if seconds else "time not measured yet"
    numbers = ", ".join(f"{k}={v}" for k, v in sizes.items() if k != "model")
    return (
        f"{profile}: {settings.device}, {settings.precision}, {attention}, {threads}; {took}\n"
        f"      model: {sizes['model']}\n      sizes: {numbers}"
    )
