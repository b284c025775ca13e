"""A lesson's verdict cannot pass by vanishing, and a check written as a comparison keeps its line."""

import math
import sys
from pathlib import Path

import pytest

from trl_clinic.course.parameters import start_run
from trl_clinic.course.results import above, below, conclude, eras_not_run, failed_checks, measured, save_metrics

sys.path.insert(0, str(Path(__file__).parent))
from test_checks_can_fail import sides  # noqa: E402 (the margin arithmetic the can-fail tests use)


@pytest.fixture
def run(tmp_path):
    return start_run("02", "cpu", 0, tmp_path / "out")


def era(status: str) -> dict:
    return {
        "era": "02-transformers-4.45",
        "script": "then_02",
        "status": status,
        "message": f"{status}: x",
        "versions": {},
    }


def test_a_comparison_passes_as_its_operator_says_and_never_on_nan():
    assert below(1e-7, 1e-4) and not below(1e-3, 1e-4) and not below(math.nan, 1e-4)
    assert above(1.16, 1e-2) and not above(1e-7, 1e-2) and not above(math.nan, 1e-2)
    check = measured(below(2e-7, 1e-4))
    assert check.passed and check.comparison.value == 2e-7 and check.comparison.threshold == 1e-4


def test_metrics_keep_each_comparisons_value_and_threshold(run):
    metrics = save_metrics(run, "00", {}, lambda n: ({"bad": measured(above(1.2, 0.01))}, {"ok": measured(True)}))
    assert metrics["checks"]["symptom"]["bad"] == {
        "passed": True,
        "kind": "measured",
        "value": 1.2,
        "op": ">",
        "threshold": 0.01,
    }
    assert metrics["checks"]["fix"]["ok"] == {"passed": True, "kind": "measured"}


def test_an_empty_group_is_neither_reproduced_nor_verified(run):
    metrics = save_metrics(run, "00", {}, lambda n: ({}, {"ok": measured(True)}))
    assert not metrics["symptom_reproduced"] and metrics["fix_verified"]
    assert failed_checks(metrics) == ["no symptom check ran"]
    with pytest.raises(AssertionError, match="no symptom check ran"):
        conclude(metrics, run.output_dir)


def test_a_lesson_whose_era_did_not_run_is_incomplete_not_passed(run, capsys):
    checks = lambda n: ({"bad": measured(True)}, {"ok": measured(True)})  # noqa: E731
    finished = save_metrics(run, "00", {}, checks, eras=[era("finished")])
    assert finished["complete"] and not eras_not_run(finished)
    conclude(finished, run.output_dir)
    assert capsys.readouterr().out.startswith("all checks passed")
    skipped = save_metrics(run, "00", {}, checks, eras=[era("finished"), era("skipped")])
    assert not skipped["complete"] and eras_not_run(skipped) == ["02-transformers-4.45: skipped: x"]
    conclude(skipped, run.output_dir)
    assert capsys.readouterr().out.startswith("INCOMPLETE")


@pytest.mark.parametrize(
    "op, threshold, own, other, scale, expected",
    [
        ("<", 1e-4, 1e-7, 1.16, "log", (1e3, 1.16e4)),
        (">", 1e-2, 1.16, 1e-7, "log", (116, 1e5)),
        ("<", 1e-4, 0.0, 1.0, "log", (math.inf, 1e4)),
        (">", 1e-2, 1.0, math.nan, "log", (100, math.inf)),
        ("<", 0.99, 0.51, 1.0, "linear", (0.48, 0.01)),
    ],
)
def test_margins_measure_how_far_the_line_sits_from_each_run(op, threshold, own, other, scale, expected):
    assert sides(op, threshold, own, other, scale) == pytest.approx(expected)


def test_a_threshold_past_the_other_run_has_a_negative_margin():
    own_side, other_side = sides("<", 1.0, 1e-7, 0.42, "linear")  # 02's "< 1e-4" loosened to "< 1.0"
    assert other_side < 0
    assert sides("<", 1.0, 1e-7, 0.42, "log")[1] < 1
