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
# Lessons 01-05 each met a failure that trains without an error. `checkup(trainer)` runs their probes on your
# own trainer, in your own environment, just before `trainer.train()` ([what each probe does](../docs/checkup.md)).
#
# **You will learn**
# * to read the check-up's table: status, how it was decided, the number, the one-line fix, the lesson;
# * what a probe measures, on one packed row small enough to check by hand;
# * to change the lines it names, prove the check-up changed nothing, and check without the library.
#
# **You should know**: how to build a TRL `SFTTrainer`; lessons [01](01_padding_free_high_loss.ipynb)-[05](05_grpo_sigfpe.ipynb) help.
#
# **Time**: 18 s to run on the cpu profile; about 25 minutes to work through.
#
# > **Hosted** (Colab, Kaggle, a server without the repository): upload the wheel (`uv build` makes it) and run `%pip install "./trl_clinic-0.1.0-py3-none-any.whl[course]"` in a cell first.

# %% tags=["parameters"]
profile = "auto"  # "auto" (gpu when CUDA is present), "cpu" or "gpu"
seed = 0
output_dir = None  # None: outputs/06_checkup_your_trainer at the repository root

# %%
import torch
from datasets import load_dataset
from peft import LoraConfig
from trl import SFTConfig, SFTTrainer

from trl_clinic import checkup
from trl_clinic.course import examples
from trl_clinic.course.companions import lesson_06_checkup_tour as tour
from trl_clinic.course.data import all_in_category_reward
from trl_clinic.course.models import make_causal_lm
from trl_clinic.course.parameters import start_run
from trl_clinic.course.results import conclude, measured, save_metrics
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
# A script as many are written: a local OPT model loaded in half precision to save memory, padding-free batches
# so no compute goes to pad tokens, gradient accumulation, the classic AdamW. It trains without an error. One
# call before `trainer.train()`:

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

# %% [markdown]
# Each row is one probe. `decided` says how: `measured` (run on your model, collator, loss or optimizer class and
# compared with a threshold), `config` (read from the arguments or the model) or `table` (a known-bugs entry
# matched your versions; such a row only warns). The rows that failed:

# %%
for f in report.findings:
    if f.status in ("fail", "warn"):
        print(f"{f.probe}: {f.status}, {f.decided}, lesson {f.lesson}\n  {f.measured}\n  fix: {f.fix}\n")
print(f"exit code {report.exit_code} (0: clean, 1: a probe failed, 3: a probe crashed)")

# %% [markdown]
# ## 2. What the `packing` probe measured
#
# The probe takes a batch from your trainer's own collator and finds the rows that hold several samples end to
# end. It runs the model on such a row as the trainer sends it, then on each sequence alone. A sequence that
# sees only itself gets the same logits both ways. The first sequence of a row has nothing before it, so its
# difference is rounding; a later one fails when it differs by more than 4 times that, or 4 units in the last
# place of the dtype at the logits' size. Two samples, one row, token by token:

# %% tags=["mechanism"]
samples = [trainer.train_dataset[i] for i in range(2)]
row = trainer.data_collator(samples)
print("keys sent:", sorted(row), "\nposition_ids:", row["position_ids"][0].tolist())
model, by_token = trainer.model.eval(), {}
with torch.no_grad():
    packed = model(input_ids=row["input_ids"].to(model.device), position_ids=row["position_ids"].to(model.device))
    start = 0
    for name, sample in zip(("first", "second"), samples):
        alone = model(input_ids=torch.tensor([sample["input_ids"]], device=model.device)).logits[0].float()
        by_token[name] = (packed.logits[0, start:start + len(alone)].float() - alone).abs().amax(-1).tolist()
        start += len(alone)
        print(f"{name} sequence ({len(alone)} tokens), largest |logit packed - alone| at its first 8 tokens:",
              " ".join(f"{d:.1g}" for d in by_token[name][:8]))
scale = alone.abs().max().item()  # the logits' size
tolerance = max(4 * max(by_token["first"]), 4 * torch.finfo(model.dtype).eps * scale)
print(f"tolerance = max(4 x {max(by_token['first']):.2g}, 4 x {torch.finfo(model.dtype).eps:.2g} x {scale:.2g})"
      f" = {tolerance:.2g}; the second sequence's largest: {max(by_token['second']):.2g}")

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
first, later = packed_vs_alone(trainer)
packing = tour.finding(checkup(trainer, only=["packing"], show=False), "packing")
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
changed = {"check-up": [part for part in before if before[part] != tour.fingerprint(fixed)[part]]}
print(f"exit code {fixed_report.exit_code}; parts the check-up changed: {changed['check-up'] or 'none'}")

# %% [markdown]
# A fingerprint that could not see a change would prove nothing: one real training step must change it. Then a
# second check-up, now that the optimizer holds state:

# %%
fixed.train()
trained = tour.fingerprint(fixed)
changed["training step"] = [part for part in trained if trained[part] != before[part]]
second = checkup(fixed, show=False)
changed["second check-up"] = [part for part in trained if trained[part] != tour.fingerprint(fixed)[part]]
print({why: parts or "none" for why, parts in changed.items()}, f"\nloss {fixed.state.log_history[-1]['train_loss']:.3g}")

# %% [markdown]
# ## 5. The other lessons' traps
#
# Each in the trainer it lives in, built by the course's `examples` module, with and without the line that fixes
# it; only that lesson's probe runs:

# %%
def verdicts(probe: str, *trainers) -> tuple[dict, ...]:
    return tuple(tour.finding(checkup(t, only=[probe], show=False), probe) for t in trainers)


common, out = {"device": run.device, "seed": run.seed, "rows": sizes.rows}, run.output_dir
window = {"per_device_train_batch_size": sizes.batch_size, "gradient_accumulation_steps": sizes.accumulation}
lora = {task: LoraConfig(target_modules=["q_proj", "v_proj"], task_type=task) for task in (None, "SEQ_CLS")}
traps = {
    "01 packing: OPT, padding-free": (packing, tour.finding(fixed_report, "packing")),
    "03 fp16_adamw: fp16 weights": (tour.finding(report, "fp16_adamw"), tour.finding(fixed_report, "fp16_adamw")),
    "02 accumulation: a loss that takes the mean": verdicts("accumulation", *(
        examples.custom_trainer(tokenizer, out / loss.__name__, loss, **common, **window,
                                model=make_causal_lm(tokenizer, seed=run.seed))
        for loss in (examples.MeanLossTrainer, examples.SumLossTrainer))),
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
    print(f"{name}: {trap['status']}, {trap['measured']}\n    fixed: {fix['status']}, {fix['measured'] or fix['reason']}")
fails = [sum(pair[i]["status"] == "fail" for pair in traps.values()) for i in (0, 1)]
title = f"{fails[0]} of {len(traps)} traps fail the check-up; with the fix line, {fails[1]} do"
tour.plot_verdicts(traps, title, run.output_dir);

# %% [markdown]
# 04 is counted, not failed: transformers raises its right-padding error for Qwen2 with FlashAttention-2 in
# 4.49.0-4.52.4, not in the version installed here (`modeling_qwen2.py`, read in each:
# [the known-bugs table](../docs/checkup.md#the-known-bugs-table-srctrl_cliniccheckupknown_bugsyaml)). Installed
# beside lesson 04's versions, the probe meets that error itself and fails
# ([measured there](../docs/checkup.md#proven-where-the-bugs-lived)). GRPO's batch rule (lesson 05) is TRL's own:
# `GRPOConfig` refuses a bad generation batch before a trainer exists (TRL 1.16.0, `grpo_config.py`,
# `__post_init__`), and `trl-clinic checkup grpo --config recipe.yaml` reports that refusal as a `grpo_config` fail.
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

# %% jupyter={"source_hidden": true} tags=["checks"]
def symptom_checks(n: dict) -> dict:
    """Your trainer's two traps fail by measurement, and the packed row shows why, token by token."""
    f, row, traps = n["mine"], n["by_token"], n["traps"]
    return {
        "your trainer: packing fails, measured (OPT, padding-free)": f["packing"] == "fail measured",
        "your trainer: fp16_adamw fails, measured (fp16 weights, adamw_torch)": f["fp16_adamw"] == "fail measured",
        "your trainer's check-up exits 1": n["exit_code"] == 1,
        "in the row, the first sequence differs by rounding only (<= 4 units in the last place at the logits' size)":
            max(row["first"]) <= n["four_ulps"],
        "in the row, the second sequence's first token already differs beyond it": row["second"][0] > n["tolerance"],
        "the pasted check sees the later sequence change (> 1e-2) and the first not (< 1e-2)":
            n["pasted"] is not None and n["pasted"][1] > 1e-2 > n["pasted"][0],
        "the custom loss fails the accumulation probe": traps["02 accumulation: a loss that takes the mean"][0]["status"] == "fail",
        "LoRA without SEQ_CLS fails reward_head": traps["03 reward_head: LoRA, no task_type"][0]["status"] == "fail",
        "Qwen2 with use_cache=True runs right-padded forwards with a cache":
            traps["04 padding_cache: Qwen2, use_cache"][0]["value"] > 0,
        "an all-or-nothing reward leaves every GRPO group equal":
            traps["05 equal_rewards: a reward never earned"][0]["status"] == "fail",
    }


# %% jupyter={"source_hidden": true} tags=["checks"]
def fix_checks(n: dict) -> dict:
    """Each fix line passes its probe, and the check-up changed no part of the trainer a training step changes."""
    traps, changed = n["traps"], n["changed"]
    return {
        "the fixed trainer's check-up exits 0 with no fail": n["fixed_exit_code"] == 0 and "fail" not in n["fixed"].values(),
        "padding_free=False: the pasted check finds no packed row": n["pasted_fixed"] is None,
        "float32 weights pass fp16_adamw": traps["03 fp16_adamw: fp16 weights"][1]["status"] == "ok",
        "the loss divided by num_items_in_batch passes accumulation":
            traps["02 accumulation: a loss that takes the mean"][1]["status"] == "ok",
        "task_type='SEQ_CLS' passes reward_head": traps["03 reward_head: LoRA, no task_type"][1]["status"] == "ok",
        "use_cache=False: no right-padded forward with a cache": traps["04 padding_cache: Qwen2, use_cache"][1]["value"] == 0,
        "a reward that differs within groups passes equal_rewards":
            traps["05 equal_rewards: a reward never earned"][1]["status"] == "ok",
        "one training step changes the weights and the optimizer in the fingerprint":
            {"weights and buffers", "optimizer"} <= set(changed["training step"]),
        "the check-up changed no part of the trainer, before and after training":
            changed["check-up"] == [] and changed["second check-up"] == [],
    }


def checks(n: dict) -> tuple[dict, dict]:
    """Every check runs today's real trainers and probes (nothing re-created or set by hand)."""
    return ({name: measured(ok) for name, ok in symptom_checks(n).items()},
            {name: measured(ok) for name, ok in fix_checks(n).items()})


# %% jupyter={"source_hidden": true}
numbers = {"mine": {f.probe: f"{f.status} {f.decided}" for f in report.findings}, "exit_code": report.exit_code,
           "by_token": by_token, "tolerance": tolerance, "four_ulps": 4 * torch.finfo(model.dtype).eps * scale,
           "pasted": (first, later), "pasted_fixed": packed_vs_alone(fixed), "traps": traps,
           "fixed": tour.statuses(fixed_report), "fixed_exit_code": fixed_report.exit_code, "changed": changed}
summary = (f"checkup(trainer) on an OPT SFTTrainer loaded in fp16 with padding-free batches failed packing (a later "
           f"sequence's logits {later:.2g} from alone, rounding {first:.2g}) and fp16_adamw, by measurement; "
           f"{fails[0]} of {len(traps)} lesson traps failed and {fails[1]} with their fix lines; padding_free=False "
           f"and float32 weights exit {fixed_report.exit_code}, and no part of the trainer changed.")
metrics = save_metrics(run, "06", numbers, checks, summary=summary)
print(summary)
conclude(metrics, run.output_dir)
