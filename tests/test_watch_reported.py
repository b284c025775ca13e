"""The watch on failures reported on today's stack: DPO whose margins never leave 0 (read from the logs TRL writes),
packed rows through linear-attention layers, and findings raised as trackio and W&B alerts (offline: trackio's local
database and W&B's offline run file; nothing is sent over the network)."""

import math
import struct
import time
import zlib
from pathlib import Path

import pytest
from test_checkup_reported import dpo, flattening_trainer, make_linear_attention_lm, preamble_pairs

from trl_clinic.course import examples
from trl_clinic.course.models import make_causal_lm
from trl_clinic.course.tokenizer import build_tokenizer
from trl_clinic.watch import ClinicWatch


def watched(trainer, **options):
    watch = ClinicWatch(show=False, trainer=trainer, **options)
    trainer.add_callback(watch)
    trainer.train()
    return watch


def one(watch, key):
    found = [f for f in watch.findings if f.probe == key]
    return found[0] if found else None


# --- dpo_flat: TRL's rewards/margins, rewards/accuracies, logps/* -------------------------------------------------


def dpo_run(tokenizer, tmp_path, **config):
    settings = {"max_steps": 12, "logging_steps": 1, "per_device_train_batch_size": 4, "learning_rate": 1e-3}
    return dpo(tokenizer, tmp_path, preamble_pairs(48), **{**settings, **config})


def test_dpo_flat_trips_on_pairs_cut_identical_and_names_them(tokenizer, tmp_path):
    watch = watched(dpo_run(tokenizer, tmp_path, max_length=64))
    flat = one(watch, "dpo_flat")
    assert flat is not None and flat.decided == "measured" and flat.step == 11
    assert "same tokens" in flat.cause and "identical_pairs" in flat.fix
    assert flat.numbers["margin"] == 0.0 and math.isclose(flat.numbers["loss"], math.log(2), abs_tol=1e-6)


def test_dpo_flat_trips_on_a_frozen_policy_and_names_the_reference(tokenizer, tmp_path):
    flat = one(watched(dpo_run(tokenizer, tmp_path, max_length=None, learning_rate=0.0)), "dpo_flat")
    assert flat is not None and "equals its reference" in flat.cause


def test_dpo_flat_passes_a_run_whose_margins_move(tokenizer, tmp_path):
    watch = watched(dpo_run(tokenizer, tmp_path, max_length=None))
    assert one(watch, "dpo_flat") is None
    assert watch.checks["dpo_flat"].startswith("rewards/margins moved off 0")
    sft = watched(examples.sft_trainer(tokenizer, tmp_path, max_steps=2))
    assert sft.checks["dpo_flat"] == "not logged (not a DPO run)"


# --- packing through linear-attention layers ------------------------------------------------------------------


def test_packing_finding_on_linear_attention_without_sequence_boundaries(tmp_path):
    """Before, the watch read the full-attention layer's (correct) block mask and said 'packed rows kept apart'."""
    tokenizer = build_tokenizer()
    leaky = watched(flattening_trainer(tokenizer, tmp_path, make_linear_attention_lm(tokenizer, "qwen3_next")))
    found = one(leaky, "packing")
    assert found is not None and found.decided == "config" and found.numbers["linear_layers"] == 3
    assert "seq_idx" in found.measured and "return_seq_idx=True" in found.fix
    llama = watched(flattening_trainer(tokenizer, tmp_path, make_causal_lm(tokenizer)))
    assert one(llama, "packing") is None and llama.checks["packing"].startswith("packed rows kept apart")


# --- alerts: trackio and W&B, offline ---------------------------------------------------------------------------


def wandb_records(path) -> list:
    """The whole records of a W&B offline run file, in order: a 7-byte header, then LevelDB-log blocks of 32 KiB whose
    records carry a 7-byte header (crc32 seeded with the type byte, length, type: 1 whole, 2 first, 3 middle, 4
    last). W&B's service can still be writing the file when ``wandb.finish()`` returns, so reading stops at the
    first record whose bytes are not all there yet (short, or failing its crc) instead of parsing half a record."""
    from wandb.proto import wandb_internal_pb2

    if not Path(path).exists():
        return []
    data, pos, pending, records = Path(path).read_bytes(), 7, b"", []
    while pos + 7 <= len(data):
        left = 32768 - pos % 32768
        if left < 7:
            pos += left
            continue
        crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if length == 0 and kind == 0:
            pos += left
            continue
        chunk, pos = data[pos + 7 : pos + 7 + length], pos + 7 + length
        if len(chunk) < length or zlib.crc32(chunk, zlib.crc32(bytes([kind]))) != crc:
            break
        pending = chunk if kind in (1, 2) else pending + chunk
        if kind in (1, 4):
            records.append(wandb_internal_pb2.Record.FromString(pending))
    return records


@pytest.fixture
def offline_trackers(tmp_path, monkeypatch):
    """trackio's database and W&B's run files in tmp_path; W&B offline; no hub."""
    monkeypatch.setenv("TRACKIO_DIR", str(tmp_path / "trackio"))
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb"))
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_DISABLE_CODE", "true")
    import sys

    import trackio.run
    import trackio.sqlite_storage  # noqa: F401 - loaded, so its copy of TRACKIO_DIR is replaced below

    # trackio's modules copy TRACKIO_DIR from the environment at import: point every copy at tmp_path
    for name, module in list(sys.modules.items()):
        if name.split(".")[0] == "trackio" and hasattr(module, "TRACKIO_DIR"):
            monkeypatch.setattr(module, "TRACKIO_DIR", tmp_path / "trackio")
    return tmp_path


def test_findings_reach_trackio_and_wandb_as_alerts_offline(tokenizer, offline_trackers):
    from trackio.sqlite_storage import SQLiteStorage

    out = offline_trackers
    trainer = dpo_run(
        tokenizer, out / "out", max_length=64, report_to=["trackio", "wandb"], project="clinic-alerts", run_name="r"
    )
    watch = watched(trainer)
    import wandb

    assert wandb.run is not None  # the Trainer's WandbCallback leaves its run open after train()
    # W&B's settings are read once a process: a run earlier in this worker can have fixed another WANDB_DIR, so the
    # run says where its file goes
    run_file = wandb.run.settings.sync_file
    wandb.finish()
    assert one(watch, "dpo_flat") is not None
    stored = SQLiteStorage.get_alerts("clinic-alerts")
    assert [a["title"] for a in stored] == ["trl-clinic: dpo_flat"] and stored[0]["level"] == "warn"
    assert stored[0]["step"] == 11 and "identical" in stored[0]["text"]
    deadline = time.monotonic() + 30  # the run file is whole once W&B's service has written its exit record
    records = wandb_records(run_file)
    while not any(record.HasField("exit") for record in records):
        assert time.monotonic() < deadline, f"no exit record in {run_file} after 30 s ({len(records)} records)"
        time.sleep(0.2)
        records = wandb_records(run_file)
    alerts = [record.alert for record in records if record.HasField("alert")]
    assert [(a.title, a.level) for a in alerts] == [("trl-clinic: dpo_flat", "WARN")] and "identical" in alerts[0].text


def test_no_alert_without_a_tracker():
    """A run that reports nowhere: no tracker among its callbacks, so a finding is neither sent nor kept waiting."""
    from trl_clinic.probes.finding import Finding
    from trl_clinic.watch.alerts import send, trackers

    class Printer:  # a callback that is not a tracker (transformers' PrinterCallback, say)
        pass

    made = Finding("dpo_flat", "warn", "pairs identical", decided="measured", step=11)
    assert trackers([Printer()]) == [] and send([(made, "dpo_flat: identical")], [Printer()]) == []


def test_no_alert_when_turned_off(tokenizer, offline_trackers):
    from trackio.sqlite_storage import SQLiteStorage

    out = offline_trackers
    trainer = dpo_run(tokenizer, out / "out", max_length=64, report_to=["trackio"], project="clinic-quiet")
    watch = watched(trainer, alerts=False)
    assert one(watch, "dpo_flat") is not None and SQLiteStorage.get_alerts("clinic-quiet") == []
