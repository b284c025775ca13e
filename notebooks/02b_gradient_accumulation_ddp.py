# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 02b · Gradient accumulation across processes (DDP, FSDP)
#
# **The report** ([TRL issue #2175](https://github.com/huggingface/trl/issues/2175), continued): the
# loss-normalisation bug of lesson 02 also hits distributed training (DDP, FSDP), and fixing it
# there needs the label-token counts of *all* processes, not only of the local micro-batches.
#
# **What you will see here**: the same `SFTTrainer` comparison run on 2 processes that each see
# different sequence lengths, started by the notebook itself; the synchronised gradient compared
# with the one-process, one-big-batch gradient for three settings: the old per-process mean,
# today's per-process `num_items_in_batch`, and counts summed across processes
# (`average_tokens_across_devices=True`, the default in `TrainingArguments`). Only one matches. The
# last setting is also run with FSDP asked for (`fsdp=True`), and the notebook says what accelerate
# made of that request on this machine.
#
# **Time**: about 25 s on the cpu profile (2 CPU cores); `trl-clinic list` shows what each profile runs.
#
# The old per-process mean is **re-created** on today's `Trainer` (`trl_clinic.stand_ins`); the other
# two settings are today's real code paths.

# %% tags=["parameters"]
profile = "auto"  # "auto" (gpu when CUDA is present), "cpu" or "gpu"
seed = 0
output_dir = None  # None: outputs/02b_gradient_accumulation_ddp at the repository root

# %%
import torch
from transformers import PrinterCallback
from trl import SFTConfig, SFTTrainer

from trl_clinic import child, data, plotting
from trl_clinic.gradients import cosine, first_step_gradient, label_counts, relative_error
from trl_clinic.launch import backend
from trl_clinic.models import make_causal_lm
from trl_clinic.parameters import start_run
from trl_clinic.results import failed_checks, recreated, save_metrics
from trl_clinic.tokenizer import build_tokenizer

run = start_run("02b", profile, seed, output_dir)
print(run.describe())
sizes = run.sizes  # this lesson's numbers for the profile (lessons.yaml)
SETTINGS = ("old", "per-process", "across-processes", "across-processes, fsdp")

# %% [markdown]
# ## 1. Reproduce: the multi-process run
#
# The function below runs in every process. For each accumulation count and each setting it builds
# an `SFTTrainer` (batch 1 per process, `max_grad_norm=0`) and captures the gradient of the first step
# after DDP has averaged it across processes. Each process also counts the label tokens of its own
# micro-batches; the main process gathers the counts and returns everything to the notebook.
#
# * **old** (re-created): `recreate_pre_446_loss(trainer)`: each micro-batch's mean, divided by the
#   accumulation steps (as before transformers 4.46);
# * **per-process**: `num_items_in_batch` counted over this process's micro-batches only
#   (`average_tokens_across_devices=False`);
# * **across-processes**: `average_tokens_across_devices=True`: the counts of all processes are summed
#   (a gather), and the loss is multiplied by the number of processes to undo DDP's averaging;
# * **across-processes, fsdp**: the same with `fsdp=True` (FSDP2, transformers' default version), the
#   report's other setup. FSDP shards parameters and gradients, and reduces gradients as an average over
#   processes as DDP does, so the same count and the same factor should make it exact too. Each process
#   records what accelerate really ran (`trainer.accelerator.distributed_type` and the model's wrapper).

# %%
# %%writefile {run.output_dir}/ddp_child.py
"""Lesson 02b's multi-process run: `distributed_gradients(run, spec)` runs in every process."""
from accelerate.utils import gather_object
from trl import SFTConfig, SFTTrainer

from trl_clinic import data
from trl_clinic.gradients import first_step_gradient, label_counts
from trl_clinic.models import make_causal_lm
from trl_clinic.stand_ins import recreate_pre_446_loss
from trl_clinic.tokenizer import build_tokenizer


def distributed_gradients(run, spec):
    tokenizer = build_tokenizer()
    train_set = data.instruction_pairs(run.sizes.n_samples, seed=run.subseed("train"))
    gradients, counts, ran_as = {}, {}, {}
    for accumulation in run.sizes.accumulation:
        for setting in spec["settings"]:
            args = SFTConfig(
                **{**run.trainer_kwargs(f"ddp-{setting}-{accumulation}".replace(", ", "-"), logging=False),
                   "bf16": False},
                per_device_train_batch_size=1,
                gradient_accumulation_steps=accumulation,
                max_grad_norm=0,
                max_steps=1,
                train_sampling_strategy="sequential",  # process p gets samples p, p + 2, ...
                average_tokens_across_devices=setting.startswith("across-processes"),  # the flag this lesson is about
                fsdp=setting.endswith("fsdp"),  # FSDP2 (fsdp_config version 2, the default)
            )
            trainer = SFTTrainer(model=make_causal_lm(tokenizer, size=run.sizes.model_size, seed=run.seed),
                                 args=args, train_dataset=train_set, processing_class=tokenizer)
            if setting == "old":
                recreate_pre_446_loss(trainer)
            gradients[(setting, accumulation)] = first_step_gradient(trainer)
            ran_as[setting] = f"{trainer.accelerator.distributed_type.value}, {type(trainer.model_wrapped).__name__}"
        # the same sequential sampler: this process's micro-batches of the first step
        counts[accumulation] = gather_object([label_counts(trainer, accumulation)])  # one list per process
    return {"gradients": gradients, "counts": counts, "ran_as": ran_as}

# %% [markdown]
# The notebook starts the processes itself with `trl_clinic.child.call`, so papermill can run it and
# a failure in a process cannot take the kernel down. With one GPU per process it uses
# `accelerate launch --multi_gpu` (NCCL); otherwise CPU processes over gloo, started with torchrun
# (accelerate 1.15's `launch` starts multi-CPU jobs only through MPI; inside, the Trainer's accelerate
# sees the distributed environment either way). The processes get this run's device, precision and
# sizes; the cpu profile's processes see no GPU even on a machine that has some.

# %%
BACKEND = backend(sizes.processes, cpu=run.device.type == "cpu")
launched = child.call(run, f"{run.output_dir}/ddp_child.py:distributed_gradients", {"settings": SETTINGS},
                      name="ddp", processes=sizes.processes, timeout=sizes.child_timeout_s)
print(f"{sizes.processes} processes over {BACKEND}: {launched.outcome.describe()}")
assert not launched.outcome.crashed, launched.outcome.stderr[-3000:]
ran_as = launched.result["ran_as"]
fsdp_applied = "FSDP" in ran_as["across-processes, fsdp"]
print(f"accelerate ran 'across-processes' as {ran_as['across-processes']}, and with fsdp=True as "
      f"{ran_as['across-processes, fsdp']}: FSDP {'applied' if fsdp_applied else 'NOT applied (plain DDP)'}")
counts = launched.result["counts"]
for acc, per_rank in counts.items():
    print(f"accumulation {acc}: " + "; ".join(f"process {r} label tokens {c} (sum {sum(c)})"
                                              for r, c in enumerate(per_rank)))

# %% [markdown]
# ## 2. Diagnose: against one process with one big batch
#
# One process with batch `processes × accumulation` sees exactly the samples of the distributed
# step (the same sequential sampler deals them out), and its loss is one mean over all their label
# tokens. Sequential sampling over `data.instruction_pairs`, whose rows alternate short and long
# answers on every seed, gives the two processes different label counts by construction.

# %%
tokenizer = build_tokenizer()
train_set = data.instruction_pairs(sizes.n_samples, seed=run.subseed("train"))


def reference_gradient(batch_size: int) -> tuple[torch.Tensor, int]:
    args = SFTConfig(**{**run.trainer_kwargs(f"reference-{batch_size}", logging=False), "bf16": False},
                     per_device_train_batch_size=batch_size, max_grad_norm=0, max_steps=1,
                     train_sampling_strategy="sequential")
    trainer = SFTTrainer(model=make_causal_lm(tokenizer, size=sizes.model_size, seed=run.seed), args=args,
                         train_dataset=train_set, processing_class=tokenizer)
    trainer.remove_callback(PrinterCallback)  # its end-of-run dict would bury the comparison
    return first_step_gradient(trainer), sum(label_counts(trainer, 1))


comparison = {setting: [] for setting in SETTINGS}
same_samples = True
for acc in sizes.accumulation:
    reference, reference_count = reference_gradient(sizes.processes * acc)
    same_samples &= reference_count == sum(sum(c) for c in counts[acc])
    for setting in SETTINGS:
        gradient = launched.result["gradients"][(setting, acc)]
        comparison[setting].append({"accumulation": acc, "relative_error": relative_error(gradient, reference),
                                    "cosine": cosine(gradient, reference)})
    print(f"accumulation {acc} (reference: {reference_count} label tokens): " + "  ".join(
        f"{s}: err {comparison[s][-1]['relative_error']:.1e}" for s in SETTINGS))
print("the reference saw the same label tokens as the processes together:", same_samples)
print("per-process against old, relative error: " + ", ".join(
    f"{p['relative_error']:.2f} vs {o['relative_error']:.2f} at {p['accumulation']}"
    for p, o in zip(comparison["per-process"], comparison["old"])))

# %% [markdown]
# ## 3. The fix, and why only one setting matches
#
# Write `Sₚ` for the summed token loss of process *p*'s micro-batches and `Nₚ` for its label count;
# DDP **averages** gradients over the *W* processes. The big batch wants `(S₀ + S₁) / (N₀ + N₁)`.
#
# * **per-process** `num_items_in_batch`: each process computes `Sₚ / Nₚ`; DDP gives
#   `(S₀/N₀ + S₁/N₁) / 2`: right only when both processes hold the same number of tokens. Within a
#   process accumulation is already fixed, so what is left is the imbalance between processes, and here
#   it is the largest there can be: the sequential sampler deals the rows out alternately, so process 0
#   gets every short answer and process 1 every long one (section 1's counts).
# * **old**: a mean per micro-batch, as in lesson 02, *and* a mean per process: wrong twice.
# * **across-processes**: every process divides by the gathered `N₀ + N₁` and multiplies by *W*; DDP's
#   average removes the *W*: `(S₀ + S₁) / (N₀ + N₁)`. Exact. FSDP averages its reduced gradient
#   shards over the *W* processes the same way, so the same count and factor are exact there too.
#
# At accumulation 1 with batch 1 the old and per-process paths are the same computation. And when the
# processes happen to hold the same number of label tokens (the counts printed in section 1 say
# when), the per-process path is exact too: the bug needs unequal counts, which real data almost
# always gives.

# %%
fig, (ax_err, ax_cos) = plotting.figure(
    2, title=f"{sizes.processes} processes: only counts summed across processes match the big batch")
kinds = {"old": "bad", "per-process": "other", "across-processes": "fixed", "across-processes, fsdp": "fixed"}
styles = {"per-process": {"linestyle": ":"}, "across-processes, fsdp": {"linestyle": "--", "marker": "x"}}
legend = {**{s: s for s in SETTINGS}, "old": "old (recreated)",
          "across-processes, fsdp": f"across-processes, fsdp=True ({'FSDP' if fsdp_applied else 'ran as DDP'})"}
for setting in SETTINGS:
    plotting.line(ax_err, sizes.accumulation, [max(r["relative_error"], 1e-9) for r in comparison[setting]],
                  kinds[setting], legend[setting], **styles.get(setting, {}))
    plotting.line(ax_cos, sizes.accumulation, [r["cosine"] for r in comparison[setting]], kinds[setting],
                  legend[setting], **styles.get(setting, {}))
plotting.label(ax_err, "accumulation steps per process (batch 1)", "relative error vs big batch",
               f"gradient error ({BACKEND})", log_y=True)
plotting.label(ax_cos, "accumulation steps per process (batch 1)", "cosine with big-batch gradient", "direction")
for ax in (ax_err, ax_cos):
    ax.set_xticks(sizes.accumulation, [str(acc) for acc in sizes.accumulation])  # accumulation counts are integers
    ax.minorticks_off()
plotting.save(fig, run.output_dir, "ddp_accumulation")

# %% [markdown]
# ### Where FSDP runs
#
# Through the `Trainer`, FSDP needs accelerators. accelerate switches a run to FSDP only when it is
# distributed over GPUs (or XPUs, NPUs, ...): on CPU processes over gloo, accelerate 1.15 takes
# `fsdp=True` (FSDP2) without a word and runs plain DDP, and FSDP1 (`fsdp_config={"version": 1}`) refuses
# to start with `RuntimeError: There are currently no available devices found, must be one of 'XPU',
# 'CUDA', 'MLU', 'NPU', 'MUSA', or 'HPU'.` (accelerate 1.15 and torch 2.13, when this lesson was written).
# What this run did is measured above and printed here:

# %%
if fsdp_applied:
    print(f"FSDP ran for real ({ran_as['across-processes, fsdp']}): its line in the plot is the FSDP result")
else:
    print(f"FSDP was asked for but not applied here ({ran_as['across-processes, fsdp']}, {BACKEND}): its line "
          "repeats the DDP result; FSDP itself runs with one GPU per process (the multi-gpu setup, nccl)")

# %% [markdown]
# ## 4. What to remember
#
# * With several processes the right denominator is the label count of *all* processes' micro-batches:
#   keep `average_tokens_across_devices=True` (the default) and a loss that uses `num_items_in_batch`.
# * Turning it off, or a custom loss that averages locally, trains a different objective whenever
#   processes see different sequence lengths, which is always, with real data.
# * Check your own setup the way this notebook does: first-step gradient of the distributed run
#   against one process with the whole batch.
# * With FSDP the same flag does the same job; and read `trainer.accelerator.distributed_type` before you
#   believe a run is sharded: on CPU processes, `fsdp=True` runs as DDP without a warning.
#
# **Running any lesson's training on several GPUs**: put the trainer code in a script and start it
# with `accelerate launch --multi_gpu --num_processes N script.py` (see the README).
#
# **The fix in your script**: `SFTConfig(..., average_tokens_across_devices=True)` (the default: do
# not turn it off), with a loss that uses `num_items_in_batch`.

# %% [markdown]
# ## 5. Exercise
#
# 1. Make every sample about the same length (`max_people=1`, biographies only): which settings match now?
# 2. With 2 processes and `per_device_train_batch_size=2`, predict the per-process error, then measure.
#
# Worked solutions: [`solutions/02b_gradient_accumulation_ddp.py`](solutions/02b_gradient_accumulation_ddp.py) (a test runs them).

# %% [markdown]
# ## Checks

# %% tags=["checks"]
def checks(n: dict) -> tuple[dict, dict]:
    """The claims above as functions of the numbers alone (a test feeds them runs without the bug)."""
    errors = {s: [r["relative_error"] for r in rows] for s, rows in n["comparison"].items()}
    accumulation = [r["accumulation"] for r in n["comparison"]["old"]]
    # the per-process path is exact when the processes hold equal token counts: judge it where they differ
    unequal = [i for i, acc in enumerate(accumulation) if len({sum(c) for c in n["label_counts"][str(acc)]}) > 1]
    symptom = {
        "the processes saw different numbers of label tokens at two accumulation counts or more": len(unequal) >= 2,
        "where they did, the old per-process mean misses the big batch (> 1e-2)":
            recreated(bool(unequal) and all(errors["old"][i] > 1e-2 for i in unequal)),
        "where they did, per-process num_items_in_batch misses it (> 1e-2)":
            bool(unequal) and all(errors["per-process"][i] > 1e-2 for i in unequal),
    }
    fix = {
        "the distributed step saw the reference's samples": n["same_samples"],
        "counts across processes match the big batch (< 1e-4)": max(errors["across-processes"]) < 1e-4,
        "with fsdp=True asked for, counts across processes match it too (< 1e-4)":
            max(errors["across-processes, fsdp"]) < 1e-4,
    }
    return symptom, fix


# %%
numbers = {"backend": BACKEND, "same_samples": same_samples, "label_counts": counts, "comparison": comparison,
           "ran_as": ran_as, "fsdp_applied": fsdp_applied}
metrics = save_metrics(run, "02b", numbers, checks)
assert not failed_checks(metrics), f"checks failed: {failed_checks(metrics)}"
print(f"all checks passed; metrics in {run.output_dir / 'metrics.json'}")
