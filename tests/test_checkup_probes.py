"""Every probe trips on a real tiny trainer carrying its trap and passes a healthy one (local models, no hub), and
says how it decided: a trip and a pass test for each probe and for each way it once went wrong (the era tests,
tests/test_checkup_eras.py, run the same probes on the versions where the bugs lived)."""

import pytest
import torch
from peft import LoraConfig, get_peft_model
from transformers import DataCollatorForLanguageModeling

from trl_clinic import checkup
from trl_clinic.checkup import load_probes
from trl_clinic.checkup.known_bugs import Facts, load, matching
from trl_clinic.course import examples, stand_ins
from trl_clinic.course.data import all_in_category_reward
from trl_clinic.course.models import make_causal_lm
from trl_clinic.course.runtime import checkpointing_flag


def status(trainer, probe):
    report = checkup(trainer, only=[probe], show=False)
    assert report.findings and all(f.probe == probe for f in report.findings)
    return report.findings[-1]


def packed_collator(tokenizer):
    """TRL 1.16's own padding-free collator (position_ids, no mask), as a user hands it to a Trainer."""
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling as TRLCollator

    return TRLCollator(pad_token_id=tokenizer.pad_token_id, padding_free=True)


# --- packing (lesson 01) ---------------------------------------------------------------------------------------


def test_packing_trips_on_opt_padding_free_by_measurement_and_passes_llama(tokenizer, tmp_path):
    opt = status(
        examples.sft_trainer(
            tokenizer, tmp_path, family="opt", padding_free=True, max_length=None, per_device_train_batch_size=4
        ),
        "packing",
    )
    llama = status(
        examples.sft_trainer(tokenizer, tmp_path, padding_free=True, max_length=None, per_device_train_batch_size=4),
        "packing",
    )
    assert (opt.status, opt.decided, opt.known_bug) == ("fail", "measured", "01-family-mask-ignores-position-ids")
    assert opt.value > 0.1 and "opt" in opt.fix
    assert (llama.status, llama.decided) == ("ok", "measured") and llama.value < 1e-5
    padded = status(examples.sft_trainer(tokenizer, tmp_path), "packing")
    assert padded.status == "skipped" and "pads, it does not pack" in padded.reason


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_packing_in_16_bits_still_fails_the_opt_trap_and_passes_llama(tokenizer, tmp_path, dtype):
    """The old 16-bit tolerance (2e-2 on the loss) was above the OPT contamination lesson 06 measures
    (9.6e-3). The decision is by logits now, against the first sequences' own rounding in this dtype."""

    def probe(family):
        model = make_causal_lm(tokenizer, family, dtype=dtype)
        return status(
            examples.sft_trainer(
                tokenizer,
                tmp_path,
                family=family,
                model=model,
                padding_free=True,
                max_length=None,
                per_device_train_batch_size=4,
            ),
            "packing",
        )

    opt, llama = probe("opt"), probe("llama")
    assert opt.status == "fail" and opt.value > 10 * float(opt.measured.split("tolerance ")[1].split(")")[0])
    assert llama.status == "ok"


def test_packing_recognises_a_packed_row_by_its_rows_whatever_keys_it_carries(tokenizer, tmp_path):
    """TRL 0.19-0.23 sent packed rows with an all-ones mask and no position_ids (the issue's TRL 0.21 report):
    the same rows today, without position_ids and with the mask, are packed and contaminated."""
    inner = packed_collator(tokenizer)

    def all_ones_no_positions(rows):
        batch = inner(rows)
        batch.pop("position_ids")
        batch["attention_mask"] = torch.ones_like(batch["input_ids"])
        return batch

    found = status(
        examples.custom_trainer(
            tokenizer, tmp_path, data_collator=all_ones_no_positions, per_device_train_batch_size=4
        ),
        "packing",
    )
    assert (found.status, found.decided) == ("fail", "measured") and "1 row(s)" in found.measured
    assert (
        status(
            examples.custom_trainer(tokenizer, tmp_path, data_collator=inner, per_device_train_batch_size=4), "packing"
        ).status
        == "ok"
    )


# --- accumulation (lesson 02) ----------------------------------------------------------------------------------


def test_accumulation_trips_on_a_loss_that_ignores_num_items_and_on_the_old_path(tokenizer, tmp_path):
    mean = status(
        examples.custom_trainer(tokenizer, tmp_path, stand_ins.MeanLossTrainer, gradient_accumulation_steps=4),
        "accumulation",
    )
    summed = status(
        examples.custom_trainer(tokenizer, tmp_path, examples.SumLossTrainer, gradient_accumulation_steps=4),
        "accumulation",
    )
    old = examples.sft_trainer(tokenizer, tmp_path, gradient_accumulation_steps=4)
    old.model_accepts_loss_kwargs = False
    assert (mean.status, mean.decided) == ("fail", "measured") and "MeanLossTrainer.compute_loss" in mean.fix
    assert (summed.status, summed.decided) == ("ok", "measured") and summed.value < 1e-5
    found = status(old, "accumulation")
    assert found.status == "fail" and "model_accepts_loss_kwargs" in found.fix
    assert (
        status(examples.sft_trainer(tokenizer, tmp_path, gradient_accumulation_steps=4), "accumulation").status == "ok"
    )


def test_accumulation_on_packed_rows_compares_like_with_like_and_names_the_real_cause(tokenizer, tmp_path):
    """OPT padding-free is contaminated, which is packing's finding, not accumulation's; a packed
    custom loss that ignores num_items_in_batch still fails accumulation, blamed on its compute_loss."""
    opt = checkup(
        examples.sft_trainer(
            tokenizer,
            tmp_path,
            family="opt",
            padding_free=True,
            max_length=None,
            per_device_train_batch_size=4,
            gradient_accumulation_steps=2,
        ),
        only=["packing", "accumulation"],
        show=False,
    )
    assert [(f.probe, f.status) for f in opt.findings] == [("packing", "fail"), ("accumulation", "ok")]
    assert "packed" in opt.by_probe("accumulation")[0].measured
    collator = packed_collator(tokenizer)
    mean = status(
        examples.custom_trainer(
            tokenizer, tmp_path, stand_ins.MeanLossTrainer, data_collator=collator, gradient_accumulation_steps=4
        ),
        "accumulation",
    )
    summed = status(
        examples.custom_trainer(
            tokenizer, tmp_path, examples.SumLossTrainer, data_collator=collator, gradient_accumulation_steps=4
        ),
        "accumulation",
    )
    assert mean.status == "fail" and "packed" in mean.measured and "MeanLossTrainer.compute_loss" in mean.fix
    assert summed.status == "ok" and summed.value < 1e-5


@pytest.mark.parametrize("reentrant", [False, True])
def test_accumulation_reference_backward_stops_at_the_compared_tensors_unless_checkpointing_is_reentrant(
    tokenizer, tmp_path, monkeypatch, reentrant
):
    """The reference's backward reaches only the last tensors it compares (``inputs=``), so the first trainable
    tensor has no gradient when they are compared; under reentrant checkpointing the outer backward cannot reach a
    block's weights, and the reference runs again whole. Either way the bad setting fails and the healthy passes."""
    from trl_clinic.checkup import accumulation

    seen = []
    compare = accumulation.relative_difference

    def recorded(kept, model):
        seen.append(([name for name, p in model.named_parameters() if p.grad is not None], list(kept)))
        return compare(kept, model)

    monkeypatch.setattr(accumulation, "relative_difference", recorded)
    flag = checkpointing_flag()
    checkpointing = {flag: True, f"{flag}_kwargs": {"use_reentrant": reentrant}}
    bad = status(
        examples.custom_trainer(
            tokenizer, tmp_path, stand_ins.MeanLossTrainer, gradient_accumulation_steps=4, **checkpointing
        ),
        "accumulation",
    )
    healthy = status(
        examples.sft_trainer(tokenizer, tmp_path, gradient_accumulation_steps=4, **checkpointing), "accumulation"
    )
    assert (bad.status, bad.decided, healthy.status) == ("fail", "measured", "ok")
    for found in (bad, healthy):
        assert f"on the last {len(seen[0][1])} of 20 trainable tensors" in found.measured
    for reached, compared in seen:
        assert 1 <= len(compared) < 20 and set(compared) <= set(reached)
        assert (len(reached) == 20) is reentrant  # restricted: the embedding and early blocks got no gradient


def test_accumulation_is_skipped_without_a_window(tokenizer, tmp_path):
    assert status(examples.sft_trainer(tokenizer, tmp_path), "accumulation").status == "skipped"


# --- precision (lesson 03) -------------------------------------------------------------------------------------


def half(tokenizer):
    return make_causal_lm(tokenizer, dtype=torch.float16)


def test_fp16_adamw_is_measured_with_the_trainers_own_optimizer(tokenizer, tmp_path):
    bad = status(examples.custom_trainer(tokenizer, tmp_path, model=half(tokenizer), optim="adamw_torch"), "fp16_adamw")
    fused = status(
        examples.custom_trainer(tokenizer, tmp_path, model=half(tokenizer), optim="adamw_torch_fused"), "fp16_adamw"
    )
    assert (bad.status, bad.decided) == ("fail", "measured") and bad.value > 0 and "optim=adamw_torch" in bad.measured
    assert (fused.status, fused.decided) == ("ok", "measured")
    fp32 = status(examples.custom_trainer(tokenizer, tmp_path, optim="adamw_torch"), "fp16_adamw")
    assert (fp32.status, fp32.decided) == ("ok", "config")


def test_fp16_adamw_reads_the_optimizer_passed_in_optimizers_not_args_optim(tokenizer, tmp_path):
    model = half(tokenizer)
    fused = torch.optim.AdamW(model.parameters(), fused=True)
    passed = status(
        examples.custom_trainer(tokenizer, tmp_path, model=model, optim="adamw_torch", optimizers=(fused, None)),
        "fp16_adamw",
    )
    model = half(tokenizer)
    plain = torch.optim.AdamW(model.parameters())
    trap = status(
        examples.custom_trainer(tokenizer, tmp_path, model=model, optim="adamw_torch_fused", optimizers=(plain, None)),
        "fp16_adamw",
    )
    assert passed.status == "ok" and "trainer.optimizer" in passed.measured
    assert trap.status == "fail" and "trainer.optimizer" in trap.measured


def test_fp16_rmsprop_is_measured_not_assumed_to_compute_in_fp32(tokenizer, tmp_path):
    """The old probe warned that rmsprop 'computes in fp32'; torch's RMSprop keeps its state in the
    weights' dtype (optim/rmsprop.py), and one step on fp16 clones turns them non-finite."""
    found = status(examples.custom_trainer(tokenizer, tmp_path, model=half(tokenizer), optim="rmsprop"), "fp16_adamw")
    assert (found.status, found.decided) == ("fail", "measured") and "RMSprop" in found.measured


def test_an_optimizer_that_cannot_step_here_is_an_error_with_its_reason(tokenizer, tmp_path):
    """A GPU-only optimizer (bitsandbytes, paged) on this CPU: fp16 stability is not measured, and it says so."""

    class GpuOnly(torch.optim.AdamW):
        def step(self, closure=None):
            raise RuntimeError("this optimizer needs a GPU")

    model = half(tokenizer)
    found = status(
        examples.custom_trainer(tokenizer, tmp_path, model=model, optimizers=(GpuOnly(model.parameters()), None)),
        "fp16_adamw",
    )
    assert found.status == "error" and "GpuOnly could not step" in found.reason and "not measured" in found.reason


def test_init_dtype_warns_when_the_built_model_lacks_the_dtype_asked_for(tokenizer, tmp_path):
    """The known-bugs entry, decided from the built model: model_init_kwargs applies only when TRL loads the model."""
    ignored = status(
        examples.sft_trainer(tokenizer, tmp_path, model_init_kwargs={"torch_dtype": "bfloat16"}), "init_dtype"
    )
    kept = status(examples.sft_trainer(tokenizer, tmp_path, model_init_kwargs={"dtype": "float32"}), "init_dtype")
    assert (ignored.status, ignored.decided) == ("warn", "config") and "torch.float32" in ignored.measured
    assert (kept.status, kept.decided) == ("ok", "config")


def test_reward_head_trips_on_lora_without_seq_cls(tokenizer, tmp_path):
    frozen = status(
        examples.reward_trainer(tokenizer, tmp_path, peft_config=LoraConfig(target_modules=["q_proj", "v_proj"])),
        "reward_head",
    )
    trained = status(
        examples.reward_trainer(
            tokenizer, tmp_path, peft_config=LoraConfig(task_type="SEQ_CLS", target_modules=["q_proj", "v_proj"])
        ),
        "reward_head",
    )
    assert (frozen.status, frozen.decided) == ("fail", "config") and "SEQ_CLS" in frozen.fix
    assert trained.status == "ok"
    assert status(examples.reward_trainer(tokenizer, tmp_path), "reward_head").status == "ok"


# --- padding and the cache (lesson 04) -------------------------------------------------------------------------


def test_padding_cache_counts_real_forwards_and_warns_from_the_table_only_on_another_kernel(
    tokenizer, tmp_path, monkeypatch
):
    """Counted for real: a Trainer given use_cache=True builds a cache on right-padded rows, TRL's DPO does not.
    Where the table says the family and version would raise with FlashAttention-2 (stated here: transformers
    4.51.3; the real raise is met in the era, tests/test_checkup_eras.py) and the model runs sdpa, it warns."""
    dpo = status(examples.dpo_trainer(tokenizer, tmp_path), "padding_cache")
    custom = examples.custom_trainer(tokenizer, tmp_path, family="qwen2", use_cache=True)
    today = status(custom, "padding_cache")
    assert (dpo.status, dpo.decided, dpo.value) == ("ok", "measured", 0)
    assert (today.status, today.decided) == ("ok", "measured") and today.value > 0
    stated = Facts(
        model_type="qwen2", attn_implementation="sdpa", trainer="trainer", versions={"transformers": "4.51.3"}
    )
    monkeypatch.setattr(Facts, "from_view", classmethod(lambda cls, view: stated))
    window = status(custom, "padding_cache")
    assert (window.status, window.decided, window.known_bug) == ("warn", "table", "04-qwen2-fa2-right-padding-4.49")
    assert (
        status(examples.custom_trainer(tokenizer, tmp_path, family="qwen2", use_cache=False), "padding_cache").status
        == "ok"
    )


def test_padding_cache_runs_the_shortest_and_longest_of_b_rows_and_pads_as_the_b_rows_do(tokenizer, tmp_path):
    """The probe's forwards run two rows where each row is one token list: the shortest and the longest of the
    first b, right-padded exactly when the b rows collated together are; DPO's rows of several lists keep all b."""
    from trl_clinic.checkup.padding import _extreme_batch
    from trl_clinic.checkup.view import TrainerView
    from trl_clinic.probes.padding import right_padded

    view = TrainerView(examples.sft_trainer(tokenizer, tmp_path, per_device_train_batch_size=4))
    lengths = [len(row["input_ids"]) for row in view.samples(4)]
    two, whole = _extreme_batch(view), view.batch(4)
    assert two["input_ids"].shape == (2, max(lengths)), lengths
    assert right_padded(two["attention_mask"]) == right_padded(whole["attention_mask"]) == (min(lengths) < max(lengths))
    dpo = TrainerView(examples.dpo_trainer(tokenizer, tmp_path, per_device_train_batch_size=4))
    assert torch.equal(_extreme_batch(dpo)["input_ids"], dpo.batch(4)["input_ids"])


def test_padding_cache_audits_grpos_scoring_forwards(tokenizer, tmp_path):
    """GRPO was skipped ('pads prompts left itself'), but its scoring forwards carry right-padded
    completions. Completions end early here (every token but EOS and two others suppressed), so some rows are
    right-padded; TRL 1.16 passes use_cache=False there, so none builds a cache (the era test counts TRL 0.17's)."""
    keep = {tokenizer.eos_token_id, *tokenizer.convert_tokens_to_ids(tokenizer.tokenize("a b"))}
    trainer = examples.grpo_trainer(
        tokenizer,
        tmp_path,
        reward=examples.length_reward,
        max_completion_length=12,
        generation_kwargs={"suppress_tokens": [i for i in range(len(tokenizer)) if i not in keep]},
    )
    found = status(trainer, "padding_cache")
    assert (found.status, found.decided, found.value) == ("ok", "measured", 0)
    padded = int(found.measured.split("(")[1].split(" right-padded")[0])
    assert padded > 0, found.measured


def test_the_right_padding_guard_windows_are_the_families_read_in_each_release():
    """In transformers 4.51.3 the guard is in mimi, mistral, mixtral, moshi, phi3, phi4_multimodal, qwen2_moe,
    qwen2_vl, qwen2_5_vl, qwen3, qwen3_moe and starcoder2 too, qwen2_5_omni in 4.52.4; qwen2_moe, phimoe and
    jetmoe keep it after 4.53.0, moshi and kyutai_speech_to_text through 5.1.0 (claims/register.yaml cites each
    window's releases)."""

    def ids(model_type, version):
        facts = Facts(
            model_type=model_type,
            attn_implementation="flash_attention_2",
            trainer="trainer",
            versions={"transformers": version, "trl": "1.16.0"},
        )
        return [e["id"] for e in matching(facts, "padding_cache")]

    for family in (
        "mimi",
        "mistral",
        "mixtral",
        "moshi",
        "phi3",
        "phi4_multimodal",
        "qwen2_moe",
        "qwen2_vl",
        "qwen2_5_vl",
        "qwen3",
        "qwen3_moe",
        "starcoder2",
    ):
        assert ids(family, "4.51.3") == ["04-fa2-right-padding-other-families-4.49"], family
    assert ids("qwen2", "4.51.3") == ["04-qwen2-fa2-right-padding-4.49"]
    assert ids("qwen2", "4.45.2") == [] and ids("llama", "4.51.3") == []
    assert ids("qwen2_moe", "4.55.4") == ["04-fa2-right-padding-moe-4.53"] and ids("qwen2_moe", "5.0.0") == []
    assert ids("mistral", "4.55.4") == []
    assert ids("qwen2_5_omni_thinker", "4.52.4") == ["04-fa2-right-padding-other-families-4.49"]
    assert ids("mimi", "4.53.0") == []
    for family in ("moshi", "kyutai_speech_to_text"):
        assert ids(family, "5.0.0") == ids(family, "5.1.0") == ["04-fa2-right-padding-moshi"], family
        assert ids(family, "5.2.0") == [], family


def test_the_undivided_mean_window_ends_at_4_48_1():
    """transformers 4.48.0 still calls compute_loss without the count for a model that accepts loss kwargs
    (trainer.py:3675-3676), so the window of the undivided micro-batch mean ends at 4.48.1, not 4.48.0."""

    def ids(version):
        facts = Facts(args={"gradient_accumulation_steps": 4}, versions={"transformers": version})
        return [e["id"] for e in matching(facts, "accumulation")]

    assert ids("4.45.2") == ["02-transformers-4.45-accumulation"]
    for version in ("4.46.0", "4.47.0", "4.47.1", "4.48.0"):
        assert ids(version) == ["02-transformers-4.46-undivided-mean"], version
    assert ids("4.48.1") == []


# --- GRPO (lesson 05) ------------------------------------------------------------------------------------------


def test_grpo_equal_rewards_trips_on_a_reward_a_random_policy_never_earns(tokenizer, tmp_path):
    strict = examples.grpo_trainer(tokenizer, tmp_path, reward=all_in_category_reward)
    spread = examples.grpo_trainer(tokenizer, tmp_path, reward=examples.length_reward)
    found = status(strict, "equal_rewards")
    assert (found.status, found.decided, found.value) == ("fail", "measured", 1)
    assert status(spread, "equal_rewards").status == "ok"


def test_grpo_config_is_not_a_probe_of_a_built_trainer():
    """A built GRPOTrainer has passed TRL's own validation, so such a probe could only say ok; the
    command line reports a config TRL refuses (tests/test_checkup_cli.py)."""
    assert "grpo_config" not in load_probes()


# --- labels ----------------------------------------------------------------------------------------------------


def test_labels_present_trips_on_batches_whose_labels_are_all_masked(tokenizer, tmp_path):
    masked = examples.custom_trainer(tokenizer, tmp_path)
    masked.train_dataset = masked.train_dataset.map(lambda row: {"labels": [-100] * len(row["input_ids"])})
    found = status(masked, "labels_present")
    assert (found.status, found.decided, found.value) == (
        "fail",
        "measured",
        8,
    )  # every batch of the 16 rows, not the first 4
    assert status(examples.sft_trainer(tokenizer, tmp_path), "labels_present").status == "ok"


def test_eos_label_trips_when_pad_is_eos_and_the_collator_masks_pads(tokenizer, tmp_path):
    tokenizer.save_pretrained(tmp_path / "tok")
    pad_is_eos = tokenizer.__class__.from_pretrained(tmp_path / "tok")  # a copy: the session's keeps its own pad
    pad_is_eos.pad_token = pad_is_eos.eos_token
    collator = DataCollatorForLanguageModeling(pad_is_eos, mlm=False)  # labels = -100 wherever input == pad
    found = status(examples.custom_trainer(pad_is_eos, tmp_path, data_collator=collator), "eos_label")
    assert (found.status, found.decided) == ("fail", "measured") and "pad == eos" in found.fix
    assert status(examples.sft_trainer(tokenizer, tmp_path), "eos_label").status == "ok"


def test_gradients_reach_trips_when_checkpointed_lora_inputs_need_no_gradient(tokenizer, tmp_path):
    model = get_peft_model(make_causal_lm(tokenizer), LoraConfig(target_modules=["q_proj", "v_proj"]))
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})
    model.base_model.model.disable_input_require_grads()
    found = status(examples.custom_trainer(tokenizer, tmp_path, model=model), "gradients_reach")
    assert (found.status, found.decided, found.value) == ("fail", "measured", 8)
    assert status(examples.sft_trainer(tokenizer, tmp_path), "gradients_reach").status == "ok"


# --- the known-bugs table --------------------------------------------------------------------------------------


def test_known_bugs_never_fails_a_family_by_name(tokenizer, tmp_path, monkeypatch):
    """OPT padding-free is packing's measured fail; the table-only probe has nothing to say about it,
    and a table-only entry (stated here: an H20 with the reported cuBLAS) warns, never fails."""
    trainer = examples.sft_trainer(tokenizer, tmp_path, family="opt", padding_free=True, max_length=None)
    found = status(trainer, "known_bugs")
    assert (found.status, found.decided) == ("ok", "table")
    h20 = Facts(gpu_name="NVIDIA H20", args={"bf16": True}, versions={"nvidia-cublas-cu12": "12.1.3.1"})
    monkeypatch.setattr(Facts, "from_view", classmethod(lambda cls, view: h20))
    warned = status(trainer, "known_bugs")
    assert (warned.status, warned.decided, warned.known_bug) == ("warn", "table", "05-h20-cublas-bf16")


def test_gpu_names_match_whole_never_as_substrings():
    """ "H20" is in "NVIDIA H200"."""

    def ids(gpu):
        return [
            e["id"]
            for e in matching(Facts(gpu_name=gpu, args={"bf16": True}, versions={"nvidia-cublas-cu12": "12.1.3.1"}))
        ]

    assert ids("NVIDIA H20") == ["05-h20-cublas-bf16"]
    assert ids("NVIDIA H200") == [] and ids("NVIDIA H100 80GB HBM3") == []


def test_the_cublas_entries_say_which_versions_were_reported_and_that_the_rest_are_unmeasured():
    """12.1.3.1 was reported bad, 12.3.4.1 (LlamaFactory #2750) and 12.4.5.8 (diffusers #11241) cures: the window
    ends at the first reported cure, and what lies between the bad one and it is said to be unmeasured."""
    for entry in (e for e in load() if e["id"].startswith("05-h20-cublas")):
        assert "12.1.3.1" in entry["bug"] and "12.3.4.1" in entry["bug"] and "12.4.5.8" in entry["bug"]
        assert "between 12.1.3.1 and 12.3.4.1 are unmeasured" in entry["bug"] and "probe" not in entry

    def ids(cublas):
        facts = Facts(gpu_name="NVIDIA H20", args={"bf16": True}, versions={"nvidia-cublas-cu12": cublas})
        return [e["id"] for e in matching(facts)]

    assert ids("12.1.3.1") == ["05-h20-cublas-bf16"] and ids("12.3.4.1") == [] and ids("12.4.5.8") == []


def test_the_qdora_cast_window_is_each_trainers_own():
    """TRL's SFT, reward and GRPO trainers cast a quantized model's trainable tensors to bfloat16 from 0.26.0, its DPO
    trainer from 0.29.0 (0.28.0 does not), all until 1.15.0 (claims/register.yaml cites each file)."""

    def ids(trainer, trl):
        facts = Facts(trainer=trainer, quantized=True, peft={"use_dora": True}, versions={"trl": trl})
        return [e["id"] for e in matching(facts, "stalled_update")]

    for trainer in ("sft", "reward", "grpo"):
        assert ids(trainer, "0.26.0") == ids(trainer, "1.14.2") == ["03-trl-qlora-casts-dora-magnitude"], trainer
        assert ids(trainer, "0.25.1") == ids(trainer, "1.15.0") == [], trainer
    assert ids("dpo", "0.28.0") == [] and ids("dpo", "1.15.0") == []
    assert ids("dpo", "0.29.0") == ids("dpo", "1.14.2") == ["03-trl-qlora-casts-dora-magnitude-dpo"]


def test_the_torch_dtype_entry_starts_with_trl_0_27():
    """TRL's dtype='float32' default starts in 0.27.0 (0.26.2 defaults to 'auto')."""

    def ids(trl):
        return [e["id"] for e in matching(Facts(init_kwargs=["torch_dtype"], versions={"trl": trl}), "init_dtype")]

    assert ids("0.27.0") == ["03-torch-dtype-init-kwarg-ignored"] and ids("0.26.2") == []


def test_the_01_entries_match_the_collator_object_not_an_argument():
    """SFTConfig has no padding_free in TRL 0.12.2-0.15.2; the collators that send position_ids and no
    mask (TRL's completion-only collator, transformers' DataCollatorWithFlattening) are matched by class."""

    def ids(collator, versions, **collator_args):
        facts = Facts(
            attn_implementation="sdpa", collator=[collator, "object"], collator_args=collator_args, versions=versions
        )
        return [e["id"] for e in matching(facts, "packing")]

    old = {"transformers": "4.48.3", "trl": "0.14.0"}
    assert ids("DataCollatorForCompletionOnlyLM", old, padding_free=True) == ["01-position-ids-ignored-before-4.53.1"]
    assert ids("DataCollatorWithFlattening", {"transformers": "4.51.3", "trl": "0.17.0"}) == [
        "01-position-ids-ignored-before-4.53.1"
    ]
    assert ids("DataCollatorForLanguageModeling", {"transformers": "4.55.4", "trl": "0.21.0"}, padding_free=True) == [
        "01-trl-0.19-all-ones-mask"
    ]
    assert ids("DataCollatorForLanguageModeling", {"transformers": "4.55.4", "trl": "0.23.1"}, padding_free=True) == []
    assert ids("DataCollatorWithFlattening", {"transformers": "4.53.1", "trl": "0.18.2"}) == []


def test_every_known_bug_says_which_released_files_it_was_read_in():
    for entry in load():
        assert entry.get("read"), f"{entry['id']}: no `read`"
        assert entry.get("probe") is None or entry["probe"] in load_probes(), entry["id"]


# --- a healthy trainer -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("make", [examples.sft_trainer, examples.dpo_trainer, examples.reward_trainer])
def test_a_healthy_trainer_has_no_fail_and_no_error(tokenizer, tmp_path, make):
    report = checkup(make(tokenizer, tmp_path, gradient_accumulation_steps=2), show=False)
    assert report.exit_code == 0, report.to_json()
    assert {f.status for f in report.findings} <= {"ok", "skipped"}
    assert all(f.decided for f in report.findings if f.status == "ok")
    assert report.by_probe("accumulation")[0].status == "ok"  # measured, not skipped
