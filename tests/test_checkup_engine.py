"""The check-up's engine: findings, selection, a probe that cannot run, the report's forms and exit code."""

import json

import pytest

from trl_clinic.checkup.engine import Finding, Probe, Report, Skip, run_probe, selected


def test_a_finding_takes_only_the_four_statuses():
    with pytest.raises(ValueError, match="status"):
        Finding("x", "broken")


def test_only_and_skip_select_by_name_and_reject_unknown_names():
    from trl_clinic.checkup import load_probes

    names = list(load_probes())
    assert [p.name for p in selected(only=["packing", "known_bugs"])] == ["packing", "known_bugs"]
    assert "packing" not in [p.name for p in selected(skip=["packing"])]
    assert len(selected()) == len(names)
    with pytest.raises(ValueError, match="unknown probe"):
        selected(only=["no_such_probe"])


def test_a_probe_that_cannot_run_is_skipped_with_its_reason_never_raised():
    def skips(view):
        raise Skip("does not apply here")

    def crashes(view):
        raise KeyError("input_ids")

    skipped = run_probe(Probe("a", "01", "", skips), view=None)
    crashed = run_probe(Probe("b", "02", "", crashes), view=None)
    assert (skipped[0].status, skipped[0].reason, skipped[0].lesson) == ("skipped", "does not apply here", "01")
    assert crashed[0].status == "skipped" and "KeyError" in crashed[0].reason
    assert skipped[0].seconds >= 0


def test_the_report_exits_1_on_a_fail_and_prints_as_a_table_and_as_json():
    report = Report([Finding("packing", "ok", "0.0"), Finding("accumulation", "warn", "0.1", fix="do x")], "t")
    assert report.exit_code == 0
    report.findings.append(Finding("fp16_adamw", "fail", "3 tensors", fix="load in float32", lesson="03"))
    assert report.exit_code == 1 and report.failed
    data = json.loads(report.to_json())
    assert data["failed"] and [f["status"] for f in data["findings"]] == ["ok", "warn", "fail"]
    text = str(report)
    assert "load in float32" in text and "fp16_adamw" in text
