"""Probe 7: the known-bugs table (``known_bugs.yaml``), matched like pip-audit matches advisories.

Each entry holds one bug: the lesson, what is broken, the fix, the conditions (installed versions,
device, model family, kernel, trainer, collator, arguments) under which it applies, and ``read``: the
released files its version window was read in. An entry that a probe can measure names that probe
(``probe: packing``): the probe decides by measuring, and cites the entry as the cause when its
measurement fails (``explain``). The ``known_bugs`` probe reports only the entries that nothing here can
measure (a GPU's cuBLAS); a table decides nothing by running, so such a finding warns, never fails.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from importlib import metadata
from importlib.resources import files
from typing import Any

import yaml
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from trl_clinic.checkup.engine import probe
from trl_clinic.checkup.view import TrainerView
from trl_clinic.probes.finding import Finding

CONDITIONS = (
    "packages",
    "model_type",
    "attn_implementation",
    "attn_not",
    "trainer",
    "gpu_name",
    "collator",
    "collator_args",
    "args",
    "config",
    "init_kwargs",
    "quantized",
    "peft",
)


def load() -> list[dict[str, Any]]:
    entries = yaml.safe_load(files("trl_clinic.checkup").joinpath("known_bugs.yaml").read_text())
    for entry in entries:
        unknown = set(entry["when"]) - set(CONDITIONS)
        if unknown:
            raise ValueError(f"known_bugs.yaml {entry['id']}: unknown condition(s) {', '.join(sorted(unknown))}")
    return entries


def installed(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


@dataclass
class Facts:
    """What an entry's conditions are matched against; ``from_view`` reads it from a trainer."""

    model_type: str = ""
    attn_implementation: str = ""
    trainer: str = ""
    gpu_name: str = ""
    collator: list[str] = field(default_factory=list)  # the collator's class and its bases, by name
    collator_args: dict[str, Any] = field(default_factory=dict)  # the collator's own attributes
    args: dict[str, Any] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)
    init_kwargs: list[str] = field(default_factory=list)
    quantized: bool = False  # the base model was loaded in 4 or 8 bits (bitsandbytes)
    peft: dict[str, Any] = field(default_factory=dict)  # the PEFT adapter's config attributes (use_dora, r...)
    versions: dict[str, str] = field(default_factory=dict)  # overrides the installed versions (tests, "what if")

    def version(self, package: str) -> str | None:
        return self.versions.get(package) or installed(package)

    @classmethod
    def from_view(cls, view: TrainerView) -> Facts:
        import torch

        config = view.base_model.config
        collator = view.trainer.data_collator
        gpu = torch.cuda.get_device_name(view.device) if view.device.type == "cuda" else ""
        args = {name: getattr(view.args, name, None) for name in vars(view.args)} | {"world_size": view.args.world_size}
        return cls(
            model_type=config.model_type,
            attn_implementation=config._attn_implementation or "",
            trainer=view.kind,
            gpu_name=gpu,
            collator=[c.__name__ for c in type(collator).__mro__],
            collator_args={k: v for k, v in vars(collator).items() if isinstance(v, (bool, int, float, str))}
            if hasattr(collator, "__dict__")
            else {},
            args=args,
            config=config.to_dict() | {"use_cache": getattr(config, "use_cache", None)},
            init_kwargs=list(getattr(view.args, "model_init_kwargs", None) or {}),
            quantized=bool(getattr(view.base_model, "is_loaded_in_4bit", False))
            or bool(getattr(view.base_model, "is_loaded_in_8bit", False)),
            peft=_adapter_settings(view.model),
        )


def _adapter_settings(model) -> dict[str, Any]:
    """The first PEFT adapter's plain settings (``use_dora``, ``r``...); {} without PEFT."""
    configs = getattr(model, "peft_config", None)
    if not configs:
        return {}
    config = next(iter(configs.values()))
    return {k: v for k, v in vars(config).items() if isinstance(v, (bool, int, float, str))}


def _value_holds(wanted: Any, actual: Any) -> bool:
    if isinstance(wanted, str) and wanted.startswith(">"):
        return isinstance(actual, (int, float)) and actual > float(wanted[1:])
    return actual == wanted


def applies(entry: dict[str, Any], facts: Facts) -> bool:
    """Whether every condition of ``entry['when']`` holds for ``facts``."""
    when = entry["when"]
    for package, spec in when.get("packages", {}).items():
        version = facts.version(package)
        if version is None or not SpecifierSet(spec).contains(Version(version), prereleases=True):
            return False
    checks = [
        facts.model_type in when.get("model_type", [facts.model_type]),
        facts.attn_implementation in when.get("attn_implementation", [facts.attn_implementation]),
        facts.attn_implementation not in when.get("attn_not", []),
        facts.trainer in when.get("trainer", [facts.trainer]),
        facts.gpu_name in when["gpu_name"] if "gpu_name" in when else True,  # whole device names, never substrings
        any(name in facts.collator for name in when["collator"]) if "collator" in when else True,
        all(_value_holds(v, facts.collator_args.get(k)) for k, v in when.get("collator_args", {}).items()),
        all(_value_holds(v, facts.args.get(k)) for k, v in when.get("args", {}).items()),
        all(_value_holds(v, facts.config.get(k)) for k, v in when.get("config", {}).items()),
        all(key in facts.init_kwargs for key in when.get("init_kwargs", [])),
        facts.quantized == when["quantized"] if "quantized" in when else True,
        all(_value_holds(v, facts.peft.get(k)) for k, v in when.get("peft", {}).items()),
    ]
    return all(checks)


def matching(facts: Facts, probe_name: str | None = None) -> list[dict[str, Any]]:
    """The entries that apply; with ``probe_name``, only those that probe measures, without it only those that
    nothing measures (the ``known_bugs`` probe's)."""
    return [e for e in load() if applies(e, facts) and e.get("probe") == probe_name]


def explain(view: TrainerView, probe_name: str) -> dict[str, Any] | None:
    """The first entry of ``probe_name`` that applies to this trainer: the known cause of what it measured."""
    found = matching(Facts.from_view(view), probe_name)
    return found[0] if found else None


@probe(
    "known_bugs",
    "README",
    "a known bug that no probe can measure here (a GPU's library build, a report) applies "
    "to the installed versions, device, model family, kernel and arguments: known_bugs.yaml, like pip-audit for "
    "training bugs. Decided by the table, so it warns and never fails.",
)
def known_bugs(view: TrainerView) -> list[Finding]:
    entries, facts = load(), Facts.from_view(view)
    found = [
        Finding(
            "known_bugs",
            "warn",
            entry["id"],
            fix=f"{entry['fix']} ({entry['bug']})",
            lesson=entry["lesson"],
            decided="table",
            known_bug=entry["id"],
        )
        for entry in matching(facts)
    ]
    unmeasured = sum(1 for e in entries if "probe" not in e)
    versions = ", ".join(f"{p} {installed(p)}" for p in ("torch", "transformers", "trl"))
    return found or [
        Finding(
            "known_bugs",
            "ok",
            f"0 of {unmeasured} table-only entries match",
            value=0,
            decided="table",
            reason=f"{versions}, {facts.model_type}, {facts.attn_implementation}",
        )
    ]
