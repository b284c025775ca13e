"""Lesson 02: how a run without the bug, or without the fix, changes the numbers, one mutation per check
(the part of the check's name it matches -> a change of the numbers such a run could produce)."""

import math  # noqa: F401

from mutation_helpers import set_all  # noqa: F401


MUTATIONS = {
    "first step: batch 1 x N on the old normalisation misses": lambda n: n["first_step"].update(old_vs_big=1e-7),
    "old normalisation misses the big-batch gradient at every count": lambda n: set_all(n["sweep"]["old"],
                                                                                        "relative_error", 1e-7),
    "custom mean-per-micro-batch loss misses": lambda n: set_all(n["sweep"]["custom"], "relative_error", 1e-7),
    "custom loss has the old path's direction": lambda n: [r.update(cosine=r["cosine"] - 0.05)
                                                           for r in n["sweep"]["custom"]],
    "custom loss error grows": lambda n: n["sweep"].update(custom=n["sweep"]["custom"][::-1]),
    "custom loss gradient is N times the old path's": lambda n: n["first_step"].update(custom_vs_n_old=0.3),
    "reports N times the old path's training loss": lambda n: [
        c.update(reported_loss=o["reported_loss"]) for c, o in zip(n["sweep"]["custom"], n["sweep"]["old"])],
    "declared loss_is_scaled_for_ga=False": lambda n: n["declared_vs_old"].update(relative_error=0.5),
    "packed rows hold more even label counts": lambda n: n["label_spread"]["packed"].update(
        coefficient_of_variation=n["label_spread"]["padded"]["coefficient_of_variation"]),
    "packing shrinks the old normalisation's gradient error": lambda n: n["packed"].update(
        old=n["first_step"]["old_vs_big"]),
    "logs another training loss than the big batch": lambda n: n["train_loss_gap"].update(old=1e-5),
    "higher held-out loss": lambda n: n["held_out_loss"]["old"].update(
        all=n["held_out_loss"]["big batch"]["all"] - 0.1),
    "favours short answers": lambda n: n["held_out_short_long_ratio"].update(
        old=n["held_out_short_long_ratio"]["big batch"] + 0.1),
    "num_items_in_batch matches the big batch (relative": lambda n: set_all(n["sweep"]["today"],
                                                                           "relative_error", 0.5),
    "matches the big batch on packed rows": lambda n: n["packed"].update(today=0.5),
    "logs the big batch's training loss at every step": lambda n: n["train_loss_gap"].update(today=0.1),
    "ends with the big batch's held-out loss": lambda n: n["held_out_loss"]["today"].update(
        all=n["held_out_loss"]["big batch"]["all"] + 0.1),
    "gradient is the mean of per-micro-batch means": lambda n: n["then"]["paths"]["sft_trainer"].update(
        vs_mean_of_means=0.3),
    "it misses the full-batch gradient": lambda n: n["then"]["paths"]["sft_trainer"].update(vs_full_batch=1e-7),
    "re-creation gives the real 4.45.2 gradient": lambda n: n["then"]["recreation_vs_era"].update(relative_error=0.1),
}
