# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 04 · Worked solutions
#
# The exercises of [lesson 04](../04_qwen2_padding_side.ipynb), at the lesson's own sizes, on the lesson's own
# models: SmolLM2-135M-Instruct for generation and scoring, and the lesson's Qwen2 checkpoint (built by the same
# lines) for today's `DPOTrainer`. Each answer ends in an assertion, so this notebook fails
# when an answer stops being true.

# %% tags=["parameters"]
profile = "auto"  # "auto" (gpu when CUDA is present), "cpu" or "gpu"
seed = 0
output_dir = None  # None: outputs/04_qwen2_padding_side at the repository root

# %%
import torch

from trl_clinic.course.lessons.lesson_04_padding_side import companion
from trl_clinic.course.models import load_smollm2, make_causal_lm
from trl_clinic.course.parameters import start_run
from trl_clinic.course.tokenizer import build_tokenizer
from trl_clinic.probes.padding import generation_check

run = start_run("04", profile, seed, output_dir)
sizes = run.sizes
smol, smol_tokenizer = load_smollm2(dtype=torch.float32)
smol = smol.to(run.device).eval()


def watch_right_padding_with_cache(model):
    """The lesson's portable check, as it is there."""
    counts = {"forwards": 0, "right_padded": 0, "right_padded_with_cache": 0}

    def hook(module, args, kwargs, output):
        mask = kwargs.get("attention_mask")
        right = mask is not None and mask.dim() == 2 and bool((mask[:, -1] == 0).any())
        counts["forwards"] += 1
        counts["right_padded"] += right
        counts["right_padded_with_cache"] += right and getattr(output, "past_key_values", None) is not None

    return counts, model.register_forward_hook(hook, with_kwargs=True)


# %% [markdown]
# ## Exercise 1
#
# Two prompts of the same token count: no row has pads, so the right- and the left-padded batch are the same
# batch, and both give the answers of one prompt at a time.

# %%
same_length = ["A, B,", "X, Y,"]
counts = [len(smol_tokenizer(prompt)["input_ids"]) for prompt in same_length]
report = generation_check(smol, smol_tokenizer, same_length, max_new_tokens=sizes.max_new_tokens)
changed = {side: sum(report[side]["changed"]) for side in ("left", "right")}
shift = max(max(report[side]["first_token_logit_shift"]) for side in ("left", "right"))
print(f"token counts {counts}; outputs changed by batching: {changed}; largest first-token logit shift {shift:.1e}")
assert len(set(counts)) == 1 and changed == {"left": 0, "right": 0} and shift < 1e-3

# %% [markdown]
# ## Exercise 2
#
# DPO evaluation at `eval_batch_size=4` on the lesson's checkpoint: eight rows a batch (four pairs, chosen and
# rejected stacked), right-padded in most batches, and no forward builds a cache: today's DPO passes
# `use_cache=False`, so nothing would have raised even on the old transformers.

# %%
tokenizer = build_tokenizer()
tokenizer.padding_side = "left"  # as in the lesson: DPO pads right whatever this says
checkpoint = run.output_dir / "qwen2"  # the lesson's random Qwen2, saved as the lesson saves it
make_causal_lm(tokenizer, "qwen2", size=sizes.model_size, seed=run.seed).save_pretrained(checkpoint)
tokenizer.save_pretrained(checkpoint)
trainer4 = companion.dpo_trainer(run, checkpoint, tokenizer, eval_batch_size=4)
watched = {name: watch_right_padding_with_cache(model)
           for name, model in (("policy", trainer4.model), ("reference", trainer4.ref_model))}
trainer4.evaluate()
for name, (counts, handle) in watched.items():
    handle.remove()
    print(f"{name}: {counts['right_padded']} of {counts['forwards']} evaluation forwards right-padded, "
          f"{counts['right_padded_with_cache']} of them with a KV cache")
assert all(c["right_padded"] > 0 and c["right_padded_with_cache"] == 0 for c, _ in watched.values())
