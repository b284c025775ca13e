"""One recipe's first training step, recorded inside a side environment with that environment's own TRL.

Usage: ``python first_step.py SPEC.json RESULT.json`` with the side environment's interpreter. Standalone: it
imports torch, that environment's transformers, TRL and datasets, and the standard library, never ``trl_clinic``
(today's code may need today's libraries), so the record never depends on this project. The one exception is
asked for by the spec and kept apart: the check-up's verdicts, imported from this project's source folder and run
before the step (``checkup_verdicts``), which say "not run" where the version's libraries refuse it.

The spec holds the recipe (``kind``: sft, dpo, reward or grpo, and the user's config as a dict), the seed and
the thread count. The trainer is built by the version's own config class from the recipe's fields that class
knows (the others are listed, not guessed at), on a tiny model built from a config whose weights are drawn here
from the seed, one generator per parameter name, so that every transformers version starts from the same numbers
whatever its own initialisation does (a reward model: the same body with a one-label ``score`` head). The model is
a Llama, or a Qwen2 where the recipe's ``model_name_or_path`` names one (``family``). The data
are synthetic, over a fixed word-level vocabulary (no hub, no tokenizer download): sentences of varied length
(SFT), prompt/chosen/rejected pairs (DPO, and reward with each answer after its prompt), prompts (GRPO, rewarded
by the completion's length in words, its completions sampled from the seed). What is changed in the recipe is
what a record needs: learning rate 0 (every version scores the same weights), one optimizer step, the CPU in
float32, no checkpointing, no NaN filter on the log.

Recorded: a hash of each integer tensor of the first batch (input ids, labels, position ids, attention mask:
"absent" where the batch has none; a DPO batch's chosen and rejected tensors under their own names): the collated
batch, or for GRPO the generated one its ``_prepare_inputs`` returns (prompt and completion ids and masks). Then
the label tokens over the first step's accumulation window (labels other than -100; where a batch has no labels,
its completion mask), the step's loss (the sum of what ``Trainer.training_step`` returned over the window: the
number the Trainer logs, before its rounding), the gradient norm the Trainer logs (before clipping), and the
attention pattern of one row in the first forward of the loss (``attention_pattern``). Where the version's own
training step raises (lesson 04's guard), the record keeps the exception's type and first line (``raised``) and
the batch collated before it, and no loss; an error while the trainer is built fails the script (not a record).
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import importlib
import importlib.metadata
import importlib.util
import inspect
import json
import random
import sys
import tempfile
import time
import zlib
from pathlib import Path

import torch

BATCH_KEYS = ("input_ids", "labels", "position_ids", "attention_mask")  # always named, "absent" when not sent
WORDS = tuple(f"w{i}" for i in range(120))
SPECIALS = ("<pad>", "<eos>", "<bos>", "<unk>")
VERSIONS = ("torch", "transformers", "trl", "accelerate", "peft", "datasets", "tokenizers")
MODEL_KEYS = ("attn_implementation", "model_name_or_path")  # the recipe's model arguments the tiny model reads
MODEL_SIZE = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4}
GENERATES = ("grpo",)  # kinds whose batch is generated in ``_prepare_inputs``, not collated (GRPO's collator: identity)


def tokenizer():
    """A word-level tokenizer over a fixed vocabulary: the same ids on every tokenizers release."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit
    from transformers import PreTrainedTokenizerFast

    vocab = {token: i for i, token in enumerate(SPECIALS + WORDS)}
    inner = Tokenizer(WordLevel(vocab, unk_token="<unk>"))
    inner.pre_tokenizer = WhitespaceSplit()
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=inner,
        pad_token="<pad>",
        eos_token="<eos>",
        bos_token="<bos>",
        unk_token="<unk>",
        model_input_names=["input_ids", "attention_mask"],  # a Llama tokenizer's: no token type ids to generate()
    )
    wrapped.model_max_length = 512
    return wrapped


# A chat template over the fixed vocabulary, for conversational data only (the plain-text records keep the tokenizer
# they always had): each turn is <bos>, a role word (w0 the user, w1 the assistant), its text and <eos>, so a
# prompt-completion row's prompt ends where its completion's turn starts.
CHAT_TEMPLATE = (
    "{% for m in messages %}<bos> {{ 'w0' if m['role'] == 'user' else 'w1' }} {{ m['content'] }} <eos> {% endfor %}"
    "{% if add_generation_prompt %}<bos> w1 {% endif %}"
)


def texts(seed: int, count: int = 64) -> list[str]:
    """Sentences of 3 to 60 words: varied lengths, so padding and the label count per micro-batch vary."""
    draw = random.Random(seed)
    return [" ".join(draw.choice(WORDS) for _ in range(draw.randint(3, 60))) for _ in range(count)]


FAMILIES = {  # model type: its config, causal LM and one-label classifier classes in transformers
    "llama": ("LlamaConfig", "LlamaForCausalLM", "LlamaForSequenceClassification"),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", "Qwen2ForSequenceClassification"),
}


def family(recipe: dict) -> str:
    """The tiny model's family: qwen2 where the recipe's ``model_name_or_path`` names a Qwen2 or Qwen2.5 checkpoint
    (their model type), else llama. A version's guard or mask builder can live in one family's modeling file
    (lesson 04's right-padding guard is Qwen2's), so the family is the recipe's, not the tool's choice."""
    return "qwen2" if "qwen2" in str(recipe.get("model_name_or_path") or "").lower() else "llama"


def tiny_model(seed: int, vocab_size: int, recipe: dict, *, scores: bool = False):
    """A two-layer model of the recipe's ``family`` whose every weight is drawn from ``seed`` and the parameter's
    name (norms and biases at one); with ``scores``, the one-label sequence classifier a reward model is (its head
    is ``score``, drawn the same way). The recipe's ``model_init_kwargs`` give ``use_cache`` as a checkpoint would
    take it (transformers finds a packed row's sequences in its position ids only without a cache, lesson 01's
    later trap); nothing else of them is read. FlashAttention-2 without the flash-attn package is re-created as
    lesson 04 re-creates it (``flash_attention_2``), and the record's notes say so."""
    import transformers

    model_type = family(recipe)
    config_name, causal_name, classifier_name = FAMILIES[model_type]
    attn_implementation = recipe.get("attn_implementation") or "sdpa"
    recreated = attn_implementation == "flash_attention_2" and importlib.util.find_spec("flash_attn") is None
    config = getattr(transformers, config_name)(
        vocab_size=vocab_size,
        num_key_value_heads=2,
        max_position_embeddings=512,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=2,
        tie_word_embeddings=False,
        attn_implementation="eager" if recreated else attn_implementation,
        **({"num_labels": 1} if scores else {}),
        **MODEL_SIZE,
    )
    use_cache = (recipe.get("model_init_kwargs") or {}).get("use_cache")
    if use_cache is not None:  # the recipe loads its model with it (a config field): transformers' masks depend on it
        config.use_cache = bool(use_cache)
    model = getattr(transformers, classifier_name if scores else causal_name)(config)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if parameter.ndim == 1:
                parameter.fill_(1.0)
                continue
            generator = torch.Generator().manual_seed(seed * 1_000_003 + zlib.crc32(name.encode()))
            parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.02)
    if recreated:
        flash_attention_2(model)
    notes = {"model": f"a tiny {model_type}, use_cache={config.use_cache}"}
    return model, notes | ({"recreated": RECREATED} if recreated else {})


RECREATED = (
    "flash_attention_2: flash-attn is not installed here, so the model was built with eager attention and then "
    "told it is FlashAttention-2 (its config, and the model's own attribute where a version keeps one), as loading "
    "it on a GPU leaves it: transformers' checks before the kernel run for real; a forward past them needs the "
    "kernel and raises"
)


def flash_attention_2(model) -> None:
    """The state loading with FlashAttention-2 leaves that transformers' checks read before any kernel: the config's
    ``_attn_implementation`` (every version), and ``_attn_implementation`` on the modules that copy it at build
    (4.37-4.41's ``Qwen2Model``); the attention layers' classes are not swapped, so the first kernel call raises."""
    model.config._attn_implementation = "flash_attention_2"
    for module in model.modules():
        if "_attn_implementation" in vars(module):
            module._attn_implementation = "flash_attention_2"


def config_fields(config_class) -> set[str]:
    return {field.name for field in dataclasses.fields(config_class)}


def training_config(config_class, recipe: dict, seed: int, output_dir: str) -> tuple[object, dict]:
    """The version's own config from the recipe's fields it knows, with what a record needs set over them."""
    fields = config_fields(config_class)
    forced = {
        "output_dir": output_dir,
        "learning_rate": 0.0,
        "max_steps": 1,
        "seed": seed,
        "logging_steps": 1,
        "logging_nan_inf_filter": False,
        "report_to": "none",
        "save_strategy": "no",
        "use_cpu": True,
        "no_cuda": True,
        "bf16": False,
        "fp16": False,
        "gradient_checkpointing": False,
        "dataloader_num_workers": 0,
        "disable_tqdm": True,
        "warmup_steps": 0,
    }
    if "dataset_text_field" in fields and not recipe.get("dataset_text_field"):
        forced["dataset_text_field"] = "text"
    given = {key: value for key, value in recipe.items() if key in fields}
    chosen = given | {key: value for key, value in forced.items() if key in fields}
    if "use_cpu" in fields:
        chosen.pop("no_cuda", None)  # deprecated where use_cpu exists
    notes = {
        "ignored": sorted(key for key in recipe if key not in fields and key not in MODEL_KEYS),
        "overridden": sorted(key for key in given if key in forced and given[key] != forced[key]),
    }
    return config_class(**chosen), notes


def tensor_digest(tensor) -> str:
    """The tensor's shape and int64 values, hashed: a dtype change alone is not a change of the batch."""
    digest = hashlib.sha256(str(tuple(tensor.shape)).encode())
    digest.update(tensor.detach().to(torch.int64).cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


def pairs(seed: int, count: int = 64) -> dict[str, list[str]]:
    """Preference pairs: a prompt of 3 to 30 words, two answers of 1 to 30 (lengths vary, so padding does)."""
    draw = random.Random(seed)

    def words(low: int, high: int) -> str:
        return " ".join(draw.choice(WORDS) for _ in range(draw.randint(low, high)))

    rows = [(words(3, 30), " " + words(1, 30), " " + words(1, 30)) for _ in range(count)]
    return {"prompt": [r[0] for r in rows], "chosen": [r[1] for r in rows], "rejected": [r[2] for r in rows]}


def completion_words(completions, **kwargs) -> list[float]:
    """GRPO's reward: a completion's length in words (plain text or the last message's), so a group's completions
    score differently and their advantages are not all zero."""
    texts = [c if isinstance(c, str) else c[-1]["content"] for c in completions]
    return [float(len(text.split())) for text in texts]


TRAINERS = {  # kind: the names of its config and trainer classes in ``trl``
    "sft": ("SFTConfig", "SFTTrainer"),
    "dpo": ("DPOConfig", "DPOTrainer"),
    "reward": ("RewardConfig", "RewardTrainer"),
    "grpo": ("GRPOConfig", "GRPOTrainer"),
}


def dataset(kind: str, seed: int, tok, data: str = "text") -> dict[str, list]:
    """SFT: sentences, or with ``data`` "conversational" prompt-completion chats (a user turn, then the assistant's,
    TRL's conversational prompt-completion format: where TRL #6105 trained the prompt); DPO: prompt, chosen,
    rejected; reward: each answer after its prompt (TRL's implicit-prompt preference format), tokenized here too for
    a TRL that reads only tokenized pairs; GRPO: prompts only."""
    if kind == "sft" and data == "conversational":
        rows = pairs(seed)
        return {
            "prompt": [[{"role": "user", "content": p}] for p in rows["prompt"]],
            "completion": [[{"role": "assistant", "content": c.strip()}] for c in rows["chosen"]],
        }
    if kind == "sft":
        return {"text": texts(seed)}
    rows = pairs(seed)
    if kind == "grpo":
        return {"prompt": rows["prompt"]}
    if kind == "dpo":
        return rows
    chosen_rejected = {key: [p + a for p, a in zip(rows["prompt"], rows[key])] for key in ("chosen", "rejected")}
    return chosen_rejected | (tokenized_pairs(chosen_rejected, tok) if reads_only_tokenized_pairs() else {})


def reads_only_tokenized_pairs() -> bool:
    """trl 0.11.4's RewardTrainer raised on text pairs ("The features should include `input_ids_chosen`, ..."),
    0.12.0's tokenizes them itself (measured here; no release lies between them)."""
    import trl
    from packaging.version import Version

    return Version(trl.__version__) < Version("0.12.0")


def tokenized_pairs(rows: dict[str, list[str]], tok) -> dict[str, list]:
    """The columns that TRL's RewardDataCollatorWithPadding read before 0.12, tokenized as 0.12's RewardTrainer does."""
    columns = {}
    for key in ("chosen", "rejected"):
        encoded = tok(rows[key])
        columns[f"input_ids_{key}"], columns[f"attention_mask_{key}"] = encoded["input_ids"], encoded["attention_mask"]
    return columns


def build(kind: str, recipe: dict, seed: int, output_dir: str, data: str = "text"):
    """The version's own trainer and config for ``kind``, on the tiny model, the tokenizer and the data."""
    import trl
    from datasets import Dataset

    config_name, trainer_name = TRAINERS[kind]
    config_class, trainer_class = getattr(trl, config_name), getattr(trl, trainer_name)
    tok = tokenizer()
    if data == "conversational":
        tok.chat_template = CHAT_TEMPLATE
    model, model_notes = tiny_model(seed, len(tok), recipe, scores=kind == "reward")
    args, notes = training_config(config_class, recipe, seed, output_dir)
    notes |= model_notes
    takes = inspect.signature(trainer_class.__init__).parameters
    tokenizer_argument = "processing_class" if "processing_class" in takes else "tokenizer"
    given = {tokenizer_argument: tok}
    if kind == "dpo":  # the reference: the same weights (TRL would load it from the model's hub id, which has none)
        given["ref_model"] = copy.deepcopy(model)
    if kind == "grpo":
        given["reward_funcs"] = completion_words
        # with beta > 0 GRPO loads its reference from the policy's name: a saved copy of the same weights
        model.save_pretrained(f"{output_dir}/policy")
        model.config._name_or_path = f"{output_dir}/policy"
    rows = Dataset.from_dict(dataset(kind, seed, tok, data))
    trainer = recording(trainer_class)(model=model, args=args, train_dataset=rows, **given)
    return trainer, notes


def label_tokens(batch: dict) -> int:
    """Labels other than -100 (a DPO batch: chosen and rejected); a batch without labels: its completion mask."""
    counted = [key for key in batch if key.endswith("labels")] or [key for key in batch if "completion_mask" in key]
    return sum(int((batch[key] != -100).sum()) if key.endswith("labels") else int(batch[key].sum()) for key in counted)


def tensors(batch: dict) -> dict:
    """A batch's integer and boolean tensors, copied: the ids, labels and masks a batch hash compares exactly
    (floating tensors, such as GRPO's advantages and log-probs, are computed and reach the loss, compared within
    the rounding bound)."""
    return {k: v.clone() for k, v in batch.items() if torch.is_tensor(v) and not torch.is_floating_point(v)}


def attention_pattern(model, call: tuple[tuple, dict] | None) -> dict | None:
    """Which tokens of one row each token's output depends on, in the first forward call of the loss in the first
    training step (``call``: its positional and keyword arguments), measured rather than read from the mask: copy k
    of the row has token k's input embedding nudged, and token q sees token k where q's last hidden state moved in
    copy k (a masked key's weight is exactly 0, so it moves nothing). The call's first row is replayed through the
    model's body (``base_model``: the heads, and forwards TRL patches over them, do not build masks) with the
    arguments of the call that the body's forward names: the mask, the position ids and flags such as
    ``use_cache``, which decide what the mask builder does (transformers finds a packed row's sequences in its
    position ids only without a mask and without a cache). Tokens the row's 2-D mask leaves out (padding) are left
    out. None where the model was not called in the step or the call sent no token ids."""
    if call is None:
        return None
    args, kwargs = call
    input_ids = kwargs.get("input_ids", args[0] if args else None)
    if not torch.is_tensor(input_ids) or input_ids.dim() != 2:
        return None
    body = model.base_model
    rows, length = input_ids.shape
    copies = length + 1
    named = inspect.signature(body.forward).parameters
    replay = {key: value for key, value in kwargs.items() if key in named and key not in ("input_ids", "inputs_embeds")}
    for key, value in replay.items():
        if torch.is_tensor(value) and value.dim() > 0 and value.shape[0] == rows:
            replay[key] = value[:1].repeat(copies, *[1] * (value.dim() - 1))
    nudged = torch.arange(length)
    embeddings = model.get_input_embeddings()(input_ids[:1]).detach().repeat(copies, 1, 1)
    embeddings[nudged + 1, nudged] += 1.0
    body.train()  # as in the training step (dropout is 0 in the tiny model)
    with torch.no_grad():
        hidden = body(inputs_embeds=embeddings, **replay)[0]
    sees = (hidden[1:] != hidden[:1]).any(-1).T  # sees[q, k]: q's output moved when k was nudged
    mask = kwargs.get("attention_mask")
    if torch.is_tensor(mask) and mask.dim() == 2:
        real = mask[0].bool()
        sees = sees[real][:, real]
    return {
        "pattern": pattern_name(sees),
        "visible_pairs": int(sees.sum()),
        "sha256": hashlib.sha256(str(tuple(sees.shape)).encode() + sees.numpy().tobytes()).hexdigest(),
    }


def pattern_name(sees) -> str:
    """``causal`` when each token sees itself and every earlier token, ``causal within N sequences`` when each sees
    back to its own sequence's start only, ``other`` otherwise (with the count of pairs seen)."""
    starts = 0
    for query, row in enumerate(sees):
        seen = row.nonzero().flatten().tolist()
        if not seen or seen != list(range(seen[0], query + 1)):
            return f"other ({int(sees.sum())} of {sees.numel()} pairs)"
        starts += seen[0] == query
    length = len(sees)
    return f"causal ({length} tokens)" if starts == 1 else f"causal within {starts} sequences ({length} tokens)"


def checkup_verdicts(trainer, source: str | None) -> dict | None:
    """The check-up's verdicts on this version's trainer, just before its first step (where the check-up is meant
    to run), by probe: status, the number it measured, and what it measured. The check-up is today's code, run
    from this project's ``source`` folder put on the path (the side environment does not install it); the record
    itself never depends on it. Where it cannot import or run beside this version's libraries, one entry says
    so. Its probes leave the model, the optimizer and the random generators as they found them (its
    ``view.untouched``), so the first step after it is the one recorded without it. None where not asked."""
    if not source:
        return None
    sys.path.insert(0, source)
    try:
        report = importlib.import_module("trl_clinic.checkup").run_checkup(trainer, show=False)
    except Exception as error:
        return {"checkup": {"status": "not run", "value": None, "measured": f"{type(error).__name__}: {error}"[:300]}}
    finally:
        sys.path.remove(source)
    return {
        f.probe: {
            "status": f.status,
            "value": None if f.value is None else float(f.value),
            "measured": f.measured or f.reason,
        }
        for f in report.findings
        if f.status != "skipped"
    }


def recording(trainer_class):
    """The version's trainer with ``training_step`` and ``_prepare_inputs`` kept as they are, the losses returned,
    the inputs prepared (GRPO's batch is made there: generated, scored, then split) and the model's first forward
    call in a training step written down."""

    class Recording(trainer_class):
        recording = False  # set by ``start_recording``: what the check-up's probes run before it is not written
        first_forward = forward_hook = None

        def start_recording(self):
            self.recording, self.recorded_losses, self.prepared_batches = True, [], []
            self.first_forward = self.forward_hook = None

        def _prepare_inputs(self, *args, **kwargs):
            inputs = super()._prepare_inputs(*args, **kwargs)
            if self.recording:
                self.prepared_batches.append(tensors(inputs))
            if self.recording and self.first_forward is None and self.forward_hook is None:  # after GRPO's generation
                self.forward_hook = self.model.register_forward_pre_hook(self._keep_first_forward, with_kwargs=True)
            return inputs

        def training_step(self, *args, **kwargs):
            loss = super().training_step(*args, **kwargs)
            if self.forward_hook is not None:
                self.forward_hook.remove()
                self.forward_hook = None
            if self.recording:
                self.recorded_losses.append(float(loss.detach().float()))
            return loss

        def _keep_first_forward(self, module, args, kwargs):
            if self.first_forward is None:
                self.first_forward = (args, dict(kwargs))

    return Recording


def record(spec: dict) -> dict:
    torch.set_num_threads(spec.get("threads", 1))
    torch.manual_seed(spec["seed"])
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="trl-clinic-bisect-") as output_dir:
        trainer, notes = build(spec["kind"], spec["recipe"], spec["seed"], output_dir, spec.get("data", "text"))
        verdicts = checkup_verdicts(trainer, spec.get("checkup_source"))
        trainer.start_recording()
        collated = []
        collate = trainer.data_collator

        def collate_and_keep(features):
            batch = collate(features)
            collated.append(tensors(batch))
            return batch

        generated = spec["kind"] in GENERATES
        if not generated:
            trainer.data_collator = collate_and_keep
        try:
            trainer.train()
            raised = None
        except Exception as error:  # the version's own step raised (lesson 04's guard): what a user meets, recorded
            raised = said(error)
        batches = trainer.prepared_batches if generated else collated
        window = batches[: trainer.args.gradient_accumulation_steps]
        logged = next((entry for entry in trainer.state.log_history if "loss" in entry), {})
        try:
            attention = None if raised else attention_pattern(trainer.model, trainer.first_forward)
        except Exception as error:  # a replay this version's model refuses: the rest of the record still stands
            attention = {"pattern": f"not measured ({said(error)[:200]})", "sha256": None}
    first = window[0] if window else {}
    parts = {key: "absent" for key in BATCH_KEYS} | {key: tensor_digest(value) for key, value in first.items()}
    grad_norm = logged.get("grad_norm")
    return {
        "raised": raised,
        "versions": {name: _version(name) for name in VERSIONS},
        "parts": parts,
        "batch_sha256": hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest(),
        "shape": {
            key: list(value.shape) for key, value in first.items() if "input_ids" in key or "completion_ids" in key
        },
        "attention": attention,
        "verdicts": verdicts,
        "label_tokens": sum(label_tokens(batch) for batch in window),
        "micro_batches": len(window),
        "loss": None if raised else sum(trainer.recorded_losses),
        "logged_loss": logged.get("loss"),
        "grad_norm": None if grad_norm is None else float(grad_norm),
        "recipe_notes": notes,
        "modules": imported_modules(),
        "seconds": round(time.perf_counter() - start, 2),
    }


MODULE_PACKAGES = ("transformers", "trl")  # whose modules a record lists: where a change between two releases lies


def imported_modules() -> dict[str, dict]:
    """For each of ``MODULE_PACKAGES``, the folder that holds it and the files of its modules imported by now (the
    trainer built, the check-up and the step run): a change found between two releases lies in code these files
    hold or call, so ``trl_clinic.bisect.changes`` compares them between the two environments."""
    modules = list(sys.modules.values())
    loaded = {Path(module.__file__).resolve() for module in modules if getattr(module, "__file__", None)}
    found = {}
    for package in MODULE_PACKAGES:
        try:
            root = Path(importlib.import_module(package).__file__).resolve().parent
        except ImportError:
            continue
        files = sorted(path.relative_to(root.parent).as_posix() for path in loaded if path.is_relative_to(root))
        found[package] = {"folder": str(root.parent), "files": files}
    return found


def said(error: BaseException) -> str:
    """An exception as a record keeps it: its type and its message's first line (no traceback, whose paths differ
    between environments)."""
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0] if lines else ''}".strip()


def _version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def main(argv: list[str]) -> int:
    spec_path, result_path = argv
    with open(spec_path) as handle:
        spec = json.load(handle)
    result = record(spec)
    with open(result_path, "w") as handle:
        json.dump(result, handle, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
