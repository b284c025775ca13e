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
import os
import signal
import subprocess
import sys

from trl_clinic.course.lessons.lesson_05_grpo_crash import companion as grpo_crash
from trl_clinic.course.parameters import start_run

run = start_run("05", profile, seed, output_dir)
sizes = run.sizes
reported = dict(learning_rate=5e-6, adam_beta1=0.9, adam_beta2=0.99, weight_decay=0.1, warmup_ratio=0.1,
                lr_scheduler_type="cosine", bf16=True, gradient_accumulation_steps=4, max_grad_norm=0.1)
settings = grpo_crash.in_todays_names(reported)


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
# Without the stand-in the same bf16=True settings train on this machine: bf16 itself does not crash here. The
# crash in the lesson is the stand-in's, put there because the real one needs an H20 and its cuBLAS.

# %%
no_stand_in = grpo_crash.user_spec(run, "bf16-no-stand-in", settings, sizes.user_steps, h20_stand_in=False)
ended = how_it_ends(str(grpo_crash.SCRIPT), str(no_stand_in))
steps = len(grpo_crash.logged_steps(no_stand_in))
print(f"bf16=True without the stand-in: {ended.splitlines()[0]}; {steps} of {sizes.user_steps} steps logged")
assert ended == "finished" and steps == sizes.user_steps

# %% [markdown]
# ## Exercise 2
#
# Reading memory at address 0 is a segmentation fault: the child dies by SIGSEGV, signal 11, so a shell would
# report exit status 128 + 11 = 139 ("Segmentation fault (core dumped)"). faulthandler names the line.

# %%
segfault = how_it_ends("-c", "import ctypes; ctypes.string_at(0)")
print(f"{segfault}\na shell would report exit status {128 + signal.Signals.SIGSEGV.value}")
assert segfault.startswith("killed by SIGSEGV") and 'File "<string>", line 1' in segfault
assert 128 + signal.Signals.SIGSEGV.value == 139

# %% [markdown]
# ## Exercise 3
#
# Python reads `PYTHONFAULTHANDLER` at start-up as it reads `-X faulthandler`: the stack appears, and the command
# stays as the job's launcher wrote it.

# %%
bad_script = grpo_crash.user_spec(run, "bf16", settings, sizes.user_steps)  # the stand-in attached
command = [sys.executable, str(grpo_crash.SCRIPT), str(bad_script)]
done = subprocess.run(command, env={**os.environ, "PYTHONFAULTHANDLER": "1"}, capture_output=True, text=True)
stack = done.stderr[done.stderr.find("Fatal Python error"):].split("\n\n")[:2]
print(f"return code {done.returncode}\n" + "\n\n".join(stack))
assert done.returncode == -signal.SIGFPE and "Fatal Python error: Floating point exception" in done.stderr
assert "in on_step_begin" in done.stderr
