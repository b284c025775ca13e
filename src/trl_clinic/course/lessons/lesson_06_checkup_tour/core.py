# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 06 · Check your own trainer before it trains
#
# Lessons 01-05 each met a failure that trains without an error. `checkup(trainer)` runs their probes (a probe:
# one measurement on your trainer) just before `trainer.train()` ([each probe](../docs/checkup.md)).
#
# **You will learn**
# * to read the check-up's table: status, how decided, number, fix, lesson;
# * what a probe measures, on one packed row checked by hand;
# * to apply its fixes, and check without the library.
#
# **You should know**: how to build a TRL `SFTTrainer`; lessons [01](01_padding_free_high_loss.ipynb)-[05](05_grpo_sigfpe.ipynb) help.
#
# **Time**: 8 s to run on the cpu [profile](../README.md#words-the-lessons-use); about 25 minutes to work through.
#
# > **Hosted** (Colab, Kaggle, no clone): upload the wheel `uv build` makes, then run `%pip install "./trl_clinic-0.1.0-py3-none-any.whl[course]"` first.

# %% tags=["parameters"]
profile = "auto"  # "auto" (gpu when CUDA is present), "cpu" or "gpu"
seed = 0
output_dir = None  # None: outputs/06_checkup_your_trainer at the repository root

# %%
import trl_clinic.course  # first: the lessons' offline mode, and two optional libraries' warnings kept quiet
from dataclasses import asdict

import torch
from datasets import load_dataset
from peft import LoraConfig
from trl import SFTConfig, SFTTrainer

from trl_clinic import checkup
from trl_clinic.course import examples, stand_ins  # tiny real trainers; stand-ins: faults set on purpose
from trl_clinic.course.lessons.lesson_06_checkup_tour import companion as tour  # its companion: bookkeeping, not the story
from trl_clinic.course.data import all_in_category_reward
from trl_clinic.course.models import make_causal_lm
from trl_clinic.course.parameters import start_run
from trl_clinic.course.results import check
from trl_clinic.course.tokenizer import build_tokenizer

run = start_run("06", profile, seed, output_dir)
print(run.describe())
sizes, tokenizer = run.sizes, build_tokenizer()
# your files on disk: a model folder (a small OPT, randomly initialised) and a train.jsonl of prompts and completions
model_dir, data_file = tour.local_files(run.output_dir / "mine", make_causal_lm(tokenizer, "opt", seed=run.seed),
                                        tokenizer, sizes.rows, run.seed)

# %% [markdown]
# ## 1. Your trainer, checked before it trains
#
# A common script: a local OPT model in half precision to save memory, padding-free batches (no compute on pad
# tokens), gradient accumulation, the classic AdamW. It trains without an error. One call before `train()`:

# %% tags=["symptom"]
def my_trainer(padding_free: bool, dtype: str) -> SFTTrainer:
    """Your script's trainer, built from the local files."""
    args = SFTConfig(**run.trainer_kwargs("mine", logging=False), max_steps=1, optim="adamw_torch",
                     padding_free=padding_free, max_length=None, model_init_kwargs={"dtype": dtype},
                     per_device_train_batch_size=sizes.packed_batch_size, gradient_accumulation_steps=sizes.accumulation)
    data = load_dataset("json", data_files=str(data_file), split="train")
    return SFTTrainer(model=str(model_dir), args=args, train_dataset=data)


trainer = my_trainer(padding_free=True, dtype="float16")
report = checkup(trainer)  # just before trainer.train()
print(f"exit code {report.exit_code} (0: clean, 1: a probe failed, 3: a probe crashed)")

# %% [markdown]
# The table shows the probes that failed or warned, one row each, and names the rest under it. `decided` says how:
# `measured` (run on your model, collator, loss or optimizer class and compared with a threshold), `config` (read
# from the arguments or the model) or `table` (a known-bugs entry matched your versions; such a row only warns).

# %% [markdown]
# ## 2. What the `packing` probe measured
#
# The probe takes a batch from your trainer's own collator, finds a row that holds several samples end to end,
# and runs the model on it as the trainer sends it, then on each sequence alone. The first sequence has nothing
# before it, so its difference is rounding; a later one fails when it differs by more than 4 times that, or 4
# units in the last place of the dtype at the logits' size. Two samples, one row, token by token:

# %% tags=["mechanism"]
samples = [trainer.train_dataset[i] for i in range(2)]
row = trainer.data_collator(samples)
starts = [i for i, p in enumerate(row["position_ids"][0].tolist()) if p == 0]
print("keys sent:", ", ".join(sorted(row)), f"\nposition_ids restart at 0 at tokens {starts}: one row, two samples")
model, by_token = trainer.model.eval(), {}
with torch.no_grad():
    packed = model(input_ids=row["input_ids"].to(model.device), position_ids=row["position_ids"].to(model.device))
    start = 0
    for name, sample in zip(("first", "second"), samples):
        alone = model(input_ids=torch.tensor([sample["input_ids"]], device=model.device)).logits[0].float()
        by_token[name] = (packed.logits[0, start:start + len(alone)].float() - alone).abs().amax(-1).tolist()
        start += len(alone)
        print(f"{name} sequence ({len(alone)} tokens), largest |packed - alone| at its first 6 tokens:",
              " ".join(f"{d:.1g}" for d in by_token[name][:6]))
scale = alone.abs().max().item()  # the logits' size
ulp = max(4 * torch.finfo(model.dtype).eps, 64 * torch.finfo(torch.float32).eps)  # 4 of its dtype, 64 of float32
tolerance = max(4 * max(by_token["first"]), ulp * scale)
print(f"tolerance = max(4 x {max(by_token['first']):.2g}, {ulp:.2g} x {scale:.2g}) = {tolerance:.2g}; "
      f"the second sequence's largest: {max(by_token['second']):.2g}")

# %% [markdown]
# The second sequence's first token already differs: OPT builds its causal mask without `position_ids`
# (transformers 5.23.0, `modeling_opt.py`, `OPTDecoder.forward`), so the restart goes unseen and each token attends
# to every token before it in the row (lesson 01 draws that mask).
#
# ## 3. A check you can paste
#
# The same comparison in plain torch, for any trainer whose collator builds rows of token ids:

# %% tags=["portable-check"]
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


# %% [markdown]
# The check-up's `packing` probe does the same with the keyword arguments your `compute_loss` really passes
# (FlashAttention's sequence lengths among them):

# %%
def verdict(report, probe: str) -> dict:
    return asdict(report.by_probe(probe)[-1])  # the finding as plain numbers


first, later = packed_vs_alone(trainer, n=sizes.packed_batch_size)  # the rows the probe reads
packing = verdict(checkup(trainer, only=["packing"], show=False), "packing")
print(f"pasted check: first sequence {first:.2g}, later ones {later:.2g}; "
      f"checkup(trainer, only=['packing']): {packing['status']}, {packing['value']:.2g}")

# %% [markdown] tags=["fix"]
# ## 4. The fix: the lines the check-up named
#
# ```diff
#   args = SFTConfig(
# -     padding_free=True,                       # OPT's sequences see each other in a packed row
# +     padding_free=False,                      # or a model family whose mask reads position_ids
# -     model_init_kwargs={"dtype": "float16"},  # AdamW's state in fp16 turns weights inf in one step
# +     model_init_kwargs={"dtype": "float32"},  # or "bfloat16"
#       ...)
# ```
#
# The check-up promises to leave your trainer as it was. A fingerprint hashes each part of it (weights,
# buffers, gradients and flags, modes, config, optimizer and scheduler state, random generators, the
# tokenizer's padding side, every attribute of the trainer and its arguments) before and after:

# %%
fixed = my_trainer(padding_free=False, dtype="float32")
before = tour.fingerprint(fixed)
fixed_report = checkup(fixed)
after = tour.fingerprint(fixed)
changed = {"check-up": [part for part in before if before[part] != after[part]]}
print(f"exit code {fixed_report.exit_code}; parts the check-up changed: {changed['check-up'] or 'none'}")

# %% [markdown]
# A fingerprint that could not see a change would prove nothing: one real training step must change it. Then a
# second check-up, now that the optimizer holds state. The parts each changed:

# %%
fixed.train()
trained = tour.fingerprint(fixed)
changed["training step"] = [part for part in trained if trained[part] != before[part]]
checkup(fixed, show=False)
changed["second check-up"] = [part for part, value in tour.fingerprint(fixed).items() if value != trained[part]]
print(*(f"{why}: {', '.join(parts) or 'nothing'}" for why, parts in changed.items()), sep="\n")

# %% [markdown]
# ## 5. The other lessons' traps
#
# Each in the trainer it lives in, built by the course's `examples` module, with and without the line that fixes
# it; only that lesson's probe runs. `stand_ins.MeanLossTrainer` is a stand-in: a custom loss set wrong on purpose
# (its check says `injected`).

# %%
def verdicts(probe: str, *trainers) -> tuple[dict, ...]:
    return tuple(verdict(checkup(t, only=[probe], show=False), probe) for t in trainers)


common, out = {"device": run.device, "seed": run.seed, "rows": sizes.rows}, run.output_dir
window = {"per_device_train_batch_size": sizes.batch_size, "gradient_accumulation_steps": sizes.accumulation}
lora = {task: LoraConfig(target_modules=["q_proj", "v_proj"], task_type=task) for task in (None, "SEQ_CLS")}

# %%
traps = {
    "01 packing: OPT, padding-free": (packing, verdict(fixed_report, "packing")),
    "03 fp16_adamw: fp16 weights": (verdict(report, "fp16_adamw"), verdict(fixed_report, "fp16_adamw")),
    "02 accumulation: a loss that takes the mean": verdicts("accumulation", *(
        examples.custom_trainer(tokenizer, out / loss.__name__, loss, **common, **window,
                                model=make_causal_lm(tokenizer, seed=run.seed))
        for loss in (stand_ins.MeanLossTrainer, examples.SumLossTrainer))),
    "03 reward_head: LoRA, no task_type": verdicts("reward_head", *(
        examples.reward_trainer(tokenizer, out / f"reward-{task}", **common, peft_config=lora[task]) for task in lora)),
    "04 padding_cache: Qwen2, use_cache": verdicts("padding_cache", *(
        examples.custom_trainer(tokenizer, out / f"qwen2-{cache}", **common, use_cache=cache,
                                model=make_causal_lm(tokenizer, "qwen2", seed=run.seed))
        for cache in (True, False))),
    "05 equal_rewards: a reward never earned": verdicts("equal_rewards", *(
        examples.grpo_trainer(tokenizer, out / f"grpo-{reward.__name__}", reward=reward, **common,
                              per_device_train_batch_size=sizes.grpo_batch_size)
        for reward in (all_in_category_reward, examples.length_reward)))}

# %% tags=["figure"]
for name, (trap, fix) in traps.items():
    print(f"{name:44} {trap['status']:5} ({trap['value']:.2g}) -> fixed: {fix['status']}"
          + ("" if fix["value"] is None else f" ({fix['value']:.2g})"))
fails = [sum(pair[i]["status"] == "fail" for pair in traps.values()) for i in (0, 1)]
title = f"{fails[0]} of {len(traps)} traps fail the check-up; with the fix line, {fails[1]} do"
tour.plot_verdicts(traps, title, run.output_dir);

# %% [markdown]
# 04 is counted, not failed: the transformers installed here has no right-padding error for Qwen2 with
# FlashAttention-2 (read in its `modeling_qwen2.py`); the versions that had one, and the probe failing there, are in
# [the deep dive](deeper/06_checkup_your_trainer_deeper.ipynb), section 6. GRPO's batch rule (lesson 05) is TRL's
# own: `GRPOConfig` refuses a bad generation batch before a trainer exists (TRL 1.16.0, `grpo_config.py`), and
# `trl-clinic checkup grpo` reports that refusal as a fail.
#
# During training, `trl_clinic.watch` reads the run's own log for the same failures: lesson
# [07](07_watch_your_run.ipynb). From a shell, `trl-clinic checkup sft --config recipe.yaml --json` checks the
# trainer `trl sft` would build and exits 1 on a fail ([the deep dive](deeper/06_checkup_your_trainer_deeper.ipynb)
# runs it).

# %% [markdown]
# ## Recap
#
# * Call `checkup(trainer)` just before `trainer.train()`; read the `fail` rows: the number, how it was
#   decided, the fix line, the lesson.
# * `measured` means run on your trainer against a threshold; `config` read from its settings; `table` a
#   known bug of your versions, which only warns.
# * `packing` compares each packed sequence's logits with the same sequence alone; the first sequence's
#   difference is the rounding it is judged against.
# * Change the lines it names and run it again; it leaves the trainer as it was, part by part.
# * Without the library: `packed_vs_alone(trainer)` above.

# %% [markdown]
# ## Exercises
#
# Worked solutions: [solutions/06_checkup_your_trainer.ipynb](solutions/06_checkup_your_trainer.ipynb).
#
# 1. Build your trainer with `gradient_accumulation_steps=1` and run only the `accumulation` probe. What does
#    it report, and why?
#    <details><summary>Hint</summary>Pass <code>only=["accumulation"]</code> and read the finding's
#    <code>status</code> and <code>reason</code>.</details>
# 2. Keep `padding_free=True` but switch the model family to Llama. What do `packed_vs_alone` and the
#    `packing` probe say?
#    <details><summary>Hint</summary><code>examples.sft_trainer(tokenizer, path, family="llama", padding_free=True,
#    max_length=None, per_device_train_batch_size=4)</code> builds one.</details>
# 3. For CI: from `report.to_json()`, list the probes that failed and how each was decided.
#    <details><summary>Hint</summary>The JSON holds a list under <code>"findings"</code>, each with
#    <code>"probe"</code>, <code>"status"</code> and <code>"decided"</code>.</details>

# %% tags=["exercise"]
# Exercise 1: your trainer without accumulation, then checkup(..., only=["accumulation"])
args = SFTConfig(**run.trainer_kwargs("one", logging=False), max_length=None, gradient_accumulation_steps=1)
one = SFTTrainer(model=str(model_dir), args=args, train_dataset=load_dataset("json", data_files=str(data_file), split="train"))

# %% tags=["exercise"]
# Exercise 2: a padding-free Llama trainer
llama = examples.sft_trainer(tokenizer, run.output_dir / "llama", family="llama", padding_free=True, max_length=None,
                             per_device_train_batch_size=sizes.packed_batch_size, **common)

# %% tags=["exercise"]
# Exercise 3: the report as JSON
import json

# %% [markdown]
# ## Checks
#
# The claims above, asserted on this run's numbers.

# %% jupyter={"source_hidden": true}
ulps = 4 * torch.finfo(model.dtype).eps * scale
runs = {"without_fix": {"statuses": {f.probe: f"{f.status} {f.decided}" for f in report.findings},
                        "exit_code": report.exit_code, "by_token": by_token, "tolerance": tolerance, "four_ulps": ulps,
                        "pasted": (first, later), "packing_value": packing["value"],
                        "traps": {name: pair[0] for name, pair in traps.items()}},
        "with_fix": {"statuses": {f.probe: f"{f.status} {f.decided}" for f in fixed_report.findings},
                     "exit_code": fixed_report.exit_code, "by_token": None, "tolerance": None, "four_ulps": None,
                     "pasted": packed_vs_alone(fixed, n=sizes.packed_batch_size),
                     "packing_value": traps["01 packing: OPT, padding-free"][1]["value"],
                     "traps": {name: pair[1] for name, pair in traps.items()}}}
numbers = {"runs": runs, "changed": changed}
check(run, numbers)
