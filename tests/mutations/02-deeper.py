"""Lesson 02's deep dive: how a run without the bug, or without the fix, changes the numbers, one mutation per check
(the part of the check's name it matches, or a tuple of parts where one real change breaks several -> a change of the
numbers such a run could produce; the comment names the real run it stands for).

The gpu profile uses SmolLM2-135M-Instruct (real weights, its own tokenizer), a sweep at k = 2, 8, 32, 64,
packed rows of 512 tokens, 100 training steps of batch 1 x 32 (3200 rows) at learning rate 1e-4, and runs the era on
the CPU with the same SmolLM2 weights (the era is CPU-only). Every one-step gradient is taken in fp32 (``FirstStep``
sets ``bf16=False``); the three training runs use the profile's bf16 autocast. Each threshold, argued for those sizes:
- era "< 1e-5" and "> 1e-2": the era runs on the CPU in fp32 with either model; 1.2e-7 on the cpu profile, and the
  full-batch miss is the weighting's (1.03), not the model's.
- sweep "> 1e-2" / "< 1e-4", "cosine < 0.99", custom "k times ... < 1e-5", declared "< 1e-5": fp32 first steps, as in
  the core (two float32 sums in another order: 1e-7 here, about 1e-6 on a GPU); the custom path is the old one scaled
  by k in the Trainer's arithmetic, bit for bit on the CPU (0.0) and within rounding on a GPU.
- "custom loss error grows": |k g_old - g| / |g| grows with k while |g_old| does not shrink as 1/k (1.29 to 1.03 over
  2..32 on the cpu profile): the same at 64.
- "packed ... spread at most half", "shrinks ... at least fourfold", "no sample was cut": SmolLM2's tokenizer spends
  more tokens on these rows than the clinic's (the packing length doubles to 512 for that), the rows are the same
  kind (a one-word answer, then one to six biographies); the spread was 0.12 against 1.15 on the cpu profile at
  seed 0, the shrink 8x there, the smallest of seeds 0-5 (8x to 380x): the fourfold threshold keeps a factor two.
  "no sample was cut" is the guard: it fails loudly if 512 is too short for SmolLM2's longest row.
- curves: the "today" checks compare two bf16 runs of the same computation (within 1e-3: they were 1e-6 in fp32; bf16
  autocast rounds the big batch's matmuls and the micro-batches' differently, about 1e-3 relative on one step, and 100
  steps can add up: this is the threshold most at risk on a GPU, kept until a GPU run measures it). The "old" checks
  (a gap > 1e-2, a higher held-out loss, a lower short/long ratio) rest on the 52x reweighting, which fine-tuning a
  pretrained model for 100 steps at 1e-4 still applies to every step.
"""

from mutation_helpers import set_all  # noqa: F401

MUTATIONS = {
    # transformers 4.46 or later in the era: SFTTrainer's gradient is the full batch's, not the mean of means
    ("mean of per-micro-batch means", "misses the full-batch gradient"): lambda n: n["then"]["paths"][
        "sft_trainer"
    ].update(vs_mean_of_means=n["then"]["paths"]["sft_trainer"]["vs_full_batch"], vs_full_batch=1.2e-7),
    # a re-creation that matched 4.46.0's undivided path instead: k times the old gradient
    "re-creation gives the real 4.45.2": lambda n: n["then"]["recreation_vs_era"].update(relative_error=31.0),
    # a run without the bug: the old arithmetic on rows with equal label counts (exercise 2 of the core)
    "old arithmetic misses the big-batch gradient": lambda n: set_all(n["sweep"]["old"], "relative_error", 1.4e-7),
    # a run without the bug: the big batch's direction
    "old arithmetic points another way": lambda n: set_all(n["sweep"]["old"], "cosine", 1.0),
    # a custom loss that passes the count on: float noise at every k (1.4e-7), which does not grow with k either
    ("custom mean-per-micro-batch loss misses", "custom loss error grows"): lambda n: set_all(
        n["sweep"]["custom"], "relative_error", 1.4e-7
    ),
    # a custom loss that the Trainer divides (loss_is_scaled_for_ga=False): the old gradient, not k times it
    "custom loss gradient is k times": lambda n: set_all(n["sweep"]["custom"], "vs_count_times_old", 0.97),
    # the same divided custom loss: its errors are the old path's, which shrink with k (1.29 to 1.03)
    "custom loss error grows": lambda n: [
        c.update(relative_error=o["relative_error"]) for c, o in zip(n["sweep"]["custom"], n["sweep"]["old"])
    ],
    # the same divided custom loss: it reports the old path's loss
    "reports k times the old path's training loss": lambda n: [
        c.update(reported_loss=o["reported_loss"]) for c, o in zip(n["sweep"]["custom"], n["sweep"]["old"])
    ],
    # a Trainer before 5.19 ignores the declaration: the undeclared custom run, k times the old gradient
    "declared loss_is_scaled_for_ga=False": lambda n: n["declared_vs_old"].update(relative_error=31.0),
    # rows packed no more evenly than single samples (a packing length of one sample)
    "packed rows hold more even label counts": lambda n: n["label_spread"]["packed"].update(
        coefficient_of_variation=n["label_spread"]["padded"]["coefficient_of_variation"]
    ),
    # the same: the old arithmetic on packed rows as far off as on single samples
    "packing shrinks the old arithmetic's gradient error": lambda n: n["packed"].update(old=n["old_at_n"]),
    # a run without the bug: the old run logs the big batch's loss (today's gap)
    "logs another training loss than the big batch": lambda n: n["train_loss_gap"].update(
        old=n["train_loss_gap"]["today"]
    ),
    # a run without the bug: the old run ends at the big batch's held-out loss
    "higher held-out loss": lambda n: n["held_out_loss"]["old"].update(all=n["held_out_loss"]["big batch"]["all"]),
    # a run without the bug: the big batch's short/long ratio
    "favours short answers": lambda n: n["held_out_short_long_ratio"].update(
        old=n["held_out_short_long_ratio"]["big batch"]
    ),
    # a run without the fix: today's path took the old arithmetic (a model without loss kwargs, as in the core)
    "num_items_in_batch matches the big batch at every count": lambda n: [
        t.update(relative_error=o["relative_error"]) for t, o in zip(n["sweep"]["today"], n["sweep"]["old"])
    ],
    # packed rows of 128 tokens, where the longest samples are cut
    "no sample was cut": lambda n: n["label_spread"].update(packing_length=128),
    # a run without the fix: the old arithmetic on packed rows
    "matches the big batch on packed rows": lambda n: n["packed"].update(today=n["packed"]["old"]),
    # a run without the fix: the old run's logged losses
    "logs the big batch's training loss at every step": lambda n: n["train_loss_gap"].update(
        today=n["train_loss_gap"]["old"]
    ),
    # a run without the fix: the old run's held-out loss
    "ends with the big batch's held-out loss": lambda n: n["held_out_loss"]["today"].update(
        all=n["held_out_loss"]["old"]["all"]
    ),
}


def gpu_shape(numbers: dict, sizes: dict) -> dict:
    """The cpu run's numbers in the gpu profile's shape: the sweep at the gpu counts (a count the cpu run did not
    measure takes the largest measured row, with the custom path's loss and error scaled by k as its arithmetic
    does), the gpu packing length, the gpu step count."""
    sweep = numbers["sweep"]
    last = {path: rows[-1] for path, rows in sweep.items()}
    measured = {row["accumulation"] for row in sweep["today"]}
    for k in sizes["accumulation_sweep"]:
        if k in measured:
            continue
        scale = k / last["custom"]["accumulation"]
        for path, rows in sweep.items():
            row = {**last[path], "accumulation": k}
            if path == "custom":
                row.update(reported_loss=row["reported_loss"] * scale, relative_error=row["relative_error"] * scale)
            rows.append(row)
    for rows in sweep.values():
        rows.sort(key=lambda row: row["accumulation"])
    numbers["label_spread"]["packing_length"] = sizes["packing_length"]
    numbers.update(curve_steps=sizes["curve_steps"], curve_accumulation=sizes["curve_accumulation"])
    return numbers
