"""Lesson 05's user script: a GRPO training run as a user starts it, ``python train_grpo.py SPEC.json``.

The lesson runs it from a shell (the symptom) and through its portable check (``subprocess``), as a
user runs their own ``train.py``: a fresh Python process, so that a native crash ends this process and
not the notebook's kernel. ``SPEC.json`` (written by ``grpo_crash.user_spec``) gives the ``GRPOConfig``
arguments, the policy's folder (model and tokenizer), the reward function's name in
``trl_clinic.course.data``, the torch threads, where to write the trainer's log history, and
``h20_stand_in``: attach ``stand_ins.InjectedH20Fault``, the fault injected on purpose that stands in
for the H20's cuBLAS crash (a real native SIGFPE at the first step when ``bf16`` is on).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main(spec_path: str) -> None:
    spec = json.loads(Path(spec_path).read_text())
    import torch

    torch.set_num_threads(spec["threads"])
    from transformers import AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from trl_clinic.course import data

    trainer = GRPOTrainer(
        model=spec["policy"],
        reward_funcs=getattr(data, spec["reward"]),
        args=GRPOConfig(**spec["config"]),
        train_dataset=data.reward_prompts(1024, seed=spec["seed"]),
        processing_class=AutoTokenizer.from_pretrained(spec["policy"]),
    )
    if spec["h20_stand_in"]:
        from trl_clinic.course.stand_ins import InjectedH20Fault

        trainer.add_callback(InjectedH20Fault())
    trainer.train()
    Path(spec["log"]).write_text(json.dumps(trainer.state.log_history))


if __name__ == "__main__":
    main(sys.argv[1])
