"""Every check can fail: each lesson's ``checks`` function, fed the numbers of a run without the bug
(or without the fix), reports that check as failed.

The ``checks`` cells of each notebook (tag ``checks``) are read from its percent-format source and run
on its own, so it can use nothing but the numbers. The numbers of a real cpu run at the default seed
are kept in ``tests/fixtures/numbers/`` (refresh them with ``python tests/fixtures/refresh.py OUT``
after a workbook run); each mutation below changes them the way a run without the bug, or without the
fix, would, and the test asserts that exactly that check now fails. A check made constant, or a new
check without a mutation, fails here loudly.
"""

import copy
import json
import math
import re
from pathlib import Path

import jupytext
import pytest

from trl_clinic.course.results import from_json_safe, injected, recreated

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures" / "numbers"
LESSONS = {"01": "01_padding_free_high_loss", "02": "02_gradient_accumulation_loss",
           "02b": "02b_gradient_accumulation_ddp", "03": "03_lora_reward_nan", "04": "04_qwen2_padding_side",
           "05": "05_grpo_sigfpe", "06": "06_checkup_your_trainer"}


def lesson_checks(notebook: str):
    """The notebook's ``checks`` function, defined with nothing but math and the check kinds at hand (the
    cells tagged ``checks``, in order: a long list of claims may span several short cells)."""
    cells = [cell for cell in jupytext.read(ROOT / "notebooks" / f"{notebook}.py").cells
             if "checks" in cell.metadata.get("tags", [])]
    assert cells, f"{notebook} has no cell tagged 'checks'"
    namespace = {"math": math, "recreated": recreated, "injected": injected}
    for cell in cells:
        exec(cell.source, namespace)
    return namespace["checks"]


def baseline(key: str) -> dict:
    return from_json_safe(json.loads((FIXTURES / f"{key}.json").read_text()))


def verdict(key: str, numbers: dict) -> dict[str, bool]:
    symptom, fix = lesson_checks(LESSONS[key])(numbers)
    return {name: getattr(check, "passed", check) for name, check in {**symptom, **fix}.items()}


def set_all(rows, field, value):
    for row in rows:
        row[field] = value


def _01_reverse_first(n):
    first = next(iter(n["loss_ratio"]))
    n["loss_ratio"][first] = n["loss_ratio"][first][::-1]


def _04_era(era: str, group: str, name: str, **change):
    """Lesson 04: change one outcome an era script recorded (``numbers["then"][era][group][name]``)."""
    return lambda n: n["then"][era][group][name].update(**change)


# check name (a unique part of it) -> how a run without the bug, or without the fix, changes the numbers
MUTATIONS = {
    "01": {
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
    },
    "02": {
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
    },
    "02b": {
        "different numbers of label tokens": lambda n: [n["label_counts"].update({acc: [[5] * len(c[0])] * len(c)})
                                                        for acc, c in list(n["label_counts"].items())],
        "old per-process mean misses": lambda n: set_all(n["comparison"]["old"], "relative_error", 1e-7),
        "per-process num_items_in_batch misses": lambda n: set_all(n["comparison"]["per-process"],
                                                                   "relative_error", 1e-7),
        "as many label tokens as the processes together": lambda n: n.update(same_samples=False),
        "counts across processes match the big batch": lambda n: set_all(n["comparison"]["across-processes"],
                                                                         "relative_error", 0.3),
        "with fsdp=True asked for": lambda n: set_all(n["comparison"]["across-processes, fsdp"], "relative_error", 0.3),
    },
    "03": {
        "non-finite raw loss": lambda n: n.update(report_raw_loss=[1.0] * len(n["report_raw_loss"])),
        "huge finite number": lambda n: n["report_logged_loss"].__setitem__(0, 0.7),
        "exactly 0 after the blow-up": lambda n: n.update(report_logged_loss=[n["report_logged_loss"][0]]
                                                          + [0.5] * (len(n["report_logged_loss"]) - 1)),
        "grad norm is NaN": lambda n: n.update(report_logged_grad_norm=[1.0] * len(n["report_logged_grad_norm"])),
        "eval accuracy is 0": lambda n: n["eval_accuracy"].update({"fp16 weights (report)": 0.5}),
        "first bad tensor is the fp16 score head": lambda n: n.update(first_nonfinite_where="gradient"),
        "exactly those whose Adam second moment": lambda n: n.update(inf_weights_are_underflowed=False),
        "threshold separates": lambda n: n.update(largest_underflowed_gradient=2 * n["underflow_threshold"]),
        "spread to every trainable tensor": lambda n: n.update(poisoned_tensors=n["trainable_tensors"] - 1),
        "replay gives every logged number": lambda n: n["replayed_logs"].__setitem__(0, 2 * n["replayed_logs"][0]),
        "head is frozen and not saved": lambda n: n["heads"]["without SEQ_CLS"].update(head_trainable=True),
        "reload under another seed changes": lambda n: n["heads"]["without SEQ_CLS"].update(reload_max_reward_change=0.0),
        "legacy torch_dtype": lambda n: n["legacy_spellings"].update(
            {"{'torch_dtype': 'float16'}": "loads with weights in torch.float16"}),
        "'half' is rejected": lambda n: n["legacy_spellings"].update(
            {"{'dtype': 'half'}": "loads with weights in torch.float16"}),
        "dtype='auto' on an fp16 checkpoint": lambda n: n["legacy_spellings"].update(
            {"{'dtype': 'auto'}": "loads with weights in torch.float32"}),
        "fp16 breaks at every accumulation count": lambda n: n["fp16_by_accumulation"]["1"].update(
            first_nonfinite_step=None),
        "more accumulation inflates the first logged loss": lambda n: n["fp16_by_accumulation"]["32"].update(
            first_log=0.5),
        "fused AdamW keeps": lambda n: n["fused_adamw_raw_loss"].__setitem__(-1, math.nan),
        "default optimizer is the fused AdamW": lambda n: n.update(default_optim="adamw_torch"),
        "clipping turns a finite gradient NaN": lambda n: n.update(clip_spreads_nan=False),
        "gradient scaler refuses": lambda n: n.update(grad_scaler="unscaled"),
        "fp16=True does not rescue": lambda n: n.update(fp16_amp="trained", fp16_amp_raw_loss=[0.69, 0.68]),
        "fixed run finite": lambda n: n["fixed_raw_loss"].__setitem__(-1, math.inf),
        "fixed head is trained and saved": lambda n: n["heads"]["with SEQ_CLS"].update(score_saved=False),
        "fixed reload reproduces": lambda n: n["heads"]["with SEQ_CLS"].update(reload_max_reward_change=0.1),
    },
    "04": {
        "has right-padded forwards": lambda n: n["audits"]["1"]["policy"]["eval"].update(right_padded=0),
        "the reference model runs its own DPO forwards": lambda n: n["audits"]["2"].pop("reference"),
        "no DPO forward of the policy or the reference model built": lambda n: n["audits"]["2"]["reference"][
            "eval"].update(cache_built=1),
        "use_cache=False from _compute_loss": lambda n: n["audits"]["1"]["reference"]["eval"].update(
            asked={"use_cache=None from dpo_trainer.py:_compute_loss": 1}),
        "right-padded batched generation differs": lambda n: n["changed_outputs"].update(right=0),
        "right padding shifts the first-token": lambda n: n["smollm2_first_token_logit_shift"].update(right=0.0),
        "padding_free is temporarily unavailable": lambda n: n["padding_free"].update(warnings=[]),
        "even with a left-padding tokenizer": lambda n: n.update(dpo_ignores_padding_side=False),
        "scoring differences below": lambda n: n["scoring"]["fp32"].update(right=1e-3),
        "left-padded batched generation equals": lambda n: n["changed_outputs"].update(left=1),
        "SmolLM2: left-padded generation": lambda n: n["smollm2_changed_outputs"].update(left=1),
        "raises the padding_side='right' ValueError": _04_era("4.51", "scenarios", "as_reported", error=None),
        "a left-padding tokenizer does not avoid it": _04_era("4.51", "scenarios", "tokenizer_left", passed_guard=True),
        "use_cache=False gets past the check": _04_era("4.51", "scenarios", "use_cache_false", passed_guard=False),
        "raises it from Qwen2Model.forward": _04_era("4.40", "direct_forward", "right", passed_guard=True),
        "use_cache=False or left padding gets past": _04_era("4.40", "direct_forward", "left", passed_guard=False),
        "DPOTrainer.evaluate() gets past the check": _04_era("4.40", "scenarios", "as_reported", passed_guard=False),
        "eval batch 2 pads every batch on the right": lambda n: n["sft_eval"]["2"].update(right_padded=0),
        "hands attention a padding mask": lambda n: n["sft_eval"]["2"].update(mask_to_attention=0),
        "vanish in fp32": lambda n: n["scoring"].update(bf16=dict(n["scoring"]["fp32"])),
        "within 2x bf16's own rounding error": lambda n: n.update(bf16_error=max(n["scoring"]["bf16"].values()) / 3),
        "SFTTrainer builds no cache in evaluation": lambda n: n["sft_eval"]["2"].update(cache_built=1),
        "matches the one predicted from rows scored alone": lambda n: n["sft_eval_gap"].update({"2": 1e-3}),
    },
    "05": {
        "kill the GRPO child with SIGFPE and no traceback": lambda n: n["symptom"].update(signal=None),
        "rejects the report's config": lambda n: n["config_walk"][0].update(error=None),
        "per-device batch 4 x accumulation 4 holds the 16 generations": lambda n: n["rule"].update(
            per_device_train_batch_size=16, generation_batch_size=64),
        "detected as SIGFPE": lambda n: n["native_crash"].update(signal=None, returncode=1),
        "a shell words it": lambda n: n["native_crash"].update(shell_says="bash: line 1: 9 Killed", shell_returncode=137),
        "leaves no message": lambda n: n["native_crash"].update(stderr_without_faulthandler="Fatal Python error: x"),
        "faulthandler shows the Python stack": lambda n: n["native_crash"].update(stderr_with_faulthandler=""),
        "bisection names the guilty setting": lambda n: n.update(culprits=["learning_rate", "bf16"]),
        "real config error names per_device_train_batch_size": lambda n: n["config_bisection"].update(
            culprits=["gradient_accumulation_steps", "num_generations"]),
        "message does not name the guilty setting": lambda n: n["config_bisection"].update(
            message="ValueError: per_device_train_batch_size (1) must be divisible by num_generations (8)."),
        "equal-reward groups teach nothing": lambda n: n.update(silent_frac_reward_zero_std=0.5),
        "minimal config runs": lambda n: n["bisection"][0].update(status="signal"),
        "gets past the injected fault": lambda n: n.update(workaround="signal"),
        "train every step on today's TRL": lambda n: n.update(workaround_steps=n["max_steps"] - 1),
        "healthy run finished": lambda n: n.update(healthy="timeout"),
        "reward improves": lambda n: n.update(reward_end=n["reward_start"]),
        "accepts the report's config as written": lambda n: n["then"].update(accepted=False),
        "runs in fp32 unless bf16 is named": lambda n: n["then"].update(default_bf16=True),
        "nor its max_grad_norm crashes a run": lambda n: n["suspects"]["max_grad_norm"].update(status="signal"),
    },
    "06": {
        "custom compute_loss fails the accumulation probe": lambda n: n["findings"]["symptom"].update(
            status="ok", value=1e-7),
        "model_accepts_loss_kwargs=False (set by hand) fails it too": lambda n: n["findings"]["old path"].update(
            status="ok"),
        "OPT padding-free fails the packing probe": lambda n: n["packing"]["opt"].update(status="ok", value=1e-6),
        "fp16 weights with adamw_torch": lambda n: n["findings"]["fp16 adamw"].update(status="warn"),
        "without SEQ_CLS fails the reward_head": lambda n: n["reward"]["no task_type"].update(status="ok"),
        "runs right-padded forwards with a cache": lambda n: n["cache"]["qwen2, use_cache=True"].update(value=0),
        "all-or-nothing reward leaves every group equal": lambda n: n["groups"]["all or nothing"].update(
            status="warn", value=0.75),
        "fail labels_present": lambda n: n["findings"]["labels"].update(status="ok"),
        "leaves no EOS target": lambda n: n["findings"]["eos"].update(status="ok"),
        "leaves tensors without a gradient": lambda n: n["findings"]["gradients"].update(status="ok"),
        "command line fails the OPT padding-free recipe": lambda n: n["command"].update(returncode=0),
        "divided by num_items_in_batch passes": lambda n: n["findings"]["fixed"].update(status="fail", value=0.3),
        "Llama padding-free passes": lambda n: n["packing"]["llama"].update(status="fail", value=0.1),
        "with SEQ_CLS passes the reward_head": lambda n: n["reward"]["SEQ_CLS"].update(status="fail"),
        "TRL's DPO builds no cache": lambda n: n["cache"]["dpo"].update(value=2),
        "differs within groups passes": lambda n: n["groups"]["length"].update(status="fail"),
        "healthy SFTTrainer has no warn or fail": lambda n: n["healthy"].update(accumulation="fail"),
        "byte for byte as it was": lambda n: n.update(untouched=False),
        "fixed recipe passes on the command line": lambda n: n["fixed_command"].update(returncode=1),
    },
}


@pytest.mark.parametrize("key", LESSONS)
def test_the_real_runs_numbers_pass_every_check(key):
    verdicts = verdict(key, baseline(key))
    assert all(verdicts.values()), [name for name, passed in verdicts.items() if not passed]


@pytest.mark.parametrize("key", LESSONS)
def test_every_check_has_a_mutation(key):
    names = verdict(key, baseline(key))
    for part in MUTATIONS[key]:
        assert sum(part in name for name in names) == 1, f"{part!r} must name exactly one check of lesson {key}"
    unmatched = [name for name in names if not any(part in name for part in MUTATIONS[key])]
    assert not unmatched, f"lesson {key}: checks without a mutation that makes them fail: {unmatched}"


@pytest.mark.parametrize("key, part", [(key, part) for key, parts in MUTATIONS.items() for part in parts])
def test_each_check_fails_on_a_run_without_the_bug_or_the_fix(key, part):
    numbers = copy.deepcopy(baseline(key))
    MUTATIONS[key][part](numbers)
    failed = [name for name, passed in verdict(key, numbers).items() if not passed]
    assert any(part in name for name in failed), f"lesson {key}: the check {part!r} still passes: {failed}"


@pytest.mark.parametrize("key", [key for key in LESSONS if "then" in baseline(key)])
def test_a_skipped_era_leaves_its_checks_out_rather_than_passing_them(key):
    numbers = baseline(key)
    eras = numbers["then"]
    for record in (eras.values() if "status" not in eras else [eras]):
        record["status"] = "skipped"
    skipped = verdict(key, numbers)
    assert all(skipped.values())
    dropped = set(verdict(key, baseline(key))) - set(skipped)
    assert dropped and all(re.search(r"\d+\.\d+", name) for name in dropped), dropped  # each names its version
