"""The lessons, one folder each: what each profile means (``profiles.yaml``) and what each lesson runs under it.

Everything that belongs to one lesson lives in its folder ``lesson_<key>_<topic>/`` beside this module, and
nothing else does (CONTRIBUTING.md draws it): ``lesson.yaml`` (title, report, measured seconds, sizes per
profile, for the core and its deep dive), the notebooks' text sources (``core.py``, ``deeper.py``,
``solution.py``), its companion (``companion.py``: what the notebook needs and a learner need not read), its
era script and pins (``then.py``, ``eras/NAME.txt``), and what the tests read (``mutations.py``,
``numbers.json``). A lesson is found by its folder: adding one is adding a folder. The folders are package
data, so a wheel install (a hosted notebook) has them too. Importing this module does not import torch: the
runner lists lessons instantly.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import yaml

PROFILE_NAMES = ("auto", "cpu", "gpu")
CONCRETE_PROFILES = ("cpu", "gpu")
_PROFILE_KEYS = {"device", "precision", "attention", "torch_threads"}
DEEPER = "-deeper"  # a deep dive's key is its core's key and this: "01-deeper"
HERE = Path(__file__).resolve().parent
FOLDER = re.compile(r"lesson_([0-9]+[a-z]?)_[a-z0-9_]+")  # lesson_02b_accumulation_ddp: key "02b"
# a core's and its deep dive's text sources in the folder, and the notebooks generated from them
SOURCES = {"core": "core.py", "deeper": "deeper.py"}
SOLUTION = "solution.py"
CARD = "card.md"
THEN = "then.py"  # the era script: run in an era as then_<key> (trl_clinic.course.eras.run_in_era)


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
    folder: Path  # the lesson's folder: lesson_<key>_<topic>/, shared by a core and its deep dive
    # a core's row of the README's table: lesson (a label), symptom, cause, fix, check (markdown); None for a deep dive
    readme: dict[str, str] | None = None
    # a core's figure for the presenter's deck (trl_clinic.course.deck): the mechanism's where the lesson draws
    # one, else its one figure; a file under docs/executed/figures/<notebook>/
    figure: str | None = None
    # the numbers README's row and the docs quote from this notebook's executed copy (docs/executed/, cpu profile,
    # seed 0): each {text, output, in (a doc's path; README.md's row when absent)}; tests/test_quoted_numbers.py
    # finds the text where it is quoted and each of its numbers in that output of the copy
    quotes: tuple[dict, ...] = ()
    # why a core has no deep dive, where its whole story fits the core's shape (None: it has one, or must)
    one_notebook: str | None = None

    def sizes(self, profile: str) -> Sizes:
        return self.shapes[profile]

    @property
    def stem(self) -> str:
        """The notebook's file name without .ipynb: the name of its output folder."""
        return Path(self.notebook).name

    @property
    def source(self) -> Path:
        """The notebook's text source (percent format) in the lesson's folder: what people edit."""
        return self.folder / SOURCES["core" if self.is_core else "deeper"]

    @property
    def solution(self) -> Path | None:
        """A core's worked solutions (``solution.py``), None for a deep dive or a core without exercises."""
        path = self.folder / SOLUTION
        return path if self.is_core and path.is_file() else None

    @property
    def card(self) -> Path:
        """A core's entry of the cheat sheet (``card.md``): docs/cheatsheet.md and the deck are made from it."""
        return self.folder / CARD

    @property
    def is_core(self) -> bool:
        """A core tells one failure's story; its deep dive (``notebooks/deeper/``) keeps the evidence."""
        return DEEPER not in self.key


def folders(root: Path = HERE) -> list[Path]:
    """Every lesson's folder, in key order (``lesson_02_...`` before ``lesson_02b_...``)."""
    found = sorted(path.parent for path in root.glob("lesson_*/lesson.yaml"))
    for path in found:
        if not FOLDER.fullmatch(path.name):
            raise ValueError(f"{path.name}: a lesson's folder is named lesson_<key>_<topic> (lesson_09_my_topic)")
    return found


def _read(root: Path = HERE) -> dict:
    """profiles.yaml, and each folder's lesson.yaml as one table: key -> entry (with its folder)."""
    table = {"profiles": yaml.safe_load((root / "profiles.yaml").read_text())["profiles"], "lessons": {}}
    for folder in folders(root):
        key = FOLDER.fullmatch(folder.name).group(1)
        blocks = yaml.safe_load((folder / "lesson.yaml").read_text())
        if set(blocks) - set(SOURCES) or "core" not in blocks:
            raise ValueError(f"{folder.name}/lesson.yaml: declares core: and, where it has one, deeper:")
        for part, entry in blocks.items():
            table["lessons"][key if part == "core" else key + DEEPER] = {**entry, "folder": folder}
    return table


def _check(table: dict) -> None:
    """The tables are edited by hand: catch a missing profile or a size declared for one profile only."""
    for name in CONCRETE_PROFILES:
        settings = table["profiles"].get(name) or {}
        if set(settings) != _PROFILE_KEYS:
            raise ValueError(f"profiles.yaml: profile {name!r} must declare exactly {sorted(_PROFILE_KEYS)}")
    for key, entry in table["lessons"].items():
        where = f"{entry['folder'].name}/lesson.yaml, lesson {key}"
        shapes = [entry.get(name) for name in CONCRETE_PROFILES]
        if not all(shapes):
            raise ValueError(f"{where} must declare every profile: {', '.join(CONCRETE_PROFILES)}")
        if len({frozenset(shape) for shape in shapes}) != 1:
            raise ValueError(f"{where} declares different sizes per profile: {[sorted(shape) for shape in shapes]}")
        if not (entry["folder"] / SOURCES["core" if DEEPER not in key else "deeper"]).is_file():
            raise ValueError(f"{where}: no {SOURCES['core' if DEEPER not in key else 'deeper']} in its folder")
    notebooks = [entry["notebook"] for entry in table["lessons"].values()]
    if len(set(notebooks)) != len(notebooks):
        raise ValueError(
            f"two lessons name the same notebook: {sorted(n for n in notebooks if notebooks.count(n) > 1)}"
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
            folder=entry["folder"],
            readme=entry.get("readme"),
            figure=entry.get("figure"),
            quotes=tuple(entry.get("quotes", ())),
            one_notebook=entry.get("one_notebook"),
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


def text_sources() -> dict[Path, str]:
    """Every notebook's text source (a core, a deep dive, a core's solutions) -> the notebook made from it, under
    ``notebooks/``: what ``make notebooks`` converts and the tests compare."""
    pairs = {}
    for lesson in lessons().values():
        pairs[lesson.source] = f"{lesson.notebook}.ipynb"
        if lesson.solution:
            pairs[lesson.solution] = f"solutions/{lesson.stem}.ipynb"
    return pairs
