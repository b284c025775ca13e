"""What the watch costs: seconds per optimizer step with and without ``ClinicWatch``, side by side.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/watch_overhead.py [--repeats 5] [--only CASE ...] [--out x.json]

(run it with nothing else on the machine; the noise left is the range over pairs). Each case is a real trainer of
the lessons' cpu size (and SmolLM2-135M-Instruct), built twice from the same seed and trained once plain and
once watched, ``--repeats`` pairs. A step's time is the interval between two ``on_step_begin`` events (it holds
the whole step: forwards, backward, optimizer, the log of that step and the watch's own work); the first
``WARMUP`` intervals of a run are left out. A step's time depends on its batch, and the two runs of a pair see
the same batches: the overhead of a pair is the ratio of its two totals, and the table gives the median pair
(and the range over pairs: the machine's noise). The seconds spent inside the watch's own code
(``WatchClock``) are summed too: that part of the overhead is measured directly, below the noise. Logging
every step is the watch's worst case (its ``on_log`` runs each step). Prints a markdown table; docs/watch.md
holds the last one.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from importlib.metadata import version
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from transformers import TrainerCallback  # noqa: E402

from trl_clinic.course import examples  # noqa: E402
from trl_clinic.course.models import load_smollm2, make_reward_model  # noqa: E402
from trl_clinic.course.tokenizer import build_tokenizer  # noqa: E402
from trl_clinic.watch import ClinicWatch  # noqa: E402

WARMUP = 2


class WatchClock:
    """Seconds spent inside the watch's own code (its callback events, its training_step listener and its
    forward hooks), summed: the part of the overhead that the machine's run-to-run noise cannot hide."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.saved = []

    def __enter__(self):
        from trl_clinic.watch.forwards import ForwardWatch

        targets = [(ClinicWatch, name) for name in vars(ClinicWatch) if name.startswith("on_")]
        targets += [(ClinicWatch, "_micro_batch"), (ForwardWatch, "_forward"), (ForwardWatch, "_attention")]
        for owner, name in targets:
            original = getattr(owner, name)
            self.saved.append((owner, name, original))
            setattr(owner, name, self._timed(original))
        return self

    def _timed(self, function):
        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - start

        return timed

    def __exit__(self, *exc) -> None:
        for owner, name, original in self.saved:
            setattr(owner, name, original)


class StepClock(TrainerCallback):
    def __init__(self) -> None:
        self.starts: list[float] = []

    def on_step_begin(self, args, state, control, **kwargs):
        self.starts.append(time.perf_counter())

    def on_train_end(self, args, state, control, **kwargs):
        self.starts.append(time.perf_counter())

    def steps(self) -> list[float]:
        return [b - a for a, b in zip(self.starts[WARMUP:], self.starts[WARMUP + 1 :])]


def cases(tokenizer, out: Path) -> dict:
    """name -> (what it is, a function building a fresh trainer); sizes from lesson.yaml's cpu profile."""
    from peft import LoraConfig

    common = {"logging_steps": 1}
    return {
        "sft-accumulation": (
            "lesson 02: SFT, tiny Llama, batch 1 x accumulation 32",
            lambda: examples.sft_trainer(
                tokenizer,
                out,
                rows=256,
                per_device_train_batch_size=1,
                gradient_accumulation_steps=32,
                max_steps=7,
                learning_rate=3e-3,
                **common,
            ),
        ),
        "sft-padding-free": (
            "lesson 01: SFT padding-free, tiny Llama, 16 sequences a row",
            lambda: examples.sft_trainer(
                tokenizer,
                out,
                rows=512,
                padding_free=True,
                max_length=None,
                per_device_train_batch_size=16,
                max_steps=22,
                **common,
            ),
        ),
        "sft-batch-16": (
            "lesson 04: SFT, tiny Qwen2, batch 16",
            lambda: examples.sft_trainer(
                tokenizer, out, family="qwen2", rows=512, per_device_train_batch_size=16, max_steps=22, **common
            ),
        ),
        "reward-lora": (
            "lesson 03: reward model, tiny Llama, LoRA r=8 (SEQ_CLS), batch 1 x 32",
            lambda: examples.reward_trainer(
                tokenizer,
                out,
                model=make_reward_model(tokenizer),
                rows=256,
                peft_config=LoraConfig(task_type="SEQ_CLS", r=8),
                per_device_train_batch_size=1,
                gradient_accumulation_steps=32,
                max_steps=7,
                **common,
            ),
        ),
        "dpo": (
            "lesson 04: DPO, tiny Qwen2, batch 2",
            lambda: examples.dpo_trainer(tokenizer, out, family="qwen2", rows=128, max_steps=22, **common),
        ),
        "grpo": (
            "lesson 05: GRPO, tiny Llama, 4 prompts x 4 generations of 16 tokens",
            lambda: examples.grpo_trainer(tokenizer, out, rows=128, max_completion_length=16, max_steps=12, **common),
        ),
    }


def smollm2_case(out: Path) -> dict:
    def build():
        model, tokenizer = load_smollm2()
        tokenizer.pad_token = tokenizer.pad_token or tokenizer.eos_token
        return examples.sft_trainer(
            tokenizer, out, model=model, rows=64, per_device_train_batch_size=2, max_steps=7, logging_steps=1
        )

    return {"smollm2-sft": ("SFT, SmolLM2-135M-Instruct (fp32), batch 2", build)}


def measure(build, repeats: int) -> dict:
    """``repeats`` pairs of runs (plain, then watched, both from the same seed, so each step sees the same
    batch in both); a pair's overhead is its watched steps' total time over its plain steps' total."""
    pairs, inside = [], []
    for _ in range(repeats):
        pair = []
        for watched in (False, True):
            trainer = build()
            clock = StepClock()
            trainer.add_callback(clock)
            with WatchClock() as own:
                if watched:
                    trainer.add_callback(ClinicWatch(trainer=trainer, show=False))
                trainer.train()
            pair.append(clock.steps())
            if watched:
                inside.append(own.seconds / trainer.state.global_step)
        pairs.append(pair)
    overheads = [100 * (sum(w) / sum(p) - 1) for p, w in pairs]
    plain = statistics.median(statistics.fmean(p) for p, _ in pairs)
    return {
        "plain_s": plain,
        "watched_s": statistics.median(statistics.fmean(w) for _, w in pairs),
        "overhead_pct": statistics.median(overheads),
        "overhead_range_pct": [min(overheads), max(overheads)],
        "inside_s": statistics.median(inside),
        "inside_pct": 100 * statistics.median(inside) / plain,
        "steps_timed": len(pairs[0][0]),
        "pairs": pairs,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5, help="pairs of runs per case")
    parser.add_argument("--only", nargs="+", help="case names")
    parser.add_argument("--out", type=Path, help="also write the numbers, every step's time included, as JSON")
    args = parser.parse_args()
    tokenizer = build_tokenizer()
    work = Path(os.environ.get("TMPDIR", "/tmp")) / "watch-overhead"
    table = {**cases(tokenizer, work), **smollm2_case(work)}
    results = {}
    for name, (what, build) in table.items():
        if args.only and name not in args.only:
            continue
        results[name] = {"what": what, **measure(build, args.repeats)}
        r = results[name]
        print(
            f"{name}: {r['plain_s']:.4f} s plain, {r['watched_s']:.4f} s watched, {r['overhead_pct']:+.1f} %; "
            f"{r['inside_s']:.5f} s a step inside the watch ({r['inside_pct']:.2f} %)",
            flush=True,
        )
    meta = {
        "device": f"cpu ({platform.processor() or platform.machine()}, {os.cpu_count()} cores)",
        "torch_threads": torch.get_num_threads(),
        "repeats": args.repeats,
        "warmup_steps_dropped": WARMUP,
        **{lib: version(lib) for lib in ("torch", "transformers", "trl", "peft")},
    }
    if args.out:
        args.out.write_text(json.dumps({"meta": meta, "results": results}, indent=1))
    print(
        f"\n{meta}\n\n| case | steps timed x pairs | s/step plain | s/step watched | overhead (median pair) | "
        "range over pairs | s/step inside the watch |\n|---|---|---|---|---|---|---|"
    )
    for r in results.values():
        low, high = r["overhead_range_pct"]
        print(
            f"| {r['what']} | {r['steps_timed']} x {args.repeats} | {r['plain_s']:.4f} | {r['watched_s']:.4f} | "
            f"{r['overhead_pct']:+.1f} % | {low:+.1f} to {high:+.1f} % | {r['inside_s']:.5f} "
            f"({r['inside_pct']:.2f} %) |"
        )


if __name__ == "__main__":
    main()
