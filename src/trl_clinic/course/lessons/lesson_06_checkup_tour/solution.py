# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 06 · Worked solutions
#
# The exercises of [the lesson](../06_checkup_your_trainer.ipynb), at the lesson's own sizes; each answer ends in an
# assertion, so this notebook fails if an answer stops being true.

# %% tags=["parameters"]
profile = "auto"  # "auto" (gpu when CUDA is present), "cpu" or "gpu"
seed = 0
output_dir = None  # None: outputs/06_checkup_your_trainer at the repository root

# %%
import trl_clinic.course  # first: the lessons' offline mode, and two optional libraries' warnings kept quiet
import json

import torch
from datasets import load_dataset
from trl import SFTConfig, SFTTrainer

from trl_clinic import checkup
from trl_clinic.course import examples
from trl_clinic.course.lessons.lesson_06_checkup_tour import companion as tour
from trl_clinic.course.models import make_causal_lm
from trl_clinic.course.parameters import start_run
from trl_clinic.course.tokenizer import build_tokenizer

run = start_run("06", profile, seed, output_dir)
sizes, tokenizer = run.sizes, build_tokenizer()
model_dir, data_file = tour.local_files(run.output_dir / "mine", make_causal_lm(tokenizer, "opt", seed=run.seed),
                                        tokenizer, sizes.rows, run.seed)
data = load_dataset("json", data_files=str(data_file), split="train")
common = {"device": run.device, "seed": run.seed, "rows": sizes.rows}

# %% [markdown]
# ## Exercise 1
#
# Your trainer with one micro-batch a step, and only the `accumulation` probe.

# %%
args = SFTConfig(**run.trainer_kwargs("one", logging=False), max_length=None, padding_free=True,
                 per_device_train_batch_size=sizes.packed_batch_size, gradient_accumulation_steps=1)
one = SFTTrainer(model=str(model_dir), args=args, train_dataset=data)
[found] = checkup(one, only=["accumulation"]).findings
print(f"{found.status}: {found.reason}. With one micro-batch a step there is no window in which label tokens could be "
      "weighed unequally, so there is nothing to measure: skipped, with the reason, never ok.")
assert found.status == "skipped" and "gradient_accumulation_steps is 1" in found.reason

# %% [markdown]
# ## Exercise 2
#
# `padding_free=True` on Llama: the pasted check and the probe.

# %%
def packed_vs_alone(trainer, n: int = 2) -> tuple[float, float] | None:
    """Largest |logit| change, packed row vs alone: (first sequence, later ones); None when rows are padded."""
    samples = [trainer.train_dataset[i] for i in range(n)]
    batch = {k: v.to(trainer.model.device) for k, v in trainer.data_collator(samples).items()
             if k in ("input_ids", "attention_mask", "position_ids")}
    if batch["input_ids"].shape[0] > 1:
        return None  # one sequence per row: nothing is packed
    mode, model, diffs = trainer.model.training, trainer.model.eval(), []
    with torch.no_grad():
        packed = model(**batch).logits[0].float().split([len(s["input_ids"]) for s in samples])
        for sample, inside in zip(samples, packed):
            alone = model(input_ids=torch.tensor([sample["input_ids"]], device=model.device)).logits[0].float()
            diffs.append((inside - alone).abs().max().item())
    model.train(mode)
    return diffs[0], max(diffs[1:])


# %%
llama = examples.sft_trainer(tokenizer, run.output_dir / "llama", family="llama", padding_free=True, max_length=None,
                             per_device_train_batch_size=sizes.packed_batch_size, **common)
first, later = packed_vs_alone(llama)
probe = tour.finding(checkup(llama, only=["packing"], show=False), "packing")
print(f"pasted check: first sequence {first:.2g}, later ones {later:.2g}; packing probe: {probe['status']} "
      f"({probe['value']:.2g}). Llama's mask reads where position_ids restart, so each sequence sees only itself: "
      "the later ones differ from alone by rounding, as the first does.")
assert later < 1e-4 and probe["status"] == "ok"

# %% [markdown]
# ## Exercise 3
#
# The lesson's trainer (OPT, padding-free, fp16 weights), its report as JSON, and the probes that failed.

# %%
args = SFTConfig(**run.trainer_kwargs("mine", logging=False), max_steps=1, optim="adamw_torch", padding_free=True,
                 max_length=None, model_init_kwargs={"dtype": "float16"},
                 per_device_train_batch_size=sizes.packed_batch_size, gradient_accumulation_steps=sizes.accumulation)
report = json.loads(checkup(SFTTrainer(model=str(model_dir), args=args, train_dataset=data), show=False).to_json())
failed = sorted((f["probe"], f["decided"]) for f in report["findings"] if f["status"] == "fail")
print(f"failed: {failed}; exit code {report['exit_code']} (what `trl-clinic checkup ... --json` returns to CI)")
assert failed == [("fp16_adamw", "measured"), ("packing", "measured")] and report["exit_code"] == 1
