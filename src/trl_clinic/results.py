"""A lesson's verdict: the numbers it measured and the claims they were checked against.

Every notebook ends by writing ``metrics.json`` (read by the tests and the workbook report) and then
asserting its checks, so the file records the truth even when a check fails.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from trl_clinic.parameters import Run
from trl_clinic.runtime import device_report

METRICS_FILE = "metrics.json"


def json_safe(value: object) -> object:
    """JSON-safe copy: floats that are not finite become strings ("nan", "inf") instead of invalid JSON."""
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if hasattr(value, "item"):  # numpy or torch scalars
        return json_safe(value.item())
    return value


def save_metrics(run: Run, lesson: str, numbers: dict, symptom: dict[str, bool], fix: dict[str, bool]) -> dict:
    """Write ``metrics.json``: ``symptom`` holds the checks that the bad run shows the failure,
    ``fix`` those that the fixed run does not."""
    checks = {**symptom, **fix}
    for name, passed in checks.items():
        if not isinstance(passed, bool):
            raise TypeError(f"check {name!r} must be a bool, got {passed!r}")
    payload = {
        "lesson": lesson,
        "profile": run.profile.name,
        "seed": run.seed,
        "symptom_reproduced": all(symptom.values()),
        "fix_verified": all(fix.values()),
        "checks": {"symptom": symptom, "fix": fix},
        "numbers": numbers,
        "versions": run.versions,
        "device": device_report(run.device),
    }
    payload = json_safe(payload)
    (run.output_dir / METRICS_FILE).write_text(json.dumps(payload, indent=2))
    return payload


def failed_checks(metrics: dict) -> list[str]:
    return [name for group in metrics["checks"].values() for name, passed in group.items() if not passed]


def load_metrics(output_dir: str | Path) -> dict:
    return json.loads((Path(output_dir) / METRICS_FILE).read_text())
