# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 01 · Worked solutions
#
# The exercises of [the lesson](../01_padding_free_high_loss.ipynb), at the lesson's own sizes; each answer ends
# in an assertion, so this notebook fails if an answer stops being true.

# %% tags=["parameters"]
profile = "auto"  # "auto" (gpu when CUDA is present), "cpu" or "gpu"
seed = 0
output_dir = None  # None: outputs/01_padding_free_high_loss at the repository root

# %%
import trl_clinic.course  # first: the lessons' offline mode, and two optional libraries' warnings kept quiet
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import SFTConfig, SFTTrainer

from trl_clinic.course.lessons.lesson_01_padding_free import companion
from trl_clinic.course.models import make_causal_lm
from trl_clinic.course.parameters import start_run

run = start_run("01", profile, seed, output_dir)
examples = companion.copy_examples(run.sizes.samples, run.subseed("examples"))
checkpoint = companion.train_copier(run)
tokenizer = AutoTokenizer.from_pretrained(checkpoint)
# on sdpa and eager today's transformers finds the boundaries in position_ids; FlashAttention in cu_seq_lens
sdpa_or_eager = run.attention in ("sdpa", "eager")


def sft_trainer(batch_size: int, padding_free: bool, model=str(checkpoint)) -> SFTTrainer:
    """The lesson's trainer: today's SFTTrainer on the copy-task model, at learning rate 0."""
    args = SFTConfig(**run.trainer_kwargs(f"batch-{batch_size}-{padding_free}", progress=False),
                     model_init_kwargs={"attn_implementation": run.attention,
                                        "dtype": "bfloat16" if run.attention.startswith("flash") else "float32"},
                     padding_free=padding_free, max_length=None, completion_only_loss=True,
                     per_device_train_batch_size=batch_size, learning_rate=0.0, num_train_epochs=1)
    return SFTTrainer(model=model, args=args, train_dataset=examples, processing_class=tokenizer)


@torch.no_grad()
def packed_vs_alone(trainer, **forward) -> list[float]:
    """The lesson's portable check; ``forward`` overrides what the packed row's forward is given."""
    model = trainer.model.eval()
    batch = next(iter(trainer.get_train_dataloader()))
    inputs = {k: v.to(model.device) if torch.is_tensor(v) else v for k, v in batch.items() if k != "labels"}
    packed = model(**inputs, **{"use_cache": False, **forward}).logits[0]
    starts = (inputs["position_ids"][0] == 0).nonzero().flatten().tolist() + [packed.shape[0]]
    return [(packed[a:b] - model(input_ids=inputs["input_ids"][:, a:b], use_cache=False).logits[0]).abs().max().item()
            for a, b in zip(starts, starts[1:])]


def kept_apart(differences: list[float]) -> bool:
    """The later sequences differ from alone no more than the first one's rounding allows (as the lesson checks)."""
    first, *later = differences
    return max(later) <= 10 * first + (1e-4 if run.precision == "fp32" else 2e-2)


# %% [markdown]
# ## Exercise 1
#
# One causal mask over a row lets each sequence see every token of the sequences before it: the count is the sum
# of `len(i) * len(j)` over the pairs `i < j`. For `b` sequences of `m` tokens that is `m * m * b * (b - 1) / 2`:
# it grows with the square of the batch size.

# %%
def cross_sequence_cells(lengths: list[int]) -> int:
    return sum(a * b for i, a in enumerate(lengths) for b in lengths[i + 1:])


lengths = run.sizes.mask_lengths
causal = torch.ones(sum(lengths), sum(lengths)).tril()  # one causal mask over the whole row
owner = torch.tensor([i for i, n in enumerate(lengths) for _ in range(n)])
counted = int((causal * (owner[:, None] != owner[None, :])).sum())  # allowed cells whose query and key differ
print(f"{lengths}: {cross_sequence_cells(lengths)} cells by the formula, {counted} counted on the mask")
assert cross_sequence_cells(lengths) == counted == 21
assert all(cross_sequence_cells([4] * b) == 16 * b * (b - 1) // 2 for b in (1, 2, 4, 8, 16))

# %% [markdown]
# ## Exercise 2
#
# With a KV cache the mask builder no longer looks for boundaries in `position_ids` (it does so only with no mask
# and no cache), so on sdpa or eager the packed sequences read each other again. `SFTTrainer` passes
# `use_cache=False`; a hand-written loop that leaves the config's `use_cache=True` does not.

# %%
trainer = sft_trainer(16, True)
no_cache, with_cache = packed_vs_alone(trainer), packed_vs_alone(trainer, use_cache=True)
print(f"use_cache=False: later sequences up to {max(no_cache[1:]):.1e}; use_cache=True: up to {max(with_cache[1:]):.1e}")
assert kept_apart(no_cache)
if sdpa_or_eager:  # FlashAttention reads cu_seq_lens, which the row carries either way
    assert not kept_apart(with_cache) and max(with_cache[1:]) > 1e-2

# %% [markdown]
# ## Exercise 3
#
# It is the family, not the kernel: today's eager finds the boundaries in `position_ids` for Llama as sdpa does,
# while OPT's mask builder is never given them, whatever the kernel.

# %%
eager_llama = AutoModelForCausalLM.from_pretrained(checkpoint, attn_implementation="eager")
eager_opt = make_causal_lm(tokenizer, "opt", seed=run.seed, attn_implementation="eager")
llama, opt = (packed_vs_alone(sft_trainer(16, True, model=model)) for model in (eager_llama, eager_opt))
print(f"eager Llama: later sequences up to {max(llama[1:]):.1e}; eager OPT: up to {max(opt[1:]):.1e}")
assert kept_apart(llama) and not kept_apart(opt) and max(opt[1:]) > 1e-2
