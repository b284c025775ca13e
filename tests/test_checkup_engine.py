"""The check-up's engine: findings say how they were decided, a crash is an error (never a skip), the report's
forms and its exit codes."""

import json

import pytest

from trl_clinic.checkup.engine import EXIT_CODES, Probe, Report, Skip, run_probe, selected
from trl_clinic.probes.finding import DECISIONS, Finding


def test_a_finding_takes_only_the_five_statuses():
    with pytest.raises(ValueError, match="status"):
        Finding("x", "broken")


def test_every_verdict_says_how_it_was_decided_and_a_skip_or_error_decided_nothing():
    for status in ("ok", "warn", "fail"):
        with pytest.raises(ValueError, match="how it was decided"):
            Finding("x", status)
        assert Finding("x", status, decided="measured").decided == "measured"
    with pytest.raises(ValueError, match="decided nothing"):
        Finding("x", "skipped", decided="config")
    assert set(DECISIONS) == {"measured", "config", "table"}


def test_only_and_skip_select_by_name_and_reject_unknown_names():
    from trl_clinic.checkup import load_probes

    names = list(load_probes())
    assert [p.name for p in selected(only=["packing", "known_bugs"])] == ["packing", "known_bugs"]
    assert "packing" not in [p.name for p in selected(skip=["packing"])]
    assert len(selected()) == len(names)
    with pytest.raises(ValueError, match="unknown probe"):
        selected(only=["no_such_probe"])


def test_a_probe_that_does_not_apply_is_skipped_and_one_that_crashes_is_an_error():
    def skips(view):
        raise Skip("does not apply here")

    def crashes(view):
        raise KeyError("input_ids")

    skipped = run_probe(Probe("a", "01", "", skips), view=None)
    crashed = run_probe(Probe("b", "02", "", crashes), view=None)
    assert (skipped[0].status, skipped[0].reason, skipped[0].lesson) == ("skipped", "does not apply here", "01")
    assert (crashed[0].status, crashed[0].decided) == ("error", "") and crashed[0].reason.startswith(
        "KeyError: 'input_ids' (raised in tests/test_checkup_engine.py:"
    )
    assert crashed[0].reason.endswith(", crashes)")
    assert skipped[0].seconds >= 0


def test_the_exit_code_says_fail_then_error_then_clean():
    clean = Report(
        [
            Finding("packing", "ok", "0.0", decided="measured"),
            Finding("accumulation", "warn", "0.1", fix="do x", decided="config"),
            Finding("labels_present", "skipped", reason="n/a"),
        ],
        "t",
    )
    assert clean.exit_code == EXIT_CODES["clean"] == 0
    clean.findings.append(Finding("eos_label", "error", reason="KeyError: 'x'"))
    assert clean.exit_code == EXIT_CODES["error"] == 3 and not clean.failed
    clean.findings.append(
        Finding("fp16_adamw", "fail", "3 tensors", fix="load in float32", lesson="03", decided="measured")
    )
    assert clean.exit_code == EXIT_CODES["fail"] == 1 and clean.failed


def test_the_report_prints_how_each_finding_was_decided_as_a_table_and_as_json():
    report = Report(
        [
            Finding("packing", "fail", "0.6", fix="pad instead", decided="measured", known_bug="01-x"),
            Finding("known_bugs", "warn", "05-y", fix="upgrade", decided="table"),
            Finding("eos_label", "error", reason="KeyError: 'x'"),
        ],
        "t",
    )
    data = json.loads(report.to_json())
    assert data["failed"] and data["errors"] == 1 and data["exit_code"] == 1
    assert [(f["status"], f["decided"]) for f in data["findings"]] == [
        ("fail", "measured"),
        ("warn", "table"),
        ("error", ""),
    ]
    text = str(report)
    assert "decided" in text and "measured" in text and "table" in text and "01-x" in text and "KeyError" in text


def test_the_printed_table_folds_what_passed_and_fits_a_notebooks_output(capsys):
    """A notebook or a CI log shows the rows that need a reader (fail, warn, error) and one line naming the rest, at
    most 120 characters wide; ``everything=True`` and ``str(report)`` keep every row."""
    report = Report(
        [
            Finding("packing", "fail", "later sequences' logits differ by 0.614 " * 3, fix="pad", decided="measured"),
            Finding("accumulation", "ok", "1e-7", decided="measured"),
            Finding("labels_present", "skipped", reason="no labels column"),
            Finding("eos_label", "error", reason="KeyError: 'x'"),
        ],
        "t",
    )
    report.print()
    folded = capsys.readouterr().out
    assert "packing" in folded and "KeyError" in folded and "ok: accumulation; skipped: labels_present" in folded
    assert "1e-7" not in folded and "no labels column" not in folded
    assert max(len(line) for line in folded.splitlines()) <= 120
    report.print(everything=True)
    assert "1e-7" in capsys.readouterr().out and "no labels column" in str(report)
    clean = Report([Finding("accumulation", "ok", "1e-7", decided="measured")], "t")
    clean.print()
    assert " ".join(capsys.readouterr().out.split()) == (
        "trl-clinic checkup: t (0.0 s): no probe failed, warned or crashed; ok: accumulation "
        "(all rows: report.print(everything=True))"
    )
