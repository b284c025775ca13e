"""A number README's table or a doc quotes from a lesson's run is the number the executed copy shows (AUDIT H.7).

README's row for 02 once quoted "3.79 against 3.61 after 15 steps" while the executed copies showed 1.813/1.342 and
2.281/1.958 after 40: the row was written from an earlier run and nothing compared them. Each lesson's ``lesson.yaml``
now lists its ``quotes``: the text as README's row (or the doc named by ``in``) quotes it, and the output of the
executed copy (``docs/executed/``, cpu profile, seed 0) it is read from, one fragment or several (a table's cell
wraps across lines). The test finds the text where it is quoted, every fragment in the copy's outputs, and each
number of the text among the fragments' numbers, to the digits the text shows ("5.55" for 5.554, "7.3e-4" for
0.000732). When ``make executed`` refreshes the copies, a quote whose output changed fails here until its text, and
the row or the doc, follow.
"""

import re
from pathlib import Path

import nbformat
import pytest
from test_screen import output_lines

from trl_clinic.course.generate import readme_row
from trl_clinic.course.lessons import Lesson, lessons

ROOT = Path(__file__).resolve().parents[1]
# a number as a quote writes it: 6.0, 498, 1.2e+34, 7.3e-4; not the digits of a name (fp16) or a version's tail (.3)
NUMBER = re.compile(r"(?<![\w.])\d+(?:\.\d+)?(?:e[+-]?\d+)?")
QUOTING = [(key, lesson) for key, lesson in lessons().items() if lesson.quotes]


def flat(text: str) -> str:
    """``text`` with every run of whitespace one space: a quote reads the same across a wrapped line."""
    return " ".join(text.split())


def shown(notebook: str) -> str:
    """Everything the executed copy of ``notebook`` printed, as one flat text."""
    copy = nbformat.read(ROOT / "docs" / "executed" / f"{notebook}.ipynb", as_version=4)
    return flat(" ".join(line for cell in copy.cells if cell.cell_type == "code" for line in output_lines(cell)))


def page(lesson: Lesson, quote: dict) -> str:
    """Where the quote is: its core's row of README's table, or the doc ``in`` names."""
    return flat(readme_row(lesson) if "in" not in quote else (ROOT / quote["in"]).read_text())


def rounds_to(value: str, written: str) -> bool:
    """Whether ``value`` shows as ``written`` at the digits ``written`` has (mantissa digits in e-notation)."""
    mantissa = written.split("e")[0]
    digits = len(mantissa.split(".")[1]) if "." in mantissa else 0
    shape = f".{digits}e" if "e" in written else f".{digits}f"
    return float(format(float(value), shape)) == float(written)


def unread(text: str, fragments: list[str]) -> list[str]:
    """The numbers of ``text`` that no number of the fragments shows (each fragment's number read once)."""
    pool = [number for fragment in fragments for number in NUMBER.findall(fragment)]
    missing = []
    for written in NUMBER.findall(text):
        match = next((number for number in pool if rounds_to(number, written)), None)
        if match is None:
            missing.append(written)
        else:
            pool.remove(match)
    return missing


def test_a_quoted_number_is_read_to_the_digits_it_shows():
    assert unread("5.55 against 4.28", ["grad_norm 5.554, batch 32 4.284"]) == []
    assert unread("first 7.3e-4, loss 1.2e+34", ["rounding 0.000732", "'1.232e+34'"]) == []
    assert unread("3.79 against 3.61 after 15 steps", ["without the fix 1.813, with it 1.342 after 40"]) == [
        "3.79",
        "3.61",
        "15",
    ]
    assert unread("`fp16_adamw` on transformers 4.48.3", []) == ["4.48"]


@pytest.mark.parametrize("key, lesson", QUOTING, ids=[key for key, _ in QUOTING])
def test_each_quote_is_where_it_is_quoted_and_in_the_executed_copy(key, lesson):
    printed = shown(lesson.notebook)
    problems = []
    for quote in lesson.quotes:
        fragments = [quote["output"]] if isinstance(quote["output"], str) else quote["output"]
        where = quote.get("in", "README.md's row")
        if flat(quote["text"]) not in page(lesson, quote):
            problems.append(f"{quote['text']!r} is not in {where}")
        absent = [fragment for fragment in fragments if flat(fragment) not in printed]
        problems += [f"{quote['text']!r}: {fragment!r} is not in the executed copy" for fragment in absent]
        if missing := unread(quote["text"], fragments):
            problems.append(f"{quote['text']!r} ({where}): {missing} are not in its output {fragments}")
    assert not problems, f"lesson {key} ({lesson.notebook}):\n" + "\n".join(problems)
