"""Companion of notebooks/05_grpo_sigfpe.py: the GRPO child runs, the config walk, the warm start, the
report's suspects and the figure, which the lesson calls in one line each.

The lines that show the bug and the fix stay in the notebook: the report's config, the fixes the
config walk applies (``per_device_train_batch_size`` from ``num_generations`` and the accumulation),
``bf16=False``, and each ``bisect_settings`` call.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from trl import GRPOConfig, GRPOTrainer, SFTConfig, SFTTrainer

from trl_clinic.course import child, data, plotting
from trl_clinic.course.crash import Bisection
from trl_clinic.course.models import make_causal_lm
from trl_clinic.course.parameters import Run
from trl_clinic.probes.recording import StepRecorder
from trl_clinic.course.stand_ins import InjectedH20Fault
from trl_clinic.course.tokenizer import build_tokenizer

# The report's settings the bisection gets (section 1 and 6), in the report's order; the others size the
# run (generations, lengths, epochs) or only log, and are set by the lesson for its tiny policy.
USER_SETTINGS = ("learning_rate", "adam_beta1", "adam_beta2", "weight_decay", "warmup_steps", "lr_scheduler_type",
                 "bf16", "gradient_accumulation_steps", "max_grad_norm")


def in_todays_names(reported: dict) -> dict:
    """Section 1: the report's training settings as today's GRPOConfig takes them.

    Today ``warmup_ratio`` is gone and ``warmup_steps`` takes a float in [0, 1) as a ratio (section 2
    shows the real TypeError).
    """
    renamed = {**reported, "warmup_steps": reported["warmup_ratio"]}
    return {name: renamed[name] for name in USER_SETTINGS}


def minimal_config(sizes) -> dict:
    """Sections 1 and 5-6: a GRPOConfig that names only what GRPO needs, in fp32, sized to the tiny policy."""
    return {"num_generations": sizes.generations, "per_device_train_batch_size": sizes.generations,
            "max_completion_length": sizes.max_completion_length, "max_steps": 2, "bf16": False}


def train_grpo(run: Run, spec: dict) -> list[dict]:
    """A GRPO run in a child process (``child.call``): returns the per-step history.

    ``spec``: ``name``, ``config`` (GRPOConfig arguments), ``policy`` (a path: GRPO with ``beta > 0``
    loads its reference model from it), ``reward`` (a function of ``trl_clinic.course.data``) and
    ``inject_h20_fault`` (attach the INJECTED stand-in for the H20 crash).
    """
    trainer = GRPOTrainer(
        model=spec["policy"],
        reward_funcs=getattr(data, spec["reward"]),
        args=GRPOConfig(**{**run.trainer_kwargs(spec["name"]), **spec["config"]}),
        train_dataset=data.reward_prompts(4096, seed=run.subseed("prompts")),
        processing_class=build_tokenizer(),
    )
    if spec["inject_h20_fault"]:
        trainer.add_callback(InjectedH20Fault())
    recorder = StepRecorder().watch(trainer)
    trainer.train()
    return recorder.history


def grpo_in_child(run: Run, name: str, config: dict, policy: Path, reward: str = "category_reward",
                  inject_h20_fault: bool = False, faulthandler: bool = True) -> child.ChildRun:
    """Every GRPO run of the lesson: ``train_grpo`` in a child, so that a native crash kills the child, not
    the notebook's kernel. ``faulthandler=False`` runs it as the report did: a crash then prints nothing."""
    spec = {"name": name, "config": config, "policy": str(policy), "reward": reward,
            "inject_h20_fault": inject_h20_fault}
    return child.call(run, f"{__name__}:train_grpo", spec, name=f"grpo_{name}", timeout=run.sizes.child_timeout_s,
                      faulthandler=faulthandler)


def save_policy(run: Run, name: str, model=None) -> Path:
    """Save a policy (a fresh random-init tiny Qwen2 when ``model`` is None) with its tokenizer, for GRPO to load."""
    tokenizer = build_tokenizer()
    model = model or make_causal_lm(tokenizer, "qwen2", size=run.sizes.model_size, seed=run.seed)
    path = run.output_dir / f"policy-{name}"
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def warm_start(run: Run, logging: bool = True) -> tuple[Path, list[float]]:
    """Section 4: a short SFT on word lists teaches a random policy the answer format; returns the saved
    policy's path and the SFT losses. A random policy almost never answers in words at all."""
    tokenizer = build_tokenizer()
    policy = make_causal_lm(tokenizer, "qwen2", size=run.sizes.model_size, seed=run.seed)
    steps = run.sizes.warm_start_steps
    trainer = SFTTrainer(
        model=policy,
        args=SFTConfig(**run.trainer_kwargs("warm-start", logging=logging, progress=logging),
                       per_device_train_batch_size=16, learning_rate=3e-3, max_steps=steps),
        train_dataset=data.word_lists(16 * steps, seed=run.subseed("warm start")),
        processing_class=tokenizer,
    )
    recorder = StepRecorder().watch(trainer)
    trainer.train()
    return save_policy(run, "warm", policy), recorder.series("loss")[1]


@dataclass
class Walk:
    """Section 2: each config tried on today's TRL, the error it met (None: accepted) and the fix applied."""
    configs: list[dict] = field(default_factory=list)
    steps: list[dict] = field(default_factory=list)

    @property
    def last_rejected(self) -> dict:
        return [seen for seen, step in zip(self.configs, self.steps) if step["error"]][-1]


def walk_config(config: dict, fixes: list[tuple[str, str, Callable[[dict], dict]]],
                build: Callable[[dict], object]) -> Walk:
    """Section 2: build the config; on an error, apply the fix whose key the message names, and try again.

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


def rule_lines() -> list[str]:
    """Section 2: the lines of the installed ``GRPOConfig.__post_init__`` that size the generation batch and
    check it against ``num_generations``, read from the installed ``trl/trainer/grpo_config.py``."""
    source = inspect.getsource(GRPOConfig.__post_init__)
    keep = ("self.generation_batch_size = self.per_device_train_batch_size", "self.steps_per_generation = self.grad",
            "self.generation_batch_size % self.num_generations")
    return list(dict.fromkeys(line.strip() for line in source.splitlines() if any(k in line for k in keep)))


def then_numbers(then) -> dict:
    """Section 2's era run of TRL 0.14.0, as the checks read it (absent fields when the era was skipped)."""
    numbers = {"status": then.status}
    if then.finished:
        result = then.result
        numbers.update(accepted=result["config_accepted_as_written"], error=result["error"],
                       optimizer_steps=result["optimizer_steps"], changed=result["changed_for_the_run"],
                       default_bf16=result.get("default_bf16"))
        print(f"TRL 0.14.0 accepts the report's config as written: {result['config_accepted_as_written']}; "
              f"{result['optimizer_steps']} real GRPO steps ran "
              f"(changed for the run: {result['changed_for_the_run']}); "
              f"a GRPOConfig that does not name bf16 has bf16={result.get('default_bf16')}")
    return numbers


def reward_ends(rows: list[dict]) -> tuple[float, float, int]:
    """Section 4: mean reward over the first and the last tenth of a run, and how many steps a tenth is."""
    window = max(1, len(rows) // 10)
    return (sum(r["reward"] for r in rows[:window]) / window, sum(r["reward"] for r in rows[-window:]) / window,
            window)


def try_suspects(run: Run, suspects: dict[str, dict], config: dict, policy: Path) -> dict[str, dict]:
    """Section 4: one short real GRPO run per suspect setting, added to ``config`` on its own."""
    rows = {}
    for i, (name, change) in enumerate(suspects.items()):
        tried = grpo_in_child(run, f"suspect-{i}", {**config, **change, "max_steps": run.sizes.suspect_steps}, policy)
        start, end, _ = reward_ends(tried.result) if tried.result else (None, None, None)
        rows[name] = {"change": change, "status": tried.outcome.status,
                      "reward_gain": end - start if tried.result else None,
                      "max_grad_norm_seen": max(r["grad_norm"] for r in tried.result) if tried.result else None}
        gain = f"; reward gain {end - start:+.3f}" if tried.result else ""
        print(f"{name:>24} {change or ''}: {tried.outcome.describe()}{gain}")
    return rows


def figure(run: Run, bisection: Bisection, healthy_rows: list[dict], silent_rows: list[dict]) -> None:
    """Section 7: the injected bisection's trials, the healthy and the silent runs' reward, and the healthy
    run's KL and zero-spread share."""
    fig, (ax_trials, ax_reward, ax_kl) = plotting.figure(
        3, title="Child processes find the setting that kills the run (an injected fault); the healthy run learns")
    labels = [" + ".join(t.settings) if t.settings else "minimal" for t in bisection.trials]
    labels = [label if len(label) < 45 else "..." + label[-42:] for label in labels]
    ax_trials.barh(range(len(labels)), [1] * len(labels),
                   color=[plotting.BAD if t.outcome.crashed else plotting.FIXED for t in bisection.trials])
    ax_trials.set_yticks(range(len(labels)), labels, fontsize=7)
    ax_trials.invert_yaxis()
    ax_trials.set_xticks([])
    for i, trial in enumerate(bisection.trials):
        ax_trials.text(0.02, i, f"{trial.phase}: {trial.outcome.signal or trial.outcome.status}", va="center",
                       fontsize=7, color="white")
    plotting.label(ax_trials, "red: killed, green: finished", "", "bisection, in order")
    steps = [row["step"] for row in healthy_rows]
    plotting.line(ax_reward, steps, [row["reward"] for row in healthy_rows], "fixed", "healthy: mean reward",
                  markersize=0)
    plotting.line(ax_reward, [r["step"] for r in silent_rows], [r["reward"] for r in silent_rows], "bad",
                  "all-or-nothing reward, random policy")
    plotting.label(ax_reward, "optimizer step", "mean reward", "reward")
    plotting.line(ax_kl, steps, [row["kl"] for row in healthy_rows], "fixed", "healthy: KL to reference",
                  markersize=0)
    plotting.line(ax_kl, steps, [row["frac_reward_zero_std"] for row in healthy_rows], "other",
                  "healthy: frac_reward_zero_std", markersize=0)
    plotting.label(ax_kl, "optimizer step", "value", "KL and zero-spread groups")
    plotting.save(fig, run.output_dir, "grpo_sigfpe")


def numbers(*, symptom, walk: Walk, rule: dict, plain, traced, shell: tuple[int, str], bisection: Bisection,
            config_bisection: Bisection,
            full_error, workaround: child.ChildRun, healthy: child.ChildRun, reward_ends: tuple[float, float],
            silent: tuple[float, float], suspects: dict, then: dict, max_steps: int) -> dict:
    """The checks' numbers, gathered from every section's results (what ``metrics.json`` stores)."""
    config_error = next(t.outcome for t in config_bisection.trials if t.outcome.crashed)
    return {
        "symptom": {"signal": symptom.signal, "returncode": symptom.returncode,
                    "traceback": "Traceback" in symptom.stderr or "Fatal Python error" in symptom.stderr},
        "config_walk": walk.steps,
        "rule": rule,
        "native_crash": {"returncode": traced.returncode, "signal": traced.signal,
                         "stderr_without_faulthandler": plain.stderr, "stderr_with_faulthandler": traced.stderr,
                         "shell_returncode": shell[0], "shell_says": shell[1]},
        "bisection": [{"settings": t.settings, "phase": t.phase, "status": t.outcome.status,
                       "signal": t.outcome.signal, "seconds": t.outcome.seconds} for t in bisection.trials],
        "config_bisection": {"culprits": config_bisection.culprits, "trials": len(config_bisection.trials),
                             "first_error": config_error.message, "message": full_error.message},
        "culprits": bisection.culprits,
        "workaround": workaround.outcome.status, "workaround_steps": len(workaround.result or []),
        "max_steps": max_steps,
        "healthy": healthy.outcome.status,
        "reward_start": reward_ends[0], "reward_end": reward_ends[1],
        "final_kl": healthy.result[-1]["kl"],
        "silent_frac_reward_zero_std": silent[0], "silent_max_grad_norm": silent[1],
        "suspects": suspects,
        "then": then,
    }
