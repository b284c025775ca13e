"""Read-only hooks on the forwards the model really receives (lessons 01 and 04).

* Packed rows (positions restarting inside a row, as TRL's padding-free and packing collators send):
  do the sequences see each other? Read from the mask the first attention layer receives, so any
  cause shows: a mask sent with the row, a cache, a model family whose mask ignores ``position_ids``.
  transformers 5.23 builds a block mask from ``position_ids`` only when no attention mask and no cache
  are passed (``masking_utils._preprocess_mask_arguments``); FlashAttention kernels take the boundaries
  from ``cu_seq_lens_*`` or packed ``position_ids`` when no mask reaches them
  (``modeling_flash_attention_utils._flash_attention_forward``).
* Generation from right-padded rows: a forward that reads a KV cache (``past_key_values`` passed, as
  ``generate()`` does from its first forward) whose prompts end in padding predicts its first new
  token at a pad slot.

The hooks only read their arguments: no extra forward, no mode change, no random numbers. A packed
row is checked on its first ``packed_forwards`` training forwards (``WatchConfig``: the collator builds every
batch the same way); a generation on the first forward of each ``generate()`` call. The words of the
findings are the catalogue's (``watch.findings``).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from trl_clinic.probes.batches import restarts
from trl_clinic.probes.finding import Finding
from trl_clinic.probes.padding import right_padded
from trl_clinic.watch.findings import finding

VARLEN_KWARGS = ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k")


def backbone(model: torch.nn.Module) -> torch.nn.Module:
    """The transformers model inside a PEFT wrapper (its forward is the one generation calls), else the model."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def boundary_visible(mask, position_ids: torch.Tensor, attention_kwargs: dict, implementation: str) -> bool | None:
    """Does the first token of some packed sequence see the last token of the one before it?

    ``mask`` is what the attention layer received: a 4D boolean (True: attend) or additive float mask, None
    (a plain causal kernel over the whole row, or FlashAttention left to find the boundaries), or a 2D
    padding mask (FlashAttention unpads by it: one sequence per row). None means it cannot be read here
    (flex attention's BlockMask).
    """
    if "flash" in implementation:
        if mask is None:  # varlen from cu_seq_lens, else from packed position_ids (batch of one row)
            return not (
                all(attention_kwargs.get(k) is not None for k in VARLEN_KWARGS)
                or (attention_kwargs.get("position_ids") is not None and position_ids.shape[0] == 1)
            )
        return True
    if mask is None:
        return True  # sdpa's causal fast path: one causal mask over every sequence of the row
    if not isinstance(mask, torch.Tensor) or mask.dim() != 4:
        return None
    rows, queries, keys = [], [], []
    for row in range(position_ids.shape[0]):
        for start in restarts(position_ids[row]):
            rows.append(min(row, mask.shape[0] - 1))
            queries.append(start)
            keys.append(start - 1)
    values = mask[rows, 0, queries, keys]
    allowed = values if values.dtype == torch.bool else values > torch.finfo(values.dtype).min / 2
    return bool(allowed.any())


class ForwardWatch:
    """Hooks on ``model`` (its transformers backbone) that report findings through ``report``, at the step
    ``step()`` says, reading packed rows on the first ``packed_forwards`` training forwards that hold them."""

    def __init__(
        self,
        model: torch.nn.Module,
        report: Callable[[Finding], None],
        step: Callable[[], int],
        packed_forwards: int,
    ) -> None:
        self.model = backbone(model)
        self.report, self.step, self.packed_forwards = report, step, packed_forwards
        self.packed_checked = 0
        self.generation_done, self.generations = False, 0  # generations: generate() calls seen
        self._packed: dict | None = None  # the packed forward whose attention layer is next
        self._handles = [self.model.register_forward_pre_hook(self._forward, with_kwargs=True)]
        attention = next((m for name, m in self.model.named_modules() if name.endswith("self_attn")), None)
        if attention is not None:
            self._handles.append(attention.register_forward_pre_hook(self._attention, with_kwargs=True))
        else:
            self.packed_checked = self.packed_forwards  # no attention layer found by name: nothing to read

    def _forward(self, module, args, kwargs) -> None:
        cache = kwargs.get("past_key_values")
        if (
            cache is not None
            and not self.generation_done
            and hasattr(cache, "get_seq_length")
            and cache.get_seq_length() == 0
        ):
            self.generations += 1
            self._generation(kwargs.get("attention_mask"))
        positions = kwargs.get("position_ids")
        # generation's forwards (a cache passed in) are not packed rows: left padding restarts positions too
        if (
            module.training
            and cache is None
            and self.packed_checked < self.packed_forwards
            and positions is not None
            and positions.dim() == 2
            and bool((positions[:, 1:] == 0).any())
        ):
            self._packed = {
                "position_ids": positions,
                "mask_sent": kwargs.get("attention_mask") is not None,
                "use_cache": kwargs.get("use_cache"),
            }
            self._recurrent(positions, kwargs)

    def _recurrent(self, positions: torch.Tensor, kwargs: dict) -> None:
        """Linear-attention (Gated DeltaNet) layers carry a state along the row and take the sequences' boundaries
        only from ``seq_idx`` / ``cu_seq_lens_q`` (transformers 5.23 ``Qwen3NextGatedDeltaNet.forward``), never from
        ``position_ids`` or a mask: a packed row without them runs one state through every sequence, whatever the
        full-attention layers' masks say."""
        layer_types = list(getattr(self.model.config, "layer_types", None) or [])
        recurrent = sum(kind == "linear_attention" for kind in layer_types)
        if not recurrent or any(kwargs.get(key) is not None for key in ("seq_idx", "cu_seq_lens_q")):
            return
        self._packed, self.packed_checked = None, self.packed_forwards
        sequences = sum(1 + len(restarts(row)) for row in positions)
        self.report(
            finding(
                "packing",
                self.step(),
                "recurrent",
                "recurrent",
                {"sequences": sequences, "rows": positions.shape[0], "linear_layers": recurrent},
                decided="config",  # read from the arguments the forward receives
                sequences=sequences,
                rows=positions.shape[0],
                width=positions.shape[1],
                recurrent=recurrent,
                layers=len(layer_types),
                model_type=self.model.config.model_type,
            )
        )

    def _generation(self, mask) -> None:
        if mask is None or mask.dim() != 2 or not right_padded(mask):
            return
        self.generation_done = True
        padded = int((mask[:, -1] == 0).sum())
        prompts = mask.shape[0]
        self.report(
            finding(
                "right_padding",
                self.step(),
                "padded",
                "right",
                {"right_padded_prompts": padded, "prompts": prompts},
                padded=padded,
                prompts=prompts,
            )
        )

    def _attention(self, module, args, kwargs) -> None:
        packed, self._packed = self._packed, None
        if packed is None:
            return
        self.packed_checked += 1
        config = self.model.config
        implementation = getattr(config, "_attn_implementation", None) or "eager"
        mask = kwargs.get("attention_mask")
        visible = boundary_visible(mask, packed["position_ids"], kwargs, implementation)
        if not visible:
            if visible is None:
                self.packed_checked = self.packed_forwards  # a mask this watch cannot read: stop looking
            return
        self.packed_checked = self.packed_forwards
        positions = packed["position_ids"]
        sequences = sum(1 + len(restarts(row)) for row in positions)
        if packed["mask_sent"]:
            cause = "mask_sent"
        elif packed["use_cache"] or (packed["use_cache"] is None and getattr(config, "use_cache", False)):
            cause = "cache"
        else:
            cause = "family"  # the model family's mask builder does not read position_ids
        self.report(
            finding(
                "packing",
                self.step(),
                "no_mask" if mask is None else "mask",
                cause,
                {"sequences": sequences, "rows": positions.shape[0]},
                # on FlashAttention the rule is read from the arguments the kernel receives, not measured
                decided="config" if "flash" in implementation else "measured",
                sequences=sequences,
                rows=positions.shape[0],
                width=positions.shape[1],
                implementation=implementation,
                dims=None if mask is None else mask.dim(),
                model_type=config.model_type,
            )
        )

    def remove(self) -> None:
        """The hooks off, and the model let go: the counts stay for the summary."""
        for handle in self._handles:
            handle.remove()
        self._handles, self.model, self._packed = [], None, None
