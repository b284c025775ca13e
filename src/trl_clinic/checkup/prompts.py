"""Probe: a completion-only loss that trains on the prompt.

TRL 0.24.0's SFTTrainer tokenized a conversational prompt with ``apply_chat_template(tokenize=True)`` and no
``return_dict``; from transformers 5.0.0 that returns a ``BatchEncoding``, so ``len(prompt_ids)`` was its number of
keys (2) and the completion mask began at the third token (TRL #6105; ``return_dict=False`` from trl 0.27.1).
Measured in trl 0.24.0 + transformers 5.5.0: every row warned "Mismatch between tokenized prompt...", and 174 of the
190 prompt tokens of the first 8 rows were trained; trl 1.16.0 + transformers 5.23.0: 0 of 190.

The probe does not trust how the trainer split prompt and completion: it renders the chat template's generation
prompt itself (the tokens ``add_generation_prompt=True`` adds, ``<|im_start|>assistant\\n`` in ChatML), finds them in
the trainer's own collated rows, and asks whether the labels train on them. That header ends every prompt, so in a
completion-only loss it is never a target, unless the template itself trains it: SmolLM3's template (the
alignment-handbook's smollm3 SFT recipe) writes ``<|im_start|>assistant\\n`` inside its ``{% generation %}`` block, so
its assistant mask (``return_assistant_tokens_mask``) holds the header. There the probe reads the user's header
instead (the tokens the template writes just before a user message's content), which no completion-only loss trains.
"""

from __future__ import annotations

import re

from trl_clinic.checkup.engine import Skip, probe
from trl_clinic.checkup.known_bugs import explain
from trl_clinic.checkup.turns import first_label_batches
from trl_clinic.checkup.view import TrainerView
from trl_clinic.probes.finding import Finding
from trl_clinic.probes.labels import targets

FAIL_SHARE = 0.5  # of the rows whose generation header is trained
GENERATION = re.compile(r"\{%-?\s*generation\s*-?%\}")  # the opening marker of a template's assistant mask


def generation_header(tokenizer) -> list[int]:
    """The tokens ``add_generation_prompt=True`` appends to a one-message conversation ([] without a template)."""
    if tokenizer is None or not getattr(tokenizer, "chat_template", None):
        return []
    messages = [{"role": "user", "content": "a"}]
    try:
        bare = tokenizer.apply_chat_template(messages, tokenize=True, return_dict=False)
        asked = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
    except Exception:  # noqa: BLE001 - a template that needs other roles or fields
        return []
    return asked[len(bare) :] if asked[: len(bare)] == bare else []


def _rendered(tokenizer, messages: list[dict], **options):
    return tokenizer.apply_chat_template(messages, tokenize=True, return_dict=True, **options)


def header_trained_by_template(tokenizer, header: list[int]) -> bool:
    """Whether the template's own assistant mask (``{% generation %}``) holds the generation header: the template
    means it to be trained. A template without generation markers holds nothing; it is not rendered for its mask,
    where transformers would warn in the user's session that it has no ``{% generation %}`` keyword."""
    if not GENERATION.search(str(getattr(tokenizer, "chat_template", None) or "")):  # a dict of named templates too
        return False
    try:
        rendered = _rendered(
            tokenizer,
            [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}],
            return_assistant_tokens_mask=True,
        )
    except Exception:  # noqa: BLE001 - no generation markers, or a template that needs more
        return False
    ids, mask, width = rendered["input_ids"], rendered.get("assistant_masks") or [], len(header)
    starts = [i for i in range(len(ids) - width + 1) if ids[i : i + width] == header]
    return bool(starts) and len(mask) == len(ids) and all(mask[i] for i in range(starts[-1], starts[-1] + width))


def user_header(tokenizer) -> list[int]:
    """The tokens the template writes just before a user message's content, from its last special token on
    (``<|im_start|>user\\n`` in ChatML); [] where none is found."""
    try:
        text = tokenizer.apply_chat_template([{"role": "user", "content": "QUESTION"}], tokenize=False)
    except Exception:  # noqa: BLE001 - a template that needs other roles or fields
        return []
    before = text[: text.find("QUESTION")]
    special = [t for t in tokenizer.all_special_tokens + list(tokenizer.get_added_vocab()) if t and t in before]
    if not special:
        return []
    start = max(before.rfind(t) for t in special)
    return tokenizer(before[start:], add_special_tokens=False)["input_ids"]


def prompt_anchor(tokenizer) -> tuple[list[int], str]:
    """What marks the prompt in a row: the generation header, or the user's header where the template trains the
    generation header itself."""
    header = generation_header(tokenizer)
    if header and header_trained_by_template(tokenizer, header):
        return user_header(tokenizer), "user header (the template trains its generation header)"
    return header, "generation header"


def _completion_only(view: TrainerView) -> bool:
    trainer, args = view.trainer, view.args
    said = [
        getattr(trainer, "completion_only_loss", None),
        getattr(trainer.data_collator, "completion_only_loss", None),
    ]
    return bool(getattr(args, "assistant_only_loss", False)) or any(value is True for value in said)


def trained_headers(batch: dict, header: list[int]) -> tuple[int, int]:
    """(rows whose generation header is trained, rows holding the header) of one collated batch."""
    mask, ids, width = targets(batch), batch["input_ids"].tolist(), len(header)
    holding = trained = 0
    for row, tokens in enumerate(ids):
        starts = [i for i in range(len(tokens) - width + 1) if tokens[i : i + width] == header]
        if starts:
            holding += 1
            trained += any(bool(mask[row, i : i + width].any()) for i in starts)
    return trained, holding


@probe(
    "prompt_in_loss",
    "08",
    "a completion-only loss (prompt-completion data, assistant_only_loss) whose labels train on the chat "
    "template's generation prompt, the header that ends every prompt: the completion mask starts inside the prompt "
    "(TRL #6105: trl < 0.27.1 with transformers >= 5.0.0 counted a BatchEncoding's keys as the prompt's length).",
)
def prompt_in_loss(view: TrainerView) -> Finding:
    if not _completion_only(view):
        raise Skip("the loss is not completion-only: the prompt is meant to be trained")
    header, named = prompt_anchor(view.tokenizer)
    if not header:
        raise Skip("no chat template with a generation prompt to find in the rows")
    batches = first_label_batches(view)
    counts = [trained_headers(batch, header) for batch in batches]
    trained, holding = sum(c[0] for c in counts), sum(c[1] for c in counts)
    if not holding:
        raise Skip("the rows hold no generation prompt of the chat template (not chat-formatted data)")
    share = trained / holding
    measured = f"{trained} of {holding} chat-formatted rows train on the prompt's {named}"
    if not trained:
        return Finding("prompt_in_loss", "ok", measured, value=0.0, decided="measured", reason="the prompts are masked")
    entry = explain(view, "prompt_in_loss")
    return Finding(
        "prompt_in_loss",
        "fail" if share >= FAIL_SHARE else "warn",
        measured,
        value=share,
        decided="measured",
        known_bug=entry["id"] if entry else "",
        fix=entry["fix"] if entry else "mask the prompt tokens: the completion mask starts inside the prompt",
    )
