"""Small helpers the mutation tables share."""

import math


def set_all(rows, field, value):
    for row in rows:
        row[field] = value


def cycled(values: list, length: int) -> list:
    """``values`` repeated and cut to ``length``: a cpu run's series stretched to a gpu profile's longer one."""
    return (values * (length // len(values) + 1))[:length]


def log(own: float, other: float, at_most: float = math.inf) -> tuple[str, float, float, float]:
    """A margin on the log scale: the threshold sits at least ``own`` times from the run's own value and ``other``
    times from the value the check must fail (the other run's, or its mutation's); ``at_most``: and no more than
    that many times from its own value, where the value it must fail is too far to show a loosened line (NaN)
    (``MARGINS`` in a mutation table)."""
    return ("log", own, other, at_most)


def linear(own: float, other: float, at_most: float = math.inf) -> tuple[str, float, float, float]:
    """A margin on the linear scale, as ``log`` with differences: for numbers that can be 0 or negative (a cosine's
    distance from 1, a shift in logits, a count)."""
    return ("linear", own, other, at_most)


def run_in_place_of(n: dict, own: str, theirs: str) -> dict:
    """The numbers with run ``own`` replaced by run ``theirs`` (every measurement of it at once)."""
    return {**n, "runs": {**n["runs"], own: n["runs"][theirs]}}


def other_run(bad: str, fixed: str) -> dict:
    """``OTHER_RUN`` for a lesson whose numbers hold one record per run under ``runs``: the symptom group reads the
    fixed run's record where the bad run's was, the fix group the bad run's where the fixed run's was."""
    return {"symptom": lambda n: run_in_place_of(n, bad, fixed), "fix": lambda n: run_in_place_of(n, fixed, bad)}
