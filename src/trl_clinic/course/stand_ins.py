"""Stand-ins: old library behaviour re-created on today's stack, and faults injected on purpose.

Everything a lesson shows that is *not* today's real code path lives here, so that a notebook's
import line says what is real: ``from trl_clinic.course.stand_ins import ...`` means "re-created" or
"injected", and the notebook, ``metrics.json`` and the report label it so. Each stand-in names the
library version and the code it stands for.
"""

from __future__ import annotations

import os
import signal
import sys

import torch.nn.functional as F
from transformers import LlamaForCausalLM, Trainer, TrainerCallback
from trl import SFTTrainer

from trl_clinic.course.crash import native_sigfpe

RECREATED, INJECTED = "recreated", "injected"

# Re-creations that run inside an era, whose script cannot import this package: named here with what they stand
# for, and labelled the same way where they are defined.
IN_ERAS = {
    "then_04.as_flash_attention_2": "RE-CREATED: a Qwen2 loaded with eager attention, then told it is "
    "FlashAttention-2 (its config; on transformers <= 4.47 also the model's field and its layers' class), as loading "
    "it with FlashAttention-2 on a GPU leaves it; the old code then runs for real up to the first flash kernel call, "
    "which needs flash-attn and a CUDA GPU (lesson 04's era checks are `recreated`).",
}


def recreate_pre_446_loss(trainer: Trainer) -> Trainer:
    """RE-CREATED: the gradient-accumulation loss of transformers before 4.46, on a model that accepts loss kwargs.

    Stands for ``Trainer.training_step`` of transformers 4.45: ``compute_loss(model, inputs)`` returned
    the model's loss, a mean over the micro-batch's own label tokens, and accelerate's
    ``Accelerator.backward`` divided it by ``gradient_accumulation_steps`` (``num_items_in_batch`` and
    ``model_accepts_loss_kwargs`` arrived in 4.46.0). Today's ``Trainer.training_step`` still takes
    that path when ``model_accepts_loss_kwargs`` is False: no ``num_items_in_batch`` reaches the loss,
    and each micro-batch mean is divided by the accumulation steps (for a model class that declares
    ``accepts_loss_kwargs = False`` it does so for real: lesson 02's core). Lesson 02's deep dive checks
    this re-creation against the real 4.45.2 in its era. Set after the trainer is built (the trainer sets
    the attribute in ``__init__``).
    """
    trainer.model_accepts_loss_kwargs = False
    return trainer


class MeanPerMicroBatchSFTTrainer(SFTTrainer):
    """INJECTED: a user's ``compute_loss`` override that drops ``num_items_in_batch``, set on purpose.

    Stands for user code (lesson 02's deep dive; the core's exercise 3 writes the same class): the loss is the
    mean over this micro-batch's label tokens. Because the override accepts ``num_items_in_batch``, today's
    Trainer believes the loss is already normalised for accumulation and does not divide by the steps.
    """

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        return super().compute_loss(model, inputs, return_outputs=return_outputs, num_items_in_batch=None)


def die_by_sigfpe() -> None:
    """INJECTED: die by SIGFPE, through torch's real kernel trap where the processor has one.

    On x86, ``crash.native_sigfpe`` traps and the process dies in the kernel. A processor whose division
    does not trap (ARM) returns from it; then the process sends itself SIGFPE, saying so on stderr, so the
    stand-in dies the same way on every machine. Only ``InjectedH20Fault`` uses it; the lessons' checks of a
    real native crash call ``crash.native_sigfpe`` and see whether it trapped.
    """
    native_sigfpe()
    print("stand-in: this processor's division did not trap; sending SIGFPE by hand", file=sys.stderr, flush=True)
    os.kill(os.getpid(), signal.SIGFPE)


class MeanLossTrainer(Trainer):
    """INJECTED: a user's ``compute_loss`` that takes the mean over its own micro-batch's tokens and ignores
    ``num_items_in_batch``, set on purpose.

    Stands for the custom losses users write (lesson 02's deep dive, section 4): the override leaves
    ``loss_is_scaled_for_ga`` unset and the model takes loss kwargs, so today's Trainer counts the window's tokens,
    believes the loss already normalised by that count and does not divide it by the steps (transformers 5.23.0
    ``trainer.py``, ``training_step``), so each micro-batch's tokens weigh by its own count. Lesson 06 and the
    check-up's tests trip the ``accumulation`` probe and the watch with it; ``examples.SumLossTrainer`` is the same
    loss written right.
    """

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        labels = inputs.pop("labels")
        outputs = model(**inputs)
        loss = F.cross_entropy(outputs.logits[:, :-1].flatten(0, 1).float(), labels[:, 1:].flatten(), ignore_index=-100)
        return (loss, outputs) if return_outputs else loss


class ListedArgumentsLlama(LlamaForCausalLM):
    """INJECTED: a Llama whose ``forward`` lists its arguments and takes no ``**kwargs``, set on purpose.

    Stands for any model class that takes no loss keywords: a user's subclass like this one, or the transformers
    classes that declare ``accepts_loss_kwargs = False`` (lesson 02's Qwen2.5-VL). The Trainer then sets
    ``model_accepts_loss_kwargs = False`` and divides each micro-batch's mean loss by the accumulation steps
    (transformers 5.23.0 ``trainer.py``, ``Trainer.__init__`` and ``training_step``): lesson 06's deep dive.
    """

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, labels=None, use_cache=None):
        return super().forward(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            labels=labels,
            use_cache=use_cache,
        )


class InjectedH20Fault(TrainerCallback):
    """INJECTED: dies with a native SIGFPE at the first step when ``bf16`` is on.

    Stands in for the crash of TRL issue #2906 (TRL 0.14.0, torch 2.5.1+cu121, an H20 GPU; gone with
    ``bf16=False``), which needs an H20 GPU. Floating point exceptions on H20 with torch's cu121 wheels
    are reported for a bf16 ``nn.Linear`` (pytorch #133548) and an fp16 ``matmul`` (pytorch #152017);
    that #2906 is the same crash is inferred, not measured. It reproduces the report's *shape* (a native
    SIGFPE at the first step, only with ``bf16``) so that crash isolation and bisection can be shown on
    a real process death; it says nothing about cuBLAS.
    """

    def on_step_begin(self, args, state, control, **kwargs):
        if args.bf16:
            die_by_sigfpe()
