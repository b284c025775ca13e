# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 02 · Gradient accumulation trains worse than the same batch
#
# Batch 1 × accumulation 32 trained worse than batch 32 on the same samples
# ([TRL #2175](https://github.com/huggingface/trl/issues/2175)). transformers 4.46 fixed it where the token
# count reaches the loss; elsewhere the old arithmetic still runs.
#
# **You will learn**
# * why adding per-micro-batch means reweights tokens;
# * the line that makes the trainer count tokens again;
# * a 13-line check of your own trainer, beside the `checkup` [probe](../README.md#words-the-lessons-use).
#
# **You should know**: `SFTTrainer`'s `gradient_accumulation_steps`; `-100` labels carry no loss.
#
# **Time**: 21 s to run on the cpu [profile](../README.md#words-the-lessons-use); about 25 minutes to work through.
#
# > **Hosted** (Colab, Kaggle, no clone): upload the wheel `uv build` makes, then run `%pip install "./trl_clinic-0.1.0-py3-none-any.whl[course]"` first.

# %% tags=["parameters"]
profile = "auto"  # "auto" (gpu when CUDA is present), "cpu" or "gpu"
seed = 0
output_dir = None  # None: outputs/02_gradient_accumulation_loss at the repository root

# %%
import trl_clinic.course  # first: the lessons' offline mode, and two optional libraries' warnings kept quiet
from trl import SFTConfig, SFTTrainer

from trl_clinic import checkup
from trl_clinic.course import data
from trl_clinic.course.lessons.lesson_02_accumulation import companion
from trl_clinic.course.parameters import start_run
from trl_clinic.course.results import check
from trl_clinic.probes.gradients import cosine, relative_error

run = start_run("02", profile, seed, output_dir)
print(run.describe())
sizes = run.sizes
make_model, tokenizer = companion.vision_language_model_maker(sizes.model_size, seed=run.seed)  # same weights each call
train_set = data.instruction_pairs(sizes.n_train, seed=run.subseed("train"))  # a one-word answer, a biography, ...
steps = companion.FirstStep(run, make_model, tokenizer, train_set)  # SFTTrainers for one step on the first rows, in order

# %% [markdown]
# ## 1. The symptom
#
# Today's `SFTTrainer` on Qwen2.5-VL (the class transformers ships, built small from its config, trained on
# text). The report's two settings from the same weights on the same first N rows, one optimizer step each:
#
# ```python
# SFTConfig(per_device_train_batch_size=N, gradient_accumulation_steps=1,  # batch N
#           max_grad_norm=0, train_sampling_strategy="sequential", max_steps=1)  # nothing clipped, rows in order
# SFTConfig(per_device_train_batch_size=1, gradient_accumulation_steps=N, ...)  # batch 1 x accumulation N
# ```

# %% tags=["symptom"]
N = sizes.accumulation  # the report: batch 1 x accumulation 32 against batch 32
big = steps.trainer(batch_size=N, accumulation=1, logging=True)  # logging: keep the step's log row
accumulated = steps.trainer(batch_size=1, accumulation=N, logging=True)
(big_gradient, big_log), (acc_gradient, acc_log) = map(companion.logged_first_step, (big, accumulated))
print(f"same weights and {N} rows: batch 1 x {N} logs grad_norm {acc_log['grad_norm']:.3f}, batch {N} "
      f"{big_log['grad_norm']:.3f}; the gradients are {relative_error(acc_gradient, big_gradient):.0%} apart "
      f"(cosine {cosine(acc_gradient, big_gradient):.2f})")

# %% [markdown]
# Two batchings of the same rows should differ by rounding only; these do not.
#
# ## 2. Who gets which weight
#
# The loss of one batch is the mean over all its label tokens: each token weighs `1 / Σ nᵢ`, where `nᵢ` is the
# number of label tokens of row *i*. With accumulation the Trainer adds up N micro-batch losses. If each is the
# mean over its own `nᵢ` tokens, divided by N, a token of row *i* weighs `1 / (N · nᵢ)`. The window's first rows:

# %% tags=["mechanism"]
rows = companion.window(accumulated, N)
counts = [companion.label_tokens(batch) for batch in rows]  # labels that are not -100 after the shift by one
for i, n_i in enumerate(counts[:3]):
    print(f"row {i}: n = {n_i:3}   mean of means: 1/({N} x {n_i}) = {1 / (N * n_i):.5f}   "
          f"one batch: 1/{sum(counts)} = {1 / sum(counts):.5f}")

# %% [markdown]
# A short answer's tokens weigh more than in one batch, a long answer's less: accumulated this way, the model
# trains on another objective, which is why the report saw a worse model, not only a noisier one. Are the
# two runs above exactly these two objectives? Both, computed by hand in plain torch on the same N rows:

# %%
by_hand = {name: companion.weighted_token_gradient(make_model(), rows, weights) for name, weights in
           (("mean_of_means", [1 / (N * n_i) for n_i in counts]), ("token_mean", [1 / sum(counts)] * N))}
print(f"batch 1 x {N} vs the mean of per-row means: {relative_error(acc_gradient, by_hand['mean_of_means']):.1e}; "
      f"batch {N} vs the mean over all tokens: {relative_error(big_gradient, by_hand['token_mean']):.1e}")
print(f"{type(big.model).__name__}.accepts_loss_kwargs = {type(big.model).accepts_loss_kwargs}, so "
      f"trainer.model_accepts_loss_kwargs = {big.model_accepts_loss_kwargs}")

# %% [markdown]
# Why this trainer averages per micro-batch: the Trainer counts the window's label tokens and passes the count
# on as `num_items_in_batch` only when the model says it takes loss kwargs (its `accepts_loss_kwargs`, else a
# `**kwargs` in `forward`). Qwen2.5-VL says no, so there is no count: `SFTTrainer` divides each micro-batch's
# summed token loss by its own tokens and the Trainer divides by N (`trainer.py`, `Trainer.__init__` and
# `training_step`; TRL's `sft_trainer.py`, `SFTTrainer.compute_loss`, in the versions printed above). Before
# transformers 4.46 every model took that path.

# %% [markdown] tags=["fix"]
# ## 3. The fix
#
# Tell the Trainer to count. `SFTTrainer` computes the loss itself and divides the summed token loss by
# `num_items_in_batch` when it gets one:
#
# ```diff
#   trainer = SFTTrainer(model=model, args=args, train_dataset=dataset, processing_class=tokenizer)
# + trainer.model_accepts_loss_kwargs = True  # the Trainer counts the window's label tokens
# ```
#
# With a custom `compute_loss`, pass `num_items_in_batch` on (exercise 3). On transformers before 4.46, upgrade
# to 4.48.1 or later: the releases between pass the count to some models only (the deep dive's table).

# %%
fixed = steps.trainer(batch_size=1, accumulation=N, logging=True)
fixed.model_accepts_loss_kwargs = True  # the fix
fixed_gradient, fixed_log = companion.logged_first_step(fixed)
print(f"with the fix, batch 1 x {N} against batch {N}: relative error {relative_error(fixed_gradient, big_gradient):.1e}, "
      f"grad_norm {fixed_log['grad_norm']:.3f}")

# %% [markdown]
# ## 4. What it does to a training run
#
# The report's run: batch 1 × accumulation N for the profile's steps on rows never repeated, from the same
# weights, without and with the fix (with it, batch 1 × N is batch N, as above). Every few steps the Trainer
# evaluates held-out rows in one batch, so the held-out loss is the true mean over their tokens:

# %%
long_run = data.instruction_pairs(N * sizes.train_steps, seed=run.subseed("long run"))  # no row seen twice
held_out = data.instruction_pairs(sizes.n_eval, seed=run.subseed("eval"))


def report_trainer(fix: bool) -> SFTTrainer:
    args = SFTConfig(**run.trainer_kwargs(f"train-fix-{fix}", progress=False), per_device_train_batch_size=1,
                     gradient_accumulation_steps=N, learning_rate=sizes.learning_rate, warmup_steps=0.1,
                     max_steps=sizes.train_steps, train_sampling_strategy="sequential", eval_strategy="steps",
                     eval_steps=sizes.train_steps // 8, per_device_eval_batch_size=len(held_out))
    trainer = SFTTrainer(model=make_model(), args=args, train_dataset=long_run, eval_dataset=held_out,
                         processing_class=tokenizer)
    if fix:
        trainer.model_accepts_loss_kwargs = True  # the fix
    return trainer


curves = {name: companion.held_out_curve(report_trainer(fix)) for name, fix in (("without_fix", False), ("with_fix", True))}
print(f"held-out loss after {sizes.train_steps} steps: without the fix {curves['without_fix']['held_out'][-1]:.3f}, "
      f"with it {curves['with_fix']['held_out'][-1]:.3f}")

# %% tags=["figure"]
figure_path = companion.plot_core(counts, curves, run.output_dir)

# %% [markdown]
# ## 5. Check your own trainer
#
# The first step's gradient of batch b × accumulation k against one batch of b·k, in plain torch and
# transformers. Build both trainers from the same weights with `max_grad_norm=0`, reading rows in order:

# %% tags=["portable-check"]
import torch
from transformers import TrainerCallback


class FirstGradient(TrainerCallback):  # on_optimizer_step: transformers 4.42 or later
    def on_optimizer_step(self, args, state, control, model=None, **kwargs):
        self.gradient = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]).double()
        control.should_training_stop = True


def accumulation_error(make_trainer, batch_size, accumulation):  # make_trainer(batch_size, accumulation) -> trainer
    gradients = []
    for trainer in (make_trainer(batch_size * accumulation, 1), make_trainer(batch_size, accumulation)):
        trainer.add_callback(keep := FirstGradient())
        trainer.train()
        gradients.append(keep.gradient)
    return ((gradients[1] - gradients[0]).norm() / gradients[0].norm()).item()  # float noise when tokens weigh alike


# %% [markdown]
# On the lesson's trainers at the other accumulation counts k, batch 1 × k against batch k:

# %%
sweep = [{"accumulation": k, "without_fix": accumulation_error(steps.trainer, 1, k),
          "with_fix": accumulation_error(lambda b, a: steps.trainer(b, a, fixed=True), 1, k)}
         for k in sizes.accumulation_sweep if k != N]
for row in sweep:
    print(f"1 x {row['accumulation']:>2}: without the fix {row['without_fix']:.2f}, with it {row['with_fix']:.1e}")

# %% [markdown]
# The [check-up](../README.md#words-the-lessons-use)'s `accumulation` probe runs the same test on a few micro-batches, without stepping the optimizer:

# %%
reports = {name: checkup(steps.trainer(1, N, fixed=fix), only=["accumulation"], show=not fix)  # the failing table
           for name, fix in (("without_fix", False), ("with_fix", True))}
probe = {name: [finding.status for finding in report.findings] for name, report in reports.items()}
print("with the fix:", "; ".join(f"{f.status}, relative gradient error {f.value:.2g}" for f in reports["with_fix"].findings))

# %% [markdown]
# ## Recap
#
# * Accumulating per-micro-batch means weighs a token of row *i* by `1 / (N · nᵢ)`; one batch weighs every token
#   `1 / Σ nᵢ`. Short answers count more: another objective, a worse model (section 4's held-out loss).
# * The Trainer fixes it by counting the window's label tokens (`num_items_in_batch`), but only when the model
#   accepts loss kwargs and the loss uses the count.
# * A model that declares no loss kwargs gets the old arithmetic today: `trainer.model_accepts_loss_kwargs = True`
#   under `SFTTrainer`.
# * To check any set-up: the first step's gradient of batch 1 × N against batch N, or
#   `checkup(trainer, only=["accumulation"])`.
#
# ## Exercises
#
# 1. Without the fix, is batch 2 × N/2 closer to batch N than 1 × N? Why?
#    <details><summary>Hint</summary>
#    <code>accumulation_error(steps.trainer, 2, N // 2)</code>; then count the label tokens of a micro-batch of two
#    consecutive rows (<code>companion.window(steps.trainer(2, N // 2), N // 2)</code>).
#    </details>
#
# 2. Give every row the same number of label tokens (one-person biographies, below). What does the check say
#    without the fix, and why?
#    <details><summary>Hint</summary>
#    What are the weights <code>1 / (N · nᵢ)</code> and <code>1 / Σ nᵢ</code> when every <code>nᵢ</code> is equal?
#    </details>
#
# 3. A custom `compute_loss` that drops `num_items_in_batch` (below): run the check on it with the fix, then
#    make it pass the count on.
#    <details><summary>Hint</summary>
#    <code>compute_loss</code> receives <code>num_items_in_batch</code>: hand it to <code>super().compute_loss</code>
#    instead of <code>None</code>.
#    </details>
#
# Worked solutions: [`solutions/02_gradient_accumulation_loss.ipynb`](solutions/02_gradient_accumulation_loss.ipynb).

# %% tags=["exercise"]
# 1. batch 2 x N/2 against batch N, without the fix
two_rows_each = None  # accumulation_error(steps.trainer, 2, N // 2)

# %% tags=["exercise"]
# 2. one-person biographies only (the odd rows): every completion has as many label tokens
biographies = data.instruction_pairs(2 * sizes.n_train, seed=run.subseed("train"), max_people=1).select(
    range(1, 2 * sizes.n_train, 2))
equal_rows = None  # accumulation_error(lambda b, k: steps.trainer(b, k, train_set=biographies), 1, N)


# %% tags=["exercise"]
# 3. a custom loss: the mean over this micro-batch's own label tokens
class MeanPerMicroBatchSFTTrainer(SFTTrainer):
    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        return super().compute_loss(model, inputs, return_outputs=return_outputs, num_items_in_batch=None)


custom = None  # accumulation_error(lambda b, k: steps.trainer(b, k, fixed=True, trainer_class=...), 1, N)

# %% [markdown]
# ## Checks
#
# The claims above, asserted on this run's numbers.

# %% jupyter={"source_hidden": true}
# each run (curves' keys: without_fix, with_fix) against batch N's gradient, the objectives by hand, its curve and checks
runs = {name: {"trainer_counts_tokens": bool(trainer.model_accepts_loss_kwargs), "grad_norm": log["grad_norm"],
               "relative_error": relative_error(gradient, big_gradient), "cosine": cosine(gradient, big_gradient),
               "vs_mean_of_means": relative_error(gradient, by_hand["mean_of_means"]), "held_out": curves[name]["held_out"],
               "held_out_steps": curves[name]["steps"], "sweep": [row[name] for row in sweep], "probe": probe[name]}
        for name, gradient, trainer, log in zip(curves, (acc_gradient, fixed_gradient), (accumulated, fixed), (acc_log, fixed_log))}
numbers = {"model": {"class": type(big.model).__name__, "accepts_loss_kwargs": bool(type(big.model).accepts_loss_kwargs)},
           "accumulation": N, "window_label_tokens": counts, "sweep_accumulation": [row["accumulation"] for row in sweep],
           "big_grad_norm": big_log["grad_norm"], "big_vs_token_mean": relative_error(big_gradient, by_hand["token_mean"]), "runs": runs}
check(run, numbers)
