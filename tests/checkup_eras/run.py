"""``checkup(trainer)`` on an era's own trainers, in an environment holding that era's stack and the built wheel.

Usage: ``python run.py SET RESULT.json`` with the interpreter of a copy of ``.eras/ERA`` into which the wheel was
installed (tests/test_checkup_eras.py); SET names one of ``SCENARIOS``: the era, or the era and a lesson.
Standalone: it imports the era's torch, transformers and TRL, and only the library from trl_clinic
(``trl_clinic.checkup``), never the course. Each scenario builds one real trainer of the era (tiny models from
configs, a word-level tokenizer built in place, token ids drawn from a fixed seed) and runs the whole check-up on
it; the result holds each report and the versions, so the test reads what was measured there.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import io
import json
import random
import sys
import tempfile
import time
import warnings

import torch

VOCAB = 24  # a small vocabulary: GRPO's sampled completions meet EOS early, so some are right-padded
TEMPLATE = [3, 4]  # the response template's token ids (trl 0.14's completion-only collator)
OUT = tempfile.mkdtemp(prefix="checkup-era-")


def tokenizer(type_ids: bool = True):
    """A word-level tokenizer over the vocabulary; ``type_ids=False``: it returns no token_type_ids, as Qwen2's own
    tokenizer (``model_input_names``, tokenization_qwen2_fast.py:80 of transformers 4.48.3); trl 0.14.0's GRPO
    passes the tokenizer's whole output to ``generate``, where Qwen2 refuses token_type_ids."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit
    from transformers import PreTrainedTokenizerFast

    words = Tokenizer(WordLevel({f"t{i}": i for i in range(VOCAB)}, unk_token="t2"))
    words.pre_tokenizer = WhitespaceSplit()
    inputs = {} if type_ids else {"model_input_names": ["input_ids", "attention_mask"]}
    return PreTrainedTokenizerFast(
        tokenizer_object=words, pad_token="t0", eos_token="t1", unk_token="t2", padding_side="right", **inputs
    )


def model(
    family: str = "llama",
    attention: str = "sdpa",
    fa2_set: bool = False,
    use_cache: bool = True,
    dtype: torch.dtype = torch.float32,
    reward_head: bool = False,
    hidden_size: int = 32,
):
    """A tiny random model of ``family`` with its weights in ``dtype``; ``fa2_set``: loaded eager, then told it is
    FlashAttention-2, as lesson 04's era script does on transformers 4.51.3 (``lesson_04_padding_side/then.py``: the
    right-padding guard runs before any kernel); ``reward_head``: a sequence-classification model with one output
    (the ``score`` head a reward model trains) instead of a language model."""
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, LlamaConfig, Qwen2Config

    config_class = {"llama": LlamaConfig, "qwen2": Qwen2Config}[family]
    config = config_class(
        vocab_size=VOCAB,
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=None,
        tie_word_embeddings=True,
        use_cache=use_cache,
        **({"num_labels": 1} if reward_head else {}),
    )
    torch.manual_seed(0)
    auto = AutoModelForSequenceClassification if reward_head else AutoModelForCausalLM
    built = auto.from_config(config, attn_implementation="eager" if fa2_set else attention, torch_dtype=dtype)
    if fa2_set:
        built.config._attn_implementation = "flash_attention_2"
        if hasattr(built.model, "_attn_implementation"):  # transformers <= 4.41 read it once, at build time
            from transformers.models.qwen2 import modeling_qwen2

            built.model._attn_implementation = "flash_attention_2"
            for layer in built.model.layers:
                layer.self_attn.__class__ = modeling_qwen2.Qwen2FlashAttention2
    return built


def token_rows(n: int, label_counts: list[int] | None = None, seed: int = 0) -> list[list[int]]:
    """Rows of ``prompt, template, completion, eos``; completion lengths cycle through ``label_counts``."""
    rng = random.Random(seed)
    counts = label_counts or [rng.randrange(2, 12) for _ in range(n)]
    return [
        [rng.randrange(5, VOCAB) for _ in range(3)]
        + TEMPLATE
        + [rng.randrange(5, VOCAB) for _ in range(counts[i % len(counts)])]
        + [1]
        for i in range(n)
    ]


def common(**overrides) -> dict:
    return {
        "output_dir": OUT,
        "report_to": "none",
        "per_device_train_batch_size": 2,
        "max_steps": 1,
        "save_strategy": "no",
        "use_cpu": True,
        "seed": 0,
        "bf16": False,
        "disable_tqdm": True,
        **overrides,
    }


def padding_collator(pad: int = 0):
    """Right-pads input_ids with pad, labels with -100, and gives the attention mask: a user's own collator."""

    def collate(rows):
        width = max(len(r["input_ids"]) for r in rows)
        ids = [r["input_ids"] + [pad] * (width - len(r["input_ids"])) for r in rows]
        labels = [r["labels"] + [-100] * (width - len(r["labels"])) for r in rows]
        mask = [[1] * len(r["input_ids"]) + [0] * (width - len(r["input_ids"])) for r in rows]
        return {"input_ids": torch.tensor(ids), "labels": torch.tensor(labels), "attention_mask": torch.tensor(mask)}

    return collate


def plain_trainer(rows: list[list[int]], family: str = "llama", **settings):
    """transformers' Trainer, the loss on the completion (prompt and template masked)."""
    from datasets import Dataset
    from transformers import Trainer, TrainingArguments

    data = Dataset.from_dict({"input_ids": rows, "labels": [[-100] * 5 + r[5:] for r in rows]})
    return Trainer(
        model=model(family, **settings.pop("model", {})),
        args=TrainingArguments(**common(**settings)),
        train_dataset=data,
        data_collator=padding_collator(),
    )


def sft_trainer(rows: list[list[int]], collator=None, **settings):
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    keywords = (
        {"processing_class": tokenizer()}
        if "processing_class" in _parameters(SFTTrainer)
        else {"tokenizer": tokenizer()}
    )
    return SFTTrainer(
        model=model(),
        args=SFTConfig(**common(**settings)),
        train_dataset=Dataset.from_dict({"input_ids": rows}),
        data_collator=collator,
        **keywords,
    )


# a ChatML-like template over the word vocabulary: t3 opens a turn, t4/t5 name user/assistant, t6 ends a turn
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ 't3 ' + ('t4' if m['role'] == 'user' else 't5') + ' ' + m['content'] + ' t6 ' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ 't3 t5 ' }}{% endif %}"
)


def chat_tokenizer(type_ids: bool = True):
    words = tokenizer(type_ids)
    words.chat_template = CHAT_TEMPLATE
    return words


def chat_rows(rows: int = 16):
    """Conversational prompt-completion rows of random words."""
    from datasets import Dataset

    rng = random.Random(0)

    def text(n: int) -> str:
        return " ".join(f"t{rng.randrange(7, VOCAB)}" for _ in range(n))

    return Dataset.from_list(
        [
            {
                "prompt": [{"role": "user", "content": text(rng.randint(3, 8))}],
                "completion": [{"role": "assistant", "content": text(rng.randint(2, 6))}],
            }
            for _ in range(rows)
        ]
    )


def chat_sft_trainer(rows: int = 16):
    """SFTTrainer on conversational prompt-completion rows (TRL #6105's setting): its own tokenization splits
    prompt and completion with apply_chat_template."""
    from trl import SFTConfig, SFTTrainer

    return SFTTrainer(
        model=model(), args=SFTConfig(**common()), train_dataset=chat_rows(rows), processing_class=chat_tokenizer()
    )


def chat_sft_command_line() -> dict:
    """``trl-clinic checkup sft --config recipe.yaml --json`` (the console script the wheel installed) on the
    conversational scenario saved as local files: the era's own ``trl sft`` script builds the trainer. Its exit
    code, its JSON, and what it wrote to stderr."""
    import subprocess
    from pathlib import Path

    local = Path(OUT) / "command-line"
    model().save_pretrained(local / "model")
    chat_tokenizer().save_pretrained(local / "model")
    chat_rows().to_json(str(local / "data" / "train.jsonl"))
    settings = {k: v for k, v in common(output_dir=str(local / "out")).items() if k != "disable_tqdm"}
    recipe = {"model_name_or_path": str(local / "model"), "dataset_name": str(local / "data"), **settings}
    (local / "recipe.yaml").write_text(json.dumps(recipe))  # JSON is YAML
    script = Path(sys.executable).with_name("trl-clinic")
    command = [str(script), "checkup", "sft", "--config", str(local / "recipe.yaml"), "--json"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    out = done.stdout
    return {
        "exit_code": done.returncode,
        "report": json.loads(out[out.index("{") :]) if "{" in out else None,
        "stderr": done.stderr[-3000:],
    }


COMMAND_LINE = {"06-trl-0.24": chat_sft_command_line}  # the scenario sets where the command line runs too


def _parameters(cls) -> set[str]:
    import inspect

    return set(inspect.signature(cls.__init__).parameters)


def completion_only(padding_free: bool):
    from trl import DataCollatorForCompletionOnlyLM

    return DataCollatorForCompletionOnlyLM(TEMPLATE, tokenizer=tokenizer(), padding_free=padding_free)


def flattening():
    from transformers import DataCollatorWithFlattening

    return DataCollatorWithFlattening()


def preference_rows(n: int = 8) -> dict[str, list[str]]:
    rng = random.Random(1)

    def words(k):
        return " ".join(f"t{rng.randrange(5, VOCAB)}" for _ in range(k))

    return {
        "prompt": [words(3) for _ in range(n)],
        "chosen": [words(rng.randrange(1, 6)) for _ in range(n)],
        "rejected": [words(rng.randrange(1, 6)) for _ in range(n)],
    }


def dpo_trainer(**model_settings):
    from datasets import Dataset
    from trl import DPOConfig, DPOTrainer

    rows = Dataset.from_dict(preference_rows())
    return DPOTrainer(
        model=model("qwen2", **model_settings),
        ref_model=model("qwen2", **model_settings),
        args=DPOConfig(**common(max_length=32, max_prompt_length=16)),
        train_dataset=rows,
        eval_dataset=rows,
        processing_class=tokenizer(),
    )


def spread(completions, **kwargs):
    """A reward that differs within a group: the completion's length in characters."""
    return [float(len(c)) for c in completions]


def spread_of_its_time(prompts, completions):
    """``spread`` with only the arguments trl 0.14.0 passes (its grpo_trainer.py:494, a dataset of prompts alone):
    a reward function of that version's time, which nothing may call with more."""
    return spread(completions)


def the_same(completions, **kwargs):
    """A reward that ignores the completion: every completion of every group gets 1."""
    return [1.0 for _ in completions]


def spread_of_messages(prompts, completions, **kwargs):
    """``spread`` on conversational rows, as trl 0.14.0 passes them (grpo_trainer.py:465-466): each prompt a list of
    messages, each completion one assistant message, whose content's length it is. ``spread`` would give every
    completion 1 there (a list of one message), and a completion passed as text makes this raise."""
    assert all(isinstance(p, list) and p[0]["role"] == "user" for p in prompts), prompts
    return [float(len(c[0]["content"])) for c in completions]


def grpo_trainer(reward=spread, chat: bool = False, words=None, **settings):
    """GRPOTrainer on a tiny Qwen2 policy, 4 generations of up to 12 tokens a prompt. ``per_device_train_batch_size``
    counts prompts on trl 0.14.0 (4 prompts, 16 completions a micro-batch) and completions from 0.15.0 on (its
    grpo_trainer.py:341-350 divides the global batch by ``num_generations``: 1 prompt). ``chat``: conversational
    prompts (one user message each) and a tokenizer with ``CHAT_TEMPLATE``, which TRL applies to them; ``words``: the
    tokenizer, where another is meant."""
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    texts = preference_rows()["prompt"]
    rows = [[{"role": "user", "content": text}] for text in texts] if chat else texts
    prompts = Dataset.from_dict({"prompt": rows})
    sizes = {"per_device_train_batch_size": 4, "num_generations": 4, "max_completion_length": 12}
    config = GRPOConfig(**common(**sizes, **{"max_prompt_length": 16, **settings}))
    return GRPOTrainer(
        model=model("qwen2"),
        reward_funcs=reward,
        args=config,
        train_dataset=prompts,
        processing_class=words or (chat_tokenizer if chat else tokenizer)(type_ids=False),
    )


def reward_trainer(dtype: torch.dtype, **settings):
    """RewardTrainer on a tiny Llama reward model with its weights in ``dtype`` and LoRA r=8 with
    ``task_type="SEQ_CLS"`` (the trainable ``score`` head keeps the weights' dtype), passed as ``peft_config=`` (trl
    0.14.0's reward_trainer.py:166 wraps the model with get_peft_model). Hidden size 64, lesson 03's cpu model's: at
    32 the first step's head gradient (32 elements, seed 0) has no element small enough for fp16 AdamW to turn
    non-finite, and the real run stays finite too (measured once in the era: grad norms 0.80, 0.48, 1.07), so the
    probe's ok there was right. trl 0.14's RewardTrainer tokenizes ``chosen`` and ``rejected`` only, so each holds
    its prompt (the implicit-prompt form)."""
    from datasets import Dataset
    from peft import LoraConfig
    from trl import RewardConfig, RewardTrainer

    rows = preference_rows(16)
    pairs = Dataset.from_dict(
        {
            side: [f"{prompt} {answer}" for prompt, answer in zip(rows["prompt"], rows[side])]
            for side in ("chosen", "rejected")
        }
    )
    return RewardTrainer(
        model=model(dtype=dtype, reward_head=True, hidden_size=64),
        args=RewardConfig(**common(max_length=32, **settings)),
        train_dataset=pairs,
        processing_class=tokenizer(),
        peft_config=LoraConfig(r=8, task_type="SEQ_CLS"),
    )


# TRL #2367's settings (lesson 03): batch 1 x accumulation 8, non-fused AdamW, no mixed precision
REPORT_03 = {"per_device_train_batch_size": 1, "gradient_accumulation_steps": 8, "optim": "adamw_torch"}


def reward_defaults() -> dict:
    """What the era's RewardConfig selects when the user names no optimizer: transformers 4.48.3's
    ``default_optim`` (training_args.py:1273) is still "adamw_torch", the non-fused AdamW of TRL #2367's
    report; transformers 5.23.0 selects "adamw_torch_fused" on torch >= 2.8 (training_args.py:806-811)."""
    from trl import RewardConfig

    optim = RewardConfig(output_dir=OUT).optim
    return {"optim": str(getattr(optim, "value", optim))}


def reward_runs() -> dict:
    """The grad norms the era's own training logs in the first two optimizer steps of the lesson 03 trainer in
    float16 and in float32: the runs the check-up's fp16_adamw measured before."""
    norms = {}
    for dtype in (torch.float16, torch.float32):
        trainer = reward_trainer(dtype, **REPORT_03, max_steps=2, logging_steps=1)
        with contextlib.redirect_stdout(io.StringIO()):
            trainer.train()
        norms[str(dtype).removeprefix("torch.")] = [
            row["grad_norm"] for row in trainer.state.log_history if "grad_norm" in row
        ]
    return norms


def known_bugs_for_2906() -> dict:
    """The known-bugs table's entries that nothing here measures, matched on the era's GRPO trainer with and
    without ``bf16=True``: as read on this machine (no GPU), and with the facts no CPU has put in, TRL #2906's
    device (an NVIDIA H20) and the cuBLAS the table names as bad (nvidia-cublas-cu12 12.1.3.1). The args (bf16)
    are read from the era's GRPOConfig either way."""
    from dataclasses import replace

    from trl_clinic.checkup.known_bugs import Facts, matching
    from trl_clinic.checkup.view import TrainerView

    found = {}
    for bf16 in (True, False):
        facts = Facts.from_view(TrainerView(grpo_trainer(bf16=bf16)))
        on_h20 = replace(facts, gpu_name="NVIDIA H20", versions={"nvidia-cublas-cu12": "12.1.3.1"})
        found[f"bf16={bf16}"] = {
            "here": [entry["id"] for entry in matching(facts)],
            "gpu_name here": facts.gpu_name,
            "on an H20 with cuBLAS 12.1.3.1": [entry["id"] for entry in matching(on_h20)],
        }
    return found


def qlora_trainer(use_dora: bool):
    """SFTTrainer on a tiny Llama loaded in 4 bits (bitsandbytes' NF4 on the CPU) with a LoRA adapter, DoRA or not,
    at lr 2e-4 (TRL #7268's setting): trl 1.14.2 casts every trainable tensor to bfloat16 after building it."""
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig
    from trl import SFTConfig, SFTTrainer

    folder = tempfile.mkdtemp(prefix="qlora-", dir=OUT)
    model(hidden_size=64).save_pretrained(folder)
    quantized = AutoModelForCausalLM.from_pretrained(
        folder,
        quantization_config=BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_compute_dtype=torch.bfloat16),
        dtype=torch.bfloat16,
    )
    return SFTTrainer(
        model=quantized,
        args=SFTConfig(**common(learning_rate=2e-4, bf16=True)),
        train_dataset=Dataset.from_dict({"input_ids": token_rows(16)}),
        processing_class=tokenizer(),
        peft_config=LoraConfig(r=8, target_modules="all-linear", use_dora=use_dora),
    )


def bos_chat_tokenizer(type_ids: bool = True):
    """``chat_tokenizer`` that adds a BOS to every text it tokenizes, and whose template writes one too, as Llama 3's
    does: t2 stands for it (the vocabulary has no spare word)."""
    from tokenizers.processors import TemplateProcessing

    words = chat_tokenizer(type_ids)
    words._tokenizer.post_processor = TemplateProcessing(single="t2 $A", special_tokens=[("t2", 2)])
    words.bos_token = "t2"
    words.chat_template = "{{ bos_token + ' ' }}" + CHAT_TEMPLATE
    return words


def generation_prompts(max_prompt_length: int) -> dict:
    """The prompt ids and mask equal_rewards' own path (TRL < 0.16) generates from, and those trl 0.14.0's own
    ``compute_loss`` generates from, for the same conversational rows, with a tokenizer that adds a BOS where its
    template writes one already."""
    from trl_clinic.checkup.grpo import group_rewards
    from trl_clinic.checkup.view import TrainerView

    words = bos_chat_tokenizer(type_ids=False)
    trainer = grpo_trainer(spread_of_messages, chat=True, words=words, max_prompt_length=max_prompt_length)
    seen, generate = [], trainer.model.generate

    def recording(**inputs):
        seen.append({"input_ids": inputs["input_ids"].tolist(), "attention_mask": inputs["attention_mask"].tolist()})
        return generate(**inputs)

    trainer.model.generate = recording
    view = TrainerView(trainer)
    group_rewards(view)
    trainer.compute_loss(trainer.model, view.grpo_prompts(4))
    probe, trl = seen
    return {"probe": probe, "trl": trl}


def prompts_cut_and_whole() -> dict:
    """``generation_prompts`` where ``max_prompt_length`` keeps the whole prompts (16) and where it cuts them (6)."""
    return {f"max_prompt_length={limit}": generation_prompts(limit) for limit in (16, 6)}


ALSO = {  # what a scenario set reads besides the check-up's reports
    "01-trl-0.14, lesson 03": {"defaults": reward_defaults, "grad_norms": reward_runs},
    "01-trl-0.14, lesson 05": {"known_bugs": known_bugs_for_2906, "generation_prompts": prompts_cut_and_whole},
}


# Each era's trainers: the bug as the era shipped it, and the healthy setting of the same era. A set is named for
# its era, or for the era and a lesson where one era holds several lessons' stacks (one process per set).
SCENARIOS = {
    "02-transformers-4.45": {
        # examples with 2, 4, 8 and 16 label tokens at batch 1 x accumulation 4
        "accumulation, unequal micro-batches": lambda: plain_trainer(
            token_rows(4, [2, 4, 8, 16]), per_device_train_batch_size=1, gradient_accumulation_steps=4
        ),
        "accumulation, equal micro-batches": lambda: plain_trainer(
            token_rows(4, [8]), per_device_train_batch_size=1, gradient_accumulation_steps=4
        ),
        "no accumulation": lambda: plain_trainer(token_rows(8), per_device_train_batch_size=4),
    },
    "01-trl-0.14": {
        "completion-only collator, padding_free=True": lambda: sft_trainer(
            token_rows(16), completion_only(True), per_device_train_batch_size=4, gradient_accumulation_steps=2
        ),
        "DataCollatorWithFlattening": lambda: sft_trainer(token_rows(16), flattening(), per_device_train_batch_size=4),
        "completion-only collator, padded": lambda: sft_trainer(
            token_rows(16), completion_only(False), per_device_train_batch_size=4, gradient_accumulation_steps=2
        ),
    },
    "01-transformers-4.55": {
        "SFTConfig(padding_free=True)": lambda: sft_trainer(
            token_rows(16),
            padding_free=True,
            max_length=None,
            per_device_train_batch_size=4,
            gradient_accumulation_steps=2,
        ),
        "SFTConfig(padding_free=False)": lambda: sft_trainer(
            token_rows(16), per_device_train_batch_size=4, gradient_accumulation_steps=2
        ),
    },
    "04-transformers-4.51": {
        "DPO, Qwen2 with flash_attention_2 set": lambda: dpo_trainer(fa2_set=True),
        "DPO, Qwen2 on sdpa": lambda: dpo_trainer(),
        "DPO, Qwen2 on sdpa, use_cache=False": lambda: dpo_trainer(use_cache=False),
        "GRPO, Qwen2 on sdpa": grpo_trainer,
    },
    "06-trl-0.24": {
        "SFT, conversational prompt-completion": chat_sft_trainer,
    },
    # lesson 03 (TRL #2367, filed on trl 0.12): fp16 weights, LoRA SEQ_CLS, a non-fused AdamW
    "01-trl-0.14, lesson 03": {
        "RewardTrainer, float16 weights": lambda: reward_trainer(torch.float16, **REPORT_03),
        "RewardTrainer, float32 weights": lambda: reward_trainer(torch.float32, **REPORT_03),
    },
    # lesson 05 (TRL #2906, filed on trl 0.14.0 with bf16=True)
    "01-trl-0.14, lesson 05": {
        "GRPO, a reward with spread": grpo_trainer,
        "GRPO, the same reward for every completion": lambda: grpo_trainer(the_same),
        "GRPO, a reward with spread, bf16=True": lambda: grpo_trainer(bf16=True),
        "GRPO, a reward taking prompts and completions only": lambda: grpo_trainer(spread_of_its_time),
        "GRPO, conversational prompts, a reward with spread": lambda: grpo_trainer(spread_of_messages, chat=True),
        "GRPO, conversational prompts, the same reward": lambda: grpo_trainer(the_same, chat=True),
    },
    # TRL #7268: QLoRA with DoRA, trl 1.14.2's cast of every trainable tensor to bfloat16
    "08-trl-1.14": {
        "SFT, 4-bit Llama, DoRA": lambda: qlora_trainer(use_dora=True),
        "SFT, 4-bit Llama, LoRA": lambda: qlora_trainer(use_dora=False),
    },
    "04-transformers-4.40": {
        # completions of 2 and 6 tokens: the first batch's shorter row ends in padding
        "Trainer, Qwen2 with flash_attention_2 set": lambda: plain_trainer(
            token_rows(8, [2, 6]), family="qwen2", model={"fa2_set": True}
        ),
        "Trainer, Qwen2 on sdpa": lambda: plain_trainer(token_rows(8, [2, 6]), family="qwen2"),
        "Trainer, Qwen2 on sdpa, use_cache=False": lambda: plain_trainer(
            token_rows(8, [2, 6]), family="qwen2", model={"use_cache": False}
        ),
    },
}


def main(scenarios: str, result_path: str) -> None:
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    from trl_clinic import checkup

    reports, start = {}, time.perf_counter()
    for name, build in SCENARIOS[scenarios].items():
        began = time.perf_counter()
        trainer = build()
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):  # the table a user reads, printed by the era's stack
            report = checkup(trainer)
        reports[name] = {
            **report.to_dict(),
            "printed": printed.getvalue(),
            "seconds_with_build": round(time.perf_counter() - began, 2),
        }
    command_line = COMMAND_LINE[scenarios]() if scenarios in COMMAND_LINE else None
    also = {name: read() for name, read in ALSO.get(scenarios, {}).items()}
    versions = {name: importlib.metadata.version(name) for name in ("torch", "transformers", "trl", "trl-clinic")}
    course = sorted(m for m in sys.modules if m.startswith("trl_clinic.course"))
    with open(result_path, "w") as out:
        json.dump(
            {
                "scenarios": scenarios,
                "versions": versions,
                "reports": reports,
                "command_line": command_line,
                "also": also,
                "course_modules": course,
                "seconds": round(time.perf_counter() - start, 2),
            },
            out,
            indent=1,
        )


if __name__ == "__main__":
    main(*sys.argv[1:3])
