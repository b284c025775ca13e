"""Lesson 05 (core): the other run's numbers for each group, and the one precondition both runs share.

The lesson runs the user's script twice, with the same settings and the same injected stand-in for the H20's
crash (``stand_ins.InjectedH20Fault``), ``bf16=True`` (without the fix) and ``bf16=False`` (with it); each run
is started from a shell and through the portable check, and records the same fields (``numbers["runs"]``).
Whole runs: the symptom's checks read the bf16=False run in place of the bf16=True one, the fix's checks the
other way round. No check is written below()/above(): the death is an exit status, a signal's name and the
shell's words; the fix a count of logged steps against the run's own ``max_steps``.
"""

from trl_clinic.course.mutations import other_run

OTHER_RUN = other_run("without_fix", "with_fix")

SHARED = {
    "differ only in bf16": "the comparison's precondition, read from the two specs the lesson wrote: both runs "
    "carry the stand-in, so only bf16 can decide which of them dies",
}

MUTATIONS = {
    # the lesson before it compared runs that differ only in the fix: the bf16=False run built without the stand-in
    "differ only in bf16": lambda n: n["runs"]["with_fix"].update(stand_in=False),
}

MARGINS = {}


def gpu_shape(numbers: dict, sizes: dict) -> dict:
    """The cpu fixture in the gpu profile's shape: the checks' indexing at the gpu sizes.

    Only the user's step count depends on the sizes: a run that finishes logs one row per optimizer step
    (``logging_steps=1``, the report's), so the bf16=False run logs ``user_steps`` rows at any model size; the
    bf16=True run dies at ``on_step_begin`` of step 1, before the first generation, whatever the model, and logs
    none. The exit statuses and the shell's words come from bash and the kernel, not from the model."""
    numbers["user_steps"] = sizes["user_steps"]
    numbers["runs"]["with_fix"]["steps"] = sizes["user_steps"]
    return numbers
