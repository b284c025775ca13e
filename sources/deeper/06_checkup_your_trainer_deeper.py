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
# > **Hosted** (Colab, Kaggle, a server without the repository): upload the wheel (`uv build` makes it) and run `%pip install "./trl_clinic-0.1.0-py3-none-any.whl[course]"` in a cell first.

# %% tags=["parameters"]
profile = "auto"  # "auto" (gpu when CUDA is present), "cpu" or "gpu"
seed = 0
output_dir = None  # None: outputs/06_checkup_your_trainer_deeper at the repository root

# %%
import torch
import yaml
from datasets import load_dataset
from peft import LoraConfig, get_peft_model
from transformers import (DataCollatorForLanguageModeling, DataCollatorForSeq2Seq, LlamaForCausalLM, Trainer,
                          TrainingArguments)

from trl_clinic import checkup
from trl_clinic.checkup.known_bugs import Facts, matching
from trl_clinic.course import examples
from trl_clinic.course.companions import lesson_06_checkup_tour as tour
from trl_clinic.course.models import make_causal_lm, model_config
from trl_clinic.course.parameters import start_run
from trl_clinic.course.results import conclude, measured, save_metrics
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
print("$", " ".join(command.argv), "\n" + command.stdout, f"exit code: {command.returncode}")

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
# generation batch that is not made of whole groups before any trainer exists (trl `trainer/grpo_config.py`).
# The command reports that refusal, and only a refusal raised in one of TRL's config classes, as a `grpo_config`
# fail with TRL's message; any other build error is an `error`, exit code 3. Three completions a step, groups of 4:

# %%
local = {key: value for key, value in yaml.safe_load(recipe.read_text()).items()
         if key in ("model_name_or_path", "dataset_name", "output_dir", "report_to", "seed", "bf16", "use_cpu")}
grpo_recipe = recipe.with_name("grpo.yaml")
grpo_recipe.write_text(yaml.safe_dump({**local, "reward_funcs": ["trl_clinic.course.examples.length_reward"],
                                       "num_generations": 4, "per_device_train_batch_size": 3}))
refused = tour.trl_clinic("checkup", "grpo", "--config", str(grpo_recipe), "--json", timeout=sizes.command_timeout_s)
cli["grpo, 3 completions, groups of 4"] = tour.command_numbers(refused)
grpo_finding = tour.json_findings(refused)[0]
print(refused.returncode, grpo_finding["probe"], grpo_finding["status"], grpo_finding["decided"], grpo_finding["fix"])

# %% [markdown]
# ## 3. The label traps
#
# Three probes watch the labels and the gradients, whatever the lesson. **Labels cut away**: your own
# preprocessing masks the prompt and truncates to a length shorter than the prompts, so no completion token is
# left to learn from (TRL's `SFTTrainer` drops such rows itself; a plain `Trainer` does not):

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
# language-modeling collator, which sets the label to -100 wherever the input is the pad token, and so at every EOS:

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
# (`_prepare_model_for_gradient_checkpointing`, peft `peft_model.py`), whichever comes first:

# %%
for order in ("checkpointing, then LoRA", "LoRA, then checkpointing"):
    base = make_causal_lm(tokenizer, seed=run.seed)
    if order.startswith("checkpointing"):
        base.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})
    lora = get_peft_model(base, LoraConfig(target_modules=["q_proj", "v_proj"]))
    if order.startswith("LoRA"):
        lora.base_model.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})
    trainer = examples.custom_trainer(tokenizer, out / f"lora-{len(found)}", model=lora, **common)
    found[f"gradients, {order}"] = tour.finding(checkup(trainer, only=["gradients_reach"], show=False),
                                                "gradients_reach")
print({name: f["measured"] for name, f in found.items() if name.startswith("gradients")})

# %% [markdown]
# ## 4. A model whose `forward` lists its arguments
#
# transformers' `Trainer` hands `num_items_in_batch` to the model only when its `forward` takes `**kwargs` (or the
# class says `accepts_loss_kwargs`); otherwise it sets `model_accepts_loss_kwargs = False` and divides each
# micro-batch's mean loss by the accumulation steps, the weighting of lesson 02 (transformers `trainer.py`,
# `Trainer.__init__`, "Model introspection"). A subclass of your own, as a user writes one:

# %%
class ListedArgumentsLlama(LlamaForCausalLM):
    def forward(self, input_ids=None, attention_mask=None, position_ids=None, labels=None, use_cache=None):
        return super().forward(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                               labels=labels, use_cache=use_cache)


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
# Where a bug lived in versions that are not installed, the check-up can only match its table. Lesson 04's report
# (DPO on Qwen2 with FlashAttention-2), stated rather than installed:

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

# %% jupyter={"source_hidden": true} tags=["checks"]
def symptom_checks(n: dict) -> dict:
    """Each trap fails its probe through a real code path: the command line, the user's preprocessing, the copied
    pad line, the model class's signature, the OPT family, and the table for the report's versions."""
    f, cli = n["found"], n["cli"]
    return {
        "trl-clinic checkup sft fails the OPT padding-free recipe with exit code 1":
            cli["padding_free: true"]["returncode"] == 1 and cli["padding_free: true"]["statuses"].get("packing") == "fail",
        "trl-clinic checkup grpo reports GRPOConfig's refusal as a grpo_config fail (config), exit 1":
            cli["grpo, 3 completions, groups of 4"]["returncode"] == 1
            and n["grpo_finding"][:3] == ["grpo_config", "fail", "config"],
        "labels cut away by the user's truncation fail labels_present": f["labels, cut"]["status"] == "fail",
        "pad == eos with the language-modeling collator fails eos_label": f["eos, pad == eos"]["status"] == "fail",
        "a forward without **kwargs: the Trainer sets model_accepts_loss_kwargs=False":
            n["accepts"]["ListedArgumentsLlama"] is False,
        "and the accumulation probe fails it (gradient error > 1e-3)":
            f["accumulation, ListedArgumentsLlama"]["status"] == "fail"
            and f["accumulation, ListedArgumentsLlama"]["value"] > 1e-3,
        "OPT padding-free fails the packing probe": n["families"]["opt"]["status"] == "fail",
        "the table names the Qwen2 FlashAttention-2 window and DPO's cache for the report's versions":
            {"04-qwen2-fa2-right-padding-4.49", "04-trl-dpo-forward-keeps-the-cache"}
            <= set(n["table"]["the report's versions"]),
    }


# %% jupyter={"source_hidden": true} tags=["checks"]
def fix_checks(n: dict) -> dict:
    """The fixed settings pass, and today's library paths that were traps once are measured clean."""
    f, cli = n["found"], n["cli"]
    return {
        "the recipe with padding_free: false exits 0 with no fail": cli["padding_free: false"]["returncode"] == 0
            and bool(cli["padding_free: false"]["statuses"]) and "fail" not in cli["padding_free: false"]["statuses"].values(),
        "a max_length longer than the prompts passes labels_present": f["labels, long enough"]["status"] == "ok",
        "a pad token of its own passes eos_label": f["eos, own pad"]["status"] == "ok",
        "LoRA with reentrant checkpointing, in either order, gets every gradient (peft enables input gradients)":
            f["gradients, checkpointing, then LoRA"]["status"] == f["gradients, LoRA, then checkpointing"]["status"] == "ok",
        "a forward with **kwargs passes accumulation (gradient error <= 1e-3)":
            n["accepts"]["KeywordsLlama"] is True and f["accumulation, KeywordsLlama"]["status"] == "ok",
        "Llama and Qwen2 padding-free pass the packing probe":
            n["families"]["llama"]["status"] == n["families"]["qwen2"]["status"] == "ok",
        "TRL's DPO builds no cache on right-padded rows": n["dpo"]["value"] == 0,
        "the installed versions match no padding_cache window": n["table"]["installed versions"] == [],
    }


def checks(n: dict) -> tuple[dict, dict]:
    """Every check runs today's real trainers, probes and command (nothing re-created or set by hand)."""
    return ({name: measured(ok) for name, ok in symptom_checks(n).items()},
            {name: measured(ok) for name, ok in fix_checks(n).items()})


# %% jupyter={"source_hidden": true}
numbers = {"found": found, "cli": cli, "accepts": accepts, "families": families, "dpo": dpo, "table": table,
           "grpo_finding": [grpo_finding[key] for key in ("probe", "status", "decided", "fix")]}
summary = (f"`trl-clinic checkup sft` exited {command.returncode} on the OPT padding-free recipe and "
           f"{fixed_command.returncode} with padding_free: false; GRPOConfig's refusal came back as a grpo_config "
           f"{grpo_finding['status']} (exit {refused.returncode}); labels cut by truncation, pad == eos and a forward "
           f"without **kwargs (gradient error {found['accumulation, ListedArgumentsLlama']['value']:.2g}) failed their "
           f"probes by measurement and passed fixed; Llama and Qwen2 packed safely, OPT did not; DPO built "
           f"{dpo['value']:.0f} cached right-padded forwards.")
metrics = save_metrics(run, "06-deeper", numbers, checks, summary=summary)
print(summary)
conclude(metrics, run.output_dir)
