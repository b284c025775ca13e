"""Lesson 04 then: Qwen2 + FlashAttention-2 right padding, on the real old transformers, in two eras.

The guard that raises ``ValueError: You are attempting to perform batched generation with
padding_side='right' ...`` lived in two windows of transformers' ``models/qwen2/modeling_qwen2.py``
(read in the released files of 4.37.0, 4.38.2, 4.39.3, 4.40.2, 4.41.2, 4.42.0, 4.42.4, 4.43.4, 4.44.2,
4.45.2, 4.46.3, 4.47.1, 4.48.3, 4.49.0, 4.50.3, 4.51.3, 4.52.4 and 4.53.0):

* 4.37.0-4.41.2, ``Qwen2Model.forward``: FlashAttention-2 (``self._attn_implementation``, set from the
  config when the model is built), an attention mask, ``use_cache`` (the argument, else the config's)
  and a right-padded row. Era ``04-transformers-4.40`` (transformers 4.40.2, trl 0.8.6).
* 4.49.0-4.52.4, ``Qwen2Model._update_causal_mask``: the config's ``flash_attention_2``, an attention
  mask, a cache object (``use_cache=True`` creates one) and a right-padded row. Era
  ``04-transformers-4.51`` (transformers 4.51.3, trl 0.17.0, the report's versions).

Both checks run before any attention kernel, so they raise on CPU: the tiny Qwen2 is built with eager
attention and then told it is FlashAttention-2, as loading with FlashAttention-2 on a GPU leaves it
(the config; on 4.40 also ``Qwen2Model._attn_implementation`` and the layers' ``Qwen2FlashAttention2``
class). A forward that gets past the check then needs the real flash kernel, which CPU-only torch has
not: what happened next is recorded as it is.

Usage: ``python then_04_padding_side.py SPEC.json RESULT.json`` with the era's interpreter. The spec
may set ``seed`` (default 0), ``eval_batch_size`` (default 1, the report's) and ``threads``.

``direct_forward``: one forward of a chosen/rejected pair stacked as DPO stacks it, right-padded with
and without the cache, and left-padded with it. ``scenarios``: the real ``DPOTrainer.evaluate()`` of
the era's trl, each with a fresh model: ``as_reported``; ``tokenizer_left`` (the message's own advice);
``use_cache_false`` (``model.config.use_cache = False``); ``padding_free`` (``DPOConfig(padding_free=True)``,
where the era's trl has it). For each: the error's type, message, file, function and line (the
traceback's last frame) and the traceback. Standalone: it must not import ``trl_clinic``.
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
WORDS = ("the cat dog sat ran on mat rug a big small red blue fast slow and then home park tree "
         "good bad yes no it is was very").split()
# chosen and rejected of different lengths: the stacked batch of one pair is right-padded
PAIRS = [("the cat sat on", "the mat and then", "a dog"),
         ("a big dog ran to", "the park", "home and then the tree was very big"),
         ("is it", "yes it is", "no"),
         ("the red cat", "was very fast and good", "slow")]


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
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="<pad>", eos_token="<eos>",
                                   unk_token="<unk>", padding_side="right", **({"bos_token": "<bos>"} if bos else {}))


def tiny_qwen2(tokenizer, seed: int, use_cache: bool = True):
    """Loaded eager, then told it is FlashAttention-2: what ``from_pretrained(attn_implementation=
    "flash_attention_2")`` leaves on a GPU, without needing the kernel to build it. transformers <= 4.41
    read the implementation once, into ``Qwen2Model._attn_implementation`` and each layer's attention
    class (``Qwen2FlashAttention2``); later releases read the config at every forward."""
    from transformers import AutoModelForCausalLM, Qwen2Config
    from transformers.models.qwen2 import modeling_qwen2

    config = Qwen2Config(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
                         bos_token_id=None, tie_word_embeddings=True, use_cache=use_cache)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager", torch_dtype=torch.float32)
    model.config._attn_implementation = "flash_attention_2"
    if hasattr(model.model, "_attn_implementation"):  # transformers <= 4.41
        model.model._attn_implementation = "flash_attention_2"
        for layer in model.model.layers:
            layer.self_attn.__class__ = modeling_qwen2.Qwen2FlashAttention2
    return model


def describe_error(error: BaseException) -> dict:
    frames = traceback.extract_tb(error.__traceback__)
    last = frames[-1] if frames else None
    message = str(error)
    return {"raised": True, "error_type": type(error).__name__, "message": message,
            "error": f"{type(error).__name__}: {message}", "padding_guard": GUARD in message,
            "file": last.filename if last else None, "function": last.name if last else None,
            "line": last.lineno if last else None,
            "library_frames": [f"{Path(f.filename).name}:{f.lineno} {f.name}" for f in frames
                               if "site-packages" in f.filename][-8:],
            "traceback": "".join(traceback.format_exception(type(error), error, error.__traceback__))[-6000:]}


def outcome(call) -> dict:
    """Run ``call``; the guard's ValueError, any other error (the missing kernel) or the metrics."""
    try:
        value = call()
    except Exception as error:
        result = describe_error(error)
    else:
        result = {"raised": False, "value": {k: float(v) for k, v in (value or {}).items()
                                             if isinstance(v, (int, float))}}
    result["passed_guard"] = not result.get("padding_guard", False)
    # past the guard, a CPU-only torch has no flash kernel: the next error comes from the flash path
    result["needs_flash_kernel"] = bool(result["raised"] and result["passed_guard"]
                                        and "flash" in (result.get("file") or "") + result.get("message", ""))
    return result


def dpo_trainer(spec: dict, workdir: Path, model, tokenizer, padding_free: bool):
    """The era's real DPOTrainer: trl 0.17's takes a DPOConfig; trl 0.8.6's takes TrainingArguments and its
    DPO settings as arguments (it has no DPOConfig and no padding_free)."""
    from datasets import Dataset
    import trl

    rows = Dataset.from_list([{"prompt": p, "chosen": c, "rejected": r} for p, c, r in PAIRS])
    common = dict(output_dir=str(workdir), per_device_eval_batch_size=spec.get("eval_batch_size", 1),
                  per_device_train_batch_size=1, report_to=[], use_cpu=True, save_strategy="no",
                  logging_strategy="no", disable_tqdm=True, bf16=False, seed=spec.get("seed", 0),
                  dataloader_num_workers=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if has_dpo_config():
            args = trl.DPOConfig(**common, max_length=64, max_prompt_length=32, padding_free=padding_free)
            return trl.DPOTrainer(model=model, args=args, train_dataset=rows, eval_dataset=rows,
                                  processing_class=tokenizer)
        from transformers import TrainingArguments

        return trl.DPOTrainer(model=model, args=TrainingArguments(**common, remove_unused_columns=False),
                              train_dataset=rows, eval_dataset=rows, tokenizer=tokenizer, max_length=64,
                              max_prompt_length=32)


def evaluate(spec: dict, workdir: Path, *, use_cache: bool = True, padding_side: str = "right",
             padding_free: bool = False) -> dict:
    tokenizer = tiny_tokenizer(bos=not has_dpo_config())
    tokenizer.padding_side = padding_side
    model = tiny_qwen2(tokenizer, spec.get("seed", 0), use_cache=use_cache)
    trainer = dpo_trainer(spec, workdir, model, tokenizer, padding_free)
    return outcome(trainer.evaluate)


def has_dpo_config() -> bool:
    """trl 0.17 has ``DPOConfig`` (with ``padding_free``); trl 0.8.6 has neither."""
    import trl

    return hasattr(trl, "DPOConfig")


def direct_forward(spec: dict) -> dict:
    """One forward of a chosen/rejected pair stacked as DPO stacks it: right-padded with and without the
    cache, and left-padded with it."""
    tokenizer = tiny_tokenizer()
    model = tiny_qwen2(tokenizer, spec.get("seed", 0)).eval()
    prompt, chosen, rejected = PAIRS[0]
    texts = [f"{prompt} {chosen}", f"{prompt} {rejected}"]
    results = {}
    for name, side, use_cache in (("right", "right", True), ("right_no_cache", "right", False), ("left", "left", True)):
        tokenizer.padding_side = side
        batch = tokenizer(texts, padding=True, return_tensors="pt")
        with torch.no_grad():
            results[name] = outcome(lambda: (model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                                                   use_cache=use_cache), {})[1])
        results[name]["attention_mask"] = batch["attention_mask"].tolist()
    return results


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

    with tempfile.TemporaryDirectory() as scratch:
        scratch = Path(scratch)
        scenarios = {
            "as_reported": evaluate(spec, scratch / "a"),
            "tokenizer_left": evaluate(spec, scratch / "b", padding_side="left"),
            "use_cache_false": evaluate(spec, scratch / "c", use_cache=False),
        }
        if has_dpo_config():
            scenarios["padding_free"] = evaluate(spec, scratch / "d", padding_free=True)
    result = {
        "era_versions": {name: importlib.metadata.version(name)
                         for name in ("torch", "transformers", "trl", "peft", "accelerate", "datasets")},
        "flash_attn_installed": importlib.util.find_spec("flash_attn") is not None,
        "guard_function": guard_function(modeling_qwen2),
        "guard_file": inspect.getsourcefile(modeling_qwen2),
        "scenarios": scenarios,
        "direct_forward": direct_forward(spec),
        "seconds": time.perf_counter() - start,
    }
    Path(result_path).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
