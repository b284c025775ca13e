"""What the check-up costs beside a training step: SmolLM2-135M-Instruct (real weights), SFTTrainer batch 4 x
accumulation 2, max_length 256, CPU, one thread (docs/cost.md holds the last table). One measurement per fresh
process, one after the other (on this project's shared machine, under cpu-slot):

    python benchmarks/checkup_cost.py all OUT.json [WHAT,...]   WHAT: train (3 optimizer steps) | checkup |
                                                                probe:NAME; SETUPS=full,lora (default), and
                                                                full-nockpt, lora-nockpt: checkpointing off
    python benchmarks/checkup_cost.py child WHAT SETUP          one measurement, printed as RESULT {json}

Peak resident memory is read from /proc/self/status (VmHWM) after resetting it (clear_refs 5) once the trainer is
built, so "peak" is the peak during the measured call and "base" the resident set before it."""

import json
import os
import re
import subprocess
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")


def status(key):
    return int(re.search(rf"{key}:\s+(\d+)", open("/proc/self/status").read()).group(1)) * 1024


def build(setup, steps=1):
    import tempfile

    import torch
    from peft import LoraConfig
    from trl import SFTConfig, SFTTrainer

    from trl_clinic.course.data import instruction_pairs
    from trl_clinic.course.models import load_smollm2

    torch.set_num_threads(1)
    model, tok = load_smollm2()
    config = SFTConfig(
        output_dir=tempfile.mkdtemp(),
        per_device_train_batch_size=4,
        gradient_accumulation_steps=2,
        max_length=256,
        max_steps=steps,
        report_to="none",
        save_strategy="no",
        disable_tqdm=True,
        use_cpu=True,
        bf16=False,
        seed=0,
        logging_steps=1,
        gradient_checkpointing="nockpt" not in setup,
    )
    peft = LoraConfig(r=16, target_modules="all-linear", task_type="CAUSAL_LM") if "lora" in setup else None
    return SFTTrainer(
        model=model,
        args=config,
        processing_class=tok,
        train_dataset=instruction_pairs(64, seed=0, max_people=24),
        peft_config=peft,
    )


def child(what, setup):
    from transformers import TrainerCallback

    trainer = build(setup, steps=3 if what == "train" else 1)
    lengths = [len(r["input_ids"]) for r in trainer.train_dataset.select(range(8))]
    base = status("VmRSS")
    open("/proc/self/clear_refs", "w").write("5")
    result = {
        "what": what,
        "setup": setup,
        "base_rss": base,
        "first_lengths": lengths,
        "trainable": sum(p.numel() for p in trainer.model.parameters() if p.requires_grad),
        "parameters": sum(p.numel() for p in trainer.model.parameters()),
        "malloc_mmap_threshold": os.environ.get("MALLOC_MMAP_THRESHOLD_"),
    }
    if what == "train":

        class Clock(TrainerCallback):
            def __init__(self):
                self.marks, self.peaks = [], []

            def on_step_begin(self, args, state, control, **kw):
                self.marks.append(time.perf_counter())

            def on_step_end(self, args, state, control, **kw):
                self.marks.append(time.perf_counter())
                self.peaks.append(status("VmHWM"))

        clock = Clock()
        trainer.add_callback(clock)
        start = time.perf_counter()
        trainer.train()
        m = clock.marks
        result.update(
            seconds=time.perf_counter() - start,
            step_seconds=[m[i + 1] - m[i] for i in range(0, len(m), 2)],
            peak_after_step=clock.peaks,
        )
    else:
        from trl_clinic import checkup

        only = [what.split(":", 1)[1]] if what.startswith("probe:") else None
        start = time.perf_counter()
        report = checkup(trainer, only=only, show=False)
        result.update(
            seconds=time.perf_counter() - start,
            findings=[
                (f.probe, f.status, round(f.seconds, 2), f.measured[:240] or f.reason[:120]) for f in report.findings
            ],
        )
    result["peak_rss"] = status("VmHWM")
    print("RESULT " + json.dumps(result), flush=True)


def main():
    if sys.argv[1] == "child":
        return child(sys.argv[2], sys.argv[3])
    out = sys.argv[2]
    probes = [
        "packing",
        "accumulation",
        "fp16_adamw",
        "init_dtype",
        "reward_head",
        "padding_cache",
        "equal_rewards",
        "labels_present",
        "eos_label",
        "gradients_reach",
        "known_bugs",
    ]
    whats = sys.argv[3].split(",") if len(sys.argv) > 3 else ["train", "checkup"] + [f"probe:{p}" for p in probes]
    results = json.load(open(out)) if os.path.exists(out) else []
    for setup in (os.environ.get("SETUPS") or "full,lora").split(","):
        for what in whats:
            if any(r["what"] == what and r["setup"] == setup for r in results):
                continue
            run = subprocess.run([sys.executable, __file__, "child", what, setup], capture_output=True, text=True)
            line = next((out for out in run.stdout.splitlines() if out.startswith("RESULT ")), None)
            if line is None:
                print(what, setup, "FAILED", run.stderr[-2000:], flush=True)
                continue
            r = json.loads(line[7:])
            results.append(r)
            json.dump(results, open(out, "w"), indent=1)
            print(
                f"{setup:5} {what:22} {r['seconds']:7.2f} s  peak {r['peak_rss'] / 1e9:.2f} GB  "
                f"base {r['base_rss'] / 1e9:.2f} GB  {r.get('step_seconds', '')}",
                flush=True,
            )


if __name__ == "__main__":
    main()
