"""``python -m trl_clinic.course.lessons new KEY TOPIC --from KEY``: a new lesson's folder, copied from another's.

The way to start lesson 09 (CONTRIBUTING.md, "Adding a lesson"): the copy runs, passes its checks and is picked up
by the workbook, the tests and ``make generated`` at once, and you change it from there. What names the old lesson
inside its files is renamed: the folder (imports of its companion), the key (``start_run("03")``, the deep dive's
``"03-deeper"``, the era script ``"then_03"``, the card's title), the notebooks' names, and its eras' names (an era's
name is unique, so the copy's pins build a venv of their own; delete ``eras/`` if the new lesson needs none).
"""

from __future__ import annotations

import argparse
import re
import shutil
import sys

from trl_clinic.course.lessons import DEEPER, FOLDER, HERE, lessons

TEXT = {".py", ".yaml", ".md", ".txt", ".json"}


def renamed(text: str, old: dict[str, str], new: dict[str, str]) -> str:
    """``text`` with every name of the old lesson replaced by the new one's: its folder and notebook names (the deep
    dive's notebook name holds the core's), and its key where it names the lesson: a quoted key (``"03"``,
    ``"03-deeper"``), the era script (``"then_03"``), an era (``"03-trl-0.14"``), the card's title and the folder's
    docstring. A bare 03 elsewhere (a number, a date) is left alone."""
    text = text.replace(old["folder"], new["folder"]).replace(old["stem"], new["stem"])
    key, to = re.escape(old["key"]), new["key"]
    text = re.sub(rf'(?<=")(then_)?{key}(?=(-deeper)?"|-[a-z]+-[0-9.]+")', lambda m: (m.group(1) or "") + to, text)
    text = re.sub(rf'^"""Lesson {key}\b', f'"""Lesson {to}', text)
    return re.sub(rf"^\*\*{key} · ", f"**{to} · ", text, flags=re.M)


def new_lesson(key: str, topic: str, source_key: str) -> list[str]:
    """Copy lesson ``source_key``'s folder to ``lesson_<key>_<topic>`` with its names renamed; the files written."""
    table = lessons()
    if source_key not in table or DEEPER in source_key:
        raise SystemExit(f"--from: no core {source_key!r}; cores: {', '.join(k for k in table if DEEPER not in k)}")
    target = HERE / f"lesson_{key}_{topic}"
    if not FOLDER.fullmatch(target.name):
        raise SystemExit(f"{target.name}: a key is digits and at most one letter (09, 02b), a topic is lower_case")
    if key in table or target.exists():
        raise SystemExit(f"lesson {key} exists already ({table[key].folder.name if key in table else target.name})")
    source = table[source_key]
    stem = f"{key}_{topic}"
    old = {"folder": source.folder.name, "stem": source.stem, "key": source_key}
    new = {"folder": target.name, "stem": stem, "key": key}
    shutil.copytree(source.folder, target, ignore=shutil.ignore_patterns("__pycache__"))
    written = []
    for path in sorted(target.rglob("*")):
        if path.is_file() and path.suffix in TEXT:
            path.write_text(renamed(path.read_text(), old, new))
        if path.parent.name == "eras" and path.name.startswith(f"{source_key}-"):
            path = path.rename(path.with_name(key + path.name[len(source_key) :]))
        written.append(str(path.relative_to(HERE)))
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trl_clinic.course.lessons", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    new = commands.add_parser("new", help="a new lesson's folder, copied from an existing lesson's")
    new.add_argument("key", help="the new lesson's key: 09, or 02c")
    new.add_argument("topic", help="a short lower_case topic: the folder is lesson_<key>_<topic>")
    new.add_argument("--from", dest="source", required=True, help="the lesson to copy (its key: 03)")
    options = parser.parse_args(argv)
    for path in new_lesson(options.key, options.topic, options.source):
        print(f"wrote {path}")
    print("next: `make generated` (notebooks, README's row, cheat sheet), then change the copy")
    return 0


if __name__ == "__main__":
    sys.exit(main())
