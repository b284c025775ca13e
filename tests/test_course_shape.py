"""Every lesson is a short core a learner finishes, and a deep dive that keeps the evidence (CONTRIBUTING.md,
"A lesson"). Measured on the percent-format sources in each lesson's folder, as a learner meets them.

A core (``notebooks/NN_*.ipynb``):
* opens in about 120 words or fewer: a title, **You will learn** (3 bullets), **You should know** (one line),
  **Time** (the measured cpu run from lesson.yaml, 60 s or less, and the working time);
* shows the symptom as a user meets it by its third code cell (tag ``symptom``), draws the mechanism (tag
  ``mechanism``), gives the fix as the lines a user changes (tag ``fix``), a portable check of 15 lines or
  fewer (tag ``portable-check``) beside the ``checkup`` probe that does the same, and one bad-vs-fixed figure
  (tag ``figure``);
* recaps in five bullets or fewer, then 2-3 exercises, each with a hint and a starter code cell (tag
  ``exercise``), and a worked-solutions notebook at ``notebooks/solutions/<core>.ipynb``;
* about 900 words of prose or fewer, 18 code cells or fewer (median about 6 lines, none over 25), about six
  version numbers or fewer in the prose, the hosted install line counted as the project's before-stop hook counts it;
* calls into its companion (``companion.py`` in the lesson's folder) of eight helpers or fewer, so that the
  trainer configuration behind each symptom is written in the notebook, not hidden behind a helper;
* ends with its checks, introduced in one sentence, collapsed in JupyterLab, at most 10 % of its code lines:
  the numbers it recorded handed to ``check(run, numbers)``, which runs the lesson folder's checks.py and shows one
  line per group, then "all checks passed" (or that the lesson is incomplete).
A deep dive (``notebooks/deeper/NN_*.ipynb``) opens with one line on what its core showed (a link to the core),
keeps its code cells on a screen, and ends with its checks the same way.
"""

import ast
import re
import statistics
from pathlib import Path

import jupytext
import nbformat
import pytest

from trl_clinic.course.hosted import INSTALL_MARK
from trl_clinic.course.lessons import lessons
from trl_clinic.course.results import lesson_checks

ROOT = Path(__file__).resolve().parents[1]
TABLE = lessons()
CORES = {key: lesson for key, lesson in TABLE.items() if lesson.is_core}
DEEP_DIVES = {key: lesson for key, lesson in TABLE.items() if not lesson.is_core}

WORDS_BEFORE_CODE = 120
PROSE_WORDS = 900
CODE_CELLS = 18
MEDIAN_CODE_LINES = 6
MAX_CODE_LINES = 25
VERSION_NUMBERS = 6
PORTABLE_CHECK_LINES = 15
CORE_SECONDS = 60
SYMPTOM_BY_CODE_CELL = 3
VERSION = re.compile(r"\b\d+\.\d+(?:\.\d+)?\b")  # as the project's before-stop hook counts them


def source(lesson) -> Path:
    return lesson.source


def cells(lesson):
    return jupytext.read(source(lesson)).cells


def story(text: str) -> str:
    """Without the hosted notebook's install line, whose words the opening still counts: the parts the opening
    must hold (title, what you learn, need and spend) are read in the story, which trl_clinic.course.hosted does
    not write."""
    return "\n".join(line for line in text.splitlines() if INSTALL_MARK not in line)


def prose(cell) -> str:
    """A markdown cell whole, the install line included: what a learner reads, and what the before-stop hook counts."""
    return cell.source if cell.cell_type == "markdown" else ""


def lines(cell) -> int:
    return len([line for line in cell.source.strip("\n").splitlines() if line.strip()])


def code(lesson):
    return [cell for cell in cells(lesson) if cell.cell_type == "code"]


def tagged(lesson, tag: str) -> list[int]:
    return [i for i, cell in enumerate(cells(lesson)) if tag in cell.metadata.get("tags", [])]


def code_index(lesson, tag: str) -> list[int]:
    return [i for i, cell in enumerate(code(lesson)) if tag in cell.metadata.get("tags", [])]


def test_every_core_has_a_deep_dive_or_says_why_not():
    """A core without a deep dive says why in its lesson.yaml (``one_notebook:``), so a new lesson touches no list."""
    for key, lesson in CORES.items():
        assert f"{key}-deeper" in TABLE or lesson.one_notebook, f"lesson {key} has no deep dive ({key}-deeper)"
        assert not (f"{key}-deeper" in TABLE and lesson.one_notebook), f"lesson {key} has a deep dive, yet says none"


# ---- the core -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("key", CORES)
def test_the_opening_is_short_and_says_what_you_learn_need_and_spend(key):
    lesson = CORES[key]
    opening = []
    for cell in cells(lesson):
        if cell.cell_type == "code":
            break
        opening.append(cell.source)
    whole = "\n".join(opening)
    text = story(whole)
    words = len(whole.split())  # the install line included, as a learner reads it and the hook counts
    assert words <= WORDS_BEFORE_CODE, f"{lesson.stem}: {words} words before the first code cell"
    assert re.match(r"#\s", text), f"{lesson.stem} opens without a title"
    learn = re.search(r"\*\*You will learn\*\*(.*?)\*\*You should know\*\*", text, re.S)
    assert learn and len(re.findall(r"^[*-] ", learn.group(1), re.M)) == 3, f"{lesson.stem}: three things to learn"
    know = re.search(r"\*\*You should know\*\*:?(.*?)\*\*Time\*\*", text, re.S)
    assert know and len([line for line in know.group(1).strip().splitlines() if line.strip()]) == 1, (
        f"{lesson.stem}: what you should know, in one line"
    )
    time_line = re.sub(r"\s+", " ", text[text.index("**Time**") :])
    seconds = lesson.seconds["cpu"]
    assert seconds is not None and seconds <= CORE_SECONDS, f"{lesson.stem}: its cpu run is {seconds} s (lesson.yaml)"
    assert f"{seconds} s" in time_line and "minutes" in time_line, (
        f"{lesson.stem}: the Time line gives the measured run ({seconds} s, lesson.yaml) and the working time"
    )


@pytest.mark.parametrize("key", CORES)
def test_the_story_has_its_symptom_mechanism_fix_check_and_figure(key):
    lesson = CORES[key]
    symptom = code_index(lesson, "symptom")
    assert symptom and symptom[0] < SYMPTOM_BY_CODE_CELL, (
        f"{lesson.stem}: the symptom (tag 'symptom') must come by code cell {SYMPTOM_BY_CODE_CELL}"
    )
    for tag in ("mechanism", "fix", "figure"):
        assert tagged(lesson, tag), f"{lesson.stem}: no cell tagged {tag!r}"
    assert min(tagged(lesson, "mechanism")) > min(tagged(lesson, "symptom")), f"{lesson.stem}: symptom before mechanism"
    [check] = [cells(lesson)[i] for i in tagged(lesson, "portable-check")]
    assert check.cell_type == "code" and lines(check) <= PORTABLE_CHECK_LINES, (
        f"{lesson.stem}: the portable check is one code cell of {PORTABLE_CHECK_LINES} lines or fewer"
    )
    assert "trl_clinic" not in check.source, f"{lesson.stem}: the portable check is plain torch/TRL"
    assert "checkup" in source(lesson).read_text(), f"{lesson.stem}: name the checkup probe that does the same"


@pytest.mark.parametrize("key", CORES)
def test_the_core_is_short(key):
    lesson = CORES[key]
    text = " ".join(prose(cell) for cell in cells(lesson))
    assert len(text.split()) <= PROSE_WORDS, f"{lesson.stem}: {len(text.split())} words of prose"
    versions = VERSION.findall(text)
    assert len(versions) <= VERSION_NUMBERS, f"{lesson.stem}: {len(versions)} version numbers in prose: {versions}"
    sizes = [lines(cell) for cell in code(lesson)]
    assert len(sizes) <= CODE_CELLS, f"{lesson.stem}: {len(sizes)} code cells"
    assert max(sizes) <= MAX_CODE_LINES, f"{lesson.stem}: a code cell of {max(sizes)} lines"
    assert statistics.median(sizes) <= MEDIAN_CODE_LINES, f"{lesson.stem}: median code cell {statistics.median(sizes)}"


COMPANION_HELPERS = 8
LESSONS = "trl_clinic.course.lessons.lesson_"


def is_companion(module: str | None) -> bool:
    """A lesson's companion module: ``trl_clinic.course.lessons.lesson_NN_<topic>.companion`` (or ``_deeper``)."""
    return (module or "").startswith(LESSONS) and module.rsplit(".", 1)[-1].startswith("companion")


def companion_helpers(cells: list[str]) -> list[str]:
    """The companion helpers the code cells use, in order, each once: ``companion.NAME`` on a module imported from
    a lesson's folder (constants in capitals are data, not helpers) and every name imported from a companion. A
    helper used again counts once: the learner reads what it does once, and the arguments that change
    (07's ``reward_trainer(run, pairs, dtype, name, **user_settings)``) are written at each call."""
    trees = [
        ast.parse("\n".join(line for line in cell.splitlines() if not line.lstrip().startswith(("%", "!"))))
        for cell in cells
    ]
    nodes = [node for tree in trees for node in ast.walk(tree)]
    modules, names = set(), set()
    for node in nodes:
        if (
            isinstance(node, ast.ImportFrom)
            and (node.module or "").startswith(LESSONS)
            and not is_companion(node.module)
        ):
            modules |= {alias.asname or alias.name for alias in node.names if alias.name.startswith("companion")}
        elif isinstance(node, ast.ImportFrom) and is_companion(node.module):
            names |= {alias.asname or alias.name for alias in node.names}
        elif isinstance(node, ast.Import):
            modules |= {alias.asname for alias in node.names if is_companion(alias.name) and alias.asname}
    used = []
    for node in nodes:
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in modules:
            if not node.attr.isupper():
                used.append(node.attr)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.id in names:
            used.append(node.id)
    return list(dict.fromkeys(used))


@pytest.mark.parametrize("key", CORES)
def test_a_core_leans_on_few_companion_helpers(key):
    """A core's body makes about eight calls into its companion or fewer: the rest (the trainer's config, the era
    it runs in, how a number is measured) is written in the notebook, where the learner reads it."""
    helpers = companion_helpers([cell.source for cell in code(CORES[key])])
    assert len(helpers) <= COMPANION_HELPERS, (
        f"{CORES[key].stem} uses {len(helpers)} companion helpers (at most {COMPANION_HELPERS}): {helpers}; write "
        "what the learner should see in the notebook, merge plumbing into one helper, or move evidence to the deep dive"
    )


def test_the_helper_count_sees_modules_names_and_repeats():
    cells = [
        "from trl_clinic.course.lessons.lesson_01_padding_free import companion as companion\n"
        "from trl_clinic.course.lessons.lesson_03_reward_nan.companion import keep_log\n"
        "a = companion.prepare(run, companion.ERA_OLD)\nb = list(map(companion.show_logs, [a]))",
        "%matplotlib inline\nkeep_log(a)\nkeep_log(b)\ncompanion.prepare(run)\nfrom trl_clinic.course import data",
        "data.preference_pairs(4)",
    ]
    assert companion_helpers(cells) == ["prepare", "show_logs", "keep_log"]


@pytest.mark.parametrize("key", CORES)
def test_recap_and_exercises_with_hints_starters_and_solutions(key):
    lesson = CORES[key]
    all_cells = cells(lesson)
    [recap] = [c.source for c in all_cells if c.cell_type == "markdown" and re.search(r"^#+ .*Recap", c.source, re.M)]
    assert 1 <= len(re.findall(r"^[*-] ", recap, re.M)) <= 5, f"{lesson.stem}: a recap of at most five bullets"
    [exercise] = [
        c.source for c in all_cells if c.cell_type == "markdown" and re.search(r"^#+ .*Exercises", c.source, re.M)
    ]
    items = re.split(r"^\d+\. ", exercise, flags=re.M)[1:]
    assert 2 <= len(items) <= 3, f"{lesson.stem}: 2-3 exercises, not {len(items)}"
    for number, item in enumerate(items, 1):
        assert "<summary>Hint</summary>" in item, f"{lesson.stem}: exercise {number} has no <details><summary>Hint"
    assert len(tagged(lesson, "exercise")) == len(items), (
        f"{lesson.stem}: one starter code cell (tag 'exercise') per exercise"
    )
    solution = ROOT / "notebooks" / "solutions" / f"{lesson.stem}.ipynb"
    assert solution.exists(), f"{lesson.stem}: no worked solutions at {solution.relative_to(ROOT)}"
    assert f"solutions/{lesson.stem}.ipynb" in exercise, f"{lesson.stem}: the Exercises cell links its solutions"


# ---- every lesson notebook, core and deep dive ------------------------------------------------------------


@pytest.mark.parametrize("key", DEEP_DIVES)
def test_a_deep_dive_opens_with_what_its_core_showed(key):
    lesson = DEEP_DIVES[key]
    core = TABLE[key.removesuffix("-deeper")]
    opening = cells(lesson)[0]
    assert opening.cell_type == "markdown" and f"../{core.stem}.ipynb" in opening.source, (
        f"{lesson.stem}: open with one line on what the core showed, linking ../{core.stem}.ipynb"
    )
    long = [lines(c) for c in code(lesson) if lines(c) > MAX_CODE_LINES]
    assert not long, f"{lesson.stem}: code cells over {MAX_CODE_LINES} lines: {long}"


CHECKS_SHARE = 0.10  # of a notebook's code lines, at most, for its Checks section (issue 46: out of the learner's way)
CHECK_CALL = re.compile(r"^check\(run, numbers(, eras=\w+)?\)$")


def code_lines(cell) -> int:
    """Lines a learner reads as code: not blank, not a comment."""
    return len([line for line in cell.source.splitlines() if line.strip() and not line.strip().startswith("#")])


@pytest.mark.parametrize("key", TABLE)
def test_checks_come_last_collapsed_introduced_in_one_sentence_and_small(key):
    """The Checks section closes the notebook: one sentence, then at most two collapsed cells of at most 10 % of
    the notebook's code lines that record the numbers and end in ``check(run, numbers)``; the checks themselves
    live in the lesson's folder (checks.py), and the learner sees one line per group."""
    lesson = TABLE[key]
    all_cells = cells(lesson)
    heading = [i for i, cell in enumerate(all_cells) if cell.cell_type == "markdown" and "## Checks" in cell.source]
    assert len(heading) == 1, f"{lesson.stem}: one '## Checks' section"
    text = re.sub(r"^#+ .*$", "", all_cells[heading[0]].source, flags=re.M).strip()
    assert text and len(re.findall(r"[.!?](\s|$)", text)) == 1, f"{lesson.stem}: introduce the checks in one sentence"
    after = all_cells[heading[0] + 1 :]
    assert after and all(cell.cell_type == "code" for cell in after), f"{lesson.stem}: nothing to read after the checks"
    assert len(after) <= 2, f"{lesson.stem}: {len(after)} cells of checks (at most 2)"
    notebook = nbformat.read(ROOT / "notebooks" / f"{lesson.notebook}.ipynb", as_version=4)
    for i in range(heading[0] + 1, len(all_cells)):
        assert notebook.cells[i].metadata.get("jupyter", {}).get("source_hidden") is True, (
            f"{lesson.stem}: checks cell {i + 1} is not collapsed (jupyter: {{source_hidden: true}})"
        )
    share = sum(code_lines(cell) for cell in after) / sum(code_lines(cell) for cell in code(lesson))
    assert share <= CHECKS_SHARE, f"{lesson.stem}: the checks take {share:.0%} of its code lines (at most 10 %)"
    last = after[-1].source.strip().splitlines()[-1]
    assert CHECK_CALL.match(last), f"{lesson.stem}'s last line is {last!r}, not check(run, numbers)"


@pytest.mark.parametrize("key", TABLE)
def test_the_report_gets_sentences_written_from_the_numbers(key):
    """The report shows each notebook's own summary, not raw metric keys: its checks module's summary(numbers)
    (tests/test_checks_can_fail.py calls it on a real run's numbers)."""
    text = source(TABLE[key]).read_text()
    assert callable(getattr(lesson_checks(key), "summary", None)), f"{key}: its checks module needs summary(numbers)"
    assert f'start_run("{key}", profile, seed, output_dir)' in text, f'{key}: start_run("{key}", ...)'
