"""Worked solutions to lesson 06's exercises (the check-up on your own trainer).

Run from the repository root: ``python notebooks/solutions/06_checkup_your_trainer.py``. Each answer is
measured on the cpu profile's tiny trainers (``trl_clinic.course.examples``, fp32, seed 0) with today's
real trainers and the real probes, printed, and asserted, so the file fails if an answer stops being true.
"""

import json
import tempfile
from pathlib import Path

import torch

from trl_clinic import checkup
from trl_clinic.course import examples
from trl_clinic.course.tokenizer import build_tokenizer

OUT = Path(tempfile.mkdtemp(prefix="solutions-06-"))
TOKENIZER = build_tokenizer()


def exercise_1() -> None:
    """Only the accumulation probe, on the symptom's trainer with gradient_accumulation_steps=1."""
    trainer = examples.custom_trainer(TOKENIZER, OUT / "one", examples.MeanLossTrainer, gradient_accumulation_steps=1)
    [found] = checkup(trainer, only=["accumulation"], show=False).findings
    print(f"1. accumulation: {found.status} ({found.reason}): with one micro-batch per step there is no window "
          "in which tokens could be reweighted, so the custom loss's mean is the batch's mean and nothing is measured.")
    assert found.status == "skipped" and "gradient_accumulation_steps is 1" in found.reason


def exercise_2() -> None:
    """Which families does the packing probe flag with padding_free=True?"""
    verdicts = {}
    for family in ("llama", "qwen2", "opt"):
        trainer = examples.sft_trainer(TOKENIZER, OUT / family, family=family, padding_free=True, max_length=None,
                                       per_device_train_batch_size=4)
        [found] = checkup(trainer, only=["packing"], show=False).findings
        verdicts[family] = (found.status, found.value)
    print("2. " + "; ".join(f"{family}: {status} (largest relative loss change {value:.2g})"
                            for family, (status, value) in verdicts.items())
          + ". OPT builds its causal mask without position_ids, so its packed sequences see each other.")
    assert verdicts["opt"][0] == "fail" and verdicts["llama"][0] == verdicts["qwen2"][0] == "ok"


def exercise_3() -> None:
    """The symptom trainer's report as JSON, and the probes that failed."""
    trainer = examples.custom_trainer(TOKENIZER, OUT / "json", examples.MeanLossTrainer, gradient_accumulation_steps=4)
    report = json.loads(checkup(trainer, show=False).to_json())
    failed = sorted({f["probe"] for f in report["findings"] if f["status"] == "fail"})
    print(f"3. failed probes: {failed}; report['failed'] = {report['failed']} (the command line's --json prints "
          "the same object and exits 1)")
    assert failed == ["accumulation"] and report["failed"] is True


if __name__ == "__main__":
    torch.set_num_threads(1)
    exercise_1()
    exercise_2()
    exercise_3()
