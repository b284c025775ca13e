import json
import math

import pytest
from trl import SFTConfig, SFTTrainer

from trl_clinic.course import data, plotting
from trl_clinic.course.models import make_causal_lm
from trl_clinic.course.parameters import start_run
from trl_clinic.course.results import failed_checks, injected, load_metrics, measured, recreated, save_metrics
from trl_clinic.probes.gradients import cosine, first_step_gradient, relative_error
from trl_clinic.probes.recording import StepRecorder


@pytest.fixture
def run(tmp_path):
    return start_run("02", "cpu", 0, tmp_path / "out")


def tiny_trainer(run, tokenizer, **config):
    args = SFTConfig(**run.trainer_kwargs("t"), per_device_train_batch_size=2, max_steps=3, **config)
    return SFTTrainer(
        model=make_causal_lm(tokenizer),
        args=args,
        processing_class=tokenizer,
        train_dataset=data.instruction_pairs(16, seed=0),
    )


def test_recorder_keeps_raw_and_logged_loss(run, tokenizer):
    trainer = tiny_trainer(run, tokenizer, gradient_accumulation_steps=2)
    recorder = StepRecorder().watch(trainer)
    trainer.train()
    steps, losses = recorder.series("loss")
    assert steps == [1, 2, 3]
    raw = recorder.series("raw_loss")[1]
    assert raw == pytest.approx(losses, rel=1e-5)  # finite losses: the filter changes nothing
    assert recorder.last("grad_norm") > 0
    with pytest.raises(KeyError, match="never logged"):
        recorder.last("reward")
    recorder.history[0]["raw_loss"] = math.nan
    recorder.save(run.output_dir / "h.json")
    assert json.loads((run.output_dir / "h.json").read_text())[0]["raw_loss"] == "nan"


def test_gradient_capture_stops_after_one_step(run, tokenizer):
    trainer = tiny_trainer(run, tokenizer, max_grad_norm=0)
    gradient = first_step_gradient(trainer)
    assert trainer.state.global_step == 1
    assert gradient.numel() == sum(p.numel() for p in trainer.model.parameters())
    assert relative_error(gradient, gradient) == 0
    assert cosine(gradient, -gradient) == pytest.approx(-1)


def test_relative_error_and_cosine_on_vectors_worked_by_hand():
    """The two metrics behind every gradient claim, on vectors whose answers are known: relative_error is
    |g - r| / |r| (measured against the reference, so not symmetric) and cosine the angle's cosine, blind to scale."""
    import torch

    reference, gradient = torch.tensor([3.0, 0.0]), torch.tensor([3.0, 4.0])
    assert relative_error(gradient, reference) == pytest.approx(4 / 3)  # |(0, 4)| / |(3, 0)|
    assert relative_error(reference, gradient) == pytest.approx(4 / 5)  # |(0, -4)| / |(3, 4)|
    assert cosine(gradient, reference) == pytest.approx(3 / 5)  # (3*3 + 0*4) / (5 * 3)
    assert relative_error(2 * reference, reference) == pytest.approx(1.0)  # twice the gradient: off by 100 %
    assert cosine(2 * reference, reference) == pytest.approx(1.0)  # ... in the same direction
    assert cosine(torch.tensor([1.0, 0.0]), torch.tensor([0.0, 2.0])) == pytest.approx(0.0, abs=1e-7)
    # the lesson-02 shape: accumulated micro-batch means against the full batch's token mean
    a, b = torch.tensor([1.0, 2.0, 2.0]), torch.tensor([1.0, 2.0, 2.5])
    assert relative_error(a, b) == pytest.approx(0.5 / torch.tensor([1.0, 2.0, 2.5]).norm().item())


def test_metrics_file_records_checks_and_non_finite_numbers(run):
    seen = {}

    def checks(numbers):
        seen.update(numbers)
        return {"bad is bad": measured(numbers["loss"] == math.inf)}, {"fixed is fine": measured(False)}

    metrics = save_metrics(run, "00", {"loss": math.inf, "nested": [1.0, math.nan], "pair": (1, 2), 3: "x"}, checks)
    # the checks see the numbers as stored: non-finite floats kept, tuples as lists, keys as strings
    assert seen["pair"] == [1, 2] and seen["3"] == "x" and math.isnan(seen["nested"][1])
    assert metrics == load_metrics(run.output_dir)
    assert metrics["symptom_reproduced"] and not metrics["fix_verified"]
    assert metrics["numbers"] == {"loss": "inf", "nested": [1.0, "nan"], "pair": [1, 2], "3": "x"}
    assert failed_checks(metrics) == ["fixed is fine"]
    assert metrics["versions"]["trl"] and metrics["device"]["device"] == "cpu"
    assert metrics["checks"]["symptom"]["bad is bad"] == {"passed": True, "kind": "measured"}
    assert metrics["symptom_kind"] == "measured" and metrics["sizes"] == dict(run.sizes)


def test_checks_say_their_kind_and_the_verdict_names_stand_ins(run):
    metrics = save_metrics(
        run, "00", {}, lambda n: ({"real": measured(True), "old code": recreated(True)}, {"fault gone": injected(True)})
    )
    assert metrics["checks"]["symptom"]["old code"] == {"passed": True, "kind": "recreated"}
    assert metrics["symptom_kind"] == "recreated" and metrics["fix_kind"] == "injected"


def test_checks_must_say_their_kind_and_be_bools(run):
    with pytest.raises(TypeError, match="must say its kind"):
        save_metrics(run, "00", {}, lambda n: ({"x": True}, {}))
    with pytest.raises(TypeError, match="must be a bool"):
        save_metrics(run, "00", {}, lambda n: ({"x": measured(1.0)}, {}))
    with pytest.raises(TypeError, match="must be a bool"):
        save_metrics(run, "00", {}, lambda n: ({"x": recreated(None)}, {}))


def test_plot_style(run):
    fig, axes = plotting.figure(2, title="finding")
    plotting.line(axes[0], [1, 2], [3, 4], "bad", "bad run")
    plotting.bars(axes[1], ["a", "b"], [1.0, 2.0], ["bad", "fixed"])
    plotting.label(axes[0], "step", "loss", log_y=True)
    assert axes[0].get_lines()[0].get_color() == plotting.BAD
    path = plotting.save(fig, run.output_dir, "figure")
    assert path.stat().st_size > 1000
    with pytest.raises(ValueError, match="unknown kind"):
        plotting.line(axes[0], [1], [1], "ugly", "x")


def test_nonfinite_probe_names_the_fp16_head(run, tokenizer):
    import torch
    from peft import LoraConfig
    from trl import RewardConfig, RewardTrainer

    from trl_clinic.course.models import make_reward_model
    from trl_clinic.probes.nonfinite import NonFiniteProbe

    args = RewardConfig(
        **run.trainer_kwargs("probe", logging=False),
        optim="adamw_torch",
        max_steps=5,
        per_device_train_batch_size=4,
        learning_rate=5e-3,
    )
    trainer = RewardTrainer(
        model=make_reward_model(tokenizer, dtype=torch.float16),
        args=args,
        train_dataset=data.preference_pairs(40, seed=0),
        processing_class=tokenizer,
        peft_config=LoraConfig(task_type="SEQ_CLS", r=4),
    )
    probe = NonFiniteProbe()
    trainer.add_callback(probe)
    trainer.train()
    assert probe.finding.step == 1 and probe.finding.where == "weight"
    assert probe.finding.names == ["base_model.model.score.modules_to_save.default.weight"]
    assert trainer.state.global_step == 1  # it stopped the run


def test_nonfinite_probe_stays_silent_on_a_healthy_run(run, tokenizer):
    from trl_clinic.probes.nonfinite import NonFiniteProbe

    trainer = tiny_trainer(run, tokenizer)
    probe = NonFiniteProbe()
    trainer.add_callback(probe)
    trainer.train()
    assert probe.finding is None and trainer.state.global_step == 3


def test_replay_nan_filter_gives_what_a_real_trainer_logs_over_nan_micro_batches(run, tokenizer):
    """Lesson 03's mechanism on a real RewardTrainer: an fp16 reward head under the non-fused AdamW goes non-finite in
    optimizer step 1, so every micro-batch loss from step 2 on is NaN; the Trainer's NaN filter then logs a number
    that grows with every NaN micro-batch, and 0 after a log. The replay, fed the raw losses a StepRecorder kept,
    must give the Trainer's own logs."""
    import torch
    from peft import LoraConfig
    from trl import RewardConfig, RewardTrainer

    from trl_clinic.course.models import make_reward_model
    from trl_clinic.probes.recording import replay_nan_filter

    args = RewardConfig(
        **{**run.trainer_kwargs("replay", logging=False), "logging_strategy": "steps", "logging_steps": 3},
        optim="adamw_torch",
        max_steps=6,
        per_device_train_batch_size=2,
        gradient_accumulation_steps=4,
        learning_rate=5e-3,
    )
    trainer = RewardTrainer(
        model=make_reward_model(tokenizer, dtype=torch.float16),
        args=args,
        train_dataset=data.preference_pairs(48, seed=0),
        processing_class=tokenizer,
        peft_config=LoraConfig(task_type="SEQ_CLS", r=4),
    )
    recorder = StepRecorder().watch(trainer)
    trainer.train()
    raw, logged = recorder.series("raw_loss")[1], recorder.series("loss")[1]
    assert math.isfinite(raw[0]) and all(math.isnan(v) for v in raw[1:])  # the NaN micro-batches are real
    assert len(logged) == 2 and logged[0] > raw[0] and logged[1] == 0.0  # inflated, then 0
    # the recorder sums step 1's fp16 micro-batch losses in fp16 (relative rounding 2**-11 = 4.9e-4), the Trainer adds
    # them into an fp32 running sum: 2e-3 is four units of fp16 rounding, while the four NaN micro-batches of steps
    # 2 and 3 multiply the sum by (1 + 1/2)**4 (1 + 1/3)**4 = 16: a filter that skipped them would miss 16-fold
    assert replay_nan_filter(raw, 4, 3) == pytest.approx(logged, rel=2e-3)
    assert logged[0] == pytest.approx(16 * raw[0] / 3, rel=2e-3)  # not the plain mean over the window, raw[0] / 3


def test_replay_nan_filter_follows_trainer_arithmetic():
    from trl_clinic.probes.recording import replay_nan_filter

    # lesson 03's report: step 1 finite, then NaN; 32 micro-batches a step, a log every 25 steps
    logs = replay_nan_filter([2.0] + [math.nan] * 49, accumulation=32, logging_steps=25)
    assert logs[0] == pytest.approx(2.0 * 13**32 / 25, rel=1e-12) and logs[1] == 0.0
    # finite losses are logged as their mean over the logging window
    assert replay_nan_filter([1.0, 3.0, 5.0, 7.0], accumulation=4, logging_steps=2) == [2.0, 6.0]
