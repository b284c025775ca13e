"""Every probe trips on a real tiny trainer carrying its trap and passes a healthy one (local models, no hub)."""

import pytest
import torch
from peft import LoraConfig, get_peft_model
from transformers import DataCollatorForLanguageModeling

from trl_clinic import checkup
from trl_clinic.course import examples
from trl_clinic.checkup.known_bugs import Facts, matching
from trl_clinic.course.data import all_in_category_reward
from trl_clinic.course.models import make_causal_lm


def status(trainer, probe):
    report = checkup(trainer, only=[probe], show=False)
    assert report.findings and all(f.probe == probe for f in report.findings)
    return report.findings[-1]


def test_packing_trips_on_opt_padding_free_and_passes_llama(tokenizer, tmp_path):
    opt = status(examples.sft_trainer(tokenizer, tmp_path, family="opt", padding_free=True, max_length=None,
                                      per_device_train_batch_size=4), "packing")
    llama = status(examples.sft_trainer(tokenizer, tmp_path, padding_free=True, max_length=None,
                                        per_device_train_batch_size=4), "packing")
    assert opt.status == "fail" and opt.value > 1e-3 and "opt" in opt.fix
    assert llama.status == "ok" and llama.value < 1e-4
    assert status(examples.sft_trainer(tokenizer, tmp_path), "packing").status == "skipped"


def test_accumulation_trips_on_a_loss_that_ignores_num_items_and_on_the_old_path(tokenizer, tmp_path):
    mean = status(examples.custom_trainer(tokenizer, tmp_path, examples.MeanLossTrainer,
                                          gradient_accumulation_steps=4), "accumulation")
    summed = status(examples.custom_trainer(tokenizer, tmp_path, examples.SumLossTrainer,
                                            gradient_accumulation_steps=4), "accumulation")
    old = examples.sft_trainer(tokenizer, tmp_path, gradient_accumulation_steps=4)
    old.model_accepts_loss_kwargs = False
    assert mean.status == "fail" and "num_items_in_batch" in mean.fix
    assert summed.status == "ok" and summed.value < 1e-5
    found = status(old, "accumulation")
    assert found.status == "fail" and "model_accepts_loss_kwargs" in found.fix
    assert status(examples.sft_trainer(tokenizer, tmp_path, gradient_accumulation_steps=4),
                  "accumulation").status == "ok"


def test_accumulation_is_skipped_without_a_window(tokenizer, tmp_path):
    assert status(examples.sft_trainer(tokenizer, tmp_path), "accumulation").status == "skipped"


def test_fp16_adamw_trips_on_fp16_weights_with_non_fused_adamw(tokenizer, tmp_path):
    half = make_causal_lm(tokenizer, dtype=torch.float16)
    bad = status(examples.custom_trainer(tokenizer, tmp_path, model=half, optim="adamw_torch"), "fp16_adamw")
    assert bad.status == "fail" and bad.value > 0
    assert status(examples.custom_trainer(tokenizer, tmp_path, optim="adamw_torch"), "fp16_adamw").status == "ok"


def test_reward_head_trips_on_lora_without_seq_cls(tokenizer, tmp_path):
    frozen = status(examples.reward_trainer(tokenizer, tmp_path, peft_config=LoraConfig(
        target_modules=["q_proj", "v_proj"])), "reward_head")
    trained = status(examples.reward_trainer(tokenizer, tmp_path, peft_config=LoraConfig(
        task_type="SEQ_CLS", target_modules=["q_proj", "v_proj"])), "reward_head")
    assert frozen.status == "fail" and "SEQ_CLS" in frozen.fix
    assert trained.status == "ok"
    assert status(examples.reward_trainer(tokenizer, tmp_path), "reward_head").status == "ok"


def test_padding_cache_counts_real_forwards_and_fails_inside_a_known_window(tokenizer, tmp_path, monkeypatch):
    """The forwards are counted for real: a Trainer given ``use_cache=True`` (transformers 5.23's Trainer
    copies ``args.use_cache`` into the model's config) builds a cache on right-padded rows, TRL's DPO does not. The version window is matched against stated versions
    (transformers 4.51.3, trl 0.17.0, Qwen2 with FlashAttention-2, which this CPU cannot load), as
    pip-audit is tested against a stated environment."""
    dpo = status(examples.dpo_trainer(tokenizer, tmp_path), "padding_cache")
    custom = examples.custom_trainer(tokenizer, tmp_path, family="qwen2", use_cache=True)
    today = status(custom, "padding_cache")
    assert dpo.status == "ok" and dpo.value == 0
    assert today.status == "ok" and today.value > 0
    stated = Facts(model_type="qwen2", attn_implementation="flash_attention_2", trainer="trainer",
                   versions={"transformers": "4.51.3"})
    monkeypatch.setattr(Facts, "from_view", classmethod(lambda cls, view: stated))
    window = status(custom, "padding_cache")
    assert window.status == "fail" and "_update_causal_mask" in window.fix


def test_grpo_equal_rewards_trips_on_a_reward_a_random_policy_never_earns(tokenizer, tmp_path):
    strict = examples.grpo_trainer(tokenizer, tmp_path, reward=all_in_category_reward)
    spread = examples.grpo_trainer(tokenizer, tmp_path, reward=examples.length_reward)
    found = status(strict, "equal_rewards")
    assert found.status == "fail" and found.value == 1
    assert status(spread, "equal_rewards").status == "ok"
    assert status(spread, "grpo_config").status == "ok"


def test_labels_present_trips_on_batches_whose_labels_are_all_masked(tokenizer, tmp_path):
    masked = examples.custom_trainer(tokenizer, tmp_path)
    masked.train_dataset = masked.train_dataset.map(lambda row: {"labels": [-100] * len(row["input_ids"])})
    found = status(masked, "labels_present")
    assert found.status == "fail" and found.value == 4
    assert status(examples.sft_trainer(tokenizer, tmp_path), "labels_present").status == "ok"


def test_eos_label_trips_when_pad_is_eos_and_the_collator_masks_pads(tokenizer, tmp_path):
    same = tokenizer.__class__.from_pretrained  # a copy, so the session's tokenizer keeps its own pad
    tokenizer.save_pretrained(tmp_path / "tok")
    pad_is_eos = same(tmp_path / "tok")
    pad_is_eos.pad_token = pad_is_eos.eos_token
    collator = DataCollatorForLanguageModeling(pad_is_eos, mlm=False)  # labels = -100 wherever input == pad
    found = status(examples.custom_trainer(pad_is_eos, tmp_path, data_collator=collator), "eos_label")
    assert found.status == "fail" and "pad == eos" in found.fix
    assert status(examples.sft_trainer(tokenizer, tmp_path), "eos_label").status == "ok"


def test_gradients_reach_trips_when_checkpointed_lora_inputs_need_no_gradient(tokenizer, tmp_path):
    model = get_peft_model(make_causal_lm(tokenizer), LoraConfig(target_modules=["q_proj", "v_proj"]))
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})
    model.base_model.model.disable_input_require_grads()
    found = status(examples.custom_trainer(tokenizer, tmp_path, model=model), "gradients_reach")
    assert found.status == "fail" and found.value == 8
    assert status(examples.sft_trainer(tokenizer, tmp_path), "gradients_reach").status == "ok"


def test_known_bugs_match_todays_opt_padding_free_and_stated_old_versions(tokenizer, tmp_path):
    report = checkup(examples.sft_trainer(tokenizer, tmp_path, family="opt", padding_free=True, max_length=None),
                     only=["known_bugs"], show=False)
    assert [f.measured for f in report.findings] == ["01-family-mask-ignores-position-ids"]
    assert report.findings[0].status == "fail"
    assert status(examples.sft_trainer(tokenizer, tmp_path), "known_bugs").status == "ok"
    h20 = Facts(gpu_name="NVIDIA H20", args={"bf16": True}, versions={"nvidia-cublas-cu12": "12.1.3.1"})
    assert [e["id"] for e in matching(h20)] == ["05-h20-cublas-bf16"]
    dpo = Facts(model_type="qwen2", attn_implementation="flash_attention_2", trainer="dpo",
                versions={"transformers": "4.51.3", "trl": "0.17.0"})
    assert [e["id"] for e in matching(dpo)] == ["04-trl-0.17-dpo-qwen2-fa2"]  # the counted windows: padding_cache's
    assert not matching(Facts(model_type="qwen2", attn_implementation="flash_attention_2", trainer="dpo",
                              versions={"transformers": "4.51.3", "trl": "0.18.0"}))
    old = Facts(args={"gradient_accumulation_steps": 8}, versions={"transformers": "4.45.2"})
    assert "02-transformers-4.45-accumulation" in [e["id"] for e in matching(old)]
    assert not matching(Facts(args={"gradient_accumulation_steps": 1}, versions={"transformers": "4.45.2"}))


@pytest.mark.parametrize("make", [examples.sft_trainer, examples.dpo_trainer, examples.reward_trainer])
def test_a_healthy_trainer_has_no_fail(tokenizer, tmp_path, make):
    report = checkup(make(tokenizer, tmp_path, gradient_accumulation_steps=2), show=False)
    assert not report.failed, report.to_json()
    assert {f.status for f in report.findings} <= {"ok", "skipped"}
    assert not [f.reason for f in report.findings if "could not run" in f.reason]  # skips say why it does not apply
