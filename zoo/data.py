"""Each recipe's training data, generated from a seed in the format its dataset has (``recipe['data']``): the rows
the trainer receives have the columns and the shape of the recipe's dataset (conversational or not, one turn or
several, pairs with an implicit or an explicit prompt), over the course's small world of people and facts, so the
tiny vocabulary covers them and a sequence stays short.

Where the format allows it, rows vary as real ones do: answers of one word and of several sentences, every fifth
conversation with a second exchange, and every third preferred answer five times as long (as the check-up's own
tests vary them: tests/test_checkup_reported.py, ``varied_pairs``), so micro-batches hold different numbers of label
tokens and an assistant turn is followed by another turn.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from trl_clinic.course.data import instruction_pairs, preference_pairs

FORMATS = (
    "messages",
    "text",
    "prompt-completion",
    "prompt-completion-conversational",
    "preference-implicit",
    "preference",
    "preference-conversational",
    "unpaired",
    "prompt",
)


def _turns(prompt: str, completion: str) -> list[dict]:
    return [{"role": "user", "content": prompt.strip()}, {"role": "assistant", "content": completion.strip()}]


def rows(data: str, n: int, seed: int = 0, system: str | None = None) -> list[dict]:
    """``n`` rows of format ``data``; ``system``: a system message first in every conversational prompt (open-r1's
    ``system_prompt``)."""
    if data not in FORMATS:
        raise ValueError(f"unknown data format {data!r}: one of {', '.join(FORMATS)}")
    head = [{"role": "system", "content": system}] if system else []
    pairs = list(instruction_pairs(n + n // 5 + 1, seed=seed))
    if data == "messages":
        out = []
        for i in range(n):
            turns = head + _turns(pairs[i]["prompt"], pairs[i]["completion"])
            if i % 5 == 4:
                extra = pairs[n + i // 5]
                turns += _turns(extra["prompt"], extra["completion"])
            out.append({"messages": turns})
        return out
    if data == "text":
        return [{"text": (p["prompt"] + p["completion"]).strip()} for p in pairs[:n]]
    if data == "prompt-completion":
        return [{"prompt": p["prompt"], "completion": p["completion"]} for p in pairs[:n]]
    if data == "prompt-completion-conversational":
        return [
            {"prompt": head + _turns(p["prompt"], "")[:1], "completion": _turns("", p["completion"])[1:]}
            for p in pairs[:n]
        ]
    if data == "prompt":
        return [{"prompt": head + _turns(p["prompt"], "")[:1], "solution": p["completion"].strip()} for p in pairs[:n]]
    prefs = [
        {**p, "chosen": p["chosen"] * 5} if i % 3 == 0 else p for i, p in enumerate(preference_pairs(n, seed=seed))
    ]
    if data == "preference":
        return [{"prompt": p["prompt"], "chosen": p["chosen"], "rejected": p["rejected"]} for p in prefs]
    if data == "preference-implicit":
        return [
            {"chosen": head + _turns(p["prompt"], p["chosen"]), "rejected": head + _turns(p["prompt"], p["rejected"])}
            for p in prefs
        ]
    if data == "preference-conversational":
        return [
            {
                "prompt": head + _turns(p["prompt"], "")[:1],
                "chosen": _turns("", p["chosen"])[1:],
                "rejected": _turns("", p["rejected"])[1:],
            }
            for p in prefs
        ]
    rng = random.Random(seed)  # unpaired (KTO): each pair's answers apart, labelled, in a shuffled order
    out = [
        {"prompt": head + _turns(p["prompt"], "")[:1], "completion": _turns("", p[side])[1:], "label": side == "chosen"}
        for p in prefs
        for side in ("chosen", "rejected")
    ]
    rng.shuffle(out)
    return out[:n]


def write(data: str, n: int, folder: Path, seed: int = 0, system: str | None = None) -> Path:
    """The rows as ``folder/train.jsonl``: a local dataset ``load_dataset(folder)`` reads offline."""
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "train.jsonl", "w") as handle:
        for row in rows(data, n, seed, system):
            handle.write(json.dumps(row) + "\n")
    return folder
