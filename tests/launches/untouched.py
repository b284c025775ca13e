"""Run in every process of a launch: build the trainer ``trl sft --config RECIPE`` would train, give it an
optimizer, run the whole check-up, and write what the check-up changed (nothing, compared bit for
bit as ``tests/test_checkup_untouched.py`` does, and each sharded parameter's shard: ZeRO-3's slice ``ds_tensor``,
status, empty ``data`` and gather depth, FSDP2's local ``DTensor`` shard), the verdicts, and the parameters counted, as
``OUT/result-<process>.json``. With ``BUDGET``, the check-up's guard runs the probes under that budget
(``untouched(trainer, budget=...)``).

usage: untouched.py RECIPE OUT [BUDGET]
"""

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for the bit-for-bit snapshot

import test_checkup_untouched  # noqa: E402
from test_checkup_untouched import differences, identities, snapshot  # noqa: E402

from trl_clinic.checkup import load_probes  # noqa: E402
from trl_clinic.checkup.command import build_trainer  # noqa: E402
from trl_clinic.checkup.engine import run_probe, selected  # noqa: E402
from trl_clinic.checkup.sharded import is_partitioned, parameter_count  # noqa: E402
from trl_clinic.checkup.view import TrainerView, untouched  # noqa: E402


def bits(tensor: torch.Tensor) -> tuple:
    """``test_checkup_untouched.bits``, of a ``DTensor``'s local shard (a whole view of it would be a collective)."""
    return whole_bits(tensor.to_local() if hasattr(tensor, "to_local") else tensor)


whole_bits, test_checkup_untouched.bits = test_checkup_untouched.bits, bits  # the snapshot's model weights too


def shards(model: torch.nn.Module) -> dict:
    """Each sharded parameter as its engine holds it: ZeRO-3's slice (``ds_tensor``), status and empty data, or an
    FSDP2 ``DTensor``'s local shard; its gradient, flag, and ZeRO-3's active modules and gather depth."""
    found = {}
    for name, p in model.named_parameters():
        if is_partitioned(p):
            found[name] = {
                "slice": bits(p.ds_tensor),
                "status": p.ds_status.name,
                "data": tuple(p.data.shape),
                "active": sorted(p.ds_active_sub_modules),
                "depth": getattr(p, "_ds_z3_gathered_param_context_depth", None),
            }
        elif hasattr(p, "to_local"):
            found[name] = {"slice": bits(p.to_local()), "type": type(p).__name__, "object": id(p)}
        else:
            continue
        found[name].update(grad=None if p.grad is None else bits(p.grad), flag=p.requires_grad)
    return found


recipe, out, budget = sys.argv[1], sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 1 << 30
trainer = build_trainer("sft", ["--config", recipe])
trainer.create_optimizer()
torch.manual_seed(7)
before, held = snapshot(trainer), identities(trainer)
sliced = shards(trainer.model)
load_probes()
view = TrainerView(trainer, budget=budget)
findings = []
with untouched(trainer, budget=budget):
    for spec in selected():
        findings += run_probe(spec, view)
after = identities(trainer)
changed = differences(before, snapshot(trainer)) + differences(sliced, shards(trainer.model))
changed += [key for key, objects in held.items() if any(a is not b for a, b in zip(objects, after[key]))]
result = {
    "process": trainer.args.process_index,
    "sharded": len(sliced),
    "parameters": parameter_count(trainer.model),
    "numel": sum(p.numel() for p in trainer.model.parameters()),
    "changed": changed,
    "findings": [(f.probe, f.status, f.decided, f.measured or f.reason) for f in findings],
}
(Path(out) / f"result-{result['process']}.json").write_text(json.dumps(result))
