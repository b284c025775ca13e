"""Probe: a run of several processes whose model will not be wrapped, so no gradient is ever averaged.

What was seen (2 processes, accelerate 1.15.0, transformers 5.23.0, torch 2.13.0+cpu, a machine without a GPU):
TRL's ``accelerate_configs/fsdp2.yaml`` (``num_processes: 2``), ``accelerate launch --config_file fsdp2.yaml`` and
``TrainingArguments(ddp_backend="gloo")`` without ``use_cpu=True`` trained two unwrapped models: the logged loss was
twice a process's own (12.48 against 6.24), each process logged its own, and the check-up and the watch said nothing.
``torchrun --nproc_per_node 2`` with the same arguments and no accelerate config does the same. The code path:

* transformers 5.23.0 ``training_args.py`` ``TrainingArguments._setup_devices`` builds ``PartialState(backend=
  "gloo")``, with ``cpu=True`` only under ``use_cpu``;
* accelerate 1.15.0 ``state.py`` ``PartialState._prepare_backend``: with ``LOCAL_RANK`` set, not ``cpu`` and no GPU
  (nor any other accelerator), no branch picks a type, and ``MULTI_CPU`` is picked only when ``cpu`` is true: the
  type is ``DistributedType.NO``; ``PartialState.__init__`` still initialises the process group with the backend it
  was given (gloo) and reads ``num_processes`` 2 from it;
* ``AcceleratorState.__init__`` turns an FSDP plugin into ``DistributedType.FSDP`` only from the GPU-like types
  (``MULTI_GPU``, ``MULTI_XPU``, ...), so it stays ``NO``;
* ``accelerator.py`` ``Accelerator.prepare_model`` wraps a model in ``DistributedDataParallel`` for those GPU-like
  types and for ``MULTI_CPU``, shards it for ``FSDP``, hands it to DeepSpeed for ``DEEPSPEED``, and returns it
  as it is for ``NO``;
* meanwhile ``Trainer.compute_loss`` multiplies each process's loss by ``accelerator.num_processes`` (2) for the
  average DDP would take, and ``Trainer._get_num_items_in_batch`` divides by ``accelerator.gather`` of the label
  tokens, which under ``NO`` returns this process's count alone: each process steps its own model with twice its
  own token-mean loss.

So the reading is certain: ``distributed_type`` NO with several processes is a model left unwrapped. The probe
reads it on every process, after the first window measures what the trainer's own ``get_batch_samples`` divides the
loss by (this process's label tokens, or every process's), and gathers both: one verdict on every process. In one
process it skips, saying why. The watch's ``replicas`` check measures the consequence (weights that differ across
processes after the first optimizer step).
"""

from __future__ import annotations

from collections.abc import Mapping

from trl_clinic.checkup.engine import Skip, probe
from trl_clinic.checkup.view import TrainerView
from trl_clinic.probes.finding import Finding
from trl_clinic.probes.processes import Processes

FIX = "use_cpu=True on CPU processes (accelerate's MULTI_CPU: DDP over gloo), or one GPU per process"

# what accelerate 1.15.0 Accelerator.prepare_model does with the model, by distributed_type (NO: nothing)
WRAPS = {
    "MULTI_CPU": "DistributedDataParallel",
    "FSDP": "FSDP",
    "DEEPSPEED": "DeepSpeed's engine",
    "XLA": "XLA's data parallel",
    "MEGATRON_LM": "Megatron-LM",
    **{
        name: "DistributedDataParallel"
        for name in ("MULTI_GPU", "MULTI_MLU", "MULTI_SDAA", "MULTI_MUSA", "MULTI_NPU", "MULTI_XPU", "MULTI_HPU")
    },
    "MULTI_NEURON": "DistributedDataParallel",
}


def _type_name(value) -> str:
    return str(getattr(value, "value", value)).split(".")[-1]


def _window_tokens(view: TrainerView) -> tuple[int, int] | None:
    """(this process's label tokens in the first window, the ``num_items_in_batch`` the trainer divides its loss
    by), from the trainer's own ``get_batch_samples`` on its first window (its collective, under a working launch,
    gathers every process's count); None where the trainer counts none (no token labels, a loss that takes no
    ``num_items_in_batch``)."""
    from trl_clinic.checkup.step import _window_samples
    from trl_clinic.probes.labels import targets

    batches = view.batches(max(1, view.args.gradient_accumulation_steps))
    if not batches or not isinstance(batches[0], Mapping) or "labels" not in batches[0]:
        return None
    _, items = _window_samples(view.trainer, batches, view.args.device)
    if items is None:
        return None
    own = sum(int(targets(batch).sum()) for batch in batches)
    return own, int(items)


@probe(
    "replicas",
    "-",
    "a run of several processes whose model accelerate will not wrap (distributed_type NO: on a machine without a "
    "GPU, processes launched without use_cpu=True): each process trains its own replica, no gradient is averaged, "
    "and the logged loss is scaled by the number of processes; or processes that read different launches.",
)
def replicas(view: TrainerView) -> Finding:
    processes = Processes.of(view.args)
    if processes.count < 2:
        raise Skip("one process: no replicas to compare")
    if not processes.several:
        raise Skip(f"args.world_size is {processes.count} but torch.distributed is not initialised: nothing to compare")
    accelerator = view.trainer.accelerator
    kind = _type_name(accelerator.distributed_type)
    tokens = _window_tokens(view)  # every process gets here: the trainer's count gathers across them
    mine = {"type": kind, "processes": int(accelerator.num_processes), "tokens": tokens}
    everyone = processes.gather(mine)
    kinds = [seen["type"] for seen in everyone]
    wraps = [WRAPS.get(seen, "nothing") for seen in kinds]
    if len(set(kinds)) > 1:
        listed = ", ".join(f"process {i}: {k} ({w})" for i, (k, w) in enumerate(zip(kinds, wraps)))
        return Finding(
            "replicas",
            "fail",
            f"the {processes.count} processes read different launches: {listed}",
            decided="config",
            fix="launch every process with the same accelerate config and TrainingArguments",
            value=float(len(set(kinds))),
        )
    counted = [seen["tokens"] for seen in everyone]
    if kind == "NO":
        measured = (
            f"{processes.count} processes and accelerate's distributed_type NO on every one: "
            "Accelerator.prepare_model will return the model unwrapped, so each process trains its own replica on "
            "its own shard and no gradient is averaged"
        )
        if all(c is not None for c in counted):
            own = [c[0] for c in counted]
            divided = [c[1] for c in counted]
            measured += (
                f"; the first window divides each process's loss by its own label tokens ({divided} against "
                f"{own} counted on the processes) and multiplies it by {processes.count}: the logged loss is "
                f"{processes.count}x a process's own"
            )
        return Finding("replicas", "fail", measured, decided="config", fix=FIX, value=float(processes.count))
    measured = f"{wraps[0]} over {processes.count} processes (accelerate's {kind}): the gradients are averaged"
    if all(c is not None for c in counted):
        measured += (
            f"; the first window's num_items_in_batch {counted[0][1]} counts the label tokens of every process "
            f"({' + '.join(str(c[0]) for c in counted)})"
        )
    return Finding("replicas", "ok", measured, decided="config", value=float(processes.count))
