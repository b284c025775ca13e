# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 06, deeper · The command line, the label traps, a model that takes no loss keywords, the table
#
# [The core](../06_checkup_your_trainer.ipynb) ran `checkup(trainer)` on your own SFTTrainer, found OPT's
# padding-free contamination and fp16 AdamW by measurement, fixed both lines and showed the check-up changed no
# part of the trainer. Here: the same check-up from a shell (`trl-clinic checkup`, its exit code, its JSON, and
# GRPO's batch rule, which TRL's config refuses), the label traps users meet now (labels cut away, an EOS that is
# never a target, gradients that never arrive), the accumulation trap of a model whose `forward` lists its
# arguments, which model families pack safely, DPO's cache, and what the known-bugs table says for lesson 04's
# report's versions.
#
# > **Hosted** (Colab, Kaggle, no clone): upload the wheel `uv build` makes, then run `%pip install "./trl_clinic-0.1.0-py3-none-any.whl[course]"` first.

# %% tags=["parameters"]
profile = "auto"  # "auto" (gpu when CUDA is present), "cpu" or "gpu"
seed = 0
output_dir = None  # None: outputs/06_checkup_your_trainer_deeper at the repository root

# %%
import trl_clinic.course  # first: the lessons' offline mode, and two optional libraries' warnings kept quiet
import inspect
import textwrap

import torch
import yaml
from datasets import load_dataset
from peft import LoraConfig, get_peft_model
from transformers import (DataCollatorForLanguageModeling, DataCollatorForSeq2Seq, LlamaForCausalLM, Trainer,
                          TrainingArguments)

from trl_clinic import checkup
from trl_clinic.checkup.known_bugs import Facts, matching
from trl_clinic.course import examples
from trl_clinic.course.lessons.lesson_06_checkup_tour import companion as tour
from trl_clinic.course.models import make_causal_lm, model_config
from trl_clinic.course.parameters import start_run
from trl_clinic.course.results import check
from trl_clinic.course.stand_ins import ListedArgumentsLlama
from trl_clinic.course.tokenizer import build_tokenizer

run = start_run("06-deeper", profile, seed, output_dir)
print(run.describe())
sizes, tokenizer, out = run.sizes, build_tokenizer(), run.output_dir
common = {"device": run.device, "seed": run.seed, "rows": sizes.rows}  # every example trainer's shared settings
found = {}

# %% [markdown]
# ## 1. From a shell: `trl-clinic checkup sft --config recipe.yaml`
#
# The command builds the trainer exactly as `trl sft --config recipe.yaml` would (TRL's own parser and script)
# and intercepts its call to `train()`, so nothing trains (`trl_clinic/checkup/command.py`). A local OPT model
# folder, a local `train.jsonl` and a recipe with `padding_free: true`:

# %%
recipe = tour.write_recipe(out / "cli", make_causal_lm(tokenizer, "opt", seed=run.seed), tokenizer, sizes.rows,
                           run.seed, padding_free=True, max_length=None, bf16=False,
                           per_device_train_batch_size=sizes.packed_batch_size,
                           gradient_accumulation_steps=sizes.accumulation, **run.cpu_flags())
command = tour.trl_clinic("checkup", "sft", "--config", str(recipe), timeout=sizes.command_timeout_s)
print(f"$ trl-clinic checkup sft --config {recipe.name}\n{command.stdout}exit code: {command.returncode}")

# %% [markdown]
# The fix in the recipe, `padding_free: false`, and the same command with `--json`, as a CI job runs it:

# %%
recipe.write_text(recipe.read_text().replace("padding_free: true", "padding_free: false"))
fixed_command = tour.trl_clinic("checkup", "sft", "--config", str(recipe), "--json", timeout=sizes.command_timeout_s)
cli = {name: tour.command_numbers(c) for name, c in (("padding_free: true", command), ("padding_free: false", fixed_command))}
print({name: (c["returncode"], [p for p, s in c["statuses"].items() if s == "fail"]) for name, c in cli.items()})

# %% [markdown]
# ## 2. GRPO's batch rule is TRL's own
#
# No probe of a built GRPO trainer can fail the rule of lesson 05: `GRPOConfig.__post_init__` refuses a
# generation batch that is not made of whole groups before any trainer exists (TRL 1.16.0 `trainer/grpo_config.py`).
# The command reports that refusal, and only a refusal raised in one of TRL's config classes, as a `grpo_config`
# fail with TRL's message; any other build error is an `error`, exit code 3. Three completions a step, groups of 4:

# %%
local = {key: value for key, value in yaml.safe_load(recipe.read_text()).items()
         if key in ("model_name_or_path", "dataset_name", "output_dir", "report_to", "seed", "bf16", "use_cpu")}
grpo_recipe = recipe.with_name("grpo.yaml")
grpo_recipe.write_text(yaml.safe_dump({**local, "reward_funcs": ["trl_clinic.course.examples.length_reward"],
                                       "num_generations": 4, "per_device_train_batch_size": 3}))
refused = tour.trl_clinic("checkup", "grpo", "--config", str(grpo_recipe), "--json", timeout=sizes.command_timeout_s)
grpo_finding = tour.json_findings(refused)[0]
print(refused.returncode, grpo_finding["probe"], grpo_finding["status"], grpo_finding["decided"],
      textwrap.fill(grpo_finding["fix"], 116))

# %% [markdown]
# Four completions a step, one whole group: TRL builds the trainer and every probe runs on it.

# %%
grpo_recipe.write_text(grpo_recipe.read_text().replace("per_device_train_batch_size: 3", "per_device_train_batch_size: 4")
                       + "max_completion_length: 8\n")
accepted = tour.trl_clinic("checkup", "grpo", "--config", str(grpo_recipe), "--json", timeout=sizes.command_timeout_s)
grpo = {name: {**tour.command_numbers(c), "first": [tour.json_findings(c)[0][k] for k in ("probe", "status", "decided")]}
        for name, c in (("groups of 4, 3 completions", refused), ("groups of 4, 4 completions", accepted))}
print({name: (g["returncode"], sorted(set(g["statuses"].values()))) for name, g in grpo.items()})

# %% [markdown]
# ## 3. The label traps
#
# Three probes watch the labels and the gradients, whatever the lesson. **Labels cut away**: your own
# preprocessing masks the prompt and truncates to a length shorter than the prompts, so no completion token is
# left to learn from (TRL 1.16.0's `SFTTrainer` drops such rows itself, `sft_trainer.py`; a plain `Trainer` does not):

# %%
def completion_only(row: dict, max_length: int) -> dict:
    """Your preprocessing: loss on the completion only, then truncation."""
    prompt = tokenizer(row["prompt"])["input_ids"]
    completion = tokenizer(row["completion"])["input_ids"] + [tokenizer.eos_token_id]
    return {"input_ids": (prompt + completion)[:max_length], "labels": ([-100] * len(prompt) + completion)[:max_length]}


# %%
data = load_dataset("json", data_files=str(out / "cli" / "data" / "train.jsonl"), split="train")
shortest_prompt = min(len(tokenizer(p)["input_ids"]) for p in data["prompt"])
for name, length in (("cut", shortest_prompt), ("long enough", None)):
    rows = data.map(completion_only, fn_kwargs={"max_length": length}, remove_columns=data.column_names)
    plain = Trainer(model=make_causal_lm(tokenizer, seed=run.seed), train_dataset=rows,
                    args=TrainingArguments(**run.trainer_kwargs(f"labels-{name}", logging=False)),
                    data_collator=DataCollatorForSeq2Seq(tokenizer))
    found[f"labels, {name}"] = tour.finding(checkup(plain, only=["labels_present"], show=False), "labels_present")
print(f"max_length {shortest_prompt} (the shortest prompt):", found["labels, cut"]["measured"])

# %% [markdown]
# **An EOS that is never a target**: `pad_token = eos_token`, the line many scripts copy, with transformers'
# language-modeling collator, which sets the label to -100 wherever the input is the pad token, and so at every EOS
# (transformers 5.23.0 `data/data_collator.py`):

# %%
tokenizer.save_pretrained(out / "pad-is-eos")
pad_is_eos = type(tokenizer).from_pretrained(out / "pad-is-eos")
pad_is_eos.pad_token = pad_is_eos.eos_token  # the line many scripts copy
for name, tok in (("pad == eos", pad_is_eos), ("own pad", tokenizer)):
    eos = examples.custom_trainer(tok, out / f"eos-{name}", **common,
                                  data_collator=DataCollatorForLanguageModeling(tok, mlm=False))
    found[f"eos, {name}"] = tour.finding(checkup(eos, only=["eos_label"], show=False), "eos_label")
print({name: f["measured"] for name, f in found.items() if name.startswith("eos")})

# %% [markdown]
# **Gradients that never arrive**: LoRA with reentrant gradient checkpointing computes no gradient for the adapters
# when the checkpointed inputs need none. peft makes the input embeddings need one itself
# (`_prepare_model_for_gradient_checkpointing`, peft 0.21.2 `peft_model.py`), whichever comes first:

# %%
for order in ("checkpointing, then LoRA", "LoRA, then checkpointing"):
    base = make_causal_lm(tokenizer, seed=run.seed)
    if order.startswith("checkpointing"):
        base.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": True})
    lora = get_peft_model(base, LoraConfig(target_modules=["q_proj", "v_proj"]))
    if order.startswith("LoRA"):
        lora.base_model.model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": True})
    trainer = examples.custom_trainer(tokenizer, out / f"lora-{len(found)}", model=lora, **common)
    found[f"gradients, {order}"] = tour.finding(checkup(trainer, only=["gradients_reach"], show=False),
                                                "gradients_reach")
print({name: f["measured"] for name, f in found.items() if name.startswith("gradients")})

# %% [markdown]
# ## 4. A model whose `forward` lists its arguments
#
# transformers' `Trainer` hands `num_items_in_batch` to the model only when its `forward` takes `**kwargs` (or the
# class says `accepts_loss_kwargs`); otherwise it sets `model_accepts_loss_kwargs = False` and divides each
# micro-batch's mean loss by the accumulation steps, the weighting of lesson 02 (transformers 5.23.0 `trainer.py`,
# `Trainer.__init__`, "Model introspection"). `stand_ins.ListedArgumentsLlama` is such a subclass, set up on purpose
# (a stand-in: its checks say `injected`); it stands for any class that takes no loss keywords, lesson 02's
# Qwen2.5-VL among them. Its `forward`, and the fix, a `forward` that passes `**kwargs` on:

# %%
print("ListedArgumentsLlama.forward", inspect.signature(ListedArgumentsLlama.forward))


class KeywordsLlama(ListedArgumentsLlama):
    def forward(self, input_ids=None, attention_mask=None, position_ids=None, labels=None, use_cache=None, **kwargs):
        return LlamaForCausalLM.forward(self, input_ids=input_ids, attention_mask=attention_mask,
                                        position_ids=position_ids, labels=labels, use_cache=use_cache, **kwargs)


# %%
window = {"per_device_train_batch_size": sizes.batch_size, "gradient_accumulation_steps": sizes.accumulation}
accepts = {}
for cls in (ListedArgumentsLlama, KeywordsLlama):
    torch.manual_seed(run.seed)
    sft = examples.sft_trainer(tokenizer, out / cls.__name__, model=cls(model_config(tokenizer)), **common, **window)
    accepts[cls.__name__] = sft.model_accepts_loss_kwargs
    found[f"accumulation, {cls.__name__}"] = tour.finding(checkup(sft, only=["accumulation"], show=False),
                                                          "accumulation")
    print(cls.__name__, f"model_accepts_loss_kwargs={accepts[cls.__name__]}:",
          found[f"accumulation, {cls.__name__}"]["measured"])

# %% [markdown]
# ## 5. Which families pack safely, and DPO's cache
#
# The core's OPT fails the `packing` probe; Llama and Qwen2 read where `position_ids` restart (lesson 01):

# %%
families = {}
for family in ("opt", "llama", "qwen2"):
    packed = examples.sft_trainer(tokenizer, out / f"sft-{family}", family=family, padding_free=True,
                                  max_length=None, per_device_train_batch_size=sizes.packed_batch_size,
                                  model=make_causal_lm(tokenizer, family, seed=run.seed), **common)
    families[family] = tour.finding(checkup(packed, only=["packing"], show=False), "packing")
print({family: (f["status"], f"{f['value']:.2g}") for family, f in families.items()})

# %% [markdown]
# The two measured traps of sections 4 and 5 side by side:

# %%
accumulation = {name: found[f"accumulation, {name}"] for name in accepts}
tour.plot_deeper(families, accumulation, out);

# %% [markdown]
# TRL's `DPOTrainer` today: how many of its forwards run right-padded rows with a cache built (lesson 04)?

# %%
dpo = tour.finding(checkup(examples.dpo_trainer(tokenizer, out / "dpo", **common), only=["padding_cache"],
                           show=False), "padding_cache")
print(dpo["status"], dpo["measured"])

# %% [markdown]
# ## 6. The table, for versions you do not have
#
# Where a bug lived in versions that are not installed, the check-up can only match its table. transformers raises
# lesson 04's right-padding error for Qwen2 with FlashAttention-2 in 4.37.0-4.41.2 and 4.49.0-4.52.4, not in the
# version installed here (`modeling_qwen2.py`, read in each:
# [the known-bugs table](../../docs/checkup.md#the-known-bugs-table-srctrl_cliniccheckupknown_bugsyaml)); installed
# beside lesson 04's versions, the probe meets that error itself and fails
# ([measured there](../../docs/checkup.md#proven-where-the-bugs-lived)). Lesson 04's report (DPO on Qwen2 with
# FlashAttention-2), stated rather than installed:

# %%
stated = Facts(model_type="qwen2", attn_implementation="flash_attention_2", trainer="dpo",
               versions={"transformers": "4.51.3", "trl": "0.17.0"})
today = Facts(model_type="qwen2", attn_implementation="flash_attention_2", trainer="dpo")
table = {name: [entry["id"] for entry in matching(facts, "padding_cache")]
         for name, facts in (("the report's versions", stated), ("installed versions", today))}
print(table)

# %% [markdown]
# ## Checks
#
# The claims above, asserted on this run's numbers.

# %% jupyter={"source_hidden": true}
numbers = tour.deeper_numbers(cli, grpo, found, accepts, families, table, dpo)
check(run, numbers)
