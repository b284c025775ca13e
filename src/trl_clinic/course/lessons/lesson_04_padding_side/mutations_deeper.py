"""Lesson 04's deep dive: the other side of each experiment for each group, the checks both sides share, and the
margins.

Each experiment records its two sides with the same fields (``numbers["runs"]``, built by
``lesson_04_padding_side.deeper_numbers``): the right-padded forward with the cache against the same forward
without it and left-padded (both windows); a forward keeping the cache on 4.40 against TRL 0.8.6's ``evaluate()``,
and TRL 0.17's ``evaluate()`` against ``padding_free=True``; the families with the check on 4.51 against today's;
TRL 0.17's DPO evaluation of a plain Qwen2 against today's (eval batch 1); GPT-2 scored without ``position_ids``
against positions from the mask; right- against left-padded generation; SFT evaluation at eval batch 2 (padded)
against eval batch 1. The era runs whose model is told it is FlashAttention-2 are ``recreated``; the rest measured.

Margins, with the values of seeds 0-5 (cpu profile, one thread):
- "GPT-2's left-padded log-probs move (> 1e-2 nats)": a random GPT-2 reading absolute positions shifted by the pad
  count moved GPT2_LEFT; with positions from the mask it scores within GPT2_POS of one at a time (1.5e-5 at seed 0,
  655x under the line): log(10, 200).
- "left and right padding score within 1e-3 nats (fp32, Qwen2 and GPT-2)": float32 batching moves a log-prob by
  its reduction order only, a few units of fp32's 6e-8 times its size: Qwen2's completions (about 20 nats) moved
  QWEN2_SCORING, the random GPT-2's (hundreds of nats) GPT2_POS at seeds 0-5; without positions GPT-2 moved
  GPT2_LEFT (2.47 at seed 0, 2.5e3x over the line): log(10, 1e3).
- "only the rows shorter than the longest prompt move (over 1000x ...)": a padded row is predicted from a pad,
  an unpadded one only by rounding (RATIO at seeds 0-5); left padding's ratio is 0.5 at seed 0, 2e3x under the line:
  log(10, 1e3).
- generation's changed answers (> 0.5 right, < 0.5 left): counts, CHANGED at seeds 0-5 against 0: linear(0.5, 0.5);
  "equals unbatched" is held against one changed answer (the mutation; right padding's 11 would let it move to 5).
- "SFT eval loss moves with the eval batch size (over 100x the prediction's miss)": evaluate() weights the batches'
  token means by rows (SFT_MOVE), while the prediction from rows scored alone misses by rounding only (SFT_MISS): the
  ratio is 1e4 or more; at one batch size against itself it is 0, infinitely far on a log scale, so the check is held
  against its mutation, a loss that moved by the prediction's miss only (a ratio of 1, 100x under the line):
  log(10, 50).
- "matches its prediction ... (< 1e-5)": SFT_MISS at seeds 0-5, both batch sizes (shared); its mutation, a padded
  batch 2e-5 off, sits 2x over the line: log(10, 1.5).
Each other-side margin is argued within tenfold of where the line sits (halfway, where it sits under 100x), so a
line loosened that far fails tests/test_checks_can_fail.py.
"""

import math

from trl_clinic.course.mutations import linear, log


def _symptom(n):
    return {**n, "runs": {**n["runs"], "without_fix": n["runs"]["with_fix"]}}


def _fix(n):
    return {**n, "runs": {**n["runs"], "with_fix": n["runs"]["without_fix"]}}


OTHER_RUN = {"symptom": _symptom, "fix": _fix}

SHARED = {
    "builds no cache in evaluation": "today's SFTTrainer passes use_cache=False in its compute_loss at any eval batch "
    "size: both sides of the tangent share it, and the tangent's question is the padding, not the cache",
    "matches its prediction from rows scored alone": "evaluate()'s arithmetic at both batch sizes: the tangent's "
    "finding that padding changes no row's loss holds for the padded and the unpadded batches alike",
}

MUTATIONS = {
    # TRL 0.19.0-0.21.0's SFTTrainer.compute_loss passed no use_cache: the config's True builds a cache
    "builds no cache in evaluation": lambda n: n["runs"]["without_fix"]["sft"].update(cache_built=1),
    # a padded batch that changed a row's loss by a little more than rounding, 2e-5
    "matches its prediction from rows scored alone": lambda n: n["sft_eval_gap"].update({"2": 2e-5}),
    # padding that moved the eval loss by the prediction's own miss: as predicted (today's fixed side reads 0, which
    # a log scale puts infinitely far)
    "moves with the eval batch size": lambda n: n["runs"]["without_fix"]["sft"].update(
        eval_loss=n["runs"]["with_fix"]["sft"]["eval_loss"] + max(n["sft_eval_gap"].values())
    ),
    # left padding that changed one answer (right padding's 11 would let the line move to 5 unseen)
    "generation equals unbatched": lambda n: n["runs"]["with_fix"].update(changed=1),
}

MARGINS = {
    "GPT-2's left-padded log-probs move": log(10, 200),
    "score within 1e-3": log(10, 1e3),
    "over 1000x the unpadded": log(10, 1e3),
    "generation differs from unbatched": linear(0.5, 0.5),
    "generation equals unbatched": linear(0.5, 0.5),
    "moves with the eval batch size": log(10, 50),
    "matches its prediction from rows scored alone": log(10, 1.5),
}


def gpu_shape(numbers: dict, sizes: dict) -> dict:
    """The cpu numbers at the gpu profile's sizes (the checks' indexing): 64 generation prompts instead of 16 (the
    cpu prompts repeated: their padded rows move like the cpu's, the unpadded by rounding), DPO evaluation of 64
    pairs at eval batch 1 (64 forwards per model, the cpu share of right-padded ones). The eras, the families and
    the scoring's largest differences do not depend on the sizes; the SFT eval rows only set how many batches
    evaluate() averages, which the prediction follows row by row."""
    repeat = math.ceil(sizes["n_prompts"] / len(numbers["lengths"]))
    numbers["lengths"] = (numbers["lengths"] * repeat)[: sizes["n_prompts"]]
    for side in numbers["runs"].values():
        side["changed"] = side["changed"] * repeat
        side["shorter"]["padded_rows"] *= repeat
    for model in ("policy", "reference"):  # today's evaluation; the era's runs its own four pairs on any profile
        row = numbers["runs"]["with_fix"]["dpo_cache"][model]
        share = row["right_padded"] / row["forwards"]
        row.update(forwards=sizes["dpo_eval_pairs"], right_padded=round(share * sizes["dpo_eval_pairs"]))
    return numbers
