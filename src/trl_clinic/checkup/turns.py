"""Probe: does every trained span of a chat-formatted batch end on the token the model must emit to stop?

With ``assistant_only_loss=True`` the labels are the chat template's ``{% generation %}`` spans. A template that
leaves the assistant's end-of-turn token outside that block (TRL PR #5988: GLM's did) trains the answers but never
the token that ends them: the loss falls, and at inference the model does not stop. TRL 1.16.0 only logs a warning
at the trainer's start (``sft_trainer.py``, ``is_chat_template_stop_token_trained``); TRL PR #7230 reports a 2 h 20 min
QLoRA run lost to it. This probe reads the labels the trainer's own collator builds: the last label token of each
trained span must be a turn end, which is the tokenizer's EOS, the model's generation EOS, or the first special
token the chat template writes after an assistant message.

The lesson-free cousin of ``eos_label``: a ChatML template ends its turns with ``<|im_end|>``, not with the
tokenizer's EOS, so on chat-formatted data ``eos_label`` defers to this probe.
"""

from __future__ import annotations

from trl_clinic.checkup.engine import Skip, probe
from trl_clinic.checkup.view import TrainerView
from trl_clinic.probes.finding import Finding
from trl_clinic.probes.labels import targets

BATCHES = 4  # the first batches of the trainer's collator
WARN_SHARE = 0.5  # below this share of spans ending on a turn end: warn (max_length cuts some ends legitimately)


def template_turn_end(tokenizer) -> int | None:
    """The first special token the chat template writes after an assistant message's content (``<|im_end|>`` for
    ChatML), or None: no template, or a template that writes none."""
    if tokenizer is None or not getattr(tokenizer, "chat_template", None):
        return None
    try:
        prompt = tokenizer.apply_chat_template(
            [{"role": "user", "content": "a"}], add_generation_prompt=True, tokenize=True, return_dict=False
        )
        whole = tokenizer.apply_chat_template(
            [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}],
            tokenize=True,
            return_dict=False,
        )
    except Exception:  # noqa: BLE001 - a template that needs other roles or fields: no turn end read
        return None
    special = set(tokenizer.all_special_ids) | set(tokenizer.get_added_vocab().values())
    special -= {tokenizer.unk_token_id, tokenizer.pad_token_id}  # content a vocabulary lacks reads as unk
    tail = whole[len(prompt) :] if whole[: len(prompt)] == prompt else whole
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


def span_ends(batch: dict) -> list[int]:
    """The token id at the last position of every run of label tokens in the batch."""
    mask, ids, ends = targets(batch), batch["input_ids"], []
    for row in range(mask.shape[0]):
        positions = mask[row].nonzero().flatten().tolist()
        ends += [
            int(ids[row, p]) for i, p in enumerate(positions) if i + 1 == len(positions) or positions[i + 1] != p + 1
        ]
    return ends


def chat_formatted(view: TrainerView, batches: list[dict]) -> int | None:
    """The template's turn-end token when the batches hold it (the data went through the chat template) and it is
    not the tokenizer's EOS, else None."""
    turn_end = template_turn_end(view.tokenizer)
    if turn_end is None or turn_end == view.tokenizer.eos_token_id:
        return None
    return turn_end if any(bool((batch["input_ids"] == turn_end).any()) for batch in batches) else None


def first_label_batches(view: TrainerView) -> list[dict]:
    if view.kind in ("grpo", "dpo", "reward"):
        raise Skip(f"{view.kind}: its batches carry no labels from a chat template's generation spans")
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
    "-",
    "chat-formatted batches whose trained spans do not end on a turn-end token (EOS, the generation config's EOS, "
    "or the template's end-of-turn such as <|im_end|>): with assistant_only_loss a template that leaves the "
    "end-of-turn token outside {% generation %} trains the answers but never the stop, so the model does not stop "
    "at inference while the loss looks healthy (TRL PR #5988, #7230).",
)
def turn_end(view: TrainerView) -> Finding:
    batches = first_label_batches(view)
    if chat_formatted(view, batches) is None and not getattr(view.args, "assistant_only_loss", False):
        raise Skip("the batches are not chat-formatted with an end-of-turn token other than EOS (eos_label checks EOS)")
    stops = stop_tokens(view)
    ends = [token for batch in batches for token in span_ends(batch)]
    if not ends:
        raise Skip("no label token in the first batches (labels_present reports it)")
    stopping = sum(token in stops for token in ends)
    share = stopping / len(ends)
    names = view.tokenizer.convert_ids_to_tokens(sorted(stops))
    last = sorted(set(view.tokenizer.convert_ids_to_tokens(ends)))[:4]
    measured = (
        f"{stopping} of {len(ends)} trained spans in the first {len(batches)} batches end on a turn-end token "
        f"({', '.join(names)}); spans end on: {', '.join(last)}"
    )
    if share >= WARN_SHARE:
        return Finding(
            "turn_end", "ok", measured, value=share, decided="measured", reason="the model is trained to end its turns"
        )
    fix = (
        "put the end-of-turn token inside {% generation %}...{% endgeneration %} of the chat template (TRL's "
        "get_training_chat_template templates do), or train on the whole sequence (assistant_only_loss=False)"
        if getattr(view.args, "assistant_only_loss", False)
        else "end every completion with the turn-end token the model must emit (the template's or EOS)"
    )
    return Finding("turn_end", "fail" if stopping == 0 else "warn", measured, value=share, decided="measured", fix=fix)
