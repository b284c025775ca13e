"""One self-contained HTML page for a workbook run: what a workshop hands out.

Figures are embedded (base64), so the page can be mailed on its own; the executed notebooks are
rendered to HTML beside their ``.ipynb`` and linked.
"""

from __future__ import annotations

import base64
import html
import json
from pathlib import Path

import nbformat
from nbconvert import HTMLExporter

from trl_clinic.course.results import METRICS_FILE, failed_checks, load_metrics
from trl_clinic.course.workbook import SUMMARY_JSON

REPORT_FILE = "report.html"
STYLE = """
body { font-family: system-ui, sans-serif; margin: 2rem auto; max-width: 1200px; color: #222; }
table { border-collapse: collapse; width: 100%; margin: 1rem 0; font-size: 0.9rem; }
th, td { border: 1px solid #ccc; padding: 0.4rem 0.6rem; text-align: left; vertical-align: top; }
th { background: #f3f3f3; }
.yes { color: #2ca02c; font-weight: bold; } .no { color: #d62728; font-weight: bold; }
.kind-recreated, .kind-injected { color: #9467bd; font-weight: bold; }
img { max-width: 100%; border: 1px solid #ddd; margin: 0.5rem 0; }
code { font-size: 0.85rem; }
"""
# Marks the page once every figure has decoded, so a headless browser test can read the result.
CHECK_IMAGES = """
<script>
window.addEventListener("load", () => {
  const images = [...document.images];
  document.body.dataset.images = images.length;
  document.body.dataset.imagesLoaded = images.every(i => i.complete && i.naturalWidth > 0);
});
</script>
"""


def _yes_no(value: bool | None, kind: str = "measured", real_old_code: bool = False) -> str:
    """yes/no, with the kind when the claim rests on a stand-in: "yes (recreated)", never a bare "yes";
    "also run on the real old code" beside it when the lesson's era ran the old library for real."""
    if value is None:
        return '<span class="no">no result</span>'
    label = ("yes" if value else "no") + ("" if kind == "measured" else f" ({html.escape(kind)})")
    if real_old_code and kind != "measured":
        label += "; also run on the real old code"
    return f'<span class="{"yes" if value else "no"}">{label}</span>'


def _ran_real_old_code(metrics: dict | None) -> bool:
    return bool(metrics) and any(era["status"] == "finished" for era in metrics.get("eras", []))


def _what_it_showed(metrics: dict) -> str:
    """The lesson's own sentences, written from its numbers; the raw scalars only for a lesson that wrote none."""
    if metrics.get("summary"):
        return html.escape(metrics["summary"])
    numbers = metrics["numbers"]
    scalars = [(k, v) for k, v in numbers.items() if isinstance(v, (int, float, str, bool)) and len(str(v)) < 80]
    return "<br>".join(
        f"<code>{html.escape(k)}</code>: {html.escape(f'{v:.4g}' if isinstance(v, float) else str(v))}"
        for k, v in scalars[:8]
    )


def _gpu_usage(gpu: dict | None) -> str:
    """Peak memory and mean utilisation sampled by the runner (gpu_usage), or why there are none."""
    if not gpu:
        return ""
    if gpu.get("peak_gpu_memory_mib") is None:
        return f"<span title='{html.escape(gpu.get('gpu_usage_missing', ''))}'>not sampled</span>"
    return f"peak {gpu['peak_gpu_memory_mib']:.0f} MiB, {gpu['mean_gpu_utilisation_pct']:.0f} % busy on average"


def _jobs_note(jobs: int) -> str:
    if jobs <= 1:
        return "<p id='jobs'>The lessons ran one at a time.</p>"
    return (
        f"<p id='jobs'>{jobs} lessons ran at once (<code>trl-clinic run --jobs {jobs}</code>), each in its own "
        "process: a lesson's seconds include sharing the machine with the others.</p>"
    )


def _verdict(metrics: dict | None, group: str) -> tuple[bool | None, str]:
    if not metrics:
        return None, "measured"
    passed = metrics["symptom_reproduced" if group == "symptom" else "fix_verified"]
    return passed, metrics[f"{group}_kind"]


def _checks_table(metrics: dict) -> str:
    """Every check with its kind, its value against its threshold where it has one, and its result, so a reader
    sees what is measured, what stands in, and how close to the line each number fell."""
    rows = "".join(
        f"<tr><td>{group}</td><td>{html.escape(name)}</td><td class='kind-{check['kind']}'>{check['kind']}</td>"
        f"<td>{_comparison(check)}</td><td>{_yes_no(check['passed'])}</td></tr>"
        for group, checks in metrics["checks"].items()
        for name, check in checks.items()
    )
    header = "<tr><th>group</th><th>check</th><th>kind</th><th>value</th><th>passed</th></tr>"
    return f"<table class='checks'>{header}{rows}</table>"


def _comparison(check: dict) -> str:
    """ "0.42 > 0.01" for a check written as a comparison (a NaN value is stored as the string "nan")."""
    if "op" not in check:
        return ""
    value, threshold = (
        f"{x:.3g}" if isinstance(x, (int, float)) else str(x) for x in (check["value"], check["threshold"])
    )
    return html.escape(f"{value} {check['op']} {threshold}")


def _eras(metrics: dict) -> str:
    """The lesson's runs of real old code: finished, or skipped/failed with the reason."""
    rows = "".join(
        f"<li>{html.escape(era['era'])} ({html.escape(', '.join(f'{k} {v}' for k, v in era['versions'].items()))}):"
        f" <b>{html.escape(era['status'])}</b>"
        + ("" if era["status"] == "finished" else f" ({html.escape(era['message'])})")
        + "</li>"
        for era in metrics.get("eras", [])
    )
    return f"<p>then, on the versions where the bug lived:</p><ul class='eras'>{rows}</ul>" if rows else ""


def _sizes(metrics: dict) -> str:
    sizes = ", ".join(
        f"<code>{html.escape(str(k))}={html.escape(str(v))}</code>" for k, v in metrics.get("sizes", {}).items()
    )
    return f"<p>profile <b>{html.escape(str(metrics['profile']))}</b>, seed {metrics['seed']}: {sizes}</p>"


def _render_notebook(path: Path) -> Path:
    target = path.with_suffix(".html")
    body, _ = HTMLExporter().from_notebook_node(nbformat.read(path, as_version=4))
    target.write_text(body)
    return target


def build_report(out: str | Path) -> Path:
    """Write ``OUT/report.html`` from the lesson folders under ``out``; returns its path."""
    out = Path(out)
    if not out.is_dir():
        raise FileNotFoundError(f"no workbook output folder at {out}")
    summary = json.loads((out / SUMMARY_JSON).read_text()) if (out / SUMMARY_JSON).exists() else {"lessons": []}
    timing = {row["lesson"]: row for row in summary["lessons"]}
    lesson_dirs = sorted(d for d in out.iterdir() if d.is_dir() and (d / f"{d.name}.ipynb").exists())
    if not lesson_dirs:
        raise FileNotFoundError(f"no executed lessons under {out}: run `trl-clinic run --out {out}` first")
    rows, sections, environment = [], [], None
    for lesson_dir in lesson_dirs:
        name = lesson_dir.name
        metrics = load_metrics(lesson_dir) if (lesson_dir / METRICS_FILE).exists() else None
        notebook_html = _render_notebook(lesson_dir / f"{name}.ipynb").relative_to(out)
        run_info = timing.get(name, {})
        if metrics:
            environment = environment or (metrics["versions"], metrics["device"])
            failed = failed_checks(metrics)
            device = metrics["device"].get("gpu") or metrics["device"]["device"]
        else:
            failed, device = [], "?"
        status = run_info.get("status") or (
            "error" if not metrics else "failed checks" if failed else "passed" if metrics["complete"] else "incomplete"
        )
        rows.append(
            f"<tr><td><a href='#{name}'>{html.escape(name)}</a></td><td>{html.escape(status)}</td>"
            f"<td>{_yes_no(*_verdict(metrics, 'symptom'), _ran_real_old_code(metrics))}</td>"
            f"<td>{_yes_no(*_verdict(metrics, 'fix'))}</td>"
            f"<td>{_what_it_showed(metrics) if metrics else html.escape(run_info.get('error') or '')}</td>"
            f"<td>{run_info.get('seconds', '')}</td><td>{_gpu_usage(run_info.get('gpu'))}</td>"
            f"<td>{html.escape(str(device))}</td></tr>"
        )
        figures = "".join(
            f"<figure><img alt='{html.escape(png.stem)}' src='data:image/png;base64,"
            f"{base64.b64encode(png.read_bytes()).decode()}'><figcaption>{html.escape(png.name)}</figcaption></figure>"
            for png in sorted(lesson_dir.glob("*.png"))
        )
        failures = "".join(f"<li>{html.escape(f)}</li>" for f in failed)
        sections.append(
            f"<section id='{name}'><h2>{html.escape(name)}</h2>"
            f"<p><a href='{notebook_html}'>executed notebook (HTML)</a> · "
            f"<a href='{name}/{name}.ipynb'>.ipynb</a> · <a href='{name}/{METRICS_FILE}'>{METRICS_FILE}</a></p>"
            + (f"<p>failed checks:</p><ul>{failures}</ul>" if failures else "")
            + (_sizes(metrics) + _eras(metrics) + _checks_table(metrics) if metrics else "")
            + figures
            + "</section>"
        )
    versions, device = environment or ({}, {})
    env_rows = "".join(
        f"<tr><th>{html.escape(k)}</th><td>{html.escape(str(v))}</td></tr>" for k, v in {**versions, **device}.items()
    )
    page = (
        "<!doctype html><html><head><meta charset='utf-8'><title>TRL Clinic workbook report</title>"
        f"<style>{STYLE}</style></head><body><h1>TRL Clinic workbook report</h1>"
        "<table id='lessons'><tr><th>lesson</th><th>status</th><th>symptom reproduced?</th><th>fix verified?</th>"
        "<th>what this run showed</th><th>seconds</th><th>GPU while it ran</th><th>device</th></tr>"
        + "".join(rows)
        + "</table>"
        + _jobs_note(summary.get("parameters", {}).get("jobs", 1))
        + "<h2>Environment</h2><table id='environment'>"
        + env_rows
        + "</table>"
        + "".join(sections)
        + CHECK_IMAGES
        + "</body></html>"
    )
    path = out / REPORT_FILE
    path.write_text(page)
    return path
