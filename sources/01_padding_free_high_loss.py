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
# **The report** ([TRL issue #2834](https://github.com/huggingface/trl/issues/2834), February 2025, with
# TRL's `DataCollatorForCompletionOnlyLM`): SFT with padding-free batches started at a much higher loss
# than padded training, more so the bigger the batch, on Llama and Qwen models. The user had passed `--attn_implementation flash_attention_2`,
# but the flag stayed in the script's model arguments and never reached the model.
#
# **You will learn**
# * why packing a batch into one row is only correct when attention stops at each sequence's start,
#   and how the loss and grad norm grow with the batch size when it does not ("batch contamination");
# * what keeps packed sequences apart on sdpa/eager today (`position_ids`, no attention mask, no KV
#   cache, a model family whose mask reads them), and what breaks it;
# * how to check your own model with `packed_vs_separate`, and which of the usual remedies only hide
#   the symptom;
# * how to make sure `attn_implementation` reached the model you train.
#
# **You should know**
# * TRL's [`SFTTrainer`](https://huggingface.co/docs/trl/sft_trainer) and its
#   [padding-free option](https://huggingface.co/docs/trl/reducing_memory_usage#padding-free);
# * attention masks and `position_ids` in a causal LM
#   ([transformers glossary](https://huggingface.co/docs/transformers/glossary#attention-mask));
# * the Hugging Face post [Packing with FlashAttention-2](https://huggingface.co/blog/packing-with-FA2).
#
# **Time**: 97 s to run on the cpu profile (seed 0, 2 CPU cores, one lesson at a time: `trl-clinic run 01
# --profile cpu --jobs 1`); gpu profile not measured yet. About 30 minutes to read and try the exercises.
#
# **What runs here, and what is re-created.**
# * **Re-created** (sections 1, 4, 7, 8): the report's collator is gone from today's TRL and its
#   transformers cannot run beside today's, so the symptom is made on today's real
#   `SFTTrainer(padding_free=True)` by sending the packed row with an all-ones attention mask, as TRL 0.19.0-0.23.0's collator did
#   (`trl_clinic.course.stand_ins.recreated_all_ones_mask` names that code). It is a different cause with
#   the same effect: attention that does not stop at sequence boundaries.
# * **Then** (sections 2 and 6): the report's own mechanism, for real, in a side environment with
#   TRL 0.14.0 and transformers 4.48.3: TRL's collator sends `position_ids` and no mask, and that
#   transformers' sdpa/eager attention ignores them; then transformers 4.55.4 with TRL 0.21.0.
# * **Today, real** (sections 3, 5, 9, 10): the probe (an attention mask and a KV cache both break
#   isolation), the model families that today's padding-free batches contaminate, whether
#   `attn_implementation` reached the model, and the fix.

# %% tags=["parameters"]
profile = "auto"  # "auto" (gpu when CUDA is present), "cpu" or "gpu"
seed = 0
output_dir = None  # None: outputs/01_padding_free_high_loss at the repository root

# %%
from IPython.display import Markdown, display
from trl import SFTConfig, SFTTrainer

from trl_clinic.course import data
from trl_clinic.course.companions import padding_free as companion
from trl_clinic.course.models import attention_implementation, make_causal_lm
from trl_clinic.probes.packing import packed_vs_separate
from trl_clinic.course.parameters import start_run
from trl_clinic.course.results import failed_checks, recreated, save_metrics
from trl_clinic.course.stand_ins import recreated_all_ones_mask
from trl_clinic.course.tokenizer import build_tokenizer

run = start_run("01", profile, seed, output_dir)
print(run.describe())
sizes, tokenizer = run.sizes, build_tokenizer()
then_runs = companion.start_eras(run)  # section 2's side environments, in the background
bench = companion.Bench(run, tokenizer)  # warms each model up (padded) on first use
mrc = data.mrc_samples(sizes.measure_samples, seed=run.subseed("measure"))  # long, variable-length samples

# %% [markdown]
# ## 1. The symptom (re-created: TRL 0.19.0-0.23.0's all-ones mask)
#
# One real `SFTTrainer` per mode on a tiny Llama that was first trained briefly (a random model
# predicts every token about equally badly, whatever it attends to), at `learning_rate=0.0`: every
# step sees the same weights and only the batching differs. `padding_free=True` packs the batch into
# one row; `max_length=None` is required (TRL refuses `padding_free=True` without packing when a
# `max_length` is set). Batch 16 of reading-comprehension samples, the loss on the answers only (the
# report's `DataCollatorForCompletionOnlyLM` trained on completions):

# %% tags=["symptom"]
def sft_trainer(mode: str, batch_size: int, dataset, *, family: str = "llama", completion_only: bool = False,
                **config) -> SFTTrainer:
    """The real SFTTrainer on the warmed-up model: "padded", "fixed" (today's padding-free collator)
    or "contaminated" (padding-free with the re-created all-ones mask)."""
    # fp32 on every profile, so that "equal" means float precision
    args = SFTConfig(**{**run.trainer_kwargs(f"{family}-{mode}-{batch_size}", progress=False), "bf16": False},
                     per_device_train_batch_size=batch_size,
                     padding_free=mode != "padded",  # the flag this lesson is about
                     max_length=None, completion_only_loss=completion_only, **config)
    trainer = SFTTrainer(model=bench.warm_model(family), args=args, train_dataset=dataset, processing_class=tokenizer)
    if mode == "contaminated":  # RE-CREATED: the packed row goes out with an attention mask of ones
        trainer.data_collator = recreated_all_ones_mask(trainer.data_collator)
    return trainer


symptom = {mode: bench.measure(sft_trainer, mode, 16, mrc, completion_only=True)
           for mode in ("padded", "contaminated")}
print(f"batch 16, loss on the answers, same weights: padded loss {symptom['padded']['loss']:.2f}, padding-free with the all-ones mask "
      f"{symptom['contaminated']['loss']:.2f} ({symptom['contaminated']['loss'] / symptom['padded']['loss']:.1f}x)")

# %% [markdown]
# ## 2. Then: the report's mechanism, for real (TRL 0.14.0 + transformers 4.48.3)
#
# Section 1 re-created the effect with a mask. The report's cause ran without one: TRL 0.14.0's
# `DataCollatorForCompletionOnlyLM(padding_free=True)` (`trl/trainer/utils.py`) pops the attention
# mask and sends `position_ids` restarting at 0, and transformers 4.48.3's sdpa/eager attention
# ignores them (transformers looks for boundaries in `position_ids` from 4.53.1 on:
# `masking_utils.find_packed_sequence_indices` is absent from 4.53.0's `masking_utils.py`). An *era* (a side environment built once by
# `make eras`) runs that real old code: packed rows against each sequence alone (largest logit
# difference; 0 means isolated), then the real old `SFTTrainer` at lr 0, padded against padding-free,
# on a tiny Llama trained briefly on a copy task.

# %%
old = then_runs["01-trl-0.14"].result()  # waits for the background run
companion.describe_era(old)

# %% [markdown]
# ## 3. Why: packed sequences see each other. A check you can run on your own model
#
# `packed_vs_separate(model, sequences)` runs the sequences one at a time, then packed into one row
# with `position_ids` restarting at 0 (what TRL's collator sends), and compares each sequence's
# loss: equal means the model keeps them apart. Today's transformers reads the boundaries from
# `position_ids` only when no attention mask and no KV cache reach the mask builder
# (`masking_utils._preprocess_mask_arguments`); the probe tries each:

# %%
held_out = [companion.as_sequence(tokenizer, row) for row in mrc.select(range(16))]  # mrc is never trained on
probe_model = bench.warm_model("llama")
probes = {"llama, position_ids only": packed_vs_separate(probe_model, held_out[:4]),
          "llama, position_ids + all-ones mask": packed_vs_separate(probe_model, held_out[:4], all_ones_mask=True),
          "llama, position_ids + use_cache=True": packed_vs_separate(probe_model, held_out[:4], use_cache=True)}
companion.describe_probes(probes)

# %% [markdown]
# ## 4. The loss ratio grows with the batch size (re-created)
#
# At batch 1 there is nothing to contaminate. The more sequences share a row, the more foreign
# context each token sees. Reading comprehension (a passage of 3 to 40 sentences, a question, a
# one-word answer) and short instructions, each with a completion-only and a whole-sequence loss:

# %%
instructions = data.instruction_pairs(sizes.measure_samples, seed=run.subseed("measure"), max_people=2)
settings = {"MRC, completion-only": (mrc, True), "MRC, whole sequence": (mrc, False),
            "instructions, completion-only": (instructions, True), "instructions, whole sequence": (instructions, False)}
BATCH_SIZES = sizes.batch_sizes  # per-device batch sizes: 1 packs nothing
sweep = bench.sweep(sft_trainer, settings, BATCH_SIZES)

# %%
companion.plot_sweep(run, sweep, BATCH_SIZES, main="MRC, whole sequence")

# %%
ratios = {name: companion.ratios(runs) for name, runs in sweep.items()}
grad_ratios = {name: companion.ratios(runs, key="grad_norm") for name, runs in sweep.items()}
fixed_vs_padded = max(max(abs(r - 1) for r in companion.ratios(runs, "fixed")) for runs in sweep.values())
worst, least = max(ratios, key=lambda k: ratios[k][-1]), min(ratios, key=lambda k: ratios[k][-1])
mrc_worse = max(ratios[k][-1] for k in settings if k.startswith("MRC")) > max(
    ratios[k][-1] for k in settings if k.startswith("instructions"))

# %%
display(Markdown(
    f"At batch {BATCH_SIZES[-1]} and this seed, **{worst}** suffers most (loss ratio {ratios[worst][-1]:.2f}, "
    f"grad norm {grad_ratios[worst][-1]:.1f}x) and **{least}** least ({ratios[least][-1]:.2f}), so the report's "
    f"\"worst on MRC\" {'holds' if mrc_worse else 'does not hold'} here. Today's collator (\"fixed\") matches "
    f"padded to {fixed_vs_padded:.0e}."))

# %% [markdown]
# Which setting suffers most depends on the data, the model and the seed: measure it. Our passages
# are built from the same small world as the instructions, so foreign context is less foreign than
# between real documents.
#
# ## 5. Live today: families whose mask is built without `position_ids`
#
# The boundary search of section 3 happens only in mask builders that are given `position_ids`. The
# probe runs today's padding-free inputs (`position_ids`, no mask, no cache) on tiny models of six
# families, with random weights drawn wide enough (`initializer_range=0.2`) that attention is far
# from uniform. Then the real `SFTTrainer` with `padding_free=True` on a briefly trained OPT. TRL 1.16
# says nothing about it: the padding-free block of its `SFTTrainer.__init__` (`sft_trainer.py`) warns
# only about the "wrapped" packing strategy and about batch 1.

# %%
family_probes = {family: companion.family_probe(tokenizer, family, run.seed, held_out[:4])
                 for family in companion.FAMILY_CONFIGS}
companion.describe_probes(family_probes)
companion.plot_families(run, family_probes)

# %%
opt = {mode: bench.measure(sft_trainer, mode, 16, mrc, family="opt") for mode in ("padded", "fixed")}
opt_gap = abs(opt["fixed"]["loss"] / opt["padded"]["loss"] - 1)
print(f"OPT, real SFTTrainer at batch 16: padded loss {opt['padded']['loss']:.3f}, "
      f"padding_free=True {opt['fixed']['loss']:.3f} (relative difference {opt_gap:.1e})")

# %% [markdown]
# ## 6. Then: transformers 4.55.4 with TRL 0.21.0, and the KV cache
#
# Transformers 4.53.1 taught sdpa/eager to read `position_ids`, but TRL 0.19.0-0.23.0's collator
# sent an all-ones mask beside them (read in `trl/trainer/sft_trainer.py`,
# `DataCollatorForLanguageModeling.torch_call`; 0.23.1 sends none). And a model whose config says
# `use_cache=True` builds a cache in a forward that does not pass `use_cache=False`, which turns the
# boundary search off too (TRL 1.16's `SFTTrainer.compute_loss` passes `use_cache=False`; TRL 0.21.0's
# does not). The era runs the real 0.21.0 collator and that forward:

# %%
late = then_runs["01-transformers-4.55"].result()
companion.describe_era(late)

# %% [markdown]
# ## 7. The same in a short real training run (re-created)
#
# The report saw a high loss at the start of training and a grad norm that "fluctuates abnormally".
# The warmed-up Llama trains for a few dozen steps (Trainer's default schedule, clipping at 1.0) on
# fresh samples, padded, contaminated and fixed; afterwards the probe runs on the weights each left.

# %%
train_set = data.mrc_samples(sizes.train_batch_size * sizes.train_steps, seed=run.subseed("train"))
training = {mode: bench.training(sft_trainer, mode, train_set, held_out) for mode in companion.MODES}
companion.describe_training(training)
spike = training["contaminated"]["grad_norm"][0] / training["padded"]["grad_norm"][0]
fixed_vs_padded_training = max(abs(f / p - 1) for f, p in zip(training["fixed"]["loss"], training["padded"]["loss"]))

# %%
companion.plot_training(run, training, spike)

# %%
bad, padded = training["contaminated"], training["padded"]
display(Markdown(
    f"At the first step (the same weights for all three) the contaminated grad norm is **{spike:.0f}x** the padded "
    f"one. Clipping bounds each update and the model partly learns to discount the foreign context (packed/alone "
    f"held-out loss {bad['ratio']:.2f} after training); the logged loss ends at {bad['final_loss']:.2f} against "
    f"{padded['final_loss']:.2f} padded, and the clean held-out loss at {bad['held_out_loss']:.3f} against "
    f"{padded['held_out_loss']:.3f}. The fixed run follows padded step by step ({fixed_vs_padded_training:.0e})."))

# %% [markdown]
# ## 8. The report's remedies: which hide the symptom, which cure it (re-created contamination)
#
# A remedy **hides** the symptom when the logged loss or grad norm goes down; it **cures** it only
# when the probe, on the weights and rows the remedy leaves, finds the packed sequences isolated.
# Data-side remedies run at lr 0 against the contaminated batch-16 measurement; optimizer-side ones
# get one short training each, against the contaminated training above.

# %%
short_docs = data.mrc_samples(sizes.measure_samples, seed=run.subseed("measure"), max_sentences=10)
baseline, small = sweep["MRC, whole sequence"]["contaminated"][-1], BATCH_SIZES[1]
data_side = {  # name -> (how, lr-0 measurement, the rows it packs)
    "smaller batch": (f"batch {small}", sweep["MRC, whole sequence"]["contaminated"][1], held_out[:small]),
    "shorter documents": ("passages <= 10 sentences", bench.measure(sft_trainer, "contaminated", 16, short_docs),
                          [companion.as_sequence(tokenizer, row) for row in short_docs.select(range(16))]),
    "balanced lengths": ("group_by_length", bench.measure(sft_trainer, "contaminated", 16, mrc,
                                                          train_sampling_strategy="group_by_length"),
                         companion.length_grouped_row(tokenizer, mrc, 16))}
remedies = {name: (how, companion.remedy_at_lr_0(logged, probe_model, rows, baseline))
            for name, (how, logged, rows) in data_side.items()}

# %%
optimizer_side = {"lower learning rate": ("lr / 10", {"learning_rate": sizes.train_learning_rate / 10}),
                  "more warmup": ("warmup_steps=0.5", {"warmup_steps": 0.5}),
                  "tighter clipping": ("max_grad_norm=0.1", {"max_grad_norm": 0.1})}
for name, (how, config) in optimizer_side.items():
    t = bench.training(sft_trainer, "contaminated", train_set, held_out, **config)
    remedies[name] = (how, companion.remedy_trained(t, padded, bad))
remedies["separate the sequences"] = ("today's collator, no mask",
                                      companion.remedy_trained(training["fixed"], padded, bad))

# %%
remedies = companion.judge_remedies(remedies, separation="separate the sequences")
companion.plot_remedies(run, remedies)

# %% [markdown]
# ## 9. The fix: attention that knows the boundaries, reaching the model you train
#
# The original bug: the FlashAttention flag never reached the model. Read it on the **built model**
# (`model.config._attn_implementation`), never on your arguments. In TRL, `model_init_kwargs` only
# applies when the model is given by name or path; with a model instance it is ignored:

# %%
eager = {"attn_implementation": "eager"}
instance = SFTTrainer(model=make_causal_lm(tokenizer), processing_class=tokenizer, train_dataset=mrc,
                      args=SFTConfig(**run.trainer_kwargs("attn-instance"), model_init_kwargs=eager))
checkpoint = run.output_dir / "checkpoint"
probe_model.save_pretrained(checkpoint)
tokenizer.save_pretrained(checkpoint)
by_path = SFTTrainer(model=str(checkpoint), processing_class=tokenizer, train_dataset=mrc,
                     args=SFTConfig(**run.trainer_kwargs("attn-path"), model_init_kwargs=eager))
print("model instance + model_init_kwargs eager ->", attention_implementation(instance.model))
print("model path + model_init_kwargs eager     ->", attention_implementation(by_path.model))

# %%
try:
    SFTTrainer(model=str(checkpoint), processing_class=tokenizer, train_dataset=mrc,
               args=SFTConfig(**run.trainer_kwargs("attn-fa2"),
                              model_init_kwargs={"attn_implementation": "flash_attention_2"}))
    fa2_outcome = "flash_attention_2 is installed and in use"
except ImportError as error:
    fa2_outcome = f"ImportError: {error}"
print("model path + flash_attention_2           ->", fa2_outcome)

# %% [markdown]
# **The fix in your script.** On a GPU with FlashAttention installed, build the model with it and
# check the built model (its varlen kernels take the `cu_seq_lens_q/k` that TRL 1.16's padding-free
# collator sends, `DataCollatorForLanguageModeling` in `sft_trainer.py`):
#
# ```python
# model = AutoModelForCausalLM.from_pretrained(name, attn_implementation="flash_attention_2", dtype=torch.bfloat16)
# assert model.config._attn_implementation == "flash_attention_2"  # before SFTConfig(padding_free=True)
# ```
#
# On sdpa/eager, today's `SFTTrainer(padding_free=True)` is correct for a family whose mask reads
# `position_ids` (Llama and Qwen2 above) because its collator sends no mask and its `compute_loss`
# passes `use_cache=False`: the "fixed" runs matched padded. In a loop of your own, send no mask and
# pass `use_cache=False`; for a family the probe flags, keep `padding_free=False`.
#
# ## 10. Why bother: padding share, throughput, memory
#
# Padding-free exists to stop computing on pad tokens: a few training steps of each, padded and
# padding-free, on the same data, with the profile's kernel (`run.attention`).

# %%
speed = {}
for name, padding_free in (("padded", False), ("padding_free", True)):
    model = make_causal_lm(tokenizer, size=sizes.model_size, seed=run.seed, attn_implementation=run.attention,
                           dtype=companion.kernel_dtype(run.attention))
    args = SFTConfig(**run.trainer_kwargs(f"speed-{name}", logging=False), padding_free=padding_free, max_length=None,
                     per_device_train_batch_size=sizes.speed_batch_size, max_steps=len(mrc) // sizes.speed_batch_size)
    speed[name] = companion.throughput(SFTTrainer(model=model, args=args, train_dataset=mrc, processing_class=tokenizer),
                                       tokenizer.pad_token_id)

# %%
companion.describe_throughput(speed)
companion.plot_throughput(run, speed)

# %% [markdown]
# Padding-free removes the pad tokens; whether that made training faster on this machine and
# kernel, the numbers above say. The Hugging Face post
# [Packing with FlashAttention-2](https://huggingface.co/blog/packing-with-FA2) reports up to 2x
# training throughput on FLAN data on a GPU; the gpu profile measures it on the machine it runs on.
#
# ## What to remember
#
# * Padding-free is only correct when attention stops at each packed sequence's start. Otherwise the
#   loss and the grad norm rise with the batch size, and the model learns from foreign context.
# * On sdpa/eager, transformers (4.53.1 and later) keeps packed sequences apart only when the row
#   comes with `position_ids`, **no attention mask and no KV cache**, in a family whose mask builder
#   reads `position_ids`: here OPT, Falcon, Bloom and MPT did not, Llama and Qwen2 did.
# * Run `packed_vs_separate` on your model before a padding-free run: equal per-sequence losses mean
#   isolation.
# * Contamination shows as a grad-norm spike at the first step and a higher logged loss. The usual
#   remedies (a smaller batch, a lower learning rate, more warmup, tighter clipping, shorter
#   documents, balanced lengths) leave packed sequences seeing each other, and a smaller batch even
#   makes the logged numbers look better; only attention that stops at each sequence's start cures it.
# * `model_init_kwargs` is ignored for a model instance: check `model.config._attn_implementation`.
# * **The fix**: FlashAttention reaching the model (checked on the built model), or on sdpa/eager
#   today's collator with no mask and `use_cache=False`, on a family the probe finds isolated.

# %% [markdown]
# ## Exercise
#
# 1. Add batch size 32 to the sweep. Predict the contaminated/padded ratio first.
#    <details><summary>Hint</summary>More sequences per row means more foreign context per token;
#    does the share of the loss it moves keep growing as fast?</details>
# 2. Run `packed_vs_separate(all_ones_mask=True)` on a freshly initialised model and on a warmed-up
#    one. Why does the lesson warm its models up before measuring contamination?
#    <details><summary>Hint</summary>Compare the two `ratio`s: does a model that has learned nothing
#    care what it attends to?</details>
# 3. Pass `use_cache=True` in a hand-written forward of a packed row (no mask). Is it still isolated?
#    <details><summary>Hint</summary>Section 3's third probe does this in one call; look at what
#    `masking_utils._preprocess_mask_arguments` requires before it reads `position_ids`.</details>
#
# Worked solutions: [`solutions/01_padding_free_high_loss.py`](solutions/01_padding_free_high_loss.py) (a test runs them).

# %% [markdown]
# ## Checks
#
# The claims above, asserted on this run's numbers.

# %% jupyter={"source_hidden": true} tags=["checks"]
def symptom_checks(n: dict) -> dict:
    """The symptom and its growth with batch size (re-created mask), as functions of the numbers alone."""
    ratios, grad_ratios, probes, largest = n["loss_ratio"], n["grad_norm_ratio"], n["probes"], n["batch_sizes"][-1]
    worst = max(ratios, key=lambda name: ratios[name][-1])
    return {
        "symptom: padding-free with the all-ones mask logs over 1.1x padded's loss at batch 16": recreated(
            n["symptom"]["contaminated"]["loss"] > 1.1 * n["symptom"]["padded"]["loss"]),
        "contaminated/padded loss ratio grows with batch size in every setting":
            recreated(all(a <= b for r in ratios.values() for a, b in zip(r, r[1:]))),
        f"ratio above 1 at batch {largest} (> 1.1) in every setting": recreated(all(r[-1] > 1.1 for r in ratios.values())),
        f"ratio well above 1 at batch {largest} (> 1.5) where it hurts most": recreated(ratios[worst][-1] > 1.5),
        "no difference at batch 1 (< 1e-6)": recreated(all(abs(r[0] - 1) < 1e-6 for r in ratios.values())),
        f"grad norm at batch {largest} is over 1.5x padded in every setting":
            recreated(all(g[-1] > 1.5 for g in grad_ratios.values())),
        "probe flags an all-ones mask on a packed row": not probes["llama, position_ids + all-ones mask"]["isolated"],
        "probe flags a packed row run with use_cache=True": not probes["llama, position_ids + use_cache=True"]["isolated"],
        "probe flags OPT, Falcon, Bloom and MPT with today's padding-free inputs": not any(
            n["family_probes"][f]["isolated"] for f in ("opt", "falcon", "bloom", "mpt")),
        "TRL's padding-free path changes OPT's loss (by > 10%)": n["opt_gap"] > 0.1,
        "model_init_kwargs is ignored for a model instance": n["attention_model_instance"] != "eager",
    }


# %% jupyter={"source_hidden": true} tags=["checks"]
def training_checks(n: dict) -> tuple[dict, dict]:
    """The short trainings and the remedies: what the contaminated runs show, and what cures them."""
    bad, padded, remedies = n["training"]["contaminated"], n["training"]["padded"], n["remedies"]
    smaller = remedies["smaller batch"]
    symptom = {
        "training: contaminated grad norm at step 1 over 3x padded": recreated(bad["grad_norm"][0] > 3 * padded["grad_norm"][0]),
        "training: contaminated run logs a higher loss than padded to the end": recreated(
            bad["final_loss"] > padded["final_loss"]),
        "remedies short of separation leave packed sequences seeing each other (probe, ratio > 1)": recreated(
            all(not r["isolated"] and r["ratio"] > 1 for r in remedies.values() if not r["separates"])),
        "a smaller batch hides the symptom: lower logged loss and grad norm": recreated(
            smaller["loss"] < smaller["baseline"]["loss"] and smaller["grad_norm"] < smaller["baseline"]["grad_norm"]),
    }
    fix = {
        "training: fixed follows padded step by step (< 1e-3)": n["fixed_vs_padded_training"] < 1e-3,
        "separating the sequences cures it: probe isolated after training": all(
            r["isolated"] for r in remedies.values() if r["separates"]),
    }
    return symptom, fix


# %% jupyter={"source_hidden": true} tags=["checks"]
def fix_checks(n: dict) -> dict:
    """Today's padding-free path where it is correct, and what reaches the model."""
    probes, families = n["probes"], n["family_probes"]
    return {
        "fixed equals padded (relative difference < 1e-3)": n["fixed_vs_padded_max_relative"] < 1e-3,
        "probe finds Llama isolated with position_ids, no mask, no cache": probes["llama, position_ids only"]["isolated"],
        "probe finds Llama and Qwen2 isolated at random init too": families["llama"]["isolated"] and families["qwen2"]["isolated"],
        "model_init_kwargs applies for a model path": n["attention_model_path"] == "eager",
        "padding-free computes no pad tokens": n["throughput"]["padding_free"]["padding_share"] == 0,
    }


# %% jupyter={"source_hidden": true} tags=["checks"]
def then_checks(n: dict) -> tuple[dict, dict]:
    """The real old code, where its era ran (checks absent when skipped)."""
    symptom, fix = {}, {}
    old, late = n["then"]["01-trl-0.14"], n["then"]["01-transformers-4.55"]
    if old["status"] == "finished":  # real TRL 0.14 + transformers 4.48.3
        symptom["on TRL 0.14 + transformers 4.48.3 the real collator's packed batch is contaminated (sdpa, eager)"] = (
            not old["collator_has_mask"]
            and all(rows["train, the era's collator batch"] > 1e-4 for rows in old["differences"].values()))
        old_ratios = list(old["loss_ratio_by_batch_size"].values())
        symptom["on TRL 0.14's real SFTTrainer the padding-free/padded loss ratio is 1 at batch 1, then grows"] = (
            abs(old_ratios[0] - 1) < 1e-3 and all(a < b for a, b in zip(old_ratios, old_ratios[1:])))
    if late["status"] == "finished":  # real TRL 0.21 + transformers 4.55.4
        symptom["on transformers 4.55.4 a packed row is contaminated in train mode with the config's cache"] = all(
            rows["train, config use_cache=True, no mask"] > 1e-4 for rows in late["differences"].values())
        symptom["TRL 0.21's real collator sends the all-ones mask that the re-creation adds"] = late["collator_mask_all_ones"]
        fix["on transformers 4.55.4 use_cache=False keeps packed sequences apart (< 1e-4)"] = all(
            rows["train, use_cache=False, no mask"] < 1e-4 for rows in late["differences"].values())
    return symptom, fix


def checks(n: dict) -> tuple[dict, dict]:
    (trained_symptom, trained_fix), (then_symptom, then_fix) = training_checks(n), then_checks(n)
    return {**symptom_checks(n), **trained_symptom, **then_symptom}, {**fix_checks(n), **trained_fix, **then_fix}


# %% jupyter={"source_hidden": true}
numbers = companion.collect_numbers(
    run, batch_sizes=BATCH_SIZES, symptom=symptom, sweep=sweep, loss_ratio=ratios, grad_norm_ratio=grad_ratios, most_affected=worst,
    fixed_vs_padded_max_relative=fixed_vs_padded, mrc_worst=mrc_worse, probes=probes, family_probes=family_probes,
    opt=opt, opt_gap=opt_gap, training=training, fixed_vs_padded_training=fixed_vs_padded_training, remedies=remedies,
    attention_model_instance=attention_implementation(instance.model),
    attention_model_path=attention_implementation(by_path.model), fa2=fa2_outcome, throughput=speed,
    then={era: companion.era_numbers(then) for era, then in (("01-trl-0.14", old), ("01-transformers-4.55", late))})
by_batch = numbers["then"]["01-trl-0.14"].get("loss_ratio_by_batch_size", {})
then_part = (f" (the real TRL 0.14.0 + transformers 4.48.3: {by_batch[max(by_batch)]:.2f}x at batch {max(by_batch)})"
             if by_batch else "")  # empty when the era was not built (skipped)
summary = (f"Padding-free batches sent with an all-ones mask (re-created TRL 0.19.0-0.23.0) logged "
           f"{symptom['contaminated']['loss'] / symptom['padded']['loss']:.1f}x the padded loss at batch 16"
           f"{then_part}. Today's collator matched padded to {fixed_vs_padded:.0e} on Llama, "
           f"while OPT's loss moved by {opt_gap:.0%} with today's padding_free=True.")
metrics = save_metrics(run, "01", numbers, checks, summary=summary, eras=[old.to_metrics(), late.to_metrics()])
assert not failed_checks(metrics), f"checks failed: {failed_checks(metrics)}"
print(f"all checks passed; metrics in {run.output_dir / 'metrics.json'}")
