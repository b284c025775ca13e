# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 08 · Worked solutions
#
# The exercises of [the lesson](../08_todays_silent_failures.ipynb), at the lesson's own sizes; each answer ends in
# an assertion, so this notebook fails if an answer stops being true. They need no era: each builds what it reads on
# today's libraries.

# %% tags=["parameters"]
profile = "auto"  # "auto" (gpu when CUDA is present), "cpu" or "gpu"
seed = 0
output_dir = None  # None: outputs/08_todays_silent_failures at the repository root

# %%
import trl_clinic.course  # first: the lessons' offline mode, and two optional libraries' warnings kept quiet
import torch
from datasets import Dataset
from trl import SFTConfig, SFTTrainer

from trl_clinic.course.lessons.lesson_08_silent_failures import companion
from trl_clinic.course.models import make_causal_lm
from trl_clinic.course.parameters import start_run
from trl_clinic.course.tokenizer import build_tokenizer

run = start_run("08", profile, seed, output_dir)
tokenizer = build_tokenizer()
rows = companion.chat_rows(run.sizes.rows, run.subseed("rows"))

# %% [markdown]
# ## Exercise 1
#
# TRL 0.24.0's rule, replayed on today's transformers: the mask's zeros are `len()` of what `apply_chat_template`
# returns, 2, so a prompt of `p` tokens has `p - 2` of them trained.


# %%
def trained_by_trl_024(p: int) -> int:
    return p - 2


for row in rows:
    full = tokenizer.apply_chat_template(row["prompt"] + row["completion"], tokenize=True, return_dict=False)
    prompt = tokenizer.apply_chat_template(row["prompt"], tokenize=True, add_generation_prompt=True, return_dict=False)
    zeros = len(tokenizer.apply_chat_template(row["prompt"], tokenize=True, add_generation_prompt=True))
    mask = [0] * zeros + [1] * (len(full) - zeros)  # trl 0.24.0's completion_mask
    assert sum(mask[: len(prompt)]) == trained_by_trl_024(len(prompt))
print(f"{len(rows)} rows: p - 2 trained each")

# %% [markdown]
# ## Exercise 2
#
# `trained_text` of the fixed turn-end trainer brackets each answer *and* its `<|im_end|>`; today's
# prompt-completion trainer brackets the completion (the answer and its turn end), never the question. Neither
# trainer needs to train to show it: the brackets are its first batch's labels.


# %%
def trained_text(trainer, row: int = 0) -> str:
    """The lesson's portable check, as pasted."""
    batch, tok = next(iter(trainer.get_train_dataloader())), trainer.processing_class
    pairs = zip(batch["input_ids"][row].tolist(), batch["labels"][row].tolist())
    return "".join(f"[{tok.decode([i])}]" if label != -100 else tok.decode([i]) for i, label in pairs)


def trainer(data, chat, **settings) -> SFTTrainer:
    args = SFTConfig(**{**run.trainer_kwargs("exercise-2", progress=False), **settings})
    return SFTTrainer(model=make_causal_lm(chat, seed=run.seed), args=args, train_dataset=data, processing_class=chat)


chat = build_tokenizer()
chat.chat_template = companion.TURN_END_INSIDE
inside = trainer(companion.conversations(rows), chat, assistant_only_loss=True)
today = trainer(Dataset.from_list(rows), tokenizer)
for name, built in (("inside", inside), ("today", today)):
    print(name, trained_text(built).replace("<|pad|>", ""))
assert "[<|im_end|>]" in trained_text(inside) and "[<|im_end|>]" in trained_text(today)
assert "[<|im_start|>]" not in trained_text(today)  # no header of the prompt is trained

# %% [markdown]
# ## Exercise 3
#
# bfloat16's gap is 2⁻⁹ just below 0.5 and 2⁻⁸ just above it (eps = 2⁻⁷ is the gap above 1). A sum rounds to the
# nearest value, so a step moves 0.5 down only past 2⁻¹⁰ ≈ 0.00098, and up only past 2⁻⁹ ≈ 0.00195: learning rates
# five and ten times TRL #7268's 2e-4.

# %%
magnitude = torch.tensor(0.5, dtype=torch.bfloat16)
eps = torch.finfo(torch.bfloat16).eps
print("down past", eps / 8, "up past", eps / 4)
assert (magnitude - 0.0009).item() == 0.5 and (magnitude - 0.0010).item() != 0.5
assert (magnitude + 0.0019).item() == 0.5 and (magnitude + 0.0020).item() != 0.5
