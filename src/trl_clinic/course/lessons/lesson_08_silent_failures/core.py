# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 08 · Today's silent failures: three runs whose loss falls and which are wrong
#
# Three failures of 2025-26 that stop nothing: a prompt trained as the answer
# ([TRL #6105](https://github.com/huggingface/trl/issues/6105)), a turn end never learned, a DoRA magnitude that
# never moves ([TRL #7268](https://github.com/huggingface/trl/issues/7268)).
#
# **You will learn**
# * to read what a trainer trains: its labels and its trainable dtypes;
# * the three fixes, as the lines you change;
# * that `checkup(trainer)` finds all three before the first step.
#
# **You should know**: `SFTTrainer`, chat templates, LoRA (lesson 03).
#
# **Time**: 30 s to run on the cpu [profile](../README.md#words-the-lessons-use); about 25 minutes to work through.
#
# > **Hosted** (Colab, Kaggle, no clone): upload the wheel `uv build` makes, then run `%pip install "./trl_clinic-0.1.0-py3-none-any.whl[course]"` first.

# %% tags=["parameters"]
profile = "auto"  # "auto" (gpu when CUDA is present), "cpu" or "gpu"
seed = 0
output_dir = None  # None: outputs/08_todays_silent_failures at the repository root

# %%
import trl_clinic.course  # first: the lessons' offline mode, and two optional libraries' warnings kept quiet
import torch
from datasets import Dataset
from peft import LoraConfig
from trl import SFTConfig, SFTTrainer

from trl_clinic import checkup
from trl_clinic.course.lessons.lesson_08_silent_failures import companion
from trl_clinic.course.models import make_causal_lm
from trl_clinic.course.parameters import start_run
from trl_clinic.course.results import check
from trl_clinic.course.tokenizer import build_tokenizer

run = start_run("08", profile, seed, output_dir)
tokenizer = build_tokenizer()  # a ChatML tokenizer (<|im_start|>, <|im_end|>) trained on the course's small world
rows = companion.chat_rows(run.sizes.rows, run.subseed("rows"))  # conversational prompt-completion rows
print(rows[0]["prompt"], rows[0]["completion"], sep="\n")
# three eras (side environments with the reports' versions) start on these rows in the background
old = companion.start_eras(run, tokenizer, rows)

# %% [markdown]
# ## 1. The prompt trained as the answer (TRL #6105)
#
# In an *era* with the report's TRL and transformers 5 (a side environment, built by `make eras`), the real
# `SFTTrainer` builds its dataset from the rows above, completion-only as TRL does for this format, and trains a tiny
# Llama:

# %% tags=["symptom"]
prompt_era = old["prompt"].result()  # waits for the side environment
companion.show(prompt_era)

# %% [markdown]
# A warning, a falling loss, and a row trained from its third token on: the model learns to write the question.
#
# ### Why: `len()` of a dictionary
#
# The old TRL wrote `completion_mask = [0] * len(prompt_ids) + [1] * (...)`, with `prompt_ids` from
# `apply_chat_template(prompt, tokenize=True, ...)`, which returns a dictionary since transformers 5:

# %% tags=["mechanism"]
prompt = rows[0]["prompt"]
encoded = tokenizer.apply_chat_template(prompt, tokenize=True, add_generation_prompt=True)
print(type(encoded).__name__, list(encoded), "-> len", len(encoded))
ids = tokenizer.apply_chat_template(prompt, tokenize=True, add_generation_prompt=True, return_dict=False)
print("return_dict=False:", len(ids), "token ids")

# %% [markdown]
# Two keys, two zeros, then ones over the rest of the prompt: count them on the row above.
#
# ### The fix

# %% [markdown] tags=["fix"]
# ```diff
# - trl==0.24.0
# + trl>=0.27.1          # it passes return_dict=False; or, pinned to that TRL: transformers<5
# ```
#
# Today's TRL on the same rows, and the [check-up](../README.md#words-the-lessons-use)'s `prompt_in_loss`
# [probe](../README.md#words-the-lessons-use) on the era's trainer and on today's (is the assistant header trained?):

# %%
def sft_trainer(name: str, data, tokenizer, **settings) -> SFTTrainer:
    """Today's SFTTrainer on a tiny Llama; ``settings``: what a part of the lesson is about."""
    args = SFTConfig(**{**run.trainer_kwargs(name, progress=False), "lr_scheduler_type": "constant", **settings})
    model = make_causal_lm(tokenizer, size=run.sizes.model_size, seed=run.seed)
    return SFTTrainer(model=model, args=args, train_dataset=data, processing_class=tokenizer)


with companion.heard() as today_warned:
    today = sft_trainer("prompt", Dataset.from_list(rows), tokenizer, max_steps=run.sizes.prompt_steps)
companion.show(today)
companion.verdict(prompt_era, "prompt_in_loss")
prompt_report = checkup(today, only=["prompt_in_loss"])

# %% [markdown]
# ## 2. A turn end the model never learns
#
# `assistant_only_loss=True` trains what the template marks with `{% generation %}`. A block that closes *before*
# the turn end (GLM's did, until TRL PR #5988) trains every answer, never the token that ends it:
#
# ```jinja
# {{ '<|im_start|>assistant\n' }}{% generation %}{{ m['content'] }}{% endgeneration %}{{ '<|im_end|>\n' }}
# ```

# %%
def turn_trainer(name: str, template: str) -> SFTTrainer:
    chat = build_tokenizer()
    chat.chat_template = template
    talks = companion.chat_rows(run.sizes.turn_rows, run.subseed("turn rows"))
    data = Dataset.from_list([{"messages": talk["prompt"] + talk["completion"]} for talk in talks])
    return sft_trainer(name, data, chat, assistant_only_loss=True, max_steps=run.sizes.turn_steps,
                       per_device_train_batch_size=run.sizes.turn_batch_size,
                       learning_rate=run.sizes.turn_learning_rate)


questions = companion.chat_rows(run.sizes.asked, run.subseed("questions"))
with companion.heard() as outside_warned:
    outside = turn_trainer("turn-end-outside", companion.TURN_END_OUTSIDE)
outside.train()
outside_answers = companion.answers("turn end outside the mask", outside, questions, run.sizes.max_new_tokens)

# %% [markdown]
# The loss fell; one warning went by at the start; the answers run on. The template's own assistant mask on one
# conversation (trained tokens in brackets):

# %% tags=["mechanism"]
chat, talk = outside.processing_class, rows[0]["prompt"] + rows[0]["completion"]
rendered = chat.apply_chat_template(talk, return_dict=True, return_assistant_tokens_mask=True)
pairs = zip(rendered["input_ids"], rendered["assistant_masks"])
print("".join(f"[{chat.decode([t])}]" if trained else chat.decode([t]) for t, trained in pairs))

# %% [markdown]
# No step asked the model to emit `<|im_end|>`, so every step pushed it down.
#
# ### The fix: the turn end inside `{% generation %}`

# %% [markdown] tags=["fix"]
# ```diff
# - {% generation %}{{ m['content'] }}{% endgeneration %}{{ '<|im_end|>\n' }}
# + {% generation %}{{ m['content'] + '<|im_end|>' }}{% endgeneration %}{{ '\n' }}
# ```
#
# The same run with that template, then the check-up's `turn_end` probe on both (is the turn end a label?):

# %%
with companion.heard() as inside_warned:
    inside = turn_trainer("turn-end-inside", companion.TURN_END_INSIDE)
inside.train()
inside_answers = companion.answers("turn end inside the mask", inside, questions, run.sizes.max_new_tokens)
turn_ends = {name: companion.verdict(checkup(trainer, only=["turn_end"], show=False), "turn_end", name)
             for name, trainer in (("outside", outside), ("inside", inside))}

# %% [markdown]
# ## 3. QDoRA's magnitude that never moves (TRL #7268)
#
# DoRA splits each adapted weight into a direction (LoRA's A and B) and a magnitude (`lora_magnitude_vector`).
# The report's TRL casts a quantized model's trainable tensors to bfloat16, the magnitude too. In an era with it and
# bitsandbytes (4 bits train on a CPU too): DoRA on every linear layer, lr 2e-4, bf16, as reported; then the same
# run with the magnitude cast back to float32:

# %% tags=["symptom"]
qdora = old["qdora"].result()
companion.show(qdora)

# %% [markdown]
# LoRA's B moved, the magnitude did not: the run trains LoRA and calls it DoRA.
#
# ### Why: half a gap of bfloat16
#
# bfloat16 keeps 8 bits of mantissa; a sum rounds to the nearest value it holds, so a step must cross half the gap
# to move a weight. AdamW's steps are about the learning rate:

# %% tags=["mechanism"]
magnitude = torch.tensor(0.5, dtype=torch.bfloat16)
print("bfloat16, one half minus and plus 2e-4:", (magnitude - 2e-4).item(), (magnitude + 2e-4).item())
eps = torch.finfo(torch.bfloat16).eps  # the gap above 1
print("its neighbours:", 0.5 - eps / 4, 0.5 + eps / 2, "| in float32:", (magnitude.float() - 2e-4).item())

# %% [markdown]
# The magnitudes above (range printed) have gaps as wide: every step rounds back.
#
# ### The fix
#
# The next TRL release keeps the magnitude in float32. Pinned? Cast it back before `train()` makes the optimizer
# (the era's "workaround" run):

# %% [markdown] tags=["fix"]
# ```diff
# - trl==1.14.2
# + trl>=1.15.0
#
#   # or, on the older TRL, after SFTTrainer(...):
# + for name, param in trainer.model.named_parameters():
# +     if "lora_magnitude_vector" in name:
# +         param.data = param.data.float()
# ```
#
# The same run on today's TRL (an era, the other libraries unchanged), and the check-up's `stalled_update` probe on
# both (one optimizer step on copies of the 16-bit trainable tensors):

# %%
qdora_today = old["qdora_today"].result()
companion.show(qdora_today)
for era in (qdora, qdora_today):
    companion.verdict(era, "stalled_update")

# %% tags=["figure"]
numbers = companion.record(prompt_era, today, today_warned, prompt_report, {
    "outside": (outside, outside_answers, outside_warned, turn_ends["outside"]),
    "inside": (inside, inside_answers, inside_warned, turn_ends["inside"])}, qdora, qdora_today, run.precision)
companion.figure(run, numbers)

# %% [markdown]
# ## 4. Check your own trainer
#
# Two reads before `train()`: what the loss trains (one row of the first batch) and the trainable tensors' dtypes.

# %% tags=["portable-check"]
def trained_text(trainer, row: int = 0) -> str:
    """One row of the trainer's first batch as text, each token its loss trains in [brackets]."""
    batch, tok = next(iter(trainer.get_train_dataloader())), trainer.processing_class
    pairs = zip(batch["input_ids"][row].tolist(), batch["labels"][row].tolist())
    return "".join(f"[{tok.decode([i])}]" if label != -100 else tok.decode([i]) for i, label in pairs)


def trainable_dtypes(trainer) -> dict[str, list[str]]:
    """Each dtype the trainable tensors are kept in, and the kinds kept in it (lora_A, lora_magnitude_vector, ...)."""
    kinds: dict[str, set[str]] = {}
    for name, param in trainer.model.named_parameters():
        if param.requires_grad:
            kind = next((part for part in name.split(".") if part.startswith("lora_")), name.split(".")[-2])
            kinds.setdefault(str(param.dtype), set()).add(kind)
    return {dtype: sorted(names) for dtype, names in kinds.items()}


# %%
print(trained_text(outside).replace("<|pad|>", ""))
dora = SFTTrainer(model=make_causal_lm(tokenizer, seed=run.seed, dtype=torch.bfloat16), args=today.args,
                  train_dataset=Dataset.from_list(rows), processing_class=tokenizer,
                  peft_config=LoraConfig(use_dora=True, target_modules="all-linear"))
print("a bfloat16 model with DoRA adapters, today:", trainable_dtypes(dora))

# %% [markdown]
# `<|im_end|>` is outside the brackets: this model will never stop. The DoRA adapters of an unquantized model train
# in float32; the older TRL's QDoRA trainer reads bfloat16. `checkup(trainer)` runs every probe, these three too.
#
# ## Recap
#
# * A falling loss says nothing about *what* is trained: read the labels of one row.
# * The old TRL on transformers 5 trains the prompt (`len()` of a dictionary); upgrade TRL.
# * A template's `{% generation %}` block must hold the turn end, or the model never learns to stop.
# * bfloat16 rounds away steps below half its gap: DoRA's magnitude at lr 2e-4 in TRL #7268.
# * `trained_text(trainer)`, `trainable_dtypes(trainer)`, or `checkup(trainer)`, before `train()`.
#
# ## Exercises
#
# 1. By hand: under the old TRL's rule, how many prompt tokens of a row whose prompt renders to `p` tokens are
#    trained? Check your answer on the era's counts (`prompt_era.result["masks"]`).
#    <details><summary>Hint</summary>The mask starts with <code>len()</code> of a two-key dictionary.</details>
# 2. Print `trained_text(inside)` and `trained_text(today)`. What is in brackets in each, and why?
#    <details><summary>Hint</summary>Conversations against prompt-completion rows.</details>
# 3. How large must a step be to move a bfloat16 one half down, and up? Try steps with the mechanism cell's lines.
#    <details><summary>Hint</summary>Half the gap to each neighbour.</details>
#
# Worked solutions: [solutions/08_todays_silent_failures.ipynb](solutions/08_todays_silent_failures.ipynb).

# %% tags=["exercise"]
def trained_by_old_trl(p: int) -> int:
    ...  # exercise 1: your count


print(trained_by_old_trl(len(ids)))

# %% tags=["exercise"]
# exercise 2: trained_text(inside) and trained_text(today)

# %% tags=["exercise"]
# exercise 3: steps around torch.tensor(0.5, dtype=torch.bfloat16)

# %% [markdown]
# ## Checks
#
# The claims above, asserted on this run's numbers.

# %% jupyter={"source_hidden": true}
era_records = [era.to_metrics() for era in (prompt_era, qdora, qdora_today)]  # finished, skipped or failed
check(run, numbers, eras=era_records)
