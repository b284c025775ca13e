"""Worked solutions to lesson 03's exercises (LoRA reward model: loss 1e+34, grad norm NaN, then 0).

Run from the repository root: ``python notebooks/solutions/03_lora_reward_nan.py``. Each answer is
measured on the cpu profile with the lesson's own helpers (``trl_clinic.course.companions.reward_nan``), printed,
and asserted, so the file fails if an answer stops being true. Short runs (accumulation 4) keep the whole
file under a minute.
"""

import math
import tempfile

import torch
from datasets import Dataset
from peft import LoraConfig
from trl import RewardTrainer

from trl_clinic.course import data
from trl_clinic.course.companions.reward_nan import head_report, lora, reward_config, train_recorded
from trl_clinic.course.models import make_reward_model
from trl_clinic.course.parameters import start_run
from trl_clinic.probes.recording import StepRecorder
from trl_clinic.course.tokenizer import build_tokenizer

run = start_run("03", "cpu", 0, tempfile.mkdtemp(prefix="solutions-03-"))
tokenizer = build_tokenizer()
pairs: Dataset = data.preference_pairs(4 * 12, seed=run.subseed("train"))


def train(name: str, dtype: torch.dtype, peft_config: LoraConfig, **overrides) -> tuple[RewardTrainer, StepRecorder]:
    """The lesson's report set-up (non-fused AdamW, no mixed precision), 12 steps of batch 1 x 4."""
    args = reward_config(run, name, **{"optim": "adamw_torch", "gradient_accumulation_steps": 4, "max_steps": 12,
                                       "logging_steps": 4, "bf16": False, "fp16": False, **overrides})
    trainer = RewardTrainer(model=make_reward_model(tokenizer, size=run.sizes.model_size, seed=run.seed, dtype=dtype),
                            args=args, train_dataset=pairs, processing_class=tokenizer, peft_config=peft_config)
    return trainer, train_recorded(trainer)


def exercise_1() -> None:
    """Rerun the report with logging_nan_inf_filter=False: what is logged now?"""
    _, recorder = train("no-filter", torch.float16, lora(task_type="SEQ_CLS"), logging_nan_inf_filter=False)
    logged = recorder.series("loss")[1]
    print(f"1. without the NaN filter the logs say {logged}: the NaN itself, instead of a huge number then 0.")
    assert logged and all(math.isnan(v) for v in logged)


def exercise_2() -> None:
    """modules_to_save=["score"] instead of task_type="SEQ_CLS": does the head train and save?"""
    trainer, _ = train("modules-to-save", torch.float32,
                       LoraConfig(task_type=None, r=8, lora_alpha=16, modules_to_save=["score"]))
    head = head_report(run, trainer, "modules-to-save", tokenizer, pairs)
    print(f"2. yes: head trainable {head['head_trainable']}, saved in the adapter {head['score_saved']}, largest "
          f"reward change after a reload under another seed {head['reload_max_reward_change']:.1e}; SEQ_CLS does "
          "exactly this for you.")
    assert head["head_trainable"] and head["score_saved"] and head["reload_max_reward_change"] < 1e-4


def exercise_3() -> None:
    """Same report set-up, but weights in bf16 instead of fp16: does the score head go infinite? Why?"""
    trainer, recorder = train("bf16-weights", torch.bfloat16, lora(task_type="SEQ_CLS"))
    raw = recorder.series("raw_loss")[1]
    head = next(p for n, p in trainer.model.named_parameters() if "score" in n and p.requires_grad)
    # Adam's (1 - beta2) * g**2 for |g| = 1e-3, and eps, in each 16-bit format
    small = {dtype: (torch.tensor((1 - 0.999) * 1e-3 ** 2, dtype=dtype).item(), torch.tensor(1e-8, dtype=dtype).item())
             for dtype in (torch.bfloat16, torch.float16)}
    print(f"3. no: bf16 weights stay finite (raw losses {[f'{v:.3f}' for v in raw]}). (1 - beta2) * g**2 for "
          f"|g| = 1e-3 and eps=1e-8 are {small[torch.bfloat16][0]:.2e} and {small[torch.bfloat16][1]:.2e} in bf16, "
          f"{small[torch.float16][0]:g} and {small[torch.float16][1]:g} in fp16: bf16 keeps fp32's exponent range, "
          "fp16 flushes both to 0 and Adam divides by it.")
    assert all(math.isfinite(v) for v in raw) and torch.isfinite(head).all()
    assert min(small[torch.bfloat16]) > 0 and max(small[torch.float16]) == 0


if __name__ == "__main__":
    exercise_1()
    exercise_2()
    exercise_3()
