"""Where ``stalled_update`` draws its lines: what a share of updates lost to 16-bit rounding costs a training run.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bf16_updates.py [--steps 300] [--lrs 2e-5 1e-4 ...] [--out x.json]

A tiny Llama of the course (``make_causal_lm``, size "tiny": hidden 128, 2 layers, weights initialised at
transformers' std 0.02, norm weights 1.0, the scales a pretrained model's matrices and norms have) trained with
SFTTrainer on the course's instruction pairs (prompt-completion, batch 8, max_length 64, AdamW, constant learning
rate, seed 0), twice from the same weights on the same batches:

* ``bf16``: the weights in bfloat16, stepped as they are (a plain Trainer, one process or DDP: weights, compute and
  AdamW's state in bfloat16);
* ``fp32``: the same weights in float32: what the optimizer steps under DeepSpeed ZeRO's float32 master weights or
  FSDP's float32 upcast.

Not SmolLM2-135M: this machine's CPU has no bfloat16 matrix units (AVX2), and a bfloat16 matmul of SmolLM2's shapes
took 52 times a float32 one (2.7 s against 0.052 s, one thread), so its bfloat16 arm would take days.

For each learning rate it records the check-up's ``stalled_update`` on the bf16 trainer before training (its share),
the held-out loss of both runs on 64 rows they never trained on, before and after, and what share of the float32
run's improvement the bfloat16 run lost. docs/checkup.md and ``checkup/updates.py`` quote the last run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from importlib.metadata import version

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from trl import SFTConfig, SFTTrainer  # noqa: E402

from trl_clinic import checkup  # noqa: E402
from trl_clinic.course.data import instruction_pairs  # noqa: E402
from trl_clinic.course.models import make_causal_lm  # noqa: E402
from trl_clinic.course.tokenizer import build_tokenizer  # noqa: E402

ROWS, HELD_OUT, BATCH, MAX_LENGTH = 2400, 64, 8, 64


def trainer(dtype: torch.dtype, lr: float, steps: int, out: str) -> SFTTrainer:
    tokenizer = build_tokenizer()
    model = make_causal_lm(tokenizer, size="tiny", seed=0, dtype=dtype)
    rows = instruction_pairs(ROWS + HELD_OUT, seed=0)
    config = SFTConfig(
        output_dir=out,
        per_device_train_batch_size=BATCH,
        per_device_eval_batch_size=16,
        max_length=MAX_LENGTH,
        learning_rate=lr,
        lr_scheduler_type="constant",
        optim="adamw_torch",
        max_steps=steps,
        use_cpu=True,
        logging_steps=10,
        save_strategy="no",
        eval_strategy="no",
        report_to="none",
        disable_tqdm=True,
        seed=0,
        dataloader_drop_last=True,
    )
    return SFTTrainer(
        model=model,
        args=config,
        processing_class=tokenizer,
        train_dataset=rows.select(range(ROWS)),
        eval_dataset=rows.select(range(ROWS, ROWS + HELD_OUT)),
    )


def run(lr: float, steps: int) -> dict:
    result = {"lr": lr}
    for name, dtype in (("bf16", torch.bfloat16), ("fp32", torch.float32)):
        with tempfile.TemporaryDirectory() as out:
            built = trainer(dtype, lr, steps, out)
            if name == "bf16":
                (found,) = checkup(built, only=["stalled_update"], show=False).findings
                result["probe"] = {"status": found.status, "share": found.value, "measured": found.measured}
            before = built.evaluate()["eval_loss"]
            start = time.perf_counter()
            built.train()
            losses = [row["loss"] for row in built.state.log_history if "loss" in row]
            result[name] = {
                "held_out_before": before,
                "held_out_after": built.evaluate()["eval_loss"],
                "train_last20": statistics.fmean(losses[-20:]),
                "train_first": losses[0],
                "seconds": time.perf_counter() - start,
            }
        print(json.dumps({name: result[name], "lr": lr}), flush=True)
    gained = result["fp32"]["held_out_before"] - result["fp32"]["held_out_after"]
    kept = result["bf16"]["held_out_before"] - result["bf16"]["held_out_after"]
    result["improvement_lost"] = 1 - kept / gained if gained > 0 else None
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--lrs", type=float, nargs="+", default=[2e-5, 1e-4, 3e-4, 1e-3, 3e-3])
    parser.add_argument("--out")
    options = parser.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    record = {
        "machine": platform.machine(),
        "threads": torch.get_num_threads(),
        "versions": {p: version(p) for p in ("torch", "transformers", "trl")},
        "steps": options.steps,
        "runs": [run(lr, options.steps) for lr in options.lrs],
    }
    print("| lr | stalled_update (bf16) | unchanged | held-out loss, bf16 | held-out loss, fp32 | improvement lost |")
    print("|---|---|---|---|---|---|")
    for r in record["runs"]:
        lost = "-" if r["improvement_lost"] is None else f"{r['improvement_lost']:.0%}"
        print(
            f"| {r['lr']:g} | {r['probe']['status']} | {r['probe']['share']:.1%} | "
            f"{r['bf16']['held_out_before']:.3f} -> {r['bf16']['held_out_after']:.3f} | "
            f"{r['fp32']['held_out_before']:.3f} -> {r['fp32']['held_out_after']:.3f} | {lost} |"
        )
    if options.out:
        with open(options.out, "w") as handle:
            json.dump(record, handle, indent=2)


if __name__ == "__main__":
    main()
