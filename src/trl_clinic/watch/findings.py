"""What the watch can find: each finding's key, the lesson that explains it, and one finding as it is reported.

Torch-free, so ``trl-clinic watch --help`` can list the findings without importing torch.
"""

from __future__ import annotations

import textwrap
from dataclasses import asdict, dataclass, field

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

# key -> (lesson, what it sees); the order is the order of the docs and of --help
CATALOGUE = {
    "nonfinite": (
        "03",
        "a NaN or inf in the raw loss, the gradients or the weights after an optimizer step: "
        "which tensors, their dtype, the optimizer, at the step where it starts (before "
        "logging_nan_inf_filter hides it in the logged loss)",
    ),
    "no_labels": ("02", "a micro-batch with no label token: its loss is 0/0 (NaN) or 0 and it teaches nothing"),
    "zero_loss": (
        "02",
        "a logged loss of exactly 0.0, with the cause the watch saw (no label tokens, a NaN hidden by "
        "the NaN filter, GRPO groups with equal rewards)",
    ),
    "equal_rewards": (
        "05",
        "GRPO groups whose completions all got the same reward (TRL's frac_reward_zero_std) over "
        "a window of steps: their advantages are 0, they teach nothing",
    ),
    "clipped": (
        "05",
        "GRPO completions cut at max_completion_length (TRL's completions/clipped_ratio) over a window of steps",
    ),
    "no_gradient": (
        "03",
        "trainable tensors that never get a gradient, or no trainable tensor at all (a frozen "
        "adapter: the optimizer updates nothing, grad_norm 0)",
    ),
    "packing": (
        "01",
        "packed or padding-free rows whose sequences see each other, read from the mask the first "
        "attention layer really receives",
    ),
    "right_padding": (
        "04",
        "generation (a forward that reads a KV cache) from right-padded rows: the first new token "
        "is predicted at a pad slot",
    ),
    "accumulation": (
        "02",
        "micro-batch losses that do not grow with their label count under gradient accumulation: "
        "each micro-batch is a mean over its own tokens, so tokens of short micro-batches weigh "
        "more",
    ),
    "loss_spike": (
        "02",
        "a step loss far above the run's own recent window, with the step's label count and its "
        "gradient norm beside it (the samples or the update)",
    ),
}


def lesson_name(key: str) -> str:
    """``"03"`` -> ``"lesson 03 (LoRA reward model NaN)"``."""
    return f"lesson {key} ({LESSONS[key]})"


@dataclass
class Finding:
    """One finding, reported once: what the watch saw, the likely cause, the fix in one line, the lesson."""

    key: str  # one of CATALOGUE
    step: int  # the optimizer step where it was seen (0: before the first step)
    seen: str  # what was measured, with its numbers
    cause: str  # the likely cause
    fix: str  # the fix, in one line
    lesson: str  # a key of LESSONS
    how: str = "measured"  # how it was decided: "measured" (on this run's tensors or logs) or "read" (config, source)
    numbers: dict[str, float] = field(default_factory=dict)  # logged as clinic/<key>/<name>

    def __post_init__(self) -> None:
        if self.key not in CATALOGUE:
            raise ValueError(f"unknown finding {self.key!r}: expected one of {', '.join(CATALOGUE)}")

    def line(self) -> str:
        """The finding as printed when it is made: what was seen, the likely cause, the fix, the lesson and how it
        was decided, each folded to ``WIDTH`` columns."""
        return "\n".join(
            [
                wrapped(f"[trl-clinic watch] step {self.step}: {self.key}: {self.seen}"),
                wrapped(f"likely cause: {self.cause}", "  "),
                wrapped(f"fix: {self.fix}", "  "),
                f"  {lesson_name(self.lesson)} [{self.how}]",
            ]
        )

    def logs(self) -> dict[str, float]:
        """The numbers under ``clinic/`` that go into the trainer's logs: the step, then the finding's own."""
        return {
            f"clinic/{self.key}/step": float(self.step),
            **{f"clinic/{self.key}/{name}": float(value) for name, value in self.numbers.items()},
        }

    def to_dict(self) -> dict:
        return {**asdict(self), "lesson_name": lesson_name(self.lesson)}


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
