"""The presenter's deck: one slide per core (symptom, mechanism figure, fix, check), one HTML file that opens
offline in any browser (``make deck``, ``docs/deck.html``).

Nothing on a slide is written here: the title and report come from the lesson's ``lesson.yaml``, the figure named by the
lesson's ``figure`` key from the executed copies (``docs/executed/figures/<notebook>/``, linked by a relative
path so the file stays small and the figures stay the measured ones), and the symptom, fix and check from the
cheat sheet's entry for the lesson (``docs/cheatsheet.md``: its "Seen in the logs", "Fix" and "Check" lines).
Arrow keys, space or a click move between slides; the address's ``#NN`` opens one; printing gives a page each.
"""

from __future__ import annotations

import html
import re
import sys
from pathlib import Path

from trl_clinic.course.lessons import Lesson, lessons
from trl_clinic.course.paths import repo_root

DECK = Path("docs") / "deck.html"
CHEATSHEET = Path("docs") / "cheatsheet.md"
FIGURES = Path("docs") / "executed" / "figures"
PARTS = {"symptom": "Seen in the logs", "fix": "Fix", "check": "Check"}  # slide part: the cheat sheet's label

STYLE = """
body { margin: 0; font: 20px/1.4 system-ui, sans-serif; background: #222; }
section { display: none; box-sizing: border-box; width: 100vw; height: 100vh; padding: 3vh 4vw; background: #fff; }
section.shown { display: grid; grid-template-columns: 1fr 1fr; grid-template-rows: auto 1fr auto; gap: 1vh 3vw; }
section.title { grid-template-columns: 1fr; align-content: center; text-align: center; }
h1 { grid-column: 1 / -1; margin: 0; font-size: 1.6em; }
h1 a { font-size: 0.5em; font-weight: normal; color: #555; }
.parts p { margin: 0 0 1.2vh; }
.parts b { display: block; color: #b03a2e; }
figure { margin: 0; display: flex; align-items: center; justify-content: center; }
img { max-width: 100%; max-height: 70vh; }
footer { grid-column: 1 / -1; color: #777; font-size: 0.7em; }
code { background: #f3f3f3; padding: 0 0.2em; font-size: 0.9em; }
@media print { section { display: grid !important; page-break-after: always; height: auto; min-height: 100vh; } }
"""

SCRIPT = """
const slides = [...document.querySelectorAll("section")];
let current = Math.max(0, slides.findIndex(s => "#" + s.id === location.hash));
function show(i) {
  current = Math.min(Math.max(i, 0), slides.length - 1);
  slides.forEach((s, j) => s.classList.toggle("shown", j === current));
  history.replaceState(null, "", "#" + slides[current].id);
  document.body.dataset.slide = slides[current].id;
}
document.addEventListener("keydown", e => {
  if (["ArrowRight", "PageDown", " "].includes(e.key)) show(current + 1);
  if (["ArrowLeft", "PageUp"].includes(e.key)) show(current - 1);
});
document.addEventListener("click", () => show(current + 1));
show(current);
"""


def inline(markdown: str) -> str:
    """The cheat sheet's inline markdown (code, bold, links) as HTML; everything else escaped."""
    out, pos = [], 0
    for found in re.finditer(r"`([^`]+)`|\*\*(.+?)\*\*|\[([^\]]+)\]\(([^)]+)\)", markdown):
        out.append(html.escape(markdown[pos : found.start()]))
        code, bold, text, link = found.groups()
        if code is not None:
            out.append(f"<code>{html.escape(code)}</code>")
        elif bold is not None:
            out.append(f"<b>{html.escape(bold)}</b>")
        else:
            out.append(f'<a href="{html.escape(link)}">{html.escape(text)}</a>')
        pos = found.end()
    return "".join(out) + html.escape(markdown[pos:])


def cheatsheet_entries(text: str) -> dict[str, dict[str, str]]:
    """Lesson key -> {label: text} from the cheat sheet's entries (``**NN · title**`` then ``- **Label**: ...``)."""
    entries: dict[str, dict[str, str]] = {}
    for block in re.split(r"\n(?=\*\*\d\d\w* · )", text)[1:]:
        key = re.match(r"\*\*(\d\d\w*) · ", block).group(1)
        items = re.findall(r"^- \*\*(.+?)\*\*:?\s*(.*?)(?=^- \*\*|\Z)", block, re.M | re.S)
        entries[key] = {label: " ".join(body.split()) for label, body in items}
    return entries


def part(entry: dict[str, str], label: str, key: str) -> str:
    """The entry's text for a label (the first whose name starts with it: "Seen in the logs (no watch)")."""
    for name, text in entry.items():
        if name.startswith(label):
            return text
    raise ValueError(f"docs/cheatsheet.md: lesson {key} has no '{label}' line for the deck")


def slide(lesson: Lesson, entry: dict[str, str], root: Path) -> str:
    if lesson.figure is None:
        raise ValueError(f"{lesson.folder.name}/lesson.yaml: lesson {lesson.key} names no figure for the deck")
    figure = FIGURES / lesson.stem / lesson.figure
    if not (root / figure).is_file():
        raise FileNotFoundError(f"lesson {lesson.key}'s figure {figure} is missing: `make executed` writes it")
    parts = "".join(f"<p><b>{name}</b>{inline(part(entry, label, lesson.key))}</p>" for name, label in PARTS.items())
    src = figure.relative_to("docs").as_posix()  # the deck lies in docs/
    return (
        f'<section id="{lesson.key}">'
        f'<h1>{lesson.key} · {html.escape(lesson.title)} <a href="{html.escape(lesson.report)}">'
        f"{html.escape(lesson.report.removeprefix('https://github.com/'))}</a></h1>"
        f'<div class="parts">{parts}</div>'
        f'<figure><img src="{src}" alt="lesson {lesson.key}: {lesson.figure}"></figure>'
        f"<footer>notebooks/{lesson.notebook}.ipynb · {lesson.seconds['cpu']} s on the cpu profile "
        f"(lesson.yaml) · figure: docs/{src}</footer></section>"
    )


def deck(root: Path) -> str:
    """The whole deck as one HTML document, for the cores in key order."""
    entries = cheatsheet_entries((root / CHEATSHEET).read_text())
    cores = [lesson for lesson in lessons().values() if lesson.is_core]
    missing = [lesson.key for lesson in cores if lesson.key not in entries]
    if missing:
        raise ValueError(f"docs/cheatsheet.md has no entry for lesson {', '.join(missing)}")
    title = (
        '<section id="start" class="title"><h1>TRL Clinic</h1>'
        f"<p>{len(cores)} training failures: what the log shows, why, the fix, the check.</p>"
        "<p>→ or space: next slide · ←: back</p></section>"
    )
    slides = "".join(slide(lesson, entries[lesson.key], root) for lesson in cores)
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>TRL Clinic: the deck</title>'
        f"<style>{STYLE}</style></head><body>\n{title}\n{slides}\n<script>{SCRIPT}</script></body></html>\n"
    )


def main() -> int:
    root = repo_root()
    (root / DECK).write_text(deck(root))
    print(f"wrote {root / DECK}: open it in a browser (offline), → for the next slide")
    return 0


if __name__ == "__main__":
    sys.exit(main())
