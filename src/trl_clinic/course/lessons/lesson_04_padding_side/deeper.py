# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 04 deep dive · Right padding and the KV cache: the two windows, today's forwards, scoring, and a tangent
#
# [The core](../04_qwen2_padding_side.ipynb) showed the report's error on TRL 0.17 + transformers 4.51.3, why
# training escaped it only under gradient checkpointing, what right padding breaks in a cached `generate()`, and
# the fix. Here is the evidence around it: the check's first window (transformers 4.40.2 with TRL 0.8.6), which
# TRL releases turned the cache off, an audit of every forward today's DPO makes for the policy and the reference
# model, why cache-free scoring does not care about the padding side (in fp32, in bf16, and without
# `position_ids`), the same generation test on a small Qwen2 we train, and a tangent from the report: an SFT
# `eval_loss` that moves with the eval batch size.
#
# > **Hosted** (Colab, Kaggle, no clone): upload the wheel `uv build` makes, then run `%pip install "./trl_clinic-0.1.0-py3-none-any.whl[course]"` first.

# %% tags=["parameters"]
profile = "auto"  # "auto" (gpu when CUDA is present), "cpu" or "gpu"
seed = 0
output_dir = None  # None: outputs/04_qwen2_padding_side_deeper at the repository root

# %%
import trl_clinic.course  # first: the lessons' offline mode, and two optional libraries' warnings kept quiet
import torch
from transformers import AutoModelForCausalLM

from trl_clinic.course import data, eras
from trl_clinic.course.lessons.lesson_04_padding_side import companion
from trl_clinic.course.parameters import start_run
from trl_clinic.course.results import check
from trl_clinic.course.tokenizer import build_tokenizer
from trl_clinic.probes.padding import (ForwardAudit, batched_eval_loss, generation_check, per_row_eval_losses,
                                       scoring_check, sequence_logprobs)

run = start_run("04-deeper", profile, seed, output_dir)
sizes = run.sizes  # this notebook's numbers for the profile (lesson.yaml)

# %% [markdown]
# ## 1. The check lived in two windows of transformers
#
# Read in `models/qwen2/modeling_qwen2.py` of each release named (the wheels from PyPI):
#
# | transformers | the check | keyed on | read in |
# |---|---|---|---|
# | 4.37.0 (the first with Qwen2) - 4.41.2 | `Qwen2Model.forward` | `use_cache` (the argument, else the config's) | 4.37.0, 4.38.2, 4.39.3, 4.40.2, 4.41.2 |
# | 4.42.0 - 4.48.3 | none | | 4.42.0, 4.43.0, 4.44.0, 4.45.2, 4.46.0-4.46.2, 4.47.0, 4.47.1, 4.48.0, 4.48.3 |
# | 4.49.0 - 4.52.4 | `Qwen2Model._update_causal_mask` | a cache object (`use_cache=True` creates one) | 4.49.0, 4.50.3, 4.51.3, 4.52.4 |
# | 4.53.0 and later | none | | 4.53.0-4.53.3, 4.54.0, 4.54.1, 4.55.4, 4.56.0, 4.57.1, 5.0.0 |
#
# The first window, run for real on transformers 4.40.2 with TRL 0.8.6: one forward of a stacked pair with and
# without the cache, then the real `DPOTrainer.evaluate()` of that time.

# %%
spec = {"seed": run.subseed("then"), "scenarios": ["as_reported"]}
first = eras.run_in_era("04-transformers-4.40", "then_04", spec, run.output_dir / "then-4.40")
companion.show_error(first, "right", group="direct_forward")
companion.show_scenarios(first, group="direct_forward")
companion.show_scenarios(first)

# %% [markdown]
# TRL 0.8.6's DPO evaluation got past the check: its `concatenated_forward` passed `use_cache=False`
# (trl 0.8.6 `trainer/dpo_trainer.py` line 988). As in the core, the model in these runs is told it is
# FlashAttention-2 (re-created: the kernel needs a CUDA GPU), so "past the check" means up to the kernel call. The
# second window on the report's versions: the same direct forwards, the report's evaluation beside the old
# workaround `DPOConfig(padding_free=True)` (one packed row without padding), and the report's evaluation of a
# plain Qwen2, nothing re-created, its forwards counted:

# %%
spec = {"seed": run.subseed("then"), "scenarios": ["as_reported", "padding_free", "cache_audit"]}
report = eras.run_in_era("04-transformers-4.51", "then_04", spec, run.output_dir / "then-4.51")
companion.show_scenarios(report, group="direct_forward")
companion.show_scenarios(report, ["as_reported", "padding_free"])
companion.show_cache_audit(report)
families = {"4.51": companion.era_record(report).get("guard_families"), "today": companion.guard_families()}
print(f"model families with the check on transformers {report.versions.get('transformers')}: {families['4.51']}\n"
      f"... on today's transformers {run.versions['transformers']}: {families['today']}")

# %% [markdown]
# Not only Qwen2: in 4.51.3 the same check sits in every family listed above (computed from that release's files),
# so Mistral, Qwen3 or Phi-3 users met the same error.
#
# ## 2. Which TRL releases turned the cache off in DPO's forward
#
# | TRL | `use_cache` in DPO's forward | read in `trainer/dpo_trainer.py` |
# |---|---|---|
# | 0.8.6 - 0.11.4 | `use_cache=False` in `concatenated_forward` | 0.8.6 line 988, 0.9.6 line 1273, 0.10.1 line 1380, 0.11.4 line 1357 |
# | 0.12.0 - 0.17.0 | none: the config's `use_cache=True` builds a cache | 0.12.0, 0.12.2, 0.13.0, 0.14.0, 0.15.2, 0.16.0, 0.17.0 |
# | 0.18.0 and later | `model_kwargs = {"use_cache": False}` (PR #3307) | 0.18.0 and 0.18.2 line 1091; 1.16.0 lines 1248, 1291 |
#
# What else decides whether a cache is built: `Qwen2Model.forward` sets `use_cache=False` only when gradient
# checkpointing is on and the model is training (4.51.3 `modeling_qwen2.py` lines 494-498). TRL 0.17's `DPOConfig`
# leaves `gradient_checkpointing` at `TrainingArguments`' default, False (4.51.3 `training_args.py` line 1381);
# one common way to have it on anyway is peft's `prepare_model_for_kbit_training`, whose
# `use_gradient_checkpointing` defaults to True (peft 0.15.2 `utils/other.py` line 96). The core measured both
# cases on the report's versions.
#
# ## 3. Today: what DPO's forwards really are
#
# A small Qwen2 trained briefly by SFT on the fixed-world instructions, saved: DPO loads the policy and the
# reference model from that folder. Then DPO train and evaluation steps at `per_device_eval_batch_size` 1 and 2,
# activation checkpointing on. `ForwardAudit` (from `trl_clinic.probes.padding`) hooks the policy **and** the
# reference model and records for every forward its padding, the `use_cache` it was passed and by which TRL
# function, and whether the backbone returned a KV cache.

# %%
tokenizer = build_tokenizer()
model, checkpoint = companion.sft_checkpoint(run, tokenizer)


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
# Evaluation feeds right-padded rows to both models even at eval batch size 1 (chosen and rejected share the
# batch), and no forward builds a cache: `DPOTrainer._compute_loss` passes `use_cache=False` to the policy and
# the reference forward (trl 1.16.0 `trainer/dpo_trainer.py` line 1291), and TRL's fused log-prob head passes it
# again to the backbone (`trainer/utils.py` line 1612). A third place, `compute_ref_log_probs` (line 1248), runs
# only with `precompute_ref_log_probs=True`. The old workaround, `padding_free=True`, on today's DPOTrainer:

# %%
with companion.warnings_of("trl.trainer.dpo_trainer") as trl_warnings:
    padding_free_trainer = companion.dpo_trainer(run, checkpoint, tokenizer, 2, padding_free=True)
padding_free_batch = next(iter(padding_free_trainer.get_train_dataloader()))
print("TRL warned:", *trl_warnings)
print(f"trainer.padding_free = {padding_free_trainer.padding_free}; its training batch has "
      f"{len(padding_free_batch['input_ids'])} padded rows with an attention mask: "
      f"{'attention_mask' in padding_free_batch}")

# %% [markdown]
# ## 4. Scoring without a cache: the padding side does not matter
#
# `scoring_check` (from `trl_clinic.probes.padding`) scores completions given prompts, as DPO does, one at a
# time and as one left-padded, right-padded or padding-free batch, all with `use_cache=False` and positions
# counted from each row's first real token, and reports the largest log-probability difference from one at a time.

# %%
eval_rows = data.instruction_pairs(sizes.n_prompts, seed=run.subseed("prompts"), max_people=2)
prompts, completions = list(eval_rows["prompt"]), list(eval_rows["completion"])
bf16_model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.bfloat16).to(run.device)
scoring = {"fp32": scoring_check(model, tokenizer, prompts, completions),
           "bf16": scoring_check(bf16_model, tokenizer, prompts, completions)}
companion.print_scoring(scoring)

# %% [markdown]
# In bf16 batching moves the log-probs more than in fp32. A padding bug would show in both precisions; rounding shows in
# proportion to the precision (bf16 keeps 8 significant bits, fp32 24), and a batch of another shape adds its
# sums in another order. The yardstick: the same bf16 model against its fp32 self, one sequence at a time.

# %%
reference_fp32 = sequence_logprobs(model, tokenizer, prompts, completions, "single")
bf16_single = sequence_logprobs(bf16_model, tokenizer, prompts, completions, "single")
bf16_error = max(abs(a - b) for a, b in zip(bf16_single, reference_fp32))
worst = {precision: max(diffs.values()) for precision, diffs in scoring.items()}
companion.explain_rounding(worst, bf16_error, sum(map(abs, reference_fp32)) / len(reference_fp32))

# %% [markdown]
# A hand-written scoring loop usually passes no `position_ids`: `model(**tokenizer_batch, use_cache=False)`.
# Then every row's positions run 0, 1, 2, ... from its first slot, so a left-padded row's first real token sits at
# the position of its pad count. Whether that matters depends on how the family encodes positions: Qwen2
# rotates queries and keys by their position, so attention sees only position *differences*; GPT-2 adds a learned
# embedding of the absolute position to each token.

# %%
gpt2 = companion.tiny_gpt2(run, tokenizer)
no_positions = {}
for name, scorer in (("qwen2", model), ("gpt2 (random init)", gpt2)):
    alone = sequence_logprobs(scorer, tokenizer, prompts, completions, "single")
    for side in ("left", "right"):
        scores, first_positions = companion.tokenizer_batch_logprobs(scorer, tokenizer, prompts, completions, side)
        no_positions[f"{name}, {side}"] = {"diff": max(abs(a - b) for a, b in zip(scores, alone)),
                                           "first_positions": first_positions}
        print(f"{name:>18}, {side:>5}-padded, no position_ids: first real token at positions "
              f"{sorted(set(first_positions))}; largest difference from one at a time "
              f"{no_positions[f'{name}, {side}']['diff']:.1e} nats")
gpt2_positioned = {mode: diff for mode, diff in scoring_check(gpt2, tokenizer, prompts, completions).items()
                   if mode in ("left", "right")}  # a packed row is lesson 01's question, not this one
print(f"gpt2 (random init), positions counted from the mask: {gpt2_positioned}; its completions' log-probs average "
      f"{sum(map(abs, alone)) / len(alone):.0f} nats")

# %% [markdown]
# So the safe recipe for scoring is `use_cache=False` and right padding (what TRL's DPO collator does), or
# `position_ids` counted from the attention mask when you pad left: GPT-2 then scores left-padded rows as it scores
# them one at a time.
#
# ## 5. Generation with a cache, on the trained Qwen2
#
# `generation_check` compares batched greedy generation with one prompt at a time, for each padding side, on the
# SFT model and the eval prompts above.

# %%
generation = generation_check(model, tokenizer, prompts)
lengths = [len(tokenizer(prompt)["input_ids"]) for prompt in prompts]
changed = {side: sum(generation[side]["changed"]) for side in ("left", "right")}
shorter = companion.shorter_rows(generation, lengths)
print(f"outputs changed by batching: left {changed['left']}/{len(prompts)}, right {changed['right']}/{len(prompts)}")
print(f"right padding, the {shorter['padded_rows']} rows shorter than the longest: {shorter['changed_padded']} changed, "
      f"first-token logits moved at least {shorter['min_shift_padded']:.2g}; the unpadded rows: "
      f"{shorter['changed_unpadded']} changed, moved at most {shorter['max_shift_unpadded']:.1e}")

# %% [markdown]
# ## 6. A tangent from the report: SFT evaluation at eval batch > 1
#
# The reporter also saw SFT evaluation of Llama 3.1 stop with a padding-side error at eval batch > 1. Today's
# real `SFTTrainer` with a tiny Llama trained briefly, then `evaluate()` at eval batch 1 and 2 (the eval rows
# alternate one-word answers and biographies, so every batch of 2 must be padded):

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
# `Trainer.evaluate()` averages one loss per batch, and SFT's loss of a batch is the mean over its label tokens.
# `per_row_eval_losses` scores every row alone with the trainer's own `prediction_step`; `batched_eval_loss`
# averages them the way evaluate() does. If padding changed a row's loss, the prediction would miss.

# %%
eval_rows_alone = per_row_eval_losses(llama_sft)
predicted = {size: batched_eval_loss(eval_rows_alone, size) for size in (1, 2)}
sft_eval_gap = {size: abs(sft_eval[size]["eval_loss"] - predicted[size]) for size in (1, 2)}
companion.explain_batch_effect(sft_eval, predicted, sft_eval_gap)

# %% [markdown]
# ## 7. With FlashAttention: the same checks on the kernel of the report
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
# ## 8. Compare

# %%
companion.figure_deeper(run, scoring, generation, audits)

# %% [markdown]
# ## Checks
#
# The claims above, asserted on this run's numbers.

# %% jupyter={"source_hidden": true}
numbers = companion.deeper_numbers(first, report, families["today"], audits, generation, lengths, no_positions,
                                   gpt2_positioned, scoring, sft_eval, bf16_error, flash, predicted, sft_eval_gap,
                                   padding_free=(padding_free_trainer, trl_warnings, padding_free_batch))
era_metrics = [first.to_metrics(), report.to_metrics()]
check(run, numbers, eras=era_metrics)
