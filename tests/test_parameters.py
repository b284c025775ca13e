import pytest
import torch
from trl import SFTConfig

from trl_clinic import runtime
from trl_clinic.parameters import start_run
from trl_clinic.profiles import PROFILES, resolve_profile


def test_auto_follows_cuda():
    assert resolve_profile("auto", cuda_available=False) is PROFILES["cpu"]
    assert resolve_profile("auto", cuda_available=True) is PROFILES["gpu"]


@pytest.mark.parametrize("bad, error, words", [
    ("fast", ValueError, "unknown profile 'fast'"),
    ("CPU", ValueError, "choose one of auto, cpu, gpu"),
    (1, TypeError, "profile must be a string"),
])
def test_bad_profile_is_a_clear_error(bad, error, words):
    with pytest.raises(error, match=words):
        resolve_profile(bad, cuda_available=False)


def test_gpu_profile_without_cuda_says_so():
    with pytest.raises(ValueError, match="needs a CUDA device"):
        resolve_profile("gpu", cuda_available=False)


def test_gpu_profile_is_bigger_and_longer():
    cpu, gpu = PROFILES["cpu"], PROFILES["gpu"]
    assert gpu.train_steps > cpu.train_steps and gpu.n_train > cpu.n_train
    assert (cpu.model_size, gpu.model_size) == ("tiny", "small")


@pytest.mark.parametrize("seed", ["0", 1.5, True, None])
def test_seed_must_be_an_int(tmp_path, seed):
    with pytest.raises(TypeError, match="seed must be an integer"):
        start_run("cpu", seed, tmp_path / "out")


def test_output_dir_parent_must_exist(tmp_path):
    with pytest.raises(FileNotFoundError, match="parent folder does not exist"):
        start_run("cpu", 0, tmp_path / "missing" / "out")


def test_output_dir_must_be_a_path(tmp_path):
    with pytest.raises(TypeError, match="output_dir must be a path"):
        start_run("cpu", 0, 3)


def test_start_run_creates_output_and_seeds(tmp_path):
    run = start_run("cpu", 7, tmp_path / "out")
    assert run.output_dir.is_dir() and run.seed == 7 and run.profile.name == "cpu"
    first = torch.rand(3)
    start_run("cpu", 7, tmp_path / "out")
    assert torch.equal(first, torch.rand(3))
    text = run.describe()
    for name in ("torch", "transformers", "trl", "peft", "device"):
        assert f"{name}:" in text


def test_cpu_trainer_kwargs_are_accepted_by_trl(tmp_path):
    run = start_run("cpu", 0, tmp_path / "out")
    kwargs = run.trainer_kwargs("probe")
    assert kwargs["bf16"] is False and kwargs["use_cpu"] is True
    config = SFTConfig(**kwargs)  # TRL's default bf16=True would raise here without a GPU
    assert not config.bf16 and not config.gradient_checkpointing


def test_gpu_precision_flags_use_bf16_where_supported(monkeypatch):
    cuda = torch.device("cuda")
    monkeypatch.setattr(runtime, "bf16_supported", lambda device: True)
    assert runtime.precision_flags(cuda) == {"bf16": True, "fp16": False}
    monkeypatch.setattr(runtime, "bf16_supported", lambda device: False)
    assert runtime.precision_flags(cuda) == {"bf16": False, "fp16": False}


def test_gpu_run_trainer_kwargs(monkeypatch, tmp_path):
    """The gpu code path, checked without a GPU: bf16 on, no CPU flag, threads left alone."""
    from trl_clinic.parameters import Run

    monkeypatch.setattr(runtime, "bf16_supported", lambda device: True)
    run = Run(profile=PROFILES["gpu"], device=torch.device("cuda"), seed=0, output_dir=tmp_path)
    kwargs = run.trainer_kwargs("x", logging=False)
    assert kwargs["bf16"] is True and "use_cpu" not in kwargs and kwargs["logging_strategy"] == "no"
    assert run.on_gpu and PROFILES["gpu"].torch_threads is None
