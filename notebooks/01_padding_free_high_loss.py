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
# **The report** ([TRL issue #2834](https://github.com/huggingface/trl/issues/2834)): SFT with
# padding-free batches started at a much higher loss than padded training, growing with the batch
# size, worst on machine-reading-comprehension samples (long, variable-length), on Llama and Qwen.
# The user had passed `--attn_implementation flash_attention_2`, but the flag stayed in the script's
# model arguments and never reached the model: FlashAttention was not on.
#
# **What you will see here**, with the real `SFTTrainer` and `SFTConfig(padding_free=True)`: when
# the attention kernel does not know where each packed sequence ends, every token attends to the
# sequences packed before it ("batch contamination"); the loss and the gradient norm rise with the
# batch size, on Llama, Qwen2 and OPT models; a short real training run with its first-step spike;
# which of the report's remedies only hide the symptom and which one cures it; a check that tells
# whether your model and collator keep sequences apart; where the bug still lives today; and what
# padding-free buys when it works.
#
# **Time**: about two and a half minutes on the cpu profile (2 CPU cores); `trl-clinic list` shows what each profile runs.
#
# The contaminated batches come from TRL 0.19-0.23's collator, **re-created** on today's stack
# (`trl_clinic.stand_ins.recreated_all_ones_mask`, which names the code it stands for). The OPT trap,
# the probe, the trainings and the fix are today's real code paths.

# %% tags=["parameters"]
profile = "auto"  # "auto" (gpu when CUDA is present), "cpu" or "gpu"
seed = 0
output_dir = None  # None: outputs/01_padding_free_high_loss at the repository root

# %%
import copy
import logging
import math
import time

import torch
from datasets import concatenate_datasets
from IPython.display import Markdown, display
from trl import SFTConfig, SFTTrainer

from trl_clinic import data, eras, plotting
from trl_clinic.models import attention_implementation, make_causal_lm
from trl_clinic.packing import packed_vs_separate
from trl_clinic.parameters import start_run
from trl_clinic.recording import StepRecorder, quiet
from trl_clinic.results import failed_checks, recreated, save_metrics
from trl_clinic.runtime import peak_memory_mib, progress, reset_peak_memory
from trl_clinic.stand_ins import recreated_all_ones_mask
from trl_clinic.tokenizer import build_tokenizer

run = start_run("01", profile, seed, output_dir)
print(run.describe())
sizes = run.sizes  # this lesson's numbers for the profile (lessons.yaml)
MODEL_SIZE, BATCH_SIZES, FAMILIES = sizes.model_size, sizes.batch_sizes, ("llama", "qwen2", "opt")
# The loss measurements run on sdpa in fp32 on every profile, so that "equal" means float precision.
# The throughput measurement (section 5) uses the profile's kernel: on a GPU the best FlashAttention
# installed, which sees packed boundaries natively.
print("attention implementation for the throughput runs:", run.attention)

# %% [markdown]
# ## 1. The symptom
#
# Two kinds of data: reading comprehension (a passage of 3 to 40 sentences, a question, a one-word
# answer) and short instructions. A randomly initialised model predicts every token about equally
# badly whatever it attends to, so contamination would barely show. So we first train each model
# briefly (padded, whole-sequence loss) so that context matters, then measure with
# `learning_rate=0.0`: every step sees the same weights and only the batching differs. The report
# saw the effect on Llama and Qwen models: we warm up a tiny Llama, a tiny Qwen2, and a tiny OPT
# (for a trap that is live today, section 3).

# %%
tokenizer = build_tokenizer()
mrc = data.mrc_samples(sizes.measure_samples, seed=run.subseed("measure"))
instructions = data.instruction_pairs(sizes.measure_samples, seed=run.subseed("measure"), max_people=2)
half = sizes.warmup_batch_size * sizes.warmup_steps // 2
warmup_set = concatenate_datasets([data.mrc_samples(half, seed=run.subseed("warm-up")),
                                   data.instruction_pairs(half, seed=run.subseed("warm-up"), max_people=2)])

def warm_up(family: str, steps: int) -> dict:
    """Briefly train a fresh model (padded, whole-sequence loss) and return its weights."""
    model = make_causal_lm(tokenizer, family, size=MODEL_SIZE, seed=run.seed)
    trainer = SFTTrainer(
        model=model,
        args=SFTConfig(**run.trainer_kwargs(f"warmup-{family}"), per_device_train_batch_size=sizes.warmup_batch_size,
                       learning_rate=sizes.warmup_learning_rate, max_steps=steps, max_length=None,
                       completion_only_loss=False),
        train_dataset=warmup_set.shuffle(seed=run.subseed("warm-up order")), processing_class=tokenizer,
    )
    log = StepRecorder().watch(trainer)
    trainer.train()
    raw = log.series("raw_loss")[1]
    # every later ratio divides by losses of this model: a warm-up that diverged must stop here, loudly
    assert all(math.isfinite(v) and v > 0 for v in raw), f"{family} warm-up diverged: raw losses {raw[-5:]}"
    print(f"{family} warm-up loss: {log.series('loss')[1][0]:.2f} -> {log.last('loss'):.2f}")
    return copy.deepcopy(model.state_dict())


family_weights = {family: warm_up(family, sizes.warmup_steps) for family in FAMILIES}
warm_weights = family_weights["llama"]


# %% [markdown]
# ## 2. Reproduce: padded, contaminated and boundary-aware batches
#
# * **padded**: `padding_free=False`, the reference.
# * **contaminated** (re-created): `padding_free=True`, with the packed row sent with an attention mask
#   of ones. TRL 0.19-0.23's collator did exactly that; `recreated_all_ones_mask` re-creates it. With
#   a mask present, transformers builds one causal mask over the whole row, as an attention kernel
#   that ignores sequence boundaries (the report's non-FlashAttention run) does.
# * **fixed**: `padding_free=True` with today's collator: `position_ids` restarting at 0 per sequence
#   and no mask, so transformers finds the boundaries (or FlashAttention varlen uses `cu_seq_lens`).
#
# `max_length=None` is required: TRL refuses `padding_free=True` without packing when a
# `max_length` is set.

# %%
def sft_run(mode: str, batch_size: int, dataset, completion_only: bool, family: str = "llama",
            weights: dict | None = warm_weights, name: str = "", **config) -> tuple[StepRecorder, torch.nn.Module]:
    """One real SFTTrainer run from the given weights; ``config`` adds SFTConfig fields (learning rate...)."""
    model = make_causal_lm(tokenizer, family, size=MODEL_SIZE, seed=run.seed)
    if weights is not None:
        model.load_state_dict(weights)
    args = SFTConfig(
        **{**run.trainer_kwargs(f"{family}-{mode}-{batch_size}{name}", progress=False),
           "bf16": False},  # fp32 on every profile (see the top)
        per_device_train_batch_size=batch_size,
        padding_free=mode != "padded",  # the flag this lesson is about
        max_length=None,
        completion_only_loss=completion_only,
        **config,
    )
    trainer = SFTTrainer(model=model, args=args, train_dataset=dataset, processing_class=tokenizer)
    if mode == "contaminated":
        trainer.data_collator = recreated_all_ones_mask(trainer.data_collator)
    recorder = StepRecorder().watch(trainer)
    trainer.train()
    # Trainer logs 0.0 for a NaN step loss: the ratios below divide by these, so they must be real
    assert all(math.isfinite(v) and v > 0 for v in recorder.series("raw_loss")[1]), f"{mode} run: non-finite loss"
    return recorder, model


def measure(mode: str, batch_size: int, dataset, completion_only: bool, family: str = "llama",
            weights: dict | None = warm_weights, **config) -> dict[str, float]:
    """Mean logged loss and grad norm over the dataset at lr 0 (the weights never change)."""
    recorder, _ = sft_run(mode, batch_size, dataset, completion_only, family, weights,
                          learning_rate=0.0, max_steps=len(dataset) // batch_size, **config)
    losses, norms = recorder.series("loss")[1], recorder.series("grad_norm")[1]
    return {"loss": sum(losses) / len(losses), "grad_norm": sum(norms) / len(norms)}


def report(name: str, runs: dict[str, list[dict[str, float]]]) -> None:
    for i, b in enumerate(BATCH_SIZES):
        print(f"{name:>30}, batch {b:>2}: " + "  ".join(
            f"{mode} loss {runs[mode][i]['loss']:.3f} / grad {runs[mode][i]['grad_norm']:.2f}" for mode in MODES))


MODES = ("padded", "contaminated", "fixed")
settings = {"MRC, completion-only": (mrc, True), "MRC, whole sequence": (mrc, False),
            "instructions, completion-only": (instructions, True), "instructions, whole sequence": (instructions, False)}
sweep = {}
# TRL warns at every padding-free run of batch 1 that batch 1 gains nothing from it: true, and the
# point of this baseline (one sequence per row has nothing to contaminate); quiet during the sweep.
sft_logger = logging.getLogger("trl.trainer.sft_trainer")
sft_logger.setLevel(logging.ERROR)
for name, (dataset, completion_only) in progress(settings.items(), "contamination sweep", total=len(settings)):
    sweep[name] = {mode: [measure(mode, b, dataset, completion_only) for b in BATCH_SIZES] for mode in MODES}
    report(name, sweep[name])
# the other families on the main setting (Llama's runs are the sweep's); for OPT, "fixed" is TRL's
# padding-free path too, and section 3 shows why it is not fixed there
MAIN = "MRC, whole sequence"
family_sweep = {"llama": sweep[MAIN]}
for family in FAMILIES[1:]:
    family_sweep[family] = {mode: [measure(mode, b, mrc, False, family, family_weights[family]) for b in BATCH_SIZES]
                            for mode in MODES}
    report(f"{family}, {MAIN}", family_sweep[family])
sft_logger.setLevel(logging.NOTSET)

# %% [markdown]
# ### The same in a short real training run
#
# The report saw a high loss at the start of training and a grad norm that "fluctuates abnormally"
# early on. Here the warmed-up Llama trains for a few dozen steps (learning rate above 0, Trainer's
# default schedule and gradient clipping at 1.0) on fresh MRC samples, padded, contaminated and fixed.
# After training, `packed_vs_separate` runs held-out sequences alone and packed (the way each run
# packed them) on the weights the run left: the loss alone is the clean held-out loss.

# %%
TRAIN_BATCH, EARLY = sizes.train_batch_size, 5  # EARLY: the first optimizer steps, where the report saw the fluctuation
train_set = data.mrc_samples(TRAIN_BATCH * sizes.train_steps, seed=run.subseed("train"))


def as_sequence(row: dict) -> list[int]:
    return tokenizer(row["prompt"] + row["completion"])["input_ids"] + [tokenizer.eos_token_id]


held_out = [as_sequence(row) for row in mrc.select(range(BATCH_SIZES[-1]))]  # mrc is never trained on


def train(mode: str, name: str = "", batch_size: int = TRAIN_BATCH, **config) -> dict:
    """A short real training run from the warmed-up Llama: per-step loss and grad norm, then the probe."""
    config = {"learning_rate": sizes.train_learning_rate, "max_steps": sizes.train_steps, **config}
    recorder, model = sft_run(mode, batch_size, train_set, False, name=f"-train{name}", **config)
    losses, norms = recorder.series("loss")[1], recorder.series("grad_norm")[1]
    probe = packed_vs_separate(model, held_out[:batch_size], all_ones_mask=mode == "contaminated")
    return {"loss": losses, "grad_norm": norms, "mean_loss": sum(losses) / len(losses),
            "mean_grad_norm": sum(norms) / len(norms), "final_loss": sum(losses[-EARLY:]) / EARLY,
            "early_grad_max": max(norms[:EARLY]), "early_grad_spread": float(torch.tensor(norms[:EARLY]).std()),
            "held_out_loss": sum(probe["separate"]) / len(probe["separate"]),
            "isolated": probe["isolated"], "ratio": probe["ratio"]}


training = {mode: train(mode) for mode in MODES}
for mode, t in training.items():
    print(f"{mode:>12}: loss {t['loss'][0]:.2f} -> {t['final_loss']:.2f} (last {EARLY} steps); grad norm at step 1 "
          f"{t['grad_norm'][0]:.2f}, first {EARLY} steps max {t['early_grad_max']:.2f} / spread {t['early_grad_spread']:.2f}; "
          f"held-out loss alone {t['held_out_loss']:.3f}")
fixed_vs_padded_training = max(abs(f - p) / p for f, p in zip(training["fixed"]["loss"], training["padded"]["loss"]))
spike = training["contaminated"]["grad_norm"][0] / training["padded"]["grad_norm"][0]
display(Markdown(
    f"At the first step (the same weights for all three) the contaminated grad norm is **{spike:.0f}x** the padded one; "
    f"over the first {EARLY} steps it peaks at {training['contaminated']['early_grad_max']:.1f} against "
    f"{training['padded']['early_grad_max']:.1f}. Then it "
    f"{'settles' if training['contaminated']['grad_norm'][-1] < 2 * training['padded']['grad_norm'][-1] else 'stays high'}: "
    f"clipping bounds each update and the model partly learns to discount the foreign context (packed/alone held-out "
    f"loss {training['contaminated']['ratio']:.2f} after training). The logged loss ends at "
    f"{training['contaminated']['final_loss']:.2f} against {training['padded']['final_loss']:.2f} padded, and the "
    f"clean held-out loss of the contaminated run is {training['contaminated']['held_out_loss']:.3f} against "
    f"{training['padded']['held_out_loss']:.3f}. The fixed run follows the padded one step by step "
    f"(largest relative loss difference {fixed_vs_padded_training:.1e})."))

# %% [markdown]
# ## 3. Diagnose
#
# ### The ratio grows with the batch size
#
# At batch 1 there is nothing to contaminate and all three agree. The more sequences share a row,
# the more foreign context each token sees.

# %%
def loss_ratios(runs: dict[str, list[dict[str, float]]], mode: str = "contaminated", key: str = "loss") -> list[float]:
    """``mode`` over padded, batch size by batch size, at the same weights."""
    return [c[key] / p[key] for c, p in zip(runs[mode], runs["padded"])]


ratios = {name: loss_ratios(runs) for name, runs in sweep.items()}
grad_ratios = {name: loss_ratios(runs, key="grad_norm") for name, runs in sweep.items()}
family_ratios = {family: loss_ratios(runs) for family, runs in family_sweep.items()}
fixed_vs_padded = max(abs(f["loss"] - p["loss"]) / p["loss"]
                      for runs in sweep.values() for f, p in zip(runs["fixed"], runs["padded"]))
for name in sweep:
    print(f"{name:>30}: contaminated/padded loss " + ", ".join(f"{r:.2f}" for r in ratios[name])
          + "; grad norm " + ", ".join(f"{r:.1f}" for r in grad_ratios[name]))
print(f"largest relative difference fixed vs padded: {fixed_vs_padded:.1e}")
worst = max(ratios, key=lambda name: ratios[name][-1])
print(f"most affected at batch {BATCH_SIZES[-1]}: {worst} (ratio {ratios[worst][-1]:.2f})")
mrc_worse = max(ratios["MRC, completion-only"][-1], ratios["MRC, whole sequence"][-1]) > max(
    ratios["instructions, completion-only"][-1], ratios["instructions, whole sequence"][-1])
least = min(ratios, key=lambda name: ratios[name][-1])
largest = BATCH_SIZES[-1]
# the sentence below is written from this run's numbers: which setting suffers most depends on the seed
display(Markdown(
    f"At batch {largest} and this seed, **{worst}** suffers most (loss ratio {ratios[worst][-1]:.2f}, grad norm "
    f"{grad_ratios[worst][-1]:.1f}x) and **{least}** least (loss ratio {ratios[least][-1]:.2f}), so the report's "
    f"\"worst on MRC\" {'holds' if mrc_worse else 'does not hold'} here. The grad norm moves much more than the "
    "loss in every setting."))
for family, r in family_ratios.items():
    print(f"{family:>6}, {MAIN}: contaminated/padded loss " + ", ".join(f"{v:.2f}" for v in r)
          + f" at batch {', '.join(map(str, BATCH_SIZES))}")

# %% [markdown]
# Which setting suffers most depends on the data, the model and the seed: measure it, do not assume
# it. Our passages are built from the same fixed world as the instructions, so foreign context is
# less foreign than between real documents; the original report used real MRC data on pretrained
# models. A completion-only loss on a one-word answer that depends mostly on the question right
# before it can suffer less than a whole-sequence loss, whose every token sees the foreign passages.
#
# ### A check you can run on your own model: packed vs one at a time
#
# `packed_vs_separate(model, sequences)` runs the sequences one at a time and then packed into one
# row (positions restarting at 0, like TRL's collator), and compares each sequence's loss. Equal
# means the model keeps packed sequences apart.

# %%
probe_sequences = [tokenizer(row["prompt"] + row["completion"])["input_ids"] + [tokenizer.eos_token_id]
                   for row in mrc.select(range(4))]
probe_model = make_causal_lm(tokenizer, size=MODEL_SIZE, seed=run.seed)
probe_model.load_state_dict(warm_weights)
probes = {"llama, position_ids only": packed_vs_separate(probe_model, probe_sequences),
          "llama, position_ids + all-ones mask": packed_vs_separate(probe_model, probe_sequences, all_ones_mask=True)}
for family in FAMILIES[1:]:
    family_model = make_causal_lm(tokenizer, family, size=MODEL_SIZE, seed=run.seed)
    family_model.load_state_dict(family_weights[family])
    probes[f"{family}, position_ids only"] = packed_vs_separate(family_model, probe_sequences)
for name, result in probes.items():
    verdict = "isolated" if result["isolated"] else "CONTAMINATED"
    print(f"{name:>38}: {verdict} (largest relative loss difference {result['max_relative_difference']:.1e})")

# %% [markdown]
# ### A trap that is live today: model families that build their mask without `position_ids`
#
# Transformers (since 4.53.1) infers packed boundaries from `position_ids` only in the mask builders
# that receive them. OPT, Falcon, Bloom, MPT and other families build their causal mask without
# `position_ids`, so TRL 1.16's correct padding-free batches still contaminate them on sdpa/eager,
# and TRL does not warn. The sweep above ran the real `SFTTrainer` with today's collator
# (`padding_free=True`, no mask) on all three warmed-up families; compare it with padded:

# %%
family_gap = {}
for family, runs in family_sweep.items():
    padded, packed = runs["padded"][-1], runs["fixed"][-1]
    family_gap[family] = abs(packed["loss"] - padded["loss"]) / padded["loss"]
    print(f"{family:>6}, batch {BATCH_SIZES[-1]}: padded {padded['loss']:.4f}, padding_free {packed['loss']:.4f}, "
          f"relative difference {family_gap[family]:.1e}")

# %% [markdown]
# ### Which attention does the built model really use?
#
# The original bug: the FlashAttention flag never reached the model. Read it on the **built model**
# (`model.config._attn_implementation`), never on your arguments. In TRL, `model_init_kwargs` only
# applies when the model is given by name or path; with a model instance it is ignored.

# %%
instance_trainer = SFTTrainer(model=make_causal_lm(tokenizer, size=MODEL_SIZE),
                              args=SFTConfig(**run.trainer_kwargs("attn-instance"),
                                             model_init_kwargs={"attn_implementation": "eager"}),
                              train_dataset=mrc, processing_class=tokenizer)
print("model instance + model_init_kwargs eager ->", attention_implementation(instance_trainer.model))

checkpoint = run.output_dir / "checkpoint"
probe_model.save_pretrained(checkpoint)
tokenizer.save_pretrained(checkpoint)
path_trainer = SFTTrainer(model=str(checkpoint),
                          args=SFTConfig(**run.trainer_kwargs("attn-path"),
                                         model_init_kwargs={"attn_implementation": "eager"}),
                          train_dataset=mrc, processing_class=tokenizer)
print("model path + model_init_kwargs eager     ->", attention_implementation(path_trainer.model))
try:
    SFTTrainer(model=str(checkpoint), args=SFTConfig(**run.trainer_kwargs("attn-fa2"),
               model_init_kwargs={"attn_implementation": "flash_attention_2"}),
               train_dataset=mrc, processing_class=tokenizer)
    fa2_outcome = "flash_attention_2 is installed and in use"
except ImportError as error:
    fa2_outcome = f"ImportError: {error}"
print("model path + flash_attention_2           ->", fa2_outcome)


# %% [markdown]
# ### Then: the real collators, on the versions where the bug lived
#
# The contaminated batches above are a re-creation. Two *eras* (side environments with old versions,
# built once by `make eras` under `.eras/`) run the real old code on a tiny random Llama and compare
# a packed row with each sequence run alone (the largest logit difference of the later sequences;
# 0 means isolated):
#
# * TRL 0.14.0 + transformers 4.48.3, the report's time. The collator,
#   `DataCollatorForCompletionOnlyLM(padding_free=True)`, sends `position_ids` and no attention mask,
#   but that version's sdpa/eager attention does not look for boundaries in `position_ids`, so the
#   packed row is contaminated. The real old `SFTTrainer` at lr 0, padded against padding-free, on a
#   model trained briefly on a copy task, then gives the report's loss growth by batch size.
# * TRL 0.21.0 + transformers 4.55.4. Transformers builds block masks from `position_ids`, but only
#   when no cache is used, and TRL's padding-free collator sends an all-ones attention mask beside
#   them (what `recreated_all_ones_mask` re-creates), which turns the block masks off.

# %%
then_runs, then_numbers = [], {}
for era in ("01-trl-0.14", "01-transformers-4.55"):
    then = eras.run_in_era(era, "then_01_padding_free", {"seed": run.subseed("then")}, run.output_dir / "then")
    then_runs.append(then)
    print(then.describe())
    then_numbers[era] = {"status": then.status}
    if then.finished:
        collator = then.result["collator"]
        then_numbers[era].update(collator_has_mask=collator["has_attention_mask"],
                                 collator_mask_all_ones=collator["attention_mask_all_ones"],
                                 differences=then.result["max_abs_logit_difference"])
        print(f"  collator: {collator['collator']} -> keys {collator['keys']}")
        by_batch = then.result.get("loss_by_batch_size")
        if by_batch:  # the real old SFTTrainer at lr 0, padded vs padding-free, on a model trained briefly
            then_numbers[era]["loss_ratio_by_batch_size"] = dict(zip(by_batch["batch_sizes"], by_batch["ratio"]))
            print("  real SFTTrainer, padding-free / padded loss by batch size: " + ", ".join(
                f"batch {b}: {r:.2f}" for b, r in zip(by_batch["batch_sizes"], by_batch["ratio"])))
        for implementation, rows in then.result["max_abs_logit_difference"].items():
            for mode, difference in rows.items():
                verdict = "isolated" if difference < then.result["isolated_below"] else "CONTAMINATED"
                print(f"  {implementation:>5} | {mode:<40} {verdict} (largest logit difference {difference:.2g})")

# %% [markdown]
# ## 4. The fix
#
# Padding-free is correct when the kernel knows the boundaries:
#
# * on a GPU: FlashAttention-2/3 (`attn_implementation="flash_attention_2"`, checked on the built
#   model) uses the collator's `cu_seq_lens` (varlen kernels);
# * on sdpa/eager with Llama, Qwen2 and other families whose mask builder gets `position_ids`:
#   today's collator (no attention mask) is enough, as the "fixed" runs above show;
# * for families that cannot see boundaries (OPT and friends): keep `padding_free=False`.
#
# ### The report's remedies: which hide the symptom, which cure it
#
# The report lists what people try: a smaller batch, a gentler schedule (lower learning rate), more
# warmup, gradient clipping, splitting long documents, balancing lengths. Each is applied here to the
# contaminated path. A remedy **hides** the symptom when the logged loss or grad norm goes down. It
# **cures** it only when, at equal weights, the loss packed equals the loss alone (ratio 1) and
# `packed_vs_separate`, on the weights and the rows the remedy leaves, finds the packed sequences
# isolated. Data-side remedies are measured at lr 0 on the warmed-up weights, against the
# contaminated batch-16 run of the sweep; optimizer-side ones (they cannot change a forward pass) get
# one short training each, against the contaminated training above, and their equal-weights ratio is
# the first step's loss over the padded run's first step (same weights, same batch).

# %%
short_docs = data.mrc_samples(sizes.measure_samples, seed=run.subseed("measure"), max_sentences=10)
by_length = sorted(mrc, key=lambda row: len(row["prompt"]))  # a length-grouped row: the middle of this order
middle = by_length[(len(by_length) - BATCH_SIZES[-1]) // 2:][:BATCH_SIZES[-1]]
warm_model = make_causal_lm(tokenizer, size=MODEL_SIZE, seed=run.seed)
warm_model.load_state_dict(warm_weights)


def at_lr_0(logged: dict[str, float], sequences: list[list[int]]) -> dict:
    """A data-side remedy: its lr-0 logged numbers, and the probe on the warmed-up weights with its rows."""
    probe = packed_vs_separate(warm_model, sequences, all_ones_mask=True)
    return {"loss": logged["loss"], "grad_norm": logged["grad_norm"], "isolated": probe["isolated"],
            "ratio": probe["ratio"], "baseline": sweep[MAIN]["contaminated"][-1]}


def trained(t: dict) -> dict:
    """An optimizer-side remedy (or the cure): its training's logged numbers against the contaminated run.

    Equal weights: every training starts from the warmed-up weights on the same first batch, so the
    step-1 loss over padded's step-1 loss is the cost of the row's foreign context. The probe runs on
    the weights the training leaves: do packed sequences still see each other?
    """
    return {"loss": t["mean_loss"], "grad_norm": t["mean_grad_norm"], "isolated": t["isolated"],
            "ratio": t["loss"][0] / training["padded"]["loss"][0], "ratio_after_training": t["ratio"],
            "baseline": {"loss": training["contaminated"]["mean_loss"],
                         "grad_norm": training["contaminated"]["mean_grad_norm"]}}


small, SEPARATION = BATCH_SIZES[1], "separate the sequences"
remedies = {  # name -> (how it is applied, what it measured)
    "smaller batch": (f"batch {small}", at_lr_0(sweep[MAIN]["contaminated"][1], held_out[:small])),
    "shorter documents": ("passages <= 10 sentences", at_lr_0(
        measure("contaminated", BATCH_SIZES[-1], short_docs, False),
        [as_sequence(row) for row in short_docs.select(range(BATCH_SIZES[-1]))])),
    "balanced lengths": ("group_by_length", at_lr_0(
        measure("contaminated", BATCH_SIZES[-1], mrc, False, train_sampling_strategy="group_by_length"),
        [as_sequence(row) for row in middle])),
    "lower learning rate": ("lr / 10", trained(train("contaminated", "-low-lr",
                                                     learning_rate=sizes.train_learning_rate / 10))),
    "more warmup": ("warmup_steps=0.5", trained(train("contaminated", "-warmup", warmup_steps=0.5))),
    "tighter clipping": ("max_grad_norm=0.1", trained(train("contaminated", "-clip", max_grad_norm=0.1))),
    SEPARATION: ("today's collator, no mask", trained(training["fixed"])),
}
remedies = {name: {"how": how, "separates": name == SEPARATION, **r} for name, (how, r) in remedies.items()}
for name, r in remedies.items():
    hides = r["loss"] < r["baseline"]["loss"] or r["grad_norm"] < r["baseline"]["grad_norm"]
    r["verdict"] = "cures it" if r["isolated"] else ("hides it, no cure" if hides else "neither hides nor cures it")
    print(f"{name + ' (' + r['how'] + ')':>50}: logged loss {r['loss']:.2f} (contaminated {r['baseline']['loss']:.2f}), grad norm "
          f"{r['grad_norm']:.2f} ({r['baseline']['grad_norm']:.2f}); equal-weights loss ratio {r['ratio']:.3f} -> {r['verdict']}")
cured = [name for name, r in remedies.items() if r["isolated"]]
hidden = [name for name, r in remedies.items() if r["verdict"].startswith("hides")]
display(Markdown(
    f"Cured: **{', '.join(cured) or 'none'}**. Hidden without a cure: {', '.join(hidden) or 'none'}. "
    f"Every other remedy leaves the packed sequences seeing each other (contaminated/padded loss "
    f"{min(r['ratio'] for n, r in remedies.items() if n not in cured):.2f} to "
    f"{max(r['ratio'] for n, r in remedies.items() if n not in cured):.2f} at equal weights): only separation cures."))

# %% [markdown]
# ## 5. Why bother: padding share, throughput, memory
#
# Padding-free exists to stop computing on pad tokens. Here we time a few training steps of each,
# padded vs padding-free (the fixed path), on the same MRC data.

# %%
def throughput(padding_free: bool, batch_size: int = sizes.speed_batch_size) -> dict[str, float | None]:
    steps = len(mrc) // batch_size
    # FlashAttention-2 takes half-precision weights; sdpa keeps fp32 (with bf16 autocast on a GPU)
    dtype = torch.bfloat16 if run.attention.startswith("flash_attention") else torch.float32
    model = make_causal_lm(tokenizer, size=MODEL_SIZE, seed=run.seed, attn_implementation=run.attention, dtype=dtype)
    args = SFTConfig(**run.trainer_kwargs(f"speed-{padding_free}", logging=False), padding_free=padding_free,
                     max_length=None, per_device_train_batch_size=batch_size, max_steps=steps)
    trainer = quiet(SFTTrainer(model=model, args=args, train_dataset=mrc, processing_class=tokenizer))
    # the same seeded sampler feeds train(): these are the batches it will see
    batches = [batch for batch, _ in zip(trainer.get_train_dataloader(), range(steps))]
    slots = sum(batch["input_ids"].numel() for batch in batches)  # positions the model computes
    real = sum(int((batch["input_ids"] != tokenizer.pad_token_id).sum()) for batch in batches)
    reset_peak_memory(run.device)
    start = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - start
    return {"padding_share": 1 - real / slots, "tokens_per_second": real / seconds, "seconds": seconds,
            "peak_memory_mib": peak_memory_mib(run.device)}


speed = {"padded": throughput(False), "padding_free": throughput(True)}
for name, numbers in speed.items():
    memory = f"{numbers['peak_memory_mib']:.0f} MiB" if numbers["peak_memory_mib"] else "not measured on CPU"
    print(f"{name:>12}: padding share {numbers['padding_share']:.0%}, {numbers['tokens_per_second']:.0f} tokens/s, "
          f"peak memory {memory}")
speedup = speed["padding_free"]["tokens_per_second"] / speed["padded"]["tokens_per_second"]
print(f"padding-free / padded throughput: {speedup:.2f}x")

# %% [markdown]
# On CPU with sdpa, padding-free removes the pad tokens but builds a boolean L × L mask for each
# packed row and leaves the causal fast path, so it is not necessarily faster (the numbers above say
# which way it went here). FlashAttention's varlen kernels have neither cost: on a GPU the HF blog
# "packing with FA2" reports up to 2x throughput on FLAN data. The gpu profile measures it on the
# machine it runs on.
#
# ## 6. Compare

# %%
fig, (ax_loss, ax_grad, ax_speed) = plotting.figure(
    3, title="Contaminated padding-free batches (recreated all-ones mask): loss and grad norm grow with batch size")
main = "MRC, whole sequence"
for mode, kind in (("contaminated", "bad"), ("padded", "reference"), ("fixed", "fixed")):
    label = "fixed (on top of padded)" if mode == "fixed" else mode
    plotting.line(ax_loss, BATCH_SIZES, [r["loss"] for r in sweep[main][mode]], kind, label)
    plotting.line(ax_grad, BATCH_SIZES, [r["grad_norm"] for r in sweep[main][mode]], kind, label)
plotting.label(ax_loss, "per-device batch size", "mean loss (nats/token)", f"{main}, same weights")
plotting.label(ax_grad, "per-device batch size", "mean grad norm", f"{main}, same weights")
for ax in (ax_loss, ax_grad):
    ax.set_xscale("log", base=2)
plotting.bars(ax_speed, ["padded", "padding-free"],
              [speed["padded"]["tokens_per_second"], speed["padding_free"]["tokens_per_second"]],
              ["reference", "fixed"], fmt="{:.0f}")
plotting.label(ax_speed, f"batch {sizes.speed_batch_size}, {run.attention}, {run.device.type}", "real tokens / second",
               f"throughput (padding share {speed['padded']['padding_share']:.0%} when padded)")
plotting.save(fig, run.output_dir, "padding_free")

fig, axes = plotting.figure(len(settings), title="Contaminated (recreated) / padded loss ratio, every setting", width=3.6)
for ax, name in zip(axes, settings):
    plotting.line(ax, BATCH_SIZES, ratios[name], "bad", "contaminated / padded")
    plotting.line(ax, BATCH_SIZES, [f["loss"] / p["loss"] for f, p in zip(sweep[name]["fixed"], sweep[name]["padded"])],
                  "fixed", "fixed / padded")
    ax.set_xscale("log", base=2)
    plotting.label(ax, "batch size", "loss ratio", name)
plotting.save(fig, run.output_dir, "loss_ratio_by_setting")

fig, (ax_bad, ax_today) = plotting.figure(2, title="Every family is contaminated by a mask over the whole row (recreated); "
                                             "OPT also by today's padding-free batches")
for family, marker in zip(FAMILIES, ("o", "s", "^")):
    plotting.line(ax_bad, BATCH_SIZES, family_ratios[family], "bad", family, marker=marker)
    today = loss_ratios(family_sweep[family], "fixed")
    plotting.line(ax_today, BATCH_SIZES, today, "bad" if family_gap[family] > 1e-3 else "fixed", family, marker=marker)
for ax, title in ((ax_bad, "contaminated (all-ones mask, recreated) / padded"),
                  (ax_today, "TRL 1.16 padding_free / padded")):
    ax.set_xscale("log", base=2)
    plotting.label(ax, "per-device batch size", "loss ratio", f"{title}, {MAIN}")
plotting.save(fig, run.output_dir, "loss_ratio_by_family")

fig, (ax_loss, ax_grad) = plotting.figure(2, title=f"Training: contaminated batches start with a {spike:.0f}x grad-norm "
                                          "spike and log a higher loss (recreated)")
steps = range(1, sizes.train_steps + 1)
for mode, kind in (("contaminated", "bad"), ("padded", "reference"), ("fixed", "fixed")):
    label = "fixed (on top of padded)" if mode == "fixed" else mode
    plotting.line(ax_loss, steps, training[mode]["loss"], kind, label)
    plotting.line(ax_grad, steps, training[mode]["grad_norm"], kind, label)
plotting.label(ax_loss, "optimizer step", "logged loss (nats/token)", f"Llama, batch {TRAIN_BATCH}, lr {sizes.train_learning_rate:g}")
plotting.label(ax_grad, "optimizer step", "grad norm (before clipping)", "grad norm per step", log_y=True)
plotting.save(fig, run.output_dir, "training")

fig, (ax_ratio, ax_logged) = plotting.figure(2, width=6.5, height=4.2,
                                             title=f"Remedies: {len(hidden)} of {len(remedies) - len(cured)} others hide the symptom, "
                                                   f"only {' and '.join(cured) or 'none'} cures it")
names = list(remedies)
kinds = ["fixed" if remedies[name]["isolated"] else "bad" for name in names]
ax_ratio.barh(names, [remedies[name]["ratio"] for name in names], color=[plotting.STYLE[k] for k in kinds])
ax_ratio.axvline(1, color=plotting.REFERENCE, linestyle="--")
ax_ratio.set_xlim(left=min(0.95, min(r["ratio"] for r in remedies.values()) - 0.02))
plotting.label(ax_ratio, "contaminated / padded loss, same weights", "", "do sequences still see each other? (1: no)")
ax_logged.barh(names, [remedies[name]["loss"] / remedies[name]["baseline"]["loss"] for name in names],
               color=[plotting.STYLE[k] for k in kinds])
ax_logged.axvline(1, color=plotting.REFERENCE, linestyle="--")
ax_logged.set_yticklabels([])
plotting.label(ax_logged, "logged loss / contaminated baseline", "", "does the logged loss look better? (< 1: yes)")
plotting.save(fig, run.output_dir, "remedies")

# %% [markdown]
# ## 7. What to remember
#
# * Padding-free is only correct when attention stops at each packed sequence's start. Otherwise
#   the loss and the grad norm rise with the batch size, and the model learns from foreign context.
# * Check the attention implementation on the built model (`model.config._attn_implementation`).
#   `model_init_kwargs` is ignored when you pass a model instance.
# * Run `packed_vs_separate` on your model before a padding-free run: equal per-sequence losses mean
#   isolation. An attention mask sent with the packed row, or a model family that builds its mask
#   without `position_ids` (OPT, Falcon, Bloom, MPT...), breaks it silently on sdpa/eager.
# * In training, contamination shows as a grad-norm spike at the first steps and a higher logged
#   loss; the model then partly adapts to the foreign context, which costs it clean held-out loss.
# * A smaller batch, a gentler schedule, more warmup, clipping, shorter documents or balanced lengths
#   can only make the logged numbers look better: sequences still see each other. Only attention that
#   stops at each sequence's start cures it.
# * Padding-free pays off with FlashAttention varlen kernels; on CPU sdpa measure before you assume.
#
# **The fix in your script**: build the model with the kernel, then check it on the built model:
#
# ```python
# model = AutoModelForCausalLM.from_pretrained(name, attn_implementation="flash_attention_2", dtype=torch.bfloat16)
# assert model.config._attn_implementation == "flash_attention_2"  # before SFTConfig(padding_free=True)
# ```
#
# ## 8. Exercise
#
# 1. Add batch size 32 to `BATCH_SIZES`. Predict the contaminated/padded ratio first.
# 2. Run `packed_vs_separate(all_ones_mask=True)` on a freshly initialised model and on a warmed-up
#    one. Why does the lesson warm its models up before measuring contamination?
# 3. Pass `use_cache=True` in a hand-written forward of a packed row (no mask). Is it still isolated?
#
# Worked solutions: [`solutions/01_padding_free_high_loss.py`](solutions/01_padding_free_high_loss.py) (a test runs them).
#
# ## Checks

# %% tags=["checks"]
def checks(n: dict) -> tuple[dict, dict]:
    """The claims above as functions of the numbers alone (a test feeds them runs without the bug)."""
    ratios, grad_ratios, probes, gap = n["loss_ratio"], n["grad_norm_ratio"], n["probes"], n["family_gap_padding_free"]
    families, training, remedies = n["family_loss_ratio"], n["training"], n["remedies"]
    largest = n["batch_sizes"][-1]
    worst = max(ratios, key=lambda name: ratios[name][-1])
    bad, padded = training["contaminated"], training["padded"]
    not_separating = [r for r in remedies.values() if not r["separates"]]
    symptom = {
        "contaminated/padded loss ratio grows with batch size in every setting":
            recreated(all(a <= b for r in ratios.values() for a, b in zip(r, r[1:]))),
        f"ratio above 1 at batch {largest} (> 1.1) in every setting":
            recreated(all(r[-1] > 1.1 for r in ratios.values())),
        f"ratio well above 1 at batch {largest} (> 1.5) where it hurts most": recreated(ratios[worst][-1] > 1.5),
        "no difference at batch 1 (< 1e-6)": recreated(all(abs(r[0] - 1) < 1e-6 for r in ratios.values())),
        f"grad norm at batch {largest} is over 1.5x padded in every setting":
            recreated(all(g[-1] > 1.5 for g in grad_ratios.values())),
        "probe flags an all-ones mask on a packed row":
            recreated(not probes["llama, position_ids + all-ones mask"]["isolated"]),
        f"every family ({', '.join(families)}): contaminated/padded ratio grows with batch size": recreated(
            all(a <= b for r in families.values() for a, b in zip(r, r[1:]))),
        f"every family: contaminated/padded ratio above 1.1 at batch {largest}": recreated(
            all(r[-1] > 1.1 for r in families.values())),
        "probe flags OPT as contaminated": not probes["opt, position_ids only"]["isolated"],
        "TRL's padding-free path changes OPT's loss (by > 10%)": gap["opt"] > 0.1,
        "training: contaminated grad norm at step 1 over 3x padded": recreated(
            bad["grad_norm"][0] > 3 * padded["grad_norm"][0]),
        "training: contaminated run logs a higher loss than padded to the end": recreated(
            bad["final_loss"] > padded["final_loss"]),
        "remedies short of separation leave packed sequences seeing each other (probe, ratio > 1)": recreated(
            all(not r["isolated"] and r["ratio"] > 1 for r in not_separating)),
        "a smaller batch hides the symptom: lower logged loss and grad norm": recreated(
            remedies["smaller batch"]["loss"] < remedies["smaller batch"]["baseline"]["loss"]
            and remedies["smaller batch"]["grad_norm"] < remedies["smaller batch"]["baseline"]["grad_norm"]),
        "model_init_kwargs is ignored for a model instance": n["attention_model_instance"] != "eager",
    }
    fix = {
        "fixed equals padded (relative difference < 1e-3)": n["fixed_vs_padded_max_relative"] < 1e-3,
        "probe finds Llama isolated with position_ids": probes["llama, position_ids only"]["isolated"],
        "TRL's padding-free path leaves Llama's and Qwen2's loss unchanged (< 1e-5)": max(gap["llama"], gap["qwen2"]) < 1e-5,
        "probe finds Qwen2 isolated with position_ids": probes["qwen2, position_ids only"]["isolated"],
        "training: fixed follows padded step by step (< 1e-3)": n["fixed_vs_padded_training"] < 1e-3,
        "separating the sequences cures it: probe isolated after training": all(
            r["isolated"] for r in remedies.values() if r["separates"]),
        "model_init_kwargs applies for a model path": n["attention_model_path"] == "eager",
        "padding-free computes no pad tokens": n["throughput"]["padding_free"]["padding_share"] == 0,
    }
    old, late = n["then"]["01-trl-0.14"], n["then"]["01-transformers-4.55"]
    if old["status"] == "finished":  # real TRL 0.14 + transformers 4.48.3 (checks absent when skipped)
        symptom["on TRL 0.14 + transformers 4.48.3 the real collator's packed batch is contaminated (sdpa, eager)"] = (
            not old["collator_has_mask"]
            and all(rows["train, the era's collator batch"] > 1e-4 for rows in old["differences"].values()))
        old_ratios = list(old["loss_ratio_by_batch_size"].values())
        symptom["on TRL 0.14's real SFTTrainer the padding-free/padded loss ratio is 1 at batch 1, then grows"] = (
            abs(old_ratios[0] - 1) < 1e-3 and all(a < b for a, b in zip(old_ratios, old_ratios[1:])))
    if late["status"] == "finished":  # real TRL 0.21 + transformers 4.55.4
        symptom["on transformers 4.55.4 a packed row is contaminated in train mode with the config's cache"] = all(
            rows["train, config use_cache=True, no mask"] > 1e-4 for rows in late["differences"].values())
        symptom["TRL 0.21's real collator sends the all-ones mask that the re-creation adds"] = (
            late["collator_mask_all_ones"])
        fix["on transformers 4.55.4 use_cache=False keeps packed sequences apart (< 1e-4)"] = all(
            rows["train, use_cache=False, no mask"] < 1e-4 for rows in late["differences"].values())
    return symptom, fix


# %%
numbers = {"batch_sizes": BATCH_SIZES, "sweep": sweep, "loss_ratio": ratios, "grad_norm_ratio": grad_ratios,
           "fixed_vs_padded_max_relative": fixed_vs_padded, "most_affected": worst, "mrc_worst": mrc_worse,
           "probes": {name: {k: v for k, v in r.items() if k in ("isolated", "max_relative_difference")}
                      for name, r in probes.items()},
           "family_gap_padding_free": family_gap, "family_sweep": family_sweep, "family_loss_ratio": family_ratios,
           "training": training, "fixed_vs_padded_training": fixed_vs_padded_training,
           "remedies": remedies,
           "attention_model_instance": attention_implementation(instance_trainer.model),
           "attention_model_path": attention_implementation(path_trainer.model),
           "speed_attention": run.attention, "fa2": fa2_outcome, "throughput": speed, "padding_free_speedup": speedup,
           "then": then_numbers}
metrics = save_metrics(run, "01", numbers, checks, eras=[then.to_metrics() for then in then_runs])
assert not failed_checks(metrics), f"checks failed: {failed_checks(metrics)}"
print(f"all checks passed; metrics in {run.output_dir / 'metrics.json'}")
