"""Lesson 05's deep dive: how a run without the bug, or without the fix, changes the numbers, one mutation per
check (the part of the check's name it matches -> a change of the numbers such a run could produce)."""

NO_GENERATION_BATCH = "TypeError: GRPOConfig.__init__() got an unexpected keyword argument 'generation_batch_size'"


def _checked_overflow(n):
    """A torch whose integer division checks for overflow, as torch 2.13 checks for a division by zero: a
    Python error (exit code 1, a traceback) instead of a native crash."""
    traceback = (
        'Traceback (most recent call last):\n  File "crash.py", line 31, in native_sigfpe\n'
        "RuntimeError: integer overflow in division\n"
    )
    n["native_crash"].update(
        returncode=1,
        signal=None,
        shell_returncode=1,
        shell_says=None,
        stderr_with_faulthandler=traceback,
        shell_stderr_is_bash_only=False,
    )


MUTATIONS = {
    (
        "kills the child: return code -8",
        "a shell words it",
        "leaves no message of its own",
        "faulthandler shows the Python stack",
    ): _checked_overflow,
    # PYTHONFAULTHANDLER=1 in the user's environment: the plain run prints its stack too
    "leaves no message of its own": lambda n: n["native_crash"].update(shell_stderr_is_bash_only=False),
    # a child started without -X faulthandler
    "faulthandler shows the Python stack": lambda n: n["native_crash"].update(stderr_with_faulthandler=""),
    # TRL 0.17.0: no generation_batch_size or steps_per_generation in GRPOConfig yet
    "unless generation_batch_size or steps_per_generation": lambda n: n["settable"].update(
        {
            "generation_batch_size=16": {
                "error": NO_GENERATION_BATCH,
                "generation_batch_size": None,
                "steps_per_generation": None,
            }
        }
    ),
    # a rule that also checked the accumulation against num_generations
    "names per_device_train_batch_size alone": lambda n: n["config_bisection"].update(
        culprits=["per_device_train_batch_size", "gradient_accumulation_steps"]
    ),
    # a TRL whose message named the setting
    "message does not name the guilty setting": lambda n: n["config_bisection"].update(
        message="ValueError: per_device_train_batch_size (1) x gradient_accumulation_steps (4) must be divisible by "
        "num_generations (16)."
    ),
    # a fault that needed two of the user's settings
    "names bf16": lambda n: n.update(culprits=["learning_rate", "bf16"]),
    # beta > 0 after the policy moved: the KL term still pulls on groups whose rewards are equal
    "equal-reward groups teach nothing": lambda n: n["silent"].update(
        max_equal_grad_norm=n["healthy_median_grad_norm"]
    ),
    # a machine where even the fp32 minimal config dies (a native crash not tied to bf16)
    "minimal config runs": lambda n: n["bisection"][0].update(status="signal", signal="SIGFPE"),
    "nor its max_grad_norm crashes a run": lambda n: n["suspects"]["max_grad_norm"].update(status="signal"),
    # the report's learning rate 5e-6 on the healthy run: the suspect run measured a gain of about -0.02
    "reward improves": lambda n: n.update(reward_end=n["reward_start"] - 0.02),
    # today's TRL, which rejects the config as written
    "accepts the report's config as written": lambda n: n["then"].update(accepted=False, optimizer_steps=0),
    # a TRL whose per-device batch counted completions (0.15.2 on): per-device batch 1 is one completion
    "counts prompts": lambda n: n["then"].update(
        completions_per_call=[1], batch_help="The batch size per device accelerator core/CPU for training."
    ),
    # today's GRPOConfig, whose bf16 defaults to True (trl 1.16.0 grpo_config.py)
    "runs in fp32 unless bf16 is named": lambda n: n["then"].update(default_bf16=True),
}


def gpu_shape(numbers: dict, sizes: dict) -> dict:
    """The cpu fixture in the gpu profile's shape: the healthy run's and the silent run's step counts.

    Thresholds at the gpu sizes (SmolLM2-135M-Instruct with real weights, bf16 autocast, 8 prompts x 16
    generations of up to 64 tokens a step, 150 GRPO steps as on the cpu):
    * the native crash, the config rule, both bisections and the era: no model or device in them (the era
      and the config builds run on the CPU in both profiles; the injected fault fires before generation).
    * "reward improves by > 0.1": the warm start (word lists, half of their words from the asked category)
      leaves a policy near 0.5 of a completion's words in category, as the tiny model's 0.66-0.71 at the cpu
      sizes; 0.1 is a third of the cpu gain (0.28 at seed 0) and the reward's ceiling is 1, so the bar asks
      for learning, not for the cpu's pace. Not yet run on a GPU.
    * "equal-reward groups teach nothing": with beta 0 an equal group's advantages are exactly 0 (reward
      minus an equal mean), in bf16 as in fp32, so the bound 1e-6 x the healthy median grad norm holds with
      any precision; "most groups equal" (mean frac_reward_zero_std > 0.5): SmolLM2 before the warm start
      scored 1 on the all-or-nothing reward in 0 of 64 completions of 64 tokens sampled on the CPU (4 prompts
      x 16), as it answers in sentences, not word lists.
    """
    numbers["healthy_steps"] = sizes["grpo_steps"]
    numbers["silent"].update(steps=sizes["silent_steps"], equal_steps=sizes["silent_steps"])
    return numbers
