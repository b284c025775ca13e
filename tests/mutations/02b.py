"""Lesson 02b: how a run without the bug, or without the fix, changes the numbers, one mutation per check (the part
of the check's name it matches -> a change of the numbers such a run could produce; the comment names the real run it
stands for).

The gpu profile launches 2 processes with a small Llama (about 30M parameters, random init) at accumulation
1, 2, 4, 8: with a GPU per process over NCCL, else (one GPU) as CPU processes over gloo (``child.placed``). Every
trainer is fp32 (``one_step_trainer`` sets ``bf16=False``). Each threshold, argued for those sizes:
- "different numbers of label tokens": batch 1 per process deals every one-word answer to process 0 and every
  biography to process 1 (the rows alternate by construction), at any accumulation count.
- "> 1e-2" (per-process misses, the portable check flags): the per-process weights 1/(W N_p) against 1/sum(N), with
  N_0 = 3 per row and N_1 = 27 to 157: 1.10 to 1.29 on the cpu profile; a wider model changes the directions
  compared, not the 40x weighting.
- "< 1e-4" (by hand, across processes, the portable check passes): float32 sums in another order, and an all-reduce
  (gloo or NCCL) that averages two float32 gradients: 1e-7 here, about 1e-6 on GPUs; two orders of margin.
- "the reference saw as many label tokens": a count, the same at any size.
- the probe's status: read from the config (several processes, average_tokens_across_devices=False), any size.
"""

from mutation_helpers import set_all  # noqa: F401

MUTATIONS = {
    # one-person biographies (exercise 1): every process holds as many label tokens
    "different numbers of label tokens": lambda n: [
        n["label_counts"].update({acc: [[27] * len(c[0])] * len(c)}) for acc, c in list(n["label_counts"].items())
    ],
    # a run without the bug: per-process counts on processes that hold equal text
    "per-process num_items_in_batch misses": lambda n: set_all(
        n["comparison"]["per-process"], "relative_error", 1.4e-7
    ),
    # a distributed run that weighs tokens otherwise (counting across processes): far from the per-process formula
    "by hand": lambda n: n.update(by_hand=n["comparison"]["per-process"][-1]["relative_error"]),
    # a run without the bug: the portable check on the per-process run matches
    "portable check flags": lambda n: n["portable"].update({"per-process": 1.4e-7}),
    # a probe without the multi-process rule: at accumulation 1 it has nothing to measure and skips
    "checkup probe warns": lambda n: n.update(probe=[["skipped", ""]]),
    # a reference over other rows (a shuffled sampler)
    "as many label tokens as the processes together": lambda n: n.update(same_samples=False),
    # a run without the fix: counting across processes no better than per process
    "counts across processes match the big batch": lambda n: [
        a.update(relative_error=p["relative_error"])
        for a, p in zip(n["comparison"]["across processes"], n["comparison"]["per-process"])
    ],
    # a run without the fix: the portable check on the run that counts across processes
    "portable check passes": lambda n: n["portable"].update({"across processes": n["portable"]["per-process"]}),
}


def gpu_shape(numbers: dict, sizes: dict) -> dict:
    """The cpu run's numbers in the gpu profile's shape: the comparison rows and label counts at the gpu accumulation
    counts (a count the cpu run did not measure repeats the largest measured one: its windows twice over)."""
    comparison, counts = numbers["comparison"], numbers["label_counts"]
    largest = max(int(acc) for acc in counts)
    for k in sizes["accumulation"]:
        if str(k) in counts:
            continue
        counts[str(k)] = [(per_rank * (k // largest + 1))[:k] for per_rank in counts[str(largest)]]
        for rows in comparison.values():
            rows.append({**rows[-1], "accumulation": k})
    numbers["processes"] = sizes["processes"]
    return numbers
