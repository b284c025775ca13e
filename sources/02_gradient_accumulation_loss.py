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
# ([TRL #2175](https://github.com/huggingface/trl/issues/2175)). transformers 4.46 fixed it for models that take
# loss kwargs; the old arithmetic still runs wherever the token count does not reach the loss.
#
# **You will learn**
# * why adding per-micro-batch means reweights tokens, on three rows you check by hand;
# * the line that makes the trainer count tokens again;
# * a 15-line check of your own trainer, and the `checkup` probe doing the same.
#
# **You should know**: `SFTTrainer` with `gradient_accumulation_steps`; labels of `-100` carry no loss.
#
# **Time**: 21 s to run on the cpu profile; about 25 minutes to work through.
#
# > **Hosted** (Colab, Kaggle, a server without the repository): upload the wheel (`uv build` makes it) and run `%pip install "./trl_clinic-0.1.0-py3-none-any.whl[course]"` in a cell first.

# %% tags=["parameters"]
profile = "auto"  # "auto" (gpu when CUDA is present), "cpu" or "gpu"
seed = 0
output_dir = None  # None: outputs/02_gradient_accumulation_loss at the repository root

# %%
from trl import SFTTrainer

from trl_clinic import checkup
from trl_clinic.course import data
from trl_clinic.course.companions import lesson_02_accumulation as companion
from trl_clinic.course.parameters import start_run
from trl_clinic.course.results import conclude, measured, save_metrics
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
# text). The report's two settings from the same weights on the same first N rows: one batch of N, and batch 1 ×
# accumulation N. One optimizer step each, nothing clipped (`max_grad_norm=0`); the Trainer prints its log line.

# %% tags=["symptom"]
N = sizes.accumulation  # the report: batch 1 x accumulation 32 against batch 32
big = steps.trainer(batch_size=N, accumulation=1, logging=True)          # per_device_train_batch_size=N
accumulated = steps.trainer(batch_size=1, accumulation=N, logging=True)  # gradient_accumulation_steps=N
(big_gradient, big_log), (acc_gradient, acc_log) = companion.logged_first_step(big), companion.logged_first_step(accumulated)
symptom = {"relative_error": relative_error(acc_gradient, big_gradient), "cosine": cosine(acc_gradient, big_gradient),
           "grad_norm": {"big": big_log["grad_norm"], "accumulated": acc_log["grad_norm"]}}
print(f"same weights, same {N} rows: batch 1 x {N} logs grad_norm {acc_log['grad_norm']:.3f}, batch {N} "
      f"{big_log['grad_norm']:.3f}; the gradients are {symptom['relative_error']:.0%} apart (cosine {symptom['cosine']:.2f})")

# %% [markdown]
# Two batchings of the same rows should differ by float rounding only; these do not.
#
# ## 2. Who gets which weight
#
# The loss of one batch is the mean over all its label tokens: each token weighs `1 / Σ nᵢ`, where `nᵢ` is the
# number of label tokens of row *i*. With accumulation the Trainer adds up N micro-batch losses. If each is the
# mean over its own `nᵢ` tokens, divided by N, a token of row *i* weighs `1 / (N · nᵢ)`. The first three rows:

# %% tags=["mechanism"]
three = companion.window(steps.trainer(1, 3), 3)
n = [companion.label_tokens(batch) for batch in three]  # labels that are not -100 after the shift by one
for i, n_i in enumerate(n):
    print(f"row {i}: n = {n_i:3}   mean of means: 1/(3 x {n_i}) = {1 / (3 * n_i):.4f}   "
          f"one batch: 1/{sum(n)} = {1 / sum(n):.4f}")

# %% [markdown]
# A short answer's tokens weigh more than in one batch, a long answer's less: accumulated this way, the model
# trains on another objective, which is why the report saw a worse model and not only a noisier one. Are the
# two runs above exactly these two objectives? Both, computed by hand in plain torch on the same N rows:

# %%
rows = companion.window(accumulated, N)
counts = [companion.label_tokens(batch) for batch in rows]
mean_of_means = companion.weighted_token_gradient(make_model(), rows, [1 / (N * n_i) for n_i in counts])
token_mean = companion.weighted_token_gradient(make_model(), rows, [1 / sum(counts)] * N)
mechanism = {"accumulated_vs_mean_of_means": relative_error(acc_gradient, mean_of_means),
             "big_vs_token_mean": relative_error(big_gradient, token_mean)}
print(f"batch 1 x {N} vs the mean of per-row means: {mechanism['accumulated_vs_mean_of_means']:.1e}; "
      f"batch {N} vs the mean over all tokens: {mechanism['big_vs_token_mean']:.1e}")
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
# With a custom `compute_loss`, pass `num_items_in_batch` on (exercise 3); on transformers before 4.46, upgrade.

# %%
fixed = steps.trainer(batch_size=1, accumulation=N, logging=True)
fixed.model_accepts_loss_kwargs = True  # the fix
fixed_gradient, fixed_log = companion.logged_first_step(fixed)
fix = {"relative_error": relative_error(fixed_gradient, big_gradient), "grad_norm": fixed_log["grad_norm"]}
print(f"with the fix, batch 1 x {N} against batch {N}: relative error {fix['relative_error']:.1e}")

# %% [markdown]
# ## 4. Check your own trainer
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
# On the lesson's trainers, and the check-up's `accumulation` probe, which runs the same test on a few
# micro-batches without stepping your optimizer:

# %%
portable = {"without_fix": accumulation_error(steps.trainer, 1, N),
            "with_fix": accumulation_error(lambda b, k: steps.trainer(b, k, fixed=True), 1, N)}
print(f"portable check at 1 x {N}: without the fix {portable['without_fix']:.2f}, with it {portable['with_fix']:.1e}")
probe = {name: [finding.status for finding in checkup(steps.trainer(1, N, fixed=fixed), only=["accumulation"]).findings]
         for name, fixed in (("without_fix", False), ("with_fix", True))}

# %% [markdown]
# ## 5. At every accumulation count
#
# The weight of one token in each of the window's N rows, and the first step's error at every k up to N:

# %% tags=["figure"]
measured_at_n = {N: {"without_fix": symptom["relative_error"], "with_fix": fix["relative_error"]}}
sweep = companion.error_by_accumulation(steps, sizes.accumulation_sweep, known=measured_at_n)
figure_path = companion.plot_core(counts, sweep, run.output_dir)

# %% [markdown]
# ## Recap
#
# * Accumulating per-micro-batch means weighs a token of row *i* by `1 / (N · nᵢ)`; one batch weighs every token
#   `1 / Σ nᵢ`. Short answers count more: another objective, a worse model.
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
# The claims above, asserted on this run's numbers and written to `metrics.json`.

# %% jupyter={"source_hidden": true} tags=["checks"]
def bad_checks(n: dict) -> dict:
    """Without the fix: the symptom, its mechanism by hand, the portable check and the probe flag it."""
    symptom, by_hand, sweep = n["symptom"], n["mechanism"], n["sweep"]
    return {
        "the model declares no loss kwargs and the Trainer counts no tokens for it":
            measured(not n["model"]["accepts_loss_kwargs"] and not n["model"]["trainer_counts_tokens"]),
        "batch 1 x N misses batch N's gradient (relative error > 1e-2)": measured(symptom["relative_error"] > 1e-2),
        "batch 1 x N's gradient points elsewhere (cosine < 0.99)": measured(symptom["cosine"] < 0.99),
        "batch 1 x N's gradient is the mean of per-row means by hand (< 1e-4)":
            measured(by_hand["accumulated_vs_mean_of_means"] < 1e-4),
        "the portable check flags the trainer without the fix (> 1e-2)": measured(n["portable"]["without_fix"] > 1e-2),
        "the checkup probe fails the trainer without the fix": measured("fail" in n["probe"]["without_fix"]),
        "without the fix the gradient misses at every accumulation count (> 1e-2)":
            measured(min(row["without_fix"] for row in sweep) > 1e-2),
    }


# %% jupyter={"source_hidden": true} tags=["checks"]
def good_checks(n: dict) -> dict:
    """With the fix: batch 1 x N is batch N, and the portable check and the probe say so."""
    by_hand, sweep, grad_norms = n["mechanism"], n["sweep"], n["symptom"]["grad_norm"]
    return {
        "batch N's gradient is the mean over all label tokens by hand (< 1e-4)": measured(by_hand["big_vs_token_mean"] < 1e-4),
        "with the fix batch 1 x N matches batch N (< 1e-4)": measured(n["fix"]["relative_error"] < 1e-4),
        "with the fix the logged grad_norm is batch N's (within 1e-4)":
            measured(abs(n["fix"]["grad_norm"] / grad_norms["big"] - 1) < 1e-4),
        "the portable check passes the trainer with the fix (< 1e-4)": measured(n["portable"]["with_fix"] < 1e-4),
        "the checkup probe passes the trainer with the fix": measured(n["probe"]["with_fix"] == ["ok"]),
        "with the fix the gradient matches at every accumulation count (< 1e-4)":
            measured(max(row["with_fix"] for row in sweep) < 1e-4),
    }


def checks(n: dict) -> tuple[dict, dict]:
    """The claims above as functions of the numbers alone (a test feeds them runs without the bug or the fix)."""
    return bad_checks(n), good_checks(n)


# %% jupyter={"source_hidden": true}
numbers = {"model": {"class": type(big.model).__name__, "accepts_loss_kwargs": bool(type(big.model).accepts_loss_kwargs),
                     "trainer_counts_tokens": bool(big.model_accepts_loss_kwargs)},
           "accumulation": N, "three_rows_label_tokens": n, "window_label_tokens": counts, "symptom": symptom,
           "mechanism": mechanism, "fix": fix, "portable": portable, "probe": probe, "sweep": sweep}
weights = max(counts) / min(counts)
summary = (f"Today's SFTTrainer on {numbers['model']['class']} (it declares no loss kwargs): batch 1 x {N} missed "
           f"batch {N}'s gradient by {symptom['relative_error']:.0%} (cosine {symptom['cosine']:.2f}), exactly the mean of "
           f"per-row means, which weighs a short answer's tokens {weights:.0f}x a long one's; with "
           f"trainer.model_accepts_loss_kwargs = True it matched to {fix['relative_error']:.0e}.")
metrics = save_metrics(run, "02", numbers, checks, summary=summary)
conclude(metrics, run.output_dir)
