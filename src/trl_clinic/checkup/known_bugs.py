"""Probe 7: the README's "bugs through the versions" table as data, matched like pip-audit matches advisories.

``known_bugs.yaml`` holds one entry per bug: the lesson, what is broken, the fix, and the conditions
(installed versions, device, model family, kernel, trainer, arguments) under which it applies.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from importlib import metadata
from importlib.resources import files
from typing import Any

import yaml
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from trl_clinic.checkup.engine import Finding, probe
from trl_clinic.checkup.view import TrainerView


def load() -> list[dict[str, Any]]:
    return yaml.safe_load(files("trl_clinic.checkup").joinpath("known_bugs.yaml").read_text())


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
    args: dict[str, Any] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)
    init_kwargs: list[str] = field(default_factory=list)
    versions: dict[str, str] = field(default_factory=dict)  # overrides the installed versions (tests, "what if")

    def version(self, package: str) -> str | None:
        return self.versions.get(package) or installed(package)

    @classmethod
    def from_view(cls, view: TrainerView) -> Facts:
        import torch

        config = view.base_model.config
        gpu = torch.cuda.get_device_name(view.device) if view.device.type == "cuda" else ""
        args = {name: getattr(view.args, name, None) for name in vars(view.args)} | {"world_size": view.args.world_size}
        return cls(model_type=config.model_type, attn_implementation=config._attn_implementation or "",
                   trainer=view.kind, gpu_name=gpu, args=args, config=config.to_dict() | {"use_cache": config.use_cache},
                   init_kwargs=list(getattr(view.args, "model_init_kwargs", None) or {}))


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
        when.get("gpu_name", "") in facts.gpu_name if "gpu_name" in when else True,
        all(_value_holds(v, facts.args.get(k)) for k, v in when.get("args", {}).items()),
        all(_value_holds(v, facts.config.get(k)) for k, v in when.get("config", {}).items()),
        all(key in facts.init_kwargs for key in when.get("init_kwargs", [])),
    ]
    return all(checks)


def matching(facts: Facts, probe_name: str | None = None) -> list[dict[str, Any]]:
    """The entries that apply; with ``probe_name``, only those that probe decides (after its measurement),
    without it only those that need no measurement."""
    return [e for e in load() if applies(e, facts) and e.get("probe") == probe_name]


def finding(entry: dict[str, Any], probe_name: str = "known_bugs") -> Finding:
    return Finding(probe_name, entry["status"], entry["id"], fix=f"{entry['fix']} ({entry['bug']})",
                   lesson=entry["lesson"])


@probe("known_bugs", "README", "a bug from the README's 'bugs through the versions' table applies to the installed "
       "versions, device, model family, kernel and arguments (known_bugs.yaml; like pip-audit for training bugs).")
def known_bugs(view: TrainerView) -> list[Finding]:
    entries, facts = load(), Facts.from_view(view)
    found = [finding(e) for e in matching(facts)]
    versions = ", ".join(f"{p} {installed(p)}" for p in ("torch", "transformers", "trl"))
    return found or [Finding("known_bugs", "ok", f"0 of {len(entries)} entries match", value=0,
                             reason=f"{versions}, {facts.model_type}, {facts.attn_implementation}")]
