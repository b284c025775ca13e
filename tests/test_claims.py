"""The claims register (claims/register.yaml, issue 47), without network: its shape, every anchor still in its
file, the checker's verdicts on wheels built here, and the completeness of the scanned prose.

Completeness: every library version (three-part anywhere, "TRL 0.14" after a package name) and every
`file.py:N` in a scanned file must lie inside an anchor of the register, and a citation's anchor covers only the
versions that citation reads (a thread or an exemption covers what it holds). `SCANNED` lists the files held to
that; `PENDING` the prose in this test's scope not yet registered, which a later change moves into `SCANNED` as it
registers them; `GENERATED` what another file writes, with where its claims come from. A file of the scope in
none of the three fails, so new prose cannot slip by unlisted.

The lessons are in scope by their folders (src/trl_clinic/course/lessons/lesson_*/): the notebooks' text sources
(core.py, deeper.py, solution.py), the cheat-sheet card (card.md) and lesson.yaml (its README row and the sizes'
comments), the companions, then.py, the checks' and mutations' docstrings, and the eras' pins (eras/*.txt: the
comment header is prose; a pin line `name==version` is the era's input, not a claim, and prose.py skips it).
numbers*.json are measurements, not prose. README's table, docs/cheatsheet.md and notebooks/ are written from the
folders (`python -m trl_clinic.course.generate`), so a lesson's claim is registered in its folder and, where the
README or the cheat sheet repeats it, there too. `make claims` (tools/claims/check.py, network) reads every quote
in the wheels; `make test-slow` runs it.
"""

import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools" / "claims"))

import check  # noqa: E402
import prose  # noqa: E402
import register  # noqa: E402

SCANNED = [
    "README.md",
    "docs/bisect.md",
    "docs/cheatsheet.md",
    "docs/checkup.md",
    "docs/cost.md",
    "docs/versions.md",
    "docs/watch.md",
    "docs/workshop.md",
    "src/trl_clinic/checkup/known_bugs.yaml",
    "src/trl_clinic/checkup/__init__.py",
    "src/trl_clinic/checkup/accumulation.py",
    "src/trl_clinic/checkup/command.py",
    "src/trl_clinic/checkup/engine.py",
    "src/trl_clinic/checkup/grpo.py",
    "src/trl_clinic/checkup/gspo.py",
    "src/trl_clinic/checkup/known_bugs.py",
    "src/trl_clinic/checkup/labels.py",
    "src/trl_clinic/checkup/packing.py",
    "src/trl_clinic/checkup/padding.py",
    "src/trl_clinic/checkup/pairs.py",
    "src/trl_clinic/checkup/precision.py",
    "src/trl_clinic/checkup/prompts.py",
    "src/trl_clinic/checkup/replicas.py",
    "src/trl_clinic/checkup/sharded.py",
    "src/trl_clinic/checkup/step.py",
    "src/trl_clinic/checkup/turns.py",
    "src/trl_clinic/checkup/updates.py",
    "src/trl_clinic/checkup/view.py",
    "src/trl_clinic/probes/__init__.py",
    "src/trl_clinic/probes/batches.py",
    "src/trl_clinic/probes/command.py",
    "src/trl_clinic/probes/finding.py",
    "src/trl_clinic/probes/gradients.py",
    "src/trl_clinic/probes/jsonable.py",
    "src/trl_clinic/probes/labels.py",
    "src/trl_clinic/probes/launch.py",
    "src/trl_clinic/probes/nonfinite.py",
    "src/trl_clinic/probes/packing.py",
    "src/trl_clinic/probes/padding.py",
    "src/trl_clinic/probes/processes.py",
    "src/trl_clinic/probes/recording.py",
    "src/trl_clinic/watch/__init__.py",
    "src/trl_clinic/watch/alerts.py",
    "src/trl_clinic/watch/callback.py",
    "src/trl_clinic/watch/command.py",
    "src/trl_clinic/watch/config.py",
    "src/trl_clinic/watch/findings.py",
    "src/trl_clinic/watch/forwards.py",
    "src/trl_clinic/watch/report.py",
    "src/trl_clinic/probes/environments.py",
    "src/trl_clinic/course/lessons/lesson_01_padding_free/core.py",
    "src/trl_clinic/course/lessons/lesson_02_accumulation/core.py",
    "src/trl_clinic/course/lessons/lesson_02b_accumulation_ddp/core.py",
    "src/trl_clinic/course/lessons/lesson_03_reward_nan/core.py",
    "src/trl_clinic/course/lessons/lesson_04_padding_side/core.py",
    "src/trl_clinic/course/lessons/lesson_05_grpo_crash/core.py",
    "src/trl_clinic/course/lessons/lesson_06_checkup_tour/core.py",
    "src/trl_clinic/course/lessons/lesson_07_watch/core.py",
    "src/trl_clinic/course/lessons/lesson_08_silent_failures/core.py",
    "src/trl_clinic/course/lessons/lesson_01_padding_free/card.md",
    "src/trl_clinic/course/lessons/lesson_02_accumulation/card.md",
    "src/trl_clinic/course/lessons/lesson_02b_accumulation_ddp/card.md",
    "src/trl_clinic/course/lessons/lesson_03_reward_nan/card.md",
    "src/trl_clinic/course/lessons/lesson_04_padding_side/card.md",
    "src/trl_clinic/course/lessons/lesson_05_grpo_crash/card.md",
    "src/trl_clinic/course/lessons/lesson_06_checkup_tour/card.md",
    "src/trl_clinic/course/lessons/lesson_07_watch/card.md",
    "src/trl_clinic/course/lessons/lesson_08_silent_failures/card.md",
    "src/trl_clinic/course/lessons/lesson_01_padding_free/lesson.yaml",
    "src/trl_clinic/course/lessons/lesson_02_accumulation/lesson.yaml",
    "src/trl_clinic/course/lessons/lesson_02b_accumulation_ddp/lesson.yaml",
    "src/trl_clinic/course/lessons/lesson_03_reward_nan/lesson.yaml",
    "src/trl_clinic/course/lessons/lesson_04_padding_side/lesson.yaml",
    "src/trl_clinic/course/lessons/lesson_05_grpo_crash/lesson.yaml",
    "src/trl_clinic/course/lessons/lesson_06_checkup_tour/lesson.yaml",
    "src/trl_clinic/course/lessons/lesson_07_watch/lesson.yaml",
    "src/trl_clinic/course/lessons/lesson_08_silent_failures/lesson.yaml",
    "src/trl_clinic/course/lessons/lesson_01_padding_free/deeper.py",
    "src/trl_clinic/course/lessons/lesson_02_accumulation/deeper.py",
    "src/trl_clinic/course/lessons/lesson_03_reward_nan/deeper.py",
    "src/trl_clinic/course/lessons/lesson_05_grpo_crash/deeper.py",
    "src/trl_clinic/course/lessons/lesson_06_checkup_tour/deeper.py",
    "src/trl_clinic/course/lessons/lesson_06_checkup_tour/eras/06-trl-0.24.txt",
    "src/trl_clinic/course/lessons/lesson_04_padding_side/deeper.py",
    "src/trl_clinic/course/lessons/lesson_01_padding_free/solution.py",
    "src/trl_clinic/course/lessons/lesson_02_accumulation/solution.py",
    "src/trl_clinic/course/lessons/lesson_02_accumulation/companion.py",
    "src/trl_clinic/course/lessons/lesson_02_accumulation/checks.py",
    "src/trl_clinic/course/lessons/lesson_02_accumulation/mutations.py",
    "src/trl_clinic/course/lessons/lesson_02b_accumulation_ddp/solution.py",
    "src/trl_clinic/course/lessons/lesson_02b_accumulation_ddp/checks.py",
    "src/trl_clinic/course/lessons/lesson_02b_accumulation_ddp/mutations.py",
    "src/trl_clinic/course/lessons/lesson_03_reward_nan/solution.py",
    "src/trl_clinic/course/lessons/lesson_03_reward_nan/checks.py",
    "src/trl_clinic/course/lessons/lesson_03_reward_nan/checks_deeper.py",
    "src/trl_clinic/course/lessons/lesson_04_padding_side/solution.py",
    "src/trl_clinic/course/lessons/lesson_04_padding_side/checks.py",
    "src/trl_clinic/course/lessons/lesson_04_padding_side/checks_deeper.py",
    "src/trl_clinic/course/lessons/lesson_05_grpo_crash/solution.py",
    "src/trl_clinic/course/lessons/lesson_05_grpo_crash/checks.py",
    "src/trl_clinic/course/lessons/lesson_05_grpo_crash/mutations.py",
    "src/trl_clinic/course/lessons/lesson_06_checkup_tour/solution.py",
    "src/trl_clinic/course/lessons/lesson_06_checkup_tour/companion.py",
    "src/trl_clinic/course/lessons/lesson_06_checkup_tour/checks.py",
    "src/trl_clinic/course/lessons/lesson_06_checkup_tour/checks_deeper.py",
    "src/trl_clinic/course/lessons/lesson_06_checkup_tour/mutations.py",
    "src/trl_clinic/course/lessons/lesson_07_watch/solution.py",
    "src/trl_clinic/course/lessons/lesson_07_watch/companion.py",
    "src/trl_clinic/course/lessons/lesson_07_watch/checks.py",
    "src/trl_clinic/course/lessons/lesson_08_silent_failures/solution.py",
    "src/trl_clinic/course/lessons/lesson_08_silent_failures/then.py",
    "src/trl_clinic/course/lessons/lesson_08_silent_failures/companion.py",
    "src/trl_clinic/course/lessons/lesson_08_silent_failures/eras/08-trl-1.14.txt",
    "src/trl_clinic/course/lessons/lesson_08_silent_failures/eras/08-trl-1.16.txt",
    "src/trl_clinic/course/lessons/lesson_01_padding_free/then.py",
    "src/trl_clinic/course/lessons/lesson_02_accumulation/then.py",
    "src/trl_clinic/course/lessons/lesson_05_grpo_crash/then.py",
    "src/trl_clinic/course/lessons/lesson_04_padding_side/then.py",
    "src/trl_clinic/course/lessons/lesson_01_padding_free/companion.py",
    "src/trl_clinic/course/lessons/lesson_02_accumulation/companion_deeper.py",
    "src/trl_clinic/course/lessons/lesson_02b_accumulation_ddp/companion.py",
    "src/trl_clinic/course/lessons/lesson_03_reward_nan/companion.py",
    "src/trl_clinic/course/lessons/lesson_04_padding_side/companion.py",
    "src/trl_clinic/course/lessons/lesson_05_grpo_crash/companion.py",
    "src/trl_clinic/course/lessons/lesson_01_padding_free/eras/01-trl-0.14.txt",
    "src/trl_clinic/course/lessons/lesson_01_padding_free/eras/01-transformers-4.55.txt",
    "src/trl_clinic/course/lessons/lesson_02_accumulation/eras/02-transformers-4.45.txt",
    "src/trl_clinic/course/lessons/lesson_04_padding_side/eras/04-transformers-4.40.txt",
    "src/trl_clinic/course/lessons/lesson_04_padding_side/eras/04-transformers-4.51.txt",
    "src/trl_clinic/course/lessons/lesson_01_padding_free/checks.py",
    "src/trl_clinic/course/lessons/lesson_01_padding_free/checks_deeper.py",
    "src/trl_clinic/course/lessons/lesson_01_padding_free/mutations.py",
    "src/trl_clinic/course/lessons/lesson_01_padding_free/mutations_deeper.py",
    "src/trl_clinic/course/lessons/lesson_02_accumulation/checks_deeper.py",
    "src/trl_clinic/course/lessons/lesson_02_accumulation/mutations_deeper.py",
    "src/trl_clinic/course/lessons/lesson_03_reward_nan/mutations.py",
    "src/trl_clinic/course/lessons/lesson_03_reward_nan/mutations_deeper.py",
    "src/trl_clinic/course/lessons/lesson_04_padding_side/mutations.py",
    "src/trl_clinic/course/lessons/lesson_04_padding_side/mutations_deeper.py",
    "src/trl_clinic/course/lessons/lesson_05_grpo_crash/checks_deeper.py",
    "src/trl_clinic/course/lessons/lesson_05_grpo_crash/mutations_deeper.py",
    "src/trl_clinic/course/lessons/lesson_06_checkup_tour/mutations_deeper.py",
    "src/trl_clinic/course/lessons/lesson_07_watch/mutations.py",
    "src/trl_clinic/course/lessons/lesson_08_silent_failures/checks.py",
    "src/trl_clinic/course/lessons/lesson_08_silent_failures/mutations.py",
    "src/trl_clinic/cli.py",
    "src/trl_clinic/course/child.py",
    "src/trl_clinic/course/crash.py",
    "src/trl_clinic/course/data.py",
    "src/trl_clinic/course/deck.py",
    "src/trl_clinic/course/doctor.py",
    "src/trl_clinic/course/examples.py",
    "src/trl_clinic/course/executed.py",
    "src/trl_clinic/course/generate.py",
    "src/trl_clinic/course/gpu_usage.py",
    "src/trl_clinic/course/hosted.py",
    "src/trl_clinic/course/mutations.py",
    "src/trl_clinic/course/parameters.py",
    "src/trl_clinic/course/paths.py",
    "src/trl_clinic/course/plotting.py",
    "src/trl_clinic/course/profiles.py",
    "src/trl_clinic/course/report.py",
    "src/trl_clinic/course/results.py",
    "src/trl_clinic/course/run.py",
    "src/trl_clinic/course/tokenizer.py",
    "src/trl_clinic/course/workbook.py",
    "src/trl_clinic/course/eras/__main__.py",
    "src/trl_clinic/course/eras/runner.py",
    "src/trl_clinic/course/eras/spec.py",
    "src/trl_clinic/bisect/changes.py",
    "src/trl_clinic/bisect/environments.py",
    "src/trl_clinic/bisect/records.py",
    "src/trl_clinic/bisect/report.py",
    "src/trl_clinic/bisect/runner.py",
    "src/trl_clinic/bisect/__init__.py",
    "src/trl_clinic/bisect/command.py",
    "src/trl_clinic/bisect/first_step.py",
    "src/trl_clinic/bisect/search.py",
    "src/trl_clinic/bisect/versions.py",
    "src/trl_clinic/__init__.py",
    "src/trl_clinic/course/__init__.py",
    "src/trl_clinic/course/handshake.py",
    "src/trl_clinic/course/launch.py",
    "src/trl_clinic/course/models.py",
    "src/trl_clinic/course/preflight.py",
    "src/trl_clinic/course/runtime.py",
    "src/trl_clinic/course/stand_ins.py",
    "src/trl_clinic/course/wheelhouse.py",
    "src/trl_clinic/course/eras/__init__.py",
    "src/trl_clinic/course/eras/build.py",
    "CONTRIBUTING.md",
    "zoo/README.md",
    "zoo/adapt.py",
    "zoo/data.py",
    "zoo/families.py",
    "zoo/hooked.py",
    "zoo/recipes/SOURCES.md",
    "zoo/run.py",
    "zoo/transcribe.py",
    "zoo/twins.py",
    "zoo/zoo_rewards.py",
]
PENDING: list[str] = []  # prose in scope not yet registered: each moves to SCANNED as its claims are cited
GENERATED = {
    "docs/zoo.md": "written by zoo/run.py from a zoo run's results; its sentences are the twins' descriptions in zoo/",
}


# A lesson folder's prose: everything but __init__.py (a one-line title) and numbers*.json (measurements)
LESSON_PROSE = (
    "core.py",
    "deeper.py",
    "solution.py",
    "card.md",
    "lesson.yaml",
    "companion*.py",
    "then.py",
    "checks*.py",
    "mutations*.py",
    "eras/*.txt",
)


def scope() -> list[str]:
    """The prose this test holds to the register: README, docs/ (not the executed notebooks), the known-bugs table,
    the library's modules (fix texts and docstrings of the check-up, the probes and the watch; the package's top
    level, the course's shared modules and eras, the bisect), CONTRIBUTING.md, and each lesson's folder, where the
    notebooks, README's table and the cheat sheet are written from; the recipe zoo's code and notes (its recipes'
    YAML files are the authors' settings, transcribed, with the adaptations' reasons: data, not prose)."""
    paths = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "src/trl_clinic/checkup/known_bugs.yaml"]
    for room in ("checkup", "probes", "watch"):
        paths += sorted((ROOT / "src" / "trl_clinic" / room).glob("*.py"))
    paths += [ROOT / "CONTRIBUTING.md", *sorted((ROOT / "src" / "trl_clinic").glob("*.py"))]
    for room in ("course", "course/eras", "bisect"):
        paths += sorted((ROOT / "src" / "trl_clinic" / room).glob("*.py"))
    for folder in sorted((ROOT / "src" / "trl_clinic" / "course" / "lessons").glob("lesson_*")):
        paths += [path for pattern in LESSON_PROSE for path in sorted(folder.glob(pattern))]
    paths += [ROOT / "zoo/README.md", *sorted((ROOT / "zoo").glob("*.py")), ROOT / "zoo/recipes/SOURCES.md"]
    return [str(p.relative_to(ROOT)) for p in paths]


@pytest.fixture(scope="module")
def claims() -> register.Register:
    return register.load()


def test_the_register_loads_with_unique_ids_and_quoted_versions(claims):
    assert claims.citations and claims.threads
    for citation in claims.citations:
        assert citation.where and (citation.quotes or citation.counts), citation.id
        for quote in citation.quotes:
            assert quote.path.startswith(quote.package.replace("-", "_") + "/"), (citation.id, quote.path)


def test_every_anchor_is_still_in_its_file(claims):
    missing = prose.missing_anchors(claims, ROOT)
    assert not missing, "sentences edited or moved; their citations must follow:\n" + "\n".join(map(str, missing))


def test_every_count_names_a_script_that_exists(claims):
    from counts import SCRIPTS

    named = {count.script for citation in claims.citations for count in citation.counts}
    assert named and named <= set(SCRIPTS), named - set(SCRIPTS)


def test_the_guard_count_counts_families_not_files():
    from counts import right_padding_guard_families

    guard = "You are attempting to perform batched generation with padding_side='right'"
    files = {
        "transformers/models/qwen2/modeling_qwen2.py": guard,
        "transformers/models/qwen2/modeling_qwen2_extra.py": guard,
        "transformers/models/llama/modeling_llama.py": "no guard",
        "transformers/models/mimi/configuration_mimi.py": guard,
    }
    assert right_padding_guard_families(files, files.get) == 1


def test_a_version_yaml_reads_as_a_number_is_refused(tmp_path):
    path = tmp_path / "register.yaml"
    path.write_text(
        "citations:\n- id: x\n  where: {file: README.md, anchor: TRL}\n"
        "  quotes: [{package: trl, path: trl/a.py, text: b, present_in: [0.16]}]\n"
    )
    with pytest.raises(register.RegisterError, match="quoted string"):
        register.load(path)


def test_a_thread_needs_the_date_it_was_read(tmp_path):
    path = tmp_path / "register.yaml"
    path.write_text(
        "threads:\n- id: t\n  url: https://github.com/a/b/issues/1\n  quote: said\n"
        "  where: {file: README.md, anchor: TRL}\n"
    )
    with pytest.raises(register.RegisterError, match="date"):
        register.load(path)


@pytest.mark.parametrize(
    "text, said",
    [
        (
            "threads:\n- id: t\n  url: https://github.com/a/b/issues/1\n  quote: said\n  read: 2026-12-02\n"
            "  where: [{file: README.md, anchor: TRL}, {file: README.md, anchor: TRL}]\n",
            "one sentence twice",
        ),
        (
            "exempt:\n- {where: {file: README.md, anchor: TRL}, reason: r}\n"
            "- {where: {file: README.md, anchor: TRL}, reason: r}\n",
            "exempted twice",
        ),
    ],
)
def test_a_sentence_named_twice_in_one_entry_or_exempted_twice_is_refused(tmp_path, text, said):
    path = tmp_path / "register.yaml"
    path.write_text(text)
    with pytest.raises(register.RegisterError, match=said):
        register.load(path)


def make_wheel(folder: Path, version: str, text: str | None) -> None:
    """A wheel of the package `fakepkg` whose `fakepkg/mod.py` holds `text` (no file where None)."""
    with zipfile.ZipFile(folder / f"fakepkg-{version}-py3-none-any.whl", "w") as archive:
        archive.writestr("fakepkg/__init__.py", "")
        if text is not None:
            archive.writestr("fakepkg/mod.py", text)


def test_the_checker_fails_a_quote_missing_inside_or_present_outside_its_window(tmp_path):
    make_wheel(tmp_path, "1.0.0", "x = 1\n")
    make_wheel(tmp_path, "1.1.0", "def f():\n    if fixed:\n        return  True\n")
    make_wheel(tmp_path, "1.2.0", "def f():\n    if fixed: return True\n")
    make_wheel(tmp_path, "2.0.0", None)
    at = register._at
    quote = register.Quote(
        "fakepkg", "fakepkg/mod.py", "if fixed: return True", (at("1.1.0:2-3", "t"), at("1.2.0", "t")), ()
    )
    assert check.quote_failures(quote, tmp_path) == []  # whitespace folded, line range honoured
    wrong_lines = register.Quote("fakepkg", "fakepkg/mod.py", "if fixed:", (at("1.1.0:1", "t"),), ())
    assert check.quote_failures(wrong_lines, tmp_path) == ["fakepkg 1.1.0 fakepkg/mod.py:1-1: 'if fixed:' not found"]
    window = register.Quote(
        "fakepkg",
        "fakepkg/mod.py",
        "if fixed:",
        (at("1.0.0", "t"), at("1.1.0", "t")),
        (at("1.2.0", "t"), at("2.0.0", "t")),
    )
    assert check.quote_failures(window, tmp_path) == [
        "fakepkg 1.0.0 fakepkg/mod.py: 'if fixed:' not found",
        "fakepkg 1.2.0 fakepkg/mod.py: 'if fixed:' present, cited as absent",
    ]


def test_the_scanner_finds_versions_and_file_lines_and_leaves_other_numbers():
    text = (
        "TRL 0.14 with transformers 4.48.3 and trl>=0.23.1 (trainer.py:3675-3676); 4.46.0-4.48.0; "
        "tolerance 2e-2, healthy 0.0099, 6.0x, 1.5 s, `02-transformers-4.46-undivided-mean`"
    )
    assert [m.text for m in prose.mentions(text)] == [
        "0.14",
        "4.48.3",
        "0.23.1",
        "trainer.py:3675-3676",
        "4.46.0",
        "4.48.0",
    ]


def test_an_era_files_pins_are_no_mentions_but_its_header_is_prose(tmp_path):
    era = tmp_path / "eras" / "01-x.txt"
    era.parent.mkdir()
    era.write_text("# trl 0.14.0 on transformers 4.48.3\ntrl==0.14.0\ntorch==2.13.0\nrich\n")
    empty = register.Register((), (), ())
    assert [m.text for m in prose.uncited(era, "eras/01-x.txt", empty)] == ["0.14.0", "4.48.3"]


def test_every_file_in_scope_is_scanned_pending_or_generated():
    listed = set(SCANNED) | set(PENDING) | set(GENERATED)
    assert not set(SCANNED) & set(PENDING)
    assert sorted(set(scope()) - listed) == [], "new prose: add it to SCANNED (registered) or PENDING"
    assert sorted(listed - set(scope())) == [], "listed files that are gone or out of scope"


@pytest.mark.parametrize("path", SCANNED)
def test_every_version_and_file_line_in_the_scanned_prose_is_cited(path, claims):
    uncited = prose.uncited(ROOT / path, path, claims)
    assert not uncited, f"{path}: cite these in claims/register.yaml (or exempt them, saying why):\n" + "\n".join(
        f"  line {m.line}: {m.text}" for m in uncited
    )
