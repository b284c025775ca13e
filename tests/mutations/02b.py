"""Lesson 02b: how a run without the bug, or without the fix, changes the numbers, one mutation per check
(the part of the check's name it matches -> a change of the numbers such a run could produce)."""

import math  # noqa: F401

from mutation_helpers import set_all  # noqa: F401


MUTATIONS = {
    "different numbers of label tokens": lambda n: [n["label_counts"].update({acc: [[5] * len(c[0])] * len(c)})
                                                    for acc, c in list(n["label_counts"].items())],
    "old per-process mean misses": lambda n: set_all(n["comparison"]["old"], "relative_error", 1e-7),
    "per-process num_items_in_batch misses": lambda n: set_all(n["comparison"]["per-process"],
                                                               "relative_error", 1e-7),
    "as many label tokens as the processes together": lambda n: n.update(same_samples=False),
    "counts across processes match the big batch": lambda n: set_all(n["comparison"]["across-processes"],
                                                                     "relative_error", 0.3),
    "with fsdp=True asked for": lambda n: set_all(n["comparison"]["across-processes, fsdp"], "relative_error", 0.3),
}
