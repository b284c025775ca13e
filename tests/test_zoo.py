"""The recipe zoo judges the check-up (zoo/README.md): public recipes, adapted to tiny models of their families and run
under the launch their authors used, pass with no probe failed and none crashed; each of their broken twins is caught
by its probe.

``make test`` checks every record's shape, adapts every recipe, and runs a rotating share: two recipes under their
launch and three twins, chosen by ``TRL_CLINIC_ROTATION`` (the index ``test_second_seed.py`` uses: CI can set it, and
the test ids name it, so a red share reruns with ``TRL_CLINIC_ROTATION=<index> make test``), else by today's date.
``make test-slow`` runs every recipe and every twin (marker ``slow``).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import yaml
from test_second_seed import rotation

ZOO = Path(__file__).resolve().parents[1] / "zoo"
sys.path.insert(0, str(ZOO))

import adapt  # noqa: E402
import data  # noqa: E402
import families  # noqa: E402
import run  # noqa: E402
import twins  # noqa: E402

NAMES = adapt.names()
TWINS = [(name, twin) for name in NAMES for twin in twins.applicable(adapt.load(name))]
INDEX = rotation()
SHARE = [NAMES[(INDEX * 7 + k * 31) % len(NAMES)] for k in range(2)]
TWIN_SHARE = [TWINS[(INDEX * 11 + k * 17) % len(TWINS)] for k in range(3)]
RERUN = f"TRL_CLINIC_ROTATION={INDEX} make test"


def rerun(what: str) -> str:
    return f"{what} (rerun: {RERUN}, or python zoo/run.py {what.split()[0]} --twins)"


# --- the records ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_every_recipe_names_its_sources_at_a_commit_with_their_hashes(name):
    recipe = adapt.load(name)
    assert re.fullmatch(r"[0-9a-f]{40}", recipe["source"]["commit"]) and "/" in recipe["source"]["repo"]
    assert recipe["source"]["files"]
    for path, file in recipe["source"]["files"].items():
        assert re.fullmatch(r"[0-9a-f]{64}", file["sha256"]), path
        assert "lines" not in file or re.fullmatch(r"\d+-\d+", file["lines"]), path
    assert recipe["kind"] in ("sft", "dpo", "reward", "grpo", "kto")
    assert recipe["family"] in families.FAMILIES and recipe["data"] in data.FORMATS
    assert isinstance(recipe["settings"], dict) and recipe["settings"], "the training settings, transcribed"
    assert recipe["launch"]["where"], "where the launch command is quoted from"
    named = recipe["launch"].get("accelerate") or recipe["launch"].get("deepspeed")
    if named:
        launches = yaml.safe_load((ZOO / "recipes" / name.split("/")[0] / "launches.yaml").read_text())
        assert named in launches, f"{name}: its launch config {named} is transcribed in launches.yaml"


def test_the_zoo_spans_the_collections_families_kinds_and_launches_the_issue_asks_for():
    recipes = [adapt.load(name) for name in NAMES]
    assert len(recipes) >= 40
    assert len({name.split("/")[0] for name in NAMES}) >= 4
    assert len({r["family"] for r in recipes}) >= 10
    assert {r["kind"] for r in recipes} == {"sft", "dpo", "reward", "grpo", "kto"}
    settings = [r["settings"] for r in recipes]
    for feature in (
        "use_peft",
        "load_in_4bit",
        "packing",
        "padding_free",
        "assistant_only_loss",
        "completion_only_loss",
    ):
        assert any(s.get(feature) for s in settings), feature
    engines = {adapt.launch_of(r, name.split("/")[0])[0]["engine"] for r, name in zip(recipes, NAMES)}
    assert {"single", "ddp", "deepspeed", "fsdp"} <= engines


def test_every_recipe_adapts_with_each_change_recorded(tmp_path):
    """Every recipe adapts: its config holds only arguments `trl <kind>` 1.16 takes, and every setting the author
    wrote is in the config unchanged or in a recorded change."""
    for name in NAMES:
        recipe = adapt.load(name)
        adapted = adapt.adapt(name, tmp_path / name.replace("/", "__"))
        known = adapt.known_keys(adapted.kind)
        assert set(adapted.config) <= set(known) | {"deepspeed"}, (name, set(adapted.config) - set(known))
        changed = {c.key for c in adapted.changes}
        for key, value in recipe["settings"].items():
            kept = adapted.config.get(adapt.RENAMED.get(key, key)) == value
            assert kept or key in changed or key in ("no_remove_unused_columns",), (name, key, value)
        record = yaml.safe_load((adapted.folder / "adapted.yaml").read_text())
        assert record["changes"] and record["command"], name
        assert (adapted.folder / "data" / "train.jsonl").exists()


# --- the runs ------------------------------------------------------------------------------------------------------


def assert_healthy(result: run.Result) -> None:
    assert result.report is not None, rerun(f"{result.name}: no report\n{result.tail}")
    findings = {f["probe"]: f for f in result.report["findings"] if f["status"] in ("fail", "error")}
    assert not findings, rerun(f"{result.name} under {result.launch}: {findings}")
    assert result.exit_code == 0, rerun(f"{result.name}: exit {result.exit_code}\n{result.tail}")


def assert_caught(result: run.Result, twin: str) -> None:
    expected = twins.TWINS[twin]
    assert result.report is not None, rerun(f"{result.name} twin {twin}: no report\n{result.tail}")
    found = [f for f in result.report["findings"] if f["probe"] == expected.probe]
    statuses = {f["status"] for f in found}
    assert expected.expect in statuses, rerun(f"{result.name} twin {twin}: {found}")
    errors = [f for f in result.report["findings"] if f["status"] == "error"]
    assert not errors, rerun(f"{result.name} twin {twin}: a probe crashed: {errors}")


@pytest.mark.parametrize("name", SHARE, ids=[f"{name}-rotation{INDEX}" for name in SHARE])
def test_todays_recipes_pass_the_checkup_as_launched(name, tmp_path):
    assert_healthy(run.check(adapt.adapt(name, tmp_path / "recipe")))


@pytest.mark.parametrize("name, twin", TWIN_SHARE, ids=[f"{n}-{t}-rotation{INDEX}" for n, t in TWIN_SHARE])
def test_todays_twins_are_caught(name, twin, tmp_path):
    assert_caught(run.check(adapt.adapt(name, tmp_path / "twin", twin=twin)), twin)


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_every_recipe_passes_the_checkup_as_launched(name, tmp_path):
    assert_healthy(run.check(adapt.adapt(name, tmp_path / "recipe")))


@pytest.mark.slow
@pytest.mark.parametrize("name, twin", TWINS, ids=[f"{n}-{t}" for n, t in TWINS])
def test_every_twin_is_caught(name, twin, tmp_path):
    assert_caught(run.check(adapt.adapt(name, tmp_path / "twin", twin=twin)), twin)


def test_the_zoo_table_in_docs_is_the_last_full_run_of_every_recipe_and_twin():
    """docs/zoo.md is written by `python zoo/run.py --twins --table docs/zoo.md` from a full run: every recipe and
    every twin has its row, and its headline counts are the table's."""
    text = (ZOO.parent / "docs" / "zoo.md").read_text()
    rows = [line for line in text.splitlines() if line.startswith("| ") and not line.startswith("| recipe")]
    recipes = [row.split(" | ")[0].removeprefix("| ") for row in rows if row.count(" | ") == 7]
    twin_rows = [tuple(row.split(" | ")[:2]) for row in rows if row.count(" | ") == 4]
    assert sorted(recipes) == NAMES
    assert sorted((name.removeprefix("| "), twin) for name, twin in twin_rows) == sorted(TWINS)
    passed = sum("| pass (" in row for row in rows if row.count(" | ") == 7)
    caught = sum(" fail |" in row or " warn |" in row for row in rows if row.count(" | ") == 4)
    headline = f"{passed} of {len(NAMES)} recipes pass; {caught} of {len(TWINS)} twins are caught."
    assert f"**{headline}**" in text
    assert headline in (ZOO.parent / "README.md").read_text(), "README quotes docs/zoo.md's headline"
