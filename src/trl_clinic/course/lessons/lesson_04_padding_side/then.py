"""Lesson 04 then: Qwen2 + FlashAttention-2 right padding, on the real old transformers, in two eras.

The guard that raises ``ValueError: You are attempting to perform batched generation with
padding_side='right' ...`` lived in two windows of transformers' ``models/qwen2/modeling_qwen2.py``
(read in the released files of 4.37.0, 4.38.2, 4.39.3, 4.40.2, 4.41.2, 4.42.0, 4.42.4, 4.43.4, 4.44.2,
4.45.2, 4.46.3, 4.47.1, 4.48.3, 4.49.0, 4.50.3, 4.51.3, 4.52.4 and 4.53.0):

* 4.37.0-4.41.2, ``Qwen2Model.forward``: FlashAttention-2 (``self._attn_implementation``, set from the
  config when the model is built), an attention mask, ``use_cache`` (the argument, else the config's)
  and a right-padded row. Era ``04-transformers-4.40`` (transformers 4.40.2, trl 0.8.6).
* 4.49.0-4.52.4, ``Qwen2Model._update_causal_mask``: the config's ``flash_attention_2``, an attention
  mask, a cache object and a right-padded row. ``Qwen2Model.forward`` creates the cache when
  ``use_cache`` (the argument, else the config's) is on, and turns it off only under gradient
  checkpointing in training (4.51.3 modeling_qwen2.py lines 494-498). Era ``04-transformers-4.51``
  (transformers 4.51.3, trl 0.17.0, the report's versions; trl 0.17.0's dpo_trainer.py passes no
  ``use_cache``, and its DPOConfig leaves ``gradient_checkpointing`` at TrainingArguments' False).

Both checks run before any attention kernel, so they raise on CPU. What is real and what is re-created:
the old TRL and transformers run for real up to the kernel call, the guard included; the model's state is
RE-CREATED: the tiny Qwen2 is built (or loaded) with eager attention and then told it is FlashAttention-2
(``as_flash_attention_2``), as loading with FlashAttention-2 on a GPU leaves it (the config; on 4.40 also
``Qwen2Model._attn_implementation`` and the layers' ``Qwen2FlashAttention2`` class), because flash-attn
needs a CUDA GPU. A forward that gets past the check then needs the flash-attn package, which this CPU
machine has not: transformers imports ``_flash_supports_window_size`` and the kernels only when flash-attn
is installed (4.51.3 modeling_flash_attention_utils.py lines 35-51), so the next error is
``NameError: name '_flash_supports_window_size' is not defined``: a run "past the check" is shown up to the
kernel call, never to its end. Each outcome says which it was: ``guard`` (the ValueError),
``missing_flash_kernel`` (that NameError: past the check), ``finished`` or ``other`` (anything else, never
counted as past the check). ``cache_audit`` alone tells the model nothing: the real DPOTrainer evaluates a
plain (eager) Qwen2 while forward hooks count the right-padded rows for which the model built a KV cache.

Usage: ``python then.py SPEC.json RESULT.json`` with the era's interpreter. The spec may
set ``seed`` (default 0), ``eval_batch_size`` (default 1, the report's), ``threads``, ``scenarios`` (names
of SCENARIOS, default all the era's trl supports) and ``direct_forward`` (default true).

``direct_forward``: one forward of a chosen/rejected pair stacked as DPO stacks it, right-padded with and
without the cache, and left-padded with it. ``scenarios``: the era's real ``DPOTrainer``, each with a fresh
model; see SCENARIOS. For each outcome: the error's type, message, file, function and line (the
traceback's last frame), the library frames and the traceback. Standalone: it must not import ``trl_clinic``.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import inspect
import json
import sys
import tempfile
import time
import traceback
import warnings
from pathlib import Path

import torch

GUARD = "You are attempting to perform batched generation with padding_side='right'"
FLASH_ATTN_INSTALLED = importlib.util.find_spec("flash_attn") is not None
WORDS = (
    "the cat dog sat ran on mat rug a big small red blue fast slow and then home park tree "
    "good bad yes no it is was very"
).split()
# chosen and rejected of different lengths: the stacked batch of one pair is right-padded
PAIRS = [
    ("the cat sat on", "the mat and then", "a dog"),
    ("a big dog ran to", "the park", "home and then the tree was very big"),
    ("is it", "yes it is", "no"),
    ("the red cat", "was very fast and good", "slow"),
]
# what each scenario changes from the report's setup (trl 0.17: DPOConfig defaults, a model instance); each
# "..._no_cache" is its scenario with the fix, model.config.use_cache = False, and nothing else changed
SCENARIOS = {
    "as_reported": "evaluate(), DPOConfig defaults",
    "as_reported_no_cache": "evaluate(), model.config.use_cache = False on the model instance",
    "train_defaults": "train(), DPOConfig defaults: the first training step",
    "train_defaults_no_cache": "train(), the first training step, model.config.use_cache = False",
    "train_checkpointing": "train() with DPOConfig(gradient_checkpointing=True), its first step; then evaluate() "
    "(the model in eval mode)",
    "train_checkpointing_no_cache": "the same with model.config.use_cache = False",
    "tokenizer_left": "evaluate(), tokenizer.padding_side = 'left' (the message's advice)",
    "tokenizer_left_no_cache": "evaluate(), tokenizer.padding_side = 'left' and model.config.use_cache = False",
    "path_defaults": "evaluate(), a model path (TRL loads the policy and the reference), no model_init_kwargs",
    "path_model_init_kwargs": "evaluate(), a model path and DPOConfig(model_init_kwargs={'use_cache': False})",
    "explicit_ref_path": "evaluate(), the same and ref_model=<path> (no ref_model_init_kwargs)",
    "explicit_ref_path_fixed": "evaluate(), the same and ref_model=<path>, ref_model_init_kwargs={'use_cache': False}",
    "padding_free": "evaluate(), DPOConfig(padding_free=True)",
    "cache_audit": "evaluate() of a plain eager Qwen2 (not told it is FlashAttention-2), DPOConfig defaults: the "
    "forwards of the policy and the reference model counted",
}
DIRECT = {
    "right": "one forward of a stacked pair, right-padded, use_cache=True",
    "right_no_cache": "the same forward with use_cache=False",
    "left": "the same pair left-padded, use_cache=True",
}
NEEDS_DPO_CONFIG = set(SCENARIOS) - {"as_reported", "as_reported_no_cache", "tokenizer_left", "tokenizer_left_no_cache"}


def tiny_tokenizer(bos: bool = False):
    """A word-level tokenizer built in place (nothing downloaded); pad and eos are their own tokens, and
    so is bos when asked (trl 0.8.6's DPO prepends ``bos_token_id`` to every prompt, even when None)."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit
    from transformers import PreTrainedTokenizerFast

    vocab = {token: i for i, token in enumerate(["<pad>", "<eos>", "<unk>", *(["<bos>"] if bos else []), *WORDS])}
    tokenizer = Tokenizer(WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = WhitespaceSplit()
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        pad_token="<pad>",
        eos_token="<eos>",
        unk_token="<unk>",
        padding_side="right",
        **({"bos_token": "<bos>"} if bos else {}),
    )


def as_flash_attention_2(model):
    """Tell a model built with eager/sdpa attention that it is FlashAttention-2, as ``from_pretrained(...,
    attn_implementation="flash_attention_2")`` leaves it on a GPU, without needing the kernel to build it.
    RE-CREATED: the state loading with FlashAttention-2 gives, without the kernel that needs a CUDA GPU.
    transformers <= 4.47 read the implementation once, into ``Qwen2Model._attn_implementation`` and each
    layer's attention class (``Qwen2FlashAttention2``); from 4.48.0 the config is read at every forward."""
    from transformers.models.qwen2 import modeling_qwen2

    model.config._attn_implementation = "flash_attention_2"
    if hasattr(model.model, "_attn_implementation"):  # transformers <= 4.47
        model.model._attn_implementation = "flash_attention_2"
        for layer in model.model.layers:
            layer.self_attn.__class__ = modeling_qwen2.Qwen2FlashAttention2
    return model


def tiny_qwen2(tokenizer, seed: int, use_cache: bool = True, flash: bool = True):
    """A two-layer Qwen2 with the config's default ``use_cache=True`` (or the one asked), then told it is
    FlashAttention-2 (unless ``flash=False``: the plain eager model)."""
    from transformers import AutoModelForCausalLM, Qwen2Config

    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
        tie_word_embeddings=True,
        use_cache=use_cache,
    )
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager", torch_dtype=torch.float32)
    return as_flash_attention_2(model) if flash else model


def site_relative(filename: str) -> str:
    """A frame's file as the user's traceback names it inside the installed package (``transformers/...``)."""
    return filename.split("site-packages/", 1)[-1]


def describe_error(error: BaseException) -> dict:
    frames = traceback.extract_tb(error.__traceback__)
    last = frames[-1] if frames else None
    message = str(error)
    library = [frame for frame in frames if "site-packages" in frame.filename]
    shown = traceback.format_list(
        [traceback.FrameSummary(site_relative(f.filename), f.lineno, f.name, line=f.line) for f in library]
    )
    return {
        "raised": True,
        "error_type": type(error).__name__,
        "message": message,
        "error": f"{type(error).__name__}: {message}",
        "padding_guard": GUARD in message,
        "missing_name": getattr(error, "name", None) if isinstance(error, NameError) else None,
        "file": last.filename if last else None,
        "function": last.name if last else None,
        "line": last.lineno if last else None,
        "in_training_step": any(frame.name == "training_step" for frame in frames),
        "library_frames": [f"{Path(f.filename).name}:{f.lineno} {f.name}" for f in library][-8:],
        "user_traceback": "Traceback (most recent call last):\n"
        + "".join(shown)
        + f"{type(error).__name__}: {message}",
        "traceback": "".join(traceback.format_exception(type(error), error, error.__traceback__))[-6000:],
    }


def verdict(result: dict) -> str:
    """``guard``: the padding_side='right' ValueError. ``missing_flash_kernel``: past the check, stopped by
    the NameError of a flash-attn name transformers defines only when flash-attn is installed.
    ``finished``: no error. ``other``: anything else (never counted as past the check)."""
    if not result["raised"]:
        return "finished"
    if result["padding_guard"]:
        return "guard"
    if result["error_type"] == "NameError" and not FLASH_ATTN_INSTALLED and "flash" in (result["missing_name"] or ""):
        return "missing_flash_kernel"
    return "other"


def outcome(call) -> dict:
    """Run ``call``: the guard's ValueError, the missing kernel's NameError, any other error, or the metrics."""
    try:
        value = call()
    except Exception as error:
        result = describe_error(error)
    else:
        result = {
            "raised": False,
            "padding_guard": False,
            "error": None,
            "message": None,
            "file": None,
            "function": None,
            "value": {k: float(v) for k, v in (value or {}).items() if isinstance(v, (int, float))},
        }
    result["verdict"] = verdict(result)
    result["passed_guard"] = result["verdict"] in ("missing_flash_kernel", "finished")
    return result


def has_dpo_config() -> bool:
    """trl 0.17 has ``DPOConfig`` (with ``padding_free``, ``model_init_kwargs``); trl 0.8.6 has neither."""
    import trl

    return hasattr(trl, "DPOConfig")


def dpo_trainer(spec: dict, workdir: Path, model, tokenizer, ref_model=None, **config):
    """The era's real DPOTrainer: trl 0.17's takes a DPOConfig (``config`` goes into it); trl 0.8.6's takes
    TrainingArguments and its DPO settings as arguments."""
    import trl
    from datasets import Dataset

    rows = Dataset.from_list([{"prompt": p, "chosen": c, "rejected": r} for p, c, r in PAIRS])
    common = dict(
        output_dir=str(workdir),
        per_device_eval_batch_size=spec.get("eval_batch_size", 1),
        per_device_train_batch_size=1,
        report_to=[],
        use_cpu=True,
        save_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
        bf16=False,
        seed=spec.get("seed", 0),
        dataloader_num_workers=0,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if has_dpo_config():
            args = trl.DPOConfig(**common, max_length=64, max_prompt_length=32, **config)
            return trl.DPOTrainer(
                model=model,
                ref_model=ref_model,
                args=args,
                train_dataset=rows,
                eval_dataset=rows,
                processing_class=tokenizer,
            )
        from transformers import TrainingArguments

        return trl.DPOTrainer(
            model=model,
            args=TrainingArguments(**common, remove_unused_columns=False),
            train_dataset=rows,
            eval_dataset=rows,
            tokenizer=tokenizer,
            max_length=64,
            max_prompt_length=32,
        )


def reference_forward(trainer) -> dict:
    """The reference model's own forward on the first evaluation batch, as trl 0.17's evaluation runs it
    (``DPOTrainer.compute_ref_log_probs``): on CPU the policy's forward stops at the missing kernel first."""
    batch = trainer._prepare_inputs(next(iter(trainer.get_eval_dataloader())))
    return outcome(lambda: trainer.compute_ref_log_probs(batch) and None)


def from_path(spec: dict, workdir: Path, tokenizer, explicit_ref: bool, **config) -> dict:
    """DPOTrainer(model=<path>, ...) as a user with a model id writes it; the loaded models are then told
    they are FlashAttention-2. Records each model's ``config.use_cache``, evaluate() and the reference forward."""
    folder = workdir / "qwen2"
    if not folder.exists():
        model = tiny_qwen2(tokenizer, spec.get("seed", 0))
        model.config._attn_implementation = "eager"  # saved as a plain checkpoint
        model.save_pretrained(folder)
        tokenizer.save_pretrained(folder)
    trainer = dpo_trainer(
        spec, workdir, str(folder), tokenizer, ref_model=str(folder) if explicit_ref else None, **config
    )
    for model in (trainer.model, trainer.ref_model):
        as_flash_attention_2(model)
    return {
        **outcome(trainer.evaluate),
        "reference_forward": reference_forward(trainer),
        "use_cache": {"policy": trainer.model.config.use_cache, "reference": trainer.ref_model.config.use_cache},
    }


class ForwardCounter:
    """Forward hooks on the policy and the reference model: for each, the forwards, those whose attention mask
    ends in padding, those among them for which the model returned a KV cache, and the ``use_cache`` each
    forward was passed (the portable check of lesson 04, kept standalone here)."""

    def __init__(self, **models):
        self.counts = {name: {"forwards": 0, "right_padded": 0, "right_padded_with_cache": 0} for name in models}
        self.asked = {name: {} for name in models}
        self.handles = [
            model.register_forward_hook(self.hook(name), with_kwargs=True) for name, model in models.items()
        ]

    def hook(self, name):
        def count(module, args, kwargs, output):
            mask = kwargs.get("attention_mask")
            right = mask is not None and mask.dim() == 2 and bool((mask[:, -1] == 0).any())
            row = self.counts[name]
            row["forwards"] += 1
            row["right_padded"] += right
            row["right_padded_with_cache"] += right and getattr(output, "past_key_values", None) is not None
            asked = f"use_cache={kwargs.get('use_cache', 'not passed')}"
            self.asked[name][asked] = self.asked[name].get(asked, 0) + 1

        return count

    def remove(self):
        for handle in self.handles:
            handle.remove()


def cache_audit(spec: dict, workdir: Path, tokenizer) -> dict:
    """The era's real DPOTrainer.evaluate() on a plain eager Qwen2 (nothing re-created), each forward counted."""
    trainer = dpo_trainer(spec, workdir, tiny_qwen2(tokenizer, spec.get("seed", 0), flash=False), tokenizer)
    counter = ForwardCounter(policy=trainer.model, reference=trainer.ref_model)
    result = outcome(trainer.evaluate)
    counter.remove()
    return {**result, "counts": counter.counts, "asked": counter.asked}


def run_scenario(name: str, spec: dict, workdir: Path) -> dict:
    tokenizer = tiny_tokenizer(bos=not has_dpo_config())
    seed = spec.get("seed", 0)
    if name.startswith("tokenizer_left"):
        tokenizer.padding_side = "left"
    if name == "cache_audit":
        return cache_audit(spec, workdir, tokenizer)
    if name.startswith("path") or name.startswith("explicit_ref"):
        ref_kwargs = {"ref_model_init_kwargs": {"use_cache": False}} if name.endswith("fixed") else {}
        init_kwargs = {} if name == "path_defaults" else {"model_init_kwargs": {"use_cache": False}}
        return from_path(
            spec, workdir, tokenizer, explicit_ref=name.startswith("explicit_ref"), **init_kwargs, **ref_kwargs
        )
    model = tiny_qwen2(tokenizer, seed, use_cache=not name.endswith("_no_cache"))
    config = {"padding_free": True} if name == "padding_free" else {}
    if name.startswith("train"):
        config.update(max_steps=1, gradient_checkpointing=name.startswith("train_checkpointing"))
    trainer = dpo_trainer(spec, workdir / name, model, tokenizer, **config)
    if not name.startswith("train"):
        return outcome(trainer.evaluate)
    trained = outcome(trainer.train)
    if name.startswith("train_checkpointing"):  # evaluation as train() runs it at eval_steps: checkpointing, eval mode
        trained["then_evaluate"] = outcome(trainer.evaluate)
        trained["checkpointing_on"] = bool(trainer.model.is_gradient_checkpointing)
    return trained


def direct_forward(spec: dict) -> dict:
    """One forward of a chosen/rejected pair stacked as DPO stacks it: right-padded with and without the
    cache, and left-padded with it."""
    tokenizer = tiny_tokenizer()
    model = tiny_qwen2(tokenizer, spec.get("seed", 0)).eval()
    prompt, chosen, rejected = PAIRS[0]
    texts = [f"{prompt} {chosen}", f"{prompt} {rejected}"]
    results = {}
    for name, (side, use_cache) in zip(DIRECT, (("right", True), ("right", False), ("left", True))):
        tokenizer.padding_side = side
        batch = tokenizer(texts, padding=True, return_tensors="pt")
        with torch.no_grad():
            results[name] = outcome(
                lambda: (  # called here, within this iteration
                    model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], use_cache=use_cache),  # noqa: B023
                    {},
                )[1]
            )
        results[name]["attention_mask"] = batch["attention_mask"].tolist()
    return results


def guard_families() -> list[str]:
    """The model families whose modeling file in this transformers holds the guard's message."""
    import transformers

    models = Path(transformers.__file__).parent / "models"
    return sorted(path.parent.name for path in models.glob("*/modeling_*.py") if GUARD in path.read_text())


def guard_function(modeling_qwen2) -> str | None:
    """The ``Qwen2Model`` method whose source holds the guard's message, or None."""
    for name in ("forward", "_update_causal_mask"):
        method = getattr(modeling_qwen2.Qwen2Model, name, None)
        if method is not None and GUARD in inspect.getsource(method):
            return f"Qwen2Model.{name}"
    return None


def main(spec_path: str, result_path: str) -> None:
    start = time.perf_counter()
    spec = json.loads(Path(spec_path).read_text())
    torch.set_num_threads(int(spec.get("threads", 1)))
    from transformers.models.qwen2 import modeling_qwen2

    supported = [name for name in SCENARIOS if has_dpo_config() or name not in NEEDS_DPO_CONFIG]
    asked = spec.get("scenarios", supported)
    unknown = set(asked) - set(supported)
    if unknown:
        raise ValueError(f"scenarios {sorted(unknown)} are not run with this trl; choose from {supported}")
    with tempfile.TemporaryDirectory() as scratch:
        scenarios = {name: run_scenario(name, spec, Path(scratch) / name) for name in asked}
    result = {
        "era_versions": {
            name: importlib.metadata.version(name)
            for name in ("torch", "transformers", "trl", "peft", "accelerate", "datasets")
        },
        "flash_attn_installed": FLASH_ATTN_INSTALLED,
        "guard_function": guard_function(modeling_qwen2),
        "guard_file": inspect.getsourcefile(modeling_qwen2),
        "guard_families": guard_families(),
        "scenario_descriptions": {name: SCENARIOS[name] for name in asked},
        "direct_forward_descriptions": DIRECT,
        "scenarios": scenarios,
        "direct_forward": direct_forward(spec) if spec.get("direct_forward", True) else {},
        "seconds": time.perf_counter() - start,
    }
    Path(result_path).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
