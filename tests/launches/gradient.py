"""Run in every process of a launch: the first window's gradient as the check-up computes it (the trainer's own
``training_step`` on this process's micro-batches, inside ``untouched``: on the gathered weights where they are
sharded), averaged over the processes as the engine reduces it, against the gradient the engine holds when its first
optimizer step begins. DeepSpeed: ``deepspeed.utils.safe_get_full_grad``, read before ``engine.step``, which accelerate
calls inside the last micro-batch's backward (accelerate 1.15.0 ``utils/deepspeed.py``
``DeepSpeedEngineWrapper.backward``). FSDP2 (sharded at load by transformers): each reduced ``DTensor`` gradient made
whole at ``on_pre_optimizer_step``, after clipping (transformers 5.23.0 ``trainer.py``), so the recipe turns clipping
off. Writes each tensor's relative difference to ``OUT/result-<process>.json``.

usage: gradient.py RECIPE OUT
"""

import json
import sys
from pathlib import Path

import torch.distributed as dist
from transformers import TrainerCallback

from trl_clinic.checkup.command import build_trainer
from trl_clinic.checkup.step import run_window
from trl_clinic.checkup.view import TrainerView, untouched

recipe, out = sys.argv[1], sys.argv[2]
trainer = build_trainer("sft", ["--config", recipe])
assert not trainer.args.max_grad_norm, "the engine's gradient is compared before clipping"
view = TrainerView(trainer)
with untouched(trainer):
    trainer.model.train()
    run_window(trainer, view.batches(trainer.args.gradient_accumulation_steps))
    ours = {name: p.grad.float().clone() for name, p in trainer.model.named_parameters() if p.requires_grad}
for grad in ours.values():
    dist.all_reduce(grad)
    grad /= dist.get_world_size()

engines = {}


def whole(grad):
    return (grad.full_tensor() if hasattr(grad, "full_tensor") else grad).float().clone()


class FirstStep(TrainerCallback):
    """The engine's gradient when its first optimizer step begins."""

    def on_train_begin(self, args, state, control, **kwargs):
        if not trainer.is_deepspeed_enabled:
            return
        from deepspeed.utils import safe_get_full_grad

        engine = trainer.model_wrapped
        step = engine.step

        def read_then_step(*args, **kwargs):
            if not engines:
                engines.update((n, whole(safe_get_full_grad(p))) for n, p in engine.module.named_parameters())
            return step(*args, **kwargs)

        engine.step = read_then_step

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        if not engines and not trainer.is_deepspeed_enabled:
            engines.update((n, whole(p.grad)) for n, p in trainer.model.named_parameters() if p.requires_grad)


trainer.add_callback(FirstStep())
trainer.train()
differences = {name: float((ours[name] - engines[name]).norm() / engines[name].norm()) for name in ours}
result = {"process": trainer.args.process_index, "tensors": len(ours), "differences": differences}
(Path(out) / f"result-{result['process']}.json").write_text(json.dumps(result))
