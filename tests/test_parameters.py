import json
import os
import subprocess
import sys

import pytest
import torch
from trl import SFTConfig

from trl_clinic.course import parameters, runtime
from trl_clinic.course.lessons import find_lesson
from trl_clinic.course.parameters import default_output_dir, start_run
from trl_clinic.course.profiles import resolve_profile
from trl_clinic.course.run import Run


def test_auto_follows_cuda():
    assert resolve_profile("auto", cuda_available=False) == "cpu"
    assert resolve_profile("auto", cuda_available=True) == "gpu"
    assert resolve_profile("cpu", cuda_available=True) == "cpu"


@pytest.mark.parametrize(
    "bad, error, words",
    [
        ("fast", ValueError, "unknown profile 'fast'"),
        ("CPU", ValueError, "choose one of auto, cpu, gpu"),
        (1, TypeError, "profile must be a string"),
    ],
)
def test_bad_profile_is_a_clear_error(bad, error, words):
    with pytest.raises(error, match=words):
        resolve_profile(bad, cuda_available=False)


def test_one_variable_picks_the_profile_of_every_notebook_left_on_auto(monkeypatch):
    """A shared GPU box: TRL_CLINIC_PROFILE=cpu makes every notebook's default "auto" the verified cpu profile; a
    notebook's explicit choice still wins, and a typo in the variable is one clear error."""
    monkeypatch.setenv("TRL_CLINIC_PROFILE", "cpu")
    assert resolve_profile("auto", cuda_available=True) == "cpu"
    assert resolve_profile("gpu", cuda_available=True) == "gpu"
    monkeypatch.setenv("TRL_CLINIC_PROFILE", "gpu")
    with pytest.raises(ValueError, match="needs a CUDA device"):
        resolve_profile("auto", cuda_available=False)
    monkeypatch.setenv("TRL_CLINIC_PROFILE", "CPU")
    with pytest.raises(ValueError, match="TRL_CLINIC_PROFILE='CPU' is not a profile"):
        resolve_profile("auto", cuda_available=True)
    monkeypatch.setenv("TRL_CLINIC_PROFILE", "")
    assert resolve_profile("auto", cuda_available=True) == "gpu"


def test_gpu_profile_without_cuda_says_so():
    with pytest.raises(ValueError, match="needs a CUDA device"):
        resolve_profile("gpu", cuda_available=False)


@pytest.mark.parametrize("seed", ["0", 1.5, True, None])
def test_seed_must_be_an_int(tmp_path, seed):
    with pytest.raises(TypeError, match="seed must be an integer"):
        start_run("02", "cpu", seed, tmp_path / "out")


def test_output_dir_parent_must_exist(tmp_path):
    with pytest.raises(FileNotFoundError, match="parent folder does not exist"):
        start_run("02", "cpu", 0, tmp_path / "missing" / "out")


def test_output_dir_must_be_a_path(tmp_path):
    with pytest.raises(TypeError, match="output_dir must be a path"):
        start_run("02", "cpu", 0, 3)


def test_output_dir_must_be_writable(tmp_path, monkeypatch):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    if os.geteuid() == 0:  # root may write anywhere, and CI runs as root: answer as the mode bits do for the owner
        monkeypatch.setattr(
            parameters.os, "access", lambda path, mode: not mode & os.W_OK or bool(os.stat(path).st_mode & 0o200)
        )
    with pytest.raises(PermissionError, match="not writable"):
        start_run("02", "cpu", 0, locked)


def test_unknown_lesson_lists_the_known_ones(tmp_path):
    with pytest.raises(ValueError, match="unknown lesson '09'; known: 01, 01-deeper, 02, 02-deeper, 02b"):
        start_run("09", "cpu", 0, tmp_path / "out")


def test_default_output_dir_is_the_repository_outputs_folder(tmp_path):
    repo = tmp_path / "repo"
    (repo / "notebooks").mkdir(parents=True)
    (repo / "notebooks" / "02_x.ipynb").write_text("{}")
    assert default_output_dir("02_x", repo / "notebooks") == repo / "outputs" / "02_x"
    assert default_output_dir("02_x", repo) == repo / "outputs" / "02_x"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    assert default_output_dir("02_x", elsewhere) == elsewhere / "outputs" / "02_x"


def test_start_run_creates_output_and_seeds(tmp_path):
    run = start_run("02", "cpu", 7, tmp_path / "out")
    assert run.output_dir.is_dir() and run.seed == 7 and run.profile == "cpu"
    first = torch.rand(3)
    start_run("02", "cpu", 7, tmp_path / "out")
    assert torch.equal(first, torch.rand(3))
    text = run.describe()
    assert "\n" not in text, text  # one line on the screen; the environment is in metrics.json
    for part in ("lesson 02", "cpu profile", "fp32", "seed 7", str(tmp_path / "out")):
        assert part in text, (part, text)
    for name in ("torch", "transformers", "trl", "peft"):
        assert name in run.versions  # what save_metrics writes to metrics.json and the report shows


def test_the_line_names_the_output_folder_from_the_repository_root(monkeypatch, tmp_path):
    monkeypatch.setenv("TRL_CLINIC_ROOT", str(tmp_path))
    (tmp_path / "outputs").mkdir()
    run = start_run("06-deeper", "cpu", 0, tmp_path / "outputs" / "06_checkup_your_trainer_deeper")
    assert run.describe().endswith("outputs in outputs/06_checkup_your_trainer_deeper")


def test_cpu_profile_means_cpu_and_fp32_even_with_cuda(monkeypatch, tmp_path):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(parameters, "bf16_supported", lambda device: True)
    run = start_run("02", "cpu", 0, tmp_path / "out")
    assert run.device.type == "cpu" and run.precision == "fp32" and run.attention == "sdpa"
    kwargs = run.trainer_kwargs("probe")
    assert kwargs["bf16"] is False and kwargs["use_cpu"] is True
    assert run.sizes == find_lesson("02").sizes("cpu") and run.cpu_flags() == {"use_cpu": True}


def test_gpu_profile_means_cuda_bf16_and_the_gpu_sizes(monkeypatch, tmp_path):
    """The gpu code path, checked without a GPU: CUDA mocked, bf16 on, no CPU flag, the gpu sizes."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(parameters, "bf16_supported", lambda device: True)
    monkeypatch.setattr(parameters, "best_attention", lambda device: "flash_attention_3")
    run = start_run("05", "gpu", 0, tmp_path / "out")
    assert run.device.type == "cuda" and run.precision == "bf16" and run.attention == "flash_attention_3"
    kwargs = run.trainer_kwargs("x", logging=False)
    assert kwargs["bf16"] is True and "use_cpu" not in kwargs and kwargs["logging_strategy"] == "no"
    assert run.sizes == find_lesson("05").sizes("gpu") and run.cpu_flags() == {}


def test_gpu_without_bf16_falls_back_to_fp32(monkeypatch, tmp_path):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(parameters, "bf16_supported", lambda device: False)
    monkeypatch.setattr(parameters, "best_attention", lambda device: "sdpa")
    assert start_run("02", "gpu", 0, tmp_path / "out").precision == "fp32"


def test_cpu_trainer_kwargs_are_accepted_by_trl(tmp_path):
    run = start_run("02", "cpu", 0, tmp_path / "out")
    config = SFTConfig(**run.trainer_kwargs("probe"))  # TRL's default bf16=True would raise here without a GPU
    assert not config.bf16 and not config.gradient_checkpointing


def test_precision_flags():
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert runtime.precision_flags(cuda, "bf16") == {"bf16": True, "fp16": False}
    assert runtime.precision_flags(cuda, "fp32") == {"bf16": False, "fp16": False}
    assert runtime.precision_flags(cpu, "fp32") == {"bf16": False, "fp16": False, "use_cpu": True}
    with pytest.raises(ValueError, match="unknown precision"):
        runtime.precision_flags(cpu, "fp8")


def test_best_attention_prefers_the_newest_flash_attention(monkeypatch):
    from transformers.utils import import_utils

    assert runtime.best_attention(torch.device("cpu")) == "sdpa"
    for version in (2, 3, 4):
        monkeypatch.setattr(import_utils, f"is_flash_attn_{version}_available", lambda: False)
    assert runtime.best_attention(torch.device("cuda")) == "sdpa"
    monkeypatch.setattr(import_utils, "is_flash_attn_2_available", lambda: True)
    assert runtime.best_attention(torch.device("cuda")) == "flash_attention_2"
    monkeypatch.setattr(import_utils, "is_flash_attn_4_available", lambda: True)
    assert runtime.best_attention(torch.device("cuda")) == "flash_attention_4"


def test_subseeds_differ_by_name_and_follow_the_seed(tmp_path):
    run = start_run("02", "cpu", 3, tmp_path / "out")
    assert run.subseed("train") == run.subseed("train") != run.subseed("eval")
    assert start_run("02", "cpu", 4, tmp_path / "out").subseed("train") != run.subseed("train")


def test_a_child_gets_the_resolved_run_back(tmp_path):
    run = start_run("02b", "cpu", 5, tmp_path / "out")
    again = Run.from_spec(run.to_spec())
    assert again.to_spec() == run.to_spec() and again.sizes.accumulation == run.sizes.accumulation


def test_progress_bars_follow_the_environment(monkeypatch, tmp_path):
    run = start_run("02", "cpu", 0, tmp_path / "out")
    monkeypatch.setenv(runtime.PROGRESS_ENV, "0")
    assert run.trainer_kwargs("x")["disable_tqdm"] is True
    monkeypatch.delenv(runtime.PROGRESS_ENV)
    assert run.trainer_kwargs("x")["disable_tqdm"] is False
    assert run.trainer_kwargs("x", progress=False)["disable_tqdm"] is True


def test_a_lesson_goes_offline_itself_even_after_the_hub_was_imported_online(tmp_path):
    """`make lab` exports nothing to JupyterLab (a learner's own hub models must load there): each lesson
    sets offline mode itself, also when transformers came first and huggingface_hub read the variable online."""
    code = (
        "import os; os.environ['HF_HUB_OFFLINE'] = '0'\n"
        "import huggingface_hub.constants as hub\nassert not hub.is_offline_mode()\n"
        "from trl_clinic.course.parameters import start_run\n"
        f"start_run('06', 'cpu', 0, {str(tmp_path / 'out')!r})\n"
        "print(hub.is_offline_mode(), os.environ['HF_HUB_OFFLINE'], os.environ['HF_DATASETS_OFFLINE'])"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert out.stdout.split() == ["True", "1", "1"], out.stderr[-2000:]


def test_the_gpu_profile_says_it_is_unverified_until_a_real_run_is_recorded(tmp_path):
    """`auto` picks gpu wherever CUDA is present, and no GPU run has yet passed every lesson: until docs/gpu-runs/
    holds one, the lesson says so plainly and how to pick cpu; once one is recorded, it names it."""
    from trl_clinic.course.profiles import GPU_RUNS, gpu_profile_note

    assert "unverified" in gpu_profile_note(tmp_path) and "profile='cpu'" in gpu_profile_note(tmp_path)
    runs = tmp_path / GPU_RUNS
    runs.mkdir(parents=True)
    (runs / "2026-11-24-h100.json").write_text(json.dumps({"all_passed": False, "device": "NVIDIA H100", "date": "x"}))
    assert "unverified" in gpu_profile_note(tmp_path)
    (runs / "2026-11-25-h100.json").write_text(
        json.dumps({"all_passed": True, "device": "NVIDIA H100 80GB HBM3", "date": "2026-11-25"})
    )
    note = gpu_profile_note(tmp_path)
    assert "unverified" not in note and "NVIDIA H100 80GB HBM3" in note and "2026-11-25-h100.json" in note


def test_a_gpu_run_prints_the_note_and_a_cpu_run_does_not(tmp_path):
    gpu = Run(
        lesson="02",
        profile="gpu",
        device=torch.device("cpu"),
        precision="bf16",
        attention="sdpa",
        sizes=find_lesson("02").sizes("gpu"),
        seed=0,
        output_dir=tmp_path,
    )
    assert "profile gpu" in gpu.describe()
    cpu = Run(
        lesson="02",
        profile="cpu",
        device=torch.device("cpu"),
        precision="fp32",
        attention="sdpa",
        sizes=find_lesson("02").sizes("cpu"),
        seed=0,
        output_dir=tmp_path,
    )
    assert "profile gpu" not in cpu.describe()


def test_a_library_warning_is_folded_once_on_screen_and_left_as_logged_for_every_other_handler():
    import io
    import logging

    screen, other = io.StringIO(), []
    logger = logging.getLogger("trl_clinic.test.folded")
    logger.propagate = False
    shown = logging.StreamHandler(screen)
    runtime.FoldedOnce().install(shown)
    captured = logging.Handler()
    captured.emit = other.append
    logger.addHandler(shown)
    logger.addHandler(captured)
    message = "right-padding was detected " + "x" * 200
    try:
        for _ in range(3):
            logger.warning("%s", message)
    finally:
        logger.removeHandler(shown)
        logger.removeHandler(captured)
    lines = screen.getvalue().splitlines()
    assert "(shown once; repeats hidden)" in screen.getvalue() and screen.getvalue().count("right-padding") == 1
    assert max(map(len, lines)) <= runtime.FoldedOnce.WIDTH
    assert [record.getMessage() for record in other] == [message] * 3  # the records themselves untouched
