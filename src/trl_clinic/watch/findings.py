"""What the watch can find, and every word it says: the catalogue.

Each entry of ``CATALOGUE`` is one check: the lesson that explains it, what it looks for (``--help``, the
report), what it saw (a template per case, filled with the run's numbers), each likely cause with its fix,
and what it says when it found nothing (the summary). The callback and the forward hooks decide which case
and which cause apply and hand over the numbers; ``finding`` fills the templates into the library's
``Finding``. Torch-free, so ``trl-clinic watch --help`` can list the checks without importing torch.
"""

from __future__ import annotations

import textwrap
from dataclasses import asdict, dataclass, field

from trl_clinic.probes.finding import Finding

# the printed lines' width: a notebook's output area holds about 120 characters, and a finding of 600 characters on
# one line is read in neither a notebook nor a log viewer
WIDTH = 120


def wrapped(text: str, indent: str = "") -> str:
    """``text`` folded to ``WIDTH`` columns, its continuation lines indented four more spaces than its first."""
    return textwrap.fill(text, WIDTH, initial_indent=indent, subsequent_indent=indent + "    ", break_long_words=False)


# the course's lesson keys and the short name a finding gives each ("lesson 03 (LoRA reward model NaN)")
LESSONS = {
    "01": "padding-free contamination",
    "02": "gradient accumulation",
    "03": "LoRA reward model NaN",
    "04": "right padding with a KV cache",
    "05": "GRPO",
}
NOT_WATCHED = "not watched: the trainer was not found in the calling frames"  # the checks that need its training_step


@dataclass(frozen=True)
class Cause:
    """A likely cause and its fix (templates); ``lesson`` where another lesson than the check's explains it."""

    cause: str
    fix: str
    lesson: str = ""


@dataclass(frozen=True)
class Entry:
    """One check of the watch (``CATALOGUE[key]``): its lesson and all it says, as templates."""

    lesson: str  # a key of LESSONS
    looks_for: str  # what the check looks for, in one paragraph
    seen: dict[str, str]  # what it saw, by case: templates of the run's numbers
    causes: dict[str, Cause]  # the likely causes it tells apart
    quiet: dict[str, str] = field(default_factory=dict)  # what it says when it found nothing, by case


_FILTER = "; logging_nan_inf_filter then logs a finite loss"
_NO_SIGNAL = "; their advantages are 0, so they teach nothing"

# key -> Entry; the order is the order of the docs, of --help and of the summary
CATALOGUE = {
    "nonfinite": Entry(
        "03",
        "a NaN or inf in the raw loss, the gradients or the weights after an optimizer step: "
        "which tensors, their dtype, the optimizer, at the step where it starts (before "
        "logging_nan_inf_filter hides it in the logged loss)",
        seen={
            "weights": "{count} of {trainable} trainable weights non-finite after optimizer step {step} ({names}; "
            "{dtypes}); gradients {gradients}; raw loss {raw_loss}; optimizer {optimizer}",
            "loss": "raw loss of step {step} is {loss}; gradients {gradients}; raw loss {raw_loss}; "
            "optimizer {optimizer}",
        },
        causes={
            "half_state": Cause(
                "the update itself: AdamW keeps its state in the weights' float16, where eps=1e-8 rounds to 0 and "
                "small squared gradients underflow, so m/(sqrt(v)+eps) is inf" + _FILTER,
                "load the weights in float32 or bfloat16 (dtype='float32'), or use optim='adamw_torch_fused'",
            ),
            "update": Cause(
                "the update itself: finite gradients gave non-finite weights (learning rate, optimizer state)"
                + _FILTER,
                "lower learning_rate, or keep weights and optimizer state in float32/bfloat16",
            ),
            "no_labels": Cause(
                "a micro-batch with no label token: its mean loss is 0/0, and NaN gradients reach every tensor"
                + _FILTER,
                "drop rows without label tokens (raise max_length above the prompts' length)",
            ),
            "overflow": Cause(
                "the loss or its backward overflowed (float16 activations, weights already non-finite); gradient "
                "clipping then spreads one NaN to every tensor" + _FILTER,
                "train in bfloat16 or float32; logging_nan_inf_filter=False shows the NaN in the logged loss",
            ),
        },
        quiet={
            "finite": "raw loss and trainable weights finite at all {steps} steps",
            "no_event": "raw loss finite at all {steps} steps; the weights not read: transformers {version} has no "
            "on_optimizer_step callback event (added in 4.42.0)",
        },
    ),
    "no_labels": Entry(
        "02",
        "a micro-batch with no label token: its loss is 0/0 (NaN) or 0 and it teaches nothing",
        seen={"empty": "{empty} of {count} micro-batches in this step have no label token (label tokens: {counts})"},
        causes={
            "masked": Cause(
                "every label masked: a max_length that cuts the completion away (TRL #6668; TRL 1.16.0's SFTTrainer "
                "drops such rows when it truncates its dataset), a completion mask or assistant_only_loss template "
                "that marks nothing, or a collator of your own",
                "raise max_length above the prompts' length, or drop rows without completion tokens",
            )
        },
        quiet={
            "present": "every step had label tokens (fewest in a step: {fewest})",
            "not_tokens": "no per-token labels in these batches (reward pairs, GRPO prompts)",
            "not_watched": NOT_WATCHED,
        },
    ),
    "zero_loss": Entry(
        "02",
        "a raw loss of exactly 0 over a log's steps (the loss training_step returned, not the logged "
        "number, which transformers < 5.0 rounds to 4 decimals), or a logged 0.0 hiding a NaN, with the cause "
        "the watch saw (no label tokens, a NaN hidden by the NaN filter, GRPO groups with equal rewards)",
        seen={
            "zero": "raw loss is exactly 0 over the steps logged at step {step} (logged loss {logged:.4g})",
            "raw": "logged loss is exactly 0.0 at step {step} (raw loss {raw:.4g})",
            "logged": "logged loss is exactly 0.0 at step {step}",
        },
        causes={
            "filtered": Cause(
                "non-finite step losses hidden by logging_nan_inf_filter: Trainer adds the running "
                "average instead of a NaN, and that average is 0 right after a log",
                "find the first NaN (the nonfinite finding); logging_nan_inf_filter=False shows it",
                "03",
            ),
            "equal_rewards": Cause(
                "every GRPO group had equal rewards, so every advantage is 0 (TRL #5697)",
                "give the reward partial credit, or raise max_completion_length if completions are cut",
                "05",
            ),
            "no_labels": Cause(
                "micro-batches without label tokens (the no_labels finding)",
                "raise max_length above the prompts' length, or drop rows without completion tokens",
            ),
            "constant": Cause(
                "a loss that does not depend on the batch: every label masked, or a loss whose terms cancel",
                "look at one batch's labels (trainer.get_train_dataloader())",
            ),
        },
        quiet={
            "none": "no raw loss was exactly 0",
            "rounded": "a logged loss of 0.0 was a rounded raw loss of {raw:.3g} (transformers < 5.0 logs 4 "
            "decimals): not a finding",
        },
    ),
    "equal_rewards": Entry(
        "05",
        "GRPO groups whose completions all got the same reward (TRL's frac_reward_zero_std) over "
        "a window of steps: their advantages are 0, they teach nothing",
        seen={
            "share": "{share:.0%} of GRPO groups had all-equal rewards over steps {first}-{last} "
            "(TRL's frac_reward_zero_std)"
        },
        causes={
            "cut": Cause(
                "completions cut at max_completion_length all earn the same reward (TRL #5697)" + _NO_SIGNAL,
                "give partial credit, warm the policy up with SFT, or raise num_generations or temperature",
            ),
            "flat": Cause(
                "the reward does not separate a prompt's completions: a 0/1 reward the policy never earns, or a reward "
                "that ignores the completion (TRL #3857)" + _NO_SIGNAL,
                "give partial credit, warm the policy up with SFT, or raise num_generations or temperature",
            ),
        },
        quiet={
            "below": "at most {most:.0%} over a logged row ({metric})",
            "not_logged": "not logged (not a GRPO run)",
        },
    ),
    "clipped": Entry(
        "05",
        "GRPO completions cut at max_completion_length (TRL's completions/clipped_ratio) over a window of steps",
        seen={
            "share": "{share:.0%} of completions were cut at max_completion_length={limit} over steps {first}-{last} "
            "(TRL's completions/clipped_ratio)"
        },
        causes={
            "long": Cause(
                "the policy writes past max_completion_length or never emits EOS; a cut completion usually "
                "earns no reward (TRL #5697)",
                "raise max_completion_length, or warm the policy up with SFT on answers that end in EOS",
            )
        },
        quiet={
            "below": "at most {most:.0%} over a logged row ({metric})",
            "not_logged": "not logged (not a GRPO run)",
        },
    ),
    "no_gradient": Entry(
        "03",
        "trainable tensors that never get a gradient, or no trainable tensor at all (a frozen "
        "adapter: the optimizer updates nothing, grad_norm 0)",
        seen={
            "frozen": "0 of {tensors} tensors are trainable: the optimizer has nothing to update (grad_norm will be 0)",
            "unreached": "{count} of {trainable} trainable tensors got no gradient in {steps} steps ({names})",
        },
        causes={
            "frozen": Cause(
                "a PEFT adapter loaded without is_trainable=True (PeftModel.from_pretrained freezes it), or "
                "everything frozen by a preparation step (TRL #3926); with gradient checkpointing the loss still "
                "has a grad_fn, so nothing fails",
                "PeftModel.from_pretrained(..., is_trainable=True), or pass a "
                "peft_config to the trainer instead of a prepared model",
            ),
            "cut_off": Cause(
                "the tensors are trainable but the loss does not depend on them: an adapter or head left out of the "
                "forward, or a graph cut (a detach, reentrant checkpointing without input gradients)",
                "freeze them (requires_grad=False) or connect them to the loss",
            ),
        },
        quiet={
            "reached": "every trainable tensor got a gradient within {steps} step(s)",
            "deepspeed": "not watched under DeepSpeed (it reads p.grad)",
            "no_event": "not watched: transformers {version} has no on_pre_optimizer_step callback event (added in "
            "4.45.0)",
        },
    ),
    "packing": Entry(
        "01",
        "packed or padding-free rows whose sequences see each other, read from the mask the first "
        "attention layer really receives, and for linear-attention layers (Gated DeltaNet: Qwen3-Next, Qwen3.5) from "
        "the sequence boundaries (seq_idx, cu_seq_lens_q) the forward receives",
        seen={
            "no_mask": "{sequences} sequences packed in {rows} row(s) of {width} tokens; the first attention layer "
            "({implementation}) received no mask (one causal kernel over the whole row)",
            "recurrent": "{sequences} sequences packed in {rows} row(s) of {width} tokens; {recurrent} of {layers} "
            "layers are linear attention and the forward received no seq_idx or cu_seq_lens_q",
            "mask": "{sequences} sequences packed in {rows} row(s) of {width} tokens; the first attention layer "
            "({implementation}) received a {dims}D mask that lets a sequence's first token attend to the sequence "
            "before it",
        },
        causes={
            "mask_sent": Cause(
                "an attention_mask was sent with the packed row: transformers builds per-sequence masks from "
                "position_ids only when no mask and no cache are passed",
                "send no attention_mask with packed rows (TRL's padding-free collator sends none)",
            ),
            "cache": Cause(
                "the forward built a KV cache (use_cache left at the config's True): transformers then ignores "
                "the restarting position_ids",
                "use_cache=False in training forwards",
            ),
            "recurrent": Cause(
                "{model_type}'s linear-attention layers carry one state along the row and read sequence boundaries "
                "only from seq_idx / cu_seq_lens_q, never from position_ids: each sequence's state runs into the "
                "next (transformers #46093)",
                "DataCollatorWithFlattening(return_flash_attn_kwargs=True, return_seq_idx=True) with the "
                "flash-linear-attention and causal-conv1d kernels, or padding_free=False (transformers PR #46333)",
            ),
            "family": Cause(
                "{model_type} builds its causal mask without reading position_ids, so every sequence of "
                "the row shares one causal mask ({implementation})",
                "padding_free=False and packing=False, or attn_implementation='flash_attention_2' reaching the "
                "model (check model.config._attn_implementation)",
            ),
        },
        quiet={"apart": "packed rows kept apart ({forwards} forward(s) read)", "none": "no packed rows seen"},
    ),
    "right_padding": Entry(
        "04",
        "generation (a forward that reads a KV cache) from right-padded rows: the first new token "
        "is predicted at a pad slot",
        seen={"padded": "generate() started from {padded} of {prompts} prompts padded on the right, with a KV cache"},
        causes={
            "right": Cause(
                "the tokenizer pads on the right (padding_side='right') where prompts are batched for generation: a "
                "prompt's first new token is predicted at a pad slot",
                "tokenizer.padding_side = 'left' before tokenizing prompts for generate()",
            )
        },
        quiet={"left": "{generations} generation(s), none from right-padded prompts", "none": "no generation seen"},
    ),
    "accumulation": Entry(
        "02",
        "micro-batch losses that do not grow with their label count under gradient accumulation: "
        "each micro-batch is a mean over its own tokens, so tokens of short micro-batches weigh "
        "more",
        seen={
            "flat": "micro-batch losses do not grow with their label count: slope {slope:.2f} of log loss against log "
            "label tokens over {points} micro-batches (1 when the loss is normalised over the window's tokens)"
        },
        causes={
            "unscaled": Cause(
                "compute_loss ignores num_items_in_batch: each micro-batch returns the mean over its own "
                "tokens, and Trainer, told the model takes loss kwargs, does not divide by the {steps} "
                "accumulation steps, so the logged loss is a sum of {steps} means (transformers #37766)",
                "sum the token losses and divide by num_items_in_batch in compute_loss (as SFTTrainer does)",
            ),
            "divided": Cause(
                "Trainer divides each micro-batch's own mean by the {steps} accumulation steps "
                "(model_accepts_loss_kwargs=False): tokens of short micro-batches weigh more (TRL #2175)",
                "sum the token losses and divide by num_items_in_batch in compute_loss (as SFTTrainer does)",
            ),
        },
        quiet={
            "grows": "micro-batch losses grow with their label count (slope {slope:.2f} over {points} micro-batches; "
            "1 when normalised over the window)",
            "undecided": "not decided: one micro-batch per step, no token labels, or label counts too alike",
            "not_watched": NOT_WATCHED,
        },
    ),
    "loss_spike": Entry(
        "02",
        "a step loss far above the run's own recent window, with the step's label count and its "
        "gradient norm beside it (the samples or the update)",
        seen={
            "labels": "step loss {loss:.4g} is {ratio:.1f}x the median {median:.4g} of the previous {steps} steps; "
            "label tokens {labels} (window median {usual:g}); gradient norm before clipping {norm:.3g}",
            "plain": "step loss {loss:.4g} is {ratio:.1f}x the median {median:.4g} of the previous {steps} steps; "
            "gradient norm before clipping {norm:.3g}",
        },
        causes={
            "samples": Cause(
                "the samples: this step's loss is a mean over only {labels} label tokens, so a few hard tokens "
                "move it (the update is weighted by tokens only if the loss is normalised over the window)",
                "normalise the loss over the window's label tokens (num_items_in_batch) and drop near-empty samples",
            ),
            "update": Cause(
                "the update: a normal batch met weights that the last updates pushed too far",
                "lower learning_rate or add warmup_steps; max_grad_norm limits the step size, not its direction",
            ),
        },
        quiet={
            "largest": "largest step loss {largest:.2f}x its window's median",
            "short": "fewer than {window} steps with a positive loss to compare with",
            "not_watched": NOT_WATCHED,
        },
    ),
    "replicas": Entry(
        "-",
        "in a run of several processes that each hold a whole replica (DDP, DeepSpeed ZeRO-1/2, a model left "
        "unwrapped), trainable weights that differ across processes after the first optimizer step: the gradients "
        "were not averaged, so each process trains its own model (compared with a float64 sum of a fixed strided "
        "sample of each process's trainable weights)",
        seen={
            "differ": "after optimizer step {step} the trainable weights differ across the {count} processes "
            "({distinct} distinct fingerprints: {prints}; spread {spread:.3g}; a float64 sum of up to {sampled} "
            "strided weights a tensor); accelerate's distributed_type {distributed}, model {wrapped}",
        },
        causes={
            "unwrapped": Cause(
                "accelerate left the model unwrapped (distributed_type NO on {count} processes): on a machine without "
                "a GPU, processes launched without use_cpu=True join over ddp_backend's group but "
                "Accelerator.prepare_model wraps nothing, so each process trains alone on its own shard and the "
                "logged loss is scaled by {count}",
                "use_cpu=True on CPU processes (accelerate's MULTI_CPU: DDP over gloo), or one GPU per process",
            ),
            "diverged": Cause(
                "the model is wrapped ({wrapped}) yet the replicas differ: something changed one process's weights "
                "or optimizer outside the averaged step (a callback, a re-initialisation after the wrap, "
                "per-process optimizer settings)",
                "change weights only through the training step, the same way on every process",
            ),
        },
        quiet={
            "equal": "the trainable weights were equal on all {count} processes after step {after} (a float64 sum of "
            "up to {sampled} strided weights a tensor)",
            "one": "one process: no replicas to compare",
            "sharded": "not compared: {launch} shards the weights, each process holds its own part",
            "nonfinite": "not compared: the weights were not finite after step {after} (the nonfinite check)",
            "not_reached": "no optimizer step to compare after",
            "not_watched": NOT_WATCHED,
        },
    ),
    "dpo_flat": Entry(
        "-",
        "DPO whose logged rewards/margins stay at 0 and loss at ln 2 over a window of logged steps after the first "
        "(TRL's rewards/* and logps/* logs): nothing separates chosen from rejected, so nothing is learned",
        seen={
            "flat": "rewards/margins {margin:.2g} and loss {loss:.7f} (ln 2 = 0.6931472) at every logged step of "
            "{first}-{last}; rewards/accuracies {accuracy:.2f}; logps/chosen {chosen:.4g}, logps/rejected "
            "{rejected:.4g}"
        },
        causes={
            "identical": Cause(
                "chosen and rejected are the same tokens once the collator truncates them to max_length "
                "(logps/chosen equals logps/rejected): each such pair gives loss ln 2 and zero gradient",
                "raise max_length above the longest prompt+completion, or drop pairs that differ only past it "
                "(the check-up's identical_pairs counts them)",
            ),
            "reference": Cause(
                "the policy still equals its reference (rewards/chosen = rewards/rejected = 0 while the log-probs "
                "differ): nothing moves the policy: learning_rate 0, no trainable tensor, or a reference model that "
                "is the policy itself",
                "check learning_rate and that the policy has trainable tensors (no_gradient); give ref_model a frozen "
                "copy, never the policy",
            ),
        },
        quiet={
            "moved": "rewards/margins moved off 0 (largest |margin| {largest:.3g} over {rows} logged steps)",
            "few": "fewer than {window} logged DPO steps after the first",
            "not_logged": "not logged (not a DPO run)",
        },
    ),
}


def lesson_name(key: str) -> str:
    """``"03"`` -> ``"lesson 03 (LoRA reward model NaN)"``; ``"-"`` (a failure no lesson covers) -> ``"no lesson"``."""
    return f"lesson {key} ({LESSONS[key]})" if key in LESSONS else "no lesson"


def finding(
    key: str, step: int, seen: str, cause: str, numbers: dict[str, float], decided: str = "measured", **values
) -> Finding:
    """The finding ``key`` makes at ``step``: its ``seen`` case and its ``cause`` filled with ``values`` (and the
    step), ``numbers`` for the logs. A watch finding is a ``fail``: a lesson's failure, seen in the run."""
    entry = CATALOGUE[key]
    said = entry.causes[cause]
    return Finding(
        probe=key,
        status="fail",
        measured=entry.seen[seen].format(step=step, **values),
        cause=said.cause.format(**values),
        fix=said.fix.format(**values),
        lesson=said.lesson or entry.lesson,
        decided=decided,
        step=step,
        numbers=numbers,
    )


def quiet(key: str, case: str, **values) -> str:
    """What check ``key`` says when it found nothing, in its ``case``, filled with ``values``."""
    return CATALOGUE[key].quiet[case].format(**values)


def line(finding: Finding) -> str:
    """What the watch prints when it makes ``finding``: what was seen, the likely cause, the fix, the lesson and how
    it was decided, each folded to ``WIDTH`` columns."""
    return "\n".join(
        [
            wrapped(f"[trl-clinic watch] step {finding.step}{where(finding)}: {finding.probe}: {finding.measured}"),
            wrapped(f"likely cause: {finding.cause}", "  "),
            wrapped(f"fix: {finding.fix}", "  "),
            f"  {lesson_name(finding.lesson)} [{finding.decided}]",
        ]
    )


def where(finding: Finding) -> str:
    """ " (process 1)" after the step of a finding made in a run of several processes, else nothing."""
    return "" if finding.process is None else f" (process {finding.process})"


def logged(finding: Finding) -> dict[str, float]:
    """The numbers under ``clinic/`` that go into the trainer's logs: the step, then the finding's own."""
    return {
        f"clinic/{finding.probe}/step": float(finding.step),
        **{f"clinic/{finding.probe}/{name}": float(value) for name, value in finding.numbers.items()},
    }


def as_dict(finding: Finding) -> dict:
    """The finding as JSON takes it, with its lesson's name."""
    return {**asdict(finding), "lesson_name": lesson_name(finding.lesson)}


def stop_keys(stop_on: str | list[str] | tuple[str, ...] | None) -> frozenset[str]:
    """The findings ``stop_on`` names ("any" for every one); an unknown name is an error, not a silent no-op."""
    if stop_on is None:
        return frozenset()
    names = [stop_on] if isinstance(stop_on, str) else list(stop_on)
    if "any" in names:
        return frozenset(CATALOGUE)
    unknown = sorted(set(names) - set(CATALOGUE))
    if unknown:
        raise ValueError(
            f"stop_on names unknown finding(s) {', '.join(unknown)}: choose from any, {', '.join(CATALOGUE)}"
        )
    return frozenset(names)
