"""Lesson 05: how a run without the bug, or without the fix, changes the numbers, one mutation per check
(the part of the check's name it matches -> a change of the numbers such a run could produce)."""

import math  # noqa: F401

from mutation_helpers import set_all  # noqa: F401


MUTATIONS = {
    "kill the GRPO child with SIGFPE and no traceback": lambda n: n["symptom"].update(signal=None),
    "rejects the report's config": lambda n: n["config_walk"][0].update(error=None),
    "per-device batch 4 x accumulation 4 holds the 16 generations": lambda n: n["rule"].update(
        per_device_train_batch_size=16, generation_batch_size=64),
    "detected as SIGFPE": lambda n: n["native_crash"].update(signal=None, returncode=1),
    "a shell words it": lambda n: n["native_crash"].update(shell_says="bash: line 1: 9 Killed", shell_returncode=137),
    "leaves no message": lambda n: n["native_crash"].update(stderr_without_faulthandler="Fatal Python error: x"),
    "faulthandler shows the Python stack": lambda n: n["native_crash"].update(stderr_with_faulthandler=""),
    "bisection names the guilty setting": lambda n: n.update(culprits=["learning_rate", "bf16"]),
    "real config error names per_device_train_batch_size": lambda n: n["config_bisection"].update(
        culprits=["gradient_accumulation_steps", "num_generations"]),
    "message does not name the guilty setting": lambda n: n["config_bisection"].update(
        message="ValueError: per_device_train_batch_size (1) must be divisible by num_generations (8)."),
    "equal-reward groups teach nothing": lambda n: n.update(silent_frac_reward_zero_std=0.5),
    "minimal config runs": lambda n: n["bisection"][0].update(status="signal"),
    "gets past the injected fault": lambda n: n.update(workaround="signal"),
    "train every step on today's TRL": lambda n: n.update(workaround_steps=n["max_steps"] - 1),
    "healthy run finished": lambda n: n.update(healthy="timeout"),
    "reward improves": lambda n: n.update(reward_end=n["reward_start"]),
    "accepts the report's config as written": lambda n: n["then"].update(accepted=False),
    "runs in fp32 unless bf16 is named": lambda n: n["then"].update(default_bf16=True),
    "nor its max_grad_norm crashes a run": lambda n: n["suspects"]["max_grad_norm"].update(status="signal"),
}
