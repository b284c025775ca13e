"""Lesson 08 (one notebook: three silent failures). The lesson records both runs side by side (``numbers["runs"]``):
``without_fix`` (trl 0.24.0 + transformers 5.5.0 on the prompt-completion rows, the template with the turn end
outside its ``{% generation %}`` block, QDoRA on trl 1.14.2) and ``with_fix`` (today's TRL on the same rows, the
turn end inside the block, QDoRA on trl 1.16.0 and, for ``workaround_frozen_share``, trl 1.14.2 with the magnitude
cast back to float32), each with the same keys, so the other run's record fails every check of a group.

Margins: every comparison is a share whose two runs sit at 0 and 1 (0.0 and 0.90-0.91 for the prompt tokens, 0 and 1
for the answers and the magnitude, seed 0); each line is at 0.5, halfway, so a line moved halfway toward the other
run crosses it (linear margins of 0.4 from each run, the prompt's 0.90 included).
"""

from trl_clinic.course.mutations import linear, other_run

OTHER_RUN = other_run("without_fix", "with_fix")

SHARED: dict[str, str] = {}

MUTATIONS: dict = {}

MARGINS = {
    "over half the prompt tokens are trained": linear(0.4, 0.4),
    "under half the prompt tokens are trained": linear(0.4, 0.4),
    "over half the greedy answers never end": linear(0.4, 0.4),
    "under half the greedy answers never end": linear(0.4, 0.4),
    "over half of DoRA's magnitude elements never move": linear(0.4, 0.4),
    "under half of the magnitude's elements stay frozen": linear(0.4, 0.4),
    "under half stay frozen": linear(0.4, 0.4),
}


def gpu_shape(numbers: dict, sizes: dict) -> dict:
    """The gpu profile runs the same sizes (``sizes`` equal the cpu's: rows, steps, questions) and its eras run on the
    CPU, as every era does: only today's runs move to the GPU, under bf16 autocast. The shape is the cpu run's, at
    the gpu's precision; not run on a GPU (no task had one)."""
    return {**numbers, "precision": "bf16"}
