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
# With several processes, counting the label tokens of each process's own window still weighs tokens unequally
# when the processes hold different amounts of text
# ([transformers #34242](https://github.com/huggingface/transformers/issues/34242), a sequel to lesson 02's TRL #2175).
#
# **You will learn**
# * why a per-process token count reweights tokens once DDP averages the processes' gradients;
# * what `average_tokens_across_devices=True` (the default) changes;
# * to check a distributed run's first-step gradient against one process.
#
# **You should know**: lesson 02 ([02_gradient_accumulation_loss.ipynb](02_gradient_accumulation_loss.ipynb)); DDP averages gradients over processes.
#
# **Time**: 25 s to run on the cpu [profile](../README.md#words-the-lessons-use); about 20 minutes to work through.
#
# > **Hosted** (Colab, Kaggle, no clone): upload the wheel `uv build` makes, then run `%pip install "./trl_clinic-0.1.0-py3-none-any.whl[course]"` first.

# %% tags=["parameters"]
profile = "auto"  # "auto" (gpu when CUDA is present), "cpu" or "gpu"
seed = 0
output_dir = None  # None: outputs/02b_gradient_accumulation_ddp at the repository root

# %%
import trl_clinic.course  # first: the lessons' offline mode, and two optional libraries' warnings kept quiet
from trl import SFTConfig

from trl_clinic.course import child
from trl_clinic.course.lessons.lesson_02b_accumulation_ddp import companion
from trl_clinic.course.parameters import start_run
from trl_clinic.course.results import check
from trl_clinic.probes.gradients import relative_error

run = start_run("02b", profile, seed, output_dir)
print(run.describe())
sizes = run.sizes
TARGET = "trl_clinic.course.lessons.lesson_02b_accumulation_ddp.companion:distributed_gradients"  # runs in every process
SETTINGS = {"per-process": {"average_tokens_across_devices": False},  # SFTConfig changes, one trainer each
            "across processes": {"average_tokens_across_devices": True}}

# %% [markdown]
# ## 1. The symptom
#
# `child.call` starts the processes (torchrun; CPU processes over gloo on the cpu profile) and runs today's
# `SFTTrainer` in each, once per setting and accumulation count k, with this config:
#
# ```python
# SFTConfig(per_device_train_batch_size=1, gradient_accumulation_steps=k, average_tokens_across_devices=False,
#           train_sampling_strategy="sequential", max_grad_norm=0, max_steps=1)  # rows in order, nothing clipped
# ```
#
# It keeps the first step's gradient after DDP averaged it. Then one process takes the same rows as one batch.

# %% tags=["symptom"]
spec = {"settings": SETTINGS, "rows": "mixed", "batch_size": 1}
launched = child.call(run, TARGET, spec, name="ddp", processes=sizes.processes, timeout=sizes.child_timeout_s)
assert not launched.outcome.crashed, launched.outcome.stderr[-3000:]
references = companion.reference_gradients(run, spec)  # one process, the whole batch, no accumulation
comparison = companion.compare(launched.result["gradients"], references, SETTINGS)
world, counts = launched.result["world"], launched.result["counts"]
print(f"{world['processes']} processes over {world['backend']} ({launched.result['ran_as']['per-process']}), "
      f"{launched.outcome.describe()}")
for row in comparison["per-process"]:
    print(f"average_tokens_across_devices=False, accumulation {row['accumulation']}: the gradient is "
          f"{row['relative_error']:.0%} off one process with the whole batch")

# %% [markdown]
# ## 2. Who gets which weight
#
# Each process *p* divides its summed token loss `Sₚ` by its own label count `Nₚ`; DDP then averages the W
# processes' gradients: `(S₀/N₀ + S₁/N₁) / 2` with two. A token of process *p* weighs `1 / (W · Nₚ)`; in one
# batch every token weighs `1 / (N₀ + N₁)`. The processes are dealt whole batches in turn, so with batch 1
# process 0 holds every one-word answer and process 1 every biography:

# %% tags=["mechanism"]
k = max(sizes.accumulation)
tokens = [sum(per_rank) for per_rank in counts[k]]  # label tokens of each process's window
for p, n_p in enumerate(tokens):
    print(f"process {p}: N = {n_p:4}   per process: 1/({len(tokens)} x {n_p}) = {1 / (len(tokens) * n_p):.5f}   "
          f"across processes: 1/{sum(tokens)} = {1 / sum(tokens):.5f}")

# %% [markdown]
# The distributed gradient is exactly that weighting: the same objective computed by hand in one process, on
# the same rows and weights, against the gradient the processes produced:

# %%
formula = companion.per_process_gradient(run, spec, k)  # (S0/N0 + S1/N1) / 2, by hand
by_hand = {setting: relative_error(launched.result["gradients"][(setting, k)], formula) for setting in SETTINGS}
print(f"accumulation {k}, distributed gradient vs (S0/N0 + S1/N1) / 2 by hand: "
      + ", ".join(f"{setting} {error:.1e}" for setting, error in by_hand.items()))

# %% [markdown] tags=["fix"]
# ## 3. The fix
#
# Count across processes. The Trainer gathers every process's count and sums it; TRL's `SFTTrainer` divides the
# summed token loss by that sum and multiplies by W, and DDP's average removes the W: `(S₀ + S₁) / (N₀ + N₁)`
# (`trainer.py`, `Trainer._get_num_items_in_batch`; `sft_trainer.py`, `SFTTrainer.compute_loss`, in the versions
# printed above). It is the default, so the fix is to not turn it off:
#
# ```diff
# - args = SFTConfig(..., average_tokens_across_devices=False)
# + args = SFTConfig(..., average_tokens_across_devices=True)  # the default since transformers 4.54
# ```

# %%
default = SFTConfig.__dataclass_fields__["average_tokens_across_devices"].default
print(f"SFTConfig's default average_tokens_across_devices: {default}")
for row in comparison["across processes"]:
    print(f"average_tokens_across_devices=True, accumulation {row['accumulation']}: relative error {row['relative_error']:.1e}")

# %% [markdown]
# ## 4. Check your own distributed run
#
# Plain torch and transformers: keep the first step's gradient in every process (DDP has averaged it by then), save
# rank 0's, then run one process with batch W × b × k on the same rows; build both with `max_grad_norm=0`.

# %% tags=["portable-check"]
import torch
from transformers import TrainerCallback


class FirstGradient(TrainerCallback):  # on_optimizer_step: transformers 4.42 or later
    def on_optimizer_step(self, args, state, control, model=None, **kwargs):
        self.gradient = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]).double()
        control.should_training_stop = True


def first_gradient(trainer):
    trainer.add_callback(keep := FirstGradient())
    trainer.train()
    return keep.gradient  # compare: (distributed - single).norm() / single.norm(), float noise when right


# %% [markdown]
# Here on the one-process trainer, against the gradients the processes produced: it is section 1's comparison
# again, through these lines. The [check-up](../README.md#words-the-lessons-use)'s `accumulation` [probe](../README.md#words-the-lessons-use) (`checkup(trainer, only=["accumulation"])`, run
# in each process before training, at accumulation k) flags the setting from the config:

# %%
single = first_gradient(companion.one_step_trainer(run, "portable", sizes.processes * k, 1, companion.rows(run)))
portable = {setting: ((launched.result["gradients"][(setting, k)] - single).norm() / single.norm()).item() for setting in SETTINGS}
same_reference = relative_error(single, references[k].gradient)
print(f"portable check at accumulation {k}: " + ", ".join(f"{s} {e:.1e}" for s, e in portable.items()))
print(f"  its one-process gradient against section 1's reference: {same_reference:.1e} (the same numbers)")
for setting, findings in launched.result["probe"].items():
    print(f"checkup on the {setting} trainer:", ", ".join(f"{status} ({how})" for status, how in findings))

# %% tags=["figure"]
companion.plot_errors(run, comparison, tokens, world["backend"])

# %% [markdown]
# ## Recap
#
# * DDP averages the processes' gradients: if each process divides by its own label count, a token of a process
#   with little text weighs more.
# * `average_tokens_across_devices=True` (the default) divides every process by the count of all of them.
# * Check a distributed run against one process with the whole batch, first step, `max_grad_norm=0`.
#
# ## Exercises
#
# Change the launch `spec` of section 1 and run the launch and the comparison again (the starter cells hold the lines).
#
# 1. Give every row the same number of label tokens (`"rows": "biographies"`): which setting matches now?
#    <details><summary>Hint</summary>
#    Section 2's per-process weight equals the batch's when <code>N₀ = N₁</code>.
#    </details>
#
# 2. With `"batch_size": 2` per process, predict the per-process error, then measure it.
#    <details><summary>Hint</summary>
#    Which rows does each process get when batches of two are dealt in turn? How far apart are the two processes'
#    label counts now?
#    </details>
#
# Worked solutions: [`solutions/02b_gradient_accumulation_ddp.ipynb`](solutions/02b_gradient_accumulation_ddp.ipynb).

# %% tags=["exercise"]
equal_rows = {**spec, "rows": "biographies"}
# launched_1 = child.call(run, TARGET, equal_rows, name="exercise-1", processes=sizes.processes, timeout=sizes.child_timeout_s)
# companion.compare(launched_1.result["gradients"], companion.reference_gradients(run, equal_rows), SETTINGS)

# %% tags=["exercise"]
two_per_process = {**spec, "batch_size": 2}
# launched_2 = child.call(run, TARGET, two_per_process, name="exercise-2", processes=sizes.processes, timeout=sizes.child_timeout_s)
# companion.compare(launched_2.result["gradients"], companion.reference_gradients(run, two_per_process), SETTINGS)

# %% [markdown]
# ## Checks
#
# The claims above, asserted on this run's numbers.

# %% jupyter={"source_hidden": true}
runs = {setting: {"comparison": comparison[setting], "by_hand": by_hand[setting],
                  "probe": [status for status, _ in launched.result["probe"][setting]]} for setting in SETTINGS}
numbers = {"backend": world["backend"], "processes": world["processes"], "ran_as": launched.result["ran_as"],
           "label_counts": counts, "window_tokens": tokens, "runs": runs, "same_samples": companion.same_label_tokens(counts, references),
           "portable": portable, "portable_vs_reference": same_reference, "default_across": default}
check(run, numbers)
