"""Probe: does the model learn to end its turn? Is the turn-end token a label at the end of each trained turn?

A chat template ends every turn with a token the model must emit to stop (``<|im_end|>`` for ChatML, ``<|eot_id|>``
for Llama 3, ``<end_of_turn>`` for Gemma, the tokenizer's EOS for Zephyr's template). With ``assistant_only_loss=True``
the labels are the template's ``{% generation %}`` spans: a template that leaves the turn end outside that block (TRL
PR #5988: GLM's did) trains the answers but never the token that ends them; the loss falls, and at inference the model
does not stop. TRL 1.16.0 only logs a warning at the trainer's start (``sft_trainer.py``,
``is_chat_template_stop_token_trained``); TRL PR #7230 reports a 2 h 20 min QLoRA run lost to it.

What is measured, on the labels the trainer's own collator builds for the first batches: for every trained span (a
run of label tokens), the first turn-end token at or after its start, within its sequence (a padding-free row holds
several, told apart by ``position_ids``). The turn is learned when that token is itself a label (it lies inside the
span): whole-sequence training, and templates that write ``<|im_end|>\\n`` inside ``{% generation %}`` (the span then
ends on ``\\n``, after the turn end), both count. It is not learned when the turn end comes after the span ends (the
template's turn end sits outside the trained block), or when the sequence ends on a trained span with no turn end at
all. A span cut by ``max_length`` before its turn end proves nothing either way and is left out (and counted).

The turn-end tokens are the tokenizer's EOS, the generation config's EOS ids, and the first special token the chat
template writes after an assistant message's content. The lesson-free cousin of ``eos_label``: on chat-formatted data
``eos_label`` defers to this probe.
"""

from __future__ import annotations

from collections import Counter

import torch

from trl_clinic.checkup.engine import Skip, probe
from trl_clinic.checkup.view import TrainerView
from trl_clinic.probes.finding import Finding
from trl_clinic.probes.labels import targets

BATCHES = 4  # the first batches of the trainer's collator
WARN_SHARE = 0.5  # below this share of judged turns with a trained turn end: warn; none at all: fail
CONTENT = "Paris is the capital."  # an assistant message the template renders, to find what it writes after it


def template_turn_end(tokenizer) -> int | None:
    """The first special token the chat template writes after an assistant message's content (``<|im_end|>`` for
    ChatML), or None: no template, a template that needs other roles or fields, or one that writes none."""
    if tokenizer is None or not getattr(tokenizer, "chat_template", None):
        return None
    try:
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": "Where is Paris?"}, {"role": "assistant", "content": CONTENT}],
            tokenize=False,
        )
    except Exception:  # noqa: BLE001 - a template that needs other roles or fields: no turn end read
        return None
    if CONTENT not in text:
        return None
    tail = tokenizer(text[text.rindex(CONTENT) + len(CONTENT) :], add_special_tokens=False)["input_ids"]
    special = set(tokenizer.all_special_ids) | set(tokenizer.get_added_vocab().values())
    special -= {tokenizer.unk_token_id, tokenizer.pad_token_id}  # content a vocabulary lacks reads as unk
    return next((token for token in tail if token in special), None)


def stop_tokens(view: TrainerView) -> set[int]:
    """The tokens that end a turn: the tokenizer's EOS, the generation config's EOS ids, the template's turn end."""
    tokenizer, found = view.tokenizer, set()
    if tokenizer is not None and tokenizer.eos_token_id is not None:
        found.add(tokenizer.eos_token_id)
    generation = getattr(view.base_model, "generation_config", None)
    eos = getattr(generation, "eos_token_id", None)
    found.update(eos if isinstance(eos, (list, tuple)) else [] if eos is None else [eos])
    turn_end = template_turn_end(tokenizer)
    if turn_end is not None:
        found.add(turn_end)
    return found


def sequences(batch: dict, row: int) -> list[tuple[int, int]]:
    """The (first, last) positions of each sequence in ``row``: its real tokens (``attention_mask``), split where
    ``position_ids`` restart at 0 (a padding-free row)."""
    length = batch["input_ids"].shape[1]
    mask = batch.get("attention_mask")
    real = [p for p in range(length) if mask is None or bool(mask[row, p])]
    if not real:
        return []
    positions = batch.get("position_ids")
    starts = [p for p in real if p == real[0] or (positions is not None and int(positions[row, p]) == 0)]
    return [(start, (starts[i + 1] - 1) if i + 1 < len(starts) else real[-1]) for i, start in enumerate(starts)]


def turns(batch: dict, stops: set[int], max_length: int | None) -> Counter:
    """Every trained span of ``batch``, judged: ``trained`` (the first turn end at or after its start is a label),
    ``outside`` (that turn end comes after the span), ``missing`` (its sequence ends on the span with no turn end),
    ``cut`` (the same, in a sequence ``max_length`` cut)."""
    mask, ids, found = targets(batch), batch["input_ids"], Counter()
    is_stop = torch.isin(ids, torch.tensor(sorted(stops), dtype=ids.dtype, device=ids.device))
    for row in range(ids.shape[0]):
        for first, last in sequences(batch, row):
            labelled = mask[row, first : last + 1].tolist()
            stop_at = is_stop[row, first : last + 1].nonzero().flatten().tolist()
            p = 0
            while p < len(labelled):
                if not labelled[p]:
                    p += 1
                    continue
                start = p
                while p + 1 < len(labelled) and labelled[p + 1]:
                    p += 1
                ahead = next((q for q in stop_at if q >= start), None)  # the first turn end from the span's start
                if ahead is not None:
                    found["trained" if ahead <= p else "outside"] += 1
                else:
                    cut = max_length is not None and last - first + 1 >= max_length
                    found["cut" if cut else "missing"] += 1
                p += 1
    return found


def chat_formatted(view: TrainerView, batches: list[dict]) -> int | None:
    """The template's turn-end token when the batches hold it (the data went through the chat template) and it is
    not the tokenizer's EOS, else None."""
    turn_end = template_turn_end(view.tokenizer)
    if turn_end is None or turn_end == view.tokenizer.eos_token_id:
        return None
    return turn_end if any(bool((batch["input_ids"] == turn_end).any()) for batch in batches) else None


def first_label_batches(view: TrainerView) -> list[dict]:
    if view.kind in ("grpo", "dpo", "reward", "kto"):
        raise Skip(f"{view.kind}: its batches carry no labels from a chat template's turns")
    b = view.args.per_device_train_batch_size
    n = min(BATCHES, len(view.rows) // b)
    if n == 0:
        raise Skip(f"fewer rows than one batch of {b}")
    batches = [view.batch(b, start=i * b) for i in range(n)]
    if "labels" not in batches[0]:
        raise Skip("the batches carry no labels")
    return batches


@probe(
    "turn_end",
    "08",
    "chat-formatted batches in which the model never learns to end its turn: the turn-end token (EOS, the "
    "generation config's EOS, or the template's end-of-turn such as <|im_end|>) that closes a trained turn is not "
    "itself a label. With assistant_only_loss, a template that leaves it outside {% generation %} trains the answers "
    "but never the stop, so the model does not stop at inference while the loss looks healthy (TRL PR #5988, #7230).",
)
def turn_end(view: TrainerView) -> Finding:
    batches = first_label_batches(view)
    if chat_formatted(view, batches) is None and not getattr(view.args, "assistant_only_loss", False):
        raise Skip("the batches are not chat-formatted with an end-of-turn token other than EOS (eos_label checks EOS)")
    stops = stop_tokens(view)
    counted = Counter()
    for batch in batches:
        counted += turns(batch, stops, getattr(view.args, "max_length", None))
    judged = counted["trained"] + counted["outside"] + counted["missing"]
    names = ", ".join(view.tokenizer.convert_ids_to_tokens(sorted(stops)))
    read = f"the first {len(batches)} batches"
    if not judged:
        if counted["cut"]:
            raise Skip(
                f"all {counted['cut']} trained spans in {read} are cut by max_length before a turn end: raise "
                "max_length to judge them"
            )
        raise Skip(f"no label token in {read} (labels_present reports it)")
    share = counted["trained"] / judged
    measured = (
        f"{counted['trained']} of {judged} trained turns in {read} have their turn end ({names}) as a label"
        + (f"; {counted['outside']} end before it" if counted["outside"] else "")
        + (f"; {counted['missing']} end their sequence without one" if counted["missing"] else "")
        + (f"; {counted['cut']} cut by max_length left out" if counted["cut"] else "")
    )
    if share >= WARN_SHARE:
        return Finding(
            "turn_end", "ok", measured, value=share, decided="measured", reason="the model is trained to end its turns"
        )
    fix = (
        "put the end-of-turn token inside {% generation %}...{% endgeneration %} of the chat template (TRL's "
        "get_training_chat_template templates do), or train on the whole sequence (assistant_only_loss=False)"
        if counted["outside"] >= counted["missing"]
        else "end every completion with the turn-end token the model must emit (the template's or EOS)"
    )
    return Finding(
        "turn_end",
        "fail" if counted["trained"] == 0 else "warn",
        measured,
        value=share,
        decided="measured",
        fix=fix,
    )
