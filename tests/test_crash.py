import math
import platform

import pytest

from trl_clinic.course.child import Outcome, run_child
from trl_clinic.course.crash import DIVISION_RETURNED, bisect_settings, in_process

# the overflowing division traps only where the processor's division does (x86): ARM returns the wrapped quotient
TRAPS = platform.machine().lower() in ("x86_64", "amd64", "i386", "i686")
needs_trap = pytest.mark.skipif(not TRAPS, reason=f"{platform.machine()}'s integer division does not trap")
DIVIDE = "from trl_clinic.course.crash import divide_and_report; divide_and_report()"


@needs_trap
def test_the_kernel_traps_and_the_child_dies_in_it():
    """Died in the kernel, not by a signal sent afterwards: the line after the division never ran, and
    faulthandler's stack names the frame that called torch.div."""
    outcome = run_child(["-c", DIVIDE], timeout=120)
    assert outcome.status == "signal" and outcome.signal == "SIGFPE" and outcome.returncode == -8
    assert outcome.message.startswith("Fatal Python error: Floating point exception")
    assert "about to divide" in outcome.stderr and DIVISION_RETURNED not in outcome.stderr
    assert "in native_sigfpe" in outcome.stderr.split("Current thread")[1]  # faulthandler's innermost frame


def test_a_division_that_returns_says_so_and_a_hand_sent_signal_is_told_apart(tmp_path):
    """What the trap check sees when no kernel traps: a division torch checks (by zero) is a Python error, and a
    process that sends itself SIGFPE after a division that returned leaves DIVISION_RETURNED behind."""
    by_zero = run_child(["-c", "import torch; torch.div(torch.tensor([5]), 0, rounding_mode='trunc')"], timeout=120)
    assert by_zero.status == "exception" and by_zero.message == "RuntimeError: ZeroDivisionError"
    sent = (
        "import os, signal, sys; from trl_clinic.course.crash import DIVISION_RETURNED\n"
        "print(DIVISION_RETURNED, file=sys.stderr, flush=True); os.kill(os.getpid(), signal.SIGFPE)"
    )
    killed = run_child(["-c", sent], timeout=120)
    assert killed.signal == "SIGFPE" and DIVISION_RETURNED in killed.stderr and "native_sigfpe" not in killed.stderr


def test_the_injected_stand_in_dies_by_sigfpe_on_any_machine():
    """InjectedH20Fault's death: the kernel's trap on x86; elsewhere a signal sent by hand, and it says so."""
    outcome = run_child(["-c", "from trl_clinic.course.stand_ins import die_by_sigfpe; die_by_sigfpe()"], timeout=180)
    assert outcome.signal == "SIGFPE" and outcome.returncode == -8
    assert ("sending SIGFPE by hand" in outcome.stderr) is not TRAPS


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


@pytest.mark.parametrize(
    "culprits", [["bf16"], ["lr", "bf16"], ["warmup", "clip"], ["lr"], ["clip"], ["beta2", "cosine", "accum"]]
)
def test_bisection_finds_the_smallest_failing_set(culprits):
    result = bisect_settings(NAMES, fake(culprits))
    assert result.culprits == [n for n in NAMES if n in culprits]
    assert result.trials[0].phase == "minimal" and not result.trials[0].outcome.crashed
    assert all(t.outcome.crashed == all(c in t.settings for c in culprits) for t in result.trials)
    # halving: about log2(n) trials per culprit (8 settings: 3, and 1 to try the needed ones alone)
    assert len(result.trials) <= 2 + len(culprits) * (math.ceil(math.log2(len(NAMES))) + 1)


def test_bisection_when_nothing_fails_or_the_minimal_fails():
    assert bisect_settings(NAMES, fake(["not-there"])).culprits is None
    assert len(bisect_settings(NAMES, fake([])).trials) == 1


def test_walk_config_applies_the_fix_each_error_names_until_accepted():
    from trl_clinic.course.lessons.lesson_05_grpo_crash.companion import walk_config

    def build(config):
        if "old" in config:
            raise TypeError("__init__() got an unexpected keyword argument 'old'")
        if config["batch"] % 4:
            raise ValueError(f"generation_batch_size ({config['batch']}) must be divisible by num_generations (4).")

    fixes = [
        ("'old'", "drop it", lambda c: {k: v for k, v in c.items() if k != "old"}),
        ("divisible by num_generations", "batch 4", lambda c: {**c, "batch": 4}),
    ]
    walk = walk_config({"old": 1, "batch": 1}, fixes, build)
    assert [step["error"] is not None for step in walk.steps] == [True, True, False]
    assert walk.configs[-1] == {"batch": 4} and walk.last_rejected == {"batch": 1}
    stuck = walk_config({"batch": 1}, fixes[:1], build)  # an error without a known fix ends the walk
    assert len(stuck.steps) == 1 and stuck.steps[0]["fix"] is None


def test_todays_grpo_config_sizes_the_generation_batch_from_batch_and_accumulation(tmp_path):
    """The rule lesson 05 prints, read from the installed grpo_config.py and measured: 4 x 4 holds 16 generations."""
    from trl import GRPOConfig

    from trl_clinic.course.lessons.lesson_05_grpo_crash.companion import rule_lines

    lines = rule_lines()
    assert any("generation_batch_size = self.per_device_train_batch_size" in line for line in lines)
    assert any("% self.num_generations" in line for line in lines)
    config = GRPOConfig(
        output_dir=str(tmp_path),
        use_cpu=True,
        per_device_train_batch_size=4,
        gradient_accumulation_steps=4,
        num_generations=16,
    )
    assert config.generation_batch_size == 16
    with pytest.raises(ValueError, match="generation_batch_size"):
        GRPOConfig(
            output_dir=str(tmp_path),
            use_cpu=True,
            per_device_train_batch_size=1,
            gradient_accumulation_steps=4,
            num_generations=16,
        )


@needs_trap
def test_a_shell_words_a_native_crash_and_exits_with_128_plus_the_signal(tmp_path):
    outcome = run_child(
        ["-c", DIVIDE],
        timeout=120,
        faulthandler=False,
        shell=True,
        cwd=tmp_path,
    )
    assert outcome.status == "signal" and outcome.signal == "SIGFPE" and outcome.returncode == 128 + 8
    assert outcome.message.startswith("bash:") and "Floating point exception" in outcome.message
    assert "Fatal Python error" not in outcome.stderr and "Traceback" not in outcome.stderr
    assert DIVISION_RETURNED not in outcome.stderr
    assert not list(tmp_path.glob("core*"))  # the truncated core file the shell's limit allowed is removed


FORKED = """
def double(run, spec):
    print("in the child")
    return {"twice": 2 * spec["x"]}


def crash(run, spec):
    from trl_clinic.course.crash import native_sigfpe
    native_sigfpe()


def fail(run, spec):
    raise ValueError("generation batch is wrong")
"""


@needs_trap
def test_forked_children_report_a_result_a_native_crash_and_an_error(tmp_path):
    from trl_clinic.course import child
    from trl_clinic.course.parameters import start_run

    (tmp_path / "targets.py").write_text(FORKED)
    run = start_run("05", "cpu", 0, tmp_path / "out")
    target = str(tmp_path / "targets.py")
    done = child.forked(run, f"{target}:double", {"x": 21}, name="double", preload=("torch",), timeout=120)
    assert done.outcome.status == "finished" and done.result == {"twice": 42} and "in the child" in done.outcome.stderr
    died = child.forked(run, f"{target}:crash", name="crash", preload=("torch",), timeout=120).outcome
    assert died.signal == "SIGFPE" and died.returncode == -8 and "native_sigfpe" in died.stderr  # faulthandler's stack
    failed = child.forked(run, f"{target}:fail", name="fail", preload=("torch",), timeout=120).outcome
    assert failed.status == "exception" and failed.message == "ValueError: generation batch is wrong"
    assert child.forked(run, f"{target}:double", {"x": 1}, name="again", preload=("torch",)).result == {"twice": 2}
