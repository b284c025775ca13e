"""Lesson 04 (core): the other run's numbers for each group, the one check both runs share, and the margins.

Each side records the same fields (``numbers["runs"]``). On the report's versions (era 04-transformers-4.51) the
era script runs each failing DPO run twice, as it raised and with ``model.config.use_cache = False`` (or
``model_init_kwargs`` / ``ref_model_init_kwargs``) and nothing else changed (``companion.PAIRS``); its DPO
evaluation of a plain Qwen2 is counted by the lesson's hook (without the fix: TRL 0.17.0, no ``use_cache``)
against today's (with it: TRL 1.16.0 passes ``use_cache=False``). Today, SmolLM2's batched ``generate()`` is padded
on the right (without the fix) and on the left (with it). Whole runs: the symptom's checks read the fixed side in
place of the bad one, and the other way round.

Margins, with the values of seeds 0-5 (cpu profile, one thread):
- "first new token from a pad slot" / "from its own last token" (match gap < 1e-2): the distance between
  generate()'s first-step logits and a cache-free forward of the same batch and positions at the slot the lesson
  names (GAP at seeds 0-5: the same fp32 SmolLM2, the same reduction order up to a few ulps), while a wrong slot
  is 2 to 34 away; the other side names a slot of the other kind (NaN, infinitely far), so each check is held
  against its mutation, the nearest wrong slot's 2 (the fixtures record only the matching slot's gap): 200x the
  line, log(10, 100) (a line loosened tenfold would sit 20x under it).
- "over 1000x the unpadded rows' first-token shift": a padded row is predicted from a pad (first-token logits moved
  SHIFT_PADDED), an unpadded one only by the batch's reduction order (SHIFT_UNPADDED): a ratio of 1e5 or more;
  left padding moves every row by rounding alike, a ratio near 1 (1.1 at seed 0, 900x under the line):
  log(10, 200).
- "changes SmolLM2's answers" (> 0.5) and "gives the answers one at a time" (< 0.5): counts of changed answers
  (CHANGED_RIGHT right, 0 left, seeds 0-5); greedy decoding of 8 tokens from logits that moved by 20 or by 1e-5:
  linear(0.5, 0.5), as far as an integer count allows; "one at a time" is held against one changed answer (the
  mutation: right padding's CHANGED_RIGHT would let its line move to 1.75 unseen).
- the hook's counts on generate() (> 0.5 / < 0.5): one right-padded prefill a call, or none: linear(0.5, 0.5).
The era's checks and the DPO counts compare verdicts, file names and counts: the era runs on the CPU in both
profiles, and TRL's use_cache=False is the same on any device.

The gpu profile runs SmolLM2-135M-Instruct in fp32 on CUDA with 6 chat questions instead of 4, and today's
DPOTrainer on a small Qwen2 (about 30M parameters, random init) under bf16 autocast, evaluating 64 pairs at eval
batch 1. At those sizes: fp32 on CUDA (torch leaves TF32 off for matmuls by default, and the course never turns it
on) differs by another reduction order, about 1e-5 relative on logits of size 20-30: the match gap and the unpadded
rows' shift stay far below the lines; with 6 questions the longest (43 tokens) is still unique; a pair whose chosen
and rejected differ in length pads one row, and 64 pairs give some at any seed.
"""

from trl_clinic.course.mutations import linear, log, other_run

OTHER_RUN = other_run("without_fix", "with_fix")

SHARED = {
    "DPO's batches end in padding": "the precondition of both sides: today's DPO collator pads the stacked row "
    "whatever the tokenizer's side, so only the cache decides",
}

MUTATIONS = {
    # a DPO collator that honoured tokenizer.padding_side="left"
    "DPO's batches end in padding": lambda n: n["dpo_padding"].update(on_the_left=n["dpo_padding"]["padded"]),
    # the first new token matched at the nearest wrong slot, 2 away (seeds 0-5: 2 to 34)
    "from a pad slot": lambda n: n["runs"]["without_fix"]["grid"][-1].update(match_gap=2.0),
    "from its own last token": lambda n: n["runs"]["with_fix"]["grid"][-1].update(match_gap=2.0),
    # left padding that changed one answer of the batch
    "one at a time": lambda n: n["runs"]["with_fix"]["generation"].update(changed=1),
}

MARGINS = {
    "from a pad slot": log(10, 100),
    "from its own last token": log(10, 100),
    "over 1000x the unpadded": log(10, 200),
    "changes SmolLM2's answers": linear(0.5, 0.5),
    "one at a time": linear(0.5, 0.5),
    "the hook flags the right-padded": linear(0.5, 0.5),
    "the hook flags nothing": linear(0.5, 0.5),
}


def gpu_shape(numbers: dict, sizes: dict) -> dict:
    """The cpu numbers at the gpu profile's sizes (the checks' indexing): 6 chat questions (the two more are
    shorter than the longest, so padded: they move like the other padded rows on the right, by rounding on the left),
    64 evaluation pairs at eval batch 1 (64 forwards per model, the cpu share of right-padded ones). The era, the
    grid and the generate() hook do not depend on the sizes."""
    extra = sizes["chat_prompts"] - numbers["prompts"]
    lengths = numbers["lengths"]
    padded = [i for i, n in enumerate(lengths) if n < max(lengths)][:extra]
    numbers["lengths"] = lengths + [lengths[i] for i in padded]
    numbers["prompts"] = sizes["chat_prompts"]
    right = numbers["runs"]["without_fix"]["generation"]
    right["changed"] += len(padded)
    right["shorter"]["padded_rows"] += len(padded)
    numbers["runs"]["with_fix"]["generation"]["shorter"]["padded_rows"] += len(padded)
    share = numbers["dpo_padding"]["padded"] / numbers["dpo_padding"]["batches"]
    numbers["dpo_padding"].update(batches=sizes["dpo_eval_pairs"], padded=round(share * sizes["dpo_eval_pairs"]))
    today = numbers["runs"]["with_fix"]["dpo_eval"]
    for model in ("policy", "reference"):
        share = today[model]["right_padded"] / today[model]["forwards"]
        today[model].update(forwards=sizes["dpo_eval_pairs"], right_padded=round(share * sizes["dpo_eval_pairs"]))
    return numbers
