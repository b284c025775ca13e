# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 01 · Padding-free training gives an abnormally high loss
#
# In [TRL issue #2834](https://github.com/huggingface/trl/issues/2834), padding-free SFT started at a far higher
# loss than padded training, more so at bigger batches: the user's `--attn_implementation` never reached the model.
#
# **You will learn**
# * why a packed row needs a block-diagonal attention mask;
# * how to make the attention flag reach the model, and read it there;
# * a dozen-line check that your trainer keeps packed sequences apart.
#
# **You should know**: TRL's `SFTTrainer`; what an attention mask does.
#
# **Time**: 30 s to run on the cpu [profile](../README.md#words-the-lessons-use); about 25 minutes to work through.
#
# > **Hosted** (Colab, Kaggle, no clone): upload the wheel `uv build` makes, then run `%pip install "./trl_clinic-0.1.0-py3-none-any.whl[course]"` first.

# %% tags=["parameters"]
profile = "auto"  # "auto" (gpu when CUDA is present), "cpu" or "gpu"
seed = 0
output_dir = None  # None: outputs/01_padding_free_high_loss at the repository root

# %%
import trl_clinic.course  # first: the lessons' offline mode, and two optional libraries' warnings kept quiet
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import SFTConfig, SFTTrainer

from trl_clinic.course.lessons.lesson_01_padding_free import companion
from trl_clinic.course.models import make_causal_lm
from trl_clinic.course.parameters import start_run
from trl_clinic.course.results import check

run = start_run("01", profile, seed, output_dir)
# the copy-task examples; the report's libraries loading in the background on them (an era: a side environment
# with the old versions); meanwhile a tiny Llama learns the task, whose answer copies its own prompt
examples, then, checkpoint = companion.prepare(run)

# %% [markdown]
# ## 1. The symptom, on the report's own libraries
#
# The model above learned a copy task: a prompt, a two-token template, then the prompt again, so its answer can
# only come from its own prompt. In an *era* (a side environment with the report's TRL 0.14.0 and transformers
# 4.48.3, built by `make eras`) the real `SFTTrainer` loads it *by path*, as the report's script did, and trains
# one epoch at learning rate 0 (every step sees the same weights), padded, then padding-free:
#
# ```python
# collator = DataCollatorForCompletionOnlyLM(template, tokenizer=tokenizer, padding_free=True)
# args = SFTConfig(learning_rate=0, per_device_train_batch_size=batch_size, num_train_epochs=1, logging_steps=1)
# trainer = SFTTrainer(model="path/to/model", args=args, train_dataset=examples, data_collator=collator)
# ```

# %% tags=["symptom"]
old = then.result()  # waits for the side environment
companion.show_logs(old)

# %% [markdown]
# Same weights, same examples: only the batching differs (at batch 1 both runs send the same row). Compare the
# `loss` of the two logs and the ratio at each batch size.
#
# ## 2. Why: what each token may attend to
#
# Padding-free concatenates the batch into one row and restarts `position_ids` at 0 for each sequence. Below,
# a row of three short sequences: each row of a grid is a query token, each column a key; a cell is coloured
# where an attention weight is above 0 (measured on the eager kernel).

# %% tags=["mechanism"]
lengths = run.sizes.mask_lengths  # position_ids 0 1 2 | 0 1 | 0 1 2
counts = companion.show_masks(run, old, checkpoint, lengths)  # the era's pattern beside today's, drawn and counted

# %% [markdown]
# The old kernel used one causal mask over the whole row: the first token of the second sequence attends to
# all of the first (the red cells). A packed row needs the block-diagonal mask on the right, where a token
# sees only its own sequence. Each sequence added to the row adds foreign keys for every token after it: the
# bigger the batch, the more each token reads from other samples.
#
# FlashAttention takes the boundaries from the `cu_seq_lens` that TRL's padding-free collator sends; today's sdpa
# and eager find them in `position_ids` when the row comes with no mask and no cache (transformers 5.23.0,
# `masking_utils._preprocess_mask_arguments`). In the report,
# FlashAttention was asked for but never reached the model.
#
# ## 3. The fix: make the flag reach the model
#
# `SFTTrainer` builds a model given by name or path with `SFTConfig.model_init_kwargs` (and ignores them, with a
# warning, for a model you built yourself). The user's fix in the thread, shortened:

# %% [markdown] tags=["fix"]
# ```diff
# + training_args.model_init_kwargs = {"attn_implementation": model_args.attn_implementation,   # flash_attention_2
# +                                    "torch_dtype": model_args.torch_dtype}
#   trainer = SFTTrainer(model=model_args.model_name_or_path, args=training_args, ...)
# + assert trainer.model.config._attn_implementation == "flash_attention_2"   # read it on the built model
# ```
#
# On the cpu profile both runs use sdpa, so the flag changes nothing here: the upgrade changed the loss (today's
# sdpa reads the boundaries, as above). On the gpu profile the flag brings FlashAttention: there it is the fix.
# The same lines on today's TRL, with this profile's kernel:

# %%
tokenizer = AutoTokenizer.from_pretrained(checkpoint)


def sft_trainer(batch_size: int, padding_free: bool, model=str(checkpoint)) -> SFTTrainer:
    """Today's SFTTrainer on the same model and examples, at learning rate 0 (the weights never change)."""
    args = SFTConfig(**run.trainer_kwargs(f"batch-{batch_size}-{padding_free}", progress=False),
                     model_init_kwargs={"attn_implementation": run.attention,  # the flag reaches the model
                                        # FlashAttention takes half-precision weights; sdpa and eager keep fp32
                                        "dtype": "bfloat16" if run.attention.startswith("flash") else "float32"},
                     padding_free=padding_free, max_length=None, completion_only_loss=True,
                     per_device_train_batch_size=batch_size, learning_rate=0.0, num_train_epochs=1)
    return SFTTrainer(model=model, args=args, train_dataset=examples, processing_class=tokenizer)


# %%
today = companion.loss_by_batch_size(sft_trainer, run.sizes.batch_sizes)

# %% tags=["figure"]
companion.plot_bad_vs_fixed(run, old, today)

# %% [markdown]
# ## 4. Check your own trainer
#
# A dozen lines of plain torch and TRL, for any trainer whose batches carry `position_ids`: send its first packed
# row through the model as `SFTTrainer` does, then each sequence alone. The first sequence has nothing before it,
# so its difference is rounding; a later one that differs by much more has read its neighbours.

# %% tags=["portable-check"]
import torch


@torch.no_grad()
def packed_vs_alone(trainer) -> list[float]:
    """Each sequence of the trainer's first packed row: largest |logit difference| against the sequence alone."""
    model = trainer.model.eval()
    batch = next(iter(trainer.get_train_dataloader()))
    inputs = {k: v.to(model.device) if torch.is_tensor(v) else v for k, v in batch.items() if k != "labels"}
    packed = model(**inputs, use_cache=False).logits[0]  # the row as SFTTrainer sends it (it passes use_cache=False)
    starts = (inputs["position_ids"][0] == 0).nonzero().flatten().tolist() + [packed.shape[0]]
    return [(packed[a:b] - model(input_ids=inputs["input_ids"][:, a:b], use_cache=False).logits[0]).abs().max().item()
            for a, b in zip(starts, starts[1:])]


# %% [markdown]
# On the lesson's trainer, and on the same trainer with an OPT model (sdpa), whose mask builder is never given
# `position_ids` (read in the [deep dive](deeper/01_padding_free_high_loss_deeper.ipynb), section 3):

# %%
opt = make_causal_lm(tokenizer, "opt", seed=run.seed)  # built by hand: model_init_kwargs does not apply
trainers = {"Llama": sft_trainer(16, True), "OPT": sft_trainer(16, True, model=opt)}
portable = {name: packed_vs_alone(trainer) for name, trainer in trainers.items()}
for name, (first, *later) in portable.items():
    print(f"{name}: first sequence {first:.1e} (rounding), later ones up to {max(later):.1e}")

# %% [markdown]
# The [check-up](../README.md#words-the-lessons-use)'s `packing` [probe](../README.md#words-the-lessons-use) runs the same comparison on the OPT trainer, with the trainer's own collator:

# %%
from trl_clinic import checkup

probe = companion.checkup_status(checkup(trainers["OPT"], only=["packing"]))

# %% [markdown]
# ## Recap
#
# * Padding-free packs a batch into one row; it is correct only when attention stops at each sequence's start.
# * A plain causal mask over the row lets every token read the sequences before it: the loss rises, and rises
#   with the batch size.
# * FlashAttention reads the boundaries from `cu_seq_lens`; today's sdpa and eager from `position_ids` (no mask,
#   no cache) where the family's mask builder gets them (Llama, not OPT).
# * Pass the kernel in `model_init_kwargs` (or to `from_pretrained`) and read `model.config._attn_implementation`
#   on the model you train.
# * `packed_vs_alone(trainer)` or `checkup(trainer, only=["packing"])` before a padding-free run.
#
# ## Exercises
#
# 1. Count by hand: how many cross-sequence cells does one causal mask over a row of 3, 2 and 3 tokens let
#    through? Then for `b` sequences of `m` tokens: how does it grow with the batch?
#    <details><summary>Hint</summary>Sequence j sees every token of the sequences before it: sum the products
#    of the lengths over pairs. Check your count on <code>torch.ones(8, 8).tril()</code>.</details>
# 2. A hand-written loop that leaves `use_cache` on: run the packed row of `sft_trainer(16, True)` through
#    `model(**inputs, use_cache=True)` (the row without its `labels`). Is the Llama still isolated?
#    <details><summary>Hint</summary>Start from <code>packed_vs_alone</code>; section 2 says when today's sdpa
#    looks for boundaries.</details>
# 3. Is it the kernel or the family? Run `packed_vs_alone` with eager attention for Llama
#    (`AutoModelForCausalLM.from_pretrained(checkpoint, attn_implementation="eager")`) and OPT.
#    <details><summary>Hint</summary>Pass each model to <code>sft_trainer(16, True, model=...)</code>;
#    <code>make_causal_lm</code> takes <code>attn_implementation</code> too.</details>
#
# Worked solutions: [solutions/01_padding_free_high_loss.ipynb](solutions/01_padding_free_high_loss.ipynb).

# %% tags=["exercise"]
def cross_sequence_cells(lengths: list[int]) -> int:
    ...  # exercise 1: your count


print(cross_sequence_cells(lengths))

# %% tags=["exercise"]
inputs = {k: v for k, v in next(iter(sft_trainer(16, True).get_train_dataloader())).items() if k != "labels"}
# exercise 2: run `inputs` through the model with use_cache=True and compare each sequence with it alone

# %% tags=["exercise"]
eager_llama = AutoModelForCausalLM.from_pretrained(checkpoint, attn_implementation="eager")
# exercise 3: the same for OPT, then packed_vs_alone on a trainer of each

# %% [markdown]
# ## Checks
#
# The claims above, asserted on this run's numbers.

# %% jupyter={"source_hidden": true}
numbers = companion.record(run, old, today, portable, counts, probe)
era_records = [old.to_metrics()]  # the era's run: finished, skipped or failed
check(run, numbers, eras=era_records)
