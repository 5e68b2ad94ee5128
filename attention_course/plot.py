"""Figures the chapters share: attention heatmaps and positional encodings."""

from __future__ import annotations

from collections.abc import Sequence

import matplotlib.pyplot as plt
import torch


def _to_numpy(x):
    if isinstance(x, torch.Tensor):
        return x.detach().float().cpu().numpy()
    return x


def plot_attention(
    weights,
    x_labels: Sequence[str] | None = None,
    y_labels: Sequence[str] | None = None,
    ax=None,
    title: str | None = None,
    xlabel: str = "keys",
    ylabel: str = "queries",
    cmap: str = "viridis",
    colorbar: bool = True,
    annotate: bool = False,
    vmax: float | None = None,
):
    """Heatmap of a ``(T, S)`` weight matrix: queries on rows, keys on columns.

    Returns the matplotlib ``Axes``. ``annotate=True`` writes each weight in its cell.
    The colour scale runs from 0 to ``vmax`` (default: this matrix's largest weight);
    pass the same ``vmax`` to several heatmaps, e.g. 1.0, to make their colours comparable.
    """
    w = _to_numpy(weights)
    if w.ndim != 2:
        raise ValueError(f"weights: got shape {w.shape}, expected a 2-D (T, S) matrix")
    if ax is None:
        _, ax = plt.subplots(figsize=(1 + 0.45 * w.shape[1], 1 + 0.45 * w.shape[0]))
    top = float(w.max()) if vmax is None else vmax
    image = ax.imshow(w, cmap=cmap, vmin=0.0, vmax=max(1e-12, top), aspect="auto")
    if x_labels is not None:
        ax.set_xticks(range(len(x_labels)), labels=list(x_labels), rotation=90)
    if y_labels is not None:
        ax.set_yticks(range(len(y_labels)), labels=list(y_labels))
    if annotate:
        for i in range(w.shape[0]):
            for j in range(w.shape[1]):
                color = "white" if w[i, j] < 0.6 * top else "black"
                ax.text(j, i, f"{w[i, j]:.2f}", ha="center", va="center", color=color, fontsize=8)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title)
    if colorbar:
        ax.figure.colorbar(image, ax=ax, fraction=0.046, pad=0.04)
    return ax


def plot_attention_heads(
    weights,
    x_labels: Sequence[str] | None = None,
    y_labels: Sequence[str] | None = None,
    ncols: int = 4,
    title: str | None = None,
    vmax: float | None = None,
    colorbar: bool = False,
):
    """Grid of per-head heatmaps from ``(H, T, S)`` weights. Returns the figure.

    ``vmax`` and ``colorbar`` are passed to :func:`plot_attention` for every head: with
    the same ``vmax`` (e.g. 1.0) all heads share one colour scale.
    """
    w = _to_numpy(weights)
    if w.ndim != 3:
        raise ValueError(f"weights: got shape {w.shape}, expected (H, T, S)")
    H = w.shape[0]
    ncols = min(ncols, H)
    nrows = (H + ncols - 1) // ncols
    width = 3.8 if colorbar else 3.2  # room for each head's colour bar
    fig, axes = plt.subplots(nrows, ncols, figsize=(width * ncols, 3.0 * nrows), squeeze=False)
    for h, ax in enumerate(axes.flat):
        if h >= H:
            ax.axis("off")
            continue
        plot_attention(
            w[h], x_labels, y_labels, ax=ax, title=f"head {h}", colorbar=colorbar, vmax=vmax
        )
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig


def plot_positional_encoding(pe, ax=None, title: str = "Sinusoidal positional encoding"):
    """Heatmap of a ``(max_len, d_model)`` positional-encoding table. Returns the Axes."""
    pe = _to_numpy(pe)
    if ax is None:
        _, ax = plt.subplots(figsize=(7, 4))
    image = ax.imshow(pe, cmap="RdBu", vmin=-1, vmax=1, aspect="auto")
    ax.set_xlabel("feature (even: sin, odd: cos)")
    ax.set_ylabel("position p")
    ax.set_title(title)
    ax.figure.colorbar(image, ax=ax)
    return ax
