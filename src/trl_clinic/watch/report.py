"""The watch's end of run: a short summary, and a self-contained HTML page (``report=`` / ``--report``)."""

from __future__ import annotations

import html
import json
import math
from pathlib import Path

from trl_clinic.probes.jsonable import json_safe
from trl_clinic.watch.findings import CATALOGUE, as_dict, lesson_name, where, wrapped


def statuses(watch) -> dict[str, str]:
    """Each check's outcome in words: where it found something, what it saw when it did not."""
    found = {f.probe: f"found at step {f.step}" for f in watch.findings}
    return {key: found.get(key) or watch.checks.get(key, "nothing seen") for key in CATALOGUE}


def summary(watch) -> str:
    """The end of run on a screen: each finding's step and fix (its line said what was seen), then the checks that
    found nothing, by name in one line (``watch.checks`` and the HTML report say what each saw)."""
    steps = len(watch.steps)
    head = f"[trl-clinic watch] {steps} optimizer steps watched: " + (
        f"{len(watch.findings)} finding(s)" if watch.findings else "no findings"
    )
    lines = [head]
    for f in watch.findings:
        lines.append(wrapped(f"step {f.step}{where(f)} {f.probe}, {lesson_name(f.lesson)}; fix: {f.fix}", "  "))
    silent = [key for key, state in statuses(watch).items() if not state.startswith("found")]
    if silent:
        lines.append(wrapped(f"nothing found by {', '.join(silent)} (watch.checks says what each saw)", "  "))
    return "\n".join(lines)


def _svg(rows: list[dict], width: int = 640, height: int = 200) -> str:
    """Raw loss per step (line) and the logged loss (dots); a non-finite raw loss is a red bar."""
    raw = [(r["step"], r["raw_loss"]) for r in rows if math.isfinite(r["raw_loss"])]
    logged = [
        (r["step"], r["loss"]) for r in rows if isinstance(r.get("loss"), (int, float)) and math.isfinite(r["loss"])
    ]
    values = [v for _, v in raw + logged]
    if not rows or not values:
        return "<p>no finite loss to draw</p>"
    low, high = min(values), max(values)
    last = max(r["step"] for r in rows)
    x = lambda step: 40 + (width - 50) * (step - 1) / max(last - 1, 1)  # noqa: E731
    y = lambda v: height - 20 - (height - 30) * ((v - low) / (high - low) if high > low else 0.5)  # noqa: E731
    parts = [f'<polyline fill="none" stroke="#1f77b4" points="{" ".join(f"{x(s):.1f},{y(v):.1f}" for s, v in raw)}"/>']
    parts += [f'<circle cx="{x(s):.1f}" cy="{y(v):.1f}" r="3" fill="#ff7f0e"/>' for s, v in logged]
    parts += [
        f'<rect x="{x(r["step"]) - 1:.1f}" y="10" width="2" height="{height - 30}" fill="#d62728"/>'
        for r in rows
        if not math.isfinite(r["raw_loss"])
    ]
    axis = (
        f'<text x="2" y="14" font-size="11">{high:.3g}</text><text x="2" y="{height - 20}" font-size="11">'
        f'{low:.3g}</text><text x="{width - 60}" y="{height - 4}" font-size="11">step {last}</text>'
    )
    return f'<svg width="{width}" height="{height}" xmlns="http://www.w3.org/2000/svg">{"".join(parts)}{axis}</svg>'


def write_html(watch, path: str | Path) -> Path:
    """One page: the findings, what each silent check saw, the raw and logged loss, the numbers as JSON."""
    path = Path(path)
    cells = lambda values: "".join(f"<td>{html.escape(str(v))}</td>" for v in values)  # noqa: E731
    findings = (
        "".join(
            f"<tr>{cells([f.step, f.probe, f.measured, f.cause, f.fix, lesson_name(f.lesson), f.decided])}</tr>"
            for f in watch.findings
        )
        or '<tr><td colspan="7">no findings</td></tr>'
    )
    checks = "".join(
        f"<tr>{cells([key, state, lesson_name(CATALOGUE[key].lesson), CATALOGUE[key].looks_for])}</tr>"
        for key, state in statuses(watch).items()
    )
    data = html.escape(
        json.dumps(json_safe({"findings": [as_dict(f) for f in watch.findings], "steps": watch.steps}), indent=1)
    )
    path.write_text(f"""<!doctype html><html><head><meta charset="utf-8"><title>trl-clinic watch</title>
<style>body{{font-family:sans-serif;max-width:1100px;margin:2em auto}}td,th{{border:1px solid #ccc;padding:4px;
vertical-align:top;font-size:13px}}table{{border-collapse:collapse}}pre{{font-size:11px;max-height:20em;overflow:auto}}
</style></head><body><h1>trl-clinic watch: {len(watch.findings)} finding(s) in {len(watch.steps)} steps</h1>
<table><tr><th>step</th><th>finding</th><th>seen</th><th>likely cause</th><th>fix</th><th>lesson</th>
<th>decided</th></tr>{findings}</table>
<h2>Raw loss per step (line), logged loss (dots), non-finite steps (red)</h2>{_svg(watch.steps)}
<h2>Every check</h2><table><tr><th>check</th><th>outcome</th><th>lesson</th><th>what it looks for</th></tr>{checks}
</table><h2>Numbers</h2><pre>{data}</pre></body></html>
""")
    return path
