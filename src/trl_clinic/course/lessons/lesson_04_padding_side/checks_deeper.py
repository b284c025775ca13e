"""Lesson 04 deep dive's checks: the claims of the deep dive, asserted on the numbers its last cell records
(``check(run, numbers)``).

They see nothing but those numbers (as metrics.json stores them), so tests/test_checks_can_fail.py can hand them the
other run's numbers and see each one fail; ``summary`` is the sentence the workbook's report shows, written from the
same numbers.
"""

import math

from trl_clinic.course.results import above, below, measured, recreated

PAST = ("missing_flash_kernel", "finished")  # past the check: the flash kernel call this CPU lacks, or nothing


def window_checks(n: dict) -> tuple[dict, dict]:
    """The direct forwards of both windows (the model told it is FlashAttention-2: re-created; absent when an era
    did not run): right-padded with the cache, against the same forward without it and left-padded."""
    symptom, fix = {}, {}
    for era, function in (("4.40", "forward"), ("4.51", "_update_causal_mask")):
        record = n["then"][era]
        if record["status"] != "finished":
            continue
        bad, fixed = n["runs"]["without_fix"]["direct"][era], n["runs"]["with_fix"]["direct"][era]
        on = f"on transformers {record['transformers']}"
        symptom[f"{on}, a right-padded forward with the cache raises it from Qwen2Model.{function}"] = recreated(
            bad["cache"]["verdict"] == "guard"
            and bad["cache"]["function"] == function
            and record["guard_function"] == f"Qwen2Model.{function}"
        )
        fix[f"{on}, use_cache=False gets the right-padded forward past the check"] = recreated(
            fixed["cache"]["verdict"] in PAST
        )
        fix[f"{on}, left padding gets the forward with the cache past the check"] = recreated(
            fixed["side"]["verdict"] in PAST
        )
    return symptom, fix


def era_checks(n: dict) -> tuple[dict, dict]:
    """The DPOTrainers of both windows and the families with the check (absent when an era did not run)."""
    (symptom, fix), bad, fixed = window_checks(n), n["runs"]["without_fix"], n["runs"]["with_fix"]
    first, report = n["then"]["4.40"], n["then"]["4.51"]
    if first["status"] == "finished":
        fix[
            f"on TRL {first['trl']}, DPOTrainer.evaluate() gets past the check (its forward passes use_cache=False)"
        ] = recreated(fixed["dpo"]["4.40"]["verdict"] in PAST)
    if report["status"] == "finished":
        fix[f"on TRL {report['trl']}, DPOConfig(padding_free=True) gets evaluate() past the check"] = recreated(
            fixed["dpo"]["4.51"]["verdict"] in PAST
        )
        symptom[f"on transformers {report['transformers']}, the check sits in Qwen2 and other families"] = measured(
            "qwen2" in bad["families"] and len(bad["families"]) > 1
        )
        counts = [bad["dpo_cache"][m] for m in ("policy", "reference")]
        symptom[
            f"on TRL {report['trl']}, DPO evaluation of a plain Qwen2 builds a KV cache for every right-padded "
            "row, passed no use_cache"
        ] = measured(
            all(
                c["right_padded"]
                and c["right_padded_with_cache"] == c["right_padded"]
                and set(c["asked"]) == {"use_cache=not passed"}
                for c in counts
            )
        )
    return symptom, fix


def today_checks(n: dict) -> tuple[dict, dict]:
    """Today's DPO forwards and transformers, scoring without a cache, and cached generation."""
    bad, fixed = n["runs"]["without_fix"], n["runs"]["with_fix"]
    sh = bad["shorter"]
    moved = sh["min_shift_padded"] / max(sh["max_shift_unpadded"], 1e-12) if sh["changed_unpadded"] == 0 else math.nan
    today = [fixed["dpo_cache"][m] for m in ("policy", "reference")]
    return {
        "without position_ids, GPT-2's left-padded log-probs move (> 1e-2 nats)": measured(
            above(bad["scoring"]["gpt2"], 1e-2)
        ),
        "right-padded batched generation differs from unbatched": measured(above(bad["changed"], 0.5)),
        "only the rows shorter than the longest prompt move (over 1000x the "
        "unpadded rows' first-token shift)": measured(above(moved, 1e3)),
    }, {
        "today's transformers has the check in no model family": measured(fixed["families"] == []),
        "today's DPO evaluation at eval batch 1: right-padded forwards of policy and reference, none with a cache, "
        "each given use_cache=False by _compute_loss and again by the fused head": measured(
            all(
                c["right_padded"]
                and c["right_padded_with_cache"] == 0
                and set(c["asked"])
                == {
                    "use_cache=False from dpo_trainer.py:_compute_loss",
                    "backbone_use_cache=False from utils.py:_fused_forward",
                }
                for c in today
            )
        ),
        "with positions from the mask, left and right padding score within 1e-3 nats of one at a time (fp32, Qwen2 "
        "and GPT-2)": measured(below(max(fixed["scoring"].values()), 1e-3)),
        "left-padded batched generation equals unbatched": measured(below(fixed["changed"], 0.5)),
    }


def sft_checks(n: dict) -> tuple[dict, dict]:
    """The tangent: today's SFT evaluation at eval batch 2 (padded) and 1 (not)."""
    padded, alone = n["runs"]["without_fix"]["sft"], n["runs"]["with_fix"]["sft"]
    rows = [padded, alone]
    miss = max(n["sft_eval_gap"].values())
    return {
        "SFT evaluation at eval batch 2 pads every batch on the right and hands attention the padding mask": measured(
            bool(padded["forwards"]) and padded["right_padded"] == padded["mask_to_attention"] == padded["forwards"]
        ),
        "SFT eval loss moves with the eval batch size (over 100x the prediction's miss)": measured(
            above(abs(padded["eval_loss"] - alone["eval_loss"]) / max(miss, 1e-12), 100)
        ),
        "today's SFTTrainer builds no cache in evaluation, at eval batch 1 and 2": measured(
            all(row["cache_built"] == 0 for row in rows)
        ),
    }, {
        "SFT evaluation at eval batch 1 pads nothing and hands attention no mask": measured(
            bool(alone["forwards"]) and alone["right_padded"] == alone["mask_to_attention"] == 0
        ),
        "SFT eval loss matches its prediction from rows scored alone at eval batch 1 and 2 (< 1e-5)": measured(
            below(miss, 1e-5)
        ),
    }


def checks(n: dict) -> tuple[dict, dict]:
    """The claims above as functions of the numbers alone (a test feeds them the other run's)."""
    parts = (era_checks(n), today_checks(n), sft_checks(n))
    return {k: v for part in parts for k, v in part[0].items()}, {k: v for part in parts for k, v in part[1].items()}


def summary(n: dict) -> str:
    """The deep dive's sentences, written from this run's numbers."""
    sentences = []
    first, bad, fixed = n["then"]["4.40"], n["runs"]["without_fix"], n["runs"]["with_fix"]
    if first["status"] == "finished":
        sentences.append(
            f"On transformers {first['transformers']} a right-padded forward with the cache "
            f"{'raised' if bad['direct']['4.40']['cache']['verdict'] == 'guard' else 'did not raise'} the "
            f"error, while TRL {first['trl']}'s DPO evaluation "
            f"{'got past it' if fixed['dpo']['4.40']['verdict'] == 'missing_flash_kernel' else 'did not'}."
        )
    eval_rows = [audit[model]["eval"] for audit in n["audits"].values() for model in ("policy", "reference")]
    sentences.append(
        f"Today DPO evaluation made {sum(row['right_padded'] for row in eval_rows)} right-padded forwards "
        f"(policy and reference) and built {sum(row['cache_built'] for row in eval_rows)} KV caches; "
        f"cache-free scoring agreed to {max(n['scoring']['fp32'].values()):.1e} nats in fp32, and the SFT "
        f"eval_loss at batch 2 matched its prediction from rows scored alone to {n['sft_eval_gap']['2']:.1e}."
    )
    return " ".join(sentences)
