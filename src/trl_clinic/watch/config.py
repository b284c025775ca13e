"""``WatchConfig``: what the watch stops on, where it reports, and its thresholds, each with its help.

Written as TRL writes its configs (``SFTConfig``, ``GRPOConfig``): a dataclass whose every field carries its help
in ``metadata``. docs/watch.md gives the margins measured on the tests' runs. Torch-free, like the catalogue.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from trl_clinic.watch.findings import stop_keys


@dataclass
class WatchConfig:
    stop_on: str | Iterable[str] | None = field(
        default=None,
        metadata={
            "help": "A finding's key, a list of keys, or 'any': the run stops (control.should_training_stop) at the "
            "end of the optimizer step where that finding is made, and that step logs its findings."
        },
    )
    window: int = field(
        default=10,
        metadata={
            "help": "Optimizer steps over which GRPO's rates are averaged, a trainable tensor must go without a "
            "gradient, and a step loss is compared with."
        },
    )
    report: str | Path | None = field(
        default=None,
        metadata={"help": "A path for a self-contained HTML page written at the end of training (main process)."},
    )
    show: bool = field(
        default=True, metadata={"help": "Print each finding's line and the summary (on the main process only)."}
    )
    alerts: bool = field(
        default=True,
        metadata={
            "help": "Raise each finding as an alert of the run's trackio and W&B reporters (report_to), besides the "
            "clinic/ keys in the logs: trackio's Run.alert and wandb.alert, on the main process."
        },
    )
    rate: float = field(
        default=0.9,
        metadata={
            "help": "equal_rewards and clipped: the share of all-equal GRPO groups (frac_reward_zero_std) or of cut "
            "completions (completions/clipped_ratio) over the window that is a finding. The reports show 1.0 "
            "(TRL #3857) and 0.97-0.99 (TRL #5697); at 0.9 nine groups in ten teach nothing."
        },
    )
    spike: float = field(
        default=3.0,
        metadata={
            "help": "loss_spike: a step loss this many times the median of the previous window's steps. The step loss "
            "is the run's, as Trainer logs it: in several processes the mean of each one's raw step loss."
        },
    )
    slope: float = field(
        default=0.5,
        metadata={
            "help": "accumulation: the slope of log micro-batch loss against log label count below which the loss is "
            "a mean per micro-batch. It is 1 when each micro-batch's loss is normalised over the window's tokens, "
            "0 when it is a mean over its own; 0.5 is halfway."
        },
    )
    slope_points: int = field(
        default=8, metadata={"help": "accumulation: the micro-batches it needs before it decides."}
    )
    slope_spread: float = field(
        default=2.0,
        metadata={
            "help": "accumulation: the spread of those micro-batches' log label counts (sum of squared deviations "
            "from their mean) it needs before it decides."
        },
    )
    few_labels: float = field(
        default=0.25,
        metadata={
            "help": "loss_spike: a spiking step with fewer label tokens than this share of the window's median is "
            "put down to the samples, otherwise to the update."
        },
    )
    flat: float = field(
        default=1e-6,
        metadata={
            "help": "dpo_flat: a logged DPO step is flat when |rewards/margins| and |loss - ln 2| are both below this. "
            "Pairs cut identical log exactly 0 and 0.6931472; a tiny healthy run moved its margins by at least 3e-3 "
            "from its second step."
        },
    )
    packed_forwards: int = field(
        default=2,
        metadata={
            "help": "packing: how many training forwards with packed rows are read (a collator builds every batch "
            "the same way)."
        },
    )

    def __post_init__(self) -> None:
        if self.window < 1:
            raise ValueError(f"window must be at least 1 step, got {self.window}")
        if self.stop_on is not None and not isinstance(self.stop_on, str):
            self.stop_on = list(self.stop_on)
        stop_keys(self.stop_on)  # an unknown finding is an error here, not a silent no-op
