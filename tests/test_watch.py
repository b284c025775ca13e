"""The watch (``trl_clinic.watch.ClinicWatch``) on real tiny trainers: each finding trips on its broken run and
stays silent on the healthy one, its numbers reach the trainer's logs, and a watched run trains exactly as an
unwatched one (weights equal bit for bit). Its shape: a ``WatchConfig`` with a help string per field, the trainer
given by ``trainer=``, its state set in ``setup``, its words in the catalogue."""

import ast
import dataclasses
import inspect
import string

import pytest
import torch
from transformers import AutoModelForCausalLM, TrainerCallback
from trl import GRPOConfig, GRPOTrainer, SFTConfig, SFTTrainer

from trl_clinic.course import data, examples, stand_ins
from trl_clinic.course.models import make_causal_lm, make_reward_model
from trl_clinic.watch import CATALOGUE, LESSONS, ClinicWatch, WatchConfig
from trl_clinic.watch import callback as watch_callback
from trl_clinic.watch.findings import finding, line, quiet


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """One torch thread, as the lessons' cpu profile: beside the other xdist worker two threads made these tiny
    runs 5-10x slower on the 2-core machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def watched(trainer, **options) -> ClinicWatch:
    watch = ClinicWatch(show=False, **options)
    trainer.add_callback(watch)
    trainer.train()
    return watch


def found(watch: ClinicWatch) -> dict:
    return {f.probe: f for f in watch.findings}


def warm_up(tokenizer, root):
    """A tiny policy after 10 SFT steps on word lists (1 s), saved with its tokenizer under ``root/policy``: it
    answers a few words and stops with EOS (15 of 16 sampled completions ended within 16 tokens when
    measured), so a healthy GRPO run is not cut off as a random-init policy's is."""
    model = make_causal_lm(tokenizer)
    SFTTrainer(
        model=model,
        processing_class=tokenizer,
        train_dataset=data.word_lists(160, seed=0),
        args=SFTConfig(
            **examples.config_kwargs(root / "out", per_device_train_batch_size=16, learning_rate=3e-3, max_steps=10)
        ),
    ).train()
    model.save_pretrained(root / "policy")
    tokenizer.save_pretrained(root / "policy")
    return root / "policy"


@pytest.fixture(scope="module")
def warm_policy(tokenizer, tmp_path_factory):
    return warm_up(tokenizer, tmp_path_factory.mktemp("watch-warm"))


def grpo_trainer(tokenizer, out, policy, reward=data.category_reward, **config):
    settings = {
        "num_generations": 4,
        "per_device_train_batch_size": 4,
        "max_completion_length": 16,
        "max_steps": 4,
        "logging_steps": 1,
        **config,
    }
    return GRPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(policy),
        reward_funcs=reward,
        args=GRPOConfig(**examples.config_kwargs(out, **settings)),
        processing_class=tokenizer,
        train_dataset=data.reward_prompts(16, seed=0),
    )


def constant_reward(completions, **kwargs):
    return [1.0] * len(completions)


def fp16_reward_trainer(tokenizer, out, dtype=torch.float16, **config):
    """Lesson 03's run: a LoRA reward model (SEQ_CLS: a trainable score head) and non-fused AdamW."""
    from peft import LoraConfig

    return examples.reward_trainer(
        tokenizer,
        out,
        model=make_reward_model(tokenizer, dtype=dtype),
        rows=40,
        peft_config=LoraConfig(task_type="SEQ_CLS", r=4),
        optim="adamw_torch",
        per_device_train_batch_size=4,
        learning_rate=5e-3,
        **{"max_steps": 4, "logging_steps": 1, **config},
    )


# -- each finding: its broken run, and the healthy run beside it ------------------------------------------
def test_nonfinite_names_the_fp16_head_at_step_1_and_the_filtered_zero_loss(tokenizer, tmp_path):
    trainer = fp16_reward_trainer(tokenizer, tmp_path)
    watch = watched(trainer)
    nonfinite, zero = found(watch)["nonfinite"], found(watch)["zero_loss"]
    assert nonfinite.step == 1 and nonfinite.lesson == "03"
    assert "score.modules_to_save.default.weight" in nonfinite.measured and "float16" in nonfinite.measured
    assert "gradients finite" in nonfinite.measured and "AdamW (not fused)" in nonfinite.measured
    assert "float32" in nonfinite.fix
    assert zero.lesson == "03" and "logging_nan_inf_filter" in zero.cause
    rows = {row["step"]: row for row in trainer.state.log_history if "loss" in row}
    assert rows[1]["clinic/nonfinite/step"] == 1 and rows[1]["clinic/nonfinite/tensors"] == 1
    assert rows[2]["loss"] == 0.0 and rows[2]["clinic/raw_loss"] != rows[2]["clinic/raw_loss"]  # NaN: the truth


def test_nonfinite_stays_silent_in_fp32(tokenizer, tmp_path):
    watch = watched(fp16_reward_trainer(tokenizer, tmp_path, dtype=torch.float32))
    assert watch.findings == []
    assert watch.checks["nonfinite"] == "raw loss and trainable weights finite at all 4 steps"


def test_stop_on_ends_the_run_at_the_step_of_the_finding(tokenizer, tmp_path):
    trainer = fp16_reward_trainer(tokenizer, tmp_path, max_steps=6, logging_steps=5)
    watch = watched(trainer, stop_on="nonfinite")
    assert trainer.state.global_step == 1
    assert trainer.state.log_history[0]["clinic/nonfinite/step"] == 1  # the stopping step logs its finding
    with pytest.raises(ValueError, match="unknown finding"):
        ClinicWatch(stop_on=["nonfinite", "nan"])
    assert ClinicWatch(stop_on="any").stop_on == set(CATALOGUE)
    assert [f.probe for f in watch.findings] == ["nonfinite"]


def masked_labels_trainer(tokenizer, out, max_length: int):
    """A hand-made completion-only pipeline (labels -100 on the prompt), cut at ``max_length`` tokens, and a
    compute_loss that averages over the micro-batch's label tokens (TRL #6668's situation)."""

    def tokenize(row):
        prompt, completion = tokenizer(row["prompt"])["input_ids"], tokenizer(row["completion"])["input_ids"]
        return {
            "input_ids": (prompt + completion)[:max_length],
            "labels": ([-100] * len(prompt) + completion)[:max_length],
        }

    rows = data.instruction_pairs(16, seed=0).map(tokenize, remove_columns=["prompt", "completion"])
    trainer = examples.custom_trainer(tokenizer, out, stand_ins.MeanLossTrainer, max_steps=3, logging_steps=1)
    trainer.train_dataset = rows
    return trainer


def test_no_labels_explains_the_nan_and_the_zero_loss(tokenizer, tmp_path):
    watch = watched(masked_labels_trainer(tokenizer, tmp_path, max_length=6))  # every prompt is 7+ tokens
    findings = found(watch)
    assert findings["no_labels"].step == 1 and "label tokens: [0]" in findings["no_labels"].measured
    assert "no label token" in findings["nonfinite"].cause
    assert findings["zero_loss"].lesson == "03"  # the NaN hidden by the filter


def test_no_labels_stays_silent_when_completions_fit(tokenizer, tmp_path):
    watch = watched(masked_labels_trainer(tokenizer, tmp_path, max_length=512))
    assert watch.findings == [] and watch.checks["no_labels"].startswith("every step had label tokens")


def test_equal_rewards_on_a_constant_reward(tokenizer, tmp_path, warm_policy):
    watch = watched(grpo_trainer(tokenizer, tmp_path, warm_policy, reward=constant_reward), window=3)
    findings = found(watch)
    assert findings["equal_rewards"].numbers["share"] == 1.0 and findings["equal_rewards"].step == 3
    assert "TRL #3857" in findings["equal_rewards"].cause  # completions end: the reward is to blame
    assert "clipped" not in findings and findings["zero_loss"].lesson == "05"


def test_clipped_when_every_completion_is_cut(tokenizer, tmp_path, warm_policy):
    watch = watched(grpo_trainer(tokenizer, tmp_path, warm_policy, max_completion_length=1), window=3)
    clipped = found(watch)["clipped"]
    assert clipped.numbers["share"] == 1.0 and "max_completion_length=1" in clipped.measured


def test_no_gradient_on_a_frozen_adapter(tokenizer, tmp_path):
    """TRL #3926: an adapter loaded frozen (``PeftModel.from_pretrained`` without ``is_trainable=True``); with
    activation checkpointing the loss still has a grad_fn, so the run trains with grad_norm 0."""
    from peft import LoraConfig, PeftModel, get_peft_model

    get_peft_model(make_causal_lm(tokenizer), LoraConfig(r=4, target_modules=["q_proj", "v_proj"])).save_pretrained(
        tmp_path / "adapter"
    )

    def run(is_trainable: bool):
        model = PeftModel.from_pretrained(make_causal_lm(tokenizer), tmp_path / "adapter", is_trainable=is_trainable)
        trainer = examples.sft_trainer(
            tokenizer, tmp_path / "out", model=model, max_steps=3, logging_steps=1, activation_checkpointing=True
        )
        return trainer, watched(trainer, window=3)

    trainer, frozen = run(False)
    assert found(frozen)["no_gradient"].step == 0 and "0 of" in found(frozen)["no_gradient"].measured
    first = trainer.state.log_history[0]
    assert first["grad_norm"] == 0.0 and first["clinic/no_gradient/step"] == 0
    _, trainable = run(True)
    assert trainable.findings == []


def test_packing_on_opt_padding_free_and_not_on_llama(tokenizer, tmp_path):
    opt = watched(
        examples.sft_trainer(
            tokenizer, tmp_path, family="opt", padding_free=True, max_length=None, per_device_train_batch_size=4
        )
    )
    packing = found(opt)["packing"]
    assert packing.lesson == "01" and "opt builds its causal mask without reading position_ids" in packing.cause
    assert "received no mask" in packing.measured and packing.numbers["sequences"] == 4
    llama = watched(
        examples.sft_trainer(tokenizer, tmp_path, padding_free=True, max_length=None, per_device_train_batch_size=4)
    )
    assert llama.findings == [] and llama.checks["packing"] == "packed rows kept apart (1 forward(s) read)"


class SampleCompletions(TrainerCallback):
    """A callback as users write one: sample completions for two prompts after every step."""

    def __init__(self, tokenizer, side: str) -> None:
        self.tokenizer, self.side = tokenizer, side

    def on_step_end(self, args, state, control, model=None, **kwargs):
        batch = self.tokenizer(
            ["name some pets:", "tell me about jonas and elena. answer:"],
            return_tensors="pt",
            padding=True,
            padding_side=self.side,
        )
        model.eval()
        model.generate(**batch, max_new_tokens=2, do_sample=False, pad_token_id=self.tokenizer.pad_token_id)
        model.train()


def test_right_padding_in_generation(tokenizer, tmp_path):
    def run(side):
        trainer = examples.sft_trainer(tokenizer, tmp_path, max_steps=2)
        trainer.add_callback(SampleCompletions(tokenizer, side))
        return watched(trainer)

    right = found(run("right"))["right_padding"]
    assert right.lesson == "04" and right.numbers["right_padded_prompts"] == 1 and right.step == 1
    left = run("left")
    assert left.findings == [] and left.checks["right_padding"] == "2 generation(s), none from right-padded prompts"


def test_accumulation_on_a_loss_that_ignores_num_items_in_batch(tokenizer, tmp_path):
    def run(loss):
        return watched(
            examples.custom_trainer(
                tokenizer,
                tmp_path,
                loss,
                rows=32,
                per_device_train_batch_size=1,
                gradient_accumulation_steps=32,
                logging_steps=1,
            )
        )

    bad = found(run(stand_ins.MeanLossTrainer))["accumulation"]
    assert bad.numbers["slope"] < 0.1 and "ignores num_items_in_batch" in bad.cause and "sum of 32 means" in bad.cause
    fixed = run(examples.SumLossTrainer)
    assert fixed.findings == [] and "slope 1.00 over 32 micro-batches" in fixed.checks["accumulation"]


def test_loss_spike_when_the_learning_rate_climbs_too_high(tokenizer, tmp_path):
    def run(learning_rate):
        return watched(
            examples.sft_trainer(
                tokenizer,
                tmp_path,
                rows=32,
                max_steps=8,
                logging_steps=8,
                learning_rate=learning_rate,
                warmup_steps=10,
                lr_scheduler_type="constant_with_warmup",
            ),
            window=5,
        )

    spike = found(run(10.0))["loss_spike"]
    assert spike.numbers["ratio"] > 5 and "the update" in spike.cause and "label tokens" in spike.measured
    healthy = run(1e-3)
    assert healthy.findings == [] and healthy.checks["loss_spike"].startswith("largest step loss")


# -- healthy runs of every trainer kind stay silent --------------------------------------------------------
@pytest.mark.parametrize("kind", ["sft", "dpo", "reward", "grpo"])
def test_healthy_runs_are_silent(tokenizer, tmp_path, warm_policy, kind):
    steps = {"max_steps": 6, "logging_steps": 2}
    trainer = {
        "sft": lambda: examples.sft_trainer(tokenizer, tmp_path, rows=32, gradient_accumulation_steps=2, **steps),
        "dpo": lambda: examples.dpo_trainer(tokenizer, tmp_path, rows=32, **steps),
        "reward": lambda: examples.reward_trainer(tokenizer, tmp_path, rows=32, **steps),
        "grpo": lambda: grpo_trainer(tokenizer, tmp_path, warm_policy, **steps),
    }[kind]()
    watch = watched(trainer, window=3)
    assert watch.findings == [], [line(f) for f in watch.findings]
    assert all("clinic/raw_loss" in row for row in trainer.state.log_history if "loss" in row)
    if kind == "grpo":
        assert watch.checks["clipped"].startswith("at most") and watch.checks["equal_rewards"].startswith("at most")


# -- the watch changes nothing, and its numbers reach the reporters ------------------------------------------
@pytest.mark.parametrize(
    "make",
    [
        lambda tok, out, policy: examples.sft_trainer(
            tok,
            out,
            model=make_causal_lm(tok, attention_dropout=0.1),
            rows=16,
            max_steps=3,
            gradient_accumulation_steps=2,
        ),
        lambda tok, out, policy: examples.sft_trainer(
            tok, out, family="opt", padding_free=True, max_length=None, per_device_train_batch_size=4, max_steps=2
        ),
        lambda tok, out, policy: grpo_trainer(tok, out, policy, max_steps=2),
        lambda tok, out, policy: fp16_reward_trainer(tok, out, max_steps=2),
    ],
    ids=["sft-dropout-accumulation", "sft-padding-free-opt", "grpo-sampling", "reward-fp16-nan"],
)
def test_watched_and_unwatched_runs_train_the_same_weights(tokenizer, tmp_path, warm_policy, make):
    plain = make(tokenizer, tmp_path / "plain", warm_policy)
    plain.train()
    trainer = make(tokenizer, tmp_path / "watched", warm_policy)
    watched(trainer)
    assert "training_step" not in vars(trainer)  # the tap is undone
    for (name, a), (_, b) in zip(plain.model.named_parameters(), trainer.model.named_parameters(), strict=True):
        assert torch.equal(a.detach().contiguous().view(torch.uint8), b.detach().contiguous().view(torch.uint8)), name


def test_clinic_keys_reach_callbacks_that_were_there_first(tokenizer, tmp_path):
    """Reporters (TensorBoard, W&B, trackio) are callbacks the trainer holds before a later add_callback."""

    class Reporter(TrainerCallback):
        def __init__(self):
            self.seen = []

        def on_log(self, args, state, control, logs=None, **kwargs):
            self.seen.append(dict(logs))

    reporter = Reporter()
    trainer = fp16_reward_trainer(tokenizer, tmp_path, max_steps=2)
    trainer.add_callback(reporter)
    watch = watched(trainer, report=tmp_path / "watch.html")
    assert reporter.seen[0]["clinic/nonfinite/step"] == 1 and "clinic/raw_loss" in reporter.seen[1]
    page = (tmp_path / "watch.html").read_text()
    assert "score.modules_to_save.default.weight" in page and "lesson 03 (LoRA reward model NaN)" in page
    assert line(watch.findings[0]).startswith("[trl-clinic watch] step 1: nonfinite:")
    from trl_clinic.watch.report import summary

    printed = [line(watch.findings[0]), summary(watch)]  # what a notebook shows: folded to 120 columns
    assert max(len(row) for text in printed for row in text.splitlines()) <= 120
    assert "fix: load the weights in float32" in printed[1] and "nothing found by" in printed[1]


def test_the_trainer_given_is_watched_without_walking_the_frames(tokenizer, tmp_path, monkeypatch):
    """``ClinicWatch(trainer=...)``, as TRL's callbacks take their trainer: the tap, the place among the callbacks
    and the clinic/ keys come from that trainer, and the calling frames are never read."""

    def no_frames(kind):
        raise AssertionError("the watch walked the frames although it was given the trainer")

    monkeypatch.setattr(watch_callback, "_caller", no_frames)
    trainer = fp16_reward_trainer(tokenizer, tmp_path, max_steps=2)
    rows = []
    trainer.add_callback(type("Reporter", (TrainerCallback,), {"on_log": lambda *a, logs=None, **k: rows.append(logs)}))
    watch = ClinicWatch(trainer=trainer, show=False)
    trainer.add_callback(watch)
    trainer.train()
    assert [row["step"] for row in watch.steps] == [1, 2]  # the tapped training_step
    assert rows[0]["clinic/nonfinite/step"] == 1 and "training_step" not in vars(trainer)


def test_a_config_and_keyword_options_set_the_watch():
    watch = ClinicWatch(WatchConfig(window=3, spike=5.0), window=4, stop_on=("nonfinite", "clipped"))
    assert (watch.config.window, watch.config.spike) == (4, 5.0)
    assert watch.stop_on == {"nonfinite", "clipped"}
    with pytest.raises(ValueError, match="window must be at least 1"):
        ClinicWatch(window=0)
    with pytest.raises(TypeError, match="no_such_threshold"):
        ClinicWatch(no_such_threshold=1)
    with pytest.raises(TypeError, match="must be a WatchConfig"):
        ClinicWatch("nonfinite")
    assert all(f.metadata.get("help") for f in dataclasses.fields(WatchConfig))


def test_the_watch_creates_its_attributes_in_init_and_setup_only():
    """transformers' WandbCallback pattern: construction in ``__init__``, a run's state in ``setup``."""
    tree = ast.parse(inspect.getsource(ClinicWatch))
    created, elsewhere = set(), {}
    for method in tree.body[0].body:
        if not isinstance(method, ast.FunctionDef):
            continue
        for node in ast.walk(method):
            targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
            for target in targets:
                for name in ast.walk(target) if target is not None else []:
                    if isinstance(name, ast.Attribute) and getattr(name.value, "id", None) == "self":
                        (
                            created
                            if method.name in ("__init__", "setup")
                            else elsewhere.setdefault(method.name, set())
                        ).add(name.attr)
    assert not {m: names - created for m, names in elsewhere.items() if names - created}


def test_every_word_of_the_watch_is_in_the_catalogue_and_fills():
    """Each check names a lesson ("-" for a reported failure no lesson covers: its causes cite the issue), and every
    template formats (the callback and the hooks fill them)."""
    for key, entry in CATALOGUE.items():
        assert entry.lesson in (*LESSONS, "-") and all(c.lesson in ("", *LESSONS) for c in entry.causes.values())
        templates = [*entry.seen.values(), *entry.quiet.values()]
        templates += [text for c in entry.causes.values() for text in (c.cause, c.fix)]
        names = {name for t in templates for _, name, _, _ in string.Formatter().parse(t) if name}
        values = dict.fromkeys(names - {"step"}, 1)
        for seen in entry.seen:
            for cause in entry.causes:
                made = finding(key, 2, seen, cause, {"x": 1.0}, **values)
                assert (made.probe, made.status, made.decided, made.step) == (key, "fail", "measured", 2)
                assert line(made).startswith(f"[trl-clinic watch] step 2: {key}: ") and line(made).endswith(
                    "[measured]"
                )
        assert all(quiet(key, case, **values) for case in entry.quiet)
