"""Tiny models of the recipes' families, built offline: the family's own model class at a few thousand parameters, and
a tokenizer that behaves as the checkpoint's does where the probes look (its special tokens, BOS/EOS/pad, whether it
adds BOS, its chat template, its generation config's EOS ids) over a small byte-level vocabulary.

What stays the checkpoint's: the architecture (``AutoConfig.for_model(model_type)`` with the family's defaults, only the
sizes in ``TINY``), the special tokens and which of them are BOS, EOS and pad, and the chat template. The templates
come from TRL 1.16.0's wheel (``trl/chat_templates/*.jinja``: "original templates ... used for identity comparison",
so byte for byte the checkpoints' own), from the recipe itself where it sets one (the alignment-handbook's and
open-r1's ``chat_template``), or for a checkpoint trained by another recipe of the zoo, from that recipe. The
tokenizer facts are those of the checkpoints' ``tokenizer_config.json`` and ``generation_config.json`` on the Hub,
read when the zoo was written, not machine-checked here (the Hub is not reachable from the tests); ``CHECKPOINTS``
names each. What is not the checkpoint's: the vocabulary (the course's 1024-token BPE plus the special tokens) and
the weights (random, seeded).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field, replace
from importlib.resources import files
from pathlib import Path

CHATML = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + "
    "'\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
# the sizes every tiny model takes, over its family's defaults: a CPU check-up in seconds
TINY = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": 2048,
}
# family-specific settings a tiny model needs to build (MoE sizes, sliding windows inside the tiny length)
FAMILY_SIZES = {
    "mixtral": {"num_local_experts": 4, "num_experts_per_tok": 2},
    "gemma2": {"sliding_window": 256},
    "gemma3_text": {"sliding_window": 256},
    "cohere2": {"sliding_window": 256},
    "starcoder2": {"sliding_window": None},
}


@dataclass(frozen=True)
class Tokens:
    """A checkpoint's tokenizer where the probes look."""

    special: tuple[str, ...]  # every special (added) token: the template's markers among them
    eos: str
    bos: str | None = None
    pad: str | None = None
    unk: str | None = None
    add_bos: bool = False  # the tokenizer's post-processor puts BOS first (Llama 3, Mistral, Gemma)
    template: str | None = None  # "trl:<name>" (TRL's wheel), "chatml", "recipe:<collection>/<name>", or None
    generation_eos: tuple[str, ...] = ()  # generation_config.json's eos_token_id, as tokens (empty: the EOS alone)


CHATML_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
LLAMA3_TOKENS = ("<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>")
LLAMA3_TOKENS += ("<|eom_id|>", "<|python_tag|>", "<|finetune_right_pad_id|>")
QWEN_TOKENS = CHATML_TOKENS + ("<tool_call>", "</tool_call>", "<|vision_start|>", "<|vision_end|>")
GEMMA_TOKENS = ("<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>")
PHI3_TOKENS = ("<unk>", "<s>", "</s>", "<|endoftext|>", "<|assistant|>", "<|system|>", "<|end|>", "<|user|>")
MISTRAL_TOKENS = ("<unk>", "<s>", "</s>")
COHERE_TOKENS = ("<PAD>", "<UNK>", "<BOS_TOKEN>", "<EOS_TOKEN>", "<|START_OF_TURN_TOKEN|>", "<|END_OF_TURN_TOKEN|>")
COHERE_TOKENS += ("<|USER_TOKEN|>", "<|CHATBOT_TOKEN|>", "<|SYSTEM_TOKEN|>", "<|START_RESPONSE|>", "<|END_RESPONSE|>")
COHERE_TOKENS += ("<|START_THINKING|>", "<|END_THINKING|>", "<|START_ACTION|>", "<|END_ACTION|>")
COHERE_TOKENS += ("<|START_TOOL_RESULT|>", "<|END_TOOL_RESULT|>", "<|START_TEXT|>", "<|END_TEXT|>")
DEEPSEEK_TOKENS = (
    "<｜begin▁of▁sentence｜>",
    "<｜end▁of▁sentence｜>",
    "<｜User｜>",
    "<｜Assistant｜>",
    "<think>",
    "</think>",
)
DEEPSEEK_TOKENS += ("<｜▁pad▁｜>",)

# each family's base checkpoint as most recipes load it; CHECKPOINTS below names the ones that differ
FAMILIES: dict[str, Tokens] = {
    "llama": Tokens(LLAMA3_TOKENS, "<|end_of_text|>", "<|begin_of_text|>", add_bos=True, template="trl:llama3_2"),
    "mistral": Tokens(MISTRAL_TOKENS, "</s>", "<s>", unk="<unk>", add_bos=True),
    "mixtral": Tokens(MISTRAL_TOKENS, "</s>", "<s>", unk="<unk>", add_bos=True),
    "qwen2": Tokens(QWEN_TOKENS, "<|endoftext|>", pad="<|endoftext|>", template="trl:qwen2_5"),
    "qwen3": Tokens(QWEN_TOKENS + ("<think>", "</think>"), "<|im_end|>", pad="<|endoftext|>", template="trl:qwen3"),
    "gemma": Tokens(GEMMA_TOKENS, "<eos>", "<bos>", "<pad>", "<unk>", add_bos=True, template="trl:gemma"),
    "gemma2": Tokens(GEMMA_TOKENS, "<eos>", "<bos>", "<pad>", "<unk>", add_bos=True, template="trl:gemma"),
    "gemma3_text": Tokens(
        GEMMA_TOKENS,
        "<eos>",
        "<bos>",
        "<pad>",
        "<unk>",
        add_bos=True,
        template="trl:gemma3",
        generation_eos=("<eos>", "<end_of_turn>"),
    ),  # fmt: skip
    "phi3": Tokens(
        PHI3_TOKENS,
        "<|endoftext|>",
        "<s>",
        "<|endoftext|>",
        "<unk>",
        template="trl:phi3",
        generation_eos=("<|endoftext|>", "<|assistant|>", "<|end|>"),
    ),  # fmt: skip
    "starcoder2": Tokens(("<|endoftext|>",), "<|endoftext|>", "<|endoftext|>", unk="<|endoftext|>"),
    "cohere2": Tokens(
        COHERE_TOKENS, "<|END_OF_TURN_TOKEN|>", "<BOS_TOKEN>", "<PAD>", "<UNK>", add_bos=True, template="trl:cohere2"
    ),
    "smollm3": Tokens(
        CHATML_TOKENS + ("<think>", "</think>"),
        "<|im_end|>",
        pad="<|im_end|>",
        template="recipe:alignment-handbook/smollm3-sft",
    ),  # fmt: skip
}

INSTRUCT_QWEN = {"eos": "<|im_end|>", "generation_eos": ("<|im_end|>", "<|endoftext|>")}
SMOLLM = {"special": CHATML_TOKENS, "eos": "<|endoftext|>", "bos": "<|endoftext|>", "pad": None, "template": "chatml"}
SMOLLM_INSTRUCT = {**SMOLLM, "eos": "<|im_end|>", "bos": "<|im_start|>", "pad": "<|im_end|>"}
CHATML_MISTRAL = {"special": MISTRAL_TOKENS + ("<|im_start|>", "<|im_end|>"), "eos": "<|im_end|>", "template": "chatml"}
# checkpoints whose tokenizer differs from their family's base (an instruct tokenizer, a template another recipe set)
CHECKPOINTS: dict[str, dict] = {
    "Qwen/Qwen2-0.5B-Instruct": INSTRUCT_QWEN,
    "Qwen/Qwen2.5-0.5B-Instruct": INSTRUCT_QWEN,
    "Qwen/Qwen2.5-1.5B-Instruct": INSTRUCT_QWEN,
    "Qwen/Qwen2.5-Coder-7B-Instruct": INSTRUCT_QWEN,
    "Qwen/Qwen2.5-Coder-32B-Instruct": INSTRUCT_QWEN,
    "Qwen/Qwen3-4B-Instruct-2507": {"template": "trl:qwen3_instruct_2507"},
    "trl-lib/qwen1.5-1.8b-sft": {"template": "chatml", "eos": "<|im_end|>"},
    "deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B": {
        "special": DEEPSEEK_TOKENS,
        "eos": "<｜end▁of▁sentence｜>",
        "bos": "<｜begin▁of▁sentence｜>",
        "pad": "<｜end▁of▁sentence｜>",
        "add_bos": True,
        "template": "trl:deepseek_r1_distill",
    },
    "HuggingFaceTB/SmolLM-360M": SMOLLM,
    "HuggingFaceTB/SmolLM2-1.7B": SMOLLM,
    "HuggingFaceTB/SmolLM2-135M": SMOLLM,
    "HuggingFaceTB/SmolLM-135M-Instruct": SMOLLM_INSTRUCT,
    "loubnabnl/smollm2-1.7B-sft": SMOLLM_INSTRUCT,
    "NousResearch/Llama-3.2-1B": {},
    "meta-llama/Llama-3.2-1B": {},
    "casperhansen/llama-3-70b-fp16": {"template": "trl:llama3_1"},
    "teknium/OpenHermes-2.5-Mistral-7B": CHATML_MISTRAL,
    "alignment-handbook/zephyr-7b-sft-full": {"template": "recipe:alignment-handbook/zephyr-7b-beta-sft-full"},
    "alignment-handbook/zephyr-7b-sft-qlora": {"template": "recipe:alignment-handbook/zephyr-7b-beta-sft-qlora"},
    "alignment-handbook/mistral-7b-sft-constitutional-ai": {
        "template": "recipe:alignment-handbook/constitutional-ai-sft-anthropic"
    },
    "HuggingFaceH4/zephyr-7b-gemma-sft-v0.1": {"template": "recipe:alignment-handbook/zephyr-7b-gemma-sft"},
    "HuggingFaceH4/starchat2-15b-sft-v0.1": {"template": "recipe:alignment-handbook/starchat2-15b-sft"},
    "Skywork/Skywork-Reward-V2-Qwen3-8B": {"template": "trl:qwen3"},
}


def tokens_of(family: str, model: str) -> Tokens:
    """The tokenizer facts of checkpoint ``model`` of ``family``."""
    if family not in FAMILIES:
        raise ValueError(f"no tiny model for family {family!r}: choose one of {', '.join(FAMILIES)}")
    return replace(FAMILIES[family], **CHECKPOINTS.get(model, {}))


def template_text(source: str | None, recipes: Path) -> str | None:
    """The chat template ``source`` names: TRL's wheel, ChatML, or another zoo recipe's ``chat_template``."""
    if source is None:
        return None
    if source == "chatml":
        return CHATML
    kind, _, name = source.partition(":")
    if kind == "trl":
        return files("trl").joinpath("chat_templates", f"{name}.jinja").read_text()
    if kind == "recipe":
        import yaml

        return yaml.safe_load((recipes / f"{name}.yaml").read_text())["settings"]["chat_template"]
    raise ValueError(f"unknown template source {source!r}")


@dataclass
class Built:
    folder: Path
    tokens: Tokens
    template: str | None
    notes: list[str] = field(default_factory=list)


def build(family: str, model: str, template: str | None, cache: Path, seed: int = 0) -> Built:
    """A tiny ``family`` model and its tokenizer, saved under ``cache`` (once per family, checkpoint, template and
    seed): a folder ``from_pretrained`` loads offline."""
    import torch
    from tokenizers import processors
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig, PreTrainedTokenizerFast

    from trl_clinic.course.tokenizer import build_tokenizer

    tokens = tokens_of(family, model)
    key = hashlib.sha256(json.dumps([family, model, template, seed, TINY]).encode()).hexdigest()[:12]
    folder = cache / f"{family}-{key}"
    built = Built(folder, tokens, template)
    if (folder / "config.json").exists():
        return built
    base = build_tokenizer()
    inner = base.backend_tokenizer
    inner.add_special_tokens([t for t in tokens.special if t not in base.get_vocab()])
    if tokens.add_bos and tokens.bos:
        bos_id = inner.token_to_id(tokens.bos)
        inner.post_processor = processors.TemplateProcessing(
            single=f"{tokens.bos} $A", pair=f"{tokens.bos} $A {tokens.bos} $B", special_tokens=[(tokens.bos, bos_id)]
        )
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=inner,
        bos_token=tokens.bos,
        eos_token=tokens.eos,
        pad_token=tokens.pad,
        unk_token=tokens.unk,
        chat_template=template,
        model_max_length=TINY["max_position_embeddings"],
    )
    bos = tokenizer.convert_tokens_to_ids(tokens.bos) if tokens.bos else None
    eos = tokenizer.convert_tokens_to_ids(tokens.eos)
    config = AutoConfig.for_model(
        family,
        vocab_size=len(tokenizer),
        bos_token_id=bos,
        eos_token_id=eos,
        pad_token_id=tokenizer.pad_token_id,
        **TINY,
        **FAMILY_SIZES.get(family, {}),
    )
    torch.manual_seed(seed)
    network = AutoModelForCausalLM.from_config(config)
    network.generation_config = GenerationConfig(
        bos_token_id=bos,
        eos_token_id=[tokenizer.convert_tokens_to_ids(t) for t in tokens.generation_eos] or eos,
        pad_token_id=tokenizer.pad_token_id,
    )
    partial = folder.with_name(folder.name + ".partial")
    network.save_pretrained(partial)
    tokenizer.save_pretrained(partial)
    partial.rename(folder)  # whole or absent: a parallel build never reads half a folder
    return built
