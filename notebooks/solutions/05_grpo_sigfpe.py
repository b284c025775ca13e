"""Worked solutions to lesson 05's exercises (GRPOTrainer dies with "Floating point exception").

Run from the repository root: ``python notebooks/solutions/05_grpo_sigfpe.py``. Each answer is
measured on the cpu profile with the lesson's own helpers and today's real TRL, printed, and
asserted, so the file fails if an answer stops being true. Config trials run in this process
(``crash.in_process``); the one GRPO run is a short one, in this process too.
"""

import math
import tempfile

from trl import GRPOConfig, GRPOTrainer

from trl_clinic.course import data
from trl_clinic.course.companions import grpo_crash
from trl_clinic.course.crash import bisect_settings, in_process
from trl_clinic.course.parameters import start_run
from trl_clinic.probes.recording import StepRecorder, quiet
from trl_clinic.course.tokenizer import build_tokenizer

run = start_run("05", "cpu", 0, tempfile.mkdtemp(prefix="solutions-05-"))
sizes = run.sizes
# The report's settings in today's names, in the report's order, as the lesson's injected bisection gets them
# (grpo_crash.in_todays_names of the lesson's `reported`)
USER_SETTINGS = {"learning_rate": 5e-6, "adam_beta1": 0.9, "adam_beta2": 0.99, "weight_decay": 0.1,
                 "warmup_steps": 0.1, "lr_scheduler_type": "cosine", "bf16": True, "gradient_accumulation_steps": 4,
                 "max_grad_norm": 0.1}


def exercise_1() -> None:
    """If the fault fired only when max_grad_norm < 1, which set would the bisection find, after how many trials?"""
    def trial(names: list[str]):
        settings = {name: USER_SETTINGS[name] for name in names}

        def fault() -> None:
            if settings.get("max_grad_norm", 1.0) < 1:
                raise FloatingPointError("the fault fires: max_grad_norm < 1")

        return in_process(fault)

    bisection = bisect_settings(list(USER_SETTINGS), trial)
    halving = [t.settings for t in bisection.trials if t.phase == "halving"]
    print(f"1. the bisection finds {bisection.culprits} after {len(bisection.trials)} trials: the minimal config, "
          f"all {len(USER_SETTINGS)} settings, then {len(halving)} halving trials (max_grad_norm is the user's last "
          "setting, so each shorter prefix works; the last trial fails with it alone); each would have been a "
          "GRPO child run.")
    assert bisection.culprits == ["max_grad_norm"]
    assert len(halving) <= math.ceil(math.log2(len(USER_SETTINGS))) + 1  # the old ladder took one per setting


def exercise_2() -> None:
    """Give the all-or-nothing reward to the warm policy: what happens to frac_reward_zero_std?"""
    policy, _ = grpo_crash.warm_start(run, logging=False)  # the lesson's warm start, saved to a folder
    grpo = quiet(GRPOTrainer(
        model=str(policy), reward_funcs=data.all_in_category_reward, processing_class=build_tokenizer(),
        args=GRPOConfig(**run.trainer_kwargs("all-or-nothing-warm", progress=False),
                        num_generations=sizes.generations, per_device_train_batch_size=4 * sizes.generations,
                        max_completion_length=sizes.max_completion_length, learning_rate=sizes.grpo_learning_rate,
                        max_steps=8),
        train_dataset=data.reward_prompts(1024, seed=run.subseed("prompts")),
    ))
    recorder = StepRecorder().watch(grpo)
    grpo.train()
    rows = recorder.history
    zero_std = sum(r["frac_reward_zero_std"] for r in rows) / len(rows)
    learning_steps = sum(r["grad_norm"] > 0 for r in rows)
    print(f"2. warm policy, all-or-nothing reward: mean frac_reward_zero_std {zero_std:.2f} (the random policy's "
          f"is 1.00), mean reward {sum(r['reward'] for r in rows) / len(rows):.2f}, a non-zero gradient at "
          f"{learning_steps} of {len(rows)} steps: some groups now mix 0 and 1, and those teach.")
    assert zero_std < 1 and learning_steps > 0


def exercise_3() -> None:
    """num_generations=6 with per_device_train_batch_size=16: what does today's TRL report, what does it accept?"""
    def build(batch_size: int):
        return in_process(lambda: GRPOConfig(**run.trainer_kwargs("exercise-3", logging=False), num_generations=6,
                                             per_device_train_batch_size=batch_size))

    rejected = build(16)
    accepted = [size for size in range(12, 21) if not build(size).crashed]
    print(f"3. {rejected.message} Accepted from 12 to 20: {accepted}, the multiples of 6 (with 1 process and "
          "no accumulation, generation_batch_size is the per-device batch: TRL 1.16's grpo_config.py).")
    assert rejected.message == "ValueError: generation_batch_size (16) must be divisible by num_generations (6)."
    assert accepted == [12, 18]


if __name__ == "__main__":
    exercise_1()
    exercise_2()
    exercise_3()
