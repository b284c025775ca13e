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
# **The report** ([TRL issue #2906](https://github.com/huggingface/trl/issues/2906)): TRL 0.14.0,
# torch 2.5.1+cu121, an H20 GPU, Qwen2.5-0.5B-Instruct. With a detailed `GRPOConfig` the process died
# with `Floating point exception (core dumped)` and no Python traceback; the documentation's minimal
# config ran; `bf16=False` fixed it.
#
# **The real cause** (from the PyTorch, vLLM and diffusers trackers: pytorch #133548, vllm #2798 and
# #4392): bf16 matrix products on H20 GPUs with the cuBLAS that torch's cu121 wheels shipped hit an
# integer division by zero inside cuBLASLt, a native SIGFPE. The fix is a newer cuBLAS
# (`pip install nvidia-cublas-cu12==12.4.5.8`) or newer torch wheels; the workaround, `bf16=False`.
# In TRL 0.14 the minimal config ran in fp32, which is why it "worked".
#
# **What you will learn here** is how to find such a cause yourself: a crash that kills the process
# cannot be caught in Python and, in Jupyter, takes the kernel and all its state with it. So the run
# goes to a child process, its death is read from outside, and the guilty setting is found by
# bisecting the config. Along the way: the report's config on today's TRL, a real GRPO run, and the
# *silent* GRPO failure that sits next to the loud one.
#
# **Time**: about 2 minutes on the cpu profile (2 CPU cores); `trl-clinic list` shows what each profile runs.
#
# The H20 crash itself cannot happen here. The bisection runs twice: first on a **real** failure
# (today's TRL rejects the user's config, and the error names a value the user never set), then on
# a crash from a fault **injected** on purpose (`trl_clinic.stand_ins.InjectedH20Fault`, labelled
# wherever it appears). The config errors, the GRPO runs, the native crash and the process deaths
# are real.

# %% tags=["parameters"]
profile = "auto"  # "auto" (gpu when CUDA is present), "cpu" or "gpu"
seed = 0
output_dir = None  # None: outputs/05_grpo_sigfpe at the repository root

# %%
from IPython.display import Markdown, display
from trl import GRPOConfig, SFTConfig, SFTTrainer

from trl_clinic import child, data, eras, plotting
from trl_clinic.crash import bisect_settings, in_process
from trl_clinic.models import make_causal_lm
from trl_clinic.parameters import start_run
from trl_clinic.recording import StepRecorder
from trl_clinic.results import failed_checks, injected, save_metrics
from trl_clinic.tokenizer import build_tokenizer

run = start_run("05", profile, seed, output_dir)
print(run.describe())
sizes = run.sizes  # this lesson's numbers for the profile (lessons.yaml)
MODEL_SIZE, GENERATIONS = sizes.model_size, sizes.generations

# %% [markdown]
# ## 1. The report's config on today's TRL
#
# The config from the report, verbatim (with `output_dir` and, on a machine without a GPU, the
# `use_cpu=True` that today's configs need for `bf16=True`). Today it fails long before any GPU
# kernel runs; each error, its message and its fix:

# %%
reported = dict(
    learning_rate=5e-6, adam_beta1=0.9, adam_beta2=0.99, weight_decay=0.1, warmup_ratio=0.1,
    lr_scheduler_type="cosine", logging_steps=1, bf16=True, per_device_train_batch_size=1,
    gradient_accumulation_steps=4, num_generations=16, max_prompt_length=256, max_completion_length=200,
    num_train_epochs=1, save_steps=100, max_grad_norm=0.1, log_on_each_node=False, use_vllm=False,
    report_to="tensorboard",
)
FIXES = [  # (what the error names, the fix, how it changes the config)
    ("warmup_ratio", "warmup_ratio is gone: warmup_steps takes a float in [0, 1) as a ratio",
     lambda c: {**{k: v for k, v in c.items() if k != "warmup_ratio"}, "warmup_steps": c["warmup_ratio"]}),
    ("max_prompt_length", "max_prompt_length is gone from GRPOConfig: truncate prompts in the dataset",
     lambda c: {k: v for k, v in c.items() if k != "max_prompt_length"}),
    ("divisible by num_generations",
     "since TRL 0.15 the per-device batch counts completions, not prompts: 16 generations of one prompt "
     "need per_device_train_batch_size=16 (or fewer generations)",
     lambda c: {**c, "per_device_train_batch_size": 16}),
]
config, walk, walked = dict(reported), [], []
for _ in range(len(FIXES) + 1):
    walked.append(dict(config))
    try:
        GRPOConfig(output_dir=str(run.output_dir / "runs" / "walk"), **run.cpu_flags(), **config)
        walk.append({"error": None, "fix": None})
        print("accepted")
        break
    except (TypeError, ValueError) as error:
        fix = next(((text, change) for key, text, change in FIXES if key in str(error)), None)
        walk.append({"error": f"{type(error).__name__}: {error}", "fix": fix[0] if fix else None})
        print(f"{type(error).__name__}: {error}\n   fix: {fix[0] if fix else 'none known: stop'}")
        if fix is None:
            break
        config = fix[1](config)

# %% [markdown]
# ### Then: the same config on TRL 0.14.0, the report's version
#
# The report was written for TRL 0.14.0, where `per_device_train_batch_size` counted prompts and
# `warmup_ratio` and `max_prompt_length` still existed. An *era* (a side environment built once by
# `make eras`) runs the real `GRPOConfig` and `GRPOTrainer` of 0.14.0 with the report's arguments as
# written (only `max_steps`, and `report_to` as tensorboard is not installed there, change), on a
# tiny random Qwen2 policy. On this CPU it does not crash: the crash needs an H20 and the old cuBLAS.

# %%
then = eras.run_in_era("01-trl-0.14", "then_05_grpo_config", {"reported": reported, "max_steps": 2,
                                                             "seed": run.subseed("then")}, run.output_dir / "then")
print(then.describe())
then_numbers = {"status": then.status}
if then.finished:
    then_numbers.update(accepted=then.result["config_accepted_as_written"], error=then.result["error"],
                        optimizer_steps=then.result["optimizer_steps"], changed=then.result["changed_for_the_run"])
    print(f"TRL 0.14.0 accepts the report's config as written: {then.result['config_accepted_as_written']}; "
          f"{then.result['optimizer_steps']} real GRPO steps ran (changed for the run: {then.result['changed_for_the_run']})")

# %% [markdown]
# ## 2. A real GRPO run
#
# A tiny Qwen2-style policy, prompts that ask for words of a category ("name some pets:") and a
# programmatic reward: the share of the completion's words that belong to the asked category.
# A randomly initialised policy almost never answers in words at all, so a short SFT warm start
# teaches the format (and gets half the words right); GRPO has to do the rest.
#
# GRPO (with `beta > 0`) builds its reference model by loading the policy again from its path, so
# the warm policy is saved to a folder and given to the trainer by path.

# %%
tokenizer = build_tokenizer()
warm_policy = make_causal_lm(tokenizer, "qwen2", size=MODEL_SIZE, seed=run.seed)
warm_start = SFTTrainer(
    model=warm_policy,
    args=SFTConfig(**run.trainer_kwargs("warm-start"), per_device_train_batch_size=16, learning_rate=3e-3,
                   max_steps=sizes.warm_start_steps),
    train_dataset=data.word_lists(16 * sizes.warm_start_steps, seed=run.subseed("warm start")),
    processing_class=tokenizer,
)
warm_log = StepRecorder().watch(warm_start)
warm_start.train()
policies = {"warm": run.output_dir / "policy-warm", "random": run.output_dir / "policy-random"}
warm_policy.save_pretrained(policies["warm"])
make_causal_lm(tokenizer, "qwen2", size=MODEL_SIZE, seed=run.seed).save_pretrained(policies["random"])
for path in policies.values():
    tokenizer.save_pretrained(path)
print(f"warm start: SFT loss {warm_log.series('loss')[1][0]:.2f} -> {warm_log.last('loss'):.2f}")

# %% [markdown]
# Every GRPO run of this lesson runs in a child process: `train_grpo` below, started by
# `trl_clinic.child.call`, which hands it this run (device, precision, sizes) and a spec (the
# `GRPOConfig` arguments and a few switches) and brings back its per-step history, or how it died.

# %%
# %%writefile {run.output_dir}/grpo_child.py
"""Lesson 05's GRPO runs, each in its own process: `train_grpo(run, spec)` returns the per-step history."""
from trl import GRPOConfig, GRPOTrainer

from trl_clinic import data
from trl_clinic.recording import StepRecorder
from trl_clinic.stand_ins import InjectedH20Fault
from trl_clinic.tokenizer import build_tokenizer


def train_grpo(run, spec):
    trainer = GRPOTrainer(
        model=spec["policy"],  # a path: GRPO loads the reference model from it too
        reward_funcs=getattr(data, spec["reward"]),
        args=GRPOConfig(**{**run.trainer_kwargs(spec["name"]), **spec["config"]}),
        train_dataset=data.reward_prompts(4096, seed=run.subseed("prompts")),
        processing_class=build_tokenizer(),
    )
    if spec["inject_h20_fault"]:
        trainer.add_callback(InjectedH20Fault())  # INJECTED: a labelled stand-in for the H20 bug
    recorder = StepRecorder().watch(trainer)
    trainer.train()
    return recorder.history


# %%
def grpo_in_child(name: str, config: dict, policy: str = "warm", reward: str = "category_reward",
                  inject_h20_fault: bool = False) -> child.ChildRun:
    spec = {"name": name, "config": config, "policy": str(policies[policy]), "reward": reward,
            "inject_h20_fault": inject_h20_fault}
    return child.call(run, f"{run.output_dir}/grpo_child.py:train_grpo", spec, name=f"grpo_{name}",
                      timeout=sizes.child_timeout_s)


def reward_ends(rows: list[dict]) -> tuple[float, float, int]:
    """Mean reward over the first and the last tenth of a run, and how many steps a tenth is."""
    window = max(1, len(rows) // 10)
    return (sum(r["reward"] for r in rows[:window]) / window, sum(r["reward"] for r in rows[-window:]) / window,
            window)


healthy_config = {"num_generations": GENERATIONS, "per_device_train_batch_size": 4 * GENERATIONS,
                  "max_completion_length": sizes.max_completion_length, "learning_rate": sizes.grpo_learning_rate,
                  "beta": 0.04, "max_steps": sizes.grpo_steps}
healthy = grpo_in_child("healthy", healthy_config)
print("healthy run:", healthy.outcome.describe())
assert not healthy.outcome.crashed, healthy.outcome.stderr[-3000:]
healthy_rows = healthy.result
rewards = [row["reward"] for row in healthy_rows]
reward_start, reward_end, window = reward_ends(healthy_rows)
print(f"mean reward, first {window} steps: {reward_start:.3f}; last {window} steps: {reward_end:.3f}")
print(f"KL at the end: {healthy_rows[-1]['kl']:.3f}; frac_reward_zero_std over the run: "
      f"{sum(r['frac_reward_zero_std'] for r in healthy_rows) / len(healthy_rows):.2f}")

# %% [markdown]
# ### The report's suspects: learning rate and `max_grad_norm`
#
# The report suspected its learning rate (5e-6) and its `max_grad_norm` (0.1). Each goes into the
# healthy config on its own, in a real GRPO run of a few dozen steps from the same warm policy:


# %%
suspects = {"healthy": {}, "report's learning_rate": {"learning_rate": config["learning_rate"]},
            "report's max_grad_norm": {"max_grad_norm": config["max_grad_norm"]}}
suspect_runs = {}
for name, change in suspects.items():
    tried = grpo_in_child(f"suspect-{len(suspect_runs)}", {**healthy_config, **change, "max_steps": sizes.suspect_steps})
    print(f"{name:>24} {change or ''}: {tried.outcome.describe()}")
    start, end, _ = reward_ends(tried.result) if tried.result else (None, None, None)
    suspect_runs[name] = {"change": change, "status": tried.outcome.status,
                          "reward_gain": end - start if tried.result else None,
                          "max_grad_norm_seen": max(r["grad_norm"] for r in tried.result) if tried.result else None}
    if tried.result:
        print(f"{'':>24} reward gain {end - start:+.3f}")
gains = {name: row["reward_gain"] for name, row in suspect_runs.items()}
lr_gain, clip_gain = gains["report's learning_rate"], gains["report's max_grad_norm"]
display(Markdown(
    ("Neither suspect crashes the run: " if all(r["status"] == "finished" for r in suspect_runs.values())
     else "A suspect crashed the run: ")
    + f"in {sizes.suspect_steps} steps the reward gains {gains['healthy']:+.3f} with the healthy settings, "
    f"{lr_gain:+.3f} with the report's learning rate and {clip_gain:+.3f} with its `max_grad_norm`. A learning "
    "rate or a clipping threshold changes how fast a run learns; neither makes a process die with a floating "
    "point exception."))

# %% [markdown]
# ## 3. What a native crash looks like
#
# A SIGFPE raised inside a C++ kernel is not a Python exception: no `try` catches it, the process
# ends with return code −8 (shell: 136, "Floating point exception (core dumped)") and, without
# `faulthandler`, prints nothing at all. Run in the notebook, it kills the kernel.
#
# On CPU, torch has a real one: integer division of the smallest int64 by −1
# (`trl_clinic.crash.native_sigfpe`). We run it in a child, once without and once with faulthandler:

# %%
code = "from trl_clinic.crash import native_sigfpe; print('about to divide', flush=True); native_sigfpe()"
plain = child.run_child(["-c", code], faulthandler=False)
traced = child.run_child(["-c", code])
print("without faulthandler:", plain.describe(), "| stderr:", repr(plain.stderr))
print("with faulthandler:   ", traced.describe())
print(traced.stderr.split("Extension modules")[0])

# %% [markdown]
# ## 4. Bisecting the config
#
# Bisection starts from a config that works and adds the user's settings until it fails: first one
# by one, in the user's order (a ladder), until a trial fails; then by halving, until the smallest
# set that still fails is left (`trl_clinic.crash.bisect_settings`).
#
# The minimal config is the documentation's, run the way TRL 0.14 ran it (fp32), sized to our tiny
# policy.
#
# ### On a real failure: which of the user's settings does today's TRL reject?
#
# Section 1 met it: with the two removed arguments renamed, today's `GRPOConfig` still rejects the
# user's config, and the message names `generation_batch_size`, a value the user never set. Which
# of the user's settings is to blame? A failure Python can catch needs no child process:
# `trl_clinic.crash.in_process` builds the real `GRPOConfig` for each trial and reports how it ended.

# %%
minimal = {"num_generations": GENERATIONS, "per_device_train_batch_size": GENERATIONS,
           "max_completion_length": sizes.max_completion_length, "max_steps": 2, "bf16": False}
renamed = [seen for seen, step in zip(walked, walk) if step["error"]][-1]  # the last config today's TRL rejected


def try_config(names: list[str]):
    settings = {**minimal, **{name: renamed[name] for name in names}}
    outcome = in_process(lambda: GRPOConfig(output_dir=str(run.output_dir / "runs" / "bisect-config"),
                                            **run.cpu_flags(), **settings))
    shown = names if len(names) <= 3 else f"{len(names)} settings: {', '.join(names[:2])}, ..., {names[-1]}"
    print(f"  + {shown or 'nothing (minimal)'}: {outcome.describe()}")
    return outcome


config_bisection = bisect_settings(list(renamed), try_config)
config_error = next(t.outcome for t in config_bisection.trials if t.outcome.crashed)
full_error = try_config(list(renamed))
print(f"\n{len(config_bisection.trials)} trials, {sum(t.outcome.seconds for t in config_bisection.trials):.3f} s "
      f"in all; smallest failing set: {config_bisection.culprits}")
print("\nthe user's whole config, as today's TRL rejects it:\n" + full_error.stderr)

# %%
culprit_named = any(name in full_error.message for name in config_bisection.culprits or [])
display(Markdown(
    f"The bisection needs {len(config_bisection.trials)} trials to name **{', '.join(config_bisection.culprits or [])}**"
    f" ({', '.join(f'{name}={renamed[name]!r}' for name in config_bisection.culprits or [])}); the message "
    f"{'names it' if culprit_named else 'never names it'}: `{full_error.message}` Since TRL 0.15 "
    "`generation_batch_size` is `per_device_train_batch_size` x `gradient_accumulation_steps` (x processes) "
    "and counts *completions*, so it must hold whole groups of `num_generations`. In TRL 0.14, where the "
    "report's config was written, the per-device batch counted prompts and 1 was a valid value."))

# %% [markdown]
# ### On a crash: the H20 fault, injected
#
# The H20 + cuBLAS crash cannot happen on this machine. To show the method on a real process death,
# the child runs attach **`InjectedH20Fault`, a fault injected on purpose**: a `TrainerCallback` that
# calls `native_sigfpe()` at the first step when `bf16` is on. It reproduces the crash's *shape* (a
# native SIGFPE tied to bf16), not its cause. Everything else below is real: real child processes,
# real GRPO runs, real process deaths.
#
# The user's settings (with the batch fixed, so the config is accepted) go to the same bisection;
# each trial is now a GRPO run in a child process.

# %%
user_settings = {key: config[key] for key in ("learning_rate", "adam_beta1", "adam_beta2", "weight_decay",
                                              "warmup_steps", "lr_scheduler_type", "bf16",
                                              "gradient_accumulation_steps", "max_grad_norm")}


def try_settings(names: list[str]):
    outcome = grpo_in_child(f"bisect-{len(names)}", {**minimal, **{n: user_settings[n] for n in names}},
                            inject_h20_fault=True).outcome
    print(f"  + {names if names else 'nothing (minimal)'}: {outcome.describe()}")
    return outcome


bisection = bisect_settings(list(user_settings), try_settings)
print("smallest failing set:", bisection.culprits)
crash = next(t.outcome for t in bisection.trials if t.outcome.crashed)
print("\nthe crash as the child printed it:\n" + crash.stderr.split("Extension modules")[0][-1500:])

# %% [markdown]
# ## 5. The fix, and the silent failure next to the loud one
#
# The workaround from the report: the user's full config with `bf16=False` (the injected fault still
# attached) runs. On a real H20 the better fix is `nvidia-cublas-cu12==12.4.5.8` or a newer torch.
#
# A crash is loud. GRPO also fails silently: its advantage is the reward minus the mean of the group
# of completions for the same prompt, divided by their spread. When every completion of a group gets
# the same reward, every advantage is 0 and the group teaches nothing. TRL logs the share of such
# groups as `frac_reward_zero_std`. Here: the random-init policy with an all-or-nothing reward.

# %%
workaround = grpo_in_child("workaround", {**minimal, **user_settings, "bf16": False}, inject_h20_fault=True).outcome
print("user's config with bf16=False:", workaround.describe())

silent = grpo_in_child("zero-std", {**healthy_config, "max_steps": max(10, sizes.grpo_steps // 10)},
                       policy="random", reward="all_in_category_reward")
assert not silent.outcome.crashed, silent.outcome.stderr[-3000:]
silent_rows = silent.result
silent_zero_std = sum(r["frac_reward_zero_std"] for r in silent_rows) / len(silent_rows)
silent_grad = max(r["grad_norm"] for r in silent_rows)
print(f"all-or-nothing reward on a random policy: {silent.outcome.describe()}; mean frac_reward_zero_std "
      f"{silent_zero_std:.2f}; largest grad norm {silent_grad:.2e}; reward {silent_rows[-1]['reward']:.2f}")

# %% [markdown]
# ## 6. Compare

# %%
fig, (ax_ladder, ax_reward, ax_kl) = plotting.figure(
    3, title="Child processes find the setting that kills the run (an injected fault); the healthy run learns")
labels = [" + ".join(t.settings) if t.settings else "minimal" for t in bisection.trials]
labels = [label if len(label) < 45 else "..." + label[-42:] for label in labels]
ax_ladder.barh(range(len(labels)), [1] * len(labels),
               color=[plotting.BAD if t.outcome.crashed else plotting.FIXED for t in bisection.trials])
ax_ladder.set_yticks(range(len(labels)), labels, fontsize=7)
ax_ladder.invert_yaxis()
ax_ladder.set_xticks([])
for i, trial in enumerate(bisection.trials):
    ax_ladder.text(0.02, i, f"{trial.phase}: {trial.outcome.signal or trial.outcome.status}", va="center", fontsize=7,
                   color="white")
plotting.label(ax_ladder, "red: killed, green: finished", "", "bisection, in order")
steps = [row["step"] for row in healthy_rows]
plotting.line(ax_reward, steps, rewards, "fixed", "healthy: mean reward", markersize=0)
plotting.line(ax_reward, [r["step"] for r in silent_rows], [r["reward"] for r in silent_rows], "bad",
              "all-or-nothing reward, random policy")
plotting.label(ax_reward, "optimizer step", "mean reward", "reward")
plotting.line(ax_kl, steps, [row["kl"] for row in healthy_rows], "fixed", "healthy: KL to reference", markersize=0)
plotting.line(ax_kl, steps, [row["frac_reward_zero_std"] for row in healthy_rows], "other",
              "healthy: frac_reward_zero_std", markersize=0)
plotting.label(ax_kl, "optimizer step", "value", "KL and zero-spread groups")
plotting.save(fig, run.output_dir, "grpo_sigfpe")

# %% [markdown]
# ## 7. What to remember
#
# * "Floating point exception (core dumped)" is a native crash: no Python traceback, no `except`.
#   Run the suspect in a child process with `python -X faulthandler` and read the return code (−8 is
#   SIGFPE) and the stack it printed.
# * Find the guilty setting by bisection from a config that works: add settings one by one, then halve.
#   It works on a loud config error too: an error message names what the code checked
#   (`generation_batch_size`), the bisection names what *you* set (`per_device_train_batch_size`).
# * For the H20 report: bf16 GEMMs with the cuBLAS of torch cu121 wheels; fix with
#   `nvidia-cublas-cu12==12.4.5.8` or newer torch, or `bf16=False`.
# * Today's TRL rejects the report's config earlier: `warmup_ratio` and `max_prompt_length` are gone,
#   and the per-device batch counts completions, so it must be divisible by `num_generations`.
# * Watch `frac_reward_zero_std`: groups with equal rewards teach nothing, silently.
#
# **The fix in your script** (H20 with torch 2.5.1+cu121): `pip install nvidia-cublas-cu12==12.4.5.8`
# or a newer torch; until then `GRPOConfig(..., bf16=False)`.
#
# ## 8. Exercise
#
# 1. Suppose the H20 fault fired only when `max_grad_norm < 1`. Give `bisect_settings` the user's
#    settings and a trial that fails exactly then (`in_process` on a function that raises for such
#    settings). Which set does it find, and after how many trials? Each would have been a child run.
# 2. Give the all-or-nothing reward to the *warm* policy. What happens to `frac_reward_zero_std`?
# 3. Build the `GRPOConfig` that `grpo_in_child` would get for `num_generations=6` and
#    `per_device_train_batch_size=16`. What does today's TRL report, and which per-device batch sizes
#    from 12 to 20 does it accept?
#
# Worked solutions: [`solutions/05_grpo_sigfpe.py`](solutions/05_grpo_sigfpe.py) (a test runs them).
#
# ## Checks

# %% tags=["checks"]
def checks(n: dict) -> tuple[dict, dict]:
    """The claims above as functions of the numbers alone (a test feeds them runs without the bug)."""
    crash, trials = n["native_crash"], n["bisection"]
    symptom = {
        "today's TRL rejects the report's config in three steps, then accepts it":
            [w["error"] is not None for w in n["config_walk"]] == [True, True, True, False],
        "the child's native crash is detected as SIGFPE (return code -8)":
            crash["signal"] == "SIGFPE" and crash["returncode"] == -8,
        "without faulthandler the crash leaves no message": "Fatal Python error" not in crash["stderr_without_faulthandler"],
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
    fix = {
        "the minimal config runs": bool(trials) and trials[0]["status"] == "finished",
        "the user's config with bf16=False runs": n["workaround"] == "finished",
        "the healthy run finished": n["healthy"] == "finished",
        "neither the report's learning rate nor its max_grad_norm crashes a run":
            all(row["status"] == "finished" for row in n["suspects"].values()),
        "reward improves over training (by > 0.1)": n["reward_end"] > n["reward_start"] + 0.1,
    }
    if n["then"]["status"] == "finished":  # the real TRL 0.14.0 (checks absent when skipped)
        symptom["TRL 0.14.0 accepts the report's config as written and trains with it"] = (
            n["then"]["accepted"] and n["then"]["optimizer_steps"] >= 1)
    return symptom, fix


# %%
numbers = {
    "config_walk": walk,
    "native_crash": {"returncode": traced.returncode, "signal": traced.signal,
                     "stderr_without_faulthandler": plain.stderr, "stderr_with_faulthandler": traced.stderr},
    "bisection": [{"settings": t.settings, "phase": t.phase, "status": t.outcome.status,
                   "signal": t.outcome.signal, "seconds": t.outcome.seconds} for t in bisection.trials],
    "config_bisection": {"culprits": config_bisection.culprits, "trials": len(config_bisection.trials),
                         "first_error": config_error.message, "message": full_error.message},
    "culprits": bisection.culprits,
    "workaround": workaround.status,
    "healthy": healthy.outcome.status,
    "reward_start": reward_start, "reward_end": reward_end,
    "final_kl": healthy_rows[-1]["kl"],
    "silent_frac_reward_zero_std": silent_zero_std, "silent_max_grad_norm": silent_grad,
    "suspects": suspect_runs,
    "then": then_numbers,
}
metrics = save_metrics(run, "05", numbers, checks, eras=[then.to_metrics()])
assert not failed_checks(metrics), f"checks failed: {failed_checks(metrics)}"
print(f"all checks passed; metrics in {run.output_dir / 'metrics.json'}")
