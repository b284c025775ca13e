# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 06 · Check-up: does your own trainer have these failures?
#
# **The question** (this project's issue 22; [README, "Check your own trainer"](../README.md#check-your-own-trainer)): you now know five failures (packed
# sequences that see each other, accumulation that reweights tokens, fp16 AdamW and a frozen reward head, right
# padding with a cache, GRPO groups that teach nothing); does your own trainer have them? `checkup(trainer)`,
# called just before `trainer.train()`, runs the lessons' probes on your real model, collator and arguments, and
# `trl-clinic checkup sft --config recipe.yaml` does the same for the trainer `trl sft` would build.
#
# **You will learn**
# * to call `checkup(trainer)` before training, and to read its table: status, the measured number, the fix;
# * which probe catches which lesson's trap, on a tiny trainer carrying each trap, and what a healthy one shows;
# * the traps users hit most now: labels that are all masked, an EOS that is never a target, parameters
#   that get no gradient;
# * the command line, `trl-clinic checkup sft --config recipe.yaml`, its exit code for CI.
#
# **You should know** lessons [01](01_padding_free_high_loss.ipynb) (padding-free),
# [02](02_gradient_accumulation_loss.ipynb) (`num_items_in_batch`), [03](03_lora_reward_nan.ipynb) (fp16
# AdamW, `SEQ_CLS`), [04](04_qwen2_padding_side.ipynb) (right padding and the cache) and
# [05](05_grpo_sigfpe.ipynb) (GRPO's groups); how TRL's scripts take a recipe
# ([TRL's CLI docs](https://huggingface.co/docs/trl/clis)).
#
# **Time**: 20 s to run on the cpu profile (seed 0, 2 CPU cores, one lesson at a time: `trl-clinic run 06
# --profile cpu --jobs 1`); gpu profile not measured yet. About 20 minutes to read and try the exercises.
#
# **What is real here.** Every trainer is a real one of today's TRL or transformers, every probe runs today's
# code paths on it, and nothing is **re-created** or **injected**. Two traps are set up by hand and say so where
# they appear: `model_accepts_loss_kwargs = False` (what transformers sets for a model whose `forward` takes no
# `**kwargs`) and `disable_input_require_grads()`. Old versions do not run here: where a finding depends on a
# version window, the check-up matches its table of known bugs (the README's, as data).

# %% tags=["parameters"]
profile = "auto"  # "auto" (gpu when CUDA is present), "cpu" or "gpu"
seed = 0
output_dir = None  # None: outputs/06_checkup_your_trainer at the repository root

# %%
import inspect

import torch
from peft import LoraConfig, get_peft_model
from transformers import DataCollatorForLanguageModeling

from trl_clinic import checkup
from trl_clinic.course import examples
from trl_clinic.checkup.known_bugs import Facts, matching
from trl_clinic.course.companions import checkup_tour as tour
from trl_clinic.course.data import all_in_category_reward
from trl_clinic.course.models import make_causal_lm
from trl_clinic.course.parameters import start_run
from trl_clinic.course.results import failed_checks, save_metrics
from trl_clinic.course.tokenizer import build_tokenizer

run = start_run("06", profile, seed, output_dir)
print(run.describe())
sizes = run.sizes  # this lesson's numbers for the profile (lessons.yaml)
tokenizer = build_tokenizer()
common = {"device": run.device, "seed": run.seed, "rows": sizes.rows}  # every example trainer's shared settings

# %% [markdown]
# ## 1. The symptom: a custom `compute_loss`, checked before it trains
#
# A `Trainer` subclass whose `compute_loss` takes the mean over its micro-batch, as many scripts do, with
# gradient accumulation. It would train without an error. One call before `trainer.train()`:

# %% tags=["symptom"]
trainer = examples.custom_trainer(tokenizer, run.output_dir / "custom", examples.MeanLossTrainer,
                                  model=make_causal_lm(tokenizer, seed=run.seed), **common,
                                  per_device_train_batch_size=sizes.batch_size,
                                  gradient_accumulation_steps=sizes.accumulation)
report = checkup(trainer)  # just before trainer.train()
found = {"symptom": tour.finding(report, "accumulation")}
print(f"exit code {report.exit_code}; accumulation: {found['symptom']['status']}, {found['symptom']['measured']}")

# %% [markdown]
# ## 2. Accumulation (lesson 02): what the probe measured, and the fix
#
# The probe calls the trainer's own `get_batch_samples` and `training_step` twice on the same samples: as
# k micro-batches of b, then as one batch of b·k, and compares the two gradients (no optimizer step, dropout
# off). The trap, as the class writes it:

# %%
print(inspect.getsource(examples.MeanLossTrainer.compute_loss))

# %% [markdown]
# The fix in your script: sum the token losses and divide by `num_items_in_batch` when the Trainer gives it
# (`examples.SumLossTrainer`). The same data, model and accumulation:

# %%
fixed = examples.custom_trainer(tokenizer, run.output_dir / "custom-fixed", examples.SumLossTrainer,
                                model=make_causal_lm(tokenizer, seed=run.seed), **common,
                                per_device_train_batch_size=sizes.batch_size,
                                gradient_accumulation_steps=sizes.accumulation)
found["fixed"] = tour.finding(checkup(fixed, only=["accumulation"]), "accumulation")

# %% [markdown]
# The old path, **set by hand**: transformers 5.23 sets `model_accepts_loss_kwargs = False` itself when the
# model's `forward` takes no `**kwargs` (`trainer.py`, `Trainer.__init__`), and then backpropagates each
# micro-batch's own mean. On TRL's own `SFTTrainer`:

# %%
old = examples.sft_trainer(tokenizer, run.output_dir / "sft-old", model=make_causal_lm(tokenizer, seed=run.seed), **common,
                          gradient_accumulation_steps=sizes.accumulation)
old.model_accepts_loss_kwargs = False  # set by hand: a model whose forward takes no **kwargs
found["old path"] = tour.finding(checkup(old, only=["accumulation"]), "accumulation")

# %% [markdown]
# ## 3. Packing (lesson 01): OPT with `padding_free=True`
#
# The probe takes one batch from the trainer's own collator and compares each sequence's loss inside the
# packed row with the same sequence alone. Lesson 01 measured OPT contaminated by today's correct
# padding-free batches, with no warning; the same call on Llama:

# %%
packed = {family: examples.sft_trainer(tokenizer, run.output_dir / f"sft-{family}", family=family,
                                       model=make_causal_lm(tokenizer, family, seed=run.seed), **common,
                                       padding_free=True, max_length=None,
                                       per_device_train_batch_size=sizes.packed_batch_size)
          for family in ("opt", "llama")}
packing = {family: checkup(t, only=["packing", "known_bugs"]) for family, t in packed.items()}

# %% [markdown]
# The two probes' numbers side by side, traps against fixes (a bar at the bottom is 0):

# %%
tour.plot_traps_and_fixes(found, {family: tour.finding(r, "packing") for family, r in packing.items()},
                          run.output_dir)

# %% [markdown]
# ## 4. Precision and the reward head (lesson 03)
#
# fp16 trainable weights with the non-fused AdamW (`optim="adamw_torch"`), and a LoRA reward model whose
# config has no `task_type="SEQ_CLS"`, so its `score` head stays frozen:

# %%
half = make_causal_lm(tokenizer, seed=run.seed, dtype=torch.float16)
fp16 = examples.custom_trainer(tokenizer, run.output_dir / "fp16", model=half, **common, optim="adamw_torch")
found["fp16 adamw"] = tour.finding(checkup(fp16, only=["fp16_adamw"]), "fp16_adamw")
heads = {name: examples.reward_trainer(tokenizer, run.output_dir / f"reward-{name}", **common, peft_config=LoraConfig(
    target_modules=["q_proj", "v_proj"], **task)) for name, task in (("no task_type", {}), ("SEQ_CLS", {"task_type": "SEQ_CLS"}))}
reward = {name: tour.finding(checkup(t, only=["reward_head"]), "reward_head") for name, t in heads.items()}

# %% [markdown]
# ## 5. Right padding and the cache (lesson 04)
#
# The probe counts the forwards of one training loss and one evaluation step that run right-padded rows
# with a KV cache built (lesson 04's `ForwardAudit`). TRL's DPO, and a plain `Trainer` on Qwen2 given
# `use_cache=True` (transformers 5.23 copies it into the model's config: `trainer.py`, `Trainer.__init__`):

# %%
dpo = examples.dpo_trainer(tokenizer, run.output_dir / "dpo", **common)
qwen2 = examples.custom_trainer(tokenizer, run.output_dir / "qwen2-cache", family="qwen2", **common, use_cache=True)
cache = {name: tour.finding(checkup(t, only=["padding_cache"]), "padding_cache")
         for name, t in (("dpo", dpo), ("qwen2, use_cache=True", qwen2))}

# %% [markdown]
# Today the count is only counted: no version window of the known-bugs table applies, so it is `ok`. On the
# report's own versions (stated here, not installed) the table names the bug:

# %%
stated = Facts(model_type="qwen2", attn_implementation="flash_attention_2", trainer="dpo",
               versions={"transformers": "4.51.3", "trl": "0.17.0"})
print([entry["id"] for entry in matching(stated)], [entry["id"] for entry in matching(stated, "padding_cache")])

# %% [markdown]
# ## 6. GRPO (lesson 05): groups whose rewards are all equal
#
# The probe samples `num_generations` completions for a few prompts with the trainer's own temperature and
# scores them with its own reward functions. An all-or-nothing reward that a random policy never earns,
# against one that differs between completions:

# %%
grpo = {name: examples.grpo_trainer(tokenizer, run.output_dir / f"grpo-{name}", reward=reward_function, **common,
                                    per_device_train_batch_size=sizes.grpo_batch_size)  # / num_generations = prompts
        for name, reward_function in (("all or nothing", all_in_category_reward), ("length", examples.length_reward))}
groups = {name: tour.finding(checkup(t, only=["grpo_config", "equal_rewards"]), "equal_rewards")
          for name, t in grpo.items()}

# %% [markdown]
# ## 7. The label traps users hit most now
#
# Three traps that no lesson covered: batches whose every label is masked (**set by hand** here, as a
# completion mask that covers everything leaves them), pad == eos with transformers' language-modeling
# collator (a real setting: it masks every pad, and so every EOS), and LoRA with reentrant gradient
# checkpointing whose inputs need no gradient (**set by hand** with `disable_input_require_grads()`).

# %%
masked = examples.custom_trainer(tokenizer, run.output_dir / "masked", **common)
masked.train_dataset = masked.train_dataset.map(lambda row: {"labels": [-100] * len(row["input_ids"])})  # by hand
found["labels"] = tour.finding(checkup(masked, only=["labels_present"]), "labels_present")

# %%
tokenizer.save_pretrained(run.output_dir / "pad-is-eos")
pad_is_eos = type(tokenizer).from_pretrained(run.output_dir / "pad-is-eos")
pad_is_eos.pad_token = pad_is_eos.eos_token  # the line many scripts copy
collator = DataCollatorForLanguageModeling(pad_is_eos, mlm=False)  # labels = -100 wherever input == pad
eos = examples.custom_trainer(pad_is_eos, run.output_dir / "eos", **common, data_collator=collator)
found["eos"] = tour.finding(checkup(eos, only=["eos_label"]), "eos_label")

# %%
lora = get_peft_model(make_causal_lm(tokenizer, seed=run.seed), LoraConfig(target_modules=["q_proj", "v_proj"]))
lora.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})
lora.base_model.model.disable_input_require_grads()  # set by hand: input embeddings need no gradient
checkpointed = examples.custom_trainer(tokenizer, run.output_dir / "lora", model=lora, **common)
found["gradients"] = tour.finding(checkup(checkpointed, only=["gradients_reach"]), "gradients_reach")

# %% [markdown]
# ## 8. A healthy trainer passes, and stays as it was
#
# TRL's own `SFTTrainer` with gradient accumulation, every probe. The check-up promises to change nothing:
# the fingerprint hashes every weight's bytes, the optimizer state, the random generators, the modules'
# modes and the trainer's attributes, before and after.

# %%
healthy = examples.sft_trainer(tokenizer, run.output_dir / "sft-healthy", **common,
                               gradient_accumulation_steps=sizes.accumulation)
before = tour.fingerprint(healthy)
healthy_report = checkup(healthy)
untouched = before == tour.fingerprint(healthy)
print(f"exit code {healthy_report.exit_code}; fingerprint unchanged: {untouched}")

# %% [markdown]
# ## 9. On the command line: `trl-clinic checkup sft --config recipe.yaml`
#
# The same engine, in TRL's own convention: TRL's parser reads the recipe, TRL's `trl sft` script builds the
# trainer, and its call to `train()` is intercepted, so nothing trains. The notebook writes a local OPT model
# folder, a local `train.jsonl` and a recipe with `padding_free: true` into its output folder:

# %%
recipe = tour.write_recipe(run.output_dir / "cli", make_causal_lm(tokenizer, "opt", seed=run.seed), tokenizer,
                           sizes.rows, run.seed, padding_free=True, max_length=None, bf16=False,
                           per_device_train_batch_size=sizes.packed_batch_size,
                           gradient_accumulation_steps=sizes.accumulation, **run.cpu_flags())
print(recipe.read_text())

# %%
command = tour.trl_clinic("checkup", "sft", "--config", str(recipe), timeout=sizes.command_timeout_s)
print("$", " ".join(command.argv), "\n" + command.stdout, f"exit code: {command.returncode}")

# %% [markdown]
# The fix, in the recipe: `padding_free: false`, the only line that changes. The same command, with `--json` as a
# CI job would run it (each probe's status read from the JSON), and the probes that failed before and after:

# %%
recipe.write_text(recipe.read_text().replace("padding_free: true", "padding_free: false"))
fixed_command = tour.trl_clinic("checkup", "sft", "--config", str(recipe), "--json", timeout=sizes.command_timeout_s)
print("$", " ".join(fixed_command.argv), "\n", tour.command_numbers(fixed_command))
print({name: [p for p, status in tour.command_numbers(c)["statuses"].items() if status == "fail"]
       for name, c in (("padding_free: true", command), ("padding_free: false", fixed_command))})

# %% [markdown]
# ## 10. What to remember
#
# * Call `checkup(trainer)` just before `trainer.train()`: a few forward and backward passes on your real
#   model, collator and arguments, and nothing about the trainer changes.
# * Each finding carries the number it measured and the threshold it used: a `fail` is a measurement, not a
#   guess from the config; a `skipped` says why the probe does not apply.
# * A custom `compute_loss` must use `num_items_in_batch`; padding-free needs a family whose mask reads
#   `position_ids`; fp16 weights need a fused AdamW or none at all; a LoRA reward model needs `SEQ_CLS`; a
#   GRPO reward must differ within groups; check that labels, EOS and gradients are really there.
# * In CI: `trl-clinic checkup sft --config recipe.yaml --json` exits 1 on a fail.
#
# **The fix in your script**: the one line in the failing row's `fix` column, then the check-up again.

# %% [markdown]
# ## 11. Exercise
#
# 1. Run only the `accumulation` probe on the symptom's trainer built with `gradient_accumulation_steps=1`.
#    What does it report, and why?
#    <details><summary>Hint</summary>A probe that does not apply raises <code>Skip</code>; the finding's
#    <code>reason</code> says why. Pass <code>only=["accumulation"]</code>.</details>
# 2. Which of the families Llama, Qwen2 and OPT does the `packing` probe flag with `padding_free=True`?
#    <details><summary>Hint</summary>Build <code>examples.sft_trainer(..., family=f, padding_free=True,
#    max_length=None, per_device_train_batch_size=4)</code> for each and read the finding's
#    <code>status</code> and <code>value</code>.</details>
# 3. For CI, get the symptom trainer's report as JSON and list the probes that failed.
#    <details><summary>Hint</summary><code>report.to_json()</code> holds one entry per finding under
#    <code>"findings"</code>, each with <code>"probe"</code> and <code>"status"</code>.</details>
#
# Worked solutions: [`solutions/06_checkup_your_trainer.py`](solutions/06_checkup_your_trainer.py) (a test runs them).

# %% [markdown]
# ## Checks
#
# The claims above, asserted on this run's numbers.

# %% jupyter={"source_hidden": true} tags=["checks"]
def symptom_checks(n: dict) -> dict:
    """Each trap's finding is a fail with the number that crossed its threshold (a test feeds runs without it)."""
    f = n["findings"]
    return {
        "the custom compute_loss fails the accumulation probe (gradient error > 1e-3)":
            f["symptom"]["status"] == "fail" and f["symptom"]["value"] > 1e-3 and n["symptom_exit_code"] == 1,
        "model_accepts_loss_kwargs=False (set by hand) fails it too": f["old path"]["status"] == "fail",
        "OPT padding-free fails the packing probe (loss change > 1e-3)":
            n["packing"]["opt"]["status"] == "fail" and n["packing"]["opt"]["value"] > 1e-3,
        "fp16 weights with adamw_torch fail the fp16_adamw probe": f["fp16 adamw"]["status"] == "fail",
        "a LoRA reward model without SEQ_CLS fails the reward_head probe": n["reward"]["no task_type"]["status"] == "fail",
        "a Qwen2 Trainer given use_cache=True runs right-padded forwards with a cache":
            n["cache"]["qwen2, use_cache=True"]["value"] > 0,
        "an all-or-nothing reward leaves every group equal (equal_rewards fails)":
            n["groups"]["all or nothing"]["status"] == "fail" and n["groups"]["all or nothing"]["value"] == 1,
        "batches whose every label is masked (set by hand) fail labels_present": f["labels"]["status"] == "fail",
        "pad == eos with transformers' collator leaves no EOS target": f["eos"]["status"] == "fail",
        "checkpointed LoRA without input gradients leaves tensors without a gradient": f["gradients"]["status"] == "fail",
        "the command line fails the OPT padding-free recipe with exit code 1":
            n["command"]["returncode"] == 1 and n["command"]["statuses"].get("packing") == "fail",
    }


# %% jupyter={"source_hidden": true} tags=["checks"]
def fix_checks(n: dict) -> dict:
    """The healthy trainers and the fixes pass, and the check-up changed nothing."""
    f = n["findings"]
    return {
        "the loss divided by num_items_in_batch passes (gradient error <= 1e-3)":
            f["fixed"]["status"] == "ok" and f["fixed"]["value"] <= 1e-3,
        "Llama padding-free passes the packing probe (loss change <= 1e-3)":
            n["packing"]["llama"]["status"] == "ok" and n["packing"]["llama"]["value"] <= 1e-3,
        "a LoRA reward model with SEQ_CLS passes the reward_head probe": n["reward"]["SEQ_CLS"]["status"] == "ok",
        "TRL's DPO builds no cache on right-padded rows": n["cache"]["dpo"]["value"] == 0,
        "a reward that differs within groups passes equal_rewards": n["groups"]["length"]["status"] == "ok",
        "the healthy SFTTrainer has no warn or fail": set(n["healthy"].values()) <= {"ok", "skipped"}
        and n["healthy_exit_code"] == 0,
        "the check-up left the healthy trainer byte for byte as it was": n["untouched"],
        "the fixed recipe passes on the command line with exit code 0": n["fixed_command"]["returncode"] == 0
        and bool(n["fixed_command"]["statuses"]) and "fail" not in n["fixed_command"]["statuses"].values(),
    }


def checks(n: dict) -> tuple[dict, dict]:
    return symptom_checks(n), fix_checks(n)


# %% jupyter={"source_hidden": true}
numbers = {"findings": found, "symptom_exit_code": report.exit_code, "reward": reward, "cache": cache,
           "groups": groups, "packing": {family: tour.finding(r, "packing") for family, r in packing.items()},
           "healthy": tour.statuses(healthy_report), "healthy_exit_code": healthy_report.exit_code,
           "untouched": untouched, "command": tour.command_numbers(command),
           "fixed_command": tour.command_numbers(fixed_command)}
summary = (f"checkup(trainer) failed a custom compute_loss that ignores num_items_in_batch (gradient "
           f"{found['symptom']['value']:.0%} off one big batch), OPT padding-free (loss change "
           f"{numbers['packing']['opt']['value']:.2g}), fp16 AdamW, a reward head without SEQ_CLS, all-equal GRPO "
           f"rewards and three label traps; the healthy SFTTrainer passed unchanged byte for byte, and "
           f"`trl-clinic checkup sft` exited {command.returncode} on the OPT recipe, {fixed_command.returncode} fixed.")
metrics = save_metrics(run, "06", numbers, checks, summary=summary)
assert not failed_checks(metrics), f"checks failed: {failed_checks(metrics)}"
print(summary)
print(f"all checks passed; metrics in {run.output_dir / 'metrics.json'}")
