"""One process of a prompt-completion SFT run (TRL's SFTTrainer, a tiny Llama, per-device batch 1) with the watch on,
as a practitioner launched it on two processes (torchrun or accelerate launch, gloo, CPU). ``sft.py JSON``: a JSON
object of options (``seed``, ``steps``, ``batch``: per-device batch size, ``lr``, ``window``, ``stop_on``,
``spike_at``: an optimizer step whose loss is multiplied by ``spike_by`` on every process, ``resume``: a checkpoint
step to save then resume from, ``deepspeed``/``fsdp``: nothing here, the launcher's accelerate config decides).
Each process prints one ``RESULT {json}`` line: its index, the step it ended at, its findings, the loss Trainer
logged and this process's own raw loss per step. Run by tests/test_processes_*.py, standalone so it can be
launched."""

import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from transformers import TrainerCallback  # noqa: E402
from trl import SFTConfig, SFTTrainer  # noqa: E402

from trl_clinic.course.data import instruction_pairs  # noqa: E402
from trl_clinic.course.models import make_causal_lm  # noqa: E402
from trl_clinic.course.tokenizer import build_tokenizer  # noqa: E402
from trl_clinic.probes.launch import Launch  # noqa: E402


class SpikedSFTTrainer(SFTTrainer):
    """Multiplies the loss of every micro-batch of optimizer step ``spike_at`` by ``spike_by`` on every process: an
    injected jump of the run's loss, the same in one process and in two (its backward is scaled the same way)."""

    spike_at, spike_by = None, 1.0

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        loss = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        if self.state.global_step + 1 == self.spike_at:
            loss = loss * self.spike_by
        return loss


class StopAt(TrainerCallback):
    """Ends a run after optimizer step ``step`` (its checkpoint saved), as a run stopped and resumed later."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        control.should_training_stop = state.global_step >= self.step
        return control


def build(options: dict, out: str) -> SFTTrainer:
    tokenizer = build_tokenizer()
    config = {
        "output_dir": out,
        "per_device_train_batch_size": options.get("batch", 1),
        "gradient_accumulation_steps": options.get("accumulation", 1),
        "max_steps": options.get("steps", 128),
        "learning_rate": options.get("lr", 1e-3),
        "logging_steps": options.get("logging_steps", 1),
        "report_to": "none",
        "save_strategy": "no",
        "disable_tqdm": True,
        "seed": options.get("seed", 0),
        "bf16": False,
        "fp16": options.get("fp16", False),
        "activation_checkpointing": False,
        "use_cpu": options.get("use_cpu", True),  # on a CPU, processes join over gloo only with use_cpu
        **options.get("args", {}),
    }
    trainer = SpikedSFTTrainer(
        model=make_causal_lm(tokenizer),
        args=SFTConfig(**config),
        processing_class=tokenizer,
        train_dataset=instruction_pairs(options.get("rows", 512), seed=options.get("data_seed", 0)),
    )
    trainer.spike_at, trainer.spike_by = options.get("spike_at"), options.get("spike_by", 1.0)
    return trainer


def main() -> None:
    options = json.loads(sys.argv[1])
    out = os.environ.get("RUN_OUT", "/tmp/trl-clinic-sft")
    resume = options.get("resume")
    if resume:  # train to the checkpoint without the watch, then resume from it with the watch
        torch.manual_seed(options.get("seed", 0))
        first = build(
            {**options, "args": {**options.get("args", {}), "save_strategy": "steps", "save_steps": resume}}, out
        )
        first.add_callback(StopAt(resume))
        first.train()
    torch.manual_seed(options.get("seed", 0))
    trainer = build(options, out)
    watch = None
    if options.get("watch", True):
        from trl_clinic.watch import ClinicWatch

        watch = ClinicWatch(trainer=trainer, stop_on=options.get("stop_on"), window=options.get("window", 10))
        trainer.add_callback(watch)
    launch = Launch.of(trainer)
    trainer.train(resume_from_checkpoint=f"{out}/checkpoint-{resume}" if resume else None)
    logged = [row["loss"] for row in trainer.state.log_history if "loss" in row]
    result = {
        "process": trainer.args.process_index,
        "processes": trainer.args.world_size,
        "step": trainer.state.global_step,
        "findings": [(f.probe, f.step, f.process) for f in watch.findings] if watch else [],
        "logged": logged,
        "raw": [row["raw_loss"] for row in watch.steps] if watch else [],
        "checks": watch.checks if watch else {},
        "launch": launch.described,
        "distributed_type": str(trainer.accelerator.distributed_type),
        "wrapped": type(trainer.model_wrapped).__name__,
    }
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    from run import end  # this folder's run.py: the same end as every launched script here

    main()
    end()
