"""Lesson 05 (core): how a run without the bug, or without the fix, changes the numbers, one mutation per check
(the part of the check's name it matches -> a change of the numbers such a run could produce)."""


def _rule_without_accumulation(n):
    """TRL 0.15.2-0.16.0's rule (grpo_trainer.py, GRPOTrainer.__init__): per-device x processes must divide by
    num_generations, accumulation left out: with 4 generations only the multiples of 4 pass."""
    for batch in n["verdicts"]:
        n["verdicts"][batch] = None if int(batch) % 4 == 0 else "ValueError: The global train batch size ..."


MUTATIONS = {
    # the user's script on a GPU without the H20 bug: bf16=True trains, the shell says nothing
    "dies by SIGFPE from the shell": lambda n: n["died"].update(returncode=0, signal=None, shell_says=None),
    # the report's TRL 0.14.0 accepts the config as written (lesson 05's deep dive runs it)
    "rejects the report's config three times": lambda n: n.update(config_walk=[{"error": None, "fix": None}]),
    "accepts exactly the per-device batches": _rule_without_accumulation,
    # the portable check on a run without the fault: the child finishes
    "reads the bf16 run's death": lambda n: n.update(check_bad="finished"),
    # a crash not tied to bf16 (one the workaround does not avoid) at the fourth step
    "train every step": lambda n: n.update(check_fixed="killed by SIGFPE\n...", fixed_steps=3),
}


def gpu_shape(numbers: dict, sizes: dict) -> dict:
    """The cpu fixture in the gpu profile's shape. Only the user's steps depend on the sizes (user_steps, the
    same 6 on both profiles); the config walk and the verdicts build GRPOConfigs, whatever the device or model.

    Thresholds at the gpu sizes (SmolLM2-135M-Instruct, bf16 autocast, 16 generations of up to 128 tokens):
    * the death: exit status 136 and "Floating point exception" come from bash and the kernel, not from the
      model; the injected fault fires at on_step_begin, before the first generation, whatever its size.
    * the walk and the verdicts: GRPOConfig's arithmetic, computed on the CPU in both profiles.
    * "trains every step": equality of counts (the fixed run's logged steps against user_steps), not a float.
    """
    numbers["user_steps"] = sizes["user_steps"]
    numbers["fixed_steps"] = sizes["user_steps"]
    return numbers
