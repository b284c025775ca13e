"""Lesson 02b: the other run's numbers for each group, the preconditions both runs share, and how far each
threshold sits from the two runs.

The two runs are the lesson's two settings, launched together on the same rows and weights:
``average_tokens_across_devices=False`` (per-process counts: the bad run) and ``True`` (counts across processes:
the fixed run). Each records the same measurements (``runs[setting]``: its gradient against one process with the
whole batch at every accumulation count, against the per-process objective by hand, and what the check-up's probe
said about its trainer), so ``OTHER_RUN`` swaps one run's record for the other's.

Margins (factors on the log scale), from seeds 0-5 on the cpu profile, one thread:
- "misses the big batch at every count (> 1e-2)": the per-process run's smallest error was 1.10 to 1.29 over
  accumulation 1, 2, 4 (seed 0: 1.10), from weights 1/(W N_p) against 1/sum(N) with N_0 = 3 per row and N_1 = 27 to
  157 per row: a 40x reweighting whatever the seed. The fixed run's largest was 1.1e-7 to 1.6e-7 (float32 sums in
  another order and gloo's average of two float32 gradients), 6e4x to 9e4x under the line. Argued: 10x from its own
  run, 2e4x from the other (within tenfold of where the line sits: loosened tenfold, it fails).
- "by hand (< 1e-4)": the per-process run against the formula, 1.0e-7 to 1.5e-7 (the same float32 rounding); the
  fixed run against the same formula is as far as the two objectives are (0.89 at seed 0). 10x and 2e3x.
- "match the big batch at every count (< 1e-4)": the mirror of the first: 1e-7 own, 1.1 to 1.3 other. 10x and 5e3x.
- "the portable check's one-process gradient is the reference (< 1e-6)": shared (both settings compare with the
  same one-process gradient); 0.0 at every seed (the same computation through two callbacks), and a real failure
  (a callback that read the gradients after they were zeroed) gives 1.0, 1e6x above the line: 10x and 2e5x.

gpu profile: 2 processes with a small Llama (about 30M parameters, random init) at accumulation 1, 2, 4, 8, with a
GPU per process over NCCL, else (one GPU) as CPU processes over gloo (``child.placed``); every trainer is fp32
(``one_step_trainer`` sets ``bf16=False``). ``gpu_shape`` tests the checks' indexing at those counts (one more
comparison row and label-count list per setting), not a GPU's numbers. The thresholds hold there for the reasons
above: the 40x reweighting is the rows', not the model's; fp32 on a GPU with TF32 off (torch's default for matmul)
and an NCCL all-reduce of two fp32 gradients round at about 1e-6, two orders under 1e-4; the probe's status comes
from the config.
"""

from trl_clinic.course.mutations import log, other_run

OTHER_RUN = other_run("per-process", "across processes")

SHARED = {
    "different numbers of label tokens": "both settings train on the same rows, dealt to the processes the same way",
    "as many label tokens as the processes together": "one reference, on the same rows, serves both settings",
    "portable check's one-process gradient": "one one-process gradient, compared with both settings",
}

MUTATIONS = {
    # one-person biographies (exercise 1): every process holds as many label tokens
    "different numbers of label tokens": lambda n: [
        n["label_counts"].update({acc: [[27] * len(c[0])] * len(c)}) for acc, c in list(n["label_counts"].items())
    ],
    # a reference over other rows (a shuffled sampler)
    "as many label tokens as the processes together": lambda n: n.update(same_samples=False),
    # a callback that read the gradients after the optimizer zeroed them: a zero vector
    "portable check's one-process gradient": lambda n: n.update(portable_vs_reference=1.0),
}

MARGINS = {
    "misses the big batch at every count": log(10, 2e4),
    "by hand": log(10, 2e3),
    "match the big batch at every count": log(10, 5e3),
    "portable check's one-process gradient": log(10, 2e5),
}


def gpu_shape(numbers: dict, sizes: dict) -> dict:
    """The cpu run's numbers in the gpu profile's shape: the comparison rows and label counts at the gpu accumulation
    counts (a count the cpu run did not measure repeats the largest measured one: its windows twice over)."""
    counts = numbers["label_counts"]
    largest = max(int(acc) for acc in counts)
    for k in sizes["accumulation"]:
        if str(k) in counts:
            continue
        counts[str(k)] = [(per_rank * (k // largest + 1))[:k] for per_rank in counts[str(largest)]]
        for record in numbers["runs"].values():
            record["comparison"].append({**record["comparison"][-1], "accumulation": k})
    numbers["processes"] = sizes["processes"]
    return numbers
