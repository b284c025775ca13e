"""A bisect's result for a reader (a table and the verdict line) and for CI (``to_json``)."""

from __future__ import annotations

from trl_clinic.bisect.changes import changed_files
from trl_clinic.bisect.search import LOSS_BOUND, Measured, Outcome, changed_verdicts

COLUMNS = (
    "version",
    "build",
    "batch",
    "attention",
    "label tokens",
    "loss",
    "grad norm",
    "verdicts",
    "seconds",
    "vs good",
)


def verdicts_said(record: dict) -> str:
    """The check-up's verdicts in a cell: the probes that warned, failed or could not measure (an error, never shown
    as ok), else how many said ok."""
    verdicts = record.get("verdicts")
    if not verdicts:
        return "-"
    loud = [
        f"{probe} {v['status']}" for probe, v in verdicts.items() if v["status"] in ("warn", "fail", "error", "not run")
    ]
    return ", ".join(loud) or f"{sum(v['status'] == 'ok' for v in verdicts.values())} ok"


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:.6g}"


def row(step: Measured, is_good: bool, compared: bool) -> tuple[str, ...]:
    """One version's line; ``compared`` is False when the good end has no record (nothing to compare with)."""
    record = step.record or {}
    if is_good:
        verdict = "good end" if step.usable else step.status
    elif not compared:
        verdict = "not compared"
    elif not step.usable:
        verdict = "skipped (conflict)" if step.status == "conflict" else f"{step.status}: not compared"
    else:
        verdict = ", ".join(step.parts) if step.parts else "same"
    return (
        step.version,
        step.status,
        record.get("batch_sha256", "-")[:12],
        (record.get("attention") or {}).get("pattern", "-"),
        str(record.get("label_tokens", "-")),
        f"raised {record['raised'].split(':')[0]}" if record.get("raised") else _number(record.get("loss")),
        _number(record.get("grad_norm")),
        verdicts_said(record),
        f"{step.seconds:.1f}",
        verdict,
    )


def table(outcome: Outcome, columns: tuple[str, ...] = COLUMNS) -> str:
    """The measured versions, oldest first, as a markdown table (what docs/bisect.md shows); ``columns`` chooses
    some of ``COLUMNS`` (a narrow screen: a notebook's 120 characters)."""
    good = outcome.versions[0]
    compared = outcome.measured[good].usable
    keep = [COLUMNS.index(column) for column in columns]
    rows = [row(outcome.measured[v], v == good, compared) for v in outcome.versions if v in outcome.measured]
    rows = [tuple(r[i] for i in keep) for r in rows]
    widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(columns)]
    lines = ["| " + " | ".join(c.ljust(w) for c, w in zip(columns, widths)) + " |"]
    lines.append("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    lines += ["| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |" for r in rows]
    return "\n".join(lines)


def change_detail(good: dict, other: dict, part: str) -> str:
    """The part's numbers at the good end and at the changed version."""
    if part == "verdict":
        a, b = good["verdicts"], other["verdicts"]
        return ", ".join(f"{p} {a[p]['status']} -> {b[p]['status']}" for p in changed_verdicts(good, other))
    if part == "error":
        return " -> ".join(record.get("raised") or "no error" for record in (good, other))
    if part == "attention":
        return " -> ".join((record.get("attention") or {}).get("pattern", "none") for record in (good, other))
    if part == "label count":
        return f"label tokens {good['label_tokens']} -> {other['label_tokens']}"
    if part == "loss scale":
        said = []
        for key in ("loss", "grad_norm"):
            a, b = good.get(key), other.get(key)
            ratio = f" (x{b / a:.6g})" if a and b is not None else ""
            said.append(f"{key.replace('_', ' ')} {_number(a)} -> {_number(b)}{ratio}")
        return ", ".join(said)
    keys = sorted(good["parts"].keys() | other["parts"].keys())
    changed = [key for key in keys if good["parts"].get(key) != other["parts"].get(key)]
    changed = [key for key in changed if ("attention_mask" in key) == (part == "mask")]
    return "changed: " + ", ".join(changed) + f"; shapes {good.get('shape')} -> {other.get('shape')}"


def _at(package: str, version: str) -> str:
    return f"{package} {version}" if package else version


def verdict(outcome: Outcome, package: str) -> str:
    """One line: what changed first and where, or that nothing did, or why it is undecided. ``package`` names the
    package that moved; empty where the versions are an upgrade path's labels, which name every package."""
    good = outcome.measured[outcome.versions[0]]
    if not good.usable:
        said = good.message.splitlines()[0] if good.message else ""
        return f"undecided: the good end {_at(package, good.version)} could not be measured ({good.status}): {said}"
    if outcome.first is None:
        if not outcome.decided:
            unmeasured = [f"{s.version} ({s.status})" for s in outcome.measured.values() if not s.usable]
            return f"undecided: no change among the versions measured, but not measured: {', '.join(unmeasured)}"
        return f"no change from {_at(package, good.version)} to {outcome.versions[-1]} (bound: relative {LOSS_BOUND:g})"
    step = outcome.measured[outcome.first]
    said = (
        f"first change: {_at(package, outcome.first)} (last same: {outcome.last_same}): the {step.parts[0]} "
        f"({change_detail(good.record, step.record, step.parts[0])})"
    )
    if len(step.parts) > 1:  # the later parts by name; a verdict with its probes (short, and what a reader acts on)
        later = [
            f"verdict ({change_detail(good.record, step.record, part)})" if part == "verdict" else part
            for part in step.parts[1:]
        ]
        said += f"; after it: {', '.join(later)}"
    if outcome.between:
        said += f"; not testable between them: {', '.join(outcome.between)}"
    if outcome.changed_back:
        said += f"; same as the good end again at: {', '.join(outcome.changed_back)}"
    if not outcome.decided:
        said = "undecided: a build failed between the last same and the first change; " + said
    return said


def to_json(outcome: Outcome, package: str) -> dict:
    """Everything measured, for CI: every version's status and record, the verdict and the exit code."""
    return {
        "package": package,
        "good": outcome.versions[0],
        "bad": outcome.versions[-1],
        "window": outcome.versions,
        "loss_bound_relative": LOSS_BOUND,
        "first_change": outcome.first,
        "last_same": outcome.last_same,
        "part": outcome.part,
        "parts": outcome.measured[outcome.first].parts if outcome.first else [],
        "untestable_between": outcome.between,
        "changed_back": outcome.changed_back,
        "decided": outcome.decided,
        "exit_code": outcome.exit_code,
        "verdict": verdict(outcome, package),
        "changed_files": changed_files(outcome),
        "measured": [
            {
                "version": step.version,
                "status": step.status,
                "seconds": round(step.seconds, 2),
                "parts": step.parts,
                "message": step.message,
                "record": step.record,
            }
            for step in (outcome.measured[v] for v in outcome.versions if v in outcome.measured)
        ],
    }
