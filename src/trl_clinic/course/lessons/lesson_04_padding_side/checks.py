"""Lesson 04's checks: the claims of the core, asserted on the numbers its last cell records
(``check(run, numbers)``).

They see nothing but those numbers (as metrics.json stores them), so tests/test_checks_can_fail.py can hand them the
other run's numbers and see each one fail; ``summary`` is the sentence the workbook's report shows, written from the
same numbers.
"""

import math

from trl_clinic.course.results import above, below, measured, recreated

PAST = ("missing_flash_kernel", "finished")  # past the check: the flash kernel call this CPU lacks, or nothing


def when(condition: bool, value: float) -> float:
    return value if condition else math.nan  # NaN passes no comparison


def verdicts(n: dict, side: str) -> dict:
    """Each era run's verdict, then its evaluate()'s and its reference model's forward's (None where not run)."""
    return {
        key: (
            row["verdict"],
            row.get("then_evaluate", {}).get("verdict"),
            row.get("reference_forward", {}).get("verdict"),
        )
        for key, row in n["runs"][side]["era"].items()
    }


def era_symptom(n: dict, on: str) -> dict:
    """The report's versions, each failing run (the model told it is FlashAttention-2: re-created)."""
    bad, first = verdicts(n, "without_fix"), n["runs"]["without_fix"]["era"]
    return {
        f"{on}, DPOTrainer.evaluate() raises the padding_side='right' ValueError from modeling_qwen2.py": recreated(
            bad["evaluate"][0] == "guard" and first["evaluate"]["file"] == "modeling_qwen2.py"
        ),
        f"{on}, DPOConfig's defaults raise it at the first training step": recreated(
            bad["train_step"][0] == "guard" and first["train_step"]["in_training_step"]
        ),
        f"{on}, gradient checkpointing gets training past it, evaluation raises": recreated(
            bad["train_checkpointing"][0] in PAST and bad["train_checkpointing"][1] == "guard"
        ),
        f"{on}, a left-padding tokenizer does not avoid it": recreated(bad["tokenizer_left"][0] == "guard"),
        f"{on}, a model path raises it in the policy's and the reference's forward": recreated(
            bad["model_path"][0] == bad["model_path"][2] == "guard"
        ),
        f"{on}, an explicit ref_model path without ref_model_init_kwargs raises in the reference forward": recreated(
            bad["explicit_ref"][2] == "guard"
        ),
    }


def era_fix(n: dict, on: str) -> dict:
    """The same runs with the fix and nothing else changed."""
    fixed = verdicts(n, "with_fix")
    return {
        f"{on}, use_cache=False gets evaluate() and the first training step past the check": recreated(
            fixed["evaluate"][0] in PAST and fixed["train_step"][0] in PAST
        ),
        f"{on}, with gradient checkpointing and use_cache=False, training and evaluation get past it": recreated(
            fixed["train_checkpointing"][0] in PAST and fixed["train_checkpointing"][1] in PAST
        ),
        f"{on}, model_init_kwargs use_cache=False gets a model path's policy and reference past it": recreated(
            fixed["model_path"][0] in PAST and fixed["model_path"][2] in PAST
        ),
        f"{on}, ref_model_init_kwargs use_cache=False gets an explicit ref_model path past it": recreated(
            fixed["explicit_ref"][2] in PAST
        ),
    }


def cache_checks(n: dict) -> tuple[dict, dict]:
    """DPO evaluation's forwards, counted: the era's TRL on a plain Qwen2, and today's (nothing re-created)."""
    bad, fixed = n["runs"]["without_fix"]["dpo_eval"] or {}, n["runs"]["with_fix"]["dpo_eval"] or {}
    counts = [bad.get(m) or {} for m in ("policy", "reference")]
    symptom = (
        {}
        if n["then"]["status"] != "finished"
        else {
            f"on TRL {n['then']['trl']}, DPO evaluation of a plain Qwen2 builds a KV cache for every right-padded row "
            "(policy and reference)": measured(
                all(c.get("right_padded") and c["right_padded_with_cache"] == c["right_padded"] for c in counts)
            )
        }
    )
    today = [fixed.get(m) or {} for m in ("policy", "reference")]
    return symptom, {
        "today's DPO evaluation: right-padded forwards of policy and reference, none with a cache; the check-up's "
        "padding_cache agrees": measured(
            all(c.get("right_padded") and c["right_padded_with_cache"] == 0 for c in today)
            and fixed.get("checkup") == {"status": "ok", "value": 0}
        )
    }


def checks(n: dict) -> tuple[dict, dict]:
    """The claims above as functions of the numbers alone (a test feeds them the other run's)."""
    era = n["then"]
    on = f"on transformers {era.get('transformers')} + TRL {era.get('trl')}"
    done = era["status"] == "finished"
    parts = (({**era_symptom(n, on)}, era_fix(n, on)) if done else ({}, {}), cache_checks(n), today_checks(n))
    return {k: v for part in parts for k, v in part[0].items()}, {k: v for part in parts for k, v in part[1].items()}


def today_checks(n: dict) -> tuple[dict, dict]:
    """Today's generate(), right padding (without the fix) against left (with it), and DPO's batches."""
    bad, fixed, pad = n["runs"]["without_fix"], n["runs"]["with_fix"], n["dpo_padding"]
    right, left, sh = bad["grid"][-1], fixed["grid"][-1], bad["generation"]["shorter"]
    moved = sh["min_shift_padded"] / max(sh["max_shift_unpadded"], 1e-12) if sh["changed_unpadded"] == 0 else math.nan
    return {
        "DPO's batches end in padding even with a left-padding tokenizer": measured(
            pad["padded"] > 0 and pad["on_the_left"] == 0
        ),
        "right padding predicts the short row's first new token from a pad slot": measured(
            below(when(right["pad"][right["predicted_from"]], right["match_gap"]), 1e-2)
        ),
        "right padding gives the short row's new tokens positions its prompt already used": measured(
            set(right["new_positions"]) <= {p for p, is_pad in zip(right["positions"], right["pad"]) if not is_pad}
        ),
        "right-padded batched generate() changes SmolLM2's answers": measured(above(bad["generation"]["changed"], 0.5)),
        "only the rows shorter than the longest prompt move (over 1000x the "
        "unpadded rows' first-token shift)": measured(above(moved, 1e3)),
        "the hook flags the right-padded generate()": measured(above(bad["hook"]["right_padded_with_cache"], 0.5)),
    }, {
        "left padding predicts every row's first new token from its own last token": measured(
            below(when(not left["pad"][left["predicted_from"]], left["match_gap"]), 1e-2)
        ),
        "left-padded batched generate() gives SmolLM2's answers one at a time": measured(
            below(fixed["generation"]["changed"], 0.5)
        ),
        "the hook flags nothing in the left-padded generate()": measured(
            below(fixed["hook"]["right_padded_with_cache"], 0.5)
        ),
    }


def summary(n: dict) -> str:
    """The core's sentences, written from this run's numbers."""
    sentences = []
    report, bad, fixed = n["then"], n["runs"]["without_fix"], n["runs"]["with_fix"]
    if report["status"] == "finished":
        on = f"On transformers {report['transformers']} + TRL {report['trl']}"
        raised = bad["era"]["evaluate"]["verdict"] == "guard"
        passed = fixed["era"]["evaluate"]["verdict"] in ("missing_flash_kernel", "finished")
        cached = bad["dpo_eval"]["policy"]
        sentences.append(
            f"{on}, DPOTrainer.evaluate() on a Qwen2 told it is FlashAttention-2 "
            + ("raised" if raised else "did not raise")
            + " the padding_side='right' ValueError, and with model.config.use_cache=False it "
            + ("got past the check" if passed else "did not get past it")
            + f"; on a plain Qwen2 the same evaluation built a KV cache for {cached['right_padded_with_cache']} of "
            f"{cached['right_padded']} right-padded policy forwards."
        )
    else:
        sentences.append("The report's versions did not run (run `make eras`).")
    today = fixed["dpo_eval"]["policy"]
    sentences.append(
        f"Today SmolLM2's batched generate() changed {bad['generation']['changed']}/{n['prompts']} answers with right "
        f"padding and {fixed['generation']['changed']}/{n['prompts']} with left; DPO evaluation made "
        f"{today['right_padded']} right-padded policy forwards, {today['right_padded_with_cache']} with a KV cache."
    )
    return " ".join(sentences)
