"""Lesson 02 (core): how a run without the bug, or without the fix, changes the numbers, one mutation per check
(the part of the check's name it matches -> a change of the numbers such a run could produce; the comment names
the real run it stands for).

The gpu profile builds the same Qwen2.5-VL class at the "small" shape (about 26M parameters, random init),
with the same clinic tokenizer and rows (so the same label counts, 3 to 157 a row), the same N = 32, a sweep that adds
k = 64 (128 rows), and every one-step trainer in fp32 (``FirstStep`` sets ``bf16=False`` on every profile: under bf16
autocast a big batch and its micro-batches round differently). Each threshold, argued for those sizes:
- "> 1e-2" (misses, at every count; the portable check flags): the error comes from the token weights 1/(k n_i)
  against 1/sum(n), a 52x spread in these rows whatever the model; on the cpu profile it was 1.16 to 1.56 at
  k = 2..32. A wider model changes how far apart the two weighted sums point, not that they differ: two orders of
  magnitude of margin.
- "cosine < 0.99": 0.51 at seed 0 on the cpu profile (0.46 to 0.56 over the deep dive's Llama sweep); the two
  objectives weigh the 3-token answers 15x up and the long biographies 2x down, far from a rescaling.
- "< 1e-4" (by hand, with the fix, the portable check, at every count): two float32 sums of the same terms in another
  order. The cpu profile gives 1.4e-7 to 1.9e-7. On a GPU, fp32 matmuls stay fp32 (torch's default
  ``allow_tf32=False`` for matmul; nothing here turns TF32 on) and the sdpa kernels in fp32 differ from the CPU by
  about 1e-6 relative; summing 32 or 64 micro-batches adds the same order. 1e-4 leaves two orders, and sits four
  orders below the bug's 1.
- "grad_norm ... within 1e-4": the same float32 sums, read through the Trainer's norm.
- the probe's statuses and the model's declaration: names, not magnitudes; the probe runs 1 x 4 against 4 x 1 in
  float32 with its own 1e-3 tolerance at any size.
"""

from mutation_helpers import cycled, set_all

MUTATIONS = {
    # a model class that takes loss kwargs (a Llama, the deep dive): the Trainer counts the window's tokens
    "declares no loss kwargs": lambda n: n["model"].update(accepts_loss_kwargs=True, trainer_counts_tokens=True),
    # a run without the bug: batch 1 x N's gradient is batch N's (the fixed run's error)
    "misses batch N's gradient": lambda n: n["symptom"].update(relative_error=n["fix"]["relative_error"]),
    # a run without the bug: the same direction
    "points elsewhere": lambda n: n["symptom"].update(cosine=1.0),
    # a run without the bug: batch 1 x N is the token mean, as far from the mean of means as the old path from batch N
    "mean of per-row means by hand": lambda n: n["mechanism"].update(
        accumulated_vs_mean_of_means=n["symptom"]["relative_error"]
    ),
    # a run without the bug: the portable check on a trainer that counts
    "portable check flags": lambda n: n["portable"].update(without_fix=n["portable"]["with_fix"]),
    # a run without the bug: the probe's verdict on a trainer that counts
    "probe fails the trainer without the fix": lambda n: n["probe"].update(without_fix=["ok"]),
    # a run without the bug: every count matches
    "misses at every accumulation count": lambda n: set_all(n["sweep"], "without_fix", 1.5e-7),
    # a big batch whose loss is itself a mean of per-row means (a model that averages per sequence)
    "mean over all label tokens by hand": lambda n: n["mechanism"].update(
        big_vs_token_mean=n["symptom"]["relative_error"]
    ),
    # a run without the fix: the unfixed trainer's error
    "with the fix batch 1 x N matches": lambda n: n["fix"].update(relative_error=n["symptom"]["relative_error"]),
    # a run without the fix: the unfixed trainer's logged grad_norm
    "logged grad_norm is batch N's": lambda n: n["fix"].update(grad_norm=n["symptom"]["grad_norm"]["accumulated"]),
    # a run without the fix: the portable check on the unfixed trainer
    "portable check passes": lambda n: n["portable"].update(with_fix=n["portable"]["without_fix"]),
    # a run without the fix: the probe on the unfixed trainer
    "probe passes the trainer with the fix": lambda n: n["probe"].update(with_fix=["fail"]),
    # a run without the fix: the unfixed errors at every count
    "matches at every accumulation count": lambda n: [row.update(with_fix=row["without_fix"]) for row in n["sweep"]],
}


def gpu_shape(numbers: dict, sizes: dict) -> dict:
    """The cpu run's numbers in the gpu profile's shape: the sweep at the gpu counts (a count the cpu run did not
    measure takes the nearest measured row, as the error barely moves with k: 1.16 to 1.56 over 2..32), the window of
    ``sizes["accumulation"]`` rows (the same rows: the window's label counts repeat when it is longer)."""
    measured = {row["accumulation"]: row for row in numbers["sweep"]}
    numbers["sweep"] = [
        {**measured[min(measured, key=lambda m: abs(m - k))], "accumulation": k} for k in sizes["accumulation_sweep"]
    ]
    window = numbers["window_label_tokens"]
    numbers["window_label_tokens"] = cycled(window, sizes["accumulation"])
    numbers["accumulation"] = sizes["accumulation"]
    return numbers
