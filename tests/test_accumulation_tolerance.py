"""The accumulation probe's tolerance (trl_clinic.checkup.accumulation.TOLERANCE) is placed between the windows it
must tell apart, so that moving it tenfold toward the broken side, or halfway there when that is nearer, fails here
(AUDIT G.3: a tenfold loosening passed every test).

The rule: the tolerance is at least twice the largest healthy error and at most half the smallest broken one, and
sits near the middle of the two in log scale (the two margins within a factor 100 of each other), so neither side's
noise is given all the room. fp32: lesson 02's real cpu run at seed 0 (numbers.json in its folder: the fixed
gradient 1.4e-7 off, the broken one 1.16). 16 bits: the recipe zoo's last full run (docs/checkup.md, the
accumulation probe: healthy bf16 and fp16 windows measured 0 to 0.0099, the smallest broken twin 0.044); the zoo
stores no per-window errors, so those two numbers are quoted here from that run.
"""

import json

import pytest

from trl_clinic.checkup.accumulation import TOLERANCE
from trl_clinic.course.lessons import lessons

ZOO_HEALTHY_16BIT, ZOO_BROKEN_16BIT = 0.0099, 0.044


def placed(tolerance: float, healthy: float, broken: float) -> bool:
    """Room on both sides (a factor 2 at least) and near the log-scale middle (margins within a factor 100)."""
    above, below = tolerance / healthy, broken / tolerance
    return above >= 2 and below >= 2 and max(above, below) / min(above, below) <= 100


def measured(kind: str) -> tuple[float, float]:
    if kind == "half":
        return ZOO_HEALTHY_16BIT, ZOO_BROKEN_16BIT
    runs = json.loads((lessons()["02"].folder / "numbers.json").read_text())["runs"]
    return runs["with_fix"]["relative_error"], runs["without_fix"]["relative_error"]


@pytest.mark.parametrize("kind", ["full", "half"])
def test_the_tolerance_separates_the_measured_windows_with_room_on_both_sides(kind):
    healthy, broken = measured(kind)
    assert placed(TOLERANCE[kind], healthy, broken), (kind, TOLERANCE[kind], healthy, broken)


@pytest.mark.parametrize("kind", ["full", "half"])
def test_a_tenfold_or_halfway_loosening_is_refused(kind):
    """The rule itself is what a loosened TOLERANCE meets: it must refuse the nearer of tenfold and halfway."""
    healthy, broken = measured(kind)
    tolerance = TOLERANCE[kind]
    loosened = min(10 * tolerance, (tolerance + broken) / 2)
    assert not placed(loosened, healthy, broken), (kind, loosened)
