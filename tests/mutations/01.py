"""Lesson 01: how a run without the bug, or without the fix, changes the numbers, one mutation per check
(the part of the check's name it matches -> a change of the numbers such a run could produce)."""

import math  # noqa: F401

from mutation_helpers import set_all  # noqa: F401


def _01_reverse_first(n):
    first = next(iter(n["loss_ratio"]))
    n["loss_ratio"][first] = n["loss_ratio"][first][::-1]


MUTATIONS = {
    "symptom: padding-free with the all-ones mask": lambda n: n["symptom"]["contaminated"].update(
        loss=n["symptom"]["padded"]["loss"]),
    "grows with batch size in every setting": _01_reverse_first,
    "contaminated grad norm at step 1": lambda n: n["training"]["contaminated"]["grad_norm"].__setitem__(
        0, n["training"]["padded"]["grad_norm"][0]),
    "logs a higher loss than padded to the end": lambda n: n["training"]["contaminated"].update(
        final_loss=n["training"]["padded"]["final_loss"]),
    "remedies short of separation": lambda n: n["remedies"]["more warmup"].update(isolated=True),
    "a smaller batch hides": lambda n: n["remedies"]["smaller batch"].update(
        loss=n["remedies"]["smaller batch"]["baseline"]["loss"] + 0.1),
    "fixed follows padded step by step": lambda n: n.update(fixed_vs_padded_training=0.05),
    "separating the sequences cures it": lambda n: n["remedies"]["separate the sequences"].update(isolated=False),
    "(> 1.1) in every setting": lambda n: n["loss_ratio"][next(iter(n["loss_ratio"]))].__setitem__(-1, 1.0),
    "where it hurts most": lambda n: [r.__setitem__(-1, 1.2) for r in n["loss_ratio"].values()],
    "no difference at batch 1": lambda n: [r.__setitem__(0, 1.01) for r in n["loss_ratio"].values()],
    "grad norm at batch": lambda n: [r.__setitem__(-1, 1.0) for r in n["grad_norm_ratio"].values()],
    "probe flags an all-ones mask": lambda n: n["probes"]["llama, position_ids + all-ones mask"].update(isolated=True),
    "probe flags a packed row run with use_cache=True": lambda n: n["probes"][
        "llama, position_ids + use_cache=True"].update(isolated=True),
    "probe flags OPT, Falcon, Bloom and MPT": lambda n: n["family_probes"]["bloom"].update(isolated=True),
    "changes OPT's loss": lambda n: n.update(opt_gap=0.0),
    "ignored for a model instance": lambda n: n.update(attention_model_instance="eager"),
    "fixed equals padded": lambda n: n.update(fixed_vs_padded_max_relative=0.1),
    "probe finds Llama isolated": lambda n: n["probes"]["llama, position_ids only"].update(isolated=False),
    "Llama and Qwen2 isolated at random init": lambda n: n["family_probes"]["qwen2"].update(isolated=False),
    "applies for a model path": lambda n: n.update(attention_model_path="sdpa"),
    "no pad tokens": lambda n: n["throughput"]["padding_free"].update(padding_share=0.2),
    "real collator's packed batch is contaminated": lambda n: [
        rows.update({"train, the era's collator batch": 0.0}) for rows in n["then"]["01-trl-0.14"]["differences"].values()],
    "padding-free/padded loss ratio is 1 at batch 1, then grows": lambda n: n["then"]["01-trl-0.14"].update(
        loss_ratio_by_batch_size={"1": 1.0, "4": 1.0, "16": 1.0}),
    "contaminated in train mode with the config's cache": lambda n: [
        rows.update({"train, config use_cache=True, no mask": 0.0})
        for rows in n["then"]["01-transformers-4.55"]["differences"].values()],
    "sends the all-ones mask that the re-creation adds": lambda n: n["then"]["01-transformers-4.55"].update(
        collator_mask_all_ones=False),
    "use_cache=False keeps packed sequences apart": lambda n: [
        rows.update({"train, use_cache=False, no mask": 0.5})
        for rows in n["then"]["01-transformers-4.55"]["differences"].values()],
}
