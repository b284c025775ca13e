"""Run the zoo: each recipe adapted (``adapt.py``) and checked under its launch, and each of its broken twins.

    python zoo/run.py [NAME ...] [--twins] [--out FOLDER] [--json results.json] [--table docs/zoo.md]
    python zoo/run.py --from results.json [--from rerun.json] --table docs/zoo.md   # the table from runs' results

A recipe passes when ``trl-clinic checkup`` under its launch exits 0 (no probe failed, none crashed); a twin is
caught when its probe fails (or warns, for a probe that only warns) in a one-process check-up of the twin. Every
process's exit code is read, and they must agree (``Result.codes``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

ZOO = Path(__file__).resolve().parent
sys.path.insert(0, str(ZOO))
for key, value in (("HF_HUB_OFFLINE", "1"), ("HF_DATASETS_OFFLINE", "1"), ("OMP_NUM_THREADS", "1")):
    os.environ.setdefault(key, value)  # the one-process runs happen here: as offline as the launched ones

import adapt  # noqa: E402
import twins  # noqa: E402

TIMEOUT = 900  # seconds a launch may take: 2 processes starting torch, TRL and DeepSpeed on 2 busy cores


@dataclass
class Result:
    name: str
    twin: str | None
    launch: str  # "DeepSpeed ZeRO-3, 2 processes", ...
    exit_code: int | None  # the launcher's
    report: dict | None  # the check-up's JSON (the main process printed it)
    seconds: float
    changes: int
    tail: str = ""  # the output's end, when something went wrong
    verdicts: dict[str, str] = field(default_factory=dict)  # probe -> status

    @property
    def failed(self) -> list[str]:
        return [probe for probe, status in self.verdicts.items() if status in ("fail", "error")]


def last_json(text: str) -> dict | None:
    """The last JSON object printed at the start of a line (the check-up's ``--json`` report)."""
    lines = text.splitlines()
    for start in reversed([i for i, line in enumerate(lines) if line == "{"]):
        for end in range(start + 1, len(lines)):
            if lines[end] == "}":
                try:
                    return json.loads("\n".join(lines[start : end + 1]))
                except json.JSONDecodeError:
                    break
    return None


def described(adapted: adapt.Adapted) -> str:
    launch = adapted.launch
    name = {"single": "one process", "ddp": "DDP", "fsdp": "FSDP", "deepspeed": "DeepSpeed"}[launch["engine"]]
    return name if launch["processes"] == 1 else f"{name}, {launch['processes']} processes"


def check_here(adapted: adapt.Adapted) -> Result:
    """The check-up on a one-process run in this process: TRL's own script builds the trainer from the config (as
    ``trl-clinic checkup`` does), a twin's hook changes it, the check-up examines it. The same verdicts as the command,
    without starting Python, torch and TRL again for each of the zoo's 170-odd one-process runs."""
    import io
    from contextlib import redirect_stderr, redirect_stdout

    from accelerate.state import AcceleratorState, PartialState

    from trl_clinic.checkup import run_checkup
    from trl_clinic.checkup.command import checkup_from_command_line

    # accelerate's state is one per process: a run that set FSDP or DeepSpeed up (or failed half way) must not leave
    # it to the next (every one-process run of the zoo shares this process)
    AcceleratorState._reset_state(reset_partial_state=True)
    PartialState._reset_state()
    start, printed = time.perf_counter(), io.StringIO()
    argv = ["--config", str(adapted.folder / "config.yaml")]
    with redirect_stdout(printed), redirect_stderr(printed):
        if adapted.hook is None:
            report = checkup_from_command_line(adapted.kind, argv, show=False)
        else:
            from trl_clinic.checkup.command import build_trainer

            trainer = build_trainer(adapted.kind, argv)
            twins.HOOKS[adapted.hook](trainer)
            report = run_checkup(trainer, show=False)
    as_dict = report.to_dict()
    result = Result(
        adapted.name,
        adapted.twin,
        described(adapted),
        report.exit_code,
        as_dict,
        time.perf_counter() - start,
        len(adapted.changes),
        verdicts=verdicts_of(as_dict),
    )
    if report.exit_code != 0:
        result.tail = printed.getvalue()[-3000:]
    return result


def verdicts_of(report: dict | None) -> dict[str, str]:
    """probe -> its status, a fail or error winning over the other findings of the same probe."""
    verdicts = {}
    for finding in (report or {}).get("findings", []):
        verdicts.setdefault(finding["probe"], finding["status"])
        if finding["status"] in ("fail", "error"):
            verdicts[finding["probe"]] = finding["status"]
    return verdicts


def check(adapted: adapt.Adapted, timeout: int = TIMEOUT) -> Result:
    """``trl-clinic checkup`` on an adapted recipe under its launch (in this process when the launch is one
    process: ``check_here``)."""
    if adapted.launch["processes"] == 1:
        return check_here(adapted)
    start = time.perf_counter()
    try:
        done = subprocess.run(
            adapted.command(),
            cwd=adapted.folder,
            env=adapted.environment(),
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        output, code = done.stdout + "\n" + done.stderr, done.returncode
    except subprocess.TimeoutExpired as expired:
        output, code = f"timed out after {timeout} s\n{expired.stdout or ''}{expired.stderr or ''}", None
    report = last_json(output if isinstance(output, str) else output.decode())
    result = Result(
        adapted.name,
        adapted.twin,
        described(adapted),
        code,
        report,
        time.perf_counter() - start,
        len(adapted.changes),
        verdicts=verdicts_of(report),
    )
    if code != 0 or report is None:
        result.tail = re.sub(r"\x1b\[[0-9;]*m", "", output)[-3000:]
    return result


def authored(name: str) -> str:
    """The launch the recipe's author used, in words."""
    recipe = adapt.load(name)
    launch, settings = adapt.launch_of(recipe, name.split("/")[0])
    stage = ((settings or {}).get("deepspeed_config") or (settings or {}).get("deepspeed") or {}).get("zero_stage")
    engine = {"single": "one process", "ddp": "DDP", "fsdp": "FSDP", "deepspeed": f"DeepSpeed ZeRO-{stage}"}
    count = launch["processes"]
    return engine[launch["engine"]] + ("" if launch["engine"] == "single" else f", {count or 'every'} GPU")


def source_link(name: str) -> str:
    recipe = adapt.load(name)
    repo, commit = recipe["source"]["repo"], recipe["source"]["commit"]
    path, file = next(iter(recipe["source"]["files"].items()))
    lines = f"#L{file['lines'].replace('-', '-L')}" if "lines" in file else ""
    return f"[{repo}](https://github.com/{repo}/blob/{commit}/{path}{lines})"


def table(results: list[dict]) -> str:
    """docs/zoo.md: every recipe as launched, and every twin, from a run's results."""
    healthy = [r for r in results if not r["twin"]]
    caught = [r for r in results if r["twin"]]
    passed = sum(r["exit_code"] == 0 and not r["failed"] for r in healthy)
    seen = sum(twins.TWINS[r["twin"]].expect in statuses(r, twins.TWINS[r["twin"]].probe) for r in caught)
    lines = [
        "# The recipe zoo: the check-up on public recipes as their authors launch them",
        "",
        "Written by `python zoo/run.py --twins --json zoo.json --table docs/zoo.md` (zoo/README.md says what the",
        "zoo is and how each recipe was adapted). Each recipe ran on a tiny model of its family, under its author's",
        "launch on 2 processes of a 2-core CPU (one process where the author used one).",
        f"**{passed} of {len(healthy)} recipes pass; {seen} of {len(caught)} twins are caught.**",
        "",
        "| recipe | source | kind | family | author's launch | run here | verdict | s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in healthy:
        recipe = adapt.load(r["name"])
        bad = ", ".join(f"{p} {s}" for p, s in r["verdicts"].items() if s in ("fail", "error", "warn")) or "-"
        verdict = ("pass" if r["exit_code"] == 0 and not r["failed"] else f"**exit {r['exit_code']}**") + f" ({bad})"
        lines.append(
            f"| {r['name']} | {source_link(r['name'])} | {recipe['kind']} | {recipe['family']} | {authored(r['name'])} "
            f"| {r['launch']} | {verdict} | {r['seconds']:.0f} |"
        )
    lines += [
        "",
        "## Broken twins",
        "",
        "| recipe | twin | the bug it stands for | probe says | s |",
        "|---|---|---|---|---|",
    ]
    for r in caught:
        twin = twins.TWINS[r["twin"]]
        said = "/".join(sorted(statuses(r, twin.probe))) or "nothing"
        lines.append(f"| {r['name']} | {r['twin']} | {twin.bug} | {twin.probe} {said} | {r['seconds']:.0f} |")
    return "\n".join(lines) + "\n"


def statuses(result: dict, probe: str) -> set[str]:
    return {f["status"] for f in (result["report"] or {}).get("findings", []) if f["probe"] == probe}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", help="recipes (COLLECTION/NAME); all when none")
    parser.add_argument("--twins", action="store_true", help="also check every broken twin")
    parser.add_argument("--out", type=Path, default=Path("zoo-output"))
    parser.add_argument("--json", type=Path, help="write every result here")
    parser.add_argument("--table", type=Path, help="write the markdown table here (docs/zoo.md)")
    parser.add_argument(
        "--from",
        dest="sources",
        type=Path,
        action="append",
        help="read the results of earlier runs instead (repeatable: a later run's result replaces an earlier one's)",
    )
    options = parser.parse_args()
    if options.sources:
        merged = {}
        for source in options.sources:
            merged.update({(r["name"], r["twin"]): r for r in json.loads(source.read_text())})
        if options.json:
            options.json.write_text(json.dumps(list(merged.values()), indent=2, default=str))
        options.table.write_text(table(list(merged.values())))
        return
    records = []

    def record(result: Result) -> None:
        """Keep a result, and write the JSON so far: an interrupted hour-long run keeps what it measured."""
        records.append({**asdict(result), "failed": result.failed})
        if options.json:
            options.json.write_text(json.dumps(records, indent=2, default=str))

    for name in options.names or adapt.names():
        folder = options.out / name.replace("/", "__")
        result = check(adapt.adapt(name, folder))
        record(result)
        print(
            f"{name}: {result.launch}, exit {result.exit_code}, {result.seconds:.0f} s, failed {result.failed}",
            flush=True,
        )
        if options.twins:
            for probe in twins.applicable(adapt.load(name)):
                twin = check(adapt.adapt(name, folder.with_name(folder.name + f"--{probe}"), twin=probe))
                record(twin)
                print(f"  twin {probe}: {twin.verdicts.get(twins.TWINS[probe].probe)}", flush=True)
    if options.table:
        options.table.write_text(table(records))


if __name__ == "__main__":
    main()
