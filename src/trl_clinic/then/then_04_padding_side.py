"""Lesson 04 then: Qwen2 + FlashAttention-2 right padding in DPO evaluation, on transformers 4.51.3 +
trl 0.17.0 (era 04-transformers-4.51).

The real old code: ``Qwen2Model._update_causal_mask`` in transformers 4.49.0-4.52.4's
``models/qwen2/modeling_qwen2.py`` raises ``ValueError: You are attempting to perform batched
generation with padding_side='right' ...`` when the config says ``flash_attention_2``, there is an
attention mask and a cache (``use_cache=True`` creates one), and the last column of the mask is not all
ones. TRL 0.17.0's ``DPOTrainer.concatenated_forward`` stacks chosen and rejected and flushes the
batch left, so every batch whose two completions differ in length is right-padded, and
``evaluate()`` runs with the config's ``use_cache=True``. The check runs before any flash kernel, so
it raises on CPU: the tiny Qwen2 is built with eager attention and its config is then set to
``flash_attention_2``, as loading with FlashAttention-2 on a GPU would leave it.

Usage: ``python then_04_padding_side.py SPEC.json RESULT.json`` with the era's interpreter. The spec
may set ``seed`` (default 0), ``eval_batch_size`` (default 1, the report's) and ``threads``.

Each scenario builds a fresh model and trainer and calls ``evaluate()``; what it raised is recorded
(type, message, the file, function and line of the traceback's last frame, the traceback):
``as_reported``; ``tokenizer_left`` (the message's own advice, ``tokenizer.padding_side = "left"``);
``use_cache_false`` (``model.config.use_cache = False``); ``padding_free`` (``DPOConfig(padding_free=True)``:
no attention mask). A fix that gets past the check then needs the real flash kernel, which CPU-only
torch has not: what happened next is recorded as it is. ``direct_forward`` does the same on one
forward of the eval batch, right-padded and left-padded. Standalone: it must not import ``trl_clinic``.
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


def tiny_tokenizer():
    """A word-level tokenizer built in place (nothing downloaded); pad and eos are their own tokens."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit
    from transformers import PreTrainedTokenizerFast

    vocab = {token: i for i, token in enumerate(["<pad>", "<eos>", "<unk>", *WORDS])}
    tokenizer = Tokenizer(WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="<pad>", eos_token="<eos>",
                                   unk_token="<unk>", padding_side="right")


def tiny_qwen2(tokenizer, seed: int, use_cache: bool = True):
    """Loaded eager, then told it is FlashAttention-2: what ``from_pretrained(attn_implementation=
    "flash_attention_2")`` leaves in the config on a GPU, without needing the kernel to build it."""
    from transformers import AutoModelForCausalLM, Qwen2Config

    config = Qwen2Config(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
                         bos_token_id=None, tie_word_embeddings=True, use_cache=use_cache)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager", torch_dtype=torch.float32)
    model.config._attn_implementation = "flash_attention_2"
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


def evaluate(spec: dict, workdir: Path, *, use_cache: bool = True, padding_side: str = "right",
             padding_free: bool = False) -> dict:
    from datasets import Dataset
    from trl import DPOConfig, DPOTrainer

    tokenizer = tiny_tokenizer()
    tokenizer.padding_side = padding_side
    model = tiny_qwen2(tokenizer, spec.get("seed", 0), use_cache=use_cache)
    rows = [{"prompt": p, "chosen": c, "rejected": r} for p, c, r in PAIRS]
    args = DPOConfig(output_dir=str(workdir), per_device_eval_batch_size=spec.get("eval_batch_size", 1),
                     per_device_train_batch_size=1, report_to=[], use_cpu=True, save_strategy="no",
                     logging_strategy="no", disable_tqdm=True, bf16=False, max_length=64, max_prompt_length=32,
                     padding_free=padding_free, seed=spec.get("seed", 0), dataloader_num_workers=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = DPOTrainer(model=model, args=args, train_dataset=Dataset.from_list(rows),
                             eval_dataset=Dataset.from_list(rows), processing_class=tokenizer)
    return outcome(trainer.evaluate)


def direct_forward(spec: dict) -> dict:
    """One forward of a chosen/rejected pair stacked as DPO stacks it: right-padded, then left-padded."""
    tokenizer = tiny_tokenizer()
    model = tiny_qwen2(tokenizer, spec.get("seed", 0)).eval()
    prompt, chosen, rejected = PAIRS[0]
    texts = [f"{prompt} {chosen}", f"{prompt} {rejected}"]
    results = {}
    for side in ("right", "left"):
        tokenizer.padding_side = side
        batch = tokenizer(texts, padding=True, return_tensors="pt")
        with torch.no_grad():
            results[side] = outcome(lambda: (model(**batch, use_cache=True), {})[1])
        results[side]["attention_mask"] = batch["attention_mask"].tolist()
    return results


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
            "padding_free": evaluate(spec, scratch / "d", padding_free=True),
        }
    guard_source = inspect.getsource(modeling_qwen2.Qwen2Model._update_causal_mask)
    result = {
        "era_versions": {name: importlib.metadata.version(name)
                         for name in ("torch", "transformers", "trl", "peft", "accelerate")},
        "flash_attn_installed": importlib.util.find_spec("flash_attn") is not None,
        "guard_in_library": GUARD in guard_source,
        "guard_file": inspect.getsourcefile(modeling_qwen2),
        "scenarios": scenarios,
        "direct_forward": direct_forward(spec),
        "seconds": time.perf_counter() - start,
    }
    Path(result_path).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
