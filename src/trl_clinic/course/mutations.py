"""Small helpers the mutation tables share."""


def set_all(rows, field, value):
    for row in rows:
        row[field] = value


def cycled(values: list, length: int) -> list:
    """``values`` repeated and cut to ``length``: a cpu run's series stretched to a gpu profile's longer one."""
    return (values * (length // len(values) + 1))[:length]


def log(own: float, other: float) -> tuple[str, float, float]:
    """A margin on the log scale: the threshold sits at least ``own`` times from the run's own value and
    ``other`` times from the other run's (``MARGINS`` in a mutation table)."""
    return ("log", own, other)


def linear(own: float, other: float) -> tuple[str, float, float]:
    """A margin on the linear scale: at least ``own`` from the run's own value and ``other`` from the other's,
    for numbers that can be 0 or negative (a cosine's distance from 1, a shift in logits)."""
    return ("linear", own, other)


def run_in_place_of(n: dict, own: str, theirs: str) -> dict:
    """The numbers with run ``own`` replaced by run ``theirs`` (every measurement of it at once)."""
    return {**n, "runs": {**n["runs"], own: n["runs"][theirs]}}


def other_run(bad: str, fixed: str) -> dict:
    """``OTHER_RUN`` for a lesson whose numbers hold one record per run under ``runs``: the symptom group reads the
    fixed run's record where the bad run's was, the fix group the bad run's where the fixed run's was."""
    return {"symptom": lambda n: run_in_place_of(n, bad, fixed), "fix": lambda n: run_in_place_of(n, fixed, bad)}
