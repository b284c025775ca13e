"""Comparing first-step records with the good end's, and searching a window for the first one that differs. A record
differs in a *part*, named in the order a step computes it: the ``batch`` (input ids, labels, position ids and any
other tensor the collator sends, hashed exactly), the ``mask`` (every attention mask, hashed exactly), an ``error``
(the version's own step raised, or raised something else: its type and first line; a step that raised has no
attention, label count or loss to compare), the ``attention`` (which tokens of one row each token's output depends
on, as the model's first forward of the loss measured it: what the mask builder made of the mask and the position
ids), the ``label count`` (label tokens over the accumulation window), the ``loss scale`` (the step's loss or
gradient norm beyond the rounding bound) and a ``verdict`` (a check-up probe that said ok, warn or fail at both
ends, differently). The first part that differs is the one named: a batch that changed changes everything after.

The search never measures a version twice and never counts an untestable one (a conflict, libraries that do
not import, a failed build) as good or bad: binary search steps around it, and the result says which
versions between the last same and the first different could not be told apart.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

PARTS = ("batch", "mask", "error", "attention", "label count", "loss scale", "verdict")
# Relative bound on the loss and the gradient norm between two records of the same weights and batch: the
# worst case of a float32 sum of about 150 terms in another order (n * 2**-24 = 9e-6, a window's label tokens).
# Measured (benchmarks/bisect_rounding.py, docs/bisect.md): the 24 orders of lesson 02's four micro-batches x
# sdpa/eager x 1/2 threads spread the loss by 9.9e-8 relative and the gradient norm by 0; the first step run
# twice, and at 1, 2 and 4 threads, in transformers 4.45.0's and 4.45.2's side environments gave the same bits.
LOSS_BOUND = 1e-5


@dataclass
class Measured:
    """One version's outcome: its environment's status and, where it ran, the record."""

    version: str
    status: str  # built, cached, conflict, unusable, failed (the build), step failed (the first step)
    record: dict | None = None
    message: str = ""
    seconds: float = 0.0
    parts: list[str] = field(default_factory=list)  # what differs from the good end, in PARTS order

    @property
    def usable(self) -> bool:
        return self.record is not None

    @property
    def skipped(self) -> bool:
        """Untestable for what it is (a conflict, libraries that do not import): neither good nor bad."""
        return self.status in ("conflict", "unusable")


def _close(a: float | None, b: float | None, bound: float) -> bool:
    if a is None or b is None:
        return a is b
    return abs(a - b) <= bound * max(abs(a), abs(b), 1e-12)


def attention_hash(record: dict) -> str | None:
    """The attention pattern's hash; None where the record has none (a batch without token ids, a replay the
    version's model refused, an older record)."""
    return (record.get("attention") or {}).get("sha256")


def attention_differs(good: dict, other: dict) -> bool:
    """Both patterns measured and different: one not measured is not compared (the loss still is)."""
    a, b = attention_hash(good), attention_hash(other)
    return a is not None and b is not None and a != b


def changed_verdicts(good: dict, other: dict) -> list[str]:
    """The probes whose verdict (ok, warn, fail) differs between the records; a probe that was skipped, crashed or
    not run at either end is not compared (the check-up is today's code, and an old library can trip it)."""
    a, b = good.get("verdicts") or {}, other.get("verdicts") or {}
    said = ("ok", "warn", "fail")
    return sorted(
        probe
        for probe in a.keys() & b.keys()
        if a[probe]["status"] in said and b[probe]["status"] in said and a[probe]["status"] != b[probe]["status"]
    )


def differing_parts(good: dict, other: dict, bound: float = LOSS_BOUND) -> list[str]:
    """The parts in which ``other`` differs from ``good``, in the order a step computes them."""
    found = []
    changed = {
        key for key in good["parts"].keys() | other["parts"].keys() if good["parts"].get(key) != other["parts"].get(key)
    }
    if any("attention_mask" not in key for key in changed):
        found.append("batch")
    if any("attention_mask" in key for key in changed):
        found.append("mask")
    if good.get("raised") != other.get("raised"):
        found.append("error")
    stepped = not (good.get("raised") or other.get("raised"))  # a step that raised has no loss to compare
    if stepped and attention_differs(good, other):
        found.append("attention")
    if stepped and good["label_tokens"] != other["label_tokens"]:
        found.append("label count")
    if stepped and not (
        _close(good["loss"], other["loss"], bound) and _close(good["grad_norm"], other["grad_norm"], bound)
    ):
        found.append("loss scale")
    if changed_verdicts(good, other):
        found.append("verdict")
    return found


@dataclass
class Outcome:
    """What a search found. ``first`` is the first version that differs from the good end (None when none
    did); ``last_same`` the newest that matched before it; ``between`` the untestable versions in between;
    ``decided`` is False when a failure (not a conflict) leaves the answer open."""

    versions: list[str]
    measured: dict[str, Measured]
    first: str | None = None
    last_same: str | None = None
    between: list[str] = field(default_factory=list)
    changed_back: list[str] = field(default_factory=list)
    decided: bool = True

    @property
    def part(self) -> str | None:
        return self.measured[self.first].parts[0] if self.first else None

    @property
    def exit_code(self) -> int:
        """0 nothing changed, 1 a change found, 3 a build failure left it undecided (2 is usage, argparse's)."""
        if not self.decided:
            return 3
        return 1 if self.first else 0


Measure = Callable[[str], Measured]


def _measure(version: str, measure: Measure, good: Measured | None, bound: float, done: dict) -> Measured:
    if version not in done:
        step = measure(version)
        if good is not None and step.usable and good.usable:
            step.parts = differing_parts(good.record, step.record, bound)
        done[version] = step
    return done[version]


def binary(versions: list[str], measure: Measure, bound: float = LOSS_BOUND) -> Outcome:
    """At most 1 + ceil(log2 n) measurements for n versions (issue 48: 6 for a 30-release window): the good end,
    then halvings of what is left open, a first change at one of the n - 1 others or none at all. The bad end
    is measured when the search reaches it, not first: measuring both ends first leaves n - 1 answers for the
    halvings, 2 + ceil(log2 (n - 1)) in all (7 for 27 releases). Assumes the record changes once (``linear``
    shows every version)."""
    done: dict[str, Measured] = {}
    good = _measure(versions[0], measure, None, bound, done)
    outcome = Outcome(versions, done)
    if not good.usable:
        outcome.decided = False
        return outcome
    low, high = 0, len(versions)  # low: the newest measured same; high: the oldest that differs, or past the end
    untestable: set[int] = set()
    while candidates := [i for i in range(low + 1, high) if i not in untestable]:
        middle = min(candidates, key=lambda i: (abs(i - (low + high) / 2), i))
        step = _measure(versions[middle], measure, good, bound, done)
        if not step.usable:
            untestable.add(middle)
        elif step.parts:
            high = middle
        else:
            low = middle
    if high == len(versions):  # nothing differs: decided only where the bad end itself was measured the same
        outcome.decided = low == len(versions) - 1
        return outcome
    return _settle(outcome, low, high)


def linear(versions: list[str], measure: Measure, bound: float = LOSS_BOUND) -> Outcome:
    """Every version, oldest first: shows a change that went back (not monotonic), which binary search misses."""
    done: dict[str, Measured] = {}
    good = _measure(versions[0], measure, None, bound, done)
    for version in versions[1:]:
        _measure(version, measure, good, bound, done)
    outcome = Outcome(versions, done)
    if not good.usable:
        outcome.decided = False
        return outcome
    usable = [i for i, v in enumerate(versions) if done[v].usable]
    first = next((i for i in usable if done[versions[i]].parts), None)
    if first is None:
        outcome.decided = all(done[v].usable or done[v].skipped for v in versions)
        return outcome
    last_same = max(i for i in usable if i < first)
    outcome.changed_back = [versions[i] for i in usable if i > first and not done[versions[i]].parts]
    return _settle(outcome, last_same, first)


def _settle(outcome: Outcome, low: int, high: int) -> Outcome:
    versions, done = outcome.versions, outcome.measured
    outcome.first, outcome.last_same = versions[high], versions[low]
    outcome.between = versions[low + 1 : high]
    outcome.decided = all(done[v].skipped for v in outcome.between if v in done)
    return outcome
