"""The kit and the script for the gpu profile's run on a lent GPU machine (tools/gpu_run): what each call carries
fits in 64 MiB, the model's two parts join into the release's file or fail with one clear error, the lessons are
launched cores first within a budget and stopped at a deadline, and the record is what gpu_profile_note reads, in
no more files than the device tool brings back. No network and no GPU: the sizes are checked once `make gpu-kit`
has made the kit, everything else always."""

import json
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools" / "gpu_run"))

import device_run  # noqa: E402
import kit  # noqa: E402

from trl_clinic.course.profiles import GPU_RUNS, gpu_profile_note  # noqa: E402

OUT_NAME = re.compile(r"^[A-Za-z0-9._-]+$")  # what the device tool brings back from $OUT


def pins(path: Path) -> dict[str, str]:
    """``name -> version`` of a requirements file, environment markers left out (the universal lock's: the last
    line of a package wins, soupsieve's from CPython 3.11.5, what the GPU machine's Python gets)."""
    lines = [line.split("#", 1)[0].split(";", 1)[0].strip() for line in path.read_text().splitlines()]
    return {
        line.split("==")[0].lower().replace("_", "-"): line.split("==")[1] if "==" in line else ""
        for line in lines
        if line
    }


def test_the_wheels_are_the_locks_versions_and_none_is_already_on_the_machine():
    carried = pins(kit.WHEEL_LIST)
    assert len(carried) == len(kit.wheel_requirements())
    locked = pins(ROOT / "requirements-lock.txt")
    assert {name: version for name, version in carried.items() if locked.get(name) != version} == {}
    machine = pins(kit.HERE / "device-packages.txt")
    assert set(carried) & set(machine) == set(), "one version of each: carry only what the machine lacks"
    # papermill's kernel and the lessons' own libraries are there; debugpy and jedi are left out on purpose
    assert {"trl", "datasets", "papermill", "ipykernel", "gguf", "pyzmq", "tornado"} <= set(carried)
    assert {"debugpy", "jedi"}.isdisjoint(carried)


def test_a_loose_or_repeated_pin_is_refused(tmp_path):
    (tmp_path / "w.txt").write_text("trl==1.16.0\nTRL==1.15.0\n")
    with pytest.raises(ValueError, match="one version of each package, trl"):
        kit.wheel_requirements(tmp_path / "w.txt")
    (tmp_path / "w.txt").write_text("trl>=1.16\n")
    with pytest.raises(ValueError, match="pin every wheel"):
        kit.wheel_requirements(tmp_path / "w.txt")


def test_the_split_puts_as_many_bytes_in_each_call():
    first = kit.split_point(kit.MODEL_BYTES, 7_416_698)
    assert abs((7_416_698 + first) - (kit.MODEL_BYTES - first)) <= 1
    with pytest.raises(ValueError, match="no room"):
        kit.split_point(100, 200)


def test_the_parts_join_into_the_checked_file_or_fail_with_one_clear_error(tmp_path):
    model = tmp_path / "model.whl"
    model.write_bytes(bytes(range(256)) * 1000)
    digest, size = kit.sha256(model), model.stat().st_size
    parts = (tmp_path / "call1" / "model.part1", tmp_path / "call2" / "model.part2")
    kit.split(model, parts, kit.split_point(size, 40_000))
    assert parts[0].stat().st_size + parts[1].stat().st_size == size
    joined = kit.join(parts, tmp_path / "work" / "joined.whl", size, digest)
    assert joined.read_bytes() == model.read_bytes()
    parts[1].write_bytes(parts[1].read_bytes()[:-1] + b"x")  # a stale or damaged part
    with pytest.raises(ValueError, match="stale or damaged") as error:
        kit.join(parts, tmp_path / "work" / "joined.whl", size, digest)
    assert digest in str(error.value) and not (tmp_path / "work" / "joined.whl").exists()
    parts[0].unlink()  # a machine given back between the calls
    with pytest.raises(FileNotFoundError, match="run call 1 again"):
        kit.join(parts, tmp_path / "work" / "joined.whl", size, digest)


@pytest.mark.skipif(not kit.prepared(), reason="the kit is not prepared here: `make gpu-kit` makes it (network)")
def test_each_call_carries_less_than_64_mib_with_room_to_spare():
    sizes = kit.call_sizes()
    assert [row["call"] for row in sizes] == [1, 2]
    for row in sizes:
        assert row["total"] <= kit.CALL_LIMIT - kit.MARGIN, row
    wheels = kit.folder_bytes(ROOT / kit.WHEELS)
    parts = [(ROOT / part).stat().st_size for part in kit.PARTS]
    assert sum(parts) == kit.MODEL_BYTES and parts[0] == kit.split_point(kit.MODEL_BYTES, wheels)


def test_the_readme_gives_each_call_as_planned():
    readme = (kit.HERE / "README.md").read_text()
    for call in kit.CALLS:
        assert call.command in readme
        assert json.dumps(list(call.carry)) in readme
        assert f"timeout_s: {call.timeout_s}" in readme
        assert all(path.startswith(kit.KIT + "/") for path in call.carry)
    assert f"/{kit.KIT}/" in (ROOT / ".gitignore").read_text().splitlines()


def test_the_lessons_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("TRL_CLINIC_REQUIRE_ERAS", "01-trl-0.14")
    env = device_run.lesson_env(tmp_path / "site", tmp_path / "work", jobs=4)
    assert "TRL_CLINIC_REQUIRE_ERAS" not in env  # no era is built there: a lesson reports its era part as skipped
    assert env["PYTHONPATH"].split(":") == [str(tmp_path / "site"), str(ROOT / "src")]
    assert env["HF_HUB_OFFLINE"] == "1" and env["JUPYTER_PATH"] == str(tmp_path / "work" / "jupyter")
    argv = device_run.write_kernelspec(tmp_path / "work")
    spec = json.loads((tmp_path / "work" / "jupyter" / "kernels" / "python3" / "kernel.json").read_text())
    assert spec["argv"] == argv and argv[0] == sys.executable


class QuietLog(device_run.Log):
    def __call__(self, message: str) -> None:
        self.handle.write(message + "\n")


def fake_lesson(seconds: float, status: str = "passed") -> str:
    """A stand-in for one lesson's `trl-clinic run`: sleeps, then writes the runner's summary.json."""
    return (
        "import json, sys, time, pathlib\n"
        f"time.sleep({seconds})\n"
        "out = pathlib.Path(sys.argv[1])\n"
        f"row = {{'lesson': out.name, 'status': {status!r}, 'seconds': {seconds}, 'gpu': None}}\n"
        "(out / 'summary.json').write_text(json.dumps({'lessons': [row]}))\n"
    )


def test_cores_first_none_launched_after_the_budget_and_the_rest_stopped_at_the_deadline(tmp_path, monkeypatch):
    # two at once: 01_a ends early and frees a slot for the first deep dive, which outlives the deadline; 02_b ends
    # after the budget, so the second deep dive never starts
    durations = {"01_a": 0.2, "02_b": 3.0, "01_a_deeper": 30, "02_b_deeper": 0.2}
    monkeypatch.setattr(
        device_run,
        "lesson_command",
        lambda name, profile, out: [sys.executable, "-c", fake_lesson(durations[name]), str(out)],
    )
    lessons = [device_run.Lesson(name, "deep dive" if "deeper" in name else "core") for name in durations]
    log = QuietLog(tmp_path / "log.txt")
    device_run.run_lessons(lessons, tmp_path / "runs", "cpu", {}, jobs=2, budget_s=2.0, deadline_s=4.5, log=log)
    status = {lesson.name: lesson.status for lesson in lessons}
    assert status == {
        "01_a": "passed",
        "02_b": "passed",
        "01_a_deeper": "stopped: deadline",
        "02_b_deeper": "not run: budget",
    }
    started = {lesson.name: lesson.started_s for lesson in lessons if lesson.started_s is not None}
    assert max(started["01_a"], started["02_b"]) <= started["01_a_deeper"]
    assert log.elapsed() < 15  # the sleeper was killed, not waited for


def metrics(attention: str = "sdpa") -> dict:
    return {
        "device": {
            "device": "cuda",
            "gpu": "NVIDIA H100 80GB HBM3",
            "attention": attention,
            "precision": "bf16",
            "torch_threads": 4,
        },
        "eras": [
            {"era": "01-trl-0.14", "script": "then_01", "status": "skipped", "message": "skipped: not built", "x": 1}
        ],
        "numbers": {"loss": {"padded": 1.5, "series": [1, 2]}, "note": "x" * 200, "steps": 3},
    }


def passed(name: str, part: str, start: float) -> device_run.Lesson:
    lesson = device_run.Lesson(name, part, "passed", start, start + 10)
    lesson.result = {
        "status": "passed",
        "seconds": 10.0,
        "symptom_reproduced": True,
        "fix_verified": True,
        "gpu": {"peak_gpu_memory_mib": 900.0, "mean_gpu_utilisation_pct": 40.0},
    }
    lesson.metrics = metrics()
    return lesson


GPU = {"cuda": True, "gpu": "NVIDIA H100 80GB HBM3", "packages": {"torch": {"version": "2.11.0", "from": "machine"}}}


def test_a_gpu_run_where_every_lesson_passed_is_what_the_profile_note_reads(tmp_path):
    lessons = [passed("01_a", "core", 0), passed("01_a_deeper", "deep dive", 5)]
    settings = {"jobs": 2, "complete": True, "in_course": 2}
    own = device_run.ProcessMemory(peaks={"01_a": 512.0})
    record = device_run.build_record(lessons, GPU, "gpu", settings, own, {})
    assert record["all_passed"] is True and record["device"] == GPU["gpu"] and record["kind"] == "gpu run"
    first = record["lessons"][0]
    assert first["ran_beside"] == ["01_a_deeper"] and first["peak_gpu_memory_mib_own"] == 512.0
    assert first["eras"] == [
        {"era": "01-trl-0.14", "script": "then_01", "status": "skipped", "message": "skipped: not built"}
    ]
    assert first["key_numbers"] == {"loss.padded": 1.5, "steps": 3} and first["attention"] == "sdpa"
    assert "source build only" in record["attention"]["why"] and record["attention"]["lessons_ran"] == ["sdpa"]
    runs = tmp_path / GPU_RUNS
    runs.mkdir(parents=True)
    (runs / device_run.record_name(record)).write_text(json.dumps(record))
    assert gpu_profile_note(tmp_path).startswith(f"profile gpu: every lesson passed on {GPU['gpu']} on ")


@pytest.mark.parametrize(
    "change",
    ["cpu rehearsal", "a core failed", "a deep dive not run", "cores only", "a lesson on the cpu"],
)
def test_all_passed_only_for_a_whole_gpu_run(change):
    lessons = [passed("01_a", "core", 0), passed("01_a_deeper", "deep dive", 5)]
    settings = {"complete": True, "in_course": 2}
    profile, machine = "gpu", {}
    if change == "cpu rehearsal":
        profile, machine = "cpu", {"cuda": False}
    elif change == "a core failed":
        lessons[0].status = "failed checks"
    elif change == "a deep dive not run":
        lessons[1].status = "not run: budget"
    elif change == "a lesson on the cpu":
        lessons[1].metrics["device"]["device"] = "cpu"
    else:
        settings["complete"] = False
    record = device_run.build_record(lessons, machine, profile, settings, device_run.ProcessMemory(), {})
    assert record["all_passed"] is False
    assert record["cores_passed"] is (change != "a core failed")
    if change == "cpu rehearsal":
        assert record["kind"] == "cpu rehearsal (not a GPU run)" and "not a GPU run" in record["device"]
        assert device_run.record_name(record).endswith("-cpu-rehearsal.json")
    else:
        assert record["device"] == "NVIDIA H100 80GB HBM3"  # from the lessons' metrics, the facts being absent


def test_what_comes_back_fits_the_device_tool(tmp_path):
    runs = tmp_path / "runs"
    notebook = runs / "01_a" / "01_a" / "01_a.ipynb"
    notebook.parent.mkdir(parents=True)
    picture = {"output_type": "display_data", "data": {"image/png": "AAAA", "text/plain": "<Figure>"}, "metadata": {}}
    printed = {"output_type": "stream", "name": "stdout", "text": "loss 1.5\n"}
    notebook.write_text(json.dumps({"cells": [{"cell_type": "code", "outputs": [picture, printed]}]}))
    (notebook.parent / "metrics.json").write_text(json.dumps(metrics()))
    (runs / "01_a" / "summary.json").write_text("{}")
    (runs / "01_a" / "log.txt").write_text("01_a: passed\n")
    (notebook.parent / "figure.png").write_bytes(b"png")
    lesson = passed("01_a", "core", 0)
    record = device_run.build_record([lesson], GPU, "gpu", {"complete": False, "in_course": 14}, lesson_memory(), {})
    (tmp_path / "log.txt").write_text("log\n")
    written = device_run.write_out(tmp_path / "out", record, "nvidia-smi\n", runs, tmp_path / "log.txt")
    assert len(written) <= device_run.MAX_OUT_FILES
    assert all(path.parent == tmp_path / "out" and OUT_NAME.match(path.name) for path in written)
    assert json.loads(written[0].read_text())["device"] == GPU["gpu"]
    assert "| 01_a | core | passed | 10.0 |" in (tmp_path / "out" / "gpu-run.md").read_text()
    with tarfile.open(tmp_path / "out" / "lessons.tar.gz") as archive:
        names = archive.getnames()
        executed = json.load(archive.extractfile("01_a/01_a/01_a.ipynb"))
    assert set(names) == {"01_a/01_a/01_a.ipynb", "01_a/01_a/metrics.json", "01_a/summary.json", "01_a/log.txt"}
    assert executed["cells"][0]["outputs"] == [{**picture, "data": {"text/plain": "<Figure>"}}, printed]


def lesson_memory() -> device_run.ProcessMemory:
    return device_run.ProcessMemory(why="per-process GPU memory not sampled: ImportError: no pynvml")


def test_each_lessons_own_gpu_memory_is_its_process_trees(monkeypatch):
    import os
    import types

    nvml = types.ModuleType("pynvml")
    nvml.nvmlInit = lambda: None
    nvml.nvmlDeviceGetHandleByIndex = lambda index: index
    listed = [
        types.SimpleNamespace(pid=os.getpid(), usedGpuMemory=300 * 2**20),
        types.SimpleNamespace(pid=1, usedGpuMemory=None),
    ]
    nvml.nvmlDeviceGetComputeRunningProcesses = lambda handle: listed
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])  # a lesson NVML never lists
    memory = device_run.ProcessMemory().start()
    memory.sample({"01_a": os.getppid(), "02_b": other.pid})  # this test's process is in the tree of its parent
    listed[0].usedGpuMemory = 100 * 2**20
    memory.sample({"01_a": os.getppid(), "02_b": other.pid})
    other.kill()
    assert memory.why == "" and memory.peaks == {"01_a": 300.0}  # 02_b's processes were never listed: no peak
    assert memory.describe().startswith("sampled through NVML")
    elsewhere = device_run.ProcessMemory().start()
    listed[:] = [types.SimpleNamespace(pid=999_999_999, usedGpuMemory=2**20)]  # ids of another namespace
    elsewhere.sample({"01_a": os.getppid()})
    assert elsewhere.peaks == {} and "none of them in a lesson's process tree" in elsewhere.describe()
    monkeypatch.setitem(sys.modules, "pynvml", None)
    assert "not sampled: ModuleNotFoundError" in device_run.ProcessMemory().start().why
