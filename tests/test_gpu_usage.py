"""The runner records peak GPU memory and mean utilisation per lesson (the one H100 run left the GPU idle in a
lesson and nothing said so), sampled through NVML; NVML is mocked here (no GPU on these machines), the lesson
runs for real."""

import json
import sys
import types

from test_workbook import FINE_LESSON, tiny_notebook

from trl_clinic.cli import main
from trl_clinic.course.gpu_usage import GpuUsage
from trl_clinic.course.report import build_report


def fake_nvml(memory_mib: list[float], busy: list[int]) -> types.ModuleType:
    """A pynvml whose one GPU reports the given memory and utilisation, one value per sample, then the last."""
    nvml = types.ModuleType("pynvml")
    nvml.NVMLError = type("NVMLError", (Exception,), {})
    nvml.nvmlInit = lambda: None
    nvml.nvmlDeviceGetCount = lambda: 1
    nvml.nvmlDeviceGetHandleByIndex = lambda index: index
    samples = {"memory": list(memory_mib), "busy": list(busy)}

    def take(name):
        values = samples[name]
        return values.pop(0) if len(values) > 1 else values[0]

    nvml.nvmlDeviceGetMemoryInfo = lambda handle: types.SimpleNamespace(used=take("memory") * 2**20)
    nvml.nvmlDeviceGetUtilizationRates = lambda handle: types.SimpleNamespace(gpu=take("busy"))
    return nvml


def test_peak_memory_and_mean_utilisation_over_the_samples(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml([100, 900, 300], [0, 100, 50]))
    usage = GpuUsage(interval_s=0.01).start()
    while len(usage.memory_mib) < 3:
        pass
    numbers = usage.stop()
    assert numbers["peak_gpu_memory_mib"] == 900
    assert numbers["gpu_samples"] >= 3 and 50 <= numbers["mean_gpu_utilisation_pct"] <= 100 * 2 / 3 + 1e-6


def test_without_nvml_the_numbers_are_absent_and_say_why(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import fails
    numbers = GpuUsage().start().stop()
    assert numbers["peak_gpu_memory_mib"] is None and "not installed" in numbers["gpu_usage_missing"]


def test_the_runner_writes_them_per_lesson_into_the_summary_and_the_report(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml([2048], [75]))
    lessons = tmp_path / "notebooks"
    lessons.mkdir()
    tiny_notebook(lessons / "02_fine.ipynb", FINE_LESSON)
    out = tmp_path / "out"
    assert main(["run", "--profile", "cpu", "--out", str(out), "--no-progress", "--notebooks", str(lessons)]) == 0
    [row] = json.loads((out / "summary.json").read_text())["lessons"]
    assert row["gpu"]["peak_gpu_memory_mib"] == 2048 and row["gpu"]["mean_gpu_utilisation_pct"] == 75
    assert "| 2048.0 | 75.0 |" in (out / "summary.md").read_text()
    assert "peak 2048 MiB, 75 % busy on average" in build_report(out).read_text()
