"""An offline tokenizer: byte-level BPE trained on the lessons' synthetic corpus, cached on disk.

No hub download is possible in CI, and a tokenizer that knows the fixed world keeps sequences short,
which is what makes CPU runs fast.
"""

from __future__ import annotations

import hashlib
import os

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from trl_clinic.course.data import corpus
from trl_clinic.course.paths import cache_dir

PAD, EOS, IM_START, IM_END = "<|pad|>", "<|endoftext|>", "<|im_start|>", "<|im_end|>"
# ChatML, the format Qwen2 uses; TRL's conversational datasets go through it.
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def _train(texts: list[str], vocab_size: int) -> Tokenizer:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[PAD, EOS, IM_START, IM_END],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    return tokenizer


def build_tokenizer(vocab_size: int = 1024) -> PreTrainedTokenizerFast:
    """Load the cached tokenizer for this corpus and size, training it (about a second) if missing.

    pad and eos are different tokens on purpose: when they are the same, collators that mask pads
    also mask the eos the model should learn to emit.
    """
    texts = corpus()
    digest = hashlib.sha256(("\n".join(texts) + f"|{vocab_size}").encode()).hexdigest()[:16]
    path = cache_dir() / f"tokenizer-{digest}.json"
    if path.exists():
        tokenizer = Tokenizer.from_file(str(path))
    else:
        tokenizer = _train(texts, vocab_size)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tokenizer.save(str(tmp))
        tmp.replace(path)  # atomic: parallel notebooks never read a half-written file
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        pad_token=PAD,
        eos_token=EOS,
        padding_side="right",
        chat_template=CHAT_TEMPLATE,
        model_max_length=4096,
    )
