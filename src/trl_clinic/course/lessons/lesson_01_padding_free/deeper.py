# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 01, deeper · Padding-free training: the versions, the families, the remedies
#
# [The core](../01_padding_free_high_loss.ipynb) showed the report's symptom on TRL 0.14.0 + transformers 4.48.3
# (a plain causal mask over the packed row), the block-diagonal mask the row needs, and the fix: an attention
# kernel that reads the sequence boundaries, reaching the model. This notebook keeps the evidence around it:
#
# 1. **Between the report and today** (TRL 0.21.0 + transformers 4.55.4, the real code in a side environment):
#    a mask of ones sent with the row, and the KV cache, each turn the boundary search off.
# 2. **What keeps packed sequences apart today**, and what breaks it, measured on six model families.
# 3. **OPT**, a family today's padding-free batches still contaminate, through today's real `SFTTrainer`:
#    the report's symptom (loss and grad norm growing with the batch size) on reading-comprehension and
#    instruction data, a short training, and the report's remedies; beside it a Llama of the same size, which
#    today's sdpa keeps apart, measured the same way.
# 4. **The flag must reach the model**: `model_init_kwargs` with a model path and with a model instance.
# 5. **Why bother**: padding share, throughput and memory, padded against padding-free.
#
# > **Hosted** (Colab, Kaggle, no clone): upload the wheel `uv build` makes, then run `%pip install "./trl_clinic-0.1.0-py3-none-any.whl[course]"` first.

# %% tags=["parameters"]
profile = "auto"  # "auto" (gpu when CUDA is present), "cpu" or "gpu"
seed = 0
output_dir = None  # None: outputs/01_padding_free_high_loss_deeper at the repository root

# %%
import trl_clinic.course  # first: the lessons' offline mode, and two optional libraries' warnings kept quiet
from transformers import AutoModelForCausalLM
from trl import SFTConfig, SFTTrainer

from trl_clinic.course import data
from trl_clinic.course.lessons.lesson_01_padding_free import companion
from trl_clinic.course.models import attention_implementation, model_maker
from trl_clinic.course.parameters import start_run
from trl_clinic.course.results import check
from trl_clinic.course.tokenizer import build_tokenizer
from trl_clinic.probes.packing import packed_vs_separate

run = start_run("01-deeper", profile, seed, output_dir)
print(run.describe())
sizes = run.sizes
examples = companion.copy_examples(sizes.samples, run.subseed("examples"))
then = companion.start_era(run, companion.ERA_LATE, examples)  # TRL 0.21 + transformers 4.55.4 load in the background...
checkpoint = companion.train_copier(run)  # ...while the core's copy-task model is trained again (same seed, same weights)

# %% [markdown]
# ## 1. Between the report and today: TRL 0.21 and transformers 4.55
#
# Where each change was read (the released wheels):
#
# | what | versions | where |
# |---|---|---|
# | sdpa/eager find sequence boundaries in `position_ids` (no mask, no cache; with torch 2.6 or later through 4.57.1, any torch from 5.0.0) | transformers 4.53.1 and later (absent in 4.53.0) | `masking_utils.find_packed_sequence_indices`, `_preprocess_mask_arguments` |
# | `SFTConfig(padding_free=True)`; `SFTTrainer` warns when the model is not on FlashAttention | TRL 0.16.0 to 1.15.0 (no warning in 1.16.0; there only the option's help says "FlashAttention 2 or 3") | `sft_config.py`, `sft_trainer.py` `__init__` |
# | the padding-free collator (without packing) sends a mask of ones; `position_ids` only under FlashAttention | TRL 0.19.0 to 0.23.0 | `sft_trainer.py`: `return_position_ids=use_flash_attention` (0.21.0) |
# | `compute_loss` passes `use_cache=False` | TRL 0.22.0 and later | `sft_trainer.py` `compute_loss` |
# | the padding-free collator sends `position_ids` and no mask | TRL 0.23.1 and later | `DataCollatorForLanguageModeling.torch_call` |
# | with an attention mask, FlashAttention-2 unpads by the mask (a mask of ones: one sequence) | transformers 4.55.4, 5.23.0 | `modeling_flash_attention_utils._flash_attention_forward` |
#
# The side environment runs TRL 0.21.0's real `SFTTrainer` (padding-free, sdpa) on the core's copy-task model,
# and packed rows through transformers 4.55.4 in train mode with and without the config's `use_cache=True`:

# %%
late = then.result()  # waits for the side environment
companion.describe_late(late)

# %%
lengths = sizes.mask_lengths
if late.finished:
    companion.plot_masks(run, {f"4.55.4, {mode}": pattern for mode, pattern in late.result["attention_pattern"].items()},
                         lengths, file="attention_masks_4_55")

# %% [markdown]
# ## 2. What keeps packed sequences apart today, and what breaks it
#
# `packed_vs_separate(model, sequences)` runs each sequence alone, then all of them packed into one row with
# `position_ids` restarting at 0 (today's padding-free inputs), and compares each sequence's loss; it can also
# send the row with a mask of ones, or ask for a KV cache. On a tiny random Llama with wide weights (attention
# far from uniform, so a foreign token moves the loss without training):

# %%
tokenizer = build_tokenizer()
held_out = [companion.as_sequence(tokenizer, row)
            for row in data.mrc_samples(sizes.train_batch_size, seed=run.subseed("held-out"), max_sentences=sizes.max_sentences)]
llama = companion.family_model(tokenizer, "llama", run.seed)
probes = {"position_ids, no mask, no cache": packed_vs_separate(llama, held_out[:4]),
          "+ an attention mask of ones": packed_vs_separate(llama, held_out[:4], all_ones_mask=True),
          "+ use_cache=True": packed_vs_separate(llama, held_out[:4], use_cache=True)}
companion.describe_probes(probes)

# %% [markdown]
# The boundary search happens only in mask builders that are given `position_ids`. Six families with
# today's padding-free inputs:

# %%
families = {family: companion.family_probe(tokenizer, family, run.seed, held_out[:4]) for family in companion.FAMILY_CONFIGS}
companion.describe_probes(families)
companion.plot_families(run, families)

# %% [markdown]
# ## 3. OPT through today's real `SFTTrainer`
#
# OPT's mask builder is not given `position_ids` (transformers 5.23.0, `OPTDecoder.forward`), so today's
# `SFTTrainer(padding_free=True)` on sdpa contaminates it: the report's setting, live. Beside it, a Llama of the
# same size on the same data, whose mask builder reads the boundaries in `position_ids` (the fix on sdpa): every
# measurement below runs on both. Each model is first trained briefly (padded); then every comparison runs at
# learning rate 0, so only the batching differs. Reading comprehension (a passage, a question, a one-word
# answer) and short instructions, each with the loss on the completion only and on the whole sequence:

# %%
bench = companion.Bench(run, tokenizer)
models = {"without_fix": "opt", "with_fix": "llama"}  # on sdpa: OPT ignores position_ids, Llama reads them
label = {"opt": "OPT", "llama": "Llama"}


def sft_trainer(batch_size: int, padding_free: bool, dataset, family: str = "opt", **config) -> SFTTrainer:
    """Today's SFTTrainer on the warmed-up model of ``family``."""
    args = SFTConfig(**run.trainer_kwargs(f"{family}-{batch_size}-{padding_free}", progress=False),
                     per_device_train_batch_size=batch_size, padding_free=padding_free, max_length=None, **config)
    return SFTTrainer(model=bench.warm_model(family), args=args, train_dataset=dataset, processing_class=tokenizer)


# %%
mrc = data.mrc_samples(sizes.measure_samples, seed=run.subseed("measure"), max_sentences=sizes.max_sentences)
instructions = data.instruction_pairs(sizes.measure_samples, seed=run.subseed("measure"), max_people=2)
settings = {"MRC, completion-only": (mrc, True), "MRC, whole sequence": (mrc, False),
            "instructions, completion-only": (instructions, True), "instructions, whole sequence": (instructions, False)}
sweep = {}
for name, family in models.items():
    print(f"{label[family]}:")
    sweep[name] = bench.sweep(sft_trainer, settings, sizes.batch_sizes, family=family)
companion.plot_sweep(run, sweep["without_fix"], sizes.batch_sizes)

# %%
loss_ratio = {name: {s: companion.ratios(runs) for s, runs in sweep[name].items()} for name in models}
grad_ratio = {name: {s: companion.ratios(runs, "grad_norm") for s, runs in sweep[name].items()} for name in models}
worst = max(loss_ratio["without_fix"], key=lambda s: loss_ratio["without_fix"][s][-1])
print(f"At batch {sizes.batch_sizes[-1]}, OPT suffers most on {worst} ({loss_ratio['without_fix'][worst][-1]:.2f}x); the "
      f"report's \"worst on MRC\" {'holds' if worst.startswith('MRC') else 'does not hold'} here. The Llama's ratios stay "
      f"within {max(abs(r - 1) for rs in loss_ratio['with_fix'].values() for r in rs):.0e} of 1.")

# %% [markdown]
# ### A short training
#
# The report saw a high loss at the start and a grad norm that "fluctuates abnormally". Each warmed-up model
# trains for the profile's `train_steps`, padded and padding-free, on fresh samples (Trainer's default schedule,
# clipping at 1.0); only the first step sees the same weights in both runs.

# %%
train_set = data.mrc_samples(sizes.train_batch_size * sizes.train_steps, seed=run.subseed("train"), max_sentences=sizes.max_sentences)
before = packed_vs_separate(bench.warm_model("opt").to(run.device), held_out)["ratio"]  # held-out packed/alone, before
training = {name: {mode: bench.training(sft_trainer, padding_free, train_set, held_out, completion_only_loss=False, family=family)
                   for mode, padding_free in companion.MODES.items()} for name, family in models.items()}
companion.describe_training({f"{label[models[name]]}, {mode}": t for name, runs in training.items() for mode, t in runs.items()})
companion.plot_training(run, {f"OPT, {mode}": t for mode, t in training["without_fix"].items()})

# %%
padded, free = training["without_fix"]["padded"], training["without_fix"]["padding-free"]
gap = {name: max(abs(f / p - 1) for f, p in zip(runs["padding-free"]["loss"], runs["padded"]["loss"]))
       for name, runs in training.items()}
print(f"Step 1, same weights: the padding-free grad norm is {free['grad_norm'][0] / padded['grad_norm'][0]:.1f}x the padded "
      f"one. Largest grad norm in each run: padded {max(padded['grad_norm']):.2f}, padding-free {max(free['grad_norm']):.2f}. "
      f"Held-out packed/alone loss: {before:.3f} before training, {padded['held_out_ratio']:.3f} after the padded run, "
      f"{free['held_out_ratio']:.3f} after the padding-free one: trained on mixed rows, the model learns in part to discount "
      f"its neighbours. The Llama's padding-free losses follow padded to {gap['with_fix']:.0e}.")

# %% [markdown]
# ### The report's remedies
#
# A remedy *hides* the symptom when the logged loss goes down; it *cures* it only when the loss comes back to the
# padded run's with the same remedy. Data-side remedies: the padding-free/padded loss at learning rate 0 on the
# data each leaves (the same weights). Optimizer-side remedies: a short training each, padding-free against
# padded with the same change. On both models:

# %%
short = data.mrc_samples(sizes.measure_samples, seed=run.subseed("measure"), max_sentences=sizes.max_sentences // 4)
completion_only, largest = settings[worst][1], sizes.batch_sizes[-1]
optimizer_side = {"lower learning rate (/10)": {"learning_rate": sizes.train_learning_rate / 10},
                  "more warmup (half the steps)": {"warmup_steps": 0.5}, "tighter clipping (0.1)": {"max_grad_norm": 0.1}}
remedies = {}
for name, family in models.items():
    runs = sweep[name][worst]  # the logged loss the remedies try to bring down: padding-free at the largest batch
    remedies[name] = {f"smaller batch ({sizes.batch_sizes[0]})": {
        "over_padded": loss_ratio[name][worst][0], "loss": runs["padding-free"][0]["loss"], "baseline": runs["padding-free"][-1]["loss"]}}
    for remedy, dataset in (("shorter documents", short), ("balanced lengths", companion.length_grouped(mrc, largest))):
        lr0 = {mode: bench.measure(sft_trainer, pf, largest, dataset, completion_only_loss=completion_only, family=family)
               for mode, pf in companion.MODES.items()}
        remedies[name][remedy] = {"over_padded": lr0["padding-free"]["loss"] / lr0["padded"]["loss"],
                                  "loss": lr0["padding-free"]["loss"], "baseline": runs["padding-free"][-1]["loss"]}
    for remedy, config in optimizer_side.items():
        t = {mode: bench.training(sft_trainer, pf, train_set, held_out, completion_only_loss=False, family=family, **config)
             for mode, pf in companion.MODES.items()}
        remedies[name][remedy] = {"over_padded": t["padding-free"]["mean_loss"] / t["padded"]["mean_loss"],
                                  "loss": t["padding-free"]["mean_loss"], "baseline": training[name]["padding-free"]["mean_loss"],
                                  "held_out_ratio": t["padding-free"]["held_out_ratio"]}
    print(f"{label[family]}:")
    companion.describe_remedies(remedies[name])
companion.plot_remedies(run, remedies["without_fix"])

# %% [markdown]
# None of them touches attention, so none stops the mixing on OPT; on the Llama, which reads the boundaries,
# every remedy leaves padding-free equal to padded. For a family like OPT on sdpa, only a kernel that reads the
# boundaries or `padding_free=False` cures it. The trained runs' held-out packed/alone ratios show what
# training does instead: the model learns to discount its neighbours in part, from the value before training
# printed above towards 1, without reaching it.
#
# ## 4. The flag must reach the model
#
# `SFTTrainer` builds a model given by name or path with `model_init_kwargs`; for a model instance it ignores
# them (TRL 1.16.0, `SFTTrainer.__init__`, with a warning). Read the kernel on the built model:

# %%
eager = {"attn_implementation": "eager"}
kernels = {}
for how, model in (("model instance", AutoModelForCausalLM.from_pretrained(checkpoint)), ("model path", str(checkpoint))):
    args = SFTConfig(**run.trainer_kwargs(f"attn-{how}"), model_init_kwargs=eager, max_length=None)
    kernels[how] = attention_implementation(SFTTrainer(model=model, args=args, train_dataset=examples).model)
    print(f"{how} + model_init_kwargs eager -> {kernels[how]}")

# %%
try:
    args = SFTConfig(**run.trainer_kwargs("attn-fa2"), model_init_kwargs={"attn_implementation": "flash_attention_2"})
    fa2 = attention_implementation(SFTTrainer(model=str(checkpoint), args=args, train_dataset=examples).model)
except ImportError as error:
    fa2 = f"ImportError: {str(error)[:120]}"
print("model path + flash_attention_2 ->", fa2)

# %% [markdown]
# ## 5. Why bother: padding share, throughput, memory
#
# Padding-free exists to stop computing on pad tokens. A few training steps of each, padded and padding-free,
# on the same long reading-comprehension samples, with the profile's kernel (`run.attention`); tokens per
# second count real tokens after the first steps.

# %%
speed_set = data.mrc_samples(sizes.speed_batch_size * sizes.speed_steps, seed=run.subseed("speed"),
                             min_sentences=sizes.speed_min_sentences, max_sentences=sizes.speed_max_sentences)
make_speed_model, speed_tokenizer = model_maker(sizes.speed_model_size, seed=run.seed, attn_implementation=run.attention)
speed = {}
for mode, padding_free in companion.MODES.items():
    args = SFTConfig(**run.trainer_kwargs(f"speed-{mode}", logging=False, progress=False), padding_free=padding_free, max_length=None,
                     per_device_train_batch_size=sizes.speed_batch_size, max_steps=sizes.speed_steps)
    trainer = SFTTrainer(model=make_speed_model(), args=args, train_dataset=speed_set, processing_class=speed_tokenizer)
    speed[mode] = companion.throughput(trainer, warm_steps=sizes.speed_warm_steps)
companion.describe_throughput(speed)
companion.plot_throughput(run, speed, run.attention)

# %% [markdown]
# The Hugging Face post [Packing with FlashAttention-2](https://huggingface.co/blog/packing-with-FA2) reports up
# to 2x training throughput on a GPU; a CPU gains little or nothing, since sdpa there builds a full mask for the
# packed row and loses its causal fast path. Padding-free computes no pad tokens by construction.

# %% [markdown]
# ## Checks
#
# The claims above, asserted on this run's numbers.

# %% jupyter={"source_hidden": true}
era = companion.era_numbers(late)
runs = companion.record_runs(loss_ratio, grad_ratio, training, gap, remedies, probes, families, kernels, era)
numbers = {"precision": run.precision, "attention": run.attention, "batch_sizes": sizes.batch_sizes, "runs": runs,
           "sweep": sweep, "held_out_before": before, "fa2": fa2, "throughput": speed, "then": era}
era_records = [late.to_metrics()]  # the era's run: finished, skipped or failed
check(run, numbers, eras=era_records)
