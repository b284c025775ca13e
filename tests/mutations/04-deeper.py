"""Lesson 04's deep dive: how a run without the bug, or without the fix, changes the numbers, one mutation per check
(the part of the check's name it matches -> a change of the numbers such a run could produce; the comment names
the real run it stands for).

The gpu profile trains a small Qwen2 (about 30M parameters) by SFT for 800 steps under bf16 autocast,
runs DPO for 50 steps on 64 evaluation pairs, scores and generates 64 prompts, and evaluates a small Llama's SFT on
128 rows; the eras run on the CPU on either profile. Each threshold, argued for those sizes:
- the eras' checks compare verdicts, function names and family lists: no magnitude.
- "scoring differences below 1e-4 in fp32" (1e-5 while only the cpu sizes were argued): the cpu run measured 7e-7
  on completions of about 1 nat. On CUDA the fp32 kernels (TF32 off, torch's default) sum in another order for each
  batch shape: per-token errors of about 1e-6 nats, summed over completions of up to about 100 tokens, can reach
  1e-5, which the old bar would fail. 1e-4 keeps a 10-fold margin and stays 10 times below bf16's batching rounding
  (9e-4 on the CPU) and 10^4 times below what padding does when it matters (GPT-2 without position_ids: 2.5 nats).
- "fp32 batching differences are over 100x below bf16's own rounding error" (bf16 against fp32, one at a time):
  2e4x on the CPU at seed 0, 3.5e4x at seed 3 (where bf16's own batching differences were only 40x fp32's, which
  failed an earlier form of this check). On CUDA both sides grow with the model's width and the completions'
  length in proportion to their unit roundoffs (2**-24 against 2**-8), so the ratio stays far above 100.
- "bf16 within 2x bf16's own rounding error": both sides are bf16 rounding of the same model on the same device
  (0.06x on the CPU).
- "without position_ids ... within 1e-3" (Qwen2 left, every family right) and "GPT-2's log-probs move (> 1e-2)":
  rotary attention sees position differences only, so a shifted row changes by the rounding of cos/sin at larger
  angles: 2e-7 on the CPU, at most about 1e-5 per token in fp32 for the gpu prompts' longer pads, summed below
  1e-3. GPT-2's learned position embeddings (std 0.02, as its token embeddings) moved the log-probs by 2.5 nats on
  the CPU; the 512-wide gpu GPT-2 draws them the same way.
- "only the rows shorter than the longest prompt move (the unpadded < 1e-3)": unpadded rows move by the reduction
  order only (2e-6 on the CPU, fp32 on CUDA the same order); padded rows by about 10.
- "SFT eval loss ... matches the one predicted (< 1e-5)" and "moves with the eval batch size (> 100x the miss)":
  the Llama trains and scores in fp32 on every profile; the miss was 8e-8 on the CPU, the weighting effect 1e-2.
  128 rows average more rows per loss, which shrinks the miss, not the weighting effect (rows still alternate
  one-word answers and biographies).
- audit counts: TRL's use_cache=False and the collator's right padding hold on any device; 64 pairs at eval batch 1
  gave 31 padded forwards on the CPU.
"""

from mutation_helpers import cycled

MUTATIONS = {
    # transformers 4.42-4.48 (no check): the right-padded forward with the cache gets past it
    "4.40.2, a right-padded forward with the cache raises": lambda n: n["then"]["4.40"]["direct_forward"][
        "right"
    ].update(verdict="missing_flash_kernel", function="_flash_attention_forward"),
    "4.51.3, a right-padded forward with the cache raises": lambda n: n["then"]["4.51"]["direct_forward"][
        "right"
    ].update(verdict="missing_flash_kernel", function="_flash_attention_forward"),
    # a check keyed on any padding, not on the cache: the cache-free forward raises too
    "4.40.2, use_cache=False or left padding": lambda n: n["then"]["4.40"]["direct_forward"]["right_no_cache"].update(
        verdict="guard"
    ),
    "4.51.3, use_cache=False or left padding": lambda n: n["then"]["4.51"]["direct_forward"]["right_no_cache"].update(
        verdict="guard"
    ),
    # TRL 0.12-0.17's DPO forward (no use_cache) on the first window: evaluate() raises
    "DPOTrainer.evaluate() gets past the check": lambda n: n["then"]["4.40"]["scenarios"]["as_reported"].update(
        verdict="guard"
    ),
    # a padding_free path that still padded (as TRL 1.16's falls back to): the padded row raises
    "DPOConfig(padding_free=True) gets past": lambda n: n["then"]["4.51"]["scenarios"]["padding_free"].update(
        verdict="guard"
    ),
    # transformers 4.53.0: no family has the check any more
    "the check sits in Qwen2 and other families": lambda n: n["then"]["4.51"].update(guard_families=[]),
    # today's check run on transformers 4.49-4.52: Qwen2 (and the others) have it
    "has the check in no model family": lambda n: n.update(guard_families_today=["mistral", "qwen2"]),
    # equal-length chosen and rejected in every pair: nothing padded at eval batch 1
    "at batch size 1 has right-padded forwards": lambda n: n["audits"]["1"]["policy"]["eval"].update(right_padded=0),
    # precompute_ref_log_probs=True: the reference model runs before training, not in its steps
    "the reference model runs its own DPO forwards": lambda n: n["audits"]["2"].pop("reference"),
    # TRL 0.12-0.17's forward (no use_cache): the config's use_cache=True builds a cache
    "no DPO forward of the policy or the reference model built": lambda n: n["audits"]["2"]["reference"]["eval"].update(
        cache_built=1
    ),
    # TRL 0.17: no use_cache passed by anyone
    "use_cache=False from _compute_loss": lambda n: n["audits"]["1"]["reference"]["eval"].update(
        asked={"use_cache=None from dpo_trainer.py:concatenated_forward": 1}
    ),
    # TRL 0.17.0: padding_free honoured, no warning
    "padding_free is temporarily unavailable": lambda n: n["padding_free"].update(warnings=[], honoured=True),
    # an eval set of rows of one length: nothing to pad at batch 2
    "eval batch 2 pads every batch on the right": lambda n: n["sft_eval"]["2"].update(right_padded=0),
    # transformers' sdpa path without padding: no mask handed to attention
    "hands attention a padding mask": lambda n: n["sft_eval"]["2"].update(mask_to_attention=0),
    # a Trainer forward that kept the config's use_cache=True
    "SFTTrainer builds no cache in evaluation": lambda n: n["sft_eval"]["2"].update(cache_built=1),
    # a padding bug that changed row losses at batch 2 by 1e-3: the batch effect is no longer 100x the miss either
    ("matches the one predicted from rows scored alone", "moves with the eval batch size"): lambda n: n[
        "sft_eval_gap"
    ].update({"2": 1e-3}),
    # eval rows of equal label counts: batch 2 weights rows as batch 1 does
    "moves with the eval batch size": lambda n: n["sft_eval"]["2"].update(eval_loss=n["sft_eval"]["1"]["eval_loss"]),
    # prompts of one length: no row padded
    "right-padded batched generation differs": lambda n: n["changed_outputs"].update(right=0),
    # a kernel that let pads leak into every row: the unpadded rows move too
    "only the rows shorter than the longest": lambda n: n["shorter"].update(changed_unpadded=1, max_shift_unpadded=9.0),
    # the yardstick's "bf16" model loaded without dtype=bfloat16 (fp32 against fp32): no rounding error to compare with
    ("100x below bf16's own rounding", "within 2x bf16's own rounding error"): lambda n: n.update(bf16_error=1e-7),
    # GPT-2 scored with position_ids counted from the mask: its left-padded row as one at a time (the right's number)
    "GPT-2's log-probs move": lambda n: n["no_position_ids"]["gpt2 (random init), left"].update(
        diff=n["no_position_ids"]["gpt2 (random init), right"]["diff"]
    ),
    # a padding bug in fp32 scoring shows in both precisions: fp32 is no longer 100x below bf16's rounding
    ("scoring differences below", "100x below bf16's own rounding"): lambda n: n["scoring"]["fp32"].update(right=1e-3),
    # bf16 batching that moved more than bf16's own rounding
    "within 2x bf16's own rounding error": lambda n: n.update(bf16_error=max(n["scoring"]["bf16"].values()) / 3),
    # a family with absolute positions in Qwen2's place: GPT-2's left-padded number
    "Qwen2's left-padded scores stay within": lambda n: n["no_position_ids"]["qwen2, left"].update(
        diff=n["no_position_ids"]["gpt2 (random init), left"]["diff"]
    ),
    # a collator that padded left by default: GPT-2's "right" row gets the left-padded number
    "right padding keeps every family's scores": lambda n: n["no_position_ids"]["gpt2 (random init), right"].update(
        diff=n["no_position_ids"]["gpt2 (random init), left"]["diff"]
    ),
    # the right-padded run's count
    "left-padded batched generation equals": lambda n: n["changed_outputs"].update(left=n["changed_outputs"]["right"]),
}


def gpu_shape(numbers: dict, sizes: dict) -> dict:
    """The cpu numbers at the gpu profile's sizes: 64 prompts (the cpu prompts repeated), 64 evaluation pairs at eval
    batch 1 and 2 (the cpu run's already), 128 SFT eval rows (128 and 64 forwards), 50 DPO steps (50 train forwards
    per model at batch 4). Scoring maxima, eras and the warning do not depend on the sizes."""
    n_prompts = sizes["n_prompts"]
    numbers["lengths"] = cycled(numbers["lengths"], n_prompts)
    for side in ("left", "right"):
        row = numbers["generation"][side]
        for key in ("outputs", "first_token_logit_shift", "changed"):
            row[key] = cycled(row[key], n_prompts)
        numbers["changed_outputs"][side] = sum(row["changed"])
    numbers["generation"]["single"]["outputs"] = cycled(numbers["generation"]["single"]["outputs"], n_prompts)
    for mode in ("left", "right"):
        for family in ("qwen2", "gpt2 (random init)"):
            entry = numbers["no_position_ids"][f"{family}, {mode}"]
            entry["first_positions"] = cycled(entry["first_positions"], n_prompts)
    for audit in numbers["audits"].values():
        for modes in audit.values():
            modes["train"].update(forwards=sizes["dpo_steps"], right_padded=sizes["dpo_steps"])
    for size, rows in (("1", sizes["sft_eval_rows"]), ("2", sizes["sft_eval_rows"] // 2)):
        row = numbers["sft_eval"][size]
        scale = rows / row["forwards"]
        row.update({key: round(row[key] * scale) for key in ("forwards", "right_padded", "mask_to_attention")})
    return numbers
