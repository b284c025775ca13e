"""Worked solutions to lesson 03's exercises (LoRA reward model: loss 1e+34, grad norm NaN, then 0).

Run from the repository root: ``python notebooks/solutions/03_lora_reward_nan.py``. Each answer is
measured on the cpu profile with the lesson's own helpers, printed, and asserted, so the file fails
if an answer stops being true. Short runs (accumulation 4) keep the whole file under a minute.
"""

import math
import tempfile

import torch
from peft import LoraConfig
from safetensors import safe_open
from trl import RewardConfig, RewardTrainer

from trl_clinic import data
from trl_clinic.models import make_reward_model
from trl_clinic.parameters import start_run
from trl_clinic.recording import StepRecorder
from trl_clinic.tokenizer import build_tokenizer

run = start_run("03", "cpu", 0, tempfile.mkdtemp(prefix="solutions-03-"))
tokenizer = build_tokenizer()
pairs = data.preference_pairs(4 * 12, seed=run.subseed("train"))


def train(name: str, dtype: torch.dtype, peft_config: LoraConfig, **overrides) -> tuple[RewardTrainer, StepRecorder]:
    """The lesson's report set-up (non-fused AdamW, no mixed precision), 12 steps of batch 1 x 4."""
    args = RewardConfig(**{**run.trainer_kwargs(name, progress=False), "per_device_train_batch_size": 1,
                           "gradient_accumulation_steps": 4, "learning_rate": 5e-3, "optim": "adamw_torch",
                           "max_steps": 12, "logging_steps": 4, **overrides})
    trainer = RewardTrainer(model=make_reward_model(tokenizer, size="tiny", seed=run.seed, dtype=dtype), args=args,
                            train_dataset=pairs, processing_class=tokenizer, peft_config=peft_config)
    recorder = StepRecorder().watch(trainer)
    trainer.train()
    return trainer, recorder


def exercise_1() -> None:
    """Rerun the report with logging_nan_inf_filter=False: what is logged now?"""
    _, recorder = train("no-filter", torch.float16, LoraConfig(task_type="SEQ_CLS", r=8, lora_alpha=16),
                        logging_nan_inf_filter=False)
    logged = recorder.series("loss")[1]
    print(f"1. without the NaN filter the logs say {logged}: the NaN itself, instead of a huge number then 0.")
    assert logged and all(math.isnan(v) for v in logged)


def exercise_2() -> None:
    """modules_to_save=["score"] instead of task_type="SEQ_CLS": does the head train and save?"""
    trainer, _ = train("modules-to-save", torch.float32,
                       LoraConfig(task_type=None, r=8, lora_alpha=16, modules_to_save=["score"]))
    trainable = [n for n, p in trainer.model.named_parameters() if p.requires_grad and "score" in n]
    trainer.save_model(str(run.output_dir / "adapter"))
    with safe_open(str(run.output_dir / "adapter" / "adapter_model.safetensors"), "pt") as saved:
        saved_head = [k for k in saved.keys() if "score" in k]
    print(f"2. yes: the head is trainable ({trainable}) and saved ({saved_head}); SEQ_CLS does exactly this for you.")
    assert trainable and saved_head


def exercise_3() -> None:
    """Same report set-up, but weights in bf16 instead of fp16: does the score head go infinite? Why?"""
    trainer, recorder = train("bf16-weights", torch.bfloat16, LoraConfig(task_type="SEQ_CLS", r=8, lora_alpha=16))
    raw = recorder.series("raw_loss")[1]
    head = next(p for n, p in trainer.model.named_parameters() if "score" in n and p.requires_grad)
    tiny = torch.tensor((1 - 0.999) * 1e-3 ** 2, dtype=torch.bfloat16).item()
    print(f"3. no: bf16 weights stay finite (raw losses {[f'{v:.3f}' for v in raw]}). bf16 keeps fp32's exponent "
          f"range, so Adam's (1 - beta2) * g**2 = 1e-9 for |g| = 1e-3 is {tiny:.2e}, not 0, and eps=1e-8 survives; "
          "fp16 flushes both to 0 and divides by it.")
    assert all(math.isfinite(v) for v in raw) and torch.isfinite(head).all() and tiny > 0


if __name__ == "__main__":
    exercise_1()
    exercise_2()
    exercise_3()
