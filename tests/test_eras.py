"""Eras: the requirements files, the build's stamp, the runner's skip path, and the 02 and 04 era scripts run for
real on the old libraries: 02's on its own small spec, 04's in every scenario it knows (the lessons run some).

The era runs of lessons 01 and 05 are checked in the workbook tests, on the results the lessons wrote
(`era_result`; tests/test_notebooks.py, tests/test_deep_dives.py): running the same scripts with the same specs
again here cost about 35 CPU-seconds of make test. The real runs need `make eras`. Under `make test` (which
builds the eras they need and sets TRL_CLINIC_REQUIRE_ERAS) a missing era fails; a plain `pytest` without eras
skips them with "run `make eras`".
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import re
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from trl_clinic.course import eras
from trl_clinic.course.eras import build as eras_build
from trl_clinic.course.lessons import lessons
from trl_clinic.course.paths import repo_root

ROOT = Path(__file__).resolve().parents[1]
REQUIRE_ENV = "TRL_CLINIC_REQUIRE_ERAS"
LIBRARIES = ("transformers", "trl", "peft", "accelerate")


def need_era(name: str) -> Path:
    """The era's interpreter; a skip (plain pytest) or a failure (`make test`) when it is not built.

    Under `make test` only the eras it builds (TEST_ERAS) run, which keeps the eras' cost of
    `make test` under a minute; the others run with a plain `pytest tests/test_eras.py`.
    """
    required = os.environ.get(REQUIRE_ENV)
    if required is not None and name not in required.split():
        pytest.skip(f"era {name} is not one of make test's eras: run `pytest tests/test_eras.py` after `make eras`")
    python = eras.era_python(name)
    if python is None and eras.wait_for_builds(repo_root(), timeout=1200):  # make test builds in the background
        python = eras.era_python(name)
    if python is None:
        why = eras.era_state(name)[1]
        if required is not None:
            pytest.fail(f"{why}: `make test` should have built it (in the background, TEST_ERAS)")
        pytest.skip(why)
    return python


def era_result(folder: Path, script: str, era: str) -> dict:
    """What ``script`` wrote when a lesson ran it in ``era`` (``run_in_era`` into ``folder`` of the lesson's
    output): the workbook tests check the era runs the lessons made instead of running the scripts again."""
    need_era(era)
    path = folder / f"{script}.{era}.result.json"
    assert path.is_file(), f"the lesson wrote no {path.name} in {folder}: see its executed notebook there"
    return json.loads(path.read_text())


def attention_across(result: dict, case: str) -> int:
    """Lesson 01's era script's attention pattern for ``case``: how many allowed (query, key) entries of the packed row
    join two different sequences (0 when the mask is block-diagonal)."""
    owner = [i for i, n in enumerate(result["mask_lengths"]) for _ in range(n)]
    pattern = result["attention_pattern"][case]
    return sum(a for q, row in enumerate(pattern) for k, a in enumerate(row) if owner[q] != owner[k])


# --- the era files ----------------------------------------------------------------------------------

ERA_FILES = sorted(eras.requirements_files().values())


def test_the_issue_s_eras_are_defined():
    assert {
        "02-transformers-4.45",
        "04-transformers-4.51",
        "04-transformers-4.40",
        "01-trl-0.14",
        "01-transformers-4.55",
    } <= {path.stem for path in ERA_FILES}


@pytest.mark.parametrize("path", ERA_FILES, ids=[path.stem for path in ERA_FILES])
def test_an_era_pins_torch_and_the_four_libraries_and_says_who_uses_it(path):
    lines = path.read_text().splitlines()
    pins = dict(
        re.match(r"^([A-Za-z0-9_.-]+)==(\S+)$", line).groups()
        for line in lines
        if "==" in line and not line.startswith("#")
    )
    assert pins.get("torch") == "2.13.0"
    assert set(LIBRARIES) <= set(pins), f"{path.name} must pin {', '.join(LIBRARIES)}"
    header = " ".join(line for line in lines if line.startswith("#"))
    # a lesson's era names its lesson and era script (then.py); an era of the check-up alone names its test's script
    used = (re.search(r"[Ll]esson", header) and "then.py" in header) or "checkup_eras/run.py" in header
    assert used, f"{path.name}: say which lesson and script use it"


def test_make_test_requires_the_eras_its_tests_run():
    makefile = (ROOT / "Makefile").read_text()
    shown = subprocess.run(
        ["make", "-s", "--eval", "show-test-eras: ; @echo $(TEST_ERAS)", "show-test-eras"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    assert shown.stdout.split() == eras.era_names(), "make test builds every era the lessons' folders pin (TEST_ERAS)"
    recipe = re.search(r"^test: .*\n((?:\t.*\n)+)", makefile, re.M).group(1)
    assert re.search(r"trl_clinic\.course\.eras --background .*\$\(TEST_ERAS\)", recipe), "make test builds TEST_ERAS"
    assert ".eras/" in (ROOT / ".gitignore").read_text()


def test_the_eras_module_imports_without_torch():
    code = (
        "import sys, trl_clinic.course.eras, trl_clinic.course.handshake; "
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_era_scripts_ship_with_the_package_and_never_import_the_course():
    """An era holds its own torch, transformers and TRL, not the course's dependencies: an era script imports nothing
    of the course. It may run the library on the era's trainer (lesson 08's ``then.py`` puts the package's folder on
    ``sys.path`` and imports ``trl_clinic.checkup``, as tests/checkup_eras/run.py does with the wheel installed)."""
    from setuptools import find_packages

    packages = find_packages(ROOT / "src")
    scripts = sorted(Path(lessons()["01"].folder).parent.glob("lesson_*/then.py"))
    assert {"lesson_02_accumulation", "lesson_04_padding_side"} <= {path.parent.name for path in scripts}
    assert all(f"trl_clinic.course.lessons.{path.parent.name}" in packages for path in scripts)
    for path in scripts:
        source = path.read_text()
        assert not re.search(r"^\s*(from|import) trl_clinic\.course", source, re.M), f"{path.name} imports the course"
        imported = re.findall(r"^\s*(?:from|import) (trl_clinic[\w.]*)", source, re.M)
        assert set(imported) <= {"trl_clinic"}, f"{path.name} imports {imported}: only `from trl_clinic import checkup`"
        assert "transformers" in source.split('"""')[1], f"{path.name}: its docstring names the versions"


# --- building: the stamp --------------------------------------------------------------------------

FAKE_UV = textwrap.dedent('''\
    #!{python}
    """A stand-in for uv: `venv ... DIR` makes DIR/bin/python (today's interpreter); `pip install`
    fails when the requirements file says FAIL, in colour unless NO_COLOR is set, as uv. Every call is logged."""
    import os, sys
    from pathlib import Path
    args = sys.argv[1:]
    with open(os.environ["FAKE_UV_LOG"], "a") as log:
        log.write(" ".join(args) + "\\n")
    if args[0] == "venv":
        python = Path(args[-1]) / "bin" / "python"
        python.parent.mkdir(parents=True)
        python.write_text("#!/bin/sh\\nexec {python} \\"$@\\"\\n")
        python.chmod(0o755)
    elif args[:2] == ["pip", "install"]:
        requirements = Path(args[args.index("-r") + 1]).read_text()
        if "FAIL" in requirements:
            print("error: no such release" if os.environ.get("NO_COLOR") else "\\x1b[31merror\\x1b[0m", file=sys.stderr)
            sys.exit(1)
    ''')


@pytest.fixture
def fake_root(tmp_path, monkeypatch):
    """A repository with one era file and a fake uv: builds take milliseconds and touch no registry."""
    (tmp_path / "eras").mkdir()
    (tmp_path / "eras" / "99-test.txt").write_text("# test era\ntorch==2.13.0\n")
    uv = tmp_path / "fake-uv"
    uv.write_text(FAKE_UV.format(python=sys.executable))
    uv.chmod(uv.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("FAKE_UV_LOG", str(tmp_path / "uv.log"))
    monkeypatch.setattr(eras_build, "PROBE_IMPORTS", ("json",))  # the probe runs, without importing torch
    return tmp_path


def build(root: Path) -> bool:
    return eras.build_era("99-test", root, installer=[str(root / "fake-uv")], torch_links=None)


def installs(root: Path) -> int:
    log = root / "uv.log"
    return sum(line.startswith("pip install") for line in log.read_text().splitlines()) if log.exists() else 0


def test_a_build_writes_a_stamp_keyed_on_the_requirements_and_is_reused(fake_root):
    assert eras.era_python("99-test", fake_root) is None
    assert build(fake_root) is True
    stamp = eras.read_stamp("99-test", fake_root)
    assert stamp["requirements_sha256"] == eras.requirements_digest(fake_root / "eras" / "99-test.txt")
    assert "torch" in stamp["versions"]
    assert eras.era_python("99-test", fake_root) == fake_root / ".eras" / "99-test" / "bin" / "python"
    assert build(fake_root) is False and installs(fake_root) == 1  # reused, not installed again


def test_a_changed_requirements_file_makes_the_era_stale_and_rebuilds_it(fake_root):
    build(fake_root)
    (fake_root / "eras" / "99-test.txt").write_text("# test era\ntorch==2.13.0\nrich\n")
    ready, why = eras.era_state("99-test", fake_root)
    assert not ready and "older" in why and "run `make eras`" in why
    assert build(fake_root) is True and installs(fake_root) == 2
    assert eras.era_python("99-test", fake_root) is not None


def test_a_failed_install_leaves_no_stamp(fake_root):
    build(fake_root)
    (fake_root / "eras" / "99-test.txt").write_text("# test era\nFAIL\n")
    with pytest.raises(eras.EraBuildError, match="uv pip install failed"):
        build(fake_root)
    assert not (fake_root / ".eras" / "99-test" / eras.STAMP).exists()
    assert eras.era_python("99-test", fake_root) is None


def test_an_era_whose_libraries_do_not_import_gets_no_stamp(fake_root, monkeypatch):
    monkeypatch.setattr(eras_build, "PROBE_IMPORTS", ("json", "no_such_module_anywhere"))
    with pytest.raises(eras.EraBuildError, match="do not import"):
        build(fake_root)
    assert eras.read_stamp("99-test", fake_root) is None


def test_an_unknown_era_is_a_clear_error(fake_root):
    with pytest.raises(eras.EraBuildError, match="no nope.txt in .*eras"):
        eras.build_era("nope", fake_root)
    assert "not defined" in eras.era_state("nope", fake_root)[1]


def test_the_local_torch_wheel_is_found_when_pip_has_one():
    folder = eras.local_torch_links("2.13.0")
    if folder is None:
        pytest.skip("pip takes torch 2.13.0 from a registry here: uv fetches it itself")
    assert any(folder.glob("torch-2.13.0*.whl"))


def test_the_local_torch_wheel_is_found_inside_a_jupyter_kernel_too(monkeypatch):
    """ipykernel sets FORCE_COLOR=1, CLICOLOR_FORCE=1 and TERM=xterm-color (read in a kernel's environment), and pip
    then colours the JSON it prints: an era built on a lesson's first use found no local torch and took PyPI's."""
    if eras.local_torch_links("2.13.0") is None:
        pytest.skip("pip takes torch 2.13.0 from a registry here: uv fetches it itself")
    for name, value in {"FORCE_COLOR": "1", "CLICOLOR_FORCE": "1", "CLICOLOR": "1", "TERM": "xterm-color"}.items():
        monkeypatch.setenv(name, value)
    assert eras.local_torch_links("2.13.0") is not None


# --- running: the skip path and the runner --------------------------------------------------------


def test_a_missing_era_is_skipped_with_the_make_command_and_never_raises(fake_root, tmp_path):
    run = eras.run_in_era("99-test", "then_02", {}, tmp_path / "work", root=fake_root)
    assert run.status == "skipped" and run.skipped and not run.finished
    assert run.message == "skipped: era 99-test is not installed, run `make eras`"
    assert run.result is None and run.to_metrics()["status"] == "skipped"
    unknown = eras.run_in_era("no-such-era", "then_02", {}, tmp_path / "work", root=fake_root)
    assert unknown.skipped and "not defined" in unknown.message


@pytest.fixture
def wheel_install(tmp_path, monkeypatch):
    """The course as a wheel install sees it: no checkout, the era files in the package (here one fake era),
    the cache folder as the root, and a fake uv on the path a lesson's first use takes."""
    from trl_clinic.course import paths
    from trl_clinic.course.eras import spec

    packaged = tmp_path / "package"
    (packaged / "lesson_99_test" / "eras").mkdir(parents=True)
    (packaged / "lesson_99_test" / "eras" / "99-test.txt").write_text("# test era\ntorch==2.13.0\n")
    uv = tmp_path / "fake-uv"
    uv.write_text(FAKE_UV.format(python=sys.executable))
    uv.chmod(uv.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setattr(paths, "checkout", lambda: None)
    monkeypatch.setattr(spec, "LESSONS", packaged)
    monkeypatch.setattr(eras_build, "uv_command", lambda: [str(uv)])
    monkeypatch.setattr(eras_build, "local_torch_links", lambda version: None)
    monkeypatch.setattr(eras_build, "PROBE_IMPORTS", ("json",))
    monkeypatch.delenv("TRL_CLINIC_ROOT", raising=False)
    monkeypatch.setenv("TRL_CLINIC_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("FAKE_UV_LOG", str(tmp_path / "uv.log"))
    return tmp_path


def test_outside_a_checkout_an_era_builds_in_the_cache_on_first_use(wheel_install, capsys):
    assert eras.builds_on_demand() and "it builds on a lesson's first use" in eras.era_state("99-test")[1]
    script = write_script(
        wheel_install,
        """\
        import json, sys
        json.dump({"ran": True}, open(sys.argv[2], "w"))
        """,
    )
    run = eras.run_in_era("99-test", script, {}, wheel_install / "work")
    assert run.finished and run.result == {"ran": True}, run.message
    assert eras.era_python("99-test") == wheel_install / "cache" / ".eras" / "99-test" / "bin" / "python"
    assert "not built yet; building it in" in capsys.readouterr().out
    assert eras.run_in_era("99-test", script, {}, wheel_install / "work").finished  # built once, reused


def test_outside_a_checkout_an_era_that_cannot_be_built_is_skipped_with_what_the_build_said(wheel_install, monkeypatch):
    """No PyPI (here: an install that fails) and no `make eras` to point at: the message says what failed, in plain
    text even inside a Jupyter kernel (ipykernel sets FORCE_COLOR=1, and uv then colours its errors)."""
    monkeypatch.setenv("FORCE_COLOR", "1")
    (wheel_install / "package" / "lesson_99_test" / "eras" / "99-test.txt").write_text("# test era\nFAIL\n")
    run = eras.run_in_era("99-test", "then_02", {}, wheel_install / "work")
    assert run.skipped and run.message.startswith("skipped: era 99-test could not be built here: uv pip install failed")
    assert run.message.endswith("error: no such release") and "\x1b" not in run.message
    assert "make eras" not in run.message and eras.era_python("99-test") is None


def write_script(folder: Path, body: str) -> Path:
    script = folder / "then_99_probe.py"
    script.write_text(textwrap.dedent(body))
    return script


def test_a_built_era_runs_a_script_and_returns_its_json(fake_root, tmp_path):
    build(fake_root)
    script = write_script(
        tmp_path,
        """\
        import json, os, sys
        spec = json.load(open(sys.argv[1]))
        json.dump({"twice": 2 * spec["x"], "offline": os.environ["HF_HUB_OFFLINE"],
                   "gpus": os.environ["CUDA_VISIBLE_DEVICES"]}, open(sys.argv[2], "w"))
        """,
    )
    run = eras.run_in_era("99-test", script, {"x": 21}, tmp_path / "work", root=fake_root)
    assert run.finished, run.message
    assert run.result == {"twice": 42, "offline": "1", "gpus": ""}
    assert run.versions == eras.era_versions("99-test", fake_root)
    assert json.loads(json.dumps(run.to_metrics()))["kind"] == "measured"


BACKGROUND_BUILD = textwrap.dedent("""\
    import sys, time
    from pathlib import Path
    from trl_clinic.course.eras import build
    root = Path(sys.argv[1])
    build.PROBE_IMPORTS = ("json",)
    with build._build_lock(root):  # as `python -m trl_clinic.course.eras` holds it across its builds
        print("locked", flush=True)
        time.sleep(2)
        build.build_era("99-test", root, installer=[str(root / "fake-uv")], torch_links=None)
    """)


def test_a_lesson_waits_for_an_era_that_make_lab_is_building_in_the_background(fake_root, tmp_path, capsys):
    script = write_script(tmp_path, "import json, sys\njson.dump({'ran': True}, open(sys.argv[2], 'w'))\n")
    builder = subprocess.Popen(
        [sys.executable, "-c", BACKGROUND_BUILD, str(fake_root)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "FAKE_UV_LOG": str(fake_root / "uv.log")},
    )
    assert builder.stdout.readline().strip() == "locked"
    run = eras.run_in_era("99-test", script, {}, tmp_path / "work", root=fake_root)
    assert builder.wait(timeout=60) == 0
    assert run.finished and run.result == {"ran": True}, run.message
    assert "waiting for the eras being built in the background" in capsys.readouterr().out
    assert eras.wait_for_builds(fake_root, timeout=1) is False  # none running now: no wait


def test_a_failing_script_is_reported_as_failed_not_raised(fake_root, tmp_path):
    build(fake_root)
    crash = write_script(tmp_path, "raise RuntimeError('old code broke')\n")
    run = eras.run_in_era("99-test", crash, {}, tmp_path / "work", root=fake_root)
    assert run.status == "failed" and "RuntimeError: old code broke" in run.message
    silent = write_script(tmp_path, "pass\n")
    run = eras.run_in_era("99-test", silent, {}, tmp_path / "work", root=fake_root)
    assert run.status == "failed" and "wrote no" in run.message
    missing = eras.run_in_era("99-test", "then_no_such_script", {}, tmp_path / "work", root=fake_root)
    assert missing.status == "failed" and "no era script" in missing.message


def test_a_script_s_time_limit_is_a_failure(fake_root, tmp_path):
    build(fake_root)
    slow = write_script(tmp_path, "import time\ntime.sleep(30)\n")
    run = eras.run_in_era("99-test", slow, {}, tmp_path / "work", root=fake_root, timeout=1)
    assert run.status == "failed" and "timeout" in run.message


# --- the real old code ----------------------------------------------------------------------------


@pytest.mark.era
def test_02_accumulation_on_transformers_4_45_and_today_s_recreation_agree(tmp_path):
    need_era("02-transformers-4.45")
    from trl_clinic.course import handshake

    spec = handshake.accumulation_spec(tmp_path)
    run = eras.run_in_era("02-transformers-4.45", "then_02", spec, tmp_path)
    assert run.finished, f"{run.message}\n{run.stderr}"
    result = run.result
    assert result["era_versions"]["transformers"] == "4.45.2" and result["era_versions"]["trl"] == "0.11.4"
    assert result["training_step_knows_num_items_in_batch"] is False
    assert len(set(result["label_counts"])) > 1
    for kind in ("trainer", "sft_trainer"):
        numbers = result["paths"][kind]
        assert numbers["vs_mean_of_means"] < 1e-6  # exactly the mean of per-micro-batch means
        assert numbers["vs_full_batch"] > 0.3 and numbers["cosine_full_batch"] < 0.95  # not the big batch

    era = handshake.load_era_gradients(result["gradients_file"])
    recreated = handshake.today_gradient(spec, tmp_path, recreate_old=True)
    assert handshake.compare_gradients(recreated, era["trainer"])["relative_error"] < 1e-6
    today = handshake.today_gradient(spec, tmp_path, recreate_old=False)
    assert handshake.compare_gradients(today, era["full_batch"])["relative_error"] < 1e-6


def then_04(era: str, versions: tuple[str, str], tmp_path: Path) -> dict:
    """Lesson 04's era script's result in one of its eras, after checking the era's versions."""
    need_era(era)
    run = eras.run_in_era(era, "then_04", {}, tmp_path)
    assert run.finished, f"{run.message}\n{run.stderr}"
    assert (run.result["era_versions"]["transformers"], run.result["era_versions"]["trl"]) == versions
    return run.result


def assert_padding_error(outcome: dict, era: str, function: str) -> None:
    """The real padding_side='right' ValueError, raised by the era's own modeling_qwen2.py in ``function``."""
    assert outcome["error_type"] == "ValueError"
    assert outcome["message"].startswith("You are attempting to perform batched generation with padding_side='right'")
    assert Path(outcome["file"]).name == "modeling_qwen2.py" and outcome["function"] == function
    assert f".eras/{era}" in outcome["file"]  # the era's own transformers raised it


@pytest.mark.era
def test_04_dpo_evaluate_raises_the_real_qwen2_padding_error_on_transformers_4_51(tmp_path):
    result = then_04("04-transformers-4.51", ("4.51.3", "0.17.0"), tmp_path)
    scenarios = result["scenarios"]
    assert result["guard_function"] == "Qwen2Model._update_causal_mask"
    assert_padding_error(scenarios["as_reported"], "04-transformers-4.51", "_update_causal_mask")
    assert scenarios["tokenizer_left"]["verdict"] == "guard"  # DPO re-pads right: the advice alone fails
    # training and evaluation run the same forward: DPOConfig's defaults raise at the first training step, and
    # only gradient checkpointing in training (modeling_qwen2.py 494-498) gets training past the check
    assert scenarios["train_defaults"]["verdict"] == "guard" and scenarios["train_defaults"]["in_training_step"]
    checkpointing = scenarios["train_checkpointing"]
    assert checkpointing["verdict"] == "missing_flash_kernel" and checkpointing["in_training_step"]
    assert checkpointing["then_evaluate"]["verdict"] == "guard" and checkpointing["checkpointing_on"]
    fixes = ("as_reported_no_cache", "train_defaults_no_cache", "tokenizer_left_no_cache", "path_model_init_kwargs")
    for fix in (*fixes, "explicit_ref_path_fixed", "padding_free"):
        assert scenarios[fix]["verdict"] == "missing_flash_kernel", scenarios[fix]["error"]  # past the check
    assert scenarios["train_checkpointing_no_cache"]["then_evaluate"]["verdict"] == "missing_flash_kernel"
    path = scenarios["path_defaults"]  # a model path without model_init_kwargs: both models keep the cache
    assert path["verdict"] == path["reference_forward"]["verdict"] == "guard"
    assert scenarios["path_model_init_kwargs"]["reference_forward"]["verdict"] == "missing_flash_kernel"
    assert scenarios["explicit_ref_path"]["reference_forward"]["verdict"] == "guard"  # ref_model_init_kwargs missing
    assert scenarios["explicit_ref_path_fixed"]["reference_forward"]["verdict"] == "missing_flash_kernel"
    forward = result["direct_forward"]
    assert forward["right"]["verdict"] == "guard"
    assert forward["left"]["verdict"] == forward["right_no_cache"]["verdict"] == "missing_flash_kernel"
    # nothing re-created: trl 0.17.0's evaluate() on a plain eager Qwen2 builds a cache for every right-padded row
    audit = scenarios["cache_audit"]
    assert audit["verdict"] == "finished"
    for model in ("policy", "reference"):
        counts = audit["counts"][model]
        assert counts["right_padded"] > 0 and counts["right_padded_with_cache"] == counts["right_padded"]
        assert audit["asked"][model] == {"use_cache=not passed": counts["forwards"]}


@pytest.mark.era
def test_04_a_right_padded_forward_with_the_cache_raises_the_same_error_on_transformers_4_40(tmp_path):
    result = then_04("04-transformers-4.40", ("4.40.2", "0.8.6"), tmp_path)
    assert result["guard_function"] == "Qwen2Model.forward" and not result["flash_attn_installed"]
    assert_padding_error(result["direct_forward"]["right"], "04-transformers-4.40", "forward")
    for passes in ("right_no_cache", "left"):  # the check is keyed on use_cache and on right padding
        assert result["direct_forward"][passes]["verdict"] == "missing_flash_kernel"
    dpo = result["scenarios"]["as_reported"]  # trl 0.8.6's concatenated_forward passes use_cache=False
    assert dpo["verdict"] == "missing_flash_kernel", dpo["error"]
    no_dpo_config = {"as_reported", "as_reported_no_cache", "tokenizer_left", "tokenizer_left_no_cache"}
    assert set(result["scenarios"]) == no_dpo_config  # trl 0.8.6 has no DPOConfig


def test_04_an_unexpected_error_is_never_counted_as_past_the_check():
    """Only the guard's ValueError, the missing flash kernel's NameError or no error at all are recognised;
    anything else (a NameError of another name, a TypeError) is ``other``, never a run that got past the guard."""
    spec = importlib.util.spec_from_file_location("then_04", eras.then_script("then_04"))
    then = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(then)

    def raising(error):
        def call():
            raise error

        return call

    assert then.outcome(raising(ValueError(then.GUARD + " ...")))["verdict"] == "guard"
    assert then.outcome(lambda: {"eval_loss": 0.5})["verdict"] == "finished"
    for error in (NameError("name 'trainer' is not defined", name="trainer"), TypeError("bad argument")):
        found = then.outcome(raising(error))
        assert found["verdict"] == "other" and not found["passed_guard"]
    missing = then.outcome(
        raising(NameError("name '_flash_supports_window_size' is not defined", name="_flash_supports_window_size"))
    )
    assert missing["verdict"] == ("other" if then.FLASH_ATTN_INSTALLED else "missing_flash_kernel")


def reported_in(source: Path) -> dict:
    """The report's GRPOConfig arguments exactly as a lesson 05 notebook quotes them (its ``reported = dict(...)``)."""
    tree = ast.parse(source.read_text())
    call = next(
        node.value
        for node in tree.body
        if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["reported"]
    )
    return {keyword.arg: ast.literal_eval(keyword.value) for keyword in call.keywords}


def lesson_05_reported() -> dict:
    return reported_in(lessons()["05"].source)


def test_05_the_deep_dive_quotes_the_same_config_as_the_core():
    """The era runs the core's ``reported``; the deep dive walks its own copy through today's TRL: the same."""
    assert reported_in(lessons()["05-deeper"].source) == lesson_05_reported()


BACKGROUND_MAIN = textwrap.dedent("""\
    import sys, time
    from pathlib import Path
    from trl_clinic.course.eras import build
    from trl_clinic.course.paths import repo_root
    root, log = Path(sys.argv[1]), sys.argv[2]
    build.PROBE_IMPORTS = ("json",)
    build_era = build.build_era
    def slow_build(name, root=None, *, force=False, **_):
        time.sleep(4)
        return build_era(name, root, installer=[str(root or repo_root()) + "/fake-uv"], torch_links=None, force=force)
    build.build_era = slow_build
    sys.exit(build.main(["--background", "--log", log, "99-test"]))
    """)


def test_make_test_builds_the_eras_in_the_background_and_tests_wait_for_them(fake_root, tmp_path):
    """`make test` starts the eras' build and its tests at once: the command returns with the build lock already
    taken, so a test that needs an era waits for it instead of finding it missing."""
    log = tmp_path / "build.log"
    env = {**os.environ, "TRL_CLINIC_ROOT": str(fake_root), "FAKE_UV_LOG": str(fake_root / "uv.log")}
    done = subprocess.run(
        [sys.executable, "-c", BACKGROUND_MAIN, str(fake_root), str(log)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0 and "in the background" in done.stdout, done.stderr
    assert eras.era_python("99-test", fake_root) is None  # returned at once: the build sleeps 4 s before it starts
    assert eras.wait_for_builds(fake_root, timeout=120) is True
    assert eras.era_python("99-test", fake_root) is not None, log.read_text()
    assert "era 99-test: built" in log.read_text()


def test_every_re_creation_inside_an_era_is_named_in_stand_ins_and_labelled_where_it_lives():
    """A re-creation an era script needs lives in the script (it cannot import this package); stand_ins.IN_ERAS
    names it with what it stands for, and the function says RE-CREATED itself."""
    from trl_clinic.course.stand_ins import IN_ERAS

    for name, sentence in IN_ERAS.items():
        script, function = name.split(".")
        spec = importlib.util.spec_from_file_location(script, eras.then_script(script))
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        assert sentence.startswith("RE-CREATED") and "RE-CREATED" in getattr(module, function).__doc__
