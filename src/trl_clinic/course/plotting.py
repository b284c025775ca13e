"""One look for every lesson's figures, so a workshop can put them side by side.

Bad runs are always red, fixed runs green, references grey; axes carry units; the title states the
finding, not the variable names.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib.pyplot as plt

BAD, FIXED, REFERENCE, OTHER = "#d62728", "#2ca02c", "#7f7f7f", "#1f77b4"
STYLE = {"bad": BAD, "fixed": FIXED, "reference": REFERENCE, "other": OTHER}


MAX_PER_ROW = 2  # readable at laptop width (three or four panels in a row were not): more wrap onto further rows


def figure(panels: int = 1, title: str = "", width: float = 5.0, height: float = 3.6):
    """``panels`` axes with the clinic's style, at most two a row; returns (fig, list of axes).

    A title states the finding, not the variable names."""
    if panels < 1:
        raise ValueError(f"a figure needs at least one panel, got {panels}")
    cols = min(panels, MAX_PER_ROW)
    rows = -(-panels // cols)
    fig, grid = plt.subplots(rows, cols, figsize=(width * cols, height * rows), squeeze=False)
    if title:
        fig.suptitle(title, fontsize=12, fontweight="bold")
    axes = list(grid.flat)
    for ax in axes[panels:]:
        ax.set_visible(False)
    for ax in axes[:panels]:
        ax.grid(alpha=0.3)
        ax.spines[["top", "right"]].set_visible(False)
    return fig, axes[:panels]


def line(ax, x: Sequence[float], y: Sequence[float], kind: str, label: str, **kwargs) -> None:
    """Plot one run; ``kind`` is "bad", "fixed", "reference" or "other" and picks the colour."""
    if kind not in STYLE:
        raise ValueError(f"unknown kind {kind!r}: choose one of {', '.join(STYLE)}")
    style = {"marker": "o", "markersize": 3, "linestyle": "--" if kind == "reference" else "-"}
    ax.plot(x, y, color=STYLE[kind], label=label, **{**style, **kwargs})


def bars(
    ax,
    labels: Sequence[str],
    values: Sequence[float],
    kinds: Sequence[str],
    fmt: str = "{:.3g}",
    texts: Sequence[str] | None = None,
) -> None:
    """Bar chart with each bar coloured by its kind and labelled with its value (or ``texts``, e.g. the true
    value of a bar drawn at a log axis' floor)."""
    drawn = ax.bar(list(labels), list(values), color=[STYLE[k] for k in kinds])
    ax.bar_label(drawn, labels=list(texts) if texts is not None else [fmt.format(v) for v in values], fontsize=8)


def label(ax, xlabel: str, ylabel: str, title: str = "", log_y: bool = False) -> None:
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title, fontsize=10)
    if log_y:
        ax.set_yscale("log")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)


def save(fig, output_dir: str | Path, name: str) -> Path:
    """Save as PNG under ``output_dir`` and return the path; the figure still shows in the notebook."""
    path = Path(output_dir) / f"{name}.png"
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return path
