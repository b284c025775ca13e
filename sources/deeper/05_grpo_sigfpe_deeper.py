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
# [The core](../05_grpo_sigfpe.ipynb) showed the user's GRPO run die by SIGFPE with no traceback (a fault
# injected to stand in for the H20's cuBLAS bug), today's TRL reject the report's config until the generation
# batch holds whole groups, and `bf16=False` train. Here is the evidence behind it:
#
# 1. a native crash, close up, on a real torch kernel;
# 2. the config walk through today's TRL, and where the batch rule really sits;
# 3. the rule's history, read in each release;
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
# > **Hosted** (Colab, Kaggle, a server without the repository): upload the wheel (`uv build` makes it) and run `%pip install "./trl_clinic-0.1.0-py3-none-any.whl[course]"` in a cell first.

# %% tags=["parameters"]
profile = "auto"  # "auto" (gpu when CUDA is present), "cpu" or "gpu"
seed = 0
output_dir = None  # None: outputs/05_grpo_sigfpe_deeper at the repository root

# %%
import statistics

import torch
from IPython.display import Markdown, display
from trl import GRPOConfig

from trl_clinic.course import child, eras
from trl_clinic.course.companions import lesson_05_grpo_crash as grpo_crash
from trl_clinic.course.crash import bisect_settings, in_process
from trl_clinic.course.parameters import start_run
from trl_clinic.course.results import conclude, injected, measured, save_metrics

run = start_run("05-deeper", profile, seed, output_dir)
sizes = run.sizes
print(run.describe())

# %% [markdown]
# ## 1. A native crash, close up
#
# torch on an x86 CPU has a real one: integer division of the smallest int64 by −1 overflows, and the
# processor traps it (`trl_clinic.course.crash.native_sigfpe`; on ARM, whose division does not trap, the
# process sends itself the same signal). Run in a child from a shell without `faulthandler`, as a user runs a
# script, and with it:

# %%
code = "from trl_clinic.course.crash import native_sigfpe; print('about to divide', flush=True); native_sigfpe()"
shell = child.run_child(["-c", code], faulthandler=False, shell=True, cwd=run.output_dir)
traced = child.run_child(["-c", code])
by_zero = in_process(lambda: torch.div(torch.tensor([5]), 0, rounding_mode="trunc"))
print(f"from a shell: exit status {shell.returncode}; its stderr, all of it: {shell.stderr!r}")
print("with faulthandler:", traced.describe())
print(traced.stderr.split("Extension modules")[0])
print(f"integer division by zero, by contrast: {by_zero.message} (a Python error, caught here)")

# %% [markdown]
# ## 2. The config walk, and where the rule sits
#
# The report's config, verbatim, through today's `GRPOConfig`, as in the core:

# %%
reported = dict(  # the report's GRPOConfig, verbatim (as in the core)
    learning_rate=5e-6, adam_beta1=0.9, adam_beta2=0.99, weight_decay=0.1, warmup_ratio=0.1,
    lr_scheduler_type="cosine", logging_steps=1, bf16=True, per_device_train_batch_size=1,
    gradient_accumulation_steps=4, num_generations=16, max_prompt_length=256, max_completion_length=200,
    num_train_epochs=1, save_steps=100, max_grad_norm=0.1, log_on_each_node=False, use_vllm=False,
    report_to="tensorboard",
)
walk = grpo_crash.walk_report(run, reported)

# %% [markdown]
# "Per-device batch × accumulation × processes must be a multiple of `num_generations`" holds only while
# `generation_batch_size` and `steps_per_generation` are unset: it is their default
# (`trl/trainer/grpo_config.py`, `GRPOConfig.__post_init__`). The rule itself is on `generation_batch_size`.
# The report's per-device batch 1 and accumulation 4, with each of them set:

# %%
settable = {"neither set": {}, "generation_batch_size=16": {"generation_batch_size": 16},
            "steps_per_generation=16": {"steps_per_generation": 16}}
for name, extra in settable.items():
    said = grpo_crash.verdicts(run, num_generations=16, accumulation=4, batches=[1], **extra)[1]
    settable[name] = {"error": said, **grpo_crash.generation_shape(run, 16, 4, 1, **extra)}
    print(f"{name:>24}: {said or 'accepted'}; {settable[name]}")

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
then = eras.run_in_era("01-trl-0.14", "then_05_grpo_config", {"reported": reported, "max_steps": 1,
                                                             "seed": run.subseed("then")}, run.output_dir / "then")
print(then.describe())
then_numbers = grpo_crash.then_numbers(then)

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
# Neither ends a run: they change how fast it learns (the gains above, over their first and last tenth).
#
# ## 7. The silent failure beside the loud one
#
# A crash is loud. GRPO also fails silently: a completion's advantage is its reward minus its group's mean,
# divided by the group's spread, so when every completion of a group gets the same reward, every advantage
# is 0 and the group teaches nothing; TRL logs the share of such groups as `frac_reward_zero_std`. Here: the
# policy before any warm start, with an all-or-nothing reward (1 only when every word is in the category).

# %%
silent = grpo_crash.grpo_trial(run, "zero-std", {**healthy_config, "beta": 0.0, "max_steps": sizes.silent_steps},
                               grpo_crash.policy(run), reward="all_in_category_reward")  # beta 0: no KL term
silent_rows = silent.result or []
equal_steps = [r for r in silent_rows if r["frac_reward_zero_std"] == 1.0]
print(f"{silent.outcome.describe()}; {len(equal_steps)} of {len(silent_rows)} steps had every group's rewards equal; "
      f"their largest grad norm {max((r['grad_norm'] for r in equal_steps), default=float('nan')):.2e}; "
      f"the healthy run's median {statistics.median(r['grad_norm'] for r in healthy_rows or [{'grad_norm': 0}]):.2e}")

# %%
grpo_crash.deep_figure(run, bisection, healthy_rows, silent_rows)

# %% [markdown]
# ## Checks
#
# The claims above, asserted on this run's numbers.

# %% jupyter={"source_hidden": true} tags=["checks"]
def native_checks(n: dict) -> dict:
    """The native crash's claims (section 1) as functions of the numbers alone."""
    native = n["native_crash"]
    return {
        "a torch kernel's SIGFPE kills the child: return code -8": measured(
            native["signal"] == "SIGFPE" and native["returncode"] == -8),
        "a shell words it 'Floating point exception', exit status 136": measured(
            "Floating point exception" in (native["shell_says"] or "") and native["shell_returncode"] == 136),
        "without faulthandler the crash leaves no message of its own": measured(native["shell_stderr_is_bash_only"]),
        "faulthandler shows the Python stack": measured(
            "Fatal Python error: Floating point exception" in native["stderr_with_faulthandler"]
            and "native_sigfpe" in native["stderr_with_faulthandler"]),
    }


# %% jupyter={"source_hidden": true} tags=["checks"]
def symptom_checks(n: dict) -> dict:
    """The failures' claims as functions of the numbers alone (a test feeds them runs without the bug)."""
    rule, silent = n["settable"], n["silent"]
    return {
        **native_checks(n),
        "per-device 1 x accumulation 4 is rejected for 16 generations unless generation_batch_size or "
        "steps_per_generation makes the generation batch 16": measured(
            rule["neither set"]["error"] is not None and all(rule[k]["error"] is None and rule[k]["generation_batch_size"] == 16
                                                             for k in ("generation_batch_size=16", "steps_per_generation=16"))),
        "bisecting today's real config error names per_device_train_batch_size alone": measured(
            n["config_bisection"]["culprits"] == ["per_device_train_batch_size"]),
        "the real config error's message does not name the guilty setting": measured(
            bool(n["config_bisection"]["culprits"])
            and not any(name in n["config_bisection"]["message"] for name in n["config_bisection"]["culprits"])),
        "bisection in child processes names bf16 (the injected stand-in)": injected(n["culprits"] == ["bf16"]),
        "equal-reward groups teach nothing: most groups are equal, and steps where all are have a gradient "
        "under 1e-6 of the healthy run's": measured(
            silent["mean_frac_reward_zero_std"] > 0.5 and silent["equal_steps"] >= 1
            and silent["max_equal_grad_norm"] < 1e-6 * (n["healthy_median_grad_norm"] or 0.0)),
    }


# %% jupyter={"source_hidden": true} tags=["checks"]
def fix_checks(n: dict) -> dict:
    """What works, and the real TRL 0.14.0's answers (absent when its side environment was skipped)."""
    fix = {
        "the minimal config runs": measured(bool(n["bisection"]) and n["bisection"][0]["status"] == "finished"),
        "neither the report's learning rate nor its max_grad_norm crashes a run": measured(
            all(row["status"] == "finished" for row in n["suspects"].values())),
        "reward improves over the healthy run (by > 0.1)": measured(n["reward_end"] > n["reward_start"] + 0.1),
    }
    if n["then"]["status"] == "finished":  # the real TRL 0.14.0
        then = n["then"]
        fix["TRL 0.14.0 accepts the report's config as written and trains with it"] = measured(
            then["accepted"] and then["optimizer_steps"] >= 1)
        fix["TRL 0.14.0 counts prompts: per-device batch 1 gives 16 completions a micro-batch"] = measured(
            set(then["completions_per_call"]) == {16} and "prompts" in then["batch_help"])
        fix["TRL 0.14.0's GRPOConfig runs in fp32 unless bf16 is named"] = measured(then["default_bf16"] is False)
    return fix


def checks(n: dict) -> tuple[dict, dict]:
    return symptom_checks(n), fix_checks(n)


# %% jupyter={"source_hidden": true}
numbers = grpo_crash.deep_numbers(
    shell=shell, traced=traced, by_zero=by_zero, settable=settable, config_bisection=config_bisection,
    full_error=full_error, bisection=bisection, healthy_rows=healthy_rows, reward_ends=(reward_start, reward_end),
    suspects=suspect_runs, silent_rows=silent_rows, then=then_numbers)
summary = (f"A torch kernel's SIGFPE killed its child with no message (exit 136 from a shell); bisection named "
           f"{', '.join(config_bisection.culprits or [])} for today's config error and "
           f"{', '.join(bisection.culprits or [])} for the injected crash in {len(bisection.trials)} child runs; "
           f"neither suspect crashed, reward rose {reward_start:.2f} -> {reward_end:.2f}; TRL 0.14.0 "
           f"{'accepts' if then_numbers.get('accepted') else 'was not run on'} the report's config.")
metrics = save_metrics(run, "05-deeper", numbers, checks, summary=summary, eras=[then.to_metrics()])
print(summary)
conclude(metrics, run.output_dir)
