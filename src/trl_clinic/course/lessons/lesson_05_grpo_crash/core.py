# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 05 · GRPOTrainer dies with "Floating point exception (core dumped)"
#
# In [TRL issue #2906](https://github.com/huggingface/trl/issues/2906), GRPO training on an H20 GPU died
# with `Floating point exception (core dumped)` and nothing else; `bf16=False` made it run.
#
# **You will learn**
# * what that message means, and why Python prints nothing;
# * how to read such a crash from a child process, with the stack where it died;
# * the report's workaround (`bf16=False`) and cure (a newer cuBLAS).
#
# **You should know** Python's `subprocess` and a `GRPOConfig` ([TRL's GRPO docs](https://huggingface.co/docs/trl/grpo_trainer)).
#
# **Time** 40 s to run on the cpu [profile](../README.md#words-the-lessons-use); about 25 minutes to work through.
#
# > **Hosted** (Colab, Kaggle, no clone): upload the wheel `uv build` makes, then run `%pip install "./trl_clinic-0.1.0-py3-none-any.whl[course]"` first.

# %% tags=["parameters"]
profile = "auto"  # "auto" (gpu when CUDA is present), "cpu" or "gpu"
seed = 0
output_dir = None  # None: outputs/05_grpo_sigfpe at the repository root

# %%
import os
import re
import signal
import subprocess
import sys

from trl_clinic.course.lessons.lesson_05_grpo_crash import companion as grpo_crash
from trl_clinic.course.parameters import start_run
from trl_clinic.course.results import check

run = start_run("05", profile, seed, output_dir)
print(run.describe())
sizes = run.sizes

# %% [markdown]
# ## 1. The symptom
#
# The report's settings on a small policy, started as the user started theirs: `python train_grpo.py` from a
# shell. Two of them are renamed for today's libraries (`warmup_ratio` is gone: `warmup_steps` takes a float
# below 1 as a ratio) and the batch sizes are the lesson's (today's TRL rejects the report's per-device batch 1;
# the [deep dive](deeper/05_grpo_sigfpe_deeper.ipynb) walks the config).
#
# **What is real, what stands in:** the GRPO run, the signal that kills it and every word the shell prints are
# real. What fires the signal is a *stand-in*, a fault put there on purpose because the real one needs an H20:
# a callback that runs a crashing torch kernel at the first step when `bf16` is on. It is labelled `injected`
# wherever it counts.

# %% tags=["symptom"]
reported = dict(  # the report's GRPOConfig, verbatim
    learning_rate=5e-6, adam_beta1=0.9, adam_beta2=0.99, weight_decay=0.1, warmup_ratio=0.1,
    lr_scheduler_type="cosine", logging_steps=1, bf16=True, per_device_train_batch_size=1,
    gradient_accumulation_steps=4, num_generations=16, max_prompt_length=256, max_completion_length=200,
    num_train_epochs=1, save_steps=100, max_grad_norm=0.1, log_on_each_node=False, use_vllm=False,
    report_to="tensorboard",
)
settings = grpo_crash.in_todays_names(reported)  # learning rate ... bf16=True, in today's names
bad_script = grpo_crash.user_spec(run, "bf16", settings, sizes.user_steps)  # the stand-in attached
died = grpo_crash.from_shell(run, bad_script)
print(grpo_crash.terminal_tail(died.stderr))
print(f"exit status {died.returncode}; a Python traceback: {'Traceback' in died.stderr}")

# %% [markdown]
# ## 2. What the message means
#
# SIGFPE is the signal Linux sends a process whose compiled code asked the processor for an integer division
# it cannot do. Python never gets control back: no traceback, no `except`, and a notebook would lose its kernel.
# The shell reports the death as exit status 128 + 8 (SIGFPE is signal 8) and in words, adding "(core dumped)"
# when its core-size limit (`ulimit -c`) let a core file be written.
#
# So run a suspect in a child process and read how it ended. With `-X faulthandler` the child prints its Python
# stack as it dies; a negative return code names the signal. Plain Python, for any script:

# %% tags=["portable-check"]
def how_it_ends(*args: str, timeout: float = 600) -> str:
    """Run `python -X faulthandler ARGS` in a child process and say how it ended."""
    done = subprocess.run([sys.executable, "-X", "faulthandler", *args], capture_output=True, text=True,
                          timeout=timeout)
    if done.returncode < 0:  # killed by a signal: -8 is SIGFPE
        stack = done.stderr[done.stderr.find("Current thread"):].split("\n\n")[0]
        return f"killed by {signal.Signals(-done.returncode).name}\n{stack}"
    return "finished" if done.returncode == 0 else f"error (exit {done.returncode})\n{done.stderr[-1500:]}"


# %% [markdown]
# Two integer divisions in torch's kernel, each in its own child: one by zero, and the smallest int64 by -1,
# whose quotient does not fit in an int64. The line after each division prints `returned`:

# %% tags=["mechanism"]
divisions = {"5 // 0": "torch.tensor([5]), 0", "-2**63 // -1": "torch.tensor([-2**63]), -1"}
native = {name: how_it_ends("-c", f"import torch; torch.div({args}, rounding_mode='trunc'); print('returned')")
          for name, args in divisions.items()}
for name, ended in native.items():
    print(f"{name}: {ended.strip().splitlines()[0]} ... {ended.strip().splitlines()[-1].strip()}")

# %% [markdown]
# torch checks for a division by zero and raises a Python error. The overflow it does not check: an x86
# processor traps it, the child dies inside the kernel before `returned`, and only faulthandler's stack says
# where (an ARM processor's division does not trap; there the child finishes).
#
# On H20 GPUs, bf16 and fp16 matrix multiplies with torch's cu121 wheels die this way
# ([pytorch #133548](https://github.com/pytorch/pytorch/issues/133548),
# [#152017](https://github.com/pytorch/pytorch/issues/152017)); users trace it to the cuBLAS those wheels
# come with, and report that `pip install nvidia-cublas-cu12==12.4.5.8` cures it
# ([Seed-Coder #11](https://github.com/ByteDance-Seed/Seed-Coder/issues/11)). That #2906 is this bug is
# inferred (same GPU, a cu121 wheel, gone with `bf16=False`), not measured: the stand-in above has its shape, not
# its cause.

# %% [markdown] tags=["fix"]
# ## 3. The fix, in your script
#
# ```diff
#  GRPOConfig(
#      ...
# -    bf16=True,
# +    bf16=False,                      # the workaround on an H20 with torch's cu121 wheels
#  )
# ```
# The cure keeps `bf16=True`: a newer cuBLAS (`pip install nvidia-cublas-cu12==12.4.5.8`, as users report).
#
# The user's script twice through the portable check: the same settings and the same stand-in, `bf16` the only
# difference. Then the fixed one from the shell, as the user would start it again:

# %%
fixed_script = grpo_crash.user_spec(run, "fp32", {**settings, "bf16": False}, sizes.user_steps)  # stand-in attached
ended = {"bf16=True": how_it_ends(str(grpo_crash.SCRIPT), str(bad_script)),
         "bf16=False": how_it_ends(str(grpo_crash.SCRIPT), str(fixed_script))}
for name, text in ended.items():
    print(f"{name}:", re.sub(r'"[^"]*/', '"', text))  # file names without their folders

# %%
fixed_shell = grpo_crash.from_shell(run, fixed_script)
fixed_rows = grpo_crash.logged_steps(fixed_script)
print(f"from the shell, bf16=False: exit status {fixed_shell.returncode}, {len(fixed_rows)} of {sizes.user_steps} "
      "steps logged")

# %% [markdown]
# The stack names the callback that fired, `on_step_begin`, inside `trainer.train()`: in a real crash it names
# the layer whose kernel died. Bisecting the settings in child processes finds `bf16` without reading any stack
# (the deep dive runs it). The [check-up](../README.md#words-the-lessons-use) reads the same risk before training:
# `checkup(trainer, only=["known_bugs"])` warns, from its table of reported bugs, on an H20 with `bf16=True` and
# the cuBLAS of torch's cu121 wheels.
#
# ## 4. Bad against fixed

# %% tags=["figure"]
grpo_crash.figure(run, ended, fixed_rows, sizes.user_steps)

# %% [markdown]
# ## Recap
#
# * "Floating point exception (core dumped)" is a native crash: the process dies by SIGFPE, Python prints nothing.
# * An integer division the processor cannot do traps in the kernel; torch raises a Python error only for what it checks.
# * Run a suspect in a child with `-X faulthandler`: a negative return code names the signal, the stack names the step.
# * On an H20 with torch's cu121 wheels, bf16 matrix multiplies crash: `bf16=False` avoids it, a newer cuBLAS cures it.
#
# ## Exercises
#
# Worked solutions: [`solutions/05_grpo_sigfpe.ipynb`](solutions/05_grpo_sigfpe.ipynb). One starter cell each follows.
#
# 1. Start the bf16=True script without the stand-in (`grpo_crash.user_spec(..., h20_stand_in=False)`). Does
#    bf16 itself crash on this machine? What does that say about the crash above?
#    <details><summary>Hint</summary>Pass the new spec to <code>how_it_ends(str(grpo_crash.SCRIPT), ...)</code>
#    and read the first line it returns.</details>
# 2. A native crash of another kind: `how_it_ends("-c", "import ctypes; ctypes.string_at(0)")` reads memory at
#    address 0. Which signal, and what exit status would a shell report?
#    <details><summary>Hint</summary>The shell's status is 128 + the signal's number:
#    <code>signal.Signals.SIGSEGV.value</code>.</details>
# 3. You cannot always change how a job is started. Run the bf16=True script with plain `python` (no
#    `-X faulthandler`) but `PYTHONFAULTHANDLER=1` in its environment. Does the stack still appear?
#    <details><summary>Hint</summary><code>subprocess.run(..., env={**os.environ, "PYTHONFAULTHANDLER": "1"},
#    capture_output=True, text=True)</code>, then look for "Fatal Python error" in its stderr.</details>

# %% tags=["exercise"]
# Exercise 1: the user's bf16=True settings, the stand-in left out
no_stand_in = grpo_crash.user_spec(run, "bf16-no-stand-in", settings, sizes.user_steps,
                                   h20_stand_in=True)  # leave the stand-in out
# print(how_it_ends(str(grpo_crash.SCRIPT), str(no_stand_in)).splitlines()[0])

# %% tags=["exercise"]
# Exercise 2: read memory at address 0 in a child
code = "import ctypes; ctypes.string_at(0)"
# print(how_it_ends("-c", code))

# %% tags=["exercise"]
# Exercise 3: plain python, faulthandler switched on by the environment
command = [sys.executable, str(grpo_crash.SCRIPT), str(bad_script)]
# done = subprocess.run(command, env={**os.environ, "PYTHONFAULTHANDLER": "1"}, capture_output=True, text=True)

# %% [markdown]
# ## Checks
#
# The claims above, asserted on this run's numbers.

# %% jupyter={"source_hidden": true}
numbers = {"runs": {"without_fix": grpo_crash.record(bad_script, died, ended["bf16=True"], settings),
                    "with_fix": grpo_crash.record(fixed_script, fixed_shell, ended["bf16=False"], settings)},
           "user_steps": sizes.user_steps, "native_divisions": native}
check(run, numbers)
