# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 02b · Gradient accumulation across processes (DDP)
#
# **The report** ([TRL issue #2175](https://github.com/huggingface/trl/issues/2175)): batch 1 ×
# gradient accumulation 32 trained worse than batch 32 (lesson 02 reproduces it in one process). With several
# processes the same question comes back one level up ([transformers issue
# #34242](https://github.com/huggingface/transformers/issues/34242)), and the answer is
# `average_tokens_across_devices` ([PR #34373](https://github.com/huggingface/transformers/pull/34373)
# added it, [PR #39395](https://github.com/huggingface/transformers/pull/39395) made it the default).
#
# **You will learn**
# * why counting label tokens per process still gives the wrong gradient when the processes hold
#   different amounts of text;
# * what `average_tokens_across_devices=True` does: it sums the counts of all processes and multiplies
#   the loss by the number of processes, which undoes DDP's average;
# * how to check a distributed setup yourself: its first-step gradient against one process with the
#   whole batch;
# * what accelerate makes of `fsdp=True` on CPU processes.
#
# **You should know**
# * lesson 02 ([02_gradient_accumulation_loss.ipynb](02_gradient_accumulation_loss.ipynb)):
#   `num_items_in_batch` and the loss before transformers 4.46;
# * what data parallelism averages: [PyTorch's DDP notes](https://docs.pytorch.org/docs/stable/notes/ddp.html);
# * [TRL's `SFTTrainer`](https://huggingface.co/docs/trl/sft_trainer) and
#   [`TrainingArguments`](https://huggingface.co/docs/transformers/main_classes/trainer#transformers.TrainingArguments).
#
# **Time**: 21 s to run on the cpu profile (seed 0, 2 CPU cores, one lesson at a time: `trl-clinic run 02b
# --profile cpu --jobs 1`); gpu profile not measured yet. About 25 minutes to read and try the exercises.
#
# **What ran here, and what did not**: today's real `SFTTrainer` on 2 processes. On the cpu profile
# they are CPU processes talking over gloo, started with torchrun, and accelerate runs them as
# **DDP**; the run prints what ran. FSDP is asked for too (`fsdp=True`), but on CPU processes
# accelerate runs it as plain DDP: **FSDP on GPUs has not been run** for this lesson, nor has the
# multi-GPU launch (`accelerate launch --multi_gpu`, NCCL) that the notebook uses when there is one
# GPU per process. The old per-process mean is **re-created** on today's `Trainer`
# (`trl_clinic.course.stand_ins.recreate_pre_446_loss`); no old library version runs here.

# %% tags=["parameters"]
profile = "auto"  # "auto" (gpu when CUDA is present), "cpu" or "gpu"
seed = 0
output_dir = None  # None: outputs/02b_gradient_accumulation_ddp at the repository root

# %%
from trl import SFTConfig

from trl_clinic.course import child
from trl_clinic.course.companions.accumulation_ddp import compare, plot_errors, reference_gradients, same_label_tokens
from trl_clinic.probes.gradients import relative_error
from trl_clinic.course.launch import distributed_args
from trl_clinic.course.parameters import start_run
from trl_clinic.course.results import failed_checks, recreated, save_metrics

run = start_run("02b", profile, seed, output_dir)
print(run.describe())
sizes = run.sizes  # this lesson's numbers for the profile (lessons.yaml)

# %% [markdown]
# ## 1. The symptom: two processes against one big batch
#
# Four settings, each a change to `SFTConfig`. A child launch runs the real `SFTTrainer` in every
# process (batch 1 per process, `max_grad_norm=0`) and keeps the first step's gradient after DDP
# synchronised it, at each accumulation count. Then one process takes the same rows as one batch.

# %% tags=["symptom"]
SETTINGS = {  # SFTConfig changes; the child builds SFTTrainer with them (trl_clinic/course/companions/accumulation_ddp.py)
    "old": {"average_tokens_across_devices": False},  # + recreate_pre_446_loss(trainer): re-created < 4.46
    "per-process": {"average_tokens_across_devices": False},  # num_items_in_batch of this process only
    "across-processes": {"average_tokens_across_devices": True},  # the label counts of all processes
    "across-processes, fsdp": {"average_tokens_across_devices": True, "fsdp": True},
}
launched = child.call(run, "trl_clinic.course.companions.accumulation_ddp:distributed_gradients", {"settings": SETTINGS},
                      name="ddp", processes=sizes.processes, timeout=sizes.child_timeout_s)
assert not launched.outcome.crashed, launched.outcome.stderr[-3000:]
references = reference_gradients(run)  # one process, batch processes x accumulation, no accumulation
acc = max(sizes.accumulation)
for setting in ("old", "per-process"):
    error = relative_error(launched.result["gradients"][(setting, acc)], references[acc].gradient)
    print(f"{setting} ({sizes.processes} processes x accumulation {acc}): the gradient is {error:.0%} off "
          "one process with the whole batch")

# %% [markdown]
# ## 2. What ran
#
# `child.call` starts the processes itself (so that papermill can run this notebook and a failing
# process cannot take the kernel down) with the command below (a new free port each launch). With
# one GPU per process it would be `accelerate launch --multi_gpu` (NCCL); otherwise torchrun, because
# without GPUs (or with `--cpu`) accelerate 1.15's `accelerate launch` starts one plain process, or
# several through `mpirun` when given `--mpirun_hostfile` (`commands/launch.py`, `launch_command`;
# `utils/launch.py`, `prepare_simple_launcher_cmd_env`). Each process reports what it ran and the
# label tokens it saw.

# %%
print("python", " ".join(distributed_args(["-m", "trl_clinic.course.child", "child_ddp.json"], sizes.processes,
                                          cpu=run.device.type == "cpu")))
world, ran_as, counts = launched.result["world"], launched.result["ran_as"], launched.result["counts"]
print(f"{world['processes']} processes over {world['backend']}, {launched.outcome.describe()}")
for setting, how in ran_as.items():
    print(f"  {setting}: accelerate ran it as {how}")
for acc, per_rank in counts.items():
    print(f"accumulation {acc}: " + "; ".join(f"process {r} label tokens {c}" for r, c in enumerate(per_rank)))

# %% [markdown]
# The rows of `data.instruction_pairs` alternate a one-word answer and a biography (its docstring
# guarantees it on every seed), and the processes take whole batches in turn (accelerate 1.15,
# `data_loader.py`, `BatchSamplerShard` with `split_batches=False`): with batch 1, process 0 holds every
# short answer and process 1 every long one, as the counts above show.
#
# ## 3. Every setting against the big batch
#
# One process with batch `processes × accumulation` takes the rows of the distributed step, and its
# loss is one mean over all their label tokens. The run checks that it saw as many label tokens as
# the processes together.

# %%
comparison = compare(launched.result["gradients"], references, SETTINGS)
same_samples = same_label_tokens(counts, references)
print("the reference saw as many label tokens as the processes together:", same_samples)
for setting, rows in comparison.items():
    print(f"{setting:>22}: relative error " + ", ".join(f"{r['relative_error']:.3g}" for r in rows)
          + f" at accumulation {', '.join(str(r['accumulation']) for r in rows)}")

# %%
fsdp_applied = "FSDP" in ran_as["across-processes, fsdp"]  # what accelerate really ran, not what was asked
plot_errors(run, comparison, world["backend"], fsdp_applied)

# %% [markdown]
# ## 4. Why only counting across processes matches
#
# Write `Sₚ` for the summed token loss of process *p*'s micro-batches and `Nₚ` for its label count;
# DDP **averages** the gradients of the *W* processes. The big batch wants `(S₀ + S₁) / (N₀ + N₁)`.
#
# * **per-process** `num_items_in_batch`: each process computes `Sₚ / Nₚ`, and DDP's average gives
#   `(S₀/N₀ + S₁/N₁) / 2`: right only when both processes hold the same number of label tokens
#   (exercise 1 measures that case). Within a process, accumulation is already right (lesson 02).
# * **old**: a mean per micro-batch, as in lesson 02, *and* a mean over processes: wrong twice. At
#   accumulation 1 with batch 1 it is the same computation as per-process; the cell below sets the
#   two rows side by side, to see how much each mistake weighs here.
# * **across-processes**: transformers 5.23 gathers every process's count and sums it
#   (`trainer.py`, `Trainer._get_num_items_in_batch`); TRL 1.16 divides the summed token loss by that
#   sum and multiplies it by *W* (`trainer/sft_trainer.py`, `SFTTrainer.compute_loss`). DDP's average
#   removes the *W*: `(S₀ + S₁) / (N₀ + N₁)`.

# %%
for old, per_process in zip(comparison["old"], comparison["per-process"]):
    print(f"accumulation {old['accumulation']}: old {old['relative_error']:.6f}, "
          f"per-process {per_process['relative_error']:.6f}")

# %% [markdown]
# ### FSDP: asked for, run as DDP
#
# accelerate 1.15 switches a run to FSDP only when its processes are multi-GPU (or MLU, NPU, XPU, ...)
# processes (`state.py`, `AcceleratorState.__init__`); CPU processes stay `MULTI_CPU`, with the model in
# plain `DistributedDataParallel` (printed in section 2). FSDP1 (`fsdp_config={"version": 1}`, deprecated) turns `sync_module_states` on by default
# (transformers 5.23, `training_args.py`, `_process_fsdp_args`), and accelerate's
# `FullyShardedDataParallelPlugin.__post_init__` then raises "There are currently no available devices
# found" when there is no accelerator (`utils/dataclasses.py`; read, not run here). On GPUs, torch 2.13's FSDP2 averages the reduced gradient over the processes as
# DDP does (`distributed/fsdp/_fully_shard/_fsdp_collectives.py`, `_get_gradient_divide_factors`), so the
# same count and factor should be exact there too: read, not measured.

# %%
if fsdp_applied:
    print(f"FSDP ran for real ({ran_as['across-processes, fsdp']}): its line in the plot is the FSDP result")
else:
    print(f"fsdp=True ran as {ran_as['across-processes, fsdp']} over {world['backend']}: its line repeats DDP; "
          "FSDP itself was not run")

# %% [markdown]
# ## 5. The fix in your script
#
# `SFTConfig(..., average_tokens_across_devices=True)`, which is the default: do not turn it off, and
# keep a loss that uses `num_items_in_batch`. The proof is section 3's `across-processes` row.

# %%
print("SFTConfig's default average_tokens_across_devices:", SFTConfig.average_tokens_across_devices)
fixed_error = max(r["relative_error"] for r in comparison["across-processes"])
print(f"with it, the largest relative error against the big batch: {fixed_error:.1e}")

# %% [markdown]
# ## 6. What to remember
#
# * With several processes the right denominator is the label count of *all* processes'
#   micro-batches; counting per process (`average_tokens_across_devices=False`) gave a different
#   gradient here, where the processes held different numbers of label tokens.
# * Check your own setup the way this notebook does: the first-step gradient of the distributed run
#   against one process with the whole batch, with `max_grad_norm=0`.
# * Read `trainer.accelerator.distributed_type` before you believe a run is sharded: on CPU processes,
#   `fsdp=True` ran as DDP.
# * **The fix**: `SFTConfig(..., average_tokens_across_devices=True)` (the default), with a loss that
#   uses `num_items_in_batch`.

# %% [markdown]
# ## 7. Exercise
#
# 1. Make every sample about the same length (`max_people=1`, biographies only): which settings match now?
#    <details><summary>Hint</summary>
#    Section 4's per-process formula equals the big batch's when N₀ = N₁. Keep the odd rows of
#    `data.instruction_pairs(n, seed, max_people=1)` and count each process's label tokens first.
#    </details>
# 2. With 2 processes and `per_device_train_batch_size=2`, predict the per-process error, then measure.
#    <details><summary>Hint</summary>
#    Write down which rows each process gets when batches of 2 are dealt out in turn: how far apart
#    are the two processes' label counts now, compared with batch 1?
#    </details>
#
# Worked solutions: [`solutions/02b_gradient_accumulation_ddp.py`](solutions/02b_gradient_accumulation_ddp.py) (a test runs them).

# %% [markdown]
# ## Checks
#
# The claims above, asserted on this run's numbers.

# %% jupyter={"source_hidden": true} tags=["checks"]
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
        "the reference saw as many label tokens as the processes together": n["same_samples"],
        "counts across processes match the big batch (< 1e-4)": max(errors["across-processes"]) < 1e-4,
        "with fsdp=True asked for, counts across processes match it too (< 1e-4)":
            max(errors["across-processes, fsdp"]) < 1e-4,
    }
    return symptom, fix


# %% jupyter={"source_hidden": true}
numbers = {"backend": world["backend"], "same_samples": same_samples, "label_counts": counts,
           "comparison": comparison, "ran_as": ran_as, "fsdp_applied": fsdp_applied}
worst = {s: max(r["relative_error"] for r in comparison[s]) for s in ("old", "per-process")}
summary = (f"On {world['processes']} processes over {world['backend']}, the re-created old per-process mean was up to "
           f"{worst['old']:.0%} and per-process num_items_in_batch up to {worst['per-process']:.0%} off one process "
           f"with the whole batch; average_tokens_across_devices=True matched it to {fixed_error:.0e}. "
           f"fsdp=True ran as {ran_as['across-processes, fsdp']}" + ("." if fsdp_applied else ": FSDP itself was not run."))
metrics = save_metrics(run, "02b", numbers, checks, summary=summary)
assert not failed_checks(metrics), f"checks failed: {failed_checks(metrics)}"
print(summary)
print(f"all checks passed; metrics in {run.output_dir / 'metrics.json'}")
