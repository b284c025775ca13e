"""Numbers as JSON, non-finite ones included: a NaN loss is the finding, not an error (no torch import)."""

from __future__ import annotations

import math


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
