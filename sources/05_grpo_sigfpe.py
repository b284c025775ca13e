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
# **The report** ([TRL issue #2906](https://github.com/huggingface/trl/issues/2906)): on TRL 0.14.0,
# torch 2.5.1+cu121 and an H20 GPU, GRPO training of Qwen2.5-0.5B-Instruct with a detailed `GRPOConfig`
# died with `浮点数例外(吐核)`, the Chinese locale's `Floating point exception (core dumped)`. The
# documentation's example, `GRPOConfig(output_dir="Qwen2-0.5B-GRPO", logging_steps=10)`, ran, and
# `bf16=False` made the detailed config run too.
#
# **You will learn**
# * why a native crash (SIGFPE) leaves no traceback, and how to study it from a child process
#   (return code −8, `faulthandler`) without losing the notebook's kernel;
# * how to find the guilty setting by bisecting a config, on a real config error and on a crash;
# * how today's TRL sizes a GRPO batch (`per_device_train_batch_size` x accumulation must hold whole
#   groups of `num_generations`), and why the report's config no longer loads;
# * `frac_reward_zero_std`: the silent GRPO failure next to the loud one.
#
# **You should know** GRPO's groups and advantages
# ([TRL's GRPO trainer docs](https://huggingface.co/docs/trl/grpo_trainer)), `TrainingArguments`' precision
# flags ([transformers' Trainer docs](https://huggingface.co/docs/transformers/main_classes/trainer)),
# Python's [`faulthandler`](https://docs.python.org/3/library/faulthandler.html) and
# [`subprocess`](https://docs.python.org/3/library/subprocess.html); lesson 04 for eras (side
# environments with old versions).
#
# **Time**: 106 s to run on the cpu profile (seed 0, 2 CPU cores, one lesson at a time: `trl-clinic run 05
# --profile cpu --jobs 1`); gpu profile not measured yet. About 40 minutes to read and try the exercises.
#
# **What is real here.** The H20 crash needs an H20 GPU and cannot happen on this machine. The crash in
# the symptom and in section 5's second bisection comes from a fault **injected** on purpose
# (`trl_clinic.course.stand_ins.InjectedH20Fault`, a native SIGFPE when `bf16` is on), labelled wherever it
# appears; the process deaths, the GRPO runs, the native SIGFPE of section 2 and today's config errors
# are real. **Then**: the report's config on the real TRL 0.14.0, in an era.

# %% tags=["parameters"]
profile = "auto"  # "auto" (gpu when CUDA is present), "cpu" or "gpu"
seed = 0
output_dir = None  # None: outputs/05_grpo_sigfpe at the repository root

# %%
import subprocess
import sys

from IPython.display import Markdown, display
from trl import GRPOConfig

from trl_clinic.course import child, eras
from trl_clinic.course.companions import grpo_crash
from trl_clinic.course.crash import bisect_settings, in_process
from trl_clinic.course.parameters import start_run
from trl_clinic.course.results import failed_checks, injected, save_metrics

run = start_run("05", profile, seed, output_dir)
print(run.describe())
sizes = run.sizes  # this lesson's numbers for the profile (lessons.yaml)

# %% [markdown]
# ## 1. The symptom: the report's settings kill the run, and nothing says why
#
# The report's training settings, in today's names (section 3 shows the renames), on a minimal fp32
# config sized to a tiny Qwen2 policy, in a real GRPO run in a child process started as the user
# started theirs (no `faulthandler`). The **injected** fault stands in for the H20 bug.

# %% tags=["symptom"]
reported = dict(  # the report's GRPOConfig, verbatim
    learning_rate=5e-6, adam_beta1=0.9, adam_beta2=0.99, weight_decay=0.1, warmup_ratio=0.1,
    lr_scheduler_type="cosine", logging_steps=1, bf16=True, per_device_train_batch_size=1,
    gradient_accumulation_steps=4, num_generations=16, max_prompt_length=256, max_completion_length=200,
    num_train_epochs=1, save_steps=100, max_grad_norm=0.1, log_on_each_node=False, use_vllm=False,
    report_to="tensorboard",
)
user_settings = grpo_crash.in_todays_names(reported)  # bf16=True among them
minimal = grpo_crash.minimal_config(sizes)  # only what GRPO needs, in fp32
policies = {"random": grpo_crash.save_policy(run, "random")}
symptom = grpo_crash.grpo_in_child(run, "symptom", {**minimal, **user_settings}, policies["random"],
                                   inject_h20_fault=True, faulthandler=False).outcome  # INJECTED fault
print(f"the child was {symptom.describe()}")
print(f"a Python traceback in its output: {'Traceback' in symptom.stderr}; its last line: "
      f"{(symptom.stderr.strip().splitlines() or ['(nothing)'])[-1][-120:]!r}")

# %% [markdown]
# ## 2. What kind of crash: a real native SIGFPE
#
# A SIGFPE raised inside a C++ kernel is not a Python exception: no `try` catches it, the process
# ends with return code −8 and, without `faulthandler`, prints nothing itself. Run in the notebook, it
# would end the kernel's process. On CPU, torch has a real one: integer division of the smallest int64 by
# −1 (`trl_clinic.course.crash.native_sigfpe`). We run it in a child without faulthandler, from a shell (which
# words the report's message), and with faulthandler:

# %%
code = "from trl_clinic.course.crash import native_sigfpe; print('about to divide', flush=True); native_sigfpe()"
plain = child.run_child(["-c", code], faulthandler=False)
traced = child.run_child(["-c", code])
shell = subprocess.run(["bash", "-c", f'"{sys.executable}" -c "{code}"; exit $?'], capture_output=True, text=True)
shell_says = shell.stderr.split('"')[0].strip()  # bash's words, before the command it echoes

# %%
print("without faulthandler:", plain.describe(), "| stderr:", repr(plain.stderr))
print(f"from a shell: exit status {shell.returncode} (128 + 8), and bash says {shell_says!r}")
print("with faulthandler:   ", traced.describe())
print(traced.stderr.split("Extension modules")[0])

# %% [markdown]
# ## 3. The report's config on today's TRL
#
# Before it can crash anywhere, today's TRL must accept the config. The report's config, verbatim (with
# `output_dir` and, on a machine without a GPU, the `use_cpu=True` that today's configs need for
# `bf16=True`), walked through today's `GRPOConfig`: each real error, and the fix it calls for.

# %%
FIXES = [  # (what the error names, the fix, how it changes the config)
    ("warmup_ratio", "warmup_ratio is gone: warmup_steps takes a float in [0, 1) as a ratio",
     lambda c: {**{k: v for k, v in c.items() if k != "warmup_ratio"}, "warmup_steps": c["warmup_ratio"]}),
    ("max_prompt_length", "max_prompt_length is gone from GRPOConfig: truncate prompts in the dataset",
     lambda c: {k: v for k, v in c.items() if k != "max_prompt_length"}),
    ("divisible by num_generations", "the per-device batch counts completions, and x gradient_accumulation_steps "
     "(x processes) it must hold whole groups: per_device_train_batch_size = num_generations // accumulation",
     lambda c: {**c, "per_device_train_batch_size": c["num_generations"] // c["gradient_accumulation_steps"]}),
]
walk = grpo_crash.walk_config(reported, FIXES, build=lambda c: GRPOConfig(
    output_dir=str(run.output_dir / "runs" / "walk"), **run.cpu_flags(), **c))

# %% [markdown]
# The rule, as the installed TRL states it (`trl/trainer/grpo_config.py`, `GRPOConfig.__post_init__`),
# and the accepted config's numbers:

# %%
print("\n".join(grpo_crash.rule_lines()))
accepted = GRPOConfig(output_dir=str(run.output_dir / "runs" / "walk"), **run.cpu_flags(), **walk.configs[-1])
rule = {key: getattr(accepted, key) for key in ("per_device_train_batch_size", "gradient_accumulation_steps",
                                                "world_size", "generation_batch_size", "num_generations")}
print(rule)

# %%
display(Markdown(
    f"Today's TRL accepts `per_device_train_batch_size={rule['per_device_train_batch_size']}` with "
    f"`gradient_accumulation_steps={rule['gradient_accumulation_steps']}` on {rule['world_size']} process: "
    f"`generation_batch_size` = {rule['per_device_train_batch_size']} x {rule['gradient_accumulation_steps']} x "
    f"{rule['world_size']} = {rule['generation_batch_size']}, one group of {rule['num_generations']} completions. "
    "The per-device batch counts completions, not prompts, and a batch of 16 is not needed. The rule moved "
    "across releases (read in each release's files): TRL 0.14.0 counts *prompts* (`grpo_config.py`: "
    "\"Number of prompts sampled per device\"), so 1 was valid; 0.15.2 checks per-device batch x processes "
    "(`grpo_trainer.py`, `GRPOTrainer.__init__`); 0.17.0 also multiplies by `gradient_accumulation_steps` "
    "(`grpo_trainer.py`); `generation_batch_size` arrives in 0.18.0 (`grpo_config.py`, `__post_init__`)."))

# %% [markdown]
# ### Then: the same config on TRL 0.14.0, the report's version
#
# An *era* (a side environment built once by `make eras`) runs the real `GRPOConfig` and `GRPOTrainer`
# of 0.14.0 with the report's arguments as written (only `max_steps`, and `report_to` as tensorboard is
# not installed there, change), on a tiny random Qwen2 policy, on this CPU. It also records the `bf16`
# of a config that does not name it, as the documentation's example the report ran did not.

# %%
then = eras.run_in_era("01-trl-0.14", "then_05_grpo_config", {"reported": reported, "max_steps": 2,
                                                             "seed": run.subseed("then")}, run.output_dir / "then")
print(then.describe())
then_numbers = grpo_crash.then_numbers(then)

# %% [markdown]
# ## 4. A real GRPO run, and the report's suspects
#
# Prompts ask for words of a category ("name some pets:"); the reward is the share of the completion's
# words in that category. A short SFT warm start teaches a random policy the answer format (GRPO with
# `beta > 0` loads its reference model from the policy's path, so the warm policy is saved to a folder).

# %%
policies["warm"], warm_losses = grpo_crash.warm_start(run)
print(f"warm start: SFT loss {warm_losses[0]:.2f} -> {warm_losses[-1]:.2f}")

# %%
healthy_config = {"num_generations": sizes.generations, "per_device_train_batch_size": 4 * sizes.generations,
                  "max_completion_length": sizes.max_completion_length, "learning_rate": sizes.grpo_learning_rate,
                  "beta": 0.04, "max_steps": sizes.grpo_steps}
healthy = grpo_crash.grpo_in_child(run, "healthy", healthy_config, policies["warm"])
assert not healthy.outcome.crashed, healthy.outcome.stderr[-3000:]
healthy_rows = healthy.result
reward_start, reward_end, window = grpo_crash.reward_ends(healthy_rows)

# %%
display(Markdown(
    f"The healthy run {healthy.outcome.describe()}. After the warm start, {reward_start:.0%} of a completion's "
    f"words are in the asked category (mean reward over GRPO's first {window} steps); over the last {window} "
    f"steps, {reward_end:.0%}. KL to the reference at the end: {healthy_rows[-1]['kl']:.3f}."))

# %% [markdown]
# The report suspected its learning rate (5e-6) and its `max_grad_norm` (0.1). Each goes into the
# healthy config on its own, in a short real GRPO run from the same warm policy:

# %%
suspects = {"healthy": {}, "learning_rate": {"learning_rate": reported["learning_rate"]},
            "max_grad_norm": {"max_grad_norm": reported["max_grad_norm"]}}
suspect_runs = grpo_crash.try_suspects(run, suspects, healthy_config, policies["warm"])
gains = {name: row["reward_gain"] for name, row in suspect_runs.items()}

# %%
display(Markdown(
    ("Neither suspect crashes the run: " if all(r["status"] == "finished" for r in suspect_runs.values())
     else "A suspect crashed the run: ")
    + f"in {sizes.suspect_steps} steps the reward gains {gains['healthy']:+.3f} with the healthy settings, "
    f"{gains['learning_rate']:+.3f} with the report's learning rate and {gains['max_grad_norm']:+.3f} with its "
    "`max_grad_norm`. They change how fast this run learns, and neither ends it."))

# %% [markdown]
# ## 5. Bisecting the config
#
# Bisection starts from a config that works and the user's config that fails, and halves, as `git
# bisect` does: the shortest run of the user's settings (in the user's order) that still fails ends with
# a setting that is needed; the same halving over the settings before it, with the needed ones added,
# goes on until the needed ones fail on their own (`trl_clinic.course.crash.bisect_settings`). Each trial
# halves what is left, so n settings cost about log2(n) trials per culprit, not n.
#
# ### On a real failure: which of the user's settings does today's TRL reject?
#
# Section 3 met it: with the two removed arguments renamed, today's `GRPOConfig` still rejects the
# user's config with a message about `generation_batch_size`, a value the user never set. A failure
# Python can catch needs no child: `in_process` builds the real `GRPOConfig` for each trial.

# %%
renamed = walk.last_rejected  # the last config today's TRL rejected


def try_config(names: list[str]):
    settings = {**minimal, **{name: renamed[name] for name in names}}
    return in_process(lambda: GRPOConfig(output_dir=str(run.output_dir / "runs" / "bisect-config"),
                                         **run.cpu_flags(), **settings))


config_bisection = bisect_settings(list(renamed), try_config)
full_error = try_config(list(renamed))
print(f"{len(config_bisection.trials)} trials, {sum(t.outcome.seconds for t in config_bisection.trials):.3f} s "
      f"in all; smallest failing set: {config_bisection.culprits}\n\n{full_error.stderr}")

# %%
culprits = config_bisection.culprits or []
display(Markdown(
    f"The bisection needs {len(config_bisection.trials)} trials to name **{', '.join(culprits)}** "
    f"({', '.join(f'{name}={renamed[name]!r}' for name in culprits)}); the message "
    f"{'names it' if any(name in full_error.message for name in culprits) else 'never names it'}: "
    f"`{full_error.message}`"))

# %% [markdown]
# ### On a crash: the H20 fault, injected
#
# To show the method on a process death, the trials attach **`InjectedH20Fault`, a fault injected on
# purpose**: a `TrainerCallback` that calls `native_sigfpe()` at the first step when `bf16` is on. It
# has the crash's *shape* (a native SIGFPE tied to bf16), not its cause. Each trial is a real GRPO run
# in a child process.

# %%
def try_settings(names: list[str]):
    config = {**minimal, **{name: user_settings[name] for name in names}}
    outcome = grpo_crash.grpo_in_child(run, f"bisect-{len(names)}", config, policies["warm"],
                                       inject_h20_fault=True).outcome
    print(f"  + {names if names else 'nothing (minimal)'}: {outcome.describe()}")
    return outcome


bisection = bisect_settings(list(user_settings), try_settings)
crash = next(t.outcome for t in bisection.trials if t.outcome.crashed)
print(f"smallest failing set: {bisection.culprits}\n\nthe crash, with faulthandler:\n"
      + crash.stderr.split("Extension modules")[0][-1500:])

# %% [markdown]
# ## 6. The fix, and the silent failure next to the loud one
#
# The workaround from the report, with the injected fault still attached: the user's settings with
# `bf16=False`. That it gets past the fault is by construction (the fault fires only on bf16); that the
# rest of the user's settings train on today's TRL is measured.

# %%
workaround = grpo_crash.grpo_in_child(run, "workaround", {**minimal, **user_settings, "bf16": False},
                                      policies["warm"], inject_h20_fault=True)
print("user's settings with bf16=False:", workaround.outcome.describe(),
      f"| optimizer steps: {len(workaround.result or [])} of {minimal['max_steps']}")

# %% [markdown]
# A crash is loud. GRPO also fails silently: its advantage is a completion's reward minus the mean of
# its group (the completions for the same prompt), divided by their spread. When every completion of a
# group gets the same reward, every advantage is 0 and the group teaches nothing; TRL logs the share of
# such groups as `frac_reward_zero_std`. Here: the random policy with an all-or-nothing reward.

# %%
silent = grpo_crash.grpo_in_child(run, "zero-std", {**healthy_config, "max_steps": max(10, sizes.grpo_steps // 10)},
                                  policies["random"], reward="all_in_category_reward")
assert not silent.outcome.crashed, silent.outcome.stderr[-3000:]
silent_rows = silent.result
silent_zero_std = sum(r["frac_reward_zero_std"] for r in silent_rows) / len(silent_rows)
silent_grad = max(r["grad_norm"] for r in silent_rows)
print(f"all-or-nothing reward, random policy: mean frac_reward_zero_std {silent_zero_std:.2f}; "
      f"largest grad norm {silent_grad:.2e}; reward {silent_rows[-1]['reward']:.2f}")

# %% [markdown]
# ## 7. Compare

# %%
grpo_crash.figure(run, bisection, healthy_rows, silent_rows)

# %% [markdown]
# ## 8. What to remember
#
# * "Floating point exception (core dumped)" is a native crash: no Python traceback, no `except`.
#   Run the suspect in a child process with `python -X faulthandler` and read the return code (−8 is
#   SIGFPE) and the stack it printed.
# * Find the guilty setting by bisection between a config that works and the one that fails: halve.
#   It works on a config error too: the message names what the code checked (`generation_batch_size`),
#   the bisection names what *you* set (`per_device_train_batch_size`).
# * Today `per_device_train_batch_size` x `gradient_accumulation_steps` x processes is the generation
#   batch, and must hold whole groups of `num_generations` (installed `grpo_config.py`, printed above).
# * Watch `frac_reward_zero_std`: groups with equal rewards teach nothing, silently.
# * The H20 crash, as reported elsewhere: `Floating point exception (core dumped)` on H20 GPUs with torch's
#   cu121 wheels for a bf16 `nn.Linear` ([pytorch #133548](https://github.com/pytorch/pytorch/issues/133548),
#   torch 2.3.0+cu121) and for an fp16 `matmul` ([pytorch #152017](https://github.com/pytorch/pytorch/issues/152017),
#   torch 2.1.0+cu121), so not for bf16 alone; users in
#   [diffusers #11241](https://github.com/huggingface/diffusers/issues/11241) and
#   [Seed-Coder #11](https://github.com/ByteDance-Seed/Seed-Coder/issues/11) report that
#   `pip install nvidia-cublas-cu12==12.4.5.8` cured it. That TRL #2906 is this crash is inferred (same GPU,
#   a cu121 wheel, gone with `bf16=False`), not measured here.
#
# **The fix in your script** (H20, torch 2.5.1+cu121): `GRPOConfig(..., bf16=False)`, as the report found;
# the cure reported in the issues above is a newer cuBLAS (`pip install nvidia-cublas-cu12==12.4.5.8`).

# %% [markdown]
# ## 9. Exercise
#
# 1. Suppose the H20 fault fired only when `max_grad_norm < 1`. Give `bisect_settings` the user's
#    settings and a trial that fails exactly then. Which set does it find, and after how many trials?
#    <details><summary>Hint</summary>A trial can be <code>in_process(f)</code> on a function
#    <code>f</code> that raises when the subset's <code>max_grad_norm</code> is below 1; the user set it
#    last, so every halving keeps the longer half.</details>
# 2. Give the all-or-nothing reward to the *warm* policy. What happens to `frac_reward_zero_std`?
#    <details><summary>Hint</summary>Call <code>grpo_crash.grpo_in_child</code> with
#    <code>policies["warm"]</code> and <code>reward="all_in_category_reward"</code>; a group teaches
#    when its completions' rewards differ.</details>
# 3. Build a `GRPOConfig` with `num_generations=6` and `per_device_train_batch_size=16`. What does today's
#    TRL report, and which per-device batch sizes from 12 to 20 does it accept?
#    <details><summary>Hint</summary>Wrap each build in <code>in_process</code> and read the rule printed
#    in section 3: with one process and no accumulation the generation batch is the per-device batch.</details>
#
# Worked solutions: [`solutions/05_grpo_sigfpe.py`](solutions/05_grpo_sigfpe.py) (a test runs them).

# %% [markdown]
# ## Checks
#
# The claims above, asserted on this run's numbers.

# %% jupyter={"source_hidden": true} tags=["checks"]
def symptom_checks(n: dict) -> dict:
    """The symptom's claims as functions of the numbers alone (a test feeds them runs without the bug)."""
    crash, died = n["native_crash"], n["symptom"]
    return {
        "the user's settings kill the GRPO child with SIGFPE and no traceback (the injected stand-in)": injected(
            died["signal"] == "SIGFPE" and not died["traceback"]),
        "today's TRL rejects the report's config in three steps, then accepts it":
            [w["error"] is not None for w in n["config_walk"]] == [True, True, True, False],
        "per-device batch 4 x accumulation 4 holds the 16 generations (generation_batch_size 16)":
            n["rule"]["per_device_train_batch_size"] * n["rule"]["gradient_accumulation_steps"] == 16
            and n["rule"]["generation_batch_size"] == n["rule"]["num_generations"] == 16,
        "the child's native crash is detected as SIGFPE (return code -8)":
            crash["signal"] == "SIGFPE" and crash["returncode"] == -8,
        "a shell words it 'Floating point exception', exit status 136":
            "Floating point exception" in crash["shell_says"] and crash["shell_returncode"] == 136,
        "without faulthandler the crash leaves no message":
            "Fatal Python error" not in crash["stderr_without_faulthandler"],
        "faulthandler shows the Python stack": "native_sigfpe" in crash["stderr_with_faulthandler"],
        "bisecting today's real config error names per_device_train_batch_size alone":
            n["config_bisection"]["culprits"] == ["per_device_train_batch_size"],
        "the real config error's message does not name the guilty setting":
            bool(n["config_bisection"]["culprits"])
            and not any(name in n["config_bisection"]["message"] for name in n["config_bisection"]["culprits"]),
        "bisection names the guilty setting (bf16, the injected stand-in)": injected(n["culprits"] == ["bf16"]),
        "equal-reward groups teach nothing (frac_reward_zero_std 1, grad norm 0)":
            n["silent_frac_reward_zero_std"] == 1.0 and n["silent_max_grad_norm"] == 0.0,
    }


# %% jupyter={"source_hidden": true} tags=["checks"]
def fix_checks(n: dict) -> dict:
    """The fix's claims, and the era's (absent when the era was skipped)."""
    fix = {
        "the minimal config runs": bool(n["bisection"]) and n["bisection"][0]["status"] == "finished",
        "the user's config with bf16=False gets past the injected fault": injected(n["workaround"] == "finished"),
        "the user's settings in fp32 train every step on today's TRL": n["workaround_steps"] == n["max_steps"],
        "the healthy run finished": n["healthy"] == "finished",
        "neither the report's learning rate nor its max_grad_norm crashes a run":
            all(row["status"] == "finished" for row in n["suspects"].values()),
        "reward improves over training (by > 0.1)": n["reward_end"] > n["reward_start"] + 0.1,
    }
    if n["then"]["status"] == "finished":  # the real TRL 0.14.0
        fix["TRL 0.14.0 accepts the report's config as written and trains with it"] = (
            n["then"]["accepted"] and n["then"]["optimizer_steps"] >= 1)
        fix["TRL 0.14.0's GRPOConfig runs in fp32 unless bf16 is named"] = n["then"]["default_bf16"] is False
    return fix


def checks(n: dict) -> tuple[dict, dict]:
    return symptom_checks(n), fix_checks(n)


# %% jupyter={"source_hidden": true}
numbers = grpo_crash.numbers(
    symptom=symptom, walk=walk, rule=rule, plain=plain, traced=traced, shell=(shell.returncode, shell_says),
    bisection=bisection, config_bisection=config_bisection, full_error=full_error, workaround=workaround, healthy=healthy,
    reward_ends=(reward_start, reward_end), silent=(silent_zero_std, silent_grad), suspects=suspect_runs,
    then=then_numbers, max_steps=minimal["max_steps"])
summary = (f"A GRPO run with the report's settings died with SIGFPE and no traceback (fault injected; the H20 "
           f"bug cannot run here); bisection in child processes named {', '.join(bisection.culprits or [])} after "
           f"{len(bisection.trials)} trials, and bf16=False trained. Today's TRL rejects the report's config "
           f"until per_device_train_batch_size is {rule['per_device_train_batch_size']} (x accumulation "
           f"{rule['gradient_accumulation_steps']} = {rule['generation_batch_size']} = num_generations).")
metrics = save_metrics(run, "05", numbers, checks, summary=summary, eras=[then.to_metrics()])
assert not failed_checks(metrics), f"checks failed: {failed_checks(metrics)}"
print(summary)
print(f"all checks passed; metrics in {run.output_dir / 'metrics.json'}")
