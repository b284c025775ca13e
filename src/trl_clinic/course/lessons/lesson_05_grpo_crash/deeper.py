# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 05 deeper · GRPO's SIGFPE: the native crash, the rule's history, the report's TRL, bisection, the suspects
#
# [The core](../05_grpo_sigfpe.ipynb) showed the user's GRPO script die by SIGFPE with no traceback (a fault
# injected to stand in for the H20's cuBLAS bug), how a child process and faulthandler read it, and `bf16=False`
# train with the same stand-in attached. Here is the evidence around it:
#
# 1. a native crash, close up, on a real torch kernel, against a division torch checks;
# 2. the report's config on today's TRL, and GRPO's generation batch as groups;
# 3. the batch rule's history, read in each release;
# 4. the report's own config on the report's TRL (0.14.0), run in a side environment;
# 5. bisection: on a real config error, and on the injected crash;
# 6. the report's suspects (learning rate, `max_grad_norm`) on a run that learns;
# 7. the silent failure beside the loud one: `frac_reward_zero_std`.
#
# **What is real here:** every process death, every GRPO run and config error, the torch kernel's SIGFPE
# of section 1 and the old TRL of section 4; the crash bisected in section 5 is the core's injected
# stand-in (`stand_ins.InjectedH20Fault`, a native SIGFPE at the first step when `bf16` is on), labelled
# wherever it appears.
#
# > **Hosted** (Colab, Kaggle, no clone): upload the wheel `uv build` makes, then run `%pip install "./trl_clinic-0.1.0-py3-none-any.whl[course]"` first.

# %% tags=["parameters"]
profile = "auto"  # "auto" (gpu when CUDA is present), "cpu" or "gpu"
seed = 0
output_dir = None  # None: outputs/05_grpo_sigfpe_deeper at the repository root

# %%
import trl_clinic.course  # first: the lessons' offline mode, and two optional libraries' warnings kept quiet

import torch
from IPython.display import Markdown, display
from trl import GRPOConfig

from trl_clinic.course import child, eras
from trl_clinic.course.lessons.lesson_05_grpo_crash import companion as grpo_crash
from trl_clinic.course.crash import bisect_settings, in_process
from trl_clinic.course.parameters import start_run
from trl_clinic.course.results import check

run = start_run("05-deeper", profile, seed, output_dir)
sizes = run.sizes
print(run.describe())

# %% [markdown]
# ## 1. A native crash, close up
#
# torch on an x86 CPU has a real one: integer division of the smallest int64 by −1 overflows, and the
# processor traps it (`trl_clinic.course.crash.native_sigfpe`; an ARM processor's division does not trap).
# `divide_and_report` writes a line after the division, so a child that never writes it died in the kernel. Run
# from a shell without `faulthandler`, as a user runs a script, and with it; then the same for a division by
# zero, which torch checks itself:

# %%
divisions = {"overflow": "from trl_clinic.course.crash import divide_and_report; divide_and_report()",
             "by zero": "import torch; torch.div(torch.tensor([5]), 0, rounding_mode='trunc')"}
native = {}
for name, code in divisions.items():
    shell = child.run_child(["-c", code], faulthandler=False, shell=True, cwd=run.output_dir)
    traced = child.run_child(["-c", code])
    native[name] = grpo_crash.native_record(shell, traced)
    print(f"{name}: from a shell, exit status {shell.returncode}, its stderr: {shell.stderr.strip()[-100:]!r}")
    print(f"{name}: with faulthandler, {traced.describe()}\n{traced.stderr.split('Extension modules')[0].strip()}\n")

# %% [markdown]
# ## 2. The report's config on today's TRL, and the generation batch as groups
#
# The report's config, verbatim, through today's `GRPOConfig`: each real error and its fix.

# %%
reported = dict(  # the report's GRPOConfig, verbatim (as in the core)
    learning_rate=5e-6, adam_beta1=0.9, adam_beta2=0.99, weight_decay=0.1, warmup_ratio=0.1,
    lr_scheduler_type="cosine", logging_steps=1, bf16=True, per_device_train_batch_size=1,
    gradient_accumulation_steps=4, num_generations=16, max_prompt_length=256, max_completion_length=200,
    num_train_epochs=1, save_steps=100, max_grad_norm=0.1, log_on_each_node=False, use_vllm=False,
    report_to="tensorboard",
)
walk = grpo_crash.walk_report(run, reported)
print("the walk's last config, as it stands:")
accepted_walk = grpo_crash.walk_report(run, walk.configs[-1])

# %% [markdown]
# GRPO samples `num_generations` completions per prompt and scores each against its group's mean. It generates
# completions for several micro-batches together, the generation batch: unless you set `generation_batch_size`
# or `steps_per_generation`, per-device batch × accumulation × processes, and it must split into whole groups.
# Two small configs with 4 generations and accumulation 2, and today's verdict on per-device batches 1 to 8:

# %%
said = grpo_crash.verdicts(run, num_generations=4, accumulation=2, batches=range(1, 9))
grpo_crash.draw_groups(run, 4, 2, (4, 3), said)
print("\n".join(grpo_crash.rule_lines()))  # the installed grpo_config.py
print({batch: "accepted" if error is None else error for batch, error in said.items()})

# %% [markdown]
# The rule itself is on `generation_batch_size`; per-device × accumulation × processes is only its default.
# The report's per-device batch 1 and accumulation 4, with neither set, and with each of them set:

# %%
settable = {"neither set": {}, "generation_batch_size=16": {"generation_batch_size": 16},
            "steps_per_generation=16": {"steps_per_generation": 16}}
for name, extra in settable.items():
    answer = grpo_crash.verdicts(run, num_generations=16, accumulation=4, batches=[1], **extra)[1]
    settable[name] = {"error": answer, **grpo_crash.generation_shape(run, 16, 4, 1, **extra)}
    print(f"{name:>24}: {answer or 'accepted'}; {settable[name]}")

# %% [markdown]
# ## 3. The rule's history, read in each release
#
# Read in each release's wheel (`pip download --no-deps trl==X`); the installed one printed below.
#
# | TRL | `per_device_train_batch_size` counts | what must divide by `num_generations` | where |
# |---|---|---|---|
# | 0.14.0 (the report's) | prompts: "Number of prompts sampled per device for training. The actual batch passed into the model will be this value multiplied by `num_generations`." | nothing: every prompt brings its whole group | `grpo_config.py`; no check in `grpo_trainer.py` |
# | 0.15.2, 0.16.0 | completions | per-device × processes | `grpo_trainer.py`, `GRPOTrainer.__init__` |
# | 0.17.0 | completions | per-device × processes × accumulation | `grpo_trainer.py`, `GRPOTrainer.__init__` |
# | 0.18.0 | completions | `generation_batch_size` (default per-device × processes × `steps_per_generation`, which defaults to accumulation) | `grpo_config.py`, `GRPOConfig.__post_init__` |
# | installed | completions | the same | printed below |
#
# So the report's config (per-device 1, accumulation 4, 16 generations, one process) was valid on 0.14.0,
# is rejected by 0.15.2-0.16.0 (1 is not a multiple of 16) and by 0.17.0 and later (4 is not).

# %%
print("\n".join(grpo_crash.rule_lines()))

# %% [markdown]
# ## 4. The report's TRL: 0.14.0, in a side environment
#
# A side environment (built once by `make eras`, under `.eras/`) runs the real `GRPOConfig` and `GRPOTrainer`
# of TRL 0.14.0 with the report's arguments as written (only `max_steps`, and `report_to` as tensorboard is
# not installed there, change), on a tiny random Qwen2 policy, on this CPU.

# %%
then = eras.run_in_era("01-trl-0.14", "then_05", {"reported": reported, "max_steps": 1,
                                                             "seed": run.subseed("then")}, run.output_dir / "then")
print(then.describe())
then_numbers = grpo_crash.then_numbers(then)
today_trl = grpo_crash.today_answers(run, walk)
print(f"today's TRL {today_trl['trl']}: accepted as written {today_trl['accepted']}; per_device_train_batch_size's "
      f"help {today_trl['batch_help']!r}; a GRPOConfig that does not name bf16 has bf16={today_trl['default_bf16']}")

# %% [markdown]
# Its `GRPOConfig` has no `bf16` of its own and inherits `TrainingArguments`' default (False, printed above),
# so the documentation's example the user ran, which does not name `bf16`, ran in fp32: consistent with it
# working where the detailed config with `bf16=True` crashed.
#
# ## 5. Bisection
#
# Bisection starts from a config that works and the user's config that fails, and halves, as `git bisect`
# does (`trl_clinic.course.crash.bisect_settings`): the shortest run of the user's settings (in the user's
# order) that still fails ends with a setting that is needed; the same halving over the settings before
# it, with the needed ones added, goes on until the needed ones fail on their own. n settings cost about
# log2(n) trials per culprit, not n.
#
# ### On a real failure: which setting does today's TRL reject?
#
# With the two removed arguments renamed, today's `GRPOConfig` still rejects the user's config with a
# message about `generation_batch_size`, a value the user never set. A Python error needs no child:
# `in_process` builds the real `GRPOConfig` for each trial.

# %%
renamed = walk.last_rejected  # the last config today's TRL rejected
minimal = {**grpo_crash.grpo_sizes(run), "max_steps": 2, "bf16": False}  # what GRPO needs, in fp32


def try_config(names: list[str]):
    settings = {**minimal, **{name: renamed[name] for name in names}}
    return in_process(lambda: GRPOConfig(output_dir=str(run.output_dir / "runs" / "bisect-config"),
                                         **run.cpu_flags(), **settings))


config_bisection = bisect_settings(list(renamed), try_config)
full_error = try_config(list(renamed))
print(f"{len(config_bisection.trials)} trials; smallest failing set: {config_bisection.culprits}\n{full_error.message}")
renamed = walk.configs[-1]  # the config today's TRL accepted: nothing to find
accepted_bisection = bisect_settings(list(renamed), try_config)
print(f"the accepted config: {len(accepted_bisection.trials)} trials, smallest failing set "
      f"{accepted_bisection.culprits}")

# %% [markdown]
# ### On a crash: the injected stand-in
#
# Each trial is a real GRPO run in a child process with `InjectedH20Fault` attached (a fault injected on
# purpose: a native SIGFPE at the first step when `bf16` is on; it has the crash's shape, not its cause).
# The children fork from a server process that imported TRL once (`child.forked`), so a trial costs its
# own work, not Python's start-up, and a crash still kills only that child.

# %%
user_settings = grpo_crash.in_todays_names(reported)


def try_settings(names: list[str]):
    config = {**minimal, **{name: user_settings[name] for name in names}}
    return grpo_crash.grpo_trial(run, f"bisect-{len(names)}", config, grpo_crash.policy(run),
                                 h20_stand_in=True).outcome


bisection = bisect_settings(list(user_settings), try_settings)
for trial in bisection.trials:
    print(f"{trial.phase:>8} + {trial.settings or 'nothing (minimal)'}: {trial.outcome.describe()}")
crash = next((t.outcome for t in bisection.trials if t.outcome.crashed), None)
print(f"smallest failing set: {bisection.culprits}\n\n" + (crash.stderr.split("Extension modules")[0][-1200:] if crash else ""))

# %% [markdown]
# The same bisection over the user's settings with the fix, `bf16=False`, and the stand-in still attached:

# %%
user_settings = {**grpo_crash.in_todays_names(reported), "bf16": False}
fixed_bisection = bisect_settings(list(user_settings), try_settings)
for trial in fixed_bisection.trials:
    print(f"{trial.phase:>8} + {trial.settings or 'nothing (minimal)'}: {trial.outcome.describe()}")
print(f"smallest failing set: {fixed_bisection.culprits}")

# %% [markdown]
# ## 6. The report's suspects, on a run that learns
#
# Prompts ask for words of a category ("name some pets:"); the reward is the share of the completion's
# words in that category. A short SFT warm start teaches the policy the answer format; GRPO with
# `beta > 0` loads its reference model from the policy's folder.

# %%
warm, warm_losses = grpo_crash.warm_start(run)
healthy_config = {**grpo_crash.grpo_sizes(run, prompts=sizes.prompts_per_step), "beta": 0.04,
                  "learning_rate": sizes.grpo_learning_rate, "max_steps": sizes.grpo_steps}
healthy = grpo_crash.grpo_trial(run, "healthy", healthy_config, warm)
healthy_rows = healthy.result or []
reward_start, reward_end, window = grpo_crash.reward_ends(healthy_rows) if healthy_rows else (0.0, 0.0, 0)
print(f"warm start: SFT loss {warm_losses[0]:.2f} -> {warm_losses[-1]:.2f}; GRPO {healthy.outcome.describe()}")

# %%
display(Markdown(
    f"After the warm start, {reward_start:.0%} of a completion's words are in the asked category (mean reward "
    f"over GRPO's first {window} steps); over the last {window} steps, {reward_end:.0%}; KL to the reference at "
    f"the end: {healthy_rows[-1]['kl'] if healthy_rows else float('nan'):.3f}."))

# %% [markdown]
# The report suspected its learning rate (5e-6) and its `max_grad_norm` (0.1). Each goes into the healthy
# config on its own, in a short real GRPO run from the same warm policy:

# %%
suspects = {"learning_rate": {"learning_rate": reported["learning_rate"]},
            "max_grad_norm": {"max_grad_norm": reported["max_grad_norm"]}}
suspect_runs = grpo_crash.try_suspects(run, suspects, healthy_config, warm)

# %% [markdown]
# Neither ends a run: they change how fast it learns (the gains above, over their first and last tenth). That
# they finish is no evidence for the H20: on this CPU nothing in them could crash; it says only that the report's
# two suspects are not what kills a GRPO run.
#
# ## 7. The silent failure beside the loud one
#
# A crash is loud. GRPO also fails silently: a completion's advantage is its reward minus its group's mean,
# divided by the group's spread, so when every completion of a group gets the same reward, every advantage
# is 0 and the group teaches nothing; TRL logs the share of such groups as `frac_reward_zero_std`. The policy
# before any warm start, two runs that differ only in the reward: all-or-nothing (1 only when every word is in
# the category) and partial credit (the share of words in the category).

# %%
zero_std = {}
for reward in ("all_in_category_reward", "category_reward"):
    ran = grpo_crash.grpo_trial(run, f"zero-std-{reward}", {**healthy_config, "beta": 0.0,
                                "max_steps": sizes.silent_steps}, grpo_crash.policy(run), reward=reward)
    zero_std[reward] = ran.result or []
    rows = zero_std[reward]
    print(f"{reward:>22}: {ran.outcome.describe()}; mean frac_reward_zero_std "
          f"{sum(r['frac_reward_zero_std'] for r in rows) / max(1, len(rows)):.2f}; largest grad norm of a step whose "
          f"groups were all equal {max((r['grad_norm'] for r in rows if r['frac_reward_zero_std'] == 1.0), default=None)}")

# %% [markdown]
# A step whose groups are all equal has a gradient of exactly 0 here, by construction: every advantage is 0, and
# `beta=0` leaves no KL term. What can go either way is how often the groups are equal, which the reward decides.

# %%
grpo_crash.deep_figure(run, bisection, zero_std)

# %% [markdown]
# ## Checks
#
# The claims above, asserted on this run's numbers.

# %% jupyter={"source_hidden": true}
numbers = grpo_crash.deep_numbers(
    native=native, walks=(walk, accepted_walk), verdicts=said, settable=settable,
    config_bisections=(config_bisection, accepted_bisection), full_error=full_error,
    crash_bisections=(bisection, fixed_bisection), healthy_rows=healthy_rows, suspects=suspect_runs,
    zero_std=zero_std, then=then_numbers, today_trl=today_trl)
era_metrics = [then.to_metrics()]
check(run, numbers, eras=era_metrics)
