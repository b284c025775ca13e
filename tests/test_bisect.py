"""``trl-clinic bisect``: the window from an index listing, the search on fake records (monotone, changed back,
untestable versions, the number of builds), the table, JSON and exit codes, the first-step script on today's stack
(SFT, DPO, reward, GRPO), and (slow) lessons 02's and 01's windows found for real: transformers 4.46.0 in the loss
scale, trl 0.23.1 in the batch."""

from __future__ import annotations

import ast
import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from trl_clinic import cli
from trl_clinic.bisect import changes, environments, records, report, runner, search, versions
from trl_clinic.bisect.search import Measured
from trl_clinic.probes.environments import EnvironmentBuildError

# lesson 02's shape: one sample per micro-batch, four micro-batches per step; both names of the length field
# (TRL 0.11's max_seq_length, today's max_length): a version's config takes the one it knows, lists the other
RECIPE = {"per_device_train_batch_size": 1, "gradient_accumulation_steps": 4, "max_seq_length": 128, "max_length": 128}
LISTING = """WARNING: pip index is currently an experimental command.
transformers (4.47.0)
Available versions: 4.47.0, 4.46.3, 4.46.2, 4.46.1, 4.46.0rc1, 4.45.2, 4.45.1, 4.45.0, 4.44.2
"""


# --- versions -------------------------------------------------------------------------------------------------


def test_the_window_holds_final_releases_between_the_ends_oldest_first():
    listed = versions.parse_index_listing(LISTING)
    assert versions.between(listed, "4.45.0", "4.46.2") == ["4.45.0", "4.45.1", "4.45.2", "4.46.1", "4.46.2"]


def test_pre_releases_only_on_request():
    listed = versions.parse_index_listing(LISTING)
    assert "4.46.0rc1" in versions.between(listed, "4.45.2", "4.46.1", pre=True)
    assert "4.46.0rc1" not in versions.between(listed, "4.45.2", "4.46.1")


def test_an_end_the_index_does_not_list_is_kept():
    """transformers 4.46.0 was yanked: pip's listing leaves it out, its exact pin still installs."""
    listed = versions.parse_index_listing(LISTING)
    assert versions.between(listed, "4.45.1", "4.46.0") == ["4.45.1", "4.45.2", "4.46.0"]


@pytest.mark.parametrize(("good", "bad"), [("4.46.0", "4.45.0"), ("4.45.0", "4.45.0"), ("four", "4.46.0")])
def test_ends_out_of_order_or_not_versions_are_usage_errors(good, bad):
    with pytest.raises(ValueError):
        versions.between(["4.45.0", "4.46.0"], good, bad)


def test_the_listing_comes_from_pip_index_versions_with_pre_on_request():
    calls = []

    def fake_run(command, **kwargs):
        calls.append(command)
        return subprocess.CompletedProcess(command, 0, stdout=LISTING, stderr="")

    assert versions.index_versions("transformers", pre=True, run=fake_run)[0] == "4.47.0"
    assert calls[0][1:5] == ["-m", "pip", "index", "versions"] and "--pre" in calls[0]


def test_a_listing_without_versions_is_an_error_that_says_what_pip_said():
    with pytest.raises(versions.IndexUnavailable, match="no such package"):
        versions.parse_index_listing("ERROR: no such package")


UNREACHABLE = "ERROR: No matching distribution found for trl"  # pip 23.2's stderr, --index-url on a closed port


def test_an_index_pip_cannot_read_is_an_index_failure_not_a_usage_error():
    def fake_run(command, **kwargs):
        return subprocess.CompletedProcess(command, 1, stdout="", stderr=UNREACHABLE)

    with pytest.raises(versions.IndexUnavailable, match="No matching distribution") as raised:
        versions.index_versions("trl", run=fake_run)
    assert not isinstance(raised.value, ValueError)


def test_an_index_failure_is_exit_code_3_and_says_so_in_json(tmp_path, monkeypatch, capsys):
    def unreachable(package, pre=False):
        raise versions.IndexUnavailable(f"pip could not list {package}'s versions: {UNREACHABLE}")

    monkeypatch.setattr(runner.versions, "index_versions", unreachable)
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("per_device_train_batch_size: 1\n")
    argv = ["bisect", "sft", "--config", str(recipe), "--package", "trl", "--good", "0.18.2", "--bad", "0.19.1"]
    assert cli.main([*argv, "--json"]) == 3
    said = json.loads(capsys.readouterr().out)
    assert said["exit_code"] == 3 and not said["decided"] and UNREACHABLE in said["verdict"]
    assert cli.main(argv) == 3 and capsys.readouterr().out.startswith("undecided: trl's releases could not be listed")
    backwards = [*argv[:-4], "--good", "0.19.1", "--bad", "0.18.2"]
    assert cli.main(backwards) == 2  # the ends are checked before the index is asked


def test_the_rest_of_the_stack_is_pinned_from_this_environment_and_overrides_win():
    import torch

    pinned = versions.pins("transformers", ["trl==0.11.4", "datasets"])
    assert "transformers" not in pinned
    assert pinned["torch"] == f"torch=={torch.__version__}"
    assert pinned["trl"] == "trl==0.11.4" and pinned["datasets"] == "datasets"
    with pytest.raises(ValueError, match="moves"):
        versions.pins("trl", ["trl==0.11.4"])


# --- side environments ------------------------------------------------------------------------------------------

UV_CONFLICT = (
    "uv pip install failed (exit code 1): error: No solution found when resolving dependencies: Because "
    "transformers==4.45.0 depends on tokenizers>=0.20,<0.21 and you require tokenizers==0.22.0, we can conclude "
    "that your requirements are unsatisfiable."
)  # what uv 0.13.8 said (stderr) for transformers==4.45.0 beside tokenizers==0.22.0, the prefix bisect adds


@pytest.fixture
def no_torch_lookup(monkeypatch):
    monkeypatch.setattr(environments, "local_torch_links", lambda version: None)


@pytest.mark.parametrize(("said", "status"), [(UV_CONFLICT, "conflict"), ("uv pip install failed: network", "failed")])
def test_a_version_that_cannot_install_is_a_conflict_or_a_failure(tmp_path, monkeypatch, no_torch_lookup, said, status):
    def refuse(*args, **kwargs):
        raise EnvironmentBuildError(said)

    monkeypatch.setattr(environments, "create_and_install", refuse)
    built = environments.prepare("transformers", "4.45.0", {"tokenizers": "tokenizers==0.22.0"}, "sft", tmp_path)
    assert built.status == status and not built.ready and "failed" in built.message


def test_a_built_environment_is_taken_from_the_cache_the_second_time(tmp_path, monkeypatch, no_torch_lookup):
    installs = []

    def install(venv, requirements, **kwargs):
        installs.append(requirements.read_text())
        (venv / "bin").mkdir(parents=True)
        (venv / "bin" / "python").write_text("")

    monkeypatch.setattr(environments, "create_and_install", install)
    monkeypatch.setattr(environments, "probe_versions", lambda *args: {"transformers": "4.45.0"})
    pins = {"trl": "trl==0.11.4", "torch": "torch==2.13.0"}
    first = environments.prepare("transformers", "4.45.0", pins, "sft", tmp_path)
    second = environments.prepare("transformers", "4.45.0", pins, "sft", tmp_path)
    assert (first.status, second.status) == ("built", "cached") and len(installs) == 1
    assert installs[0] == "transformers==4.45.0\ntorch==2.13.0\ntrl==0.11.4\n"
    assert environments.prepare("transformers", "4.45.1", pins, "sft", tmp_path).status == "built"


def test_libraries_that_do_not_import_together_make_the_version_unusable(tmp_path, monkeypatch, no_torch_lookup):
    monkeypatch.setattr(environments, "create_and_install", lambda *args, **kwargs: None)

    def broken(*args):
        raise EnvironmentBuildError("the environment's libraries do not import: ImportError")

    monkeypatch.setattr(environments, "probe_versions", broken)
    assert environments.prepare("trl", "0.19.0", {}, "sft", tmp_path).status == "unusable"


# --- search on fake records -----------------------------------------------------------------------------------


CAUSAL = {"pattern": "causal (124 tokens)", "visible_pairs": 7750, "sha256": "c" * 64}
BLOCKS = {"pattern": "causal within 4 sequences (124 tokens)", "visible_pairs": 2484, "sha256": "b" * 64}


def verdicts(**statuses: str) -> dict:
    """Check-up verdicts as a record holds them: packing ok and eos_label fail unless said otherwise."""
    said = {"packing": "ok", "eos_label": "fail"} | statuses
    return {probe: {"status": status, "value": None} for probe, status in said.items()}


OK_VERDICTS = verdicts()


def fake_record(
    loss=4.8, grad_norm=0.9, labels=120, input_ids="a", mask="m", attention=CAUSAL, said=None, raised=None
) -> dict:
    parts = {"input_ids": input_ids, "labels": input_ids, "position_ids": "absent", "attention_mask": mask}
    if raised:  # a step that raised: first_step.record keeps no loss, gradient or attention
        loss = grad_norm = attention = None
    return {"parts": parts, "batch_sha256": "f" * 64, "label_tokens": labels, "loss": loss, "grad_norm": grad_norm,
            "attention": attention, "verdicts": said or OK_VERDICTS, "raised": raised}  # fmt: skip


GUARD = "ValueError: You are attempting to perform batched generation with padding_side='right' this may lead"
KERNEL = "NameError: name '_flash_supports_window_size' is not defined"


class FakeIndex:
    """A measure() over fake records, counting what it was asked for."""

    def __init__(self, records: dict[str, dict | str]):
        self.records, self.asked = records, []

    def __call__(self, version: str) -> Measured:
        self.asked.append(version)
        value = self.records[version]
        if isinstance(value, str):  # a status: conflict, unusable, failed
            return Measured(version, value, message=f"{value} for {version}")
        return Measured(version, "cached", record=value)


WINDOW = [f"1.{i}.0" for i in range(30)]


def monotone(first_change: int, changed: dict | None = None) -> dict:
    changed = changed or fake_record(loss=4.8 * 4)
    return {v: (changed if i >= first_change else fake_record()) for i, v in enumerate(WINDOW)}


@pytest.mark.parametrize("first_change", [1, 7, 15, 29])
def test_binary_search_finds_the_first_change_in_about_log2_n_measurements(first_change):
    fake = FakeIndex(monotone(first_change))
    outcome = search.binary(WINDOW, fake)
    assert outcome.first == WINDOW[first_change] and outcome.last_same == WINDOW[first_change - 1]
    assert outcome.part == "loss scale" and outcome.exit_code == 1
    assert len(set(fake.asked)) == len(fake.asked)  # no version measured twice


def test_a_30_release_window_costs_at_most_6_builds_wherever_the_change_is():
    """Issue 48's cost: the good end and five halvings of the 30 answers left (a change at one of the 29 others,
    or none). Measuring the bad end first, as the search once did, made it 7 (2 + ceil(log2 29))."""
    asked = []
    for first_change in range(1, len(WINDOW) + 1):  # len(WINDOW): nothing changed
        fake = FakeIndex(monotone(first_change))
        outcome = search.binary(WINDOW, fake)
        assert outcome.first == (WINDOW[first_change] if first_change < len(WINDOW) else None)
        assert len(set(fake.asked)) == len(fake.asked) and fake.asked[0] == WINDOW[0]
        asked.append(len(fake.asked))
    assert max(asked) == 6


@pytest.mark.parametrize("n", [2, 3, 4, 5, 8, 17, 27, 31, 64, 100])
def test_binary_search_measures_at_most_1_plus_ceil_log2_n_versions(n):
    window = WINDOW[:n] if n <= len(WINDOW) else [f"2.{i}.0" for i in range(n)]
    for first_change in range(1, n + 1):
        records = {v: (fake_record(loss=9.6) if i >= first_change else fake_record()) for i, v in enumerate(window)}
        fake = FakeIndex(records)
        search.binary(window, fake)
        assert len(fake.asked) <= 1 + math.ceil(math.log2(n))


def test_nothing_changed_is_exit_code_0_once_the_bad_end_is_measured_the_same():
    fake = FakeIndex(monotone(len(WINDOW)))
    outcome = search.binary(WINDOW, fake)
    assert outcome.first is None and outcome.exit_code == 0 and fake.asked[-1] == WINDOW[-1]


def test_nothing_changed_but_a_bad_end_that_cannot_be_built_is_undecided():
    fake = FakeIndex(monotone(len(WINDOW)) | {WINDOW[-1]: "failed"})
    outcome = search.binary(WINDOW, fake)
    assert outcome.first is None and outcome.exit_code == 3
    assert report.verdict(outcome, "trl").endswith(f"not measured: {WINDOW[-1]} (failed)")


def test_a_change_that_went_back_is_missed_by_binary_search_and_shown_by_linear():
    records = monotone(len(WINDOW)) | {v: fake_record(labels=99) for v in WINDOW[3:6]}
    fake = FakeIndex(records)
    assert search.binary(WINDOW, fake).exit_code == 0  # its halvings step over 3 to 5: binary sees nothing
    assert not set(fake.asked) & set(WINDOW[3:6])
    outcome = search.linear(WINDOW, FakeIndex(records))
    assert outcome.first == WINDOW[3] and outcome.part == "label count" and outcome.exit_code == 1
    assert outcome.changed_back == WINDOW[6:]


def test_a_conflicting_version_is_stepped_around_and_never_counted_good_or_bad():
    records = monotone(12) | {WINDOW[11]: "conflict"}
    outcome = search.binary(WINDOW, FakeIndex(records))
    assert outcome.first == WINDOW[12] and outcome.last_same == WINDOW[10]
    assert outcome.between == [WINDOW[11]] and outcome.decided and outcome.exit_code == 1
    assert outcome.measured[WINDOW[11]].parts == []


def test_a_failed_build_where_the_change_may_be_leaves_it_undecided():
    records = monotone(12) | {WINDOW[11]: "failed"}
    outcome = search.binary(WINDOW, FakeIndex(records))
    assert outcome.between == [WINDOW[11]] and not outcome.decided and outcome.exit_code == 3
    assert report.verdict(outcome, "trl").startswith("undecided")


def test_a_walk_with_no_change_but_a_failed_step_is_undecided_and_names_it():
    """As trl 1.14.0 to 1.16.0 went here: 1.15.0's SFT step raised (no triton for its fused head), the rest agreed."""
    records = monotone(len(WINDOW)) | {WINDOW[4]: "step failed"}
    outcome = search.linear(WINDOW, FakeIndex(records))
    assert outcome.first is None and outcome.exit_code == 3
    assert report.verdict(outcome, "trl").endswith(f"not measured: {WINDOW[4]} (step failed)")


def test_a_good_end_that_cannot_be_measured_is_undecided_and_nothing_is_called_same():
    records = monotone(5) | {WINDOW[0]: "step failed"}
    assert search.linear(WINDOW, FakeIndex(records)).exit_code == 3
    outcome = search.binary(WINDOW, FakeIndex(records))
    assert outcome.exit_code == 3 and report.verdict(outcome, "trl").endswith(f"step failed for {WINDOW[0]}")
    assert verdict_column(outcome) == ["step failed"]  # nothing else is measured against no reference


def verdict_column(outcome) -> list[str]:
    return [line.split("|")[-2].strip() for line in report.table(outcome).splitlines()[2:]]


@pytest.mark.parametrize(
    ("changed", "parts"),
    [
        (fake_record(input_ids="b", labels=99, loss=9.0), ["batch", "label count", "loss scale"]),
        (fake_record(mask="n"), ["mask"]),
        (fake_record(attention=BLOCKS), ["attention"]),
        (
            fake_record(input_ids="b", mask="n", attention=BLOCKS, labels=119),
            ["batch", "mask", "attention", "label count"],
        ),
        (fake_record(attention={"pattern": "not measured (TypeError)", "sha256": None}), []),  # not compared
        (fake_record(said=verdicts(packing="fail")), ["verdict"]),
        (fake_record(said=verdicts(packing="error")), []),  # the check-up crashed: not a verdict on the version
        (fake_record(said={"checkup": {"status": "not run", "value": None}}), []),
        (fake_record(labels=119), ["label count"]),
        (fake_record(grad_norm=0.9 * (1 + 3 * search.LOSS_BOUND)), ["loss scale"]),
        (fake_record(loss=4.8 * (1 + search.LOSS_BOUND / 2)), []),
        (fake_record(raised=GUARD), ["error"]),  # no loss, label count or attention compared against a raise
        (fake_record(raised=GUARD, input_ids="b", said=verdicts(packing="fail")), ["batch", "error", "verdict"]),
    ],
)
def test_parts_are_named_in_the_order_a_step_computes_them_and_rounding_is_not_a_change(changed, parts):
    assert search.differing_parts(fake_record(), changed) == parts


def test_a_step_that_raises_differently_is_an_error_change_named_with_both_messages():
    """Lesson 04's window as bisect meets it: past the guard the re-created FlashAttention-2 model reaches the missing
    kernel (NameError); inside it the guard raises first (ValueError). Equal raises are the same record."""
    records = {v: fake_record(raised=GUARD if 12 <= i < 20 else KERNEL) for i, v in enumerate(WINDOW)}
    assert search.differing_parts(records[WINDOW[0]], records[WINDOW[1]]) == []
    outcome = search.binary(WINDOW[:16], FakeIndex(records))
    assert (outcome.first, outcome.part) == (WINDOW[12], "error")
    assert report.verdict(outcome, "transformers").endswith(f"the error ({KERNEL} -> {GUARD})")
    assert "raised ValueError" in report.table(outcome) and "raised NameError" in report.table(outcome)


def test_an_attention_change_is_named_with_both_patterns_and_shown_in_the_table():
    outcome = search.binary(WINDOW, FakeIndex(monotone(9, fake_record(attention=BLOCKS))))
    assert outcome.part == "attention" and outcome.first == WINDOW[9]
    assert report.verdict(outcome, "trl").endswith(f"the attention ({CAUSAL['pattern']} -> {BLOCKS['pattern']})")
    assert BLOCKS["pattern"] in report.table(outcome)


def test_a_verdict_change_is_named_and_the_table_shows_the_loud_probes():
    outcome = search.binary(WINDOW, FakeIndex(monotone(20, fake_record(loss=9.6, said=verdicts(packing="fail")))))
    assert outcome.measured[WINDOW[20]].parts == ["loss scale", "verdict"]
    assert report.change_detail(fake_record(), outcome.measured[WINDOW[20]].record, "verdict") == "packing ok -> fail"
    assert report.verdict(outcome, "trl").endswith("; after it: verdict (packing ok -> fail)")
    cells = [line.split("|")[8].strip() for line in report.table(outcome).splitlines()[2:]]  # the verdicts column
    assert cells[0] == "eos_label fail" and cells[-1] == "packing fail, eos_label fail"


# --- output ---------------------------------------------------------------------------------------------------


def test_the_table_and_json_say_every_version_and_the_verdict_names_the_part():
    records = monotone(12) | {WINDOW[11]: "conflict"}
    outcome = search.binary(WINDOW, FakeIndex(records))
    text = report.table(outcome)
    assert text.splitlines()[0].split("|")[1].strip() == "version"
    assert "skipped (conflict)" in text and "good end" in text
    line = report.verdict(outcome, "trl")
    assert line.startswith(f"first change: trl {WINDOW[12]} (last same: {WINDOW[10]}): the loss scale")
    assert "x4" in line and WINDOW[11] in line
    data = json.loads(json.dumps(report.to_json(outcome, "trl")))
    assert data["first_change"] == WINDOW[12] and data["part"] == "loss scale" and data["exit_code"] == 1
    assert {m["version"] for m in data["measured"]} == set(outcome.measured)


def test_the_command_prints_json_and_returns_the_outcomes_exit_code(tmp_path, monkeypatch, capsys):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("per_device_train_batch_size: 1\ngradient_accumulation_steps: 4\n")
    seen = {}

    def fake_bisect(kind, config, moves, **options):
        seen.update(kind=kind, config=config, pins=options["pins"], moves=moves)
        return search.binary(WINDOW, FakeIndex(monotone(3)))

    monkeypatch.setattr(runner, "bisect_together", fake_bisect)
    argv = ["bisect", "sft", "--config", str(recipe), "--package", "trl", "--good", "1.0.0", "--bad", "1.29.0"]
    assert cli.main([*argv, "--json", "--pin", "datasets"]) == 1
    assert json.loads(capsys.readouterr().out)["first_change"] == WINDOW[3]
    assert seen == {"kind": "sft", "config": {"per_device_train_batch_size": 1, "gradient_accumulation_steps": 4},
                    "pins": ["datasets"], "moves": [("trl", "1.0.0", "1.29.0")]}  # fmt: skip
    together = ["--package", "trl,transformers", "--good", "1.0.0,4.0.0", "--bad", "1.29.0,4.2.0"]
    assert cli.main([*argv[:4], *together]) == 1
    assert seen["moves"] == [("trl", "1.0.0", "1.29.0"), ("transformers", "4.0.0", "4.2.0")]


def test_the_files_that_changed_are_named_among_those_the_step_imported(tmp_path):
    """Both environments' copies of the moving package's imported files, compared: a changed file with its lines
    gained and lost, an unchanged one left out, a file only the newer release has counted as all gained."""
    for version, text in (("a", "x = 1\ny = 2\n"), ("b", "x = 1\ny = 3\nz = 4\n")):
        (tmp_path / version / "trl").mkdir(parents=True)
        (tmp_path / version / "trl" / "sft.py").write_text(text)
        (tmp_path / version / "trl" / "same.py").write_text("same\n")
    (tmp_path / "b" / "trl" / "new.py").write_text("1\n2\n")

    def record(version, files):
        modules = {"trl": {"folder": str(tmp_path / version), "files": files}}
        return fake_record() | {"versions": {"trl": f"0.{ord(version)}.0"}, "modules": modules}

    outcome = search.Outcome(["0.97.0", "0.98.0"], {
        "0.97.0": Measured("0.97.0", "cached", record=record("a", ["trl/sft.py", "trl/same.py"])),
        "0.98.0": Measured("0.98.0", "cached", record=record("b", ["trl/sft.py", "trl/same.py", "trl/new.py"])),
    }, first="0.98.0", last_same="0.97.0")  # fmt: skip
    found = changes.changed_files(outcome)
    counted = [(f["file"], f["added"], f["removed"]) for f in found["files"]]
    assert counted == [("trl/sft.py", 2, 1), ("trl/new.py", 2, 0)]
    assert found["files"][0]["diff"] == ["@@ -2 +2,2 @@", "-y = 2", "+y = 3", "+z = 4"]  # quoted: a small change
    assert (found["package"], found["imported"]) == ("trl", 3)
    assert changes.said(found).startswith("in trl 0.97.0 -> 0.98.0, 2 of the 3 files the step imported changed")
    assert changes.said(found).endswith("trl/sft.py:\n    @@ -2 +2,2 @@\n    -y = 2\n    +y = 3\n    +z = 4")
    assert changes.changed_files(search.Outcome(["0.97.0"], outcome.measured)) is None  # no change, nothing named


# --- packages upgraded together ---------------------------------------------------------------------------------

LISTED = {"trl": ["0.1.0", "0.2.0", "0.3.0"], "transformers": ["4.0.0", "4.1.0", "4.2.0", "4.3.0"]}
TOGETHER = [("trl", "0.1.0", "0.3.0"), ("transformers", "4.0.0", "4.2.0")]


def test_an_upgrade_path_moves_one_package_one_release_at_a_time():
    path = runner.upgrade_path(TOGETHER, LISTED)
    assert [label for label, *_ in path] == [
        "trl 0.1.0 + transformers 4.0.0",
        "trl 0.2.0 + transformers 4.0.0",
        "trl 0.3.0 + transformers 4.0.0",
        "trl 0.3.0 + transformers 4.1.0",
        "trl 0.3.0 + transformers 4.2.0",
    ]
    assert [(package, version) for _, package, version, _ in path[1:]] == [
        ("trl", "0.2.0"), ("trl", "0.3.0"), ("transformers", "4.1.0"), ("transformers", "4.2.0")
    ]  # fmt: skip
    assert [label for label, *_ in runner.upgrade_path(TOGETHER[:1], LISTED)] == ["0.1.0", "0.2.0", "0.3.0"]


def test_packages_upgraded_together_name_the_package_and_release_that_changed(monkeypatch):
    """Each point's environment holds the moving package's release beside the other's current one; the record
    changes with transformers 4.1.0, so the first change is that point, whatever trl did before it."""
    built = []

    def fake_prepare(package, version, pins, kind, cache):
        state = {package: version} | {name: line.split("==")[1] for name, line in pins.items() if name in LISTED}
        built.append(state)
        return environments.Environment(version, "cached", Path(json.dumps(state)))

    def fake_step(python, spec):
        state = json.loads(str(python))
        return (fake_record(loss=9.0) if state["transformers"] >= "4.1.0" else fake_record()), ""

    monkeypatch.setattr(runner, "prepare", fake_prepare)
    monkeypatch.setattr(runner, "record_first_step", fake_step)
    outcome = runner.bisect_together("sft", {}, TOGETHER, windows=LISTED, pins=["datasets"], progress=lambda _: None)
    assert outcome.first == "trl 0.3.0 + transformers 4.1.0" and outcome.last_same == "trl 0.3.0 + transformers 4.0.0"
    assert all(set(state) == {"trl", "transformers"} for state in built)
    assert report.verdict(outcome, "").startswith("first change: trl 0.3.0 + transformers 4.1.0 (last same: trl 0.3.0")


@pytest.mark.parametrize(
    "moves, pins, said",
    [
        ([("trl", "0.1.0", "0.3.0"), ("trl", "0.2.0", "0.3.0")], [], "each package moves once"),
        (TOGETHER, ["transformers==4.0.0"], "names the package that moves"),
    ],
)
def test_a_package_moved_twice_or_pinned_while_it_moves_is_a_usage_error(moves, pins, said):
    with pytest.raises(ValueError, match=said):
        runner.bisect_together("sft", {}, moves, windows=LISTED, pins=pins)


def test_a_package_without_its_two_ends_is_a_usage_error(tmp_path):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("per_device_train_batch_size: 1\n")
    argv = ["bisect", "sft", "--config", str(recipe), "--package", "trl,transformers", "--good", "0.1.0"]
    assert cli.main([*argv, "--bad", "0.3.0,4.2.0"]) == 2


@pytest.mark.parametrize(
    "argv",
    [
        ["bisect", "sft", "--config", "no-such.yaml", "--package", "trl", "--good", "0.18.2", "--bad", "0.19.1"],
        ["bisect", "sft", "--config", "x.yaml", "--good", "0.18.2", "--bad", "0.19.1"],
    ],
)
def test_usage_errors_are_exit_code_2(argv, capsys):
    try:
        code = cli.main(argv)
    except SystemExit as stop:  # argparse's own usage error
        code = stop.code
    assert code == 2


def test_a_trainer_the_first_step_cannot_build_is_a_usage_error():
    with pytest.raises(ValueError, match="sft, dpo, reward, grpo"):
        runner.bisect("ppo", {}, "trl", "0.18.2", "0.19.1", window=["0.18.2", "0.19.1"])


# --- the first-step script ------------------------------------------------------------------------------------


def test_the_first_step_script_imports_nothing_of_trl_clinic():
    tree = ast.parse(records.SCRIPT.read_text())
    imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert not any(name.startswith("trl_clinic") for name in imported)


def test_the_first_step_on_todays_stack_records_every_part():
    """The tiny model's weights are drawn at std 0.02, so its logits are near zero and the first loss is near
    log(vocabulary): the record reads the real step, not a default."""
    record, why = records.record_first_step(Path(sys.executable), records.first_step_spec("sft", RECIPE))
    assert record is not None, why
    assert record["micro_batches"] == 4 and record["label_tokens"] > 4
    assert set(record["parts"]) == {"input_ids", "labels", "position_ids", "attention_mask"}
    assert abs(record["loss"] - math.log(124)) < 0.05 * math.log(124)
    assert record["grad_norm"] > 0 and record["recipe_notes"]["ignored"] == ["max_seq_length"]
    assert record["attention"]["pattern"] == f"causal ({record['shape']['input_ids'][1]} tokens)"
    assert record["verdicts"]["accumulation"]["status"] == "ok"  # today's transformers: the window's label count


def test_conversational_data_trains_the_completion_only_on_todays_stack():
    """Prompt-completion chats through the tokenizer's chat template: today's TRL masks the prompt (the check-up's
    prompt_in_loss probe, run on that trainer, says ok), which TRL #6105's releases did not (the slow proof)."""
    spec = records.first_step_spec("sft", {"per_device_train_batch_size": 2}, data="conversational")
    record, why = records.record_first_step(Path(sys.executable), spec)
    assert record is not None, why
    assert record["verdicts"]["prompt_in_loss"]["status"] == "ok" and record["label_tokens"] > 0
    assert record["parts"]["labels"] != "absent" and record["grad_norm"] > 0


@pytest.mark.parametrize("kind, data", [("dpo", "conversational"), ("sft", "messages")])
def test_conversational_data_is_for_sft_only_and_other_data_is_a_usage_error(kind, data):
    with pytest.raises(ValueError, match="conversational for sft only"):
        records.first_step_spec(kind, {}, data=data)


def test_the_check_up_is_put_on_the_scripts_path_alone(tmp_path):
    """Only a link to trl_clinic: the folder holding the package may be a site-packages whose other libraries would
    shadow the side environment's."""
    source = Path(records.checkup_source(tmp_path))
    assert [p.name for p in source.iterdir()] == ["trl_clinic"]
    assert (source / "trl_clinic" / "checkup" / "__init__.py").is_file()


def test_the_check_up_runs_only_when_asked_and_leaves_the_record_as_it_was():
    spec = records.first_step_spec("sft", RECIPE, checkup=False)
    record, why = records.record_first_step(Path(sys.executable), spec)
    assert record is not None and record["verdicts"] is None, why
    asked, why = records.record_first_step(Path(sys.executable), records.first_step_spec("sft", RECIPE))
    assert asked is not None, why
    assert {key: asked[key] for key in ("parts", "loss", "grad_norm", "label_tokens", "attention")} == {
        key: record[key] for key in ("parts", "loss", "grad_norm", "label_tokens", "attention")
    }


def first_step_module():
    """The standalone script, imported as a module (it runs as a file in the side environments)."""
    spec = importlib.util.spec_from_file_location("first_step", records.SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_patterns_are_named_causal_causal_within_sequences_or_other():
    import torch

    name = first_step_module().pattern_name
    causal = torch.ones(5, 5, dtype=torch.bool).tril()
    blocks = causal.clone()
    blocks[2:, :2] = False  # two sequences: tokens 0-1, then 2-4
    assert (name(causal), name(blocks)) == ("causal (5 tokens)", "causal within 2 sequences (5 tokens)")
    assert name(torch.ones(5, 5, dtype=torch.bool)) == "other (25 of 25 pairs)"  # sees later tokens


def test_a_packed_rows_attention_is_measured_from_the_models_forward():
    """Padding-free on today's stack (no mask, position ids restarting, use_cache off in TRL's SFT loss): each
    token's output moves only with its own sequence's tokens, four sequences in the packed row; trl 0.23.0 beside
    transformers 4.57.1 gave ``causal (124 tokens)`` on this row, the contamination lesson 01 draws."""
    recipe = {"per_device_train_batch_size": 4, "padding_free": True, "max_length": None}
    record, why = records.record_first_step(Path(sys.executable), records.first_step_spec("sft", recipe))
    assert record is not None, why
    assert record["attention"]["pattern"] == "causal within 4 sequences (124 tokens)"


def test_a_dpo_first_step_scores_the_reference_weights():
    """The reference is the policy's copy and the learning rate 0, so every pair's margin is 0 and the loss is log 2:
    the record holds the chosen and rejected tensors under their own names."""
    spec = records.first_step_spec("dpo", {"per_device_train_batch_size": 2, "gradient_accumulation_steps": 2})
    record, why = records.record_first_step(Path(sys.executable), spec)
    assert record is not None, why
    assert abs(record["loss"] - math.log(2)) < 1e-6 and record["grad_norm"] > 0 and record["label_tokens"] > 0
    assert any("attention_mask" in key and digest != "absent" for key, digest in record["parts"].items())


def test_a_reward_first_step_scores_the_pairs_with_a_one_label_head():
    """The score head is drawn at std 0.02 like every weight, so both rewards are near 0 and the first loss,
    -log sigmoid(chosen - rejected), is near log 2; the batch holds the chosen and rejected ids, no labels."""
    spec = records.first_step_spec("reward", {"per_device_train_batch_size": 2, "gradient_accumulation_steps": 2})
    record, why = records.record_first_step(Path(sys.executable), spec)
    assert record is not None, why
    assert abs(record["loss"] - math.log(2)) < 0.05 and record["grad_norm"] > 0 and record["micro_batches"] == 2
    assert record["parts"]["labels"] == "absent" and record["label_tokens"] == 0
    assert any("input_ids" in key and digest != "absent" for key, digest in record["parts"].items())


def test_a_grpo_first_step_records_the_generated_batch_and_its_reference_is_the_policy():
    """The batch is what GRPO generated (completion ids and mask, sampled from the seed: the same twice); with
    beta > 0 the reference is loaded from the policy's saved copy, so the KL term is 0 and the loss is beta 0's."""
    recipe = {"per_device_train_batch_size": 4, "num_generations": 4, "max_completion_length": 16}
    plain, why = records.record_first_step(Path(sys.executable), records.first_step_spec("grpo", recipe))
    assert plain is not None, why
    kl, why = records.record_first_step(Path(sys.executable), records.first_step_spec("grpo", recipe | {"beta": 0.04}))
    assert kl is not None, why
    assert plain["parts"]["completion_ids"] != "absent" and plain["shape"]["completion_ids"] == [4, 16]
    assert 0 < plain["label_tokens"] <= 4 * 16  # the completion mask: tokens up to each completion's end
    assert kl["batch_sha256"] == plain["batch_sha256"] and kl["loss"] == plain["loss"]
    assert search.differing_parts(plain, kl) == [] and plain["grad_norm"] > 0


def test_a_first_step_that_fails_says_the_exception_on_its_first_line():
    record, why = records.record_first_step(Path(sys.executable), records.first_step_spec("no-such-trainer", RECIPE))
    assert record is None and why.splitlines()[0].endswith("KeyError: 'no-such-trainer'")


# --- the real proof: lesson 02's window -------------------------------------------------------------------------


@pytest.mark.slow
def test_lesson_02s_window_is_found_unaided():
    """transformers 4.45.0 good, 4.46.0 bad, TRL 0.11.4 beside both (the pins of era 02-transformers-4.45): the
    first change is 4.46.0, in the loss scale (the window's label count reaches the loss), not the batch, and the
    check-up's accumulation verdict goes from fail to ok."""
    pins = ["trl==0.11.4", "peft==0.13.2", "accelerate==1.0.1", "datasets", "rich"]
    outcome = runner.bisect("sft", RECIPE, "transformers", "4.45.0", "4.46.0", pins=pins)
    assert (outcome.first, outcome.last_same, outcome.part) == ("4.46.0", "4.45.2", "loss scale")
    assert outcome.measured["4.46.0"].parts == ["loss scale", "verdict"] and outcome.exit_code == 1
    said = {v: outcome.measured[v].record["verdicts"]["accumulation"]["status"] for v in ("4.45.2", "4.46.0")}
    assert said == {"4.45.2": "fail", "4.46.0": "ok"}  # the check-up's accumulation probe, run in each version


@pytest.mark.slow
def test_lesson_01s_padding_free_window_is_found_unaided():
    """trl 0.19.0 good (its padding-free collator sends the packed row with a ones mask and no position ids, so on sdpa
    every token sees the earlier sequences), 0.24.0 bad, transformers 4.57.1 beside both: the first change is 0.23.1,
    in the batch (position ids sent, the labels at each sequence's start masked), then the mask, then the attention
    (every token saw the earlier sequences of the packed row; from 0.23.1 only its own)."""
    recipe = {"per_device_train_batch_size": 4, "padding_free": True, "max_length": None, "max_seq_length": None}
    pins = ["transformers==4.57.1", "accelerate", "peft", "datasets", "rich"]
    outcome = runner.bisect("sft", recipe, "trl", "0.19.0", "0.24.0", pins=pins)
    assert (outcome.first, outcome.last_same, outcome.part) == ("0.23.1", "0.23.0", "batch")
    assert outcome.measured["0.23.1"].parts == ["batch", "mask", "attention", "label count", "loss scale", "verdict"]
    assert outcome.measured["0.23.0"].record["attention"]["pattern"] == "causal (124 tokens)"
    assert outcome.measured["0.23.1"].record["attention"]["pattern"] == "causal within 4 sequences (124 tokens)"
    said = {v: outcome.measured[v].record["verdicts"]["packing"]["status"] for v in ("0.23.0", "0.23.1")}
    assert said == {"0.23.0": "fail", "0.23.1": "ok"}  # the check-up's packing probe, run in each version


@pytest.mark.slow
def test_lesson_01s_transformers_release_is_found_unaided():
    """trl 0.18.2's padding-free collator sends position ids and no mask on sdpa; the recipe loads its model with
    use_cache=False. transformers 4.52.4 good, 4.53.3 bad: the first change is 4.53.1, in the attention (its mask
    builder finds the sequences in the position ids), with the batch unchanged, and the check-up's packing verdict
    goes from fail to ok. With the config's use_cache=True the same two releases give the same record: the cache
    keeps the row contaminated (lesson 01's later trap)."""
    recipe = {"per_device_train_batch_size": 4, "padding_free": True, "max_length": None, "max_seq_length": None}
    recipe["model_init_kwargs"] = {"use_cache": False}
    pins = ["trl==0.18.2", "accelerate", "peft", "datasets", "rich"]
    outcome = runner.bisect("sft", recipe, "transformers", "4.52.4", "4.53.3", pins=pins)
    assert (outcome.first, outcome.last_same, outcome.part) == ("4.53.1", "4.53.0", "attention")
    assert outcome.measured["4.53.1"].parts == ["attention", "loss scale", "verdict"]
    assert outcome.measured["4.53.1"].record["attention"]["pattern"] == "causal within 4 sequences (124 tokens)"
    said = {v: outcome.measured[v].record["verdicts"]["packing"]["status"] for v in ("4.53.0", "4.53.1")}
    assert said == {"4.53.0": "fail", "4.53.1": "ok"}
    assert changes.changed_files(outcome)["files"][0]["file"] == "transformers/masking_utils.py"  # the boundary search
    cached = runner.bisect("sft", recipe | {"model_init_kwargs": {}}, "transformers", "4.53.0", "4.53.1", pins=pins)
    assert (cached.first, cached.exit_code) == (None, 0)
    assert cached.measured["4.53.1"].record["attention"]["pattern"] == "causal (124 tokens)"


@pytest.mark.slow
def test_lesson_04s_right_padding_guard_is_found_where_it_appears_and_where_it_goes():
    """DPO on a tiny Qwen2 with FlashAttention-2 (re-created: flash-attn needs a GPU), trl 0.17.0 (which passes no
    use_cache, TRL #3306) beside every transformers: the step raises in every version, and what it raises is the
    record. 4.48.x reach the missing kernel (past the checks); 4.49.0 is the first where the guard's ValueError comes
    first, and 4.53.0 the first past it again. The same window on a tiny Llama (no guard in its modeling file) does
    not change: the change is Qwen2's."""
    recipe = {"model_name_or_path": "Qwen/Qwen2-0.5B-Instruct", "attn_implementation": "flash_attention_2"}
    recipe["per_device_train_batch_size"] = 2
    pins = ["trl==0.17.0", "peft==0.15.2", "accelerate==1.6.0", "datasets", "rich"]  # era 04-transformers-4.51's
    appears = runner.bisect("dpo", recipe, "transformers", "4.48.0", "4.49.0", pins=pins)
    assert (appears.first, appears.last_same, appears.part) == ("4.49.0", "4.48.3", "error")
    assert appears.measured["4.49.0"].record["raised"].startswith(GUARD)
    assert appears.measured["4.48.3"].record["recipe_notes"]["recreated"].startswith("flash_attention_2")
    goes = runner.bisect("dpo", recipe, "transformers", "4.51.3", "4.53.0", pins=pins)
    assert (goes.first, goes.last_same, goes.part) == ("4.53.0", "4.52.4", "error")
    assert not goes.measured["4.53.0"].record["raised"].startswith("ValueError")
    llama = recipe | {"model_name_or_path": "meta-llama/Llama-3.2-1B"}
    llama = runner.bisect("dpo", llama, "transformers", "4.48.3", "4.49.0", pins=pins)
    assert (llama.first, llama.exit_code) == (None, 0)


@pytest.mark.slow
def test_lesson_08s_prompt_in_loss_window_is_found_unaided():
    """TRL #6105 (lesson 08's first part; era 06-trl-0.24's pins, transformers 5.5.0): SFT on conversational
    prompt-completion rows, trl 0.24.0 good (the buggy end: its prompt ids are a two-key BatchEncoding, so the
    completion mask trains the prompt), 0.27.1 bad: the first change is 0.27.1, in the batch (its labels mask the
    prompt), then the label count, and the check-up's prompt_in_loss verdict goes from fail to ok."""
    pins = ["transformers==5.5.0", "peft==0.21.2", "accelerate==1.15.0", "datasets==5.2.0"]
    recipe = {"per_device_train_batch_size": 2}
    outcome = runner.bisect("sft", recipe, "trl", "0.24.0", "0.27.1", pins=pins, data="conversational")
    assert (outcome.first, outcome.last_same, outcome.part) == ("0.27.1", "0.27.0", "batch")
    assert outcome.measured["0.27.1"].parts == ["batch", "label count", "loss scale", "verdict"]
    before, after = (outcome.measured[v].record for v in ("0.27.0", "0.27.1"))
    assert before["label_tokens"] > after["label_tokens"] > 0  # the prompt tokens leave the loss
    said = {v: outcome.measured[v].record["verdicts"]["prompt_in_loss"]["status"] for v in ("0.27.0", "0.27.1")}
    assert said == {"0.27.0": "fail", "0.27.1": "ok"}
    assert [f["file"] for f in changes.changed_files(outcome)["files"]] == ["trl/trainer/sft_trainer.py"]


@pytest.mark.slow
def test_trl_and_transformers_upgraded_together_name_the_release_that_trained_the_prompt():
    """A user upgrades trl 0.24.0 -> 0.26.0 and transformers 4.57.1 -> 5.5.0 at once and the SFT loss on chats
    changes: the path moves trl first (nothing changes beside 4.57.1), then transformers, and names 5.0.0 (TRL
    #6105: 5.0.0's apply_chat_template returns a BatchEncoding where trl 0.26.0 counted a list)."""
    moves = [("trl", "0.24.0", "0.26.0"), ("transformers", "4.57.1", "5.5.0")]
    pins = ["peft", "accelerate", "datasets"]
    outcome = runner.bisect_together("sft", {"per_device_train_batch_size": 2}, moves, pins=pins, data="conversational")
    assert outcome.first == "trl 0.26.0 + transformers 5.0.0" and outcome.part == "batch"
    assert outcome.last_same == "trl 0.26.0 + transformers 4.57.6"
    said = [
        outcome.measured[v].record["verdicts"]["prompt_in_loss"]["status"] for v in (outcome.last_same, outcome.first)
    ]
    assert said == ["ok", "fail"] and len(outcome.versions) == 15 and len(outcome.measured) <= 5
