"""The presenter's deck: one slide per core from lesson.yaml, the cheat sheet and the executed copies' figures,
opened offline in a real headless Chromium (Debian's, as the report's and JupyterLab's tests use)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import missing

from trl_clinic.course import deck
from trl_clinic.course.lessons import lessons

ROOT = Path(__file__).resolve().parents[1]
CORES = [lesson for lesson in lessons().values() if lesson.is_core]
CHROMIUM = Path("/usr/bin/chromium")


def test_the_committed_deck_is_what_its_sources_make():
    """docs/deck.html is `make deck`'s output for today's lesson.yaml, cheat sheet and figures."""
    assert (ROOT / deck.DECK).read_text() == deck.deck(ROOT), "run `make deck`"


def test_each_core_has_a_slide_with_its_symptom_figure_fix_and_check():
    page = deck.deck(ROOT)
    for lesson in CORES:
        found = re.search(rf'<section id="{lesson.key}">(.*?)</section>', page, re.S)
        assert found, f"no slide for lesson {lesson.key}"
        for name in deck.PARTS:
            assert f"<b>{name}</b>" in found.group(1)
        assert f'src="executed/figures/{lesson.stem}/{lesson.figure}"' in found.group(1)


def test_a_lesson_without_its_cheat_sheet_line_is_one_clear_error():
    entries = deck.cheatsheet_entries((ROOT / deck.CHEATSHEET).read_text())
    entries["02"].pop("Fix")
    with pytest.raises(ValueError, match="lesson 02 has no 'Fix' line"):
        deck.part(entries["02"], "Fix", "02")


def test_the_deck_opens_offline_in_a_headless_browser_and_steps_through_every_slide():
    if not CHROMIUM.exists():
        missing("chromium", f"needs Debian's chromium at {CHROMIUM} (`make browser` installs it when run as root)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="needs playwright (pip install -e '.[test]')")
    from test_learner_path import CHROMIUM_ARGS

    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 720})
            page.route(re.compile(r"^(?!file:)"), lambda route: route.abort())  # offline: nothing but files
            page.goto((ROOT / deck.DECK).as_uri())
            page.wait_for_load_state("load")
            images = page.eval_on_selector_all("img", "all => all.map(i => i.complete && i.naturalWidth > 0)")
            assert images == [True] * len(CORES), "a figure did not load"
            seen = [page.evaluate("document.body.dataset.slide")]
            for _ in CORES:
                page.keyboard.press("ArrowRight")
                seen.append(page.evaluate("document.body.dataset.slide"))
                shown = page.eval_on_selector_all("section.shown", "all => all.length")
                assert shown == 1
            assert seen == ["start", *(lesson.key for lesson in CORES)]
            page.goto((ROOT / deck.DECK).as_uri() + "#04")
            page.reload()
            assert page.evaluate("document.body.dataset.slide") == "04"
        finally:
            browser.close()
