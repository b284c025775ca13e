"""The gpu profile's failures seen in its one run on an H100, each reproduced or guarded without a GPU."""

import copy
import dataclasses

import pytest
import torch
from trl import SFTConfig, SFTTrainer

from trl_clinic.course import child, data
from trl_clinic.course.launch import distributed_args
from trl_clinic.course.lessons import find_lesson
from trl_clinic.course.models import make_causal_lm, model_maker, trained_model
from trl_clinic.course.parameters import start_run
from trl_clinic.probes.gradients import first_step_gradient, relative_error


@pytest.fixture
def run(tmp_path):
    return start_run("02b", "cpu", 0, tmp_path / "out")


def test_trained_model_drops_the_autocast_a_bf16_run_leaves_behind(run, tokenizer):
    """After training with bf16=True accelerate leaves the forward wrapped in bf16 autocast: "fp32"
    scoring of trainer.model silently ran in bf16 (lessons 03 and 04 on the GPU). Reproduced on CPU."""
    model = make_causal_lm(tokenizer)
    args = SFTConfig(
        **{**run.trainer_kwargs("bf16", logging=False), "bf16": True}, per_device_train_batch_size=2, max_steps=1
    )
    trainer = SFTTrainer(
        model=model, args=args, processing_class=tokenizer, train_dataset=data.instruction_pairs(8, seed=0)
    )
    trainer.train()
    reference = copy.deepcopy(model)  # same weights, a forward without any wrapper
    reference.forward = type(reference).forward.__get__(reference)
    ids = torch.tensor([tokenizer("alice lives in paris. where does alice live? answer:")["input_ids"]])
    with torch.no_grad():
        expected = reference(input_ids=ids).logits
        leaked = trainer.model(input_ids=ids).logits
        plain = trained_model(trainer)(input_ids=ids).logits
    assert (leaked - expected).abs().max() > 1e-4, "the bf16 autocast leak no longer happens: update lesson 03/04"
    assert torch.equal(plain, expected)


def test_a_cpu_runs_children_see_no_gpu(run):
    """With one GPU, 02b's gloo children asked for cuda:RANK in SFTTrainer's main_process_first barrier."""
    assert child.child_env(run) == {"CUDA_VISIBLE_DEVICES": ""}
    probe = run.output_dir / "probe.py"
    probe.write_text(
        "import os, torch\n"
        "def look(run, spec):\n"
        "    return {'visible': os.environ['CUDA_VISIBLE_DEVICES'], 'cuda': torch.cuda.is_available(),\n"
        "            'device': str(run.device), 'sizes': dict(run.sizes), 'spec': spec}\n"
    )
    result = child.call(run, f"{probe}:look", {"x": 1}, name="look", timeout=120).result
    assert result == {"visible": "", "cuda": False, "device": "cpu", "sizes": dict(run.sizes), "spec": {"x": 1}}


def test_a_child_that_dies_or_overruns_says_so(run):
    probe = run.output_dir / "probe.py"
    probe.write_text(
        "import time\nfrom trl_clinic.course.crash import native_sigfpe\n"
        "def crash(run, spec):\n    native_sigfpe()\n"
        "def sleep(run, spec):\n    time.sleep(30)\n"
    )
    died = child.call(run, f"{probe}:crash", name="crash", timeout=120)
    assert died.outcome.signal == "SIGFPE" and died.result is None
    slow = child.call(run, f"{probe}:sleep", name="sleep", timeout=3)
    assert slow.outcome.status == "timeout" and slow.result is None


def test_two_gloo_processes_return_the_main_process_result(run):
    probe = run.output_dir / "probe.py"
    probe.write_text(
        "import torch.distributed as dist\n"
        "def ranks(run, spec):\n"
        "    dist.init_process_group('gloo')\n"
        "    out = [None, None]\n"
        "    dist.all_gather_object(out, dist.get_rank())\n"
        "    return out\n"
    )  # the group is left to child.call to close, as a Trainer leaves it
    both = child.call(run, f"{probe}:ranks", name="ranks", processes=2, timeout=180)
    assert both.outcome.status == "finished", both.outcome.stderr[-2000:]
    assert both.result == [0, 1]


def gpu_run(run, monkeypatch, gpus: int):
    """The gpu profile's run on a machine with ``gpus`` GPUs (mocked; the children see the real machine)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpus > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    return dataclasses.replace(run, profile="gpu", device=torch.device("cuda"), precision="bf16")


@pytest.mark.parametrize(
    "gpus, device, launcher",
    [
        (0, "cpu", "torch.distributed.run"),
        (1, "cpu", "torch.distributed.run"),
        (2, "cuda", "accelerate.commands.launch"),
    ],
)
def test_two_processes_use_the_gpus_only_with_one_gpu_each(run, monkeypatch, gpus, device, launcher):
    """With one GPU, 02b's two gloo processes both saw it and rank 1 asked for cuda:1. Now fewer
    GPUs than processes means CPU processes over gloo, in fp32, that see no GPU, and the lesson says so."""
    where = child.placed(gpu_run(run, monkeypatch, gpus), 2)
    assert where.device.type == device and where.precision == ("fp32" if device == "cpu" else "bf16")
    assert child.child_env(where) == ({"CUDA_VISIBLE_DEVICES": ""} if device == "cpu" else {})
    assert launcher in distributed_args(["-m", "trl_clinic.course.child", "spec.json"], 2, cpu=device == "cpu")
    said = child.placement(gpu_run(run, monkeypatch, gpus), 2)
    assert ("over nccl" in said) == (device == "cuda") and ("fewer GPUs than processes" in said) == (device == "cpu")
    assert child.placed(gpu_run(run, monkeypatch, gpus), 1).device.type == "cuda"  # one process keeps its GPU


def test_a_gpu_run_on_one_gpu_starts_its_two_processes_on_the_cpu_for_real(run, monkeypatch):
    probe = run.output_dir / "probe.py"
    probe.write_text(
        "import os, torch.distributed as dist\n"
        "def where(run, spec):\n"
        "    dist.init_process_group('gloo')\n"
        "    return {'device': str(run.device), 'precision': run.precision, 'backend': dist.get_backend(),\n"
        "            'visible': os.environ.get('CUDA_VISIBLE_DEVICES')}\n"
    )
    both = child.call(gpu_run(run, monkeypatch, 1), f"{probe}:where", name="where", processes=2, timeout=180)
    assert both.outcome.status == "finished", both.outcome.stderr[-2000:]
    assert both.result == {"device": "cpu", "precision": "fp32", "backend": "gloo", "visible": ""}


def test_lesson_02s_gpu_model_loads_and_takes_an_accumulated_step_on_cpu(smollm2_package, tmp_path):
    """Lesson 02's deep dive trains SmolLM2-135M-Instruct on the gpu profile (model_size "smollm2"): the same maker,
    on CPU, gives separate copies of the same weights, and today's batch 1 x 2 step matches batch 2 with its
    tokenizer."""
    gpu_sizes = find_lesson("02-deeper").sizes("gpu")
    make_model, tokenizer = model_maker(gpu_sizes.model_size)
    first, second = make_model(), make_model()
    assert first is not second and first.config.model_type == "llama"
    assert all(torch.equal(a, b) for a, b in zip(first.state_dict().values(), second.state_dict().values()))
    run = start_run("02", "cpu", 0, tmp_path / "out")
    samples = data.instruction_pairs(2, seed=0)  # a short and a long answer

    def gradient(model, batch_size, accumulation):
        args = SFTConfig(
            **{**run.trainer_kwargs(f"smol-{batch_size}", logging=False), "bf16": False},
            per_device_train_batch_size=batch_size,
            gradient_accumulation_steps=accumulation,
            max_grad_norm=0,
            max_steps=1,
            train_sampling_strategy="sequential",
        )
        return first_step_gradient(
            SFTTrainer(model=model, args=args, train_dataset=samples, processing_class=tokenizer)
        )

    assert relative_error(gradient(first, 1, 2), gradient(second, 2, 1)) < 1e-4


def test_lesson_02s_gpu_core_model_shows_the_bug_and_the_fix_on_cpu(tmp_path):
    """Lesson 02's core on the gpu profile builds Qwen2.5-VL at the "small" shape: the class still declares no loss
    kwargs there, batch 1 x 2 misses batch 2 on a short and a long answer, and the core's one-line fix matches it."""
    from trl_clinic.course.lessons.lesson_02_accumulation.companion import FirstStep, vision_language_model_maker

    gpu_sizes = find_lesson("02").sizes("gpu")
    make_model, tokenizer = vision_language_model_maker(gpu_sizes.model_size)
    assert type(make_model()).accepts_loss_kwargs is False
    steps = FirstStep(
        start_run("02", "cpu", 0, tmp_path / "out"), make_model, tokenizer, data.instruction_pairs(2, seed=0)
    )
    big = first_step_gradient(steps.trainer(2, 1))
    assert relative_error(first_step_gradient(steps.trainer(1, 2)), big) > 1e-2
    assert relative_error(first_step_gradient(steps.trainer(1, 2, fixed=True)), big) < 1e-4


def test_lesson_03s_gpu_reward_model_goes_non_finite_in_fp16_and_not_in_float32(smollm2_package, tmp_path):
    """Lesson 03's gpu profile trains SmolLM2-135M-Instruct with a new score head on pairs whose prompts carry a
    passage: its tokenizer, its head, and one step of the report's non-fused AdamW, tried on CPU (batch 1 x
    accumulation 2 and no passage for the step, or fp16 on a CPU takes tens of seconds): the fp16 head goes
    non-finite, the float32 one does not."""
    from trl_clinic.course.lessons import Sizes
    from trl_clinic.course.lessons.lesson_03_reward_nan.companion import preference_data, reward_trainer

    run = start_run("03", "cpu", 0, tmp_path / "out")
    gpu_sizes = find_lesson("03").sizes("gpu")
    passages = preference_data(dataclasses.replace(run, sizes=Sizes({**gpu_sizes, "train_steps": 1, "eval_pairs": 4})))
    assert len(passages.tokenizer) > 40_000 and passages.train[0]["prompt"].startswith("passage: ")  # SmolLM2's own
    assert len(passages.tokenizer(passages.train[0]["prompt"])["input_ids"]) > 100  # the longer sequences
    short = dataclasses.replace(run, sizes=Sizes({**gpu_sizes, "train_steps": 1, "eval_pairs": 4, "context_people": 0}))
    pairs = preference_data(short)
    heads = {}
    for dtype in (torch.float16, torch.float32):
        trainer = reward_trainer(
            short,
            pairs,
            dtype,
            f"smol-{dtype}",
            bf16=False,
            optim="adamw_torch",
            per_device_train_batch_size=1,
            gradient_accumulation_steps=2,
            max_steps=1,
            logging_strategy="no",
        )
        trainer.train()
        heads[dtype] = next(p for n, p in trainer.model.named_parameters() if "score" in n and p.requires_grad)
    assert heads[torch.float16].numel() == 576 and heads[torch.float16].dtype == torch.float16
    assert not torch.isfinite(heads[torch.float16]).all() and torch.isfinite(heads[torch.float32]).all()
