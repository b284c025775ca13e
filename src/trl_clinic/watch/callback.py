"""``ClinicWatch``: the lessons' symptoms caught live in a real training run, with their cause.

    trainer.add_callback(ClinicWatch(trainer=trainer))  # or ClinicWatch(stop_on="nonfinite", report="watch.html")
    trainer.train()

At the first sign it prints what it sees, the likely cause, the fix in one line and the lesson that
explains it; each finding once, also as numbers under ``clinic/`` in the trainer's own logs; a summary at
the end. Its options and thresholds are a ``WatchConfig`` (``watch.config``); every word it says is in the
catalogue (``watch.findings.CATALOGUE``); this module decides. Where it looks, in transformers 5.23's
``Trainer._run_epoch`` and ``Trainer.log``:

* ``on_train_begin`` calls ``setup`` once per run (transformers' ``WandbCallback`` pattern), which sets all the
  run's state. The trainer is the one given (``ClinicWatch(trainer=...)``, as TRL's ``WinRateCallback`` takes
  it), else the one found in the calling frames (a callback is not given it). The watch moves itself to just
  after ``DefaultFlowCallback`` in the trainer's callback handler: the handler calls callbacks in list order
  (``CallbackHandler.call_event``) and ``Trainer.__init__`` puts the ``report_to`` integrations and the printer
  before any callback added later, so the ``clinic/`` keys it adds to ``logs`` in ``on_log`` reach
  TensorBoard, W&B and trackio.
* ``training_step``, tapped (``probes.recording.tap_training_step``): each micro-batch's loss as it returns,
  before ``_run_epoch`` replaces a NaN under ``logging_nan_inf_filter``, and its label count. After the last
  micro-batch of a step the gradients are whole and not yet clipped.
* ``on_pre_optimizer_step`` (``_run_epoch`` calls it after clipping): which trainable tensors got a gradient.
* ``on_optimizer_step`` (after ``optimizer.step()``, before ``model.zero_grad()``): are the trainable weights finite.
* ``on_log`` (``Trainer.log`` calls it after ``state.log_history`` took its copy of ``logs``): the logged loss
  and TRL's GRPO metrics (in trl 1.16 ``frac_reward_zero_std`` from ``GRPOTrainer._generate_and_score_completions``
  and ``completions/clipped_ratio`` from ``GRPOTrainer._generate``, averaged per log by ``GRPOTrainer.log``).
* forward hooks on the model (``watch.forwards``): packed rows and right-padded generation.

It never changes what the trainer computes: no extra forward, no mode change, no random numbers, no
gradient or weight written (tests/test_watch.py compares a watched and an unwatched run bit for bit).
"""

from __future__ import annotations

import math
import statistics
import sys
import weakref
from dataclasses import replace

import torch
import transformers
from transformers import Trainer, TrainerCallback
from transformers.trainer_callback import CallbackHandler, DefaultFlowCallback

from trl_clinic.probes.finding import Finding
from trl_clinic.probes.labels import label_tokens
from trl_clinic.probes.launch import Launch
from trl_clinic.probes.nonfinite import local_part, nonfinite_names
from trl_clinic.probes.processes import SAMPLED, Processes, fingerprint
from trl_clinic.probes.recording import tap_training_step
from trl_clinic.watch.alerts import send
from trl_clinic.watch.config import WatchConfig
from trl_clinic.watch.findings import CATALOGUE, NOT_WATCHED, finding, line, logged, quiet, stop_keys
from trl_clinic.watch.forwards import ForwardWatch


def _caller(kind: type):
    """The innermost calling frame's ``self`` that is a ``kind`` (the handler, the trainer), or None."""
    frame = sys._getframe(1)
    while frame is not None:
        candidate = frame.f_locals.get("self")
        if isinstance(candidate, kind):
            return candidate
        frame = frame.f_back
    return None


def has_event(name: str) -> bool:
    """Whether the installed transformers calls callback event ``name`` (``on_optimizer_step`` since 4.42.0,
    ``on_pre_optimizer_step`` since 4.45.0): ``TrainerCallback`` defines every event its Trainer calls."""
    return hasattr(TrainerCallback, name)


def _nothing() -> None:
    """What a weak reference to nothing returns."""
    return None


def _first(made: Finding) -> tuple[int, int]:
    """Which of several processes' findings of one check every process keeps: the earliest step, then the lowest
    process (a finding no one process owns, ``process`` None, comes first)."""
    return (made.step or 0, -1 if made.process is None else made.process)


def _some(names: list[str]) -> str:
    """The first three names, and an ellipsis for the rest."""
    return f"{', '.join(names[:3])}{', ...' if len(names) > 3 else ''}"


class ClinicWatch(TrainerCallback):
    """Watches a training run for the lessons' failures; see the module's docstring and docs/watch.md.

    ``config``: a ``WatchConfig`` (its defaults when None). ``options``: any of its fields by name, over the
    config (``ClinicWatch(stop_on="nonfinite", window=5)``). ``trainer``: the trainer the watch is added to, as
    TRL's callbacks take it (``WinRateCallback(trainer=...)``); without it the watch finds the trainer in the
    frames that call ``on_train_begin``.
    """

    def __init__(self, config: WatchConfig | None = None, *, trainer: Trainer | None = None, **options) -> None:
        if config is not None and not isinstance(config, WatchConfig):
            raise TypeError(
                f"config must be a WatchConfig, not {type(config).__name__}: pass options by name "
                "(ClinicWatch(stop_on=...))"
            )
        self.config = replace(config or WatchConfig(), **options)
        # held weakly: the trainer holds the watch among its callbacks, and a strong reference back made a cycle that
        # kept the trainer, its DDP wrapper and the process group alive past the user's script into the interpreter's
        # teardown (tests/test_watch_processes.py)
        self._given = weakref.ref(trainer) if trainer is not None else _nothing
        self.stop_on = stop_keys(self.config.stop_on)
        self.findings: list[Finding] = []
        self.steps: list[dict] = []  # one row per optimizer step: raw loss, label tokens, what was logged
        self.checks: dict[str, str] = {}  # what each check saw when it found nothing (for the summary)

    @property
    def trainer(self) -> Trainer | None:
        """The trainer given (``ClinicWatch(trainer=...)``), while it lives; None when none was given."""
        return self._given()

    def setup(self, args, state, model, **kwargs) -> None:
        """All of a run's state, set once at its start (from ``on_train_begin``): the findings so far, the
        trainer and its tapped ``training_step``, the watch's place among the callbacks, the trainable tensors,
        the forward hooks."""
        self.findings, self.steps, self.checks = [], [], {}
        self._state, self._args, self._main = state, args, state.is_world_process_zero
        self._processes = Processes.of(args)
        self._unlogged: list[Finding] = []  # findings whose numbers have not reached a log row yet
        self._unshared: list[Finding] = []  # this process's findings the other processes have not been sent
        self._stop, self._in_step = False, False
        self._micro: list[tuple[torch.Tensor, torch.Tensor | None]] = []  # this optimizer step's micro-batches
        self._slope = [0.0, 0.0, 0]  # sums of x*x and x*y, and the micro-batches they hold
        self._dpo: list[dict] = []  # the logged DPO rows after the first (TRL's rewards/* and logps/*)
        self._rates: dict[str, list[tuple[int, float, int]]] = {
            "frac_reward_zero_std": [],
            "completions/clipped_ratio": [],
        }
        self._last_log_step = state.global_step
        self._trainable = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
        self._never = {name for name, _ in self._trainable}  # trainable tensors without a gradient so far
        self._gradient_steps, self._largest = 0, 0.0
        self._norm = math.nan  # this step's gradient norm before clipping, read where this process's loss could spike
        given = self.trainer
        if given is not None:
            trainer, handler = given, getattr(given, "callback_handler", None)
        else:
            trainer, handler = _caller(Trainer), _caller(CallbackHandler)
        if handler is not None and self in handler.callbacks:  # ahead of the reporters and the printer
            handler.callbacks.remove(self)
            flow = next((i for i, c in enumerate(handler.callbacks) if isinstance(c, DefaultFlowCallback)), -1)
            handler.callbacks.insert(flow + 1, self)
        # weakly, as the trainer given: both hold the watch
        self._owner = weakref.ref(trainer) if trainer is not None else _nothing
        self._handler = weakref.ref(handler) if handler is not None else _nothing
        self._replicas_due = self._replicas_compared(trainer)  # compare the replicas at the first step's end
        self._alerts: list[tuple[Finding, str]] = []  # findings for trackio / W&B whose runs have not started yet
        self._untap = tap_training_step(trainer, self._micro_batch) if trainer is not None else None
        if trainer is None:  # the losses and batches come through the trainer's training_step
            self.checks.update(dict.fromkeys(("no_labels", "accumulation", "loss_spike"), NOT_WATCHED))
        if getattr(trainer, "is_deepspeed_enabled", False):  # ZeRO manages gradients itself; not tried here
            self._never = set()
            self.checks["no_gradient"] = quiet("no_gradient", "deepspeed")
        self._forwards = ForwardWatch(model, self._report, self._current_step, self.config.packed_forwards)
        # transformers added the events these checks read in 4.42.0 and 4.45.0: older ones never call them, and a
        # check that never ran must not end the run saying it saw nothing
        version = transformers.__version__
        if not has_event("on_pre_optimizer_step"):
            self._never = set()
            self.checks["no_gradient"] = quiet("no_gradient", "no_event", version=version)
        self._weights_read = has_event("on_optimizer_step")

    # -- bookkeeping -------------------------------------------------------------------------------
    def found(self, key: str) -> bool:
        return any(f.probe == key for f in self.findings)

    def _report(self, made: Finding, run: bool = False) -> None:
        """Keep, print (main process) and raise ``made`` once. ``run``: decided on numbers every process holds (the
        run's loss, every process's fingerprint), so every process makes it at the same point and it is no one
        process's: nothing to send, no process named."""
        if self.found(made.probe):
            return
        if self._processes.several and not run:
            made.process = self._processes.index
            self._unshared.append(made)
        self.findings.append(made)
        self._unlogged.append(made)
        self._stop |= made.probe in self.stop_on
        if self.config.show and self._main:
            print(line(made), flush=True)
        if self.config.alerts and self._main:
            self._alerts = send([*self._alerts, (made, line(made))], self._listeners())

    def _share(self, extra: object = None) -> list[object]:
        """Send this process's new findings (and ``extra``) to every process, and take theirs: the main process
        prints and logs another process's finding here, each finding once over all processes. Called where every
        process is at the same point (a training log, the end of training); returns every process's ``extra``."""
        gathered = self._processes.gather((self._unshared, extra))
        self._unshared = []
        for index, (made, _) in enumerate(gathered):
            if index == self._processes.index:
                continue
            for other in made:
                held = next((f for f in self.findings if f.probe == other.probe), None)
                if held is None:
                    self.findings.append(other)
                    self._unlogged.append(other)
                    self._stop |= other.probe in self.stop_on
                    if self.config.show and self._main:
                        print(line(other), flush=True)
                elif _first(other) < _first(held):  # several saw it: every process keeps the same one
                    self.findings[self.findings.index(held)] = other
        return [value for _, value in gathered]

    def _listeners(self) -> list:
        """The trainer's callbacks (the trackers among them), while its handler lives."""
        handler = self._handler()
        return handler.callbacks if handler is not None else []

    def _replicas_compared(self, trainer) -> bool:
        """Whether the processes' trainable weights are meant to be equal after a step, and so are compared: several
        processes whose engine keeps a whole replica on each (DDP, DeepSpeed ZeRO-1 and -2, and a model accelerate
        left unwrapped); not ZeRO-3 or FSDP, where each process holds its own shard. Says why not in ``checks``."""
        if not self._processes.several:
            self.checks["replicas"] = quiet("replicas", "one")
            return False
        if trainer is None:
            self.checks["replicas"] = quiet("replicas", "not_watched")
            return False
        launch = Launch.of(trainer)
        sharded = any(local_part(p) is not p for _, p in self._trainable)  # ZeRO-3, or fully_shard by hand: DTensors
        if sharded or launch.engine == "fsdp" or (launch.engine == "deepspeed" and (launch.zero_stage or 0) >= 3):
            described = launch.described if launch.engine != "ddp" else "fully_shard (DTensor parameters)"
            self.checks["replicas"] = quiet("replicas", "sharded", launch=described)
            return False
        return bool(self._trainable)

    def _control(self, control):
        """Apply ``stop_on`` at a step's end or a log only: ``Trainer._run_epoch`` checks the flag after every
        micro-batch, and a stop there would leave a step's gradients accumulated and never applied."""
        if self._stop:
            control.should_training_stop = True
        return control

    def _current_step(self) -> int:
        """The optimizer step under way (between on_step_begin and on_step_end), else the one just finished."""
        return self._state.global_step + self._in_step

    # -- events ------------------------------------------------------------------------------------
    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self.setup(args, state, model)
        if not self._trainable:
            total = sum(1 for _ in model.parameters())
            self._report(
                finding("no_gradient", 0, "frozen", "frozen", {"trainable": 0, "tensors": total}, tensors=total)
            )
        return control

    def _micro_batch(self, loss: torch.Tensor, inputs, num_items_in_batch) -> None:
        self._micro.append((loss, label_tokens(inputs)))
        trainer = self._owner()
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
        self._norm = self._spike_norm(row["raw_loss"])

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        if self._never and self._gradient_steps < self.config.window:
            self._gradient_steps += 1
            grads = dict(self._trainable)
            self._never = {name for name in self._never if grads[name].grad is None}
            if self._never and (self._gradient_steps == self.config.window or state.global_step + 1 >= state.max_steps):
                self._no_gradient()
        return control

    def on_optimizer_step(self, args, state, control, optimizer=None, **kwargs):
        if not self.found("nonfinite") and self._trainable:
            current = self.steps and self.steps[-1]["step"] == state.global_step + 1
            raw = self.steps[-1]["raw_loss"] if current else None  # None: the loss was not seen
            weights = nonfinite_names((name, local_part(p)) for name, p in self._trainable)  # this process's shard
            if weights or (raw is not None and not math.isfinite(raw)):
                self._nonfinite(weights, raw, optimizer)
        return control

    def on_step_begin(self, args, state, control, **kwargs):
        self._in_step = True
        return control

    def on_step_end(self, args, state, control, **kwargs):
        self._in_step = False
        if self._alerts:  # findings made before the trackers' runs started
            self._alerts = send(self._alerts, self._listeners())
        self._agree(state.global_step)
        if self._stop and (self._unlogged or self._processes.several):
            control.should_log = True  # the step that stops the run logs its findings (on every process)
        return self._control(control)

    def _agree(self, step: int) -> None:
        """What every process must see alike, agreed at the end of optimizer step ``step``, a point every process
        reaches, with at most one collective (``Processes.table``: one all-gather of a few numbers a process): whether
        to stop (a finding of ``stop_on`` on any process stops every one after this step), the run's step loss and
        label tokens (``loss_spike``), and, after the first step watched, the weights' fingerprints (``replicas``).

        The run's step loss is the mean over processes of each one's raw step loss: what ``Trainer`` logs (transformers
        5.23 ``Trainer._maybe_log_save_evaluate`` logs ``nested_gather(tr_loss, ...).mean()``), and, under
        ``average_tokens_across_devices`` (the default since 4.54), the window's loss over every process's label
        tokens: ``Trainer.compute_loss`` multiplies each process's loss by the number of processes and
        ``_get_num_items_in_batch`` divides it by the tokens of all of them, so one process's own loss is its share of
        the window's tokens times the processes, and swings with that share (0.11 to 12.6 on one process of a healthy
        run whose logged loss fell smoothly). The same data in one process gives the same run loss."""
        row = self.steps[-1] if self.steps and self.steps[-1]["step"] == step else None
        compare, self._replicas_due = self._replicas_due, False
        several = self._processes.several
        if several and not (self.stop_on or self._untap is not None or compare):
            return  # nothing to agree on (the condition is the same on every process)
        values = [float(self._stop), math.nan, math.nan, self._norm]
        if row is not None:
            values[1:3] = [row["raw_loss"], float(row.get("label_tokens", math.nan))]
        if compare:
            values.append(fingerprint([local_part(p) for _, p in self._trainable]))
        table = self._processes.table(values) if several else [values]
        self._norm = math.nan
        self._stop = any(r[0] for r in table)
        if row is not None:
            row["run_loss"] = statistics.fmean(r[1] for r in table)
            tokens = [r[2] for r in table]
            if all(math.isfinite(t) for t in tokens):
                row["run_label_tokens"] = int(sum(tokens))
            norms = [r[3] for r in table if math.isfinite(r[3])]
            self._spike(row, max(norms) if norms else math.nan)
        if compare:
            self._replicas(step, [r[4] for r in table])

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs is None or "loss" not in logs:  # evaluation rows and the final train metrics
            return self._control(control)
        since = [row for row in self.steps if row["step"] > self._last_log_step]
        covered, self._last_log_step = state.global_step - self._last_log_step, state.global_step
        extra = {}
        raw = sum(row["raw_loss"] for row in since) / len(since) if since else None
        if self._processes.several:  # every process logs at the same steps: the run's raw loss, and their findings
            raws = [value for value in self._share(raw) if value is not None]
            raw = sum(raws) / len(raws) if raws else None
        if raw is not None:
            extra["clinic/raw_loss"] = raw  # a mean over processes, like the logged loss
        if since:
            since[-1].update({k: logs[k] for k in ("loss", "grad_norm") if isinstance(logs.get(k), (int, float))})
        for key in self._rates:
            if isinstance(logs.get(key), (int, float)):
                self._rates[key].append((state.global_step, float(logs[key]), covered))
        self._grpo(final=state.global_step >= state.max_steps)
        self._dpo_flat(logs, state.global_step, covered)
        # GRPO's loss is ~0 on-policy by construction
        grpo_teaches = logs.get("frac_reward_zero_std", 1.0) < self.config.rate
        hidden = logs["loss"] == 0.0 and (raw is None or not math.isfinite(raw))  # a NaN the filter logged as 0
        if not grpo_teaches and (raw == 0.0 or hidden):
            self._zero_loss(logs, raw)
        elif logs["loss"] == 0.0 and not grpo_teaches and not self.found("zero_loss"):
            self.checks["zero_loss"] = quiet("zero_loss", "rounded", raw=raw)  # transformers < 5.0 rounds the log
        for made in self._unlogged:
            extra.update(logged(made))
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
        """Runs before the reporters' on_train_end (the watch sits ahead of them), so alerts reach live runs."""
        if self._never and not self.found("no_gradient") and self._gradient_steps:
            self._no_gradient()
        self._grpo(final=True)
        counts = [r["label_tokens"] for r in self.steps if "label_tokens" in r]
        fewest = min(counts) if counts else None
        if self._processes.several:  # the last findings, and what the silent checks saw on every process
            seen = [value for value in self._share(fewest) if value is not None]
            fewest = min(seen) if seen else None
        self._silent_checks(fewest)
        order = list(CATALOGUE)
        self.findings.sort(key=lambda f: (f.step or 0, order.index(f.probe)))  # one order on every process
        self._forwards.remove()
        if self._untap is not None:
            self._untap()
        if self._main:
            from trl_clinic.watch.report import summary, write_html

            if self.config.show:
                print(summary(self), flush=True)
            if self.config.report is not None:
                write_html(self, self.config.report)
        # nothing of the run's model outlives it through the watch (its findings, steps and checks stay)
        self._trainable, self._micro = [], []
        return control

    def _silent_checks(self, fewest: int | None) -> None:
        """What each check that found nothing saw, in the catalogue's words (for the summary and the report);
        ``fewest``: the fewest label tokens in a step, over every process."""
        forwards = self._forwards
        silent = {
            "nonfinite": (
                ("finite", {"steps": len(self.steps)})
                if self._weights_read
                else ("no_event", {"steps": len(self.steps), "version": transformers.__version__})
            ),
            "no_labels": ("present", {"fewest": fewest}) if fewest is not None else ("not_tokens", {}),
            "zero_loss": ("none", {}),
            "equal_rewards": ("not_logged", {}),
            "clipped": ("not_logged", {}),
            "no_gradient": ("reached", {"steps": self._gradient_steps}),
            "packing": ("apart", {"forwards": forwards.packed_checked}) if forwards.packed_checked else ("none", {}),
            "right_padding": (
                ("left", {"generations": forwards.generations}) if forwards.generations else ("none", {})
            ),
            "accumulation": ("undecided", {}),
            "replicas": ("not_reached", {}),
            "loss_spike": (
                ("largest", {"largest": self._largest}) if self._largest else ("short", {"window": self.config.window})
            ),
            "dpo_flat": (
                ("not_logged", {})
                if not self._dpo
                else ("few", {"window": self.config.window})
                if len(self._dpo) < self.config.window
                else ("moved", {"largest": max(abs(r["rewards/margins"]) for r in self._dpo), "rows": len(self._dpo)})
            ),
        }
        for key, (case, values) in silent.items():
            self.checks.setdefault(key, quiet(key, case, **values))

    # -- findings: which case and which cause, and the numbers; the words are the catalogue's ---------
    def _no_labels(self, counts: list[int]) -> None:
        empty = sum(c == 0 for c in counts)
        self._report(
            finding(
                "no_labels",
                self._current_step(),
                "empty",
                "masked",
                {"empty_micro_batches": empty, "micro_batches": len(counts)},
                empty=empty,
                count=len(counts),
                counts=counts,
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
        if points < self.config.slope_points or xx < self.config.slope_spread:
            return
        slope = xy / xx
        if slope >= self.config.slope:
            self.checks["accumulation"] = quiet("accumulation", "grows", slope=slope, points=points)
            return
        # told the model takes loss kwargs, Trainer does not divide each micro-batch's loss by the steps
        cause = "unscaled" if getattr(trainer, "model_accepts_loss_kwargs", None) else "divided"
        self._report(
            finding(
                "accumulation",
                self._current_step(),
                "flat",
                cause,
                {"slope": slope, "micro_batches": points},
                slope=slope,
                points=points,
                steps=len(counts),
            )
        )

    def _history(self, current: dict | None = None) -> list[dict]:
        """The last ``window`` steps before ``current`` whose run loss is finite (the window a step loss is compared
        with), or fewer where the run is younger."""
        done = [r for r in self.steps if r is not current and math.isfinite(r.get("run_loss", math.nan))]
        return done[-self.config.window :]

    def _spike_norm(self, loss: float) -> float:
        """The gradient norm before clipping (whole: the last micro-batch's backward is done, clipping comes next),
        read only where this process's own step loss reaches ``spike`` times the window's median run loss: the run's
        loss is the mean over processes, so where it spikes some process's own loss is at least as high, and that
        process reads the norm for the finding (under DDP every process holds the averaged gradient). Otherwise NaN:
        no read on an ordinary step."""
        history = self._history()
        if self.found("loss_spike") or len(history) < self.config.window or not math.isfinite(loss):
            return math.nan
        median = statistics.median(r["run_loss"] for r in history)
        if min(r["run_loss"] for r in history) <= 0 or loss < self.config.spike * median:
            return math.nan
        grads = [p.grad for _, p in self._trainable if p.grad is not None]
        if not grads:
            return math.nan
        return torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g.float()) for g in grads])).item()

    def _spike(self, row: dict, norm: float) -> None:
        """The run's step loss (``_agree``) against the median of the window before it; every process decides alike."""
        if self.found("loss_spike"):
            return
        window = self.config.window
        history = self._history(row)
        loss = row["run_loss"]
        if len(history) < window or not math.isfinite(loss) or min(r["run_loss"] for r in history) <= 0:
            return
        median = statistics.median(r["run_loss"] for r in history)
        self._largest = max(self._largest, loss / median)
        if loss < self.config.spike * median:
            return
        labels, usual = row.get("run_label_tokens"), None
        if labels is not None and all("run_label_tokens" in r for r in history):
            usual = statistics.median(r["run_label_tokens"] for r in history)
        few = usual is not None and labels < self.config.few_labels * usual
        self._report(
            finding(
                "loss_spike",
                row["step"],
                "labels" if usual is not None else "plain",
                "samples" if few else "update",
                {
                    "loss": loss,
                    "ratio": loss / median,
                    "grad_norm": norm,
                    **({"label_tokens": labels} if labels is not None else {}),
                },
                loss=loss,
                ratio=loss / median,
                median=median,
                steps=len(history),
                labels=labels,
                usual=usual,
                norm=norm,
            ),
            run=True,
        )

    def _replicas(self, step: int, prints: list[float]) -> None:
        """Every process's fingerprint of its trainable weights after the first step watched: equal replicas
        (DDP, DeepSpeed ZeRO-1/2) are equal bit for bit, so any difference is a finding. No tolerance: every process
        applies the same update to the same weights (DDP's all-reduce hands every process the same averaged
        gradient), and a tolerance would hide the small drift of a small learning rate."""
        count = len(prints)
        if not all(math.isfinite(value) for value in prints):
            self.checks["replicas"] = quiet("replicas", "nonfinite", after=step)
            return
        if len(set(prints)) == 1:
            self.checks["replicas"] = quiet("replicas", "equal", count=count, after=step, sampled=SAMPLED)
            return
        trainer = self._owner()
        accelerator = getattr(trainer, "accelerator", None)
        distributed = str(getattr(accelerator, "distributed_type", "unknown")).split(".")[-1]
        wrapped = type(getattr(trainer, "model_wrapped", None)).__name__
        spread = max(prints) - min(prints)
        self._report(
            finding(
                "replicas",
                step,
                "differ",
                "unwrapped" if distributed == "NO" else "diverged",
                {"processes": count, "spread": spread},
                count=count,
                distinct=len(set(prints)),
                prints=", ".join(f"{value:.12g}" for value in prints),
                spread=spread,
                sampled=SAMPLED,
                distributed=distributed,
                wrapped=wrapped,
            ),
            run=True,
        )

    def _no_gradient(self) -> None:
        never = sorted(self._never)
        self._report(
            finding(
                "no_gradient",
                self._current_step(),
                "unreached",
                "cut_off",
                {"tensors": len(never), "trainable": len(self._trainable)},
                count=len(never),
                trainable=len(self._trainable),
                steps=self._gradient_steps,
                names=_some(never),
            )
        )

    def _nonfinite(self, weights: list[str], raw: float | None, optimizer) -> None:
        gradients = nonfinite_names((name, p.grad) for name, p in self._trainable)
        held = getattr(self._owner(), "is_deepspeed_enabled", False)  # DeepSpeed keeps them in its own buffers
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
        # torch 2.13 Adam._init_group: the moments are zeros_like(p), in the weights' dtype
        half_state = "float16" in dtypes and "Adam" in type(inner).__name__ and not defaults.get("fused")
        if weights and not gradients:
            cause = "half_state" if half_state else "update"
        elif self.found("no_labels") and raw is not None and not math.isfinite(raw):
            cause = "no_labels"
        else:
            cause = "overflow"
        self._report(
            finding(
                "nonfinite",
                self._current_step(),
                "weights" if weights else "loss",
                cause,
                {"tensors": len(bad), "raw_loss": float("nan") if raw is None else raw},
                count=len(weights),
                trainable=len(self._trainable),
                names=_some(weights),
                dtypes=", ".join(dtypes),
                loss=raw,
                gradients="not read (DeepSpeed holds them)"
                if held
                else "finite"
                if not gradients
                else f"non-finite in {len(gradients)} tensors",
                raw_loss="not seen" if raw is None else f"{raw:.4g}",
                optimizer=described,
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
                if covered >= self.config.window:
                    break
            if covered < self.config.window and not final:
                continue
            share = sum(value * steps for _, value, steps in window) / covered
            first, last = window[-1][0] - window[-1][2] + 1, window[0][0]
            if share < self.config.rate:
                self.checks[name] = quiet(name, "below", most=max(v for _, v, _ in rows), metric=key)
                continue
            if name == "equal_rewards":
                clipped = self._rates["completions/clipped_ratio"]
                cut = bool(clipped) and clipped[-1][1] >= self.config.rate
                cause, values = ("cut" if cut else "flat"), {}
            else:
                cause, values = "long", {"limit": getattr(self._args, "max_completion_length", None)}
            self._report(
                finding(
                    name,
                    self._state.global_step,
                    "share",
                    cause,
                    {"share": share},
                    share=share,
                    first=first,
                    last=last,
                    **values,
                )
            )

    def _dpo_flat(self, logs: dict, step: int, covered: int) -> None:
        """DPO's margins at 0 and loss at ln 2 for ``window`` logged rows after the first (the first logged step is
        flat by construction: the policy starts as its reference)."""
        if "rewards/margins" not in logs or self.found("dpo_flat"):
            return
        if step <= covered:  # the row that holds step 1
            return
        self._dpo.append({"step": step, **{k: float(v) for k, v in logs.items() if isinstance(v, (int, float))}})
        rows = self._dpo[-self.config.window :]
        flat = [
            abs(r["rewards/margins"]) < self.config.flat and abs(r["loss"] - math.log(2)) < self.config.flat
            for r in rows
        ]
        if len(rows) < self.config.window or not all(flat):
            return
        last = rows[-1]
        same = abs(last.get("logps/chosen", 0.0) - last.get("logps/rejected", 1.0)) < self.config.flat
        self._report(
            finding(
                "dpo_flat",
                step,
                "flat",
                "identical" if same else "reference",
                {"margin": last["rewards/margins"], "loss": last["loss"], "rows": len(rows)},
                margin=last["rewards/margins"],
                loss=last["loss"],
                first=rows[0]["step"],
                last=step,
                accuracy=last.get("rewards/accuracies", float("nan")),
                chosen=last.get("logps/chosen", float("nan")),
                rejected=last.get("logps/rejected", float("nan")),
            )
        )

    def _zero_loss(self, logs: dict, raw: float | None) -> None:
        if (raw is not None and not math.isfinite(raw)) or self.found("nonfinite"):
            cause = "filtered"
        elif logs.get("frac_reward_zero_std", 0) >= self.config.rate:
            cause = "equal_rewards"
        elif self.found("no_labels"):
            cause = "no_labels"
        else:
            cause = "constant"
        self._report(
            finding(
                "zero_loss",
                self._state.global_step,
                "logged" if raw is None else "zero" if raw == 0.0 else "raw",
                cause,
                {"logged_loss": float(logs["loss"]), "raw_loss": float("nan") if raw is None else raw},
                raw=raw,
                logged=logs["loss"],
            )
        )
