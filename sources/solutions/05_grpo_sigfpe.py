# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 05 · Worked solutions
#
# The exercises of [lesson 05](../05_grpo_sigfpe.ipynb), at the lesson's own sizes, with today's real TRL;
# each answer ends in an assertion, so this notebook fails if an answer stops being true.

# %% tags=["parameters"]
profile = "auto"  # "auto" (gpu when CUDA is present), "cpu" or "gpu"
seed = 0
output_dir = None  # None: outputs/05_grpo_sigfpe at the repository root

# %%
import signal
import subprocess
import sys

from trl import GRPOConfig

from trl_clinic.course.companions import lesson_05_grpo_crash as grpo_crash
from trl_clinic.course.parameters import start_run

run = start_run("05", profile, seed, output_dir)


def how_it_ends(*args: str, timeout: float = 600) -> str:
    """The lesson's portable check: run `python -X faulthandler ARGS` in a child process, say how it ended."""
    done = subprocess.run([sys.executable, "-X", "faulthandler", *args], capture_output=True, text=True,
                          timeout=timeout)
    if done.returncode < 0:  # killed by a signal: -8 is SIGFPE
        stack = done.stderr[done.stderr.find("Current thread"):].split("\n\n")[0]
        return f"killed by {signal.Signals(-done.returncode).name}\n{stack}"
    return "finished" if done.returncode == 0 else f"error (exit {done.returncode})\n{done.stderr[-1500:]}"


# %% [markdown]
# ## Exercise 1
#
# The generation batch is per-device × accumulation 4 × 1 process, and it must be a multiple of 16: the
# per-device batch must be a multiple of 4.

# %%
batches = range(1, 17)
predicted = [batch for batch in batches if batch * 4 * 1 % 16 == 0]
said = grpo_crash.verdicts(run, num_generations=16, accumulation=4, batches=batches)
accepted = [batch for batch, error in said.items() if error is None]
print(f"predicted {predicted}; today's TRL accepts {accepted}; per-device 1 says: {said[1]}")
assert accepted == predicted == [4, 8, 12, 16]

# %% [markdown]
# ## Exercise 2
#
# With `generation_batch_size=16` set, TRL no longer computes the generation batch from per-device ×
# accumulation: it only checks that 16 splits into whole per-device batches (16 of 1) and into whole groups
# (one of 16), and feeds it through `steps_per_generation` = 16 micro-batches, four optimizer steps of
# accumulation 4. The rule is on the generation batch; per-device × accumulation × processes is only its default.

# %%
said = grpo_crash.verdicts(run, num_generations=16, accumulation=4, batches=[1], generation_batch_size=16)
config = GRPOConfig(**run.trainer_kwargs("exercise-2", logging=False), num_generations=16,
                    per_device_train_batch_size=1, gradient_accumulation_steps=4, generation_batch_size=16)
print(f"per-device 1, accumulation 4, generation_batch_size=16: {said[1] or 'accepted'}; "
      f"steps_per_generation = {config.steps_per_generation}")
assert said[1] is None and config.steps_per_generation == 16

# %% [markdown]
# ## Exercise 3
#
# torch checks an integer division by zero itself and raises a Python error (a traceback, exit code 1); the
# smallest int64 divided by -1 overflows inside the kernel, the processor traps it and the child dies by SIGFPE.

# %%
by_zero = how_it_ends("-c", 'import torch; torch.div(torch.tensor([5]), 0, rounding_mode="trunc")')
overflow = how_it_ends("-c", 'import torch; torch.div(torch.tensor([-2**63]), -1, rounding_mode="trunc")')
print(f"by zero: {by_zero.splitlines()[0]} ... {by_zero.strip().splitlines()[-1]}\nINT64_MIN / -1: {overflow}")
assert by_zero.startswith("error (exit 1)") and "ZeroDivisionError" in by_zero
assert overflow.startswith("killed by SIGFPE")
