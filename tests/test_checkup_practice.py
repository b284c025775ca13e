"""The check-up and the watch in the setups practitioners train in: each false all-clear and crash a user met
trips here on a real trainer, and a healthy trainer of the same kind passes (local models, no hub)."""

import copy
import math

import pytest
import torch
import yaml
from peft import LoraConfig, PeftModel, get_peft_model
from transformers import DataCollatorForSeq2Seq, Trainer, TrainingArguments

from trl_clinic import checkup
from trl_clinic.checkup.command import build_trainer
from trl_clinic.checkup.view import TrainerView, untouched
from trl_clinic.course import examples, stand_ins
from trl_clinic.course.data import instruction_pairs, preference_pairs, reward_prompts
from trl_clinic.course.models import make_causal_lm
from trl_clinic.watch import ClinicWatch


def only(trainer, probe, **options):
    (found,) = [f for f in checkup(trainer, only=[probe], show=False, **options).findings if f.probe == probe]
    return found


# --- nothing trainable -------------------------------------------------------------------------------------------


def test_a_frozen_adapter_fails_with_its_fix_and_a_trainable_one_passes(tokenizer, tmp_path):
    """PeftModel.from_pretrained without is_trainable=True freezes every tensor (TRL #3926): gradients_reach
    passed on "0 of 0" and the check-up exited 0."""
    get_peft_model(make_causal_lm(tokenizer), LoraConfig(r=8, target_modules=["q_proj", "v_proj"])).save_pretrained(
        tmp_path / "adapter"
    )
    frozen = PeftModel.from_pretrained(make_causal_lm(tokenizer), tmp_path / "adapter")
    found = only(examples.sft_trainer(tokenizer, tmp_path, model=frozen), "gradients_reach")
    assert (found.status, found.decided) == ("fail", "measured") and "is_trainable=True" in found.fix
    assert "0 of" in found.measured and "trainable" in found.measured
    trainable = PeftModel.from_pretrained(make_causal_lm(tokenizer), tmp_path / "adapter", is_trainable=True)
    assert only(examples.sft_trainer(tokenizer, tmp_path, model=trainable), "gradients_reach").status == "ok"


# --- any dataset type, through the trainer's own dataloader --------------------------------------------------------


class Rows(torch.utils.data.Dataset):
    """A plain torch Dataset of token ids (the usual thing outside TRL); ``masked`` rows have every label masked."""

    def __init__(self, tokenizer, n: int, masked: tuple[int, ...] = ()) -> None:
        pairs = instruction_pairs(n, seed=0)
        self.rows = [tokenizer(r["prompt"] + r["completion"])["input_ids"] + [tokenizer.eos_token_id] for r in pairs]
        self.masked = masked

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> dict:
        ids = self.rows[i]
        return {"input_ids": ids, "labels": [-100] * len(ids) if i in self.masked else ids}


def plain_trainer(tokenizer, tmp_path, dataset, **settings) -> Trainer:
    args = TrainingArguments(
        **{
            "output_dir": str(tmp_path),
            "per_device_train_batch_size": 2,
            "report_to": "none",
            "use_cpu": True,
            "max_steps": 1,
            **settings,
        }
    )
    return Trainer(
        model=make_causal_lm(tokenizer),
        args=args,
        train_dataset=dataset,
        processing_class=tokenizer,
        data_collator=DataCollatorForSeq2Seq(tokenizer),
    )


def test_a_torch_dataset_is_read_through_the_trainers_dataloader(tokenizer, tmp_path):
    """A plain Trainer on a torch.utils.data.Dataset: 9 of 11 findings were skipped ("not a datasets.Dataset")."""
    trainer = plain_trainer(tokenizer, tmp_path, Rows(tokenizer, 32), gradient_accumulation_steps=2)
    report = checkup(trainer, show=False)
    statuses = {f.probe: f.status for f in report.findings}
    for probe in ("accumulation", "labels_present", "eos_label", "gradients_reach", "padding_cache"):
        assert statuses[probe] == "ok", report.to_json()
    assert report.exit_code == 0


def test_the_label_probes_read_the_whole_set_not_the_first_four_batches(tokenizer, tmp_path):
    """Batch 1, row 20 fully masked: the old probe read rows 0-3 only and passed."""
    masked = plain_trainer(tokenizer, tmp_path, Rows(tokenizer, 32, masked=(20,)), per_device_train_batch_size=1)
    found = only(masked, "labels_present")
    assert (found.status, found.decided, found.value) == ("fail", "measured", 1)
    assert "32 micro-batches (32 rows)" in found.measured
    healthy = plain_trainer(tokenizer, tmp_path, Rows(tokenizer, 32), per_device_train_batch_size=1)
    assert only(healthy, "labels_present").status == "ok"


# --- bounded cost ------------------------------------------------------------------------------------------------


def test_a_probe_over_its_budget_skips_with_the_bytes_it_needed_and_holds_no_copy(tokenizer, tmp_path):
    trainer = examples.sft_trainer(tokenizer, tmp_path, gradient_accumulation_steps=2)
    found = only(trainer, "accumulation", budget=16)
    assert found.status == "skipped" and "needs" in found.reason and "budget of" in found.reason
    view = TrainerView(trainer, budget=16)
    with untouched(trainer):
        assert view.step.kept == {} and view.step.needed > 16  # nothing copied
    part = only(trainer, "accumulation", budget=4096)  # a few tensors fit: compared on those, and said so
    assert part.status == "ok" and " of 20 trainable tensors (" in part.measured and "; the budget of" in part.measured
    assert only(trainer, "accumulation").status == "ok"  # the default budget holds this model's gradient


def test_the_first_window_copies_only_the_gradients_a_probe_reads(tokenizer, tmp_path):
    """Under the default budget the first window copied every gradient tensor (a full fine-tune's whole gradient,
    0.54 GB on SmolLM2-135M, beside the reference's pass): it copies the compared eighth nearest the output, and
    in an fp16 model the fp16 tensors fp16_adamw steps too."""
    from trl_clinic.checkup.step import COMPARED_SHARE

    def copied(trainer):
        view = TrainerView(trainer)
        with untouched(trainer):
            step = view.step
        names = [name for name, p in trainer.model.named_parameters() if p.requires_grad]
        return step, names, sum(g.numel() * g.element_size() for g in step.kept.values())

    step, names, nbytes = copied(examples.sft_trainer(tokenizer, tmp_path, gradient_accumulation_steps=2))
    assert list(step.kept) == step.compared == names[-len(step.compared) :] and not step.cut
    last = step.kept[names[-1]]
    assert 1 < len(step.kept) < len(names) and nbytes <= max(COMPARED_SHARE * step.needed, last.numel() * 4)
    half = make_causal_lm(tokenizer).half()
    step, names, _ = copied(examples.sft_trainer(tokenizer, tmp_path, model=half, gradient_accumulation_steps=2))
    assert set(step.kept) == set(names) and len(step.compared) < len(names)  # every fp16 tensor, for fp16_adamw


def test_the_accumulation_reference_never_holds_more_rows_than_a_micro_batch(tokenizer, tmp_path, monkeypatch):
    trainer = examples.custom_trainer(tokenizer, tmp_path, stand_ins.MeanLossTrainer, gradient_accumulation_steps=4)
    rows = []
    original = trainer.training_step

    def counted(model, inputs, *args, **kwargs):
        rows.append(len(inputs["input_ids"]))
        return original(model, inputs, *args, **kwargs)

    monkeypatch.setattr(trainer, "training_step", counted)
    found = only(trainer, "accumulation")
    assert (found.status, found.decided) == ("fail", "measured")
    assert max(rows) == trainer.args.per_device_train_batch_size and len(rows) == 8  # k tested, k reference


# --- the optimizer step's own gradient ----------------------------------------------------------------------------


def reward_recipe(tokenizer, tmp_path, **settings) -> str:
    """TRL's `trl reward` recipe on a local Llama loaded in float16, LoRA SEQ_CLS, batch 1 x accumulation 8."""
    make_causal_lm(tokenizer).save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    (tmp_path / "data").mkdir()
    preference_pairs(64, seed=0).to_json(tmp_path / "data" / "train.jsonl")
    config = {
        "model_name_or_path": str(tmp_path / "model"),
        "dataset_name": str(tmp_path / "data"),
        "output_dir": str(tmp_path / "out"),
        "dtype": "float16",
        "use_peft": True,
        "lora_task_type": "SEQ_CLS",
        "optim": "adamw_torch",
        "per_device_train_batch_size": 1,
        "gradient_accumulation_steps": 8,
        "max_steps": 2,
        "logging_steps": 1,
        "use_cpu": True,
        "bf16": False,
        "report_to": "none",
        "save_strategy": "no",
        "disable_tqdm": True,
        **settings,
    }
    path = tmp_path / f"recipe-{len(settings)}.yaml"
    path.write_text(yaml.safe_dump(config))
    return str(path)


def test_fp16_adamw_fails_before_the_run_that_goes_nan_at_step_2_and_passes_fused(tokenizer, tmp_path):
    recipe = reward_recipe(tokenizer, tmp_path)
    found = only(build_trainer("reward", ["--config", recipe]), "fp16_adamw")
    assert (found.status, found.decided) == ("fail", "measured")
    assert "8 micro-batches through training_step" in found.measured
    run = build_trainer("reward", ["--config", recipe])
    run.train()
    norms = [row["grad_norm"] for row in run.state.log_history if "grad_norm" in row]
    assert math.isfinite(norms[0]) and math.isnan(norms[1])  # the real run: finite step 1, NaN from step 2
    fused = reward_recipe(tokenizer, tmp_path / "fused", optim="adamw_torch_fused")
    assert only(build_trainer("reward", ["--config", fused]), "fp16_adamw").status == "ok"


def test_fp16_adamw_steps_on_the_whole_windows_gradient(tokenizer, tmp_path, monkeypatch):
    """The gradient fp16_adamw steps its clones with is the accumulation window's (AUDIT G.4: stepping on the first
    micro-batch's gradient passed every test). Recomputed here apart from the check-up: each of the window's
    micro-batches through compute_loss with the window's label count, summed; measured equal to 0.0 relative, while
    the first micro-batch alone is 4.5 off."""
    from trl_clinic.checkup import precision
    from trl_clinic.course.models import make_causal_lm
    from trl_clinic.probes.labels import targets

    model = make_causal_lm(tokenizer).to(torch.float16)
    trainer = examples.sft_trainer(
        tokenizer,
        tmp_path,
        model=model,
        gradient_accumulation_steps=4,
        per_device_train_batch_size=1,
        max_grad_norm=0.0,
    )
    seen = {}
    within_budget, one_step = precision.within_budget, precision.one_step

    def window_of(view, params):  # the window's micro-batches, as the check-up ran them
        seen["batches"] = list(view.step.batches)
        return within_budget(view, params)

    def stepped_with(cls, settings, source, tensors):  # the gradients the optimizer step is really given
        seen["gradient"] = {name: gradient.float().clone() for name, _, gradient in tensors}
        return one_step(cls, settings, source, tensors)

    monkeypatch.setattr(precision, "within_budget", window_of)
    monkeypatch.setattr(precision, "one_step", stepped_with)
    assert only(trainer, "fp16_adamw").decided == "measured"
    assert len(seen["batches"]) == 4

    reference = copy.deepcopy(trainer.model).eval()
    total = sum(int(targets(batch).sum()) for batch in seen["batches"])

    def summed(batches) -> torch.Tensor:
        reference.zero_grad(set_to_none=True)
        for batch in batches:
            trainer.compute_loss(reference, batch, num_items_in_batch=total).backward()
        grads = dict(reference.named_parameters())
        return torch.cat([grads[name].grad.float().flatten() for name in sorted(seen["gradient"])])

    got = torch.cat([seen["gradient"][name].flatten() for name in sorted(seen["gradient"])])
    window, first = summed(seen["batches"]), summed(seen["batches"][:1])
    assert (got - window).norm() / window.norm() < 1e-2
    assert (first - window).norm() / window.norm() > 0.5  # the micro-batches differ: the test can tell them apart


# --- GRPO on conversational prompts, up to the user's completion length ----------------------------------------


def conversational_grpo(tokenizer, tmp_path, reward, **settings):
    from trl import GRPOConfig, GRPOTrainer

    prompts = reward_prompts(16, seed=0).map(lambda row: {"prompt": [{"role": "user", "content": row["prompt"]}]})
    config = {"num_generations": 4, "per_device_train_batch_size": 4, "max_completion_length": 16, **settings}
    return GRPOTrainer(
        model=make_causal_lm(tokenizer),
        reward_funcs=reward,
        args=GRPOConfig(**examples.config_kwargs(tmp_path, **config)),
        processing_class=tokenizer,
        train_dataset=prompts,
    )


def answer_length(completions, **kwargs):
    return [float(len(c[0]["content"])) for c in completions]  # TRL's conversational form: a list of messages


def never_earned(completions, **kwargs):
    return [float(c[0]["content"].startswith("the answer is")) for c in completions]


def test_equal_rewards_reads_conversational_completions_the_way_trl_passes_them(tokenizer, tmp_path):
    """A reward reading completions as messages made equal_rewards raise (TypeError, exit 3)."""
    healthy = only(conversational_grpo(tokenizer, tmp_path, answer_length), "equal_rewards")
    assert (healthy.status, healthy.decided) == ("ok", "measured")
    flat = only(conversational_grpo(tokenizer, tmp_path, never_earned), "equal_rewards")
    assert (flat.status, flat.decided) == ("fail", "measured") and "4 of 4 groups" in flat.measured


def no_kwargs(prompts, completions):
    return [float(len(c[0]["content"])) for c in completions]


def broken_inside(completions, **kwargs):
    def score(text):
        return float(len(text))

    return [score(text=c[0]["content"], strict=True) for c in completions]  # the reward's own bug


def test_a_reward_without_kwargs_fails_with_the_keyword_it_refused_as_the_trainer_would(tokenizer, tmp_path):
    """TRL 1.16 calls rewards with completion_ids and the dataset's columns: a reward written (prompts, completions)
    made equal_rewards an unnamed error. It fails, names the keyword, gives the fix, and the trainer's own first
    step raises the same; padding_cache skips saying why. A TypeError inside a reward's body stays an error."""
    trainer = conversational_grpo(tokenizer, tmp_path, no_kwargs)
    report = checkup(trainer, only=["equal_rewards", "padding_cache"], show=False)
    found, padding = (
        next(f for f in report.findings if f.probe == name) for name in ("equal_rewards", "padding_cache")
    )
    assert (found.status, found.decided) == ("fail", "measured") and "completion_ids" in found.measured
    assert "**kwargs" in found.fix and "completion_ids" in found.fix
    assert padding.status == "skipped" and "equal_rewards" in padding.reason
    with pytest.raises(TypeError, match="unexpected keyword argument 'completion_ids'"):
        conversational_grpo(tokenizer, tmp_path, no_kwargs, max_steps=1).train()
    inside = only(conversational_grpo(tokenizer, tmp_path, broken_inside), "equal_rewards")
    assert inside.status == "error" and "strict" in inside.reason


def test_equal_rewards_generates_up_to_max_completion_length(tokenizer, tmp_path):
    """A reward for a finished answer (EOS within the limit) read as all-equal at the old 32-token cap."""

    def finished(completion_ids, **kwargs):
        return [float(tokenizer.eos_token_id in ids) for ids in completion_ids]

    found = only(
        examples.grpo_trainer(tokenizer, tmp_path, reward=finished, max_completion_length=256), "equal_rewards"
    )
    assert found.status != "fail" and "completions up to 256 tokens" in found.measured and "cut at" in found.measured


# --- the watch reads the raw loss -------------------------------------------------------------------------------


def test_zero_loss_is_decided_on_the_raw_loss_not_a_rounded_log(tokenizer, tmp_path):
    """A DPO run converging below 5e-5: transformers < 5.0 logged round(loss, 4) = 0.0 (trainer.py's
    _maybe_log_save_evaluate), which the watch blamed on masked labels. The raw loss is what it reads now."""
    trainer = examples.dpo_trainer(
        tokenizer,
        tmp_path,
        rows=8,
        beta=1.0,
        learning_rate=1e-2,
        max_steps=40,
        logging_steps=1,
        per_device_train_batch_size=2,
    )
    watch = ClinicWatch(trainer=trainer, show=False)
    trainer.add_callback(watch)
    trainer.train()
    assert round(watch.steps[-1]["raw_loss"], 4) == 0.0 < watch.steps[-1]["raw_loss"]  # what 4.55 would log
    assert "zero_loss" not in {f.probe for f in watch.findings}


@pytest.mark.parametrize("probe", ["labels_present", "gradients_reach"])
def test_the_probes_leave_the_dataloader_unregistered(tokenizer, tmp_path, probe):
    trainer = examples.sft_trainer(tokenizer, tmp_path, gradient_accumulation_steps=2)
    before = list(getattr(trainer.accelerator, "_dataloaders", []))
    only(trainer, probe)
    assert list(getattr(trainer.accelerator, "_dataloaders", [])) == before


def test_the_watch_says_which_checks_an_old_transformers_never_calls(tokenizer, tmp_path, monkeypatch):
    """transformers < 4.45 has no on_pre_optimizer_step (and < 4.42 no on_optimizer_step): those checks never run,
    and the summary says so instead of 'every trainable tensor got a gradient'. The events' absence is stood in for
    here (today's Trainer calls them); the era 04-transformers-4.40 has the real one, not run with the watch."""
    from trl_clinic.watch import callback

    monkeypatch.setattr(callback, "has_event", lambda name: name not in ("on_pre_optimizer_step", "on_optimizer_step"))
    trainer = examples.sft_trainer(tokenizer, tmp_path, max_steps=2)
    watch = ClinicWatch(trainer=trainer, show=False)
    trainer.add_callback(watch)
    trainer.train()
    assert watch.checks["no_gradient"].startswith("not watched: transformers")
    assert "the weights not read" in watch.checks["nonfinite"]
