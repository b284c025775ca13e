"""Lesson 04 (core): how a run without the bug, or without the fix, changes the numbers, one mutation per check
(the part of the check's name it matches -> a change of the numbers such a run could produce; the comment names
the real run it stands for).

The gpu profile runs the report's era the same way (it runs on the CPU: the eras hold CPU torch),
SmolLM2-135M-Instruct in fp32 on CUDA with 6 chat questions instead of 4, and today's DPOTrainer on a small
Qwen2 (about 30M parameters, random init) under bf16 autocast, evaluating 64 pairs at eval batch 1. Each threshold,
argued for those sizes:
- the era's checks compare verdicts ("guard", "missing_flash_kernel"), file names and flags: no magnitude, and
  the era is the same process on either profile.
- "first new token from a pad slot" / "from its own last token" (match gap < 1e-2): the gap is the distance between
  generate()'s first-step logits and a cache-free forward of the same batch and positions. Both are fp32 SmolLM2
  on one device: 3e-5 on the CPU; fp32 on CUDA (torch leaves TF32 off for matmuls by default, and the course never
  turns it on) differs by a different reduction order, about 1e-5 relative on logits of size 20-30, so well below
  1e-2, while a wrong slot is 2-34 away (the measured gaps to the other slots).
- "only the rows shorter than the longest prompt move (every padded row > 1, the unpadded < 1e-3)": a padded row
  is predicted from a pad (first-token logits moved 20-23 on the CPU, the same weights and dtype on CUDA); the
  unpadded row only by the batch's reduction order, 4e-5 on the CPU and of the same order in fp32 on CUDA: 1e-3
  keeps a 25-fold margin on each side. With 6 questions the longest (43 tokens) is still unique.
- "changes SmolLM2's answers" (> 0) and "gives the answers one at a time" (== 0): greedy decoding of 8 tokens from
  logits that moved by 20 (right) or by 1e-5 (left); a flip needs a near tie within 1e-5 in one of 6 x 8 steps.
- "today's DPO evaluation ... right-padded forwards, none with a cache": a pair whose chosen and rejected differ in
  length pads one row; 6 of 16 pairs did on the CPU (seed 0), so 64 pairs give some at any seed; "none with a
  cache" is TRL's use_cache=False, the same on any device and dtype.
- the hook's and the check-up's counts on generate(): one right-padded prefill per call whatever the sizes.
"""

MUTATIONS = {
    # TRL 0.18 on the same transformers (dpo_trainer.py passes use_cache=False): evaluate() gets past the check
    "evaluate() raises the padding_side='right' ValueError": lambda n: n["then"]["scenarios"]["as_reported"].update(
        verdict="missing_flash_kernel", file="modeling_flash_attention_utils.py"
    ),
    # a model saved with use_cache=False in its config: the first training step gets past the check too
    "raise it at the first training step": lambda n: n["then"]["scenarios"]["train_defaults"].update(
        verdict="missing_flash_kernel"
    ),
    # TRL 0.18: evaluation after checkpointed training gets past the check as well
    "gradient checkpointing gets training past it": lambda n: n["then"]["scenarios"]["train_checkpointing"][
        "then_evaluate"
    ].update(verdict="missing_flash_kernel"),
    # a collator that honoured the tokenizer's side (left): the rows end in real tokens
    "a left-padding tokenizer does not avoid it": lambda n: n["then"]["scenarios"]["tokenizer_left"].update(
        verdict="missing_flash_kernel"
    ),
    # a TRL that passed use_cache=False in the forward: the reference forward gets past the check
    "raises in the reference forward": lambda n: n["then"]["scenarios"]["explicit_ref_path"][
        "reference_forward"
    ].update(verdict="missing_flash_kernel"),
    # a generate() that read each row's last real token: the short row's slot 3 (its last ',')
    "from a pad slot": lambda n: n["grid"]["right"][-1].update(predicted_from=3),
    # transformers 4.51.3's generate() counted positions from the mask: the short row's new tokens at 4, 5, 6
    "positions its prompt already used": lambda n: n["grid"]["right"][-1].update(new_positions=[4, 5, 6]),
    # prompts of one length (exercise 1): no row padded, no answer changed
    "right-padded batched generate() changes": lambda n: n["generation"]["changed"].update(right=0),
    # a right-padded batch that predicted from the last real token: the padded rows move as little as the left's
    "only the rows shorter than the longest": lambda n: n["generation"]["shorter"].update(min_shift_padded=4.4e-5),
    # a DPO collator that honoured tokenizer.padding_side="left"
    "even with a left-padding tokenizer": lambda n: n["dpo_padding"].update(on_the_left=n["dpo_padding"]["padded"]),
    # generate() on prompts of one length: the prefill is not right-padded
    "the hook flags the right-padded generate()": lambda n: n["portable"]["generate(), right padding"].update(
        right_padded=0, right_padded_with_cache=0
    ),
    # without the fix: the report's model with use_cache=True
    "model.config.use_cache=False gets past": lambda n: n["then"]["scenarios"]["use_cache_false"].update(
        verdict="guard"
    ),
    # without the fix for the reference: TRL 0.17 loads it with use_cache=True unless told
    "gets policy and reference past it": lambda n: n["then"]["scenarios"]["path_model_init_kwargs"][
        "reference_forward"
    ].update(verdict="guard"),
    # without ref_model_init_kwargs: the explicit ref_model's forward raises
    "gets an explicit ref_model path past it": lambda n: n["then"]["scenarios"]["explicit_ref_path_fixed"][
        "reference_forward"
    ].update(verdict="guard"),
    # the right-padded batch's short row (its last slot is a pad), as the right-padded run recorded it
    "from its own last token": lambda n: n["grid"]["left"].__setitem__(-1, dict(n["grid"]["right"][-1])),
    # the right-padded run's count
    "gives SmolLM2's answers one at a time": lambda n: n["generation"]["changed"].update(left=3),
    # TRL 0.12-0.17's DPO forward, no use_cache: the config's True builds a cache on the padded rows
    "none with a cache": lambda n: n["portable"]["DPO evaluate(), policy"].update(right_padded_with_cache=6),
    # the right-padded generate(): one padded prefill that built a cache
    "flags nothing in the left-padded": lambda n: n["portable"]["generate(), left padding"].update(
        right_padded=1, right_padded_with_cache=1
    ),
    # the probe on a trainer whose forwards build a cache (TRL 0.17's DPO): 4 of 4 padded forwards with a cache
    "padding_cache probe agrees": lambda n: n["checkup"].update(status="warn", value=4),
}


def gpu_shape(numbers: dict, sizes: dict) -> dict:
    """The cpu numbers at the gpu profile's sizes: 6 chat questions (the two more are shorter than the longest, so
    padded: they move like the other padded rows), 64 evaluation pairs at eval batch 1 (64 forwards per model, the
    cpu share of right-padded ones). The era, the grid and the generate() hook do not depend on the sizes."""
    generation, extra = numbers["generation"], sizes["chat_prompts"] - numbers["generation"]["prompts"]
    padded = [i for i, n in enumerate(generation["lengths"]) if n < max(generation["lengths"])][:extra]
    generation["lengths"] += [generation["lengths"][i] for i in padded]
    for side in ("left", "right"):
        generation["shift"][side] += [generation["shift"][side][i] for i in padded]
    generation["changed"]["right"] += len(padded)
    generation.update(
        prompts=sizes["chat_prompts"],
        shorter=dict(generation["shorter"], padded_rows=generation["shorter"]["padded_rows"] + extra),
    )
    share = numbers["dpo_padding"]["padded"] / numbers["dpo_padding"]["batches"]
    numbers["dpo_padding"].update(batches=sizes["dpo_eval_pairs"], padded=round(share * sizes["dpo_eval_pairs"]))
    for model in ("policy", "reference"):
        row = numbers["portable"][f"DPO evaluate(), {model}"]
        share = row["right_padded"] / row["forwards"]
        row.update(forwards=sizes["dpo_eval_pairs"], right_padded=round(share * sizes["dpo_eval_pairs"]))
    return numbers
