"""Companion of lesson 05 (notebooks/05_grpo_sigfpe.ipynb and its deep dive): the user's GRPO runs, the
config walk, the generation-batch picture, the warm start, the report's suspects and the figures, which
the lessons call in one line each.

The lines that show the bug and the fix stay in the notebooks: the report's config, ``bf16=False``,
the batch sizes tried, the portable check and each ``bisect_settings`` call.
"""

from __future__ import annotations

import inspect
import json
import statistics
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from matplotlib.patches import Rectangle
from trl import GRPOConfig, SFTConfig, SFTTrainer

from trl_clinic.course import child, data, plotting
from trl_clinic.course.crash import DIVISION_RETURNED, Bisection, in_process
from trl_clinic.course.models import PRETRAINED_SIZES, dequantized_smollm2, load_smollm2, make_causal_lm
from trl_clinic.course.run import Run
from trl_clinic.course.tokenizer import build_tokenizer
from trl_clinic.course.user_scripts import train_grpo
from trl_clinic.probes.recording import StepRecorder

# The user's script, run as `python train_grpo.py SPEC.json` (from a shell, and by the portable check)
SCRIPT = Path(train_grpo.__file__)
# The report's training settings the user changed from the documentation's example, in the report's
# order; the others size the run (generations, lengths, epochs) or only log, and are set per profile.
USER_SETTINGS = (
    "learning_rate",
    "adam_beta1",
    "adam_beta2",
    "weight_decay",
    "warmup_steps",
    "lr_scheduler_type",
    "bf16",
    "gradient_accumulation_steps",
    "max_grad_norm",
)
# What the deep dive's fork server imports once, so that each GRPO trial forked from it skips Python's start-up
PRELOAD = (__name__,)
# transformers 5.23 warns on TRL's default gradient_checkpointing=True in every GRPOConfig the walk builds
warnings.filterwarnings("ignore", message="`gradient_checkpointing` is deprecated", category=FutureWarning)


def in_todays_names(reported: dict) -> dict:
    """The report's training settings as today's GRPOConfig takes them: ``warmup_ratio`` is gone and
    ``warmup_steps`` takes a float in [0, 1) as a ratio (transformers 5.23.0 ``training_args.py``,
    ``get_warmup_steps``; the config walk shows the real TypeError)."""
    renamed = {**reported, "warmup_steps": reported["warmup_ratio"]}
    return {name: renamed[name] for name in USER_SETTINGS}


def grpo_sizes(run: Run, prompts: int = 1) -> dict:
    """What sizes a GRPO run here: the profile's generations and completion length, ``prompts`` groups per
    optimizer step (the generation batch is ``prompts * num_generations`` completions)."""
    return {
        "num_generations": run.sizes.generations,
        "max_completion_length": run.sizes.max_completion_length,
        "per_device_train_batch_size": prompts * run.sizes.generations,
    }


# ---- the policy --------------------------------------------------------------------------------------------


def policy(run: Run, name: str = "random", model=None, tokenizer=None) -> Path:
    """A folder GRPO loads its policy (and tokenizer) from. The profile's ``model_size`` says which: a
    random-init tiny Qwen2 with the clinic tokenizer, saved here, or SmolLM2-135M-Instruct's real weights
    (the dequantized copy the course keeps, used as it is). ``model``: save this one instead."""
    if model is None and run.sizes.model_size in PRETRAINED_SIZES:
        return dequantized_smollm2()
    if model is None:
        tokenizer = build_tokenizer()
        model = make_causal_lm(tokenizer, "qwen2", size=run.sizes.model_size, seed=run.seed)
    path = run.output_dir / f"policy-{name}"
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


# ---- the user's script -------------------------------------------------------------------------------------


def user_spec(run: Run, name: str, settings: dict, steps: int, h20_stand_in: bool = True) -> Path:
    """Write the spec of the user's script (``train_grpo.py``): the lesson's GRPO run with ``settings`` on
    top, the progress bar a user sees, and ``h20_stand_in`` (the injected fault, attached unless told not to,
    so that the core's two runs differ only in their settings). Returns its path."""
    folder = run.output_dir / "user"
    folder.mkdir(exist_ok=True)
    # per-device batch = num_generations: with the report's accumulation 4, four prompts' groups a step
    config = {
        **run.trainer_kwargs(f"user-{name}"),
        **grpo_sizes(run),
        "max_steps": steps,
        "disable_tqdm": False,
        **settings,
    }
    spec = {
        "config": config,
        "policy": str(policy(run)),
        "reward": "category_reward",
        "seed": run.subseed("prompts"),
        "threads": torch.get_num_threads(),
        "h20_stand_in": h20_stand_in,
        "log": str(folder / f"{name}.log.json"),
    }
    path = folder / f"{name}.json"
    path.write_text(json.dumps(spec, indent=1))
    return path


def from_shell(run: Run, spec: Path) -> child.Outcome:
    """``python train_grpo.py SPEC`` started from bash, as the user started theirs (no faulthandler)."""
    return child.run_child(
        [str(SCRIPT), str(spec)],
        faulthandler=False,
        shell=True,
        cwd=spec.parent,
        timeout=run.sizes.child_timeout_s,
        env=child.child_env(run),
    )


def record(script: Path, shell: child.Outcome, check: str, settings: dict) -> dict:
    """Core: one run of the user's script for the checks (the lesson's checks.py): its spec's ``settings`` and
    stand-in, the shell's report, the portable check's verdict (``check``) and the steps it logged."""
    spec = json.loads(script.read_text())
    return {
        "settings": {k: spec["config"][k] for k in settings},
        "stand_in": spec["h20_stand_in"],
        "shell": {
            "returncode": shell.returncode,
            "signal": shell.signal,
            "shell_says": shell.message,
            "traceback": "Traceback" in shell.stderr or "Fatal Python error" in shell.stderr,
        },
        "check": check,
        "steps": len(logged_steps(script)),
    }


def terminal_tail(text: str, lines: int = 3) -> str:
    """The last lines as a terminal shows them: a progress bar redraws its line with a carriage return."""
    shown = [line.rsplit("\r", 1)[-1] for line in text.splitlines()]
    return "\n".join([line for line in shown if line.strip()][-lines:])


def logged_steps(spec: Path) -> list[dict]:
    """The optimizer steps the user's script logged (its ``trainer.state.log_history``), [] if it died."""
    log = Path(json.loads(spec.read_text())["log"])
    return [row for row in json.loads(log.read_text()) if "reward" in row] if log.exists() else []


# ---- the config walk and the rule -------------------------------------------------------------------------

FIXES = [  # (what the error names, the fix, how it changes the config)
    (
        "warmup_ratio",
        "warmup_ratio is gone: warmup_steps takes a float in [0, 1) as a ratio",
        lambda c: {**{k: v for k, v in c.items() if k != "warmup_ratio"}, "warmup_steps": c["warmup_ratio"]},
    ),
    (
        "max_prompt_length",
        "max_prompt_length is gone from GRPOConfig, which truncates no prompt: shorten them in the dataset",
        lambda c: {k: v for k, v in c.items() if k != "max_prompt_length"},
    ),
    (
        "divisible by num_generations",
        "the per-device batch counts completions: per-device x accumulation x "
        "processes must hold whole groups, so per_device_train_batch_size = num_generations // accumulation",
        lambda c: {**c, "per_device_train_batch_size": c["num_generations"] // c["gradient_accumulation_steps"]},
    ),
]


@dataclass
class Walk:
    """Each config tried on today's TRL, the error it met (None: accepted) and the fix applied."""

    configs: list[dict] = field(default_factory=list)
    steps: list[dict] = field(default_factory=list)

    @property
    def last_rejected(self) -> dict:
        return [seen for seen, step in zip(self.configs, self.steps) if step["error"]][-1]


def walk_config(
    config: dict, fixes: list[tuple[str, str, Callable[[dict], dict]]], build: Callable[[dict], object]
) -> Walk:
    """Build the config; on an error, apply the fix whose key the message names, and try again.

    Stops when the config is accepted or an error has no known fix.
    """
    walk = Walk()
    for _ in range(len(fixes) + 1):
        walk.configs.append(dict(config))
        try:
            build(config)
        except (TypeError, ValueError) as error:
            fix = next(((text, change) for key, text, change in fixes if key in str(error)), None)
            walk.steps.append({"error": f"{type(error).__name__}: {error}", "fix": fix[0] if fix else None})
            print(f"{type(error).__name__}: {error}\n   fix: {fix[0] if fix else 'none known: stop'}")
            if fix is None:
                break
            config = fix[1](config)
        else:
            walk.steps.append({"error": None, "fix": None})
            print("accepted")
            break
    return walk


def walk_report(run: Run, reported: dict) -> Walk:
    """The report's config, verbatim, through today's ``GRPOConfig`` (``use_cpu`` on the cpu profile)."""
    return walk_config(
        reported, FIXES, lambda c: GRPOConfig(output_dir=str(run.output_dir / "runs" / "walk"), **run.cpu_flags(), **c)
    )


def rule_lines() -> list[str]:
    """The lines of the installed ``GRPOConfig.__post_init__`` that size the generation batch when neither
    ``generation_batch_size`` nor ``steps_per_generation`` is set, and check it against ``num_generations``
    (TRL 1.16.0 ``trl/trainer/grpo_config.py``, lines 1098-1101 and 1131)."""
    source = inspect.getsource(GRPOConfig.__post_init__)
    keep = (
        "if self.generation_batch_size is None and self.steps_per_generation is None",
        "self.steps_per_generation = self.gradient_accumulation_steps",
        "self.generation_batch_size = self.per_device_train_batch_size * num_processes * self.steps",
        "if self.generation_batch_size % self.num_generations != 0",
    )
    return list(dict.fromkeys(line.strip() for line in source.splitlines() if any(k in line for k in keep)))


def verdicts(run: Run, num_generations: int, accumulation: int, batches, **extra) -> dict[int, str | None]:
    """Today's ``GRPOConfig`` on each per-device batch: None where it accepts it, else its error."""

    def build(batch: int):
        return in_process(
            lambda: GRPOConfig(
                **run.trainer_kwargs("verdicts", logging=False),
                num_generations=num_generations,
                gradient_accumulation_steps=accumulation,
                per_device_train_batch_size=batch,
                **extra,
            )
        )

    return {batch: build(batch).message for batch in batches}


def generation_shape(run: Run, num_generations: int, accumulation: int, batch: int, **extra) -> dict:
    """The generation batch and the steps it feeds, as today's ``GRPOConfig`` sizes them (None where it raises)."""
    try:
        built = GRPOConfig(
            **run.trainer_kwargs("shape", logging=False),
            num_generations=num_generations,
            gradient_accumulation_steps=accumulation,
            per_device_train_batch_size=batch,
            **extra,
        )
    except ValueError:
        built = None
    return {key: getattr(built, key, None) for key in ("generation_batch_size", "steps_per_generation")}


def draw_groups(
    run: Run, num_generations: int, accumulation: int, batches: tuple[int, int], said: dict[int, str | None]
) -> None:
    """The mechanism: the generation batch (per-device batch x accumulation, one process) laid out as the
    completions of each micro-batch, each lettered by the prompt whose group it belongs to; a group
    cut short is red. ``said``: today's GRPOConfig on each batch (``verdicts``)."""
    fig, axes = plotting.figure(
        2,
        title=f"Groups of num_generations={num_generations}: a generation batch that cuts one short is rejected",
        width=4.8,
        height=2.8,
    )
    for ax, batch in zip(axes, batches):
        total = batch * accumulation
        for slot in range(total):
            row, col, group = slot // batch, slot % batch, slot // num_generations
            whole = (group + 1) * num_generations <= total
            color = plotting.OTHER if whole and group % 2 == 0 else "#9ecae1" if whole else plotting.BAD
            ax.add_patch(Rectangle((col, row), 0.92, 0.92, color=color))
            ax.text(
                col + 0.46, row + 0.46, "ABCDEFGH"[group], ha="center", va="center", color="white", fontweight="bold"
            )
        ax.set_xlim(0, max(batches))
        ax.set_ylim(accumulation, 0)
        ax.set_xticks([i + 0.46 for i in range(batch)], [str(i + 1) for i in range(batch)])
        ax.set_yticks([i + 0.46 for i in range(accumulation)], [f"micro-batch {i + 1}" for i in range(accumulation)])
        ax.grid(False)
        verdict = "accepted" if said[batch] is None else "ValueError"
        plotting.label(
            ax,
            "completion",
            "",
            f"per-device {batch} x accumulation {accumulation} "
            f"= {total}\n{total / num_generations:g} groups: {verdict}",
        )
    plotting.save(fig, run.output_dir, "generation_batch_groups")


# ---- the core's figure -------------------------------------------------------------------------------------


def stack_frames(ended: str, shown: int = 10) -> list[str]:
    """The innermost frames of faulthandler's stack in a ``how_it_ends`` answer, as ``function (file:line)``."""
    frames = []
    for line in ended.splitlines():
        line = line.strip()
        if line.startswith("File "):  # File "/path/to/file.py", line 12 in function
            where, _, function = line.partition(" in ")
            file, _, number = where.removeprefix("File ").partition(", line ")
            frames.append(f"{function}  ({Path(file.strip(chr(34))).name}:{number})")
    return frames[:shown]


def figure(run: Run, ended: dict[str, str], fixed_rows: list[dict], steps: int) -> None:
    """Bad against fixed, what the lesson's text rests on: how far each run of the user's script got (optimizer
    steps logged of ``steps``) and how it ended (``how_it_ends``' first line, and the innermost frame of
    faulthandler's stack where it died): the same script and stand-in, ``bf16`` the one difference."""
    bad = ended["bf16=True"]
    frames = stack_frames(bad, shown=1)
    rows = {
        "bf16=True\n(the report's)": (
            0,
            f"{bad.splitlines()[0]} before step 1, no traceback"
            + (f"\nfaulthandler: died in {frames[0]}" if frames else ""),
        ),
        "bf16=False\n(the fix)": (
            len(fixed_rows),
            f"{ended['bf16=False'].splitlines()[0]}: {len(fixed_rows)} of {steps} steps logged",
        ),
    }
    fig, (ax,) = plotting.figure(
        1, title="The user's GRPO script twice, the stand-in attached to both", width=8.0, height=2.8
    )
    names = list(rows)[::-1]
    ax.barh(names, [rows[n][0] for n in names], color=[plotting.FIXED, plotting.BAD], height=0.5)
    for y, name in enumerate(names):
        ax.text(0.2, y, rows[name][1], va="center", fontsize=9, family="monospace")
    ax.set_xlim(0, steps + 1)
    plotting.label(ax, f"optimizer steps logged (of {steps})", "", "how far each run got, and how it ended")
    plotting.save(fig, run.output_dir, "grpo_sigfpe")


# ---- the deep dive: GRPO trials forked from a server -------------------------------------------------------


def train_grpo_in_child(run: Run, spec: dict) -> list[dict]:
    """A GRPO run in a child process: returns the per-step history (``StepRecorder``).

    ``spec``: ``name``, ``config`` (GRPOConfig arguments), ``policy`` (a folder: GRPO with ``beta > 0``
    loads its reference model from it), ``reward`` (a function of ``trl_clinic.course.data``) and
    ``h20_stand_in`` (attach the INJECTED stand-in for the H20 crash).
    """
    trainer = train_grpo.build(
        {**run.trainer_kwargs(spec["name"], progress=False), **spec["config"]},
        spec["policy"],
        spec["reward"],
        4096,
        run.subseed("prompts"),
        spec["h20_stand_in"],
    )
    recorder = StepRecorder().watch(trainer)
    trainer.train()
    return recorder.history


def grpo_trial(
    run: Run, name: str, config: dict, policy_path: Path, reward: str = "category_reward", h20_stand_in: bool = False
) -> child.ChildRun:
    """Every GRPO run of the deep dive: ``train_grpo_in_child`` in a child forked from a server that imported
    TRL once (``child.forked``), so a native crash kills the child, not the notebook's kernel."""
    spec = {"name": name, "config": config, "policy": str(policy_path), "reward": reward, "h20_stand_in": h20_stand_in}
    return child.forked(
        run,
        f"{__name__}:train_grpo_in_child",
        spec,
        name=f"grpo_{name}",
        timeout=run.sizes.child_timeout_s,
        preload=PRELOAD,
    )


def warm_start(run: Run) -> tuple[Path, list[float]]:
    """A short SFT on word lists teaches the policy the answer format; returns the saved policy's folder
    and the SFT losses. A random policy almost never answers in words at all."""
    if run.sizes.model_size in PRETRAINED_SIZES:
        model, tokenizer = load_smollm2()
    else:
        tokenizer = build_tokenizer()
        model = make_causal_lm(tokenizer, "qwen2", size=run.sizes.model_size, seed=run.seed)
    steps = run.sizes.warm_start_steps
    trainer = SFTTrainer(
        model=model,
        args=SFTConfig(
            **run.trainer_kwargs("warm-start", progress=False),
            per_device_train_batch_size=16,
            learning_rate=run.sizes.warm_start_learning_rate,
            max_steps=steps,
        ),
        train_dataset=data.word_lists(16 * steps, seed=run.subseed("warm start")),
        processing_class=tokenizer,
    )
    recorder = StepRecorder().watch(trainer)
    trainer.train()
    return policy(run, "warm", model, tokenizer), recorder.series("loss")[1]


def reward_ends(rows: list[dict]) -> tuple[float, float, int]:
    """Mean reward over the first and the last tenth of a run, and how many steps a tenth is."""
    window = max(1, len(rows) // 10)
    return (sum(r["reward"] for r in rows[:window]) / window, sum(r["reward"] for r in rows[-window:]) / window, window)


def try_suspects(run: Run, suspects: dict[str, dict], config: dict, policy_path: Path) -> dict[str, dict]:
    """One short real GRPO run per suspect setting, added to ``config`` on its own."""
    rows = {}
    for name, change in suspects.items():
        tried = grpo_trial(
            run, f"suspect-{name}", {**config, **change, "max_steps": run.sizes.suspect_steps}, policy_path
        )
        start, end, _ = reward_ends(tried.result) if tried.result else (None, None, None)
        rows[name] = {
            "change": change,
            "status": tried.outcome.status,
            "reward_gain": end - start if tried.result else None,
        }
        gain = f"; reward gain {end - start:+.3f}" if tried.result else ""
        print(f"{name:>14} {change}: {tried.outcome.describe()}{gain}")
    return rows


def then_numbers(then) -> dict:
    """The era run of TRL 0.14.0, as the checks read it (only the status when the era was skipped)."""
    numbers = {"status": then.status}
    if then.finished:
        result = then.result
        numbers.update(
            trl=result["era_versions"]["trl"],
            accepted=result["config_accepted_as_written"],
            error=result["error"],
            optimizer_steps=result["optimizer_steps"],
            changed=result["changed_for_the_run"],
            default_bf16=result["default_bf16"],
            completions_per_call=result["completions_per_call"],
            batch_help=result["batch_help"],
        )
        print(
            f"TRL {numbers['trl']} accepts the report's config as written: {result['config_accepted_as_written']}; "
            f"{result['optimizer_steps']} real GRPO steps ran (changed for the run: {result['changed_for_the_run']})\n"
            f"completions per reward call: {sorted(set(result['completions_per_call']))} with "
            f"per_device_train_batch_size={result['reported']['per_device_train_batch_size']}; its help: "
            f"{result['batch_help']!r}\na GRPOConfig that does not name bf16 has bf16={result['default_bf16']}"
        )
    return numbers


def native_record(shell: child.Outcome, traced: child.Outcome) -> dict:
    """How one division's children ended (from a shell without faulthandler, and with it), as the checks read it:
    whether the line after the division ran (``crash.DIVISION_RETURNED``) and whether faulthandler's innermost
    frame is ``native_sigfpe``, which tell a trap in the kernel from any other death."""
    stack = traced.stderr.split("Current thread", 1)[-1] if "Current thread" in traced.stderr else ""
    frames = [line.strip() for line in stack.splitlines() if line.strip().startswith("File ")]
    return {
        "returncode": traced.returncode,
        "signal": traced.signal,
        "division_returned": DIVISION_RETURNED in traced.stderr or DIVISION_RETURNED in shell.stderr,
        "died_in_native_sigfpe": bool(frames) and frames[0].endswith(" in native_sigfpe"),
        "stderr_with_faulthandler": traced.stderr,
        "shell_returncode": shell.returncode,
        "shell_says": shell.message if shell.status == "signal" else None,
        "shell_python_said_nothing": "Fatal Python error" not in shell.stderr and "Traceback" not in shell.stderr,
    }


def today_answers(run: Run, walk: Walk) -> dict:
    """The questions the deep dive asks TRL 0.14.0 in its era, put to today's TRL: the report's config as written
    (the walk's first answer), the help of ``per_device_train_batch_size``, and the ``bf16`` of a ``GRPOConfig``
    that does not name it. Today's TRL trains nothing with the report's config (it rejects it)."""
    import trl

    return {
        "status": "finished",
        "trl": trl.__version__,
        "accepted": walk.steps[0]["error"] is None,
        "optimizer_steps": 0,
        "completions_per_call": None,
        "batch_help": GRPOConfig.__dataclass_fields__["per_device_train_batch_size"].metadata["help"],
        # as the era script asks it (use_cpu=True there: the eras run on the CPU)
        "default_bf16": GRPOConfig(output_dir=str(run.output_dir / "runs" / "default-bf16"), use_cpu=True).bf16,
    }


def deep_figure(run: Run, bisection: Bisection, zero_std: dict[str, list[dict]]) -> None:
    """The injected bisection's trials in order, and the share of equal-reward groups per step under the two
    rewards (the same policy, the same config)."""
    silent, partial = zero_std["all_in_category_reward"], zero_std["category_reward"]
    mean = {name: sum(r["frac_reward_zero_std"] for r in rows) / max(1, len(rows)) for name, rows in zero_std.items()}
    fig, (ax_trials, ax_equal) = plotting.figure(
        2,
        title=(
            f"Child processes name {', '.join(bisection.culprits or ['nothing'])} in {len(bisection.trials)} trials "
            f"(injected fault).\nEqual-reward groups: {mean['all_in_category_reward']:.0%} with an all-or-nothing "
            f"reward, {mean['category_reward']:.0%} with partial credit"
        ),
        width=5.4,
    )
    labels = [" + ".join(t.settings) if t.settings else "minimal" for t in bisection.trials]
    labels = [label if len(label) < 40 else "..." + label[-37:] for label in labels]
    ax_trials.barh(
        range(len(labels)),
        [1] * len(labels),
        color=[plotting.BAD if t.outcome.crashed else plotting.FIXED for t in bisection.trials],
    )
    ax_trials.set_yticks(range(len(labels)), labels, fontsize=7)
    ax_trials.invert_yaxis()
    ax_trials.set_xticks([])
    for i, trial in enumerate(bisection.trials):
        ax_trials.text(
            0.02,
            i,
            f"{trial.phase}: {trial.outcome.signal or trial.outcome.status}",
            va="center",
            fontsize=7,
            color="white",
        )
    plotting.label(ax_trials, "red: killed, green: finished", "", "bisection, in order")
    for rows, kind, name in ((silent, "bad", "all-or-nothing reward"), (partial, "fixed", "partial credit")):
        plotting.line(ax_equal, [r["step"] for r in rows], [r["frac_reward_zero_std"] for r in rows], kind, name)
    ax_equal.set_ylim(-0.05, 1.05)
    plotting.label(ax_equal, "optimizer step", "frac_reward_zero_std", "groups whose rewards are all equal")
    plotting.save(fig, run.output_dir, "grpo_sigfpe_deeper")


def _bisection_record(bisection: Bisection) -> dict:
    return {
        "culprits": bisection.culprits,
        "trials": [
            {
                "settings": t.settings,
                "phase": t.phase,
                "status": t.outcome.status,
                "signal": t.outcome.signal,
                "seconds": t.outcome.seconds,
            }
            for t in bisection.trials
        ],
    }


def _zero_std_record(rows: list[dict]) -> dict:
    equal = [row for row in rows if row["frac_reward_zero_std"] == 1.0]
    return {
        "steps": len(rows),
        "mean_frac_reward_zero_std": sum(r["frac_reward_zero_std"] for r in rows) / max(1, len(rows)),
        "equal_steps": len(equal),
        "max_equal_grad_norm": max((row["grad_norm"] for row in equal), default=None),
        "reward": [row["reward"] for row in rows],
    }


def deep_numbers(
    *,
    native: dict[str, dict],
    walks: tuple[Walk, Walk],
    verdicts: dict[int, str | None],
    settable: dict,
    config_bisections: tuple[Bisection, Bisection],
    full_error: child.Outcome,
    crash_bisections: tuple[Bisection, Bisection],
    healthy_rows: list[dict],
    suspects: dict,
    zero_std: dict[str, list[dict]],
    then: dict,
    today_trl: dict,
) -> dict:
    """The deep dive's numbers (what ``metrics.json`` stores): each section's bad and fixed side under
    ``runs["without_fix"]`` and ``runs["with_fix"]`` with the same fields, so a test can hand each check group the
    other side. Without the fix: the overflowing division, the report's config and its walk, per-device 1 with
    neither generation setting, the renamed config's error, the user's bf16=True settings, the all-or-nothing
    reward. With it: the division torch checks (by zero), the walk's last config, the generation batch set to 16,
    that config's bisection, the settings with bf16=False (the stand-in still attached), partial credit."""
    reward_start, reward_end, _ = reward_ends(healthy_rows) if healthy_rows else (None, None, 0)
    sides = {}
    for side, i in (("without_fix", 0), ("with_fix", 1)):
        sides[side] = {
            "native": native["overflow" if i == 0 else "by zero"],
            "walk": walks[i].steps,
            "rule": [row for name, row in settable.items() if (name == "neither set") == (i == 0)],
            "config_bisection": {
                "culprits": config_bisections[i].culprits,
                "trials": len(config_bisections[i].trials),
                "message": full_error.message if i == 0 else None,
            },
            "crash_bisection": _bisection_record(crash_bisections[i]),
            "zero_std": _zero_std_record(zero_std["all_in_category_reward" if i == 0 else "category_reward"]),
        }
    return {
        "runs": sides,
        "verdicts": verdicts,
        "verdict_rule": {"num_generations": 4, "accumulation": 2},
        "healthy": {
            "steps": len(healthy_rows),
            "reward_start": reward_start,
            "reward_end": reward_end,
            "median_grad_norm": statistics.median(row["grad_norm"] for row in healthy_rows) if healthy_rows else None,
        },
        "suspects": suspects,
        "then": then,
        "today_trl": today_trl,
    }
