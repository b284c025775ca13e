"""Weights held sharded across the processes before ``train()``, whole while the check-up's passes run and sharded
again after: DeepSpeed ZeRO-3's partitions and torch's ``fully_shard`` (FSDP2) shards.

**ZeRO-3.** With ``zero3_init_flag`` transformers builds the model inside ``deepspeed.zero.Init`` (transformers 5.23.0
``modeling_utils.py`` ``get_init_context``): each parameter keeps an empty ``data`` and this process's slice of it in
``ds_tensor``, its real shape and size in ``ds_shape`` and ``ds_numel`` (deepspeed 0.19.8
``runtime/zero/partition_parameters.py`` ``_convert_to_deepspeed_param``, ``free_param``). In training DeepSpeed's
engine gathers each module's weights in a forward pre-hook and frees them after (``runtime/zero/parameter_offload.py``
``setup_zero_stage3_hooks``), but accelerate builds that engine in ``prepare``, inside ``train()`` (accelerate 1.15.0
``accelerator.py`` ``_prepare_deepspeed``): before it, a forward meets the empty weights (``'weight' must be 2-D``).
Here they are gathered with ``GatheredParameters(params, modifier_rank=None)``: an all-gather on entry, and on exit
each is partitioned again without being written back (``_exit``, ``has_been_updated=False``).

**FSDP2.** transformers shards a model at load with ``from_pretrained(..., distributed_config=DistributedConfig(
fsdp_size=N))`` (``distributed/utils.py`` ``initialize_distributed_mesh``), and the Trainer trains it as it is
(``trainer.py``: ``is_distributed_loading_by_transformers``; accelerate does not wrap it). Every parameter is then a
``DTensor`` shard and each managed module all-gathers its weights in a forward pre-hook and reduce-scatters their
gradient, averaged over the processes, in backward (torch 2.13.0 ``distributed/fsdp/_fully_shard/_fsdp_state.py``
``FSDPState.init``, ``_fsdp_param_group.py`` ``post_backward``): a probe would get the processes' mean gradient, not
this process's, and every forward would be a collective its shard decides. Here each managed module is unsharded once
(``FSDPModule.unshard``: its whole parameters are registered on the modules, ``_fsdp_param.py`` ``to_unsharded``), its
FSDP hooks are set aside so the passes are plain local autograd, and afterwards the hooks are put back in place and
each module resharded (``FSDPModule.reshard``: the shards registered again, the whole copies freed).

Either way the gathering happens once for the whole check-up, not per probe: it is a collective, every process must
make the same calls in the same order, and a probe's passes depend on its process's shard (a micro-batch without label
tokens has no backward). Autograd then puts the window's gradient whole in each ``p.grad``, as on a model that was
never sharded: the gradient this process's micro-batches give, which the engine would average across the processes
(ZeRO-3 reduce-scatters it and accumulates it in the weights' dtype, deepspeed 0.19.8 ``runtime/engine.py``
``get_data_types``), as DDP does.

The whole weights and their gradient are bytes training never holds at once, so they must fit the check-up's budget;
over it nothing is gathered, and a forward through a sharded module raises ``Skip`` with the bytes it needed. Models
DeepSpeed already wraps (TRL's reference model under ZeRO-3, trl 1.16.0 ``models/utils.py`` ``prepare_deepspeed``)
gather their own weights in their forward and are left alone.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

from torch import nn

from trl_clinic.checkup.engine import Skip
from trl_clinic.checkup.step import size


def is_partitioned(p: nn.Parameter) -> bool:
    """A ZeRO-3 parameter (deepspeed 0.19.8 ``runtime/zero/utils.py`` ``is_zero_param``: it has a ``ds_id``)."""
    return hasattr(p, "ds_id")


def numel(p: nn.Parameter) -> int:
    """The parameter's real size: ``ds_numel`` where ZeRO-3 holds it partitioned (its ``numel()`` is 0 then); a
    ``DTensor`` shard's ``numel()`` is already its whole size."""
    return int(getattr(p, "ds_numel", p.numel()))


def parameter_count(model: nn.Module) -> int:
    """Every parameter of ``model`` counted at its real size, sharded or not."""
    return sum(numel(p) for p in model.parameters())


def _wrapped_by_deepspeed(module: nn.Module) -> bool:
    return any(c.__name__ == "DeepSpeedEngine" for c in type(module).__mro__)


def _own(models: list[nn.Module]) -> list[nn.Module]:
    """The models whose weights nothing gathers before ``train()``: those DeepSpeed wraps already left out."""
    return [m for m in models if not _wrapped_by_deepspeed(m)]


def partitioned(models: list[nn.Module]) -> list[nn.Parameter]:
    """The ZeRO-3 partitioned parameters of ``models`` that nothing gathers before ``train()``, each once: those of
    the models DeepSpeed wraps already (their engine gathers them) left out."""
    engines = {id(p) for m in models if _wrapped_by_deepspeed(m) for p in m.parameters()}
    found = {id(p): p for m in _own(models) for p in m.parameters() if is_partitioned(p) and id(p) not in engines}
    return list(found.values())


def fully_sharded(models: list[nn.Module]) -> list[nn.Module]:
    """The modules torch's ``fully_shard`` (FSDP2) manages, each once, in module order (the order their unshard, a
    collective, must keep on every process)."""
    found = {
        id(m): m
        for model in _own(models)
        for m in model.modules()
        if hasattr(m, "unshard") and hasattr(m, "_get_fsdp_state")
    }
    return list(found.values())


def whole_bytes(params: list[nn.Parameter]) -> int:
    """What gathering ``params`` holds: each weight whole, and the whole gradient of each trainable one."""
    return sum(numel(p) * p.element_size() * (2 if p.requires_grad else 1) for p in params)


def refusal(engine: str, processes: int | None, needed: int, budget: int) -> str:
    """Why a forward is not run: the model is sharded, and whole it does not fit the budget."""
    across = f" across {processes} processes" if processes else ""
    return (
        f"{engine} holds the model sharded{across}; a forward here needs it whole: {size(needed)} (every weight, and "
        f"the gradient of the trainable ones), over the check-up's budget of {size(budget)}: checkup(trainer, "
        "budget=...) or --budget BYTES, or run the check-up where the model is whole (one process, DDP, ZeRO-2, or "
        "ZeRO-3 with zero3_init_flag false)"
    )


def _processes(zero: list[nn.Parameter], fsdp: list[nn.Parameter]) -> int | None:
    if zero:
        return getattr(zero[0], "ds_zero_partition_world_size", None)
    mesh = getattr(fsdp[0], "device_mesh", None)
    return mesh.size() if mesh is not None else None


def _handles(handle) -> list:
    """A hook handle's single handles (FSDP2 registers a group's hooks as one ``_MultiHandle``)."""
    return list(getattr(handle, "handles", None) or [handle])


def _drop_gradients(params: list[nn.Parameter]) -> None:
    for p in params:
        p.grad = None


def _slots(modules: list[nn.Module]) -> dict[int, list[tuple[nn.Module, str]]]:
    """Where each parameter of ``modules`` is registered, by the parameter: a tied weight (an embedding and its output
    head) is one parameter in two slots."""
    seen, slots = set(), {}
    for module in modules:
        for owner in module.modules():
            for name, p in owner._parameters.items():
                if p is not None and (id(owner), name) not in seen:
                    seen.add((id(owner), name))
                    slots.setdefault(id(p), []).append((owner, name))
    return slots


@contextmanager
def _unsharded(modules: list[nn.Module]) -> Iterator[None]:
    """FSDP2's ``modules`` whole and without their FSDP hooks while the block runs (see the module): each hooks dict
    the hooks sit in is copied before they leave it and refilled in place after, so every hook keeps its place and
    every handle its dict. A tied weight comes back whole once per FSDP group that holds it (transformers shards a tied
    embedding with the embedding, trl 1.16.0's SFT on a tied Llama: two copies), so its slots are tied to its first
    copy again, and its gradient sums both uses as the shard's does in training. Afterwards the whole parameters get
    back their flags (FSDP keeps them for its next unshard) and lose the gradients left on them, the copies are put
    back, and each module reshards."""
    suspended: dict[int, tuple[dict, dict]] = {}
    retied: list[tuple[nn.Module, str, nn.Parameter]] = []
    flags: list[tuple[nn.Parameter, bool]] = []
    ties = [places for places in _slots(modules).values() if len(places) > 1]
    try:
        for module in modules:
            module.unshard()
        flags = [(p, p.requires_grad) for module in modules for p in module.parameters()]  # FSDP reuses them
        for (owner, name), *others in ties:
            for other, other_name in others:
                retied.append((other, other_name, other._parameters[other_name]))
                other._parameters[other_name] = owner._parameters[name]
        for module in modules:
            state = module._get_fsdp_state()
            for handle in _handles(state._pre_forward_hook_handle) + _handles(state._post_forward_hook_handle):
                hooks = handle.hooks_dict_ref()
                if hooks is not None and handle.id in hooks:
                    suspended.setdefault(id(hooks), (hooks, dict(hooks)))
                    del hooks[handle.id]
        yield
    finally:
        for p, flag in flags:
            p.requires_grad_(flag)
            p.grad = None
        for hooks, content in suspended.values():
            hooks.clear()
            hooks.update(content)
        for other, other_name, copy in retied:
            other._parameters[other_name] = copy
        for module in modules:
            module.reshard()


@contextmanager
def gathered(models: list[nn.Module], budget: int) -> Iterator[None]:
    """``models``' sharded parameters whole while the block runs (see the module), then sharded again, with the
    gradients the block left on them dropped first. Over the budget nothing is gathered: a forward pre-hook on each
    module that holds a sharded parameter, ahead of any hook of FSDP's, raises ``Skip`` saying what it needed.
    Without sharded parameters, nothing happens."""
    zero, modules = partitioned(models), fully_sharded(models)
    fsdp = list({id(p): p for m in modules for p in m.parameters()}.values())
    if not zero and not fsdp:
        yield
        return
    with ExitStack() as stack:
        needed = whole_bytes(zero + fsdp)
        if needed > budget:
            engine = "DeepSpeed ZeRO-3" if zero else "torch's fully_shard (FSDP2)"
            reason = refusal(engine, _processes(zero, fsdp), needed, budget)

            def refuse(module, args):
                raise Skip(reason)

            held, managed = {id(p) for p in zero + fsdp}, {id(m) for m in modules}
            owners = {id(m): m for model in _own(models) for m in model.modules()}.values()
            for module in owners:
                if id(module) in managed or any(id(p) in held for p in module.parameters(recurse=False)):
                    stack.callback(module.register_forward_pre_hook(refuse, prepend=True).remove)
            yield
            return
        if zero:
            from deepspeed.runtime.zero.partition_parameters import GatheredParameters

            stack.enter_context(GatheredParameters(zero, modifier_rank=None))
            stack.callback(_drop_gradients, zero)  # runs first: no whole gradient beside an emptied weight
        if modules:
            stack.enter_context(_unsharded(modules))
        yield
