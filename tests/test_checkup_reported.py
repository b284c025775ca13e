"""The probes for failures users report on today's stack (TRL 1.x, transformers 5.x): each trips on a real tiny
trainer carrying the reported setting and passes the same trainer without it; the known-bugs entries that name the
causes match the versions their windows were read in."""

import pytest
import torch
from datasets import Dataset

from trl_clinic import checkup
from trl_clinic.checkup.known_bugs import Facts, matching
from trl_clinic.course import examples
from trl_clinic.course.data import NAMES, fixed_world, instruction_pairs, preference_pairs
from trl_clinic.course.models import make_causal_lm
from trl_clinic.course.tokenizer import build_tokenizer

# ChatML with {% generation %} around the assistant's content only (the end-of-turn token outside: TRL PR #5988),
# and the same template with <|im_end|> inside the block
HEAD = "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' }}"
TAIL = "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
EOT_OUTSIDE = (
    HEAD + "{% if message['role'] == 'assistant' %}{% generation %}{{ message['content'] }}{% endgeneration %}"
    "{% else %}{{ message['content'] }}{% endif %}{{ '<|im_end|>\n' }}" + TAIL
)
EOT_INSIDE = (
    HEAD + "{% if message['role'] == 'assistant' %}{% generation %}{{ message['content'] + '<|im_end|>' }}"
    "{% endgeneration %}{{ '\n' }}{% else %}{{ message['content'] + '<|im_end|>\n' }}{% endif %}" + TAIL
)
# <|im_end|>\n inside the block, as TRL's own training templates write it (qwen2_5_training.jinja): every trained
# span ends on the newline, one token after the turn end
EOT_AND_NEWLINE_INSIDE = (
    HEAD + "{% if message['role'] == 'assistant' %}{% generation %}{{ message['content'] + '<|im_end|>\n' }}"
    "{% endgeneration %}{% else %}{{ message['content'] + '<|im_end|>\n' }}{% endif %}" + TAIL
)


def finding(trainer, probe):
    report = checkup(trainer, only=[probe], show=False)
    assert report.findings and all(f.probe == probe for f in report.findings)
    return report.findings[-1]


def chat_trainer(out, template, assistant_only_loss=True, **config):
    from trl import SFTConfig, SFTTrainer

    tokenizer = build_tokenizer()
    tokenizer.chat_template = template
    rows = instruction_pairs(16, seed=0, max_people=2)
    data = Dataset.from_list(
        [
            {
                "messages": [
                    {"role": "user", "content": r["prompt"]},
                    {"role": "assistant", "content": r["completion"].strip()},
                ]
            }
            for r in rows
        ]
    )
    return SFTTrainer(
        model=make_causal_lm(tokenizer),
        args=SFTConfig(**examples.config_kwargs(out, assistant_only_loss=assistant_only_loss, **config)),
        processing_class=tokenizer,
        train_dataset=data,
    )


# --- turn_end (TRL PR #5988) --------------------------------------------------------------------------------------


def test_turn_end_trips_when_the_template_leaves_the_end_of_turn_out_of_the_generation_block(tmp_path):
    bad = finding(chat_trainer(tmp_path, EOT_OUTSIDE), "turn_end")
    good = finding(chat_trainer(tmp_path, EOT_INSIDE), "turn_end")
    assert (bad.status, bad.decided, bad.value) == ("fail", "measured", 0.0)
    assert "0 of 8 trained turns" in bad.measured and "8 end before it" in bad.measured
    assert "{% generation %}" in bad.fix
    assert (good.status, good.decided, good.value) == ("ok", "measured", 1.0)
    assert "<|im_end|>" in good.measured


@pytest.mark.parametrize(
    "template, assistant_only",
    [(EOT_AND_NEWLINE_INSIDE, True), (EOT_OUTSIDE, False), (EOT_AND_NEWLINE_INSIDE, False)],
    ids=["turn-end-and-newline-in-the-block", "whole-sequence", "whole-sequence-generation-template"],
)
def test_turn_end_passes_spans_that_end_after_a_trained_turn_end(tmp_path, template, assistant_only):
    """The recipes' own setups the old probe failed: a span that ends on the newline after <|im_end|> (TRL's training
    templates), and whole-sequence training, where every turn end is a label although no span ends on one."""
    found = finding(chat_trainer(tmp_path, template, assistant_only_loss=assistant_only), "turn_end")
    assert (found.status, found.decided, found.value) == ("ok", "measured", 1.0), found.measured


def test_turn_end_leaves_out_spans_that_max_length_cut_and_says_so(tmp_path):
    """A turn cut by max_length before its turn end proves nothing; when every span is cut the probe says it cannot
    judge, never ok on nothing."""
    some = finding(chat_trainer(tmp_path, EOT_INSIDE, max_length=30), "turn_end")
    assert "cut by max_length left out" in some.measured and some.status == "ok", some.measured
    every = finding(chat_trainer(tmp_path, EOT_INSIDE, max_length=24), "turn_end")
    assert every.status == "skipped" and "cut by max_length" in every.reason


def test_eos_label_leaves_chatml_turns_to_turn_end_and_still_checks_plain_text(tokenizer, tmp_path):
    """ChatML turns end with <|im_end|>, not the tokenizer's EOS: no EOS target is right there (it failed before)."""
    chat = finding(chat_trainer(tmp_path, EOT_INSIDE), "eos_label")
    assert chat.status == "skipped" and "turn_end" in chat.reason
    plain = finding(examples.sft_trainer(tokenizer, tmp_path), "eos_label")
    assert plain.status == "ok"
    assert finding(examples.sft_trainer(tokenizer, tmp_path), "turn_end").status == "skipped"


# --- identical_pairs (DPO margins flat) --------------------------------------------------------------------------


def preamble_pairs(rows: int = 16) -> Dataset:
    """Preference pairs whose chosen and rejected share a three-biography preamble: the difference comes late."""
    world = fixed_world()

    def add(row, i):
        shared = " " + " ".join(world.biography(NAMES[(i + j) % len(NAMES)]) for j in range(3))
        return {"chosen": shared + row["chosen"], "rejected": shared + row["rejected"]}

    return preference_pairs(rows, seed=0).map(add, with_indices=True)


def dpo(tokenizer, out, data, **config):
    from trl import DPOConfig, DPOTrainer

    return DPOTrainer(
        model=make_causal_lm(tokenizer),
        ref_model=make_causal_lm(tokenizer),
        args=DPOConfig(**examples.config_kwargs(out, **config)),
        processing_class=tokenizer,
        train_dataset=data,
    )


def test_identical_pairs_trips_when_max_length_cuts_the_difference_away(tokenizer, tmp_path):
    cut = finding(dpo(tokenizer, tmp_path, preamble_pairs(), max_length=64), "identical_pairs")
    whole = finding(dpo(tokenizer, tmp_path, preamble_pairs(), max_length=None), "identical_pairs")
    assert (cut.status, cut.decided, cut.value) == ("fail", "measured", 1.0)
    assert "8 of 8 pairs" in cut.measured and "raise max_length to at least" in cut.fix
    assert (whole.status, whole.value) == ("ok", 0.0)
    assert finding(examples.sft_trainer(tokenizer, tmp_path), "identical_pairs").status == "skipped"


# --- gspo_loss (TRL #3823) ----------------------------------------------------------------------------------------


def test_gspo_loss_warns_on_sequence_ratios_under_a_token_summed_loss(tokenizer, tmp_path):
    summed = finding(examples.grpo_trainer(tokenizer, tmp_path, importance_sampling_level="sequence"), "gspo_loss")
    per_sequence = finding(
        examples.grpo_trainer(tokenizer, tmp_path, importance_sampling_level="sequence", loss_type="grpo"),
        "gspo_loss",
    )
    assert (summed.status, summed.decided) == ("warn", "config") and "'dapo'" in summed.measured
    assert "loss_type='grpo'" in summed.fix
    assert (per_sequence.status, per_sequence.decided) == ("ok", "config")
    assert finding(examples.grpo_trainer(tokenizer, tmp_path), "gspo_loss").status == "skipped"


# --- stalled_update (TRL #7268) -----------------------------------------------------------------------------------


def test_stalled_update_trips_on_bf16_weights_that_the_step_cannot_move(tokenizer, tmp_path):
    """A model built in bfloat16 and fully fine-tuned at lr 2e-5 under a plain launch: its norm weights (1.0) and most
    matrix elements (|w| above 2e-5 * 2^9) cannot move by 2e-5; every kind of tensor is read the same way."""
    from trl_clinic.checkup.updates import FAIL_SHARE

    half = examples.sft_trainer(
        tokenizer, tmp_path, model=make_causal_lm(tokenizer, dtype=torch.bfloat16), learning_rate=2e-5
    )
    stalled = finding(half, "stalled_update")
    full = finding(examples.sft_trainer(tokenizer, tmp_path, learning_rate=2e-5), "stalled_update")
    assert (stalled.status, stalled.decided) == ("fail", "measured") and stalled.value >= FAIL_SHARE
    for kind in ("norm 100%", "matrix", "embedding"):
        assert kind in stalled.measured, stalled.measured
    assert "under one process" in stalled.measured and "float32" in stalled.fix and "master" in stalled.fix
    assert (full.status, full.decided) == ("ok", "config")


@pytest.mark.parametrize(
    "lr, status",
    [(1e-4, "warn"), (1e-2, "ok")],
    ids=["lr-1e-4-matrices-12pct-warn", "lr-1e-2-everything-moves-ok"],
)
def test_stalled_update_warns_on_a_run_that_still_trains_and_passes_one_that_moves(tokenizer, tmp_path, lr, status):
    """benchmarks/bf16_updates.py: at lr 1e-4 about 12% of a bfloat16 tiny Llama's parameters never move (the run
    lost 15% of its improvement: it trains, worse); at 1e-2 every kind moves, norms at 1.0 included (half a unit of
    bfloat16 at 1.0 is 2^-8, about 0.0039)."""
    from trl_clinic.checkup.updates import FAIL_SHARE, WARN_SHARE

    half = make_causal_lm(tokenizer, dtype=torch.bfloat16)
    found = finding(examples.sft_trainer(tokenizer, tmp_path, model=half, learning_rate=lr), "stalled_update")
    assert (found.status, found.decided) == (status, "measured"), found.measured
    assert (WARN_SHARE <= found.value < FAIL_SHARE) if status == "warn" else found.value < WARN_SHARE
    assert ("norm 100%" in found.measured) == (status == "warn")


def test_stalled_update_fails_a_dora_magnitude_that_never_moves_whatever_its_small_share(tokenizer, tmp_path):
    """TRL #7268's cast, made by hand on today's TRL (which keeps the magnitude in float32): DoRA's magnitude
    vectors in bfloat16 at lr 2e-4 are a small share of the parameters, and never move."""
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(
        make_causal_lm(tokenizer), LoraConfig(r=8, target_modules=["q_proj", "v_proj"], use_dora=True)
    )
    for parameter in model.parameters():
        if parameter.requires_grad:
            parameter.data = parameter.data.to(torch.bfloat16)  # trl 1.14.2 sft_trainer.py's cast of every one
    found = finding(examples.sft_trainer(tokenizer, tmp_path, model=model, learning_rate=2e-4), "stalled_update")
    assert (found.status, found.decided) == ("fail", "measured") and found.value < 0.5, found.measured
    assert "magnitude 100%" in found.measured and "lora_magnitude_vector" in found.fix


def test_stalled_update_never_steps_the_users_weights(tokenizer, tmp_path):
    trainer = examples.sft_trainer(tokenizer, tmp_path, model=make_causal_lm(tokenizer, dtype=torch.bfloat16))
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    finding(trainer, "stalled_update")
    assert all(torch.equal(before[n], p) for n, p in trainer.model.named_parameters())


# --- prompt_in_loss (TRL #6105) -----------------------------------------------------------------------------------


def test_prompt_in_loss_passes_todays_conversational_prompt_completion(tmp_path):
    """The trip is an era's (trl 0.24.0 + transformers 5.5.0, tests/test_checkup_eras.py); today the prompt is
    masked."""
    from trl import SFTConfig, SFTTrainer

    tokenizer = build_tokenizer()
    rows = instruction_pairs(16, seed=0)
    data = Dataset.from_list(
        [
            {
                "prompt": [{"role": "user", "content": r["prompt"]}],
                "completion": [{"role": "assistant", "content": r["completion"].strip()}],
            }
            for r in rows
        ]
    )
    trainer = SFTTrainer(
        model=make_causal_lm(tokenizer),
        args=SFTConfig(**examples.config_kwargs(tmp_path)),
        processing_class=tokenizer,
        train_dataset=data,
    )
    found = finding(trainer, "prompt_in_loss")
    assert (found.status, found.decided, found.value) == ("ok", "measured", 0.0)
    assert "0 of 8 chat-formatted rows" in found.measured


# SmolLM3's layout (the alignment-handbook's smollm3 SFT recipe): the generation header inside {% generation %}, so the
# template itself trains <|im_start|>assistant\n
HEADER_INSIDE = (
    "{% for message in messages %}{% if message['role'] == 'assistant' %}{% generation %}"
    "{{ '<|im_start|>assistant\n' + message['content'] + '<|im_end|>\n' }}{% endgeneration %}{% else %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}{% endif %}" + TAIL
)


def test_prompt_in_loss_reads_the_user_header_where_the_template_trains_its_generation_header(tmp_path):
    """The probe failed the alignment-handbook's SmolLM3 SFT recipe (4 of 4 rows "train on the prompt's generation
    header"): its template writes the header inside {% generation %}. The user's header is never trained there."""
    found = finding(chat_trainer(tmp_path, HEADER_INSIDE), "prompt_in_loss")
    assert (found.status, found.decided, found.value) == ("ok", "measured", 0.0), found.measured
    assert "user header" in found.measured


# --- accumulation on DPO and Reward -------------------------------------------------------------------------------


def varied_pairs(rows: int = 32) -> Dataset:
    """Every third chosen answer five times longer: micro-batches hold different numbers of chosen tokens."""
    return preference_pairs(rows, seed=0).map(
        lambda row, i: {"chosen": row["chosen"] * 5} if i % 3 == 0 else {}, with_indices=True
    )


def test_accumulation_covers_dpo_and_trips_on_its_per_micro_batch_sft_term(tokenizer, tmp_path):
    settings = {"gradient_accumulation_steps": 4, "per_device_train_batch_size": 2}
    rpo = finding(dpo(tokenizer, tmp_path, varied_pairs(), loss_type=["sigmoid", "sft"], **settings), "accumulation")
    sigmoid = finding(dpo(tokenizer, tmp_path, varied_pairs(), **settings), "accumulation")
    assert (rpo.status, rpo.decided) == ("fail", "measured") and rpo.value > 0.05
    assert "'sft'" in rpo.fix
    assert (sigmoid.status, sigmoid.decided) == ("ok", "measured") and sigmoid.value < 1e-5


def test_accumulation_covers_the_reward_trainer(tokenizer, tmp_path):
    reward = examples.reward_trainer(tokenizer, tmp_path, gradient_accumulation_steps=4, per_device_train_batch_size=2)
    found = finding(reward, "accumulation")
    assert (found.status, found.decided) == ("ok", "measured") and found.value < 1e-5


# --- the known-bugs entries that name the causes ------------------------------------------------------------------


def ids(probe, **facts):
    return [e["id"] for e in matching(Facts(**facts), probe)]


def test_the_qdora_entry_spans_trl_0_26_0_to_1_14_2_on_quantized_dora_only():
    """For the trainers that cast from 0.26.0 (SFT here; reward and GRPO in test_checkup_probes.py); a plain
    Trainer casts nothing."""
    dora = {"quantized": True, "peft": {"use_dora": True}, "trainer": "sft"}
    assert ids("stalled_update", versions={"trl": "0.26.0"}, **dora) == ["03-trl-qlora-casts-dora-magnitude"]
    assert ids("stalled_update", versions={"trl": "1.14.2"}, **dora) == ["03-trl-qlora-casts-dora-magnitude"]
    assert ids("stalled_update", versions={"trl": "0.25.1"}, **dora) == []
    assert ids("stalled_update", versions={"trl": "1.15.0"}, **dora) == []
    assert (
        ids("stalled_update", versions={"trl": "1.14.2"}, quantized=False, peft={"use_dora": True}, trainer="sft") == []
    )
    assert (
        ids("stalled_update", versions={"trl": "1.14.2"}, quantized=True, peft={"use_dora": False}, trainer="sft") == []
    )
    assert (
        ids("stalled_update", versions={"trl": "1.14.2"}, quantized=True, peft={"use_dora": True}, trainer="trainer")
        == []
    )


def test_the_chat_template_dict_entry_needs_trl_before_0_27_1_and_transformers_5():
    def window(trl, transformers):
        return ids("prompt_in_loss", trainer="sft", versions={"trl": trl, "transformers": transformers})

    assert window("0.24.0", "5.5.0") == ["02-trl-chat-template-dict-mask"]
    assert window("0.19.0", "5.0.0") == ["02-trl-chat-template-dict-mask"]
    assert window("0.27.1", "5.5.0") == [] and window("0.24.0", "4.57.6") == [] and window("0.18.2", "5.5.0") == []


def test_the_linear_attention_entry_needs_the_position_ids_only_flattening_collator():
    def entry(model_type, **collator_args):
        return ids(
            "packing", model_type=model_type, collator=["DataCollatorWithFlattening"], collator_args=collator_args
        )

    assert entry("qwen3_next", return_seq_idx=False) == ["01-linear-attention-ignores-position-ids"]
    assert entry("qwen3_5_text", return_seq_idx=False) == ["01-linear-attention-ignores-position-ids"]
    assert entry("qwen3_next", return_seq_idx=True) == [] and entry("llama", return_seq_idx=False) == []


@pytest.mark.parametrize("family", ["qwen3_next", "qwen3_5_text"])
def test_packing_fails_a_gated_deltanet_family_on_the_position_ids_only_collator(tmp_path, family):
    """transformers' own padding-free recipe (Trainer + DataCollatorWithFlattening()) on a tiny Gated DeltaNet model:
    the packing probe measures the leak and names the entry; Llama through the same collator passes."""
    tokenizer = build_tokenizer()
    leaky = finding(flattening_trainer(tokenizer, tmp_path, make_linear_attention_lm(tokenizer, family)), "packing")
    llama = finding(flattening_trainer(tokenizer, tmp_path, make_causal_lm(tokenizer)), "packing")
    assert (leaky.status, leaky.decided, leaky.known_bug) == (
        "fail",
        "measured",
        "01-linear-attention-ignores-position-ids",
    )
    assert leaky.value > 0.01
    assert (llama.status, llama.decided) == ("ok", "measured") and llama.value < 1e-5


def make_linear_attention_lm(tokenizer, family: str):
    """A tiny Gated DeltaNet model (three linear-attention layers, one full-attention layer), random init."""
    from transformers import AutoModelForCausalLM, Qwen3NextConfig
    from transformers.models.qwen3_5.configuration_qwen3_5 import Qwen3_5TextConfig

    sizes = {
        "vocab_size": len(tokenizer),
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "linear_num_key_heads": 2,
        "linear_num_value_heads": 4,
        "linear_key_head_dim": 16,
        "linear_value_head_dim": 16,
        "pad_token_id": tokenizer.pad_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "bos_token_id": None,
    }
    if family == "qwen3_next":
        experts = {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 64}
        config = Qwen3NextConfig(**sizes, **experts, shared_expert_intermediate_size=64)
    else:
        config = Qwen3_5TextConfig(**sizes)
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")


def flattening_trainer(tokenizer, out, model):
    from transformers import DataCollatorWithFlattening, Trainer, TrainingArguments

    rows = instruction_pairs(16, seed=0).map(
        lambda r: {"input_ids": tokenizer(r["prompt"] + r["completion"])["input_ids"] + [tokenizer.eos_token_id]},
        remove_columns=["prompt", "completion"],
    )
    rows = rows.map(lambda r: {"labels": list(r["input_ids"])})
    args = TrainingArguments(**examples.config_kwargs(out, per_device_train_batch_size=4, remove_unused_columns=False))
    return Trainer(model=model, args=args, train_dataset=rows, data_collator=DataCollatorWithFlattening())
