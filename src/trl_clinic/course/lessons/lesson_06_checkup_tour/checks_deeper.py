"""Lesson 06 deep dive's checks: the claims of the deep dive, asserted on the numbers its last cell records
(``check(run, numbers)``).

They see nothing but those numbers (as metrics.json stores them), so tests/test_checks_can_fail.py can hand them the
other run's numbers and see each one fail; ``summary`` is the sentence the workbook's report shows, written from the
same numbers.
"""

from trl_clinic.course.results import above, below, injected, measured


def symptom_checks(n: dict) -> dict:
    """Each trap fails its probe through a real code path (the command line, the user's preprocessing, the copied pad
    line, the OPT family, the table for the report's versions), or a stand-in set up on purpose (the model class that
    takes no loss keywords): all read from the settings without the fix."""
    run = n["runs"]["without_fix"]
    cli, grpo, accumulation = run["cli"], run["grpo"], run["accumulation"]
    return {
        "trl-clinic checkup sft fails the OPT padding-free recipe: packing fail, exit code 1": measured(
            cli["returncode"] == 1 and cli["statuses"].get("packing") == "fail"
        ),
        "trl-clinic checkup grpo reports GRPOConfig's refusal as a grpo_config fail (config), exit 1": measured(
            grpo["returncode"] == 1 and grpo["first"] == ["grpo_config", "fail", "config"]
        ),
        "labels cut away by the user's truncation fail labels_present": measured(run["labels"]["status"] == "fail"),
        "pad == eos with the language-modeling collator fails eos_label": measured(run["eos"]["status"] == "fail"),
        "a forward without **kwargs: the Trainer sets model_accepts_loss_kwargs=False": injected(
            run["accepts_loss_kwargs"] is False
        ),
        "and the accumulation probe measures a gradient error above its 1e-3 tolerance": injected(
            accumulation["value"] is not None and above(accumulation["value"], 1e-3)
        ),
        "a family whose mask ignores position_ids (OPT) fails the packing probe": measured(
            bool(run["packing"]) and all(f["status"] == "fail" for f in run["packing"].values())
        ),
        "the table names the Qwen2 FlashAttention-2 window and DPO's cache for the report's versions": measured(
            {"04-qwen2-fa2-right-padding-4.49", "04-trl-dpo-forward-keeps-the-cache"} <= set(run["table"])
        ),
    }


def fix_checks(n: dict) -> dict:
    """The fixed settings pass, read from the run with the fix."""
    run = n["runs"]["with_fix"]
    cli, grpo, accumulation = run["cli"], run["grpo"], run["accumulation"]
    return {
        "the recipe with padding_free: false exits 0 with no fail": measured(
            cli["returncode"] == 0 and bool(cli["statuses"]) and "fail" not in cli["statuses"].values()
        ),
        "a GRPO recipe of whole groups builds and exits 0 with no fail": measured(
            grpo["returncode"] == 0 and bool(grpo["statuses"]) and "fail" not in grpo["statuses"].values()
        ),
        "a max_length longer than the prompts passes labels_present": measured(run["labels"]["status"] == "ok"),
        "a pad token of its own passes eos_label": measured(run["eos"]["status"] == "ok"),
        "a forward with **kwargs: the Trainer hands num_items_in_batch on (model_accepts_loss_kwargs=True)": measured(
            run["accepts_loss_kwargs"] is True
        ),
        "and the accumulation probe measures a gradient error below its 1e-3 tolerance": measured(
            accumulation["value"] is not None and below(accumulation["value"], 1e-3)
        ),
        "families whose mask reads position_ids (Llama, Qwen2) pass the packing probe": measured(
            bool(run["packing"]) and all(f["status"] == "ok" for f in run["packing"].values())
        ),
        "the installed versions match no padding_cache window": measured(run["table"] == []),
    }


def today_checks(n: dict) -> dict:
    """Today's library paths that were traps once (peft's input gradients, DPO's cache), measured clean: the same
    for both runs, which share today's peft and TRL."""
    today = n["today"]
    return {
        "LoRA with reentrant checkpointing, in either order, gets every "
        "gradient (peft enables input gradients)": measured(
            bool(today["gradients"]) and all(f["status"] == "ok" for f in today["gradients"].values())
        ),
        "TRL's DPO builds no cache on right-padded rows": measured(today["dpo"]["value"] == 0),
    }


def checks(n: dict) -> tuple[dict, dict]:
    """Today's real trainers, probes and command; the model class that takes no loss keywords is a stand-in
    (stand_ins.ListedArgumentsLlama), and its checks say injected."""
    return symptom_checks(n), {**fix_checks(n), **today_checks(n)}


def summary(n: dict) -> str:
    """The deep dive in one sentence, from its numbers."""
    bad, fixed = n["runs"]["without_fix"], n["runs"]["with_fix"]
    return (
        f"`trl-clinic checkup sft` exited {bad['cli']['returncode']} on the OPT padding-free recipe and "
        f"{fixed['cli']['returncode']} with padding_free: false; GRPOConfig's refusal came back as a grpo_config "
        f"{bad['grpo']['first'][1]} (exit {bad['grpo']['returncode']}), whole groups exited "
        f"{fixed['grpo']['returncode']}; labels cut by truncation, pad == eos and a forward without **kwargs (gradient "
        f"error {bad['accumulation']['value']:.2g}) failed their probes by measurement and passed fixed; Llama and "
        f"Qwen2 packed safely, OPT did not; DPO built {n['today']['dpo']['value']:.0f} cached right-padded forwards."
    )
