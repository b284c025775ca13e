import pytest

from trl_clinic.child import Outcome, run_child
from trl_clinic.crash import bisect_settings, in_process


def test_native_sigfpe_is_reported_as_a_signal():
    outcome = run_child(["-c", "from trl_clinic.crash import native_sigfpe; native_sigfpe()"], timeout=120)
    assert outcome.status == "signal" and outcome.signal == "SIGFPE" and outcome.returncode == -8
    assert outcome.message.startswith("Fatal Python error: Floating point exception")
    assert "native_sigfpe" in outcome.stderr  # faulthandler printed the Python stack


def test_python_exception_is_reported_with_its_message():
    outcome = run_child(["-c", "raise ValueError('generation batch is wrong')"], timeout=60)
    assert outcome.status == "exception" and outcome.returncode == 1
    assert outcome.message == "ValueError: generation batch is wrong"


def test_in_process_reports_a_python_error_in_full():
    def reject():
        raise ValueError("generation_batch_size (1) must be divisible by num_generations (8).")

    outcome = in_process(reject)
    assert outcome.status == "exception" and outcome.crashed
    assert outcome.message == "ValueError: generation_batch_size (1) must be divisible by num_generations (8)."
    assert "reject" in outcome.stderr  # the traceback, where it was raised
    assert in_process(lambda: None).status == "finished"


def test_finished_and_timeout():
    assert run_child(["-c", "print('ok')"], timeout=60).status == "finished"
    slow = run_child(["-c", "import time; time.sleep(30)"], timeout=1)
    assert slow.status == "timeout" and slow.crashed


def fake(culprits):
    """A run that crashes when every culprit is in the subset."""
    def run(subset):
        crashed = all(name in subset for name in culprits)
        if crashed:
            return Outcome("signal", -8, 0.0, signal="SIGFPE")
        return Outcome("finished", 0, 0.0)
    return run


NAMES = ["lr", "beta2", "decay", "warmup", "cosine", "bf16", "accum", "clip"]


@pytest.mark.parametrize("culprits", [["bf16"], ["lr", "bf16"], ["warmup", "clip"], ["lr"], ["clip"],
                                      ["beta2", "cosine", "accum"]])
def test_bisection_finds_the_smallest_failing_set(culprits):
    result = bisect_settings(NAMES, fake(culprits))
    assert result.culprits == [n for n in NAMES if n in culprits]
    assert result.trials[0].phase == "minimal" and not result.trials[0].outcome.crashed
    assert all(t.outcome.crashed == all(c in t.settings for c in culprits) for t in result.trials)


def test_bisection_when_nothing_fails_or_the_minimal_fails():
    assert bisect_settings(NAMES, fake(["not-there"])).culprits is None
    assert len(bisect_settings(NAMES, fake([])).trials) == 1
