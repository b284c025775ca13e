"""Ready for a workshop: `make lab` starts at once, as root too, with the eras building beside it (a room
of learners must not wait a minute for five side environments), and the facilitator's guide covers every
lesson with the run times measured for it (lesson.yaml)."""

from __future__ import annotations

import json
import os
import re
import secrets
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

from trl_clinic.course.launch import free_port
from trl_clinic.course.lessons import lessons

ROOT = Path(__file__).resolve().parents[1]
GUIDE = ROOT / "docs" / "workshop.md"
ERA = "04-transformers-4.51"  # built by `make test` (TEST_ERAS), so the era step is quick here


def serves(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status == 200
    except OSError:
        return False


def test_make_lab_serves_at_once_and_builds_the_eras_in_the_background(tmp_path):
    """As a facilitator types it (root in a workshop container): JupyterLab starts without waiting for the
    eras (as root it needs --allow-root, which `make lab` adds) and serves lesson 04 within 30 s (the target
    from a fresh clone to the first lesson), while the eras build in the background into .eras/build.log."""
    port, token = free_port(), secrets.token_hex(16)
    lab_args = (
        f"--no-browser --ServerApp.ip=127.0.0.1 --ServerApp.port={port} --ServerApp.port_retries=0 "
        f"--IdentityProvider.token={token} --LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"
    )
    log_path, build_log = tmp_path / "lab.log", ROOT / ".eras" / "build.log"
    build_log.unlink(missing_ok=True)
    env = {**os.environ, "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime")}
    started = time.monotonic()
    with log_path.open("w") as log:
        lab = subprocess.Popen(
            ["make", "lab", f"ERAS={ERA}", f"LAB_ARGS={lab_args}"],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    url = f"http://127.0.0.1:{port}/api/contents/04_qwen2_padding_side.ipynb?content=0&token={token}"
    try:
        deadline = started + 300  # a stale venv stamp reinstalls first
        while time.monotonic() < deadline and lab.poll() is None and not serves(url):
            time.sleep(0.5)
        served_after = time.monotonic() - started
        log = log_path.read_text()
        assert lab.poll() is None, f"make lab exited with {lab.returncode}:\n{log[-3000:]}"
        assert serves(url), f"JupyterLab did not serve lesson 04 within 300 s:\n{log[-3000:]}"
        # the eras build in the background: this one reports, or waits its turn behind another build of them
        # (make test builds every era in the background while its tests run)
        while time.monotonic() < deadline and not re.search(
            rf"era {ERA}:|waiting for another build", build_log.read_text() if build_log.exists() else ""
        ):
            time.sleep(0.5)
    finally:
        os.killpg(lab.pid, signal.SIGTERM)
        lab.wait(timeout=60)
    assert served_after < 30, f"JupyterLab served lesson 04 after {served_after:.0f} s"
    eras_step, lab_step = (
        log.find(f"trl_clinic.course.eras {ERA} > .eras/build.log 2>&1 &"),
        log.find("jupyter lab notebooks"),
    )
    assert 0 <= eras_step < lab_step, f"the eras are not started in the background:\n{log[:3000]}"
    assert re.search(rf"era {ERA}: up to date|waiting for another build", build_log.read_text())
    assert ("--allow-root" in log[lab_step:].splitlines()[0]) == (os.getuid() == 0)


def test_the_facilitators_guide_covers_every_lesson_with_its_measured_time():
    guide = GUIDE.read_text()
    for key, lesson in lessons().items():
        assert lesson.notebook in guide, f"docs/workshop.md does not cover {lesson.notebook}"
        section = guide[guide.index(f"### {key} ") :]
        section = section[: section.find("\n### ", 1) if "\n### " in section[1:] else len(section)]
        measured = lesson.seconds["cpu"]
        assert re.search(rf"\bcpu[^\n]*\b{measured} s\b", section), (
            f"lesson {key}: docs/workshop.md must give the measured cpu run time ({measured} s, lesson.yaml)"
        )
        for part in ("Objectives", "Prerequisites", "Reading time", "Discussion", "Where learners get stuck"):
            assert part in section, f"lesson {key}: docs/workshop.md has no {part!r}"
    for needed in ("trl-clinic doctor", "make lab", "report.html", "Half day", "Full day"):
        assert needed in guide, f"docs/workshop.md does not mention {needed!r}"


# --- the room kit: preflight, an offline wheelhouse, solutions kept back -------------------------------------


def make_in(folder: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """The repository's Makefile run in another folder (a learner's clone stand-in)."""
    return subprocess.run(
        ["make", "-s", "-f", str(ROOT / "Makefile"), *args],
        cwd=folder,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_preflight_says_each_part_in_one_line_and_fails_on_an_era_that_did_not_run(tmp_path):
    """The parts come from the lessons' own results: 04 passed but its era skipped is a failure of the era cell."""
    from trl_clinic.course import preflight
    from trl_clinic.course.workbook import LessonResult

    (tmp_path / "04_qwen2_padding_side").mkdir()
    metrics = {"eras": [{"era": "04-transformers-4.51", "status": "skipped", "message": "skipped: no network"}]}
    (tmp_path / "04_qwen2_padding_side" / "metrics.json").write_text(json.dumps(metrics))
    passed = LessonResult("04_qwen2_padding_side", "passed", 17.0, "04_qwen2_padding_side.ipynb")
    assert preflight.verdict("04", passed, tmp_path) == "era not run (04-transformers-4.51)"
    metrics["eras"][0]["status"] = "finished"
    (tmp_path / "04_qwen2_padding_side" / "metrics.json").write_text(json.dumps(metrics))
    assert preflight.verdict("04", passed, tmp_path) == "ok"
    crashed = LessonResult("05_grpo_sigfpe", "error", 3.0, "05_grpo_sigfpe.ipynb", error="RuntimeError: no child")
    assert preflight.verdict("05", crashed, tmp_path) == "error: RuntimeError: no child"
    makefile = (ROOT / "Makefile").read_text()
    recipe = re.search(r"^preflight:\n((?:\t.*\n)+)", makefile, re.M).group(1)
    assert "trl_clinic.course.eras &&" in recipe and "trl_clinic.course.preflight --started" in recipe


def test_preflight_says_what_it_runs_and_a_line_as_each_lesson_ends(tmp_path, monkeypatch, capsys):
    """A room waits minutes on make preflight: it names its lessons first, then prints each as it ends (the same
    line as trl-clinic run), then the line to paste."""
    from trl_clinic.course import preflight
    from trl_clinic.course.workbook import LessonResult

    def run_lessons(lessons, out, parameters, jobs, progress_bar, on_done):
        results = [LessonResult(path.stem, "error", 1.0, path.name, error="RuntimeError: stub") for path in lessons]
        for result in results:
            on_done(result)
        return results

    monkeypatch.setattr(preflight, "run_lessons", run_lessons)
    assert preflight.main(["--out", str(tmp_path), "--notebooks", str(ROOT / "notebooks")]) == 1
    lines = [line for line in capsys.readouterr().out.splitlines() if line]
    assert lines[0].startswith("preflight: lessons 04, 02b, 05 on the cpu profile, ")
    assert lines[0].endswith(" at once; a line as each ends")
    ended = [line for line in lines if ": error in 1 s" in line]
    assert sorted(ended) == [
        f"{name}: error in 1 s" for name in ("02b_gradient_accumulation_ddp", "04_qwen2_padding_side", "05_grpo_sigfpe")
    ]
    pasted = next(line for line in lines if line.startswith("TRL Clinic preflight: FAILED"))
    assert lines.index(ended[-1]) < lines.index(pasted)
    shown = (ROOT / "notebooks" / "solutions").is_dir()
    assert f"| solutions {'shown' if shown else 'hidden'} |" in pasted


def test_a_room_s_preflight_hides_the_solutions_unless_told_to_show_them():
    """make preflight hides the worked solutions in a git clone (the room works the exercises first) before its
    lessons run; ROOM_SOLUTIONS=shown keeps them."""
    recipe = re.search(r"^preflight:\n((?:\t.*\n)+)", (ROOT / "Makefile").read_text(), re.M).group(1)
    assert "hide-solutions" in recipe and '[ "$(ROOM_SOLUTIONS)" = shown ]' in recipe
    assert recipe.index("hide-solutions") < recipe.index("trl_clinic.course.preflight")
    assert re.search(r"^ROOM_SOLUTIONS \?= hidden$", (ROOT / "Makefile").read_text(), re.M)


def test_a_wheelhouse_sends_pip_and_uv_to_that_folder_with_the_network_off(tmp_path):
    shown = make_in(
        tmp_path,
        f"WHEELHOUSE={tmp_path / 'wheels'}",
        "--eval",
        "show: ; @echo $$PIP_NO_INDEX $$PIP_FIND_LINKS $$UV_OFFLINE $$UV_FIND_LINKS",
        "show",
    )
    wheels = tmp_path / "wheels"
    assert shown.stdout.split() == ["1", str(wheels), "1", str(wheels)], shown


def test_solutions_leave_the_learners_tree_and_come_back(tmp_path):
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    lesson = "src/trl_clinic/course/lessons/lesson_01_topic"
    for path in ("notebooks/01.ipynb", "notebooks/solutions/01.ipynb", f"{lesson}/core.py", f"{lesson}/solution.py"):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text("{}")
    for command in (["init", "-q"], ["add", "."], ["commit", "-q", "-m", "a course"]):
        subprocess.run([*git, *command], cwd=tmp_path, check=True)
    hidden = make_in(tmp_path, "hide-solutions")
    assert hidden.returncode == 0, hidden.stderr
    assert not (tmp_path / "notebooks" / "solutions").exists() and not (tmp_path / lesson / "solution.py").exists()
    assert (tmp_path / "notebooks" / "01.ipynb").exists() and (tmp_path / lesson / "core.py").exists()
    status = subprocess.run(["git", "status", "--porcelain"], cwd=tmp_path, capture_output=True, text=True)
    assert status.stdout == ""  # nothing deleted: the learner's clone stays clean
    assert make_in(tmp_path, "solutions").returncode == 0
    assert (tmp_path / "notebooks" / "solutions" / "01.ipynb").exists()


def agenda(title: str) -> list[tuple[int, str]]:
    """The (minute, what) rows of the agenda table that follows the bold title ``title`` in the guide."""
    guide = GUIDE.read_text()
    table = guide[guide.index(f"**{title}**") :].split("\n\n", 2)[1]
    rows = re.findall(r"^\| (\d+):(\d\d) \| (.+?) \|$", table, re.M)
    return [(int(hours) * 60 + int(minutes), what) for hours, minutes, what in rows]


def cores_in(what: str) -> list[str]:
    return [key for key, lesson in lessons().items() if lesson.is_core and re.match(rf"{key} ", what)]


def cores_with_an_era() -> set[str]:
    """The cores whose executed copy ran an era (its output names one: "era 01-trl-0.14 ...")."""
    from trl_clinic.course.eras import era_names

    found = set()
    for key, lesson in lessons().items():
        executed = ROOT / "docs" / "executed" / f"{lesson.notebook}.ipynb"
        if lesson.is_core and any(f"era {name}" in executed.read_text() for name in era_names()):
            found.add(key)
    return found


def test_the_3_hour_agendas_add_up_and_the_one_without_eras_runs_none():
    with_eras = agenda("Half day, 3 hours, with the eras")
    without = agenda("Half day, 3 hours, without the eras")
    assert cores_with_an_era() == {"01", "04", "08"}  # the guide's premise, read in the executed copies
    for rows in (with_eras, without):
        times = [minute for minute, _ in rows]
        assert times[0] == 0 and times[-1] == 180 and times == sorted(set(times)), rows
        assert rows[-1][1] == "end"
        for (start, what), (end, _) in zip(rows, rows[1:]):
            for key in cores_in(what):
                assert lessons()[key].seconds["cpu"] <= 60 and end - start >= 20, (key, start, end)
    run_without = {key for _, what in without if "executed copy" not in what for key in cores_in(what)}
    assert run_without and not run_without & cores_with_an_era(), run_without
    shown = {key for _, what in without if "executed copy" in what for key in cores_in(what)}
    assert shown == {"01", "04"}
    assert {"01", "04"} <= {key for _, what in with_eras for key in cores_in(what)}


def test_the_wheelhouse_downloads_an_eras_older_release_beside_the_course_s():
    """pip refuses two versions of one package in one call: the pins go in batches that never repeat a name."""
    from trl_clinic.course.wheelhouse import batches

    pins = ["accelerate==1.15.0", "accelerate==1.0.1", "trl==1.16.0", "accelerate==0.30.1", "trl==0.14.0"]
    assert batches(pins) == [
        ["accelerate==1.15.0", "trl==1.16.0"],
        ["accelerate==1.0.1", "trl==0.14.0"],
        ["accelerate==0.30.1"],
    ]
