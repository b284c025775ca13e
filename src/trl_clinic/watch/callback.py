"""``ClinicWatch``: the lessons' symptoms caught live in a real training run, with their cause.

    trainer.add_callback(ClinicWatch())     # or ClinicWatch(stop_on="nonfinite", report="watch.html")
    trainer.train()

At the first sign it prints what it sees, the likely cause, the fix in one line and the lesson that
explains it; each finding once, also as numbers under ``clinic/`` in the trainer's own logs; a summary at
the end. Where it looks, in transformers 5.23 ``trainer.py`` (``Trainer._run_epoch``, lines 1894-1961,
and ``Trainer.log``, 4181-4203):

* ``on_train_begin``: the trainer and its callback handler, found in the calling frames (a callback is
  not given them). The watch moves itself to just after ``DefaultFlowCallback``: the handler calls
  callbacks in list order (``trainer_callback.py``, ``CallbackHandler.call_event``) and ``Trainer.__init__``
  puts the ``report_to`` integrations and the printer before any callback added later (trainer.py:586-599),
  so the ``clinic/`` keys it adds to ``logs`` in ``on_log`` reach TensorBoard, W&B and trackio.
* ``training_step``, tapped (``probes.recording.tap_training_step``): each micro-batch's loss as it
  returns, before ``logging_nan_inf_filter`` replaces a NaN (trainer.py:1911-1917), and its label count.
  After the last micro-batch of a step the gradients are whole and not yet clipped.
* ``on_pre_optimizer_step`` (after clipping, trainer.py:1929-1934): which trainable tensors got a gradient.
* ``on_optimizer_step`` (after ``optimizer.step()``, before ``model.zero_grad()``, trainer.py:1936-1946):
  are the trainable weights finite.
* ``on_log`` (called after ``state.log_history`` took its copy of ``logs``): the logged loss and TRL's
  GRPO metrics (``frac_reward_zero_std``, ``completions/clipped_ratio``: trl 1.16 grpo_trainer.py:2304,
  2830, averaged per log by ``GRPOTrainer.log``, 3302-3321).
* forward hooks on the model (``watch.forwards``): packed rows and right-padded generation.

It never changes what the trainer computes: no extra forward, no mode change, no random numbers, no
gradient or weight written (tests/test_watch.py compares a watched and an unwatched run bit for bit).
"""

from __future__ import annotations

import math
import statistics
import sys
from collections.abc import Iterable
from pathlib import Path

import torch
from transformers import Trainer, TrainerCallback
from transformers.trainer_callback import CallbackHandler, DefaultFlowCallback

from trl_clinic.probes.labels import label_tokens
from trl_clinic.probes.nonfinite import nonfinite_names
from trl_clinic.probes.recording import tap_training_step
from trl_clinic.watch.findings import Finding, stop_keys
from trl_clinic.watch.forwards import ForwardWatch

# Thresholds, and why (docs/watch.md gives the measured margins):
RATE = 0.9  # GRPO: share of all-equal groups / clipped completions over the window; the reports show 1.0 (#3857)
#             and 0.97-0.99 (#5697): at 0.9 nine groups in ten teach nothing
SPIKE = 3.0  # a step loss this many times the median of the recent window
SLOPE = 0.5  # micro-batch loss against its label count on a log-log scale: 1 when normalised over the window's
#             tokens, 0 when each micro-batch is a mean of its own; 0.5 is halfway
SLOPE_POINTS, SLOPE_SPREAD = 8, 2.0  # micro-batches, and the spread of their log label counts, to decide on
FEW_LABELS = 0.25  # a spiking step with fewer label tokens than this share of the window's median: the samples


def _caller(kind: type):
    """The innermost calling frame's ``self`` that is a ``kind`` (the handler, the trainer), or None."""
    frame = sys._getframe(2)
    while frame is not None:
        candidate = frame.f_locals.get("self")
        if isinstance(candidate, kind):
            return candidate
        frame = frame.f_back
    return None


class ClinicWatch(TrainerCallback):
    """Watches a training run for the lessons' failures; see the module's docstring and docs/watch.md.

    ``stop_on``: a finding's key, a list of them, or "any": the run stops (``control.should_training_stop``)
    at the step the finding is made. ``window``: the optimizer steps over which GRPO's rates are averaged,
    a trainable tensor must go without a gradient, and a loss spike is compared with. ``report``: a path
    for a self-contained HTML page written at the end. ``show``: print the lines and the summary.
    """

    def __init__(
        self,
        stop_on: str | Iterable[str] | None = None,
        window: int = 10,
        report: str | Path | None = None,
        show: bool = True,
    ) -> None:
        if window < 1:
            raise ValueError(f"window must be at least 1 step, got {window}")
        self.stop_on = stop_keys(stop_on if stop_on is None or isinstance(stop_on, str) else list(stop_on))
        self.window, self.report_path, self.show = window, report, show
        self.findings: list[Finding] = []
        self.steps: list[dict] = []  # one row per optimizer step: raw loss, label tokens, what was logged
        self.checks: dict[str, str] = {}  # what each check saw when it found nothing (for the summary)
        self._unlogged: list[Finding] = []  # findings whose numbers have not reached a log row yet
        self._stop, self._main = False, True

    # -- bookkeeping -------------------------------------------------------------------------------
    def found(self, key: str) -> bool:
        return any(f.key == key for f in self.findings)

    def _report(self, finding: Finding) -> None:
        if self.found(finding.key):
            return
        self.findings.append(finding)
        self._unlogged.append(finding)
        self._stop |= finding.key in self.stop_on
        if self.show and self._main:
            print(finding.line(), flush=True)

    def _control(self, control):
        """Apply ``stop_on`` at a step's end or a log only: Trainer checks the flag after every micro-batch
        (trainer.py:1963), and a stop there would leave a step's gradients accumulated and never applied."""
        if self._stop:
            control.should_training_stop = True
        return control

    def _current_step(self) -> int:
        """The optimizer step under way (between on_step_begin and on_step_end), else the one just finished."""
        return self._state.global_step + self._in_step

    # -- events ------------------------------------------------------------------------------------
    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self.findings, self.steps, self.checks = [], [], {}
        self._state, self._args, self._main = state, args, state.is_world_process_zero
        self._unlogged, self._stop, self._in_step = [], False, False
        self._micro: list[tuple[torch.Tensor, torch.Tensor | None]] = []
        self._slope = [0.0, 0.0, 0]  # sums of x*x and x*y, and the micro-batches they hold
        self._rates: dict[str, list[tuple[int, float, int]]] = {
            "frac_reward_zero_std": [],
            "completions/clipped_ratio": [],
        }
        self._last_log_step = state.global_step
        self._trainable = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
        self._never = {name for name, _ in self._trainable}  # trainable tensors without a gradient so far
        self._gradient_steps, self._largest = 0, 0.0
        handler, trainer = _caller(CallbackHandler), _caller(Trainer)
        if handler is not None:  # ahead of the reporters and the printer, so they see the clinic/ keys
            handler.callbacks.remove(self)
            flow = next((i for i, c in enumerate(handler.callbacks) if isinstance(c, DefaultFlowCallback)), -1)
            handler.callbacks.insert(flow + 1, self)
        self._trainer = trainer
        self._untap = tap_training_step(trainer, self._micro_batch) if trainer is not None else None
        if trainer is None:  # the losses and batches come through the trainer's training_step
            self.checks.update(
                dict.fromkeys(
                    ("no_labels", "accumulation", "loss_spike"),
                    "not watched: the trainer was not found in the calling frames",
                )
            )
        if getattr(trainer, "is_deepspeed_enabled", False):  # ZeRO manages gradients itself; not tried here
            self._never = set()
            self.checks["no_gradient"] = "not watched under DeepSpeed (it reads p.grad)"
        self._forwards = ForwardWatch(model, self._report, self._current_step)
        if not self._trainable:
            total = sum(1 for _ in model.parameters())
            self._report(
                Finding(
                    "no_gradient",
                    0,
                    f"0 of {total} tensors are trainable: the optimizer has nothing to update (grad_norm will be 0)",
                    "a PEFT adapter loaded without is_trainable=True (PeftModel.from_pretrained freezes it), or "
                    "everything frozen by a preparation step (TRL #3926); with gradient checkpointing the loss still "
                    "has a grad_fn, so nothing fails",
                    "PeftModel.from_pretrained(..., is_trainable=True), or pass a "
                    "peft_config to the trainer instead of a prepared model",
                    "03",
                    how="measured",
                    numbers={"trainable": 0, "tensors": total},
                )
            )
        return control

    def _micro_batch(self, loss: torch.Tensor, inputs, num_items_in_batch) -> None:
        self._micro.append((loss, label_tokens(inputs)))
        trainer = self._trainer
        if not trainer.accelerator.sync_gradients:  # more micro-batches to come in this optimizer step
            return
        micro, self._micro = self._micro, []
        counted = all(count is not None for _, count in micro)
        values = torch.stack(
            [loss.float() for loss, _ in micro] + ([count.float() for _, count in micro] if counted else [])
        ).tolist()  # one sync
        losses, counts = values[: len(micro)], [int(c) for c in values[len(micro) :]]
        row = {"step": self._current_step(), "raw_loss": sum(losses), "micro_batches": len(micro)}
        if counts:
            row["label_tokens"] = sum(counts)
        self.steps.append(row)
        if counts and min(counts) == 0:
            self._no_labels(counts)
        if counts and "labels" in inputs and len(counts) > 1:
            self._accumulation(losses, counts, trainer)
        self._spike(row)

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        if self._never and self._gradient_steps < self.window:
            self._gradient_steps += 1
            grads = dict(self._trainable)
            self._never = {name for name in self._never if grads[name].grad is None}
            if self._never and (self._gradient_steps == self.window or state.global_step + 1 >= state.max_steps):
                self._no_gradient()
        return control

    def on_optimizer_step(self, args, state, control, optimizer=None, **kwargs):
        if not self.found("nonfinite") and self._trainable:
            current = self.steps and self.steps[-1]["step"] == state.global_step + 1
            raw = self.steps[-1]["raw_loss"] if current else None  # None: the loss was not seen
            weights = nonfinite_names(self._trainable)
            if weights or (raw is not None and not math.isfinite(raw)):
                self._nonfinite(weights, raw, optimizer)
        return control

    def on_step_begin(self, args, state, control, **kwargs):
        self._in_step = True
        return control

    def on_step_end(self, args, state, control, **kwargs):
        self._in_step = False
        if self._stop and self._unlogged:
            control.should_log = True  # the step that stops the run logs its findings
        return self._control(control)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs is None or "loss" not in logs:  # evaluation rows and the final train metrics
            return self._control(control)
        since = [row for row in self.steps if row["step"] > self._last_log_step]
        covered, self._last_log_step = state.global_step - self._last_log_step, state.global_step
        extra = {}
        if since:
            extra["clinic/raw_loss"] = sum(row["raw_loss"] for row in since) / len(since)
            since[-1].update({k: logs[k] for k in ("loss", "grad_norm") if isinstance(logs.get(k), (int, float))})
        for key in self._rates:
            if isinstance(logs.get(key), (int, float)):
                self._rates[key].append((state.global_step, float(logs[key]), covered))
        self._grpo(final=state.global_step >= state.max_steps)
        grpo_teaches = logs.get("frac_reward_zero_std", 1.0) < RATE  # GRPO's loss is ~0 on-policy by construction
        if logs["loss"] == 0.0 and not grpo_teaches:
            self._zero_loss(logs, since)
        for finding in self._unlogged:
            extra.update(finding.logs())
        self._unlogged = []
        logs.update(extra)
        if (
            state.log_history
            and state.log_history[-1].get("step") == state.global_step
            and state.log_history[-1].get("loss") == logs["loss"]
        ):
            state.log_history[-1].update(extra)  # Trainer.log appended its copy before calling on_log
        return self._control(control)

    def on_train_end(self, args, state, control, **kwargs):
        if self._never and not self.found("no_gradient") and self._gradient_steps:
            self._no_gradient()
        self._grpo(final=True)
        self._silent_checks()
        self._forwards.remove()
        if self._untap is not None:
            self._untap()
        if self._main:
            from trl_clinic.watch.report import summary, write_html

            if self.show:
                print(summary(self), flush=True)
            if self.report_path is not None:
                write_html(self, self.report_path)
        return control

    def _silent_checks(self) -> None:
        """What each check that found nothing saw, in words (for the summary and the report)."""
        steps, counts = len(self.steps), [r["label_tokens"] for r in self.steps if "label_tokens" in r]
        forwards = self._forwards
        silent = {
            "nonfinite": f"raw loss and trainable weights finite at all {steps} steps",
            "no_labels": (
                f"every step had label tokens (fewest in a step: {min(counts)})"
                if counts
                else "no per-token labels in these batches (reward pairs, GRPO prompts)"
            ),
            "zero_loss": "no logged loss was exactly 0.0",
            "equal_rewards": "not logged (not a GRPO run)",
            "clipped": "not logged (not a GRPO run)",
            "no_gradient": f"every trainable tensor got a gradient within {self._gradient_steps} step(s)",
            "packing": (
                f"packed rows kept apart ({forwards.packed_checked} forward(s) read)"
                if forwards.packed_checked
                else "no packed rows seen"
            ),
            "right_padding": (
                f"{forwards.generations} generation(s), none from right-padded prompts"
                if forwards.generations
                else "no generation seen"
            ),
            "accumulation": "not decided: one micro-batch per step, no token labels, or label counts too alike",
            "loss_spike": (
                f"largest step loss {self._largest:.2f}x its window's median"
                if self._largest
                else f"fewer than {self.window} steps with a positive loss to compare with"
            ),
        }
        for key, text in silent.items():
            self.checks.setdefault(key, text)

    # -- findings ----------------------------------------------------------------------------------
    def _no_labels(self, counts: list[int]) -> None:
        empty = sum(c == 0 for c in counts)
        self._report(
            Finding(
                "no_labels",
                self._current_step(),
                f"{empty} of {len(counts)} micro-batches in this step have no label token (label tokens: {counts})",
                "every label masked: a max_length that cuts the completion away (TRL #6668; TRL 1.16.0's SFTTrainer "
                "drops such rows when it truncates its dataset), a completion mask or assistant_only_loss template "
                "that marks nothing, or a collator of your own",
                "raise max_length above the prompts' length, or drop rows without completion tokens",
                "02",
                numbers={"empty_micro_batches": empty, "micro_batches": len(counts)},
            )
        )

    def _accumulation(self, losses: list[float], counts: list[int], trainer) -> None:
        if self.found("accumulation") or "accumulation" in self.checks:
            return
        if min(counts) == 0 or not all(math.isfinite(v) and v > 0 for v in losses):
            return
        logs_n, logs_r = [math.log(c) for c in counts], [math.log(v) for v in losses]
        mean_n, mean_r = statistics.fmean(logs_n), statistics.fmean(logs_r)
        self._slope[0] += sum((n - mean_n) ** 2 for n in logs_n)
        self._slope[1] += sum((n - mean_n) * (r - mean_r) for n, r in zip(logs_n, logs_r))
        self._slope[2] += len(counts)
        xx, xy, points = self._slope
        if points < SLOPE_POINTS or xx < SLOPE_SPREAD:
            return
        slope = xy / xx
        if slope >= SLOPE:
            self.checks["accumulation"] = (
                f"micro-batch losses grow with their label count (slope {slope:.2f} over "
                f"{points} micro-batches; 1 when normalised over the window)"
            )
            return
        scaled = getattr(trainer, "model_accepts_loss_kwargs", None)
        steps = len(counts)
        if scaled:
            cause = (
                f"compute_loss ignores num_items_in_batch: each micro-batch returns the mean over its own "
                f"tokens, and Trainer, told the model takes loss kwargs, does not divide by the {steps} "
                f"accumulation steps, so the logged loss is a sum of {steps} means (transformers #37766)"
            )
        else:
            cause = (
                f"Trainer divides each micro-batch's own mean by the {steps} accumulation steps "
                "(model_accepts_loss_kwargs=False): tokens of short micro-batches weigh more (TRL #2175)"
            )
        self._report(
            Finding(
                "accumulation",
                self._current_step(),
                f"micro-batch losses do not grow with their label count: slope {slope:.2f} of log loss against log "
                f"label tokens over {points} micro-batches (1 when the loss is normalised over the window's tokens)",
                cause,
                "sum the token losses and divide by num_items_in_batch in compute_loss (as SFTTrainer does)",
                "02",
                numbers={"slope": slope, "micro_batches": points},
            )
        )

    def _spike(self, row: dict) -> None:
        if self.found("loss_spike"):
            return
        history = [r for r in self.steps[:-1] if math.isfinite(r["raw_loss"])][-self.window :]
        loss = row["raw_loss"]
        if len(history) < self.window or not math.isfinite(loss) or min(r["raw_loss"] for r in history) <= 0:
            return
        median = statistics.median(r["raw_loss"] for r in history)
        self._largest = max(self._largest, loss / median)
        if loss < SPIKE * median:
            return
        grads = [p.grad for _, p in self._trainable if p.grad is not None]  # whole and not yet clipped
        norm = (
            torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g.float()) for g in grads])).item()
            if grads
            else float("nan")
        )
        labels, usual = row.get("label_tokens"), None
        if labels is not None and all("label_tokens" in r for r in history):
            usual = statistics.median(r["label_tokens"] for r in history)
        beside = (
            f"; label tokens {labels} (window median {usual:g})" if usual is not None else ""
        ) + f"; gradient norm before clipping {norm:.3g}"
        if usual is not None and labels < FEW_LABELS * usual:
            cause = (
                f"the samples: this step's loss is a mean over only {labels} label tokens, so a few hard tokens "
                "move it (the update is weighted by tokens only if the loss is normalised over the window)"
            )
            fix = "normalise the loss over the window's label tokens (num_items_in_batch) and drop near-empty samples"
        else:
            cause = "the update: a normal batch met weights that the last updates pushed too far"
            fix = "lower learning_rate or add warmup_steps; max_grad_norm limits the step size, not its direction"
        self._report(
            Finding(
                "loss_spike",
                row["step"],
                f"step loss {loss:.4g} is {loss / median:.1f}x the median {median:.4g} of the "
                f"previous {len(history)} steps{beside}",
                cause,
                fix,
                "02",
                numbers={
                    "loss": loss,
                    "ratio": loss / median,
                    "grad_norm": norm,
                    **({"label_tokens": labels} if labels is not None else {}),
                },
            )
        )

    def _no_gradient(self) -> None:
        never = sorted(self._never)
        self._report(
            Finding(
                "no_gradient",
                self._current_step(),
                f"{len(never)} of {len(self._trainable)} trainable tensors got no gradient in {self._gradient_steps} "
                f"steps ({', '.join(never[:3])}{', ...' if len(never) > 3 else ''})",
                "the tensors are trainable but the loss does not depend on them: an adapter or head left out of the "
                "forward, or a graph cut (a detach, reentrant checkpointing without input gradients)",
                "freeze them (requires_grad=False) or connect them to the loss",
                "03",
                numbers={"tensors": len(never), "trainable": len(self._trainable)},
            )
        )

    def _nonfinite(self, weights: list[str], raw: float | None, optimizer) -> None:
        gradients = nonfinite_names((name, p.grad) for name, p in self._trainable)
        params = dict(self._trainable)
        bad = weights or gradients
        dtypes = sorted({str(params[name].dtype).replace("torch.", "") for name in bad}) if bad else []
        inner = getattr(optimizer, "optimizer", optimizer)
        defaults = getattr(inner, "defaults", {}) or {}
        described = (
            f"{type(inner).__name__} ({'fused' if defaults.get('fused') else 'not fused'})"
            if inner is not None
            else "none"
        )
        step = self._current_step()
        where = (
            f"{len(weights)} of {len(self._trainable)} trainable weights non-finite after optimizer step {step} "
            f"({', '.join(weights[:3])}{', ...' if len(weights) > 3 else ''}; {', '.join(dtypes)})"
            if weights
            else f"raw loss of step {step} is {raw}"
        )
        seen = (
            f"{where}; gradients {'finite' if not gradients else f'non-finite in {len(gradients)} tensors'}; "
            f"raw loss {'not seen' if raw is None else f'{raw:.4g}'}; optimizer {described}"
        )
        half_state = "float16" in dtypes and "Adam" in type(inner).__name__ and not defaults.get("fused")
        if weights and not gradients and half_state:
            # torch 2.13 optim/adam.py:177-183: the moments are zeros_like(p), in the weights' dtype
            cause = (
                "the update itself: AdamW keeps its state in the weights' float16, where eps=1e-8 rounds to 0 "
                "and small squared gradients underflow, so m/(sqrt(v)+eps) is inf"
            )
            fix = "load the weights in float32 or bfloat16 (dtype='float32'), or use optim='adamw_torch_fused'"
        elif weights and not gradients:
            cause = "the update itself: finite gradients gave non-finite weights (learning rate, optimizer state)"
            fix = "lower learning_rate, or keep weights and optimizer state in float32/bfloat16"
        elif self.found("no_labels") and raw is not None and not math.isfinite(raw):
            cause = "a micro-batch with no label token: its mean loss is 0/0, and NaN gradients reach every tensor"
            fix = "drop rows without label tokens (raise max_length above the prompts' length)"
        else:
            cause = (
                "the loss or its backward overflowed (float16 activations, weights already non-finite); gradient "
                "clipping then spreads one NaN to every tensor"
            )
            fix = "train in bfloat16 or float32; logging_nan_inf_filter=False shows the NaN in the logged loss"
        self._report(
            Finding(
                "nonfinite",
                step,
                seen,
                cause + "; logging_nan_inf_filter then logs a finite loss",
                fix,
                "03",
                numbers={"tensors": len(bad), "raw_loss": float("nan") if raw is None else raw},
            )
        )

    def _grpo(self, final: bool) -> None:
        for key, name in (("frac_reward_zero_std", "equal_rewards"), ("completions/clipped_ratio", "clipped")):
            rows = self._rates[key]
            if self.found(name) or not rows:
                continue
            window, covered = [], 0
            for row in reversed(rows):
                window.append(row)
                covered += row[2]
                if covered >= self.window:
                    break
            if covered < self.window and not final:
                continue
            share = sum(value * steps for _, value, steps in window) / covered
            first = window[-1][0] - window[-1][2] + 1
            if share < RATE:
                self.checks[name] = f"at most {max(v for _, v, _ in rows):.0%} over a logged row ({key})"
                continue
            if name == "equal_rewards":
                clipped = self._rates["completions/clipped_ratio"]
                cut = bool(clipped) and clipped[-1][1] >= RATE
                self._report(
                    Finding(
                        name,
                        self._state.global_step,
                        f"{share:.0%} of GRPO groups had all-equal rewards over steps "
                        f"{first}-{window[0][0]} (TRL's frac_reward_zero_std)",
                        (
                            "completions cut at max_completion_length all earn the same reward (TRL #5697)"
                            if cut
                            else "the reward does not separate a prompt's completions: a 0/1 reward the policy "
                            "never earns, or a reward that ignores the completion (TRL #3857)"
                        )
                        + "; their advantages are 0, so they teach "
                        "nothing",
                        "give partial credit, warm the policy up with SFT, or raise num_generations or temperature",
                        "05",
                        numbers={"share": share},
                    )
                )
            else:
                limit = getattr(self._args, "max_completion_length", None)
                self._report(
                    Finding(
                        name,
                        self._state.global_step,
                        f"{share:.0%} of completions were cut at max_completion_length="
                        f"{limit} over steps {first}-{window[0][0]} (TRL's completions/clipped_ratio)",
                        "the policy writes past max_completion_length or never emits EOS; a cut completion usually "
                        "earns no reward (TRL #5697)",
                        "raise max_completion_length, or warm the policy up with SFT on answers that end in EOS",
                        "05",
                        numbers={"share": share},
                    )
                )

    def _zero_loss(self, logs: dict, since: list[dict]) -> None:
        if any(not math.isfinite(row["raw_loss"]) for row in since) or self.found("nonfinite"):
            cause, fix, lesson = (
                "non-finite step losses hidden by logging_nan_inf_filter: Trainer adds the running "
                "average instead of a NaN, and that average is 0 right after a log",
                "find the first NaN (the nonfinite finding); logging_nan_inf_filter=False shows it",
                "03",
            )
        elif logs.get("frac_reward_zero_std", 0) >= RATE:
            cause, fix, lesson = (
                "every GRPO group had equal rewards, so every advantage is 0 (TRL #5697)",
                "give the reward partial credit, or raise max_completion_length if completions are cut",
                "05",
            )
        elif self.found("no_labels"):
            cause, fix, lesson = (
                "micro-batches without label tokens (the no_labels finding)",
                "raise max_length above the prompts' length, or drop rows without completion tokens",
                "02",
            )
        else:
            cause, fix, lesson = (
                "a loss that does not depend on the batch: every label masked, or a loss whose terms cancel",
                "look at one batch's labels (trainer.get_train_dataloader())",
                "02",
            )
        raw = f" (raw loss {since[-1]['raw_loss']:.4g})" if since else ""
        self._report(
            Finding(
                "zero_loss",
                self._state.global_step,
                f"logged loss is exactly 0.0 at step {self._state.global_step}{raw}",
                cause,
                fix,
                lesson,
                numbers={"logged_loss": 0.0},
            )
        )
