"""DeepSpeed ZeRO-3's partitioned weights, whole while the check-up's passes run and partitioned again after.

With ``zero3_init_flag`` transformers builds the model inside ``deepspeed.zero.Init`` (transformers 5.23.0
``modeling_utils.py`` ``get_init_context``): each parameter keeps an empty ``data`` and this process's slice of it in
``ds_tensor``, its real shape and size in ``ds_shape`` and ``ds_numel`` (deepspeed 0.19.8
``runtime/zero/partition_parameters.py`` ``_convert_to_deepspeed_param``, ``free_param``). In training DeepSpeed's
engine gathers each module's weights in a forward pre-hook and frees them after (``runtime/zero/parameter_offload.py``
``setup_zero_stage3_hooks``), but accelerate builds that engine in ``prepare``, inside ``train()`` (accelerate 1.15.0
``accelerator.py`` ``_prepare_deepspeed``): before it, a forward meets the empty weights (``'weight' must be 2-D``).

So for the check-up's passes every partitioned parameter of the models it runs is gathered whole at once
(``deepspeed.zero.GatheredParameters(params, modifier_rank=None)``: an all-gather on entry, and on exit each is
partitioned again without being written back, ``_exit`` ``has_been_updated=False``), once for the whole check-up and
not per probe: the gather is a collective, every process must make the same calls in the same order, and a probe's
passes depend on its process's shard (a micro-batch without label tokens has no backward). Autograd then puts the
window's gradient whole in each ``p.grad``, as on a model that was never partitioned: the gradient this process's
micro-batches give, which DeepSpeed would reduce-scatter across the processes and accumulate in the weights' dtype
(``runtime/engine.py`` ``get_data_types``: ``grad_accum_dtype`` defaults to the model's dtype), as DDP averages it.

The whole weights and their gradient are bytes training never holds at once, so they must fit the check-up's budget;
over it nothing is gathered, and a forward through a partitioned module raises ``Skip`` with the bytes it needed.
Models DeepSpeed already wraps (TRL's reference model under ZeRO-3, ``trl 1.16.0 models/utils.py prepare_deepspeed``)
gather their own weights in their forward and are left alone.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

from torch import nn

from trl_clinic.checkup.engine import Skip
from trl_clinic.checkup.step import size


def is_partitioned(p: nn.Parameter) -> bool:
    """A ZeRO-3 parameter (``deepspeed.runtime.zero.utils.is_zero_param``: it has a ``ds_id``)."""
    return hasattr(p, "ds_id")


def numel(p: nn.Parameter) -> int:
    """The parameter's real size: ``ds_numel`` where ZeRO-3 holds it partitioned (its ``numel()`` is 0 then)."""
    return int(getattr(p, "ds_numel", p.numel()))


def parameter_count(model: nn.Module) -> int:
    """Every parameter of ``model`` counted at its real size, partitioned or not."""
    return sum(numel(p) for p in model.parameters())


def _wrapped_by_deepspeed(module: nn.Module) -> bool:
    return any(c.__name__ == "DeepSpeedEngine" for c in type(module).__mro__)


def partitioned(models: list[nn.Module]) -> list[nn.Parameter]:
    """The partitioned parameters of ``models`` that nothing gathers before ``train()``, each once: those of the
    models DeepSpeed wraps already (their engine gathers them) left out."""
    engines = {id(p) for m in models if _wrapped_by_deepspeed(m) for p in m.parameters()}
    found = {id(p): p for m in models for p in m.parameters() if is_partitioned(p) and id(p) not in engines}
    return list(found.values())


def whole_bytes(params: list[nn.Parameter]) -> int:
    """What gathering ``params`` holds: each weight whole, and the whole gradient of each trainable one."""
    return sum(numel(p) * p.element_size() * (2 if p.requires_grad else 1) for p in params)


def refusal(params: list[nn.Parameter], budget: int) -> str:
    """Why a forward is not run: the model is partitioned, and whole it does not fit the budget."""
    ranks = getattr(params[0], "ds_zero_partition_world_size", None)
    across = f" across {ranks} processes" if ranks else ""
    return (
        f"DeepSpeed ZeRO-3 holds the model partitioned{across} until train() builds its engine; a forward here needs "
        f"it whole: {size(whole_bytes(params))} (every weight, and the gradient of the trainable ones), over the "
        f"check-up's budget of {size(budget)}: checkup(trainer, budget=...) or --budget BYTES, or run the check-up "
        "where the model is whole (zero3_init_flag false, ZeRO-2, or one process)"
    )


@contextmanager
def gathered(models: list[nn.Module], budget: int) -> Iterator[None]:
    """``models``' partitioned parameters whole while the block runs (see the module), then partitioned again, with
    the gradients the block left on them dropped first (a whole gradient beside an empty weight). Over the budget
    nothing is gathered: a forward pre-hook on each module that holds a partitioned parameter raises ``Skip`` saying
    what it needed. Without partitioned parameters, nothing happens."""
    params = partitioned(models)
    if not params:
        yield
        return
    with ExitStack() as stack:
        if whole_bytes(params) > budget:
            reason = refusal(params, budget)

            def refuse(module, args):
                raise Skip(reason)

            held = {id(p) for p in params}
            owners = {id(m): m for model in models for m in model.modules()}.values()
            for module in owners:
                if any(id(p) in held for p in module.parameters(recurse=False)):
                    stack.callback(module.register_forward_pre_hook(refuse).remove)
            yield
            return
        from deepspeed.runtime.zero.partition_parameters import GatheredParameters

        stack.enter_context(GatheredParameters(params, modifier_rank=None))
        try:
            yield
        finally:
            for p in params:
                p.grad = None
