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
# * what that message means, and how to read such a crash from a child process;
# * how GRPO cuts its generation batch into groups, and which batch settings today's TRL accepts;
# * the workaround (`bf16=False`) and the cure (a newer cuBLAS) for the report's crash.
#
# **You should know** GRPO's groups of completions ([TRL's GRPO docs](https://huggingface.co/docs/trl/grpo_trainer)) and Python's `subprocess`.
#
# **Time** 40 s to run on the cpu profile; about 25 minutes to work through.
#
# > **Hosted** (Colab, Kaggle, a server without the repository): upload the wheel (`uv build` makes it) and run `%pip install "./trl_clinic-0.1.0-py3-none-any.whl[course]"` in a cell first.

# %% tags=["parameters"]
profile = "auto"  # "auto" (gpu when CUDA is present), "cpu" or "gpu"
seed = 0
output_dir = None  # None: outputs/05_grpo_sigfpe at the repository root

# %%
import signal
import subprocess
import sys

from trl_clinic.course.companions import lesson_05_grpo_crash as grpo_crash
from trl_clinic.course.parameters import start_run
from trl_clinic.course.results import conclude, injected, measured, save_metrics

run = start_run("05", profile, seed, output_dir)
sizes = run.sizes

# %% [markdown]
# ## 1. The symptom
#
# The report's settings (in today's names, on a small policy; section 3 shows why the config as written no
# longer loads), started as the user started theirs: `python train_grpo.py` from a shell.
# **What is real, what stands in:** the GRPO run, the SIGFPE that kills it (an overflowing integer division
# in a torch kernel, which x86 processors trap) and every word the shell prints are real; what fires it, a
# callback that runs that kernel at the first step when `bf16` is on, stands in for the H20's cuBLAS bug,
# which needs that GPU.

# %% tags=["symptom"]
reported = dict(  # the report's GRPOConfig, verbatim
    learning_rate=5e-6, adam_beta1=0.9, adam_beta2=0.99, weight_decay=0.1, warmup_ratio=0.1,
    lr_scheduler_type="cosine", logging_steps=1, bf16=True, per_device_train_batch_size=1,
    gradient_accumulation_steps=4, num_generations=16, max_prompt_length=256, max_completion_length=200,
    num_train_epochs=1, save_steps=100, max_grad_norm=0.1, log_on_each_node=False, use_vllm=False,
    report_to="tensorboard",
)
settings = grpo_crash.in_todays_names(reported)  # what the user changed: learning rate ... bf16=True ...
script = grpo_crash.user_spec(run, "bf16", settings, sizes.user_steps, h20_stand_in=True)
died = grpo_crash.from_shell(run, script)
print(grpo_crash.terminal_tail(died.stderr))
print(f"exit status {died.returncode}; a Python traceback: {'Traceback' in died.stderr}")

# %% [markdown]
# ## 2. What the message means
#
# SIGFPE is the signal Linux sends a process whose compiled code asked the processor for an integer division
# it cannot do (by zero, or one that overflows). Python never gets control back: no traceback, no `except`,
# and a notebook would lose its kernel. The shell reports the death as exit status 128 + 8 (SIGFPE is
# signal 8) and in words, adding "(core dumped)" when its core-size limit (`ulimit -c`) let a core file be written.
#
# On H20 GPUs, bf16 and fp16 matrix multiplies with torch's cu121 wheels die this way
# ([pytorch #133548](https://github.com/pytorch/pytorch/issues/133548),
# [#152017](https://github.com/pytorch/pytorch/issues/152017)); users trace it to the cuBLAS those wheels
# come with, and report that `pip install nvidia-cublas-cu12==12.4.5.8` cures it
# ([Seed-Coder #11](https://github.com/ByteDance-Seed/Seed-Coder/issues/11)). That #2906 is this bug is
# inferred (same GPU, a cu121 wheel, gone with `bf16=False`), not measured.
#
# ## 3. Today the same config fails sooner
#
# The report's config, verbatim, through today's `GRPOConfig`: each real error and its fix.

# %%
walk = grpo_crash.walk_report(run, reported)

# %% [markdown]
# ## 4. The generation batch as groups
#
# GRPO samples `num_generations` completions per prompt and scores each against its group's mean. It
# generates completions for several micro-batches together, the generation batch: unless you set
# `generation_batch_size` or `steps_per_generation`, per-device batch × accumulation × processes, and it
# must split into whole groups. Two small configs with 4 generations and accumulation 2, and today's
# verdict on per-device batches 1 to 8:

# %% tags=["mechanism"]
said = grpo_crash.verdicts(run, num_generations=4, accumulation=2, batches=range(1, 9))
grpo_crash.draw_groups(run, 4, 2, (4, 3), said)
print("\n".join(grpo_crash.rule_lines()))  # the installed grpo_config.py
print({batch: "accepted" if error is None else error for batch, error in said.items()})

# %% [markdown]
# The report's per-device batch 1 × accumulation 4 × 1 process is 4 completions: a quarter of one group of
# 16. The report's TRL counted prompts there, so 1 meant one group; today it counts completions (the
# [deep dive](deeper/05_grpo_sigfpe_deeper.ipynb) runs the report's TRL and reads each release's rule).

# %% [markdown] tags=["fix"]
# ## 5. The fix, in your script
#
# ```diff
#  GRPOConfig(
# -    warmup_ratio=0.1,
# +    warmup_steps=0.1,                # a float below 1 is a ratio today
# -    max_prompt_length=256,           # gone: shorten prompts in the dataset
# -    per_device_train_batch_size=1,
# +    per_device_train_batch_size=4,   # 4 x accumulation 4 = 16 completions: one whole group
# -    bf16=True,
# +    bf16=False,                      # the workaround on an H20 with torch's cu121 wheels
#      ...
#  )
# ```
# The cure keeps `bf16=True`: a newer cuBLAS (`pip install nvidia-cublas-cu12==12.4.5.8`, as users report).
#
# ## 6. Check it in your project
#
# Run the training script in a child process and read how it ended; a native crash then kills the
# child, not you, and `-X faulthandler` makes the child print its Python stack as it dies:

# %% tags=["portable-check"]
def how_it_ends(*args: str, timeout: float = 600) -> str:
    """Run `python -X faulthandler ARGS` in a child process and say how it ended."""
    done = subprocess.run([sys.executable, "-X", "faulthandler", *args], capture_output=True, text=True,
                          timeout=timeout)
    if done.returncode < 0:  # killed by a signal: -8 is SIGFPE
        stack = done.stderr[done.stderr.find("Current thread"):].split("\n\n")[0]
        return f"killed by {signal.Signals(-done.returncode).name}\n{stack}"
    return "finished" if done.returncode == 0 else f"error (exit {done.returncode})\n{done.stderr[-1500:]}"


fixed_script = grpo_crash.user_spec(run, "fp32", {**settings, "bf16": False}, sizes.user_steps)
bad, fixed = how_it_ends(str(grpo_crash.SCRIPT), str(script)), how_it_ends(str(grpo_crash.SCRIPT), str(fixed_script))
print(f"bf16=True: {bad}\n\nbf16=False: {fixed}")

# %% [markdown]
# TRL checks the group rule when the config is built (`trl-clinic checkup grpo ...` reports its refusal);
# on a built trainer, `checkup(trainer, only=["equal_rewards"])` flags groups whose rewards are all equal.
#
# ## 7. Bad against fixed

# %% tags=["figure"]
fixed_rows = grpo_crash.logged_steps(fixed_script)
grpo_crash.figure(run, died, fixed_rows, sizes.user_steps, walk)

# %% [markdown]
# ## Recap
#
# * "Floating point exception (core dumped)" is a native crash: the process dies with SIGFPE, Python prints nothing.
# * Run a suspect in a child process with `-X faulthandler`: a negative return code names the signal, the stack names the step.
# * On an H20 with torch's cu121 wheels, bf16 matrix multiplies crash: `bf16=False` avoids it, a newer cuBLAS cures it.
# * Today per-device batch × accumulation × processes is the generation batch unless you set it, and it must hold whole groups.
#
# ## Exercises
#
# Worked solutions: [`solutions/05_grpo_sigfpe.ipynb`](solutions/05_grpo_sigfpe.ipynb). One starter cell each follows.
#
# 1. With the report's 16 generations and accumulation 4, which per-device batches from 1 to 16 does
#    today's TRL accept? Predict them from the rule, then ask `grpo_crash.verdicts`.
#    <details><summary>Hint</summary>The generation batch is per-device × 4 × 1 process; it must be a
#    multiple of 16.</details>
# 2. Keep the report's per-device batch 1 and accumulation 4, and set `generation_batch_size=16`. Does
#    today's TRL accept it? What does that say about the rule?
#    <details><summary>Hint</summary><code>verdicts</code> passes extra keywords to
#    <code>GRPOConfig</code>; read the rule lines printed in section 4: which branch runs now?</details>
# 3. `how_it_ends("-c", code)` runs one line of Python. Divide `torch.tensor([5])` by 0 with
#    `torch.div(..., rounding_mode="trunc")`, then `torch.tensor([-2**63])` by -1. Which one is a SIGFPE,
#    and why is the other not?
#    <details><summary>Hint</summary>Only a division the processor itself cannot do traps; read the
#    first line each call returns.</details>

# %% tags=["exercise"]
# Exercise 1
predicted = [batch for batch in range(1, 17) if False]  # replace False by the rule
# grpo_crash.verdicts(run, num_generations=16, accumulation=4, batches=range(1, 17)) gives today's answer
print(predicted)

# %% tags=["exercise"]
# Exercise 2
extra = {}  # add generation_batch_size=16
print(grpo_crash.verdicts(run, num_generations=16, accumulation=4, batches=[1], **extra))

# %% tags=["exercise"]
# Exercise 3
code = 'import torch; print(torch.div(torch.tensor([5]), 2, rounding_mode="trunc"))'  # try the two divisions
# print(how_it_ends("-c", code))
print(code)

# %% [markdown]
# ## Checks
#
# The claims above, asserted on this run's numbers.

# %% jupyter={"source_hidden": true} tags=["checks"]
def symptom_checks(n: dict) -> dict:
    """The symptom's claims as functions of the numbers alone (a test feeds them runs without the bug)."""
    died, rule = n["died"], n["mechanism"]
    expected = {int(b): int(b) * rule["accumulation"] % rule["num_generations"] == 0 for b in n["verdicts"]}
    return {
        "the user's GRPO run dies by SIGFPE from the shell (exit 136), with no traceback (the injected stand-in)":
            injected(died["returncode"] == 136 and "Floating point exception" in (died["shell_says"] or "")
                     and not died["traceback"]),
        "today's TRL rejects the report's config three times (2 TypeErrors, the generation batch), then accepts it":
            measured([w["error"].split(":")[0] if w["error"] else None for w in n["config_walk"]]
                     == ["TypeError", "TypeError", "ValueError", None]
                     and "divisible by num_generations" in n["config_walk"][2]["error"]),
        "today's GRPOConfig accepts exactly the per-device batches whose generation batch holds whole groups":
            measured({int(b): error is None for b, error in n["verdicts"].items()} == expected
                     and len(set(expected.values())) == 2),
    }


# %% jupyter={"source_hidden": true} tags=["checks"]
def fix_checks(n: dict) -> dict:
    """The fix's claims."""
    return {
        "the portable check reads the bf16 run's death as SIGFPE, its stack inside trainer.train (the injected stand-in)":
            injected(n["check_bad"].startswith("killed by SIGFPE") and "in train" in n["check_bad"]),
        "with bf16=False the user's settings train every step on today's TRL":
            measured(n["check_fixed"] == "finished" and n["fixed_steps"] == n["user_steps"]),
    }


def checks(n: dict) -> tuple[dict, dict]:
    return symptom_checks(n), fix_checks(n)


# %% jupyter={"source_hidden": true}
numbers = {
    "died": {"returncode": died.returncode, "signal": died.signal, "shell_says": died.message,
             "traceback": "Traceback" in died.stderr or "Fatal Python error" in died.stderr},
    "config_walk": walk.steps, "mechanism": {"num_generations": 4, "accumulation": 2}, "verdicts": said,
    "check_bad": bad, "check_fixed": fixed, "fixed_steps": len(fixed_rows), "user_steps": sizes.user_steps,
}
summary = (f"The user's GRPO run with bf16=True died by {died.signal} with no traceback (the H20 bug's stand-in), "
           f"and with bf16=False trained {len(fixed_rows)} of {sizes.user_steps} steps; today's TRL rejects the report's "
           f"config {sum(bool(w['error']) for w in walk.steps)} times before per-device batch "
           f"{walk.configs[-1]['per_device_train_batch_size']} x accumulation 4 holds one group of 16.")
metrics = save_metrics(run, "05", numbers, checks, summary=summary)
print(summary)
conclude(metrics, run.output_dir)
