"""Lesson 05's user script: a GRPO training run as a user starts it, ``python train_grpo.py SPEC.json``.

The lesson runs it from a shell (the symptom) and through its portable check (``subprocess``), as a
user runs their own ``train.py``: a fresh Python process, so that a native crash ends this process and
not the notebook's kernel. ``SPEC.json`` (written by ``lessons.lesson_05_grpo_crash.companion.user_spec``) gives
the ``GRPOConfig`` arguments, the policy's folder (model and tokenizer), the reward function's name in
``trl_clinic.course.data``, the torch threads, where to write the trainer's log history, and
``h20_stand_in``: attach ``stand_ins.InjectedH20Fault``, the fault injected on purpose that stands in
for the H20's cuBLAS crash (a real native SIGFPE at the first step when ``bf16`` is on).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def build(config: dict, policy: str, reward: str, prompts: int, seed: int, h20_stand_in: bool):
    """The GRPOTrainer the script trains (the deep dive's forked trials build theirs here too): the policy's
    folder for model and tokenizer, a reward function of ``trl_clinic.course.data``, prompts drawn from ``seed``."""
    from transformers import AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from trl_clinic.course import data

    trainer = GRPOTrainer(
        model=policy,
        reward_funcs=getattr(data, reward),
        args=GRPOConfig(**config),
        train_dataset=data.reward_prompts(prompts, seed=seed),
        processing_class=AutoTokenizer.from_pretrained(policy),
    )
    if h20_stand_in:
        from trl_clinic.course.stand_ins import InjectedH20Fault

        trainer.add_callback(InjectedH20Fault())
    return trainer


def main(spec_path: str) -> None:
    spec = json.loads(Path(spec_path).read_text())
    import torch

    torch.set_num_threads(spec["threads"])
    trainer = build(spec["config"], spec["policy"], spec["reward"], 1024, spec["seed"], spec["h20_stand_in"])
    trainer.train()
    Path(spec["log"]).write_text(json.dumps(trainer.state.log_history))


if __name__ == "__main__":
    main(sys.argv[1])
