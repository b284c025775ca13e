"""The check-up installed as a user installs it, where the bugs lived.

The wheel is built once from this checkout. For each era (``.eras/<name>``, built by ``make eras`` from
``eras/<name>.txt`` in a lesson's folder) a copy of the era's environment is made with hard links
(``cp -al``: seconds, no space), the wheel is installed into the copy the way a user installs it, resolving its
dependencies against what is there (uv, and pip for one era), and the copy's torch, transformers, TRL, peft,
accelerate and datasets must keep their versions. A copy, not the era itself: the era stays exactly what its
requirements file built (the lessons' ``then_*`` scripts run there, ``trl_clinic.course.eras`` keys it on that file),
and a test that installs into it while a lesson runs there would race with it; installing writes new files
and unlinks old ones, so the hard-linked originals are never changed (the test checks the era after).

Then ``tests/checkup_eras/run.py`` (standalone: the library only) runs ``checkup(trainer)`` in the copy on
the era's own trainers, one process per era: the era's bug fails by measurement, its healthy setting has
no fail. Under ``make test`` (``TRL_CLINIC_REQUIRE_ERAS``) a missing era fails; a plain pytest skips it.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_eras import need_era

from trl_clinic.course import eras

ROOT = Path(__file__).resolve().parents[1]
RUN = ROOT / "tests" / "checkup_eras" / "run.py"
STACK = ("torch", "transformers", "trl", "peft", "accelerate", "datasets", "tokenizers", "numpy")
VERSIONS = (
    "import importlib.metadata as m, json, sys\n"
    "found = {}\n"
    "for name in sys.argv[1:]:\n"
    "    try:\n"
    "        found[name] = m.version(name)\n"
    "    except m.PackageNotFoundError:\n"
    "        found[name] = None\n"
    "print(json.dumps(found))\n"
)
CHILD_ENV = {**eras.CHILD_ENV, "OMP_NUM_THREADS": "1"}  # an era's child, as the lessons start one, on one thread
SECONDS: dict[str, float] = {}  # per era: copy + install + check-up, printed at the end of the session


def versions(python: Path, names=STACK) -> dict[str, str | None]:
    done = subprocess.run(
        [str(python), "-c", VERSIONS, *names],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, **CHILD_ENV},
    )
    return json.loads(done.stdout)


@pytest.fixture(scope="session")
def wheel(tmp_path_factory) -> Path:
    """The package's wheel, built once from a copy of this checkout's sources (the build leaves no files here)."""
    source = tmp_path_factory.mktemp("source")
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, source / name)
    shutil.copytree(ROOT / "src", source / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(out),
            str(source),
        ],
        check=True,
    )
    (built,) = out.glob("trl_clinic-*.whl")
    return built


def install(era: str, wheel: Path, folder: Path, installer: str) -> dict:
    """A hard-linked copy of the era with the wheel installed into it; the stack's versions before and after."""
    need_era(era)
    original = eras.era_dir(era)
    stamp = (original / eras.STAMP).read_text()
    copy = folder / era
    subprocess.run(["cp", "-al", str(original), str(copy)], check=True)
    python = copy / "bin" / "python"
    before = versions(python)
    if installer == "uv":
        command = [
            str(Path(sys.executable).with_name("uv")),
            "pip",
            "install",
            "--quiet",
            "--python",
            str(python),
            str(wheel),
        ]
    else:  # pip of this venv, installing into the copy (pip >= 22.3's --python)
        command = [sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet", str(wheel)]
    subprocess.run(command, check=True, env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"})
    after = versions(python, (*STACK, "trl-clinic"))
    assert (original / eras.STAMP).read_text() == stamp and eras.era_state(era) == (True, "ready")
    assert versions(original / "bin" / "python", ("trl-clinic",)) == {"trl-clinic": None}  # the era itself: untouched
    return {"python": python, "before": before, "after": after}


def checkup_in(era: str, wheel: Path, tmp_path: Path, installer: str = "uv", scenarios: str | None = None) -> dict:
    """The check-up's reports on ``scenarios`` (a set of run.py's SCENARIOS; the era's own by default), run in a
    copy of ``era`` with the wheel installed."""
    start = time.perf_counter()
    env = install(era, wheel, tmp_path, installer)
    assert {k: env["after"][k] for k in STACK} == env["before"], f"installing the wheel changed {era}'s stack"
    assert env["after"]["trl-clinic"] is not None
    result = tmp_path / "result.json"
    done = subprocess.run(
        [str(env["python"]), str(RUN), scenarios or era, str(result)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={"PATH": os.environ["PATH"], "HOME": str(tmp_path), **CHILD_ENV},
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    outcome = json.loads(result.read_text())
    SECONDS[scenarios or era] = round(time.perf_counter() - start, 1)
    assert outcome["course_modules"] == []  # the library alone: the course was never imported
    assert outcome["versions"]["trl-clinic"] == env["after"]["trl-clinic"]
    for name, report in outcome["reports"].items():  # the table printed in the era names every finding's status
        printed = report["printed"]
        assert "trl-clinic checkup:" in printed, name
        for status in {f["status"] for f in report["findings"]}:
            assert status in printed, (name, status, printed)
    return outcome


def findings(outcome: dict, scenario: str) -> dict[str, dict]:
    """probe -> its (last) finding in one scenario's report."""
    return {f["probe"]: f for f in outcome["reports"][scenario]["findings"]}


def no_fail(outcome: dict, scenario: str) -> None:
    report = outcome["reports"][scenario]
    assert not report["failed"] and report["errors"] == 0, report["findings"]


@pytest.fixture(scope="session", autouse=True)
def report_seconds():
    yield
    if SECONDS:
        print(f"\ncheck-up era tests, seconds per era or scenario set (copy, install, check-up): {SECONDS}")


@pytest.mark.era
def test_02_transformers_4_45_accumulation_fails_by_measurement_and_its_healthy_settings_pass(wheel, tmp_path):
    outcome = checkup_in("02-transformers-4.45", wheel, tmp_path)
    assert outcome["versions"]["transformers"] == "4.45.2"
    bug = findings(outcome, "accumulation, unequal micro-batches")["accumulation"]
    assert (bug["status"], bug["decided"], bug["known_bug"]) == (
        "fail",
        "measured",
        "02-transformers-4.45-accumulation",
    )
    assert bug["value"] > 0.3  # 0.85 once measured on these examples: the mean of micro-batch means
    equal = findings(outcome, "accumulation, equal micro-batches")["accumulation"]
    assert (equal["status"], equal["decided"]) == ("ok", "measured") and equal["value"] < 1e-5
    for healthy in ("accumulation, equal micro-batches", "no accumulation"):
        no_fail(outcome, healthy)


@pytest.mark.era
def test_01_trl_0_14_padding_free_collators_fail_packing_by_measurement(wheel, tmp_path):
    outcome = checkup_in("01-trl-0.14", wheel, tmp_path, installer="pip")
    assert (outcome["versions"]["transformers"], outcome["versions"]["trl"]) == ("4.48.3", "0.14.0")
    for scenario in ("completion-only collator, padding_free=True", "DataCollatorWithFlattening"):
        packing = findings(outcome, scenario)["packing"]
        assert (packing["status"], packing["decided"]) == ("fail", "measured"), packing
        assert packing["known_bug"] == "01-position-ids-ignored-before-4.53.1"
        assert ", position_ids, no attention_mask)" in packing["fix"]  # what the era sends
    accumulation = findings(outcome, "completion-only collator, padding_free=True")["accumulation"]
    assert (accumulation["status"], accumulation["decided"]) == ("ok", "measured")  # like with like
    assert "packed" in accumulation["measured"]
    assert findings(outcome, "completion-only collator, padded")["packing"]["status"] == "skipped"
    no_fail(outcome, "completion-only collator, padded")


@pytest.mark.era
def test_01_trl_0_21_padding_free_sends_an_all_ones_mask_and_fails_packing_not_accumulation(wheel, tmp_path):
    """The issue's own report: on TRL 0.21.0 the old check-up said packing 'skipped' (no position_ids) and
    blamed accumulation; the packed row is recognised by its rows now."""
    outcome = checkup_in("01-transformers-4.55", wheel, tmp_path)
    assert (outcome["versions"]["transformers"], outcome["versions"]["trl"]) == ("4.55.4", "0.21.0")
    found = findings(outcome, "SFTConfig(padding_free=True)")
    assert (found["packing"]["status"], found["packing"]["decided"]) == ("fail", "measured")
    assert found["packing"]["known_bug"] == "01-trl-0.19-all-ones-mask"
    assert ", no position_ids, an attention_mask)" in found["packing"]["fix"]
    assert (found["accumulation"]["status"], found["accumulation"]["decided"]) == ("ok", "measured")
    no_fail(outcome, "SFTConfig(padding_free=False)")


@pytest.mark.era
def test_04_transformers_4_51_dpo_meets_the_real_right_padding_error_and_sdpa_passes(wheel, tmp_path):
    outcome = checkup_in("04-transformers-4.51", wheel, tmp_path)
    assert (outcome["versions"]["transformers"], outcome["versions"]["trl"]) == ("4.51.3", "0.17.0")
    bug = findings(outcome, "DPO, Qwen2 with flash_attention_2 set")["padding_cache"]
    assert (bug["status"], bug["decided"], bug["known_bug"]) == ("fail", "measured", "04-qwen2-fa2-right-padding-4.49")
    assert "raised transformers' ValueError (modeling_qwen2.py, _update_causal_mask)" in bug["measured"]
    assert "TRL 0.12.0-0.17.0's DPO forward" in bug["fix"]  # the cause: the era's DPO builds the cache
    sdpa = findings(outcome, "DPO, Qwen2 on sdpa")["padding_cache"]
    assert (sdpa["status"], sdpa["decided"]) == ("warn", "table") and sdpa["value"] > 0  # counted, then the window
    no_cache = findings(outcome, "DPO, Qwen2 on sdpa, use_cache=False")["padding_cache"]
    assert (no_cache["status"], no_cache["decided"], no_cache["value"]) == ("ok", "measured", 0)
    grpo = findings(outcome, "GRPO, Qwen2 on sdpa")["padding_cache"]  # GRPO's scoring forwards count
    assert grpo["status"] == "warn" and grpo["value"] > 0 and "GRPO scoring forward" in grpo["fix"]
    for healthy in ("DPO, Qwen2 on sdpa", "DPO, Qwen2 on sdpa, use_cache=False", "GRPO, Qwen2 on sdpa"):
        no_fail(outcome, healthy)


@pytest.mark.era
def test_04_transformers_4_40_first_window_fails_padding_cache_by_measurement(wheel, tmp_path):
    outcome = checkup_in("04-transformers-4.40", wheel, tmp_path)
    assert (outcome["versions"]["transformers"], outcome["versions"]["trl"]) == ("4.40.2", "0.8.6")
    bug = findings(outcome, "Trainer, Qwen2 with flash_attention_2 set")["padding_cache"]
    assert (bug["status"], bug["decided"], bug["known_bug"]) == ("fail", "measured", "04-qwen2-fa2-right-padding-4.37")
    assert "(modeling_qwen2.py, forward)" in bug["measured"]
    assert findings(outcome, "Trainer, Qwen2 on sdpa")["padding_cache"]["status"] == "warn"
    for healthy in ("Trainer, Qwen2 on sdpa", "Trainer, Qwen2 on sdpa, use_cache=False"):
        no_fail(outcome, healthy)


@pytest.mark.era
def test_06_trl_0_24_on_transformers_5_trains_the_prompt_and_prompt_in_loss_fails_by_measurement(wheel, tmp_path):
    """TRL #6105: trl 0.24.0 counts a BatchEncoding's keys as the prompt's length on transformers >= 5.0.0; today's
    stack passes the same probe (tests/test_checkup_reported.py)."""
    outcome = checkup_in("06-trl-0.24", wheel, tmp_path)
    assert (outcome["versions"]["transformers"], outcome["versions"]["trl"]) == ("5.5.0", "0.24.0")
    bug = findings(outcome, "SFT, conversational prompt-completion")["prompt_in_loss"]
    assert (bug["status"], bug["decided"], bug["known_bug"]) == ("fail", "measured", "02-trl-chat-template-dict-mask")
    assert bug["value"] >= 0.5
    # the same scenario through the command line: trl 0.24.0's own sft script builds the trainer from local files
    command_line = outcome["command_line"]
    assert command_line["exit_code"] == 1 and command_line["report"] is not None, command_line["stderr"]
    assert command_line["report"]["subject"].startswith("SFTTrainer")
    by_command = {f["probe"]: f for f in command_line["report"]["findings"]}["prompt_in_loss"]
    assert (by_command["status"], by_command["decided"], by_command["known_bug"]) == (
        "fail",
        "measured",
        "02-trl-chat-template-dict-mask",
    )
    assert not command_line["report"]["errors"], command_line["report"]["findings"]


@pytest.mark.era
def test_03_trl_0_14_fp16_lora_reward_model_fails_fp16_adamw_before_its_run_goes_nan(wheel, tmp_path):
    """Lesson 03 (TRL #2367) in the era closest to its report: trl 0.14.0, transformers 4.48.3, peft 0.14.0,
    accelerate 1.2.1. The report's thread dates from November 2024 (trl 0.12-era), so these are not its exact
    versions. A real RewardTrainer with peft_config=LoraConfig(task_type="SEQ_CLS") on a float16 Llama reward
    model, optim="adamw_torch", batch 1 x accumulation 8: the check-up's fp16_adamw fails by measurement, and the
    era's own training then logs a finite grad norm at step 1 and NaN at step 2; float32 weights, the rest the same,
    have no fail and train finite. The era selects "adamw_torch" when no optimizer is named (transformers 4.48.3
    training_args.py:1273), where today's 5.23.0 selects the fused AdamW on torch >= 2.8 (training_args.py:806-811)
    and hides the bug: the result reads that default from the era's own RewardConfig."""
    outcome = checkup_in("01-trl-0.14", wheel, tmp_path, scenarios="01-trl-0.14, lesson 03")
    assert (outcome["versions"]["transformers"], outcome["versions"]["trl"]) == ("4.48.3", "0.14.0")
    assert outcome["also"]["defaults"] == {"optim": "adamw_torch"}
    bug = findings(outcome, "RewardTrainer, float16 weights")["fp16_adamw"]
    assert (bug["status"], bug["decided"]) == ("fail", "measured"), bug
    assert "(optim=adamw_torch)" in bug["measured"] and "8 micro-batches through training_step" in bug["measured"]
    assert bug["fix"].startswith("base_model.model.score.")  # the SEQ_CLS head, trainable and kept in fp16
    norms = outcome["also"]["grad_norms"]
    assert math.isfinite(norms["float16"][0]) and math.isnan(norms["float16"][1])  # the run the probe foresaw
    assert all(math.isfinite(n) for n in norms["float32"]) and len(norms["float32"]) == 2
    healthy = findings(outcome, "RewardTrainer, float32 weights")["fp16_adamw"]
    assert healthy["status"] == "ok" and healthy["measured"] == "0 fp16 trainable tensors"
    assert findings(outcome, "RewardTrainer, float32 weights")["reward_head"]["status"] == "ok"
    no_fail(outcome, "RewardTrainer, float32 weights")


@pytest.mark.era
def test_05_trl_0_14_grpo_checkup_reaches_its_verdict_and_equal_rewards_fail_by_measurement(wheel, tmp_path):
    """Lesson 05 (TRL #2906) on the report's own trl 0.14.0 (transformers 4.48.3, peft 0.14.0, accelerate 1.2.1),
    the first GRPOTrainer: it generates inside compute_loss, counts prompts in the per-device batch and has no
    top_p or reward_weights, so the check-up's equal_rewards takes its own generation path here. A reward that
    ignores the completion fails it by measurement (4 of 4 groups); a reward with spread passes, in fp32 and with
    the report's bf16=True, and with a reward that takes only the prompts and completions trl 0.14.0 passes (the
    probe passed completion_ids, which later versions add, and raised a TypeError). Conversational prompts take the
    probe's own chat path on this TRL (the tokenizer's chat template applied, completions passed as messages): the
    same verdicts, measured, and padding_cache measures TRL's own generation and loss on them. The probe generates
    from the prompt ids trl 0.14.0 builds: no second BOS where the template writes one, cut to max_prompt_length
    (it added one and cut nothing before). The report's crash (SIGFPE in a bf16 GEMM) needs an H20 GPU and an old
    cuBLAS and is not made here: on this CPU the known-bugs table matches nothing (decided by the table, no GPU name
    read), and the same trainer's facts with the report's device and cuBLAS put in match 05-h20-cublas-bf16 from the
    era's GRPOConfig(bf16=True), and nothing with bf16=False."""
    outcome = checkup_in("01-trl-0.14", wheel, tmp_path, scenarios="01-trl-0.14, lesson 05")
    assert (outcome["versions"]["transformers"], outcome["versions"]["trl"]) == ("4.48.3", "0.14.0")
    for same in ("GRPO, the same reward for every completion", "GRPO, conversational prompts, the same reward"):
        flat = findings(outcome, same)["equal_rewards"]
        assert (flat["status"], flat["decided"], flat["value"]) == ("fail", "measured", 1.0), flat
        assert flat["measured"].startswith("4 of 4 groups")  # 4 prompts: trl 0.14.0's per-device batch counts prompts
    healthy_runs = ("GRPO, a reward with spread", "GRPO, a reward with spread, bf16=True")
    chat = "GRPO, conversational prompts, a reward with spread"  # a completion passed as text makes its reward raise
    for healthy in (*healthy_runs, "GRPO, a reward taking prompts and completions only", chat):
        found = findings(outcome, healthy)["equal_rewards"]
        assert (found["status"], found["decided"]) == ("ok", "measured") and found["measured"].startswith("0 of 4")
        no_fail(outcome, healthy)
    for conversational in (chat, "GRPO, conversational prompts, the same reward"):
        padding = findings(outcome, conversational)["padding_cache"]
        assert (padding["status"], padding["decided"]) == ("ok", "measured"), padding
    prompts = outcome["also"]["generation_prompts"]  # what equal_rewards and trl 0.14.0 each generate from
    for limit, seen in prompts.items():
        assert seen["probe"] == seen["trl"], (limit, seen)
    whole, cut = (len(prompts[f"max_prompt_length={n}"]["trl"]["input_ids"][0]) for n in (16, 6))
    assert cut == 6 < whole
    table = findings(outcome, "GRPO, a reward with spread, bf16=True")["known_bugs"]
    assert (table["status"], table["decided"], table["value"]) == ("ok", "table", 0)
    assert "trl 0.14.0" in table["reason"]
    what_if = outcome["also"]["known_bugs"]
    assert what_if["bf16=True"] == {
        "here": [],
        "gpu_name here": "",
        "on an H20 with cuBLAS 12.1.3.1": ["05-h20-cublas-bf16"],
    }
    assert what_if["bf16=False"]["on an H20 with cuBLAS 12.1.3.1"] == []


@pytest.mark.era
def test_08_trl_1_14_qdora_magnitude_stalls_and_stalled_update_names_its_known_bug(wheel, tmp_path):
    """TRL #7268: trl 1.14.2 casts DoRA's magnitude vector of a 4-bit model to bfloat16, where lr 2e-4 cannot move it;
    the probe fails by measurement and names the known-bugs entry. The same QLoRA without DoRA trains: the cast's
    LoRA matrices move (|w| about 0.02-0.1, lora_B starting at 0)."""
    outcome = checkup_in("08-trl-1.14", wheel, tmp_path)
    assert outcome["versions"]["trl"] == "1.14.2"
    dora = findings(outcome, "SFT, 4-bit Llama, DoRA")["stalled_update"]
    assert (dora["status"], dora["decided"]) == ("fail", "measured"), dora
    assert dora["known_bug"] == "03-trl-qlora-casts-dora-magnitude" and "trl>=1.15.0" in dora["fix"]
    assert "adapter" in dora["measured"] and "bfloat16" in dora["measured"]
    lora = findings(outcome, "SFT, 4-bit Llama, LoRA")["stalled_update"]
    assert (lora["status"], lora["decided"]) == ("ok", "measured"), lora
    for scenario in outcome["reports"]:  # a 4-bit model makes no probe crash
        assert outcome["reports"][scenario]["errors"] == 0, outcome["reports"][scenario]["findings"]
