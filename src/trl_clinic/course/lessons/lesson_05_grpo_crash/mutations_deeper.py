"""Lesson 05's deep dive: the other side of each experiment for each group, and the one rule both sides share.

Each section records both sides with the same fields (``numbers["runs"]``, built by
``lesson_05_grpo_crash.deep_numbers``): without the fix, the overflowing division, the report's config and its
walk, per-device 1 with neither generation setting, the renamed config's bisection, the user's bf16=True settings
bisected with the injected stand-in, the all-or-nothing reward; with it, the division torch checks (by zero), the
walk's last config, the generation batch set to 16, the accepted config's bisection, the settings with
bf16=False (the stand-in still attached), partial credit on the same policy. TRL 0.14.0's answers in its era
(``numbers["then"]``) have today's TRL's answers to the same questions beside them (``numbers["today_trl"]``).

Margins, with the values of seeds 0-5 (cpu profile, one thread; the tiny Qwen2 policy before any warm start,
15 GRPO steps of 4 prompts x 8 completions, ``beta=0``):
- "nearly every group is equal (> 0.75)" and "over a quarter of the groups unequal (< 0.75)": the all-or-nothing
  reward left every group equal at every step on every seed (1.0: a random completion whose every word is a
  category word never came up), partial credit 0.32-0.48. 0.75 sits at least 0.25 from each: linear(0.2, 0.2).
  At the gpu sizes SmolLM2-135M-Instruct answers in sentences, which the all-or-nothing reward scored 1 in 0 of 64
  completions sampled on a CPU, and which partial credit scores above 0 whenever a category word appears: the same
  sides of the line.
Everything else compares statuses, exit codes, signals, names and error types: no magnitude.
"""

from trl_clinic.course.mutations import linear


def _symptom(n):
    return {**n, "runs": {**n["runs"], "without_fix": n["runs"]["with_fix"]}}


def _fix(n):
    return {**n, "runs": {**n["runs"], "with_fix": n["runs"]["without_fix"]}, "then": n["today_trl"]}


OTHER_RUN = {"symptom": _symptom, "fix": _fix}

SHARED = {
    "accepts exactly the per-device batches": "today's GRPOConfig's rule, asked on configs of neither side (4 "
    "generations, accumulation 2, per-device 1 to 8): both sides meet the same rule",
}


def _rule_without_accumulation(n):
    """TRL 0.15.2-0.16.0's rule (grpo_trainer.py, GRPOTrainer.__init__): per-device x processes must divide by
    num_generations, accumulation left out: with 4 generations only the multiples of 4 pass."""
    for batch in n["verdicts"]:
        n["verdicts"][batch] = None if int(batch) % 4 == 0 else "ValueError: The global train batch size ..."


MUTATIONS = {"accepts exactly the per-device batches": _rule_without_accumulation}

MARGINS = {
    "nearly every group is equal": linear(0.2, 0.2),
    "over a quarter of the groups unequal": linear(0.2, 0.2),
}


def gpu_shape(numbers: dict, sizes: dict) -> dict:
    """The cpu fixture in the gpu profile's shape: the checks' indexing at the gpu sizes.

    The sizes enter only the GRPO runs' step counts (the all-or-nothing and partial-credit runs, ``silent_steps``
    on both profiles) and the healthy run's, which no check reads; the native crash, the config rule, both
    bisections and the era run no model on a device (the era and the config builds run on the CPU in both
    profiles; the stand-in fires at on_step_begin, before the first generation). The share of equal groups is a
    mean over the run's steps, whatever their number: the margins above argue its value at the gpu sizes."""
    for side in numbers["runs"].values():
        side["zero_std"]["steps"] = sizes["silent_steps"]
    numbers["healthy"]["steps"] = sizes["grpo_steps"]
    return numbers
