"""Worked solutions to lesson 04's exercises (Qwen2 + FlashAttention-2: right padding and DPO evaluation).

Run from the repository root: ``python notebooks/solutions/04_qwen2_padding_side.py``. Each answer is
measured on the cpu profile (fp32, sdpa) with the lesson's own helpers and today's real TRL, printed,
and asserted, so the file fails if an answer stops being true. Small random or briefly trained
models keep the whole file short: the answers are about padding, which needs no trained model.
"""

import tempfile
from collections import defaultdict

import torch
from trl import DPOConfig, DPOTrainer, SFTConfig, SFTTrainer

from trl_clinic.course import data
from trl_clinic.course.models import make_causal_lm
from trl_clinic.probes.padding import ForwardAudit, batched_eval_loss, generation_check, per_row_eval_losses
from trl_clinic.course.parameters import start_run
from trl_clinic.probes.recording import quiet
from trl_clinic.course.tokenizer import build_tokenizer

run = start_run("04", "cpu", 0, tempfile.mkdtemp(prefix="solutions-04-"))
tokenizer = build_tokenizer()
qwen2 = make_causal_lm(tokenizer, "qwen2", size="tiny", seed=run.seed).eval()


def exercise_1() -> None:
    """Run generation_check with prompts of equal length. What changes, and why?"""
    by_length = defaultdict(list)
    for prompt in data.instruction_pairs(64, seed=run.subseed("prompts"))["prompt"]:
        by_length[len(tokenizer(prompt)["input_ids"])].append(prompt)
    prompts = max(by_length.values(), key=len)[:4]  # the most common length
    report = generation_check(qwen2, tokenizer, prompts, max_new_tokens=8)
    changed = {side: sum(report[side]["changed"]) for side in ("left", "right")}
    shift = max(max(report[side]["first_token_logit_shift"]) for side in ("left", "right"))
    print(f"1. {len(prompts)} prompts of {len(tokenizer(prompts[0])['input_ids'])} tokens: outputs changed by batching "
          f"left {changed['left']}, right {changed['right']}; largest first-token logit shift {shift:.1e}. "
          "No row has pads, so left and right batches are the same batch: the side no longer matters.")
    assert changed == {"left": 0, "right": 0} and shift < 1e-4


def exercise_2() -> None:
    """Call dpo_audit(4): how many evaluation forwards of each model are right-padded, and how many built a cache?"""
    checkpoint = run.output_dir / "qwen2-random"
    qwen2.save_pretrained(checkpoint)
    tokenizer.save_pretrained(checkpoint)
    trainer = quiet(DPOTrainer(model=str(checkpoint), processing_class=tokenizer,
                         args=DPOConfig(**run.trainer_kwargs("dpo-eval-4", logging=False, progress=False),
                                        per_device_eval_batch_size=4, max_steps=1),
                         train_dataset=data.preference_pairs(8, seed=run.subseed("dpo train")),
                         eval_dataset=data.preference_pairs(32, seed=run.subseed("dpo eval"))))
    audit = ForwardAudit(policy=trainer.model, reference=trainer.ref_model)
    trainer.evaluate()
    audit.remove()
    rows = {model: modes["eval"] for model, modes in audit.summary().items()}
    for model, row in rows.items():
        print(f"2. eval batch 4, {model} (8 rows: chosen and rejected stacked): {row['right_padded']} of "
              f"{row['forwards']} evaluation forwards right-padded, {row['cache_built']} built a cache.")
    print("   More rows, more chances of unequal lengths, and still nothing would raise: no forward builds a cache.")
    assert set(rows) == {"policy", "reference"}
    assert all(row["right_padded"] > 0 and row["cache_built"] == 0 for row in rows.values())


@torch.no_grad()
def exercise_3() -> None:
    """Score a right-padded batch with use_cache=True by hand: does the log-probability change?"""
    texts = ["where does alice live? answer: paris.", "tell me about bruno and chloe. answer: bruno is a baker."]
    batch = tokenizer(texts, return_tensors="pt", padding=True)  # this tokenizer pads on the right
    logprobs = {cache: torch.log_softmax(qwen2(**batch, use_cache=cache).logits, dim=-1) for cache in (False, True)}
    real = batch["attention_mask"].bool()
    diff = (logprobs[True] - logprobs[False]).abs()[real].max().item()
    print(f"3. right-padded batch ({int((~real).sum())} pad slots): log-probs with and without the cache differ "
          f"by at most {diff:.1e}: the cache is only written for the next forward, this one does not read it.")
    assert tokenizer.padding_side == "right" and not real.all() and diff < 1e-5


def exercise_4() -> None:
    """Predict the Llama SFT eval_loss at eval batch 4 from rows scored alone, then run evaluate() at batch 4."""
    steps = 30
    trainer = quiet(SFTTrainer(
        model=make_causal_lm(tokenizer, "llama", size="tiny", seed=run.seed),
        args=SFTConfig(**run.trainer_kwargs("llama-sft", logging=False, progress=False), learning_rate=3e-3,
                       per_device_train_batch_size=16, max_steps=steps, per_device_eval_batch_size=4),
        train_dataset=data.instruction_pairs(16 * steps, seed=run.subseed("llama sft"), max_people=2),
        eval_dataset=data.instruction_pairs(32, seed=run.subseed("llama eval"), max_people=2),
        processing_class=tokenizer,
    ))
    trainer.train()
    rows = per_row_eval_losses(trainer)
    predicted, alone = batched_eval_loss(rows, 4), batched_eval_loss(rows, 1)
    measured = trainer.evaluate()["eval_loss"]
    print(f"4. eval batch 4: predicted {predicted:.6f}, evaluate() says {measured:.6f} (off by "
          f"{abs(measured - predicted):.1e}); at batch 1 it would be {alone:.6f}: the batch size changes the "
          "weighting of rows, the padding changes nothing.")
    assert abs(measured - predicted) < 1e-5


if __name__ == "__main__":
    exercise_1()
    exercise_2()
    exercise_3()
    exercise_4()
