"""The encoder-decoder Transformer drawn as a block diagram (chapter 10).

The figure follows the layout of Figure 1 of Vaswani et al. (2017): the encoder on
the left, the decoder on the right, data flowing upwards. It is drawn with plain
matplotlib boxes and arrows, so the book needs no image file.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from matplotlib.patches import Circle, FancyBboxPatch

# One colour per kind of sub-layer, the same in both stacks.
_COLOURS = {
    "attention": "#fbd7a3",
    "norm": "#f4f1b5",
    "ffn": "#bfe0f5",
    "embedding": "#f6c4c6",
    "linear": "#d9cff7",
    "softmax": "#c8ecc6",
    "stack": "#f2f2f2",
}
_BOX_W = 3.4  # width of a sub-layer box
_BOX_H = 0.62  # height of a sub-layer box
_FRAME_MARGIN = 0.6  # a stack frame reaches this far beyond the boxes on each side
_MEMORY_GAP = 0.45  # the memory line passes this far left of the decoder frame


def _box(ax, x: float, y: float, text: str, kind: str, width: float = _BOX_W) -> None:
    """A rounded box centred at (x, y)."""
    ax.add_patch(
        FancyBboxPatch(
            (x - width / 2, y - _BOX_H / 2),
            width,
            _BOX_H,
            boxstyle="round,pad=0.02,rounding_size=0.12",
            facecolor=_COLOURS[kind],
            edgecolor="black",
            linewidth=1.0,
            zorder=3,
        )
    )
    ax.text(x, y, text, ha="center", va="center", fontsize=9.5, zorder=4)


def _arrow(ax, start, end, **kwargs) -> None:
    """A straight arrow from ``start`` to ``end`` (points in data coordinates)."""
    ax.annotate(
        "",
        xy=end,
        xytext=start,
        arrowprops={"arrowstyle": "-|>", "lw": 1.2, "color": "black", "shrinkA": 0, "shrinkB": 0}
        | kwargs,
        zorder=2,
    )


def _residual(ax, x: float, y_from: float, y_to: float, side: float) -> None:
    """The residual connection: from below a sub-layer, around it, into its Add & Norm."""
    edge = x + side * (_BOX_W / 2 + 0.28)
    ax.plot([x, edge, edge], [y_from, y_from, y_to], color="black", lw=1.0, zorder=2)
    _arrow(ax, (edge, y_to), (x + side * _BOX_W / 2, y_to))


def _sub_layers(ax, x: float, y0: float, names: list[tuple[str, str]], side: float) -> list[float]:
    """Sub-layer boxes, each followed by Add & Norm, stacked upwards from y0.

    Returns the centre heights of the boxes, sub-layers and norms alternating.
    """
    ys, y = [], y0
    for name, kind in names:
        ys += [y, y + 0.9]
        _box(ax, x, y, name, kind)
        _box(ax, x, y + 0.9, "Add & Norm", "norm")
        _arrow(ax, (x, y + _BOX_H / 2), (x, y + 0.9 - _BOX_H / 2))
        _residual(ax, x, y - 0.5, y + 0.9, side)
        y += 1.95
    return ys


def _stack_frame(ax, x: float, y_bottom: float, y_top: float, side: float, name: str) -> None:
    """The grey frame around one layer, with "N× <name> layers" beside it."""
    width = _BOX_W + 2 * _FRAME_MARGIN
    ax.add_patch(
        FancyBboxPatch(
            (x - width / 2, y_bottom),
            width,
            y_top - y_bottom,
            boxstyle="round,pad=0.02,rounding_size=0.25",
            facecolor=_COLOURS["stack"],
            edgecolor="0.35",
            linewidth=1.2,
            zorder=1,
        )
    )
    ax.text(
        x + side * (width / 2 + 0.2),
        (y_bottom + y_top) / 2,
        f"N×\n{name}\nlayers",
        ha="left" if side > 0 else "right",
        va="center",
        fontsize=11,
        fontweight="bold",
        linespacing=1.4,
    )


def _embedding(ax, x: float, y: float, text: str, tokens: str, side: float) -> float:
    """Tokens -> embedding (times sqrt(d_model)) -> + positional encoding.

    Returns the height of the sum, where the stack's input starts.
    """
    ax.text(x, y - 1.05, tokens, ha="center", va="center", fontsize=9.5, style="italic")
    _arrow(ax, (x, y - 0.85), (x, y - _BOX_H / 2))
    _box(ax, x, y, text, "embedding")
    plus_y = y + 1.0
    _arrow(ax, (x, y + _BOX_H / 2), (x, plus_y - 0.2))
    ax.add_patch(Circle((x, plus_y), 0.2, facecolor="white", edgecolor="black", zorder=3))
    ax.text(x, plus_y, "+", ha="center", va="center", fontsize=13, zorder=4)
    label_x = x + side * 1.05
    ax.text(
        label_x + side * 0.05,
        plus_y,
        "positional\nencoding",
        ha="left" if side > 0 else "right",
        va="center",
        fontsize=9,
    )
    _arrow(ax, (label_x, plus_y), (x + side * 0.2, plus_y))
    return plus_y


def draw_transformer() -> Figure:
    """Draw the encoder-decoder Transformer of Vaswani et al. (2017), Figure 1 style.

    Encoder (left): ``N`` layers of multi-head self-attention and a feed-forward
    network, each followed by a residual connection and LayerNorm ("Add & Norm",
    post-norm). Decoder (right): masked self-attention, cross-attention with
    **queries from the decoder** and **keys and values from the encoder output**
    (the memory ``M``), and a feed-forward network, each with Add & Norm; then the
    final linear layer and the softmax over the target vocabulary. Both stacks
    start from token embeddings scaled by ``sqrt(d_model)`` plus the positional
    encoding. Returns the matplotlib ``Figure`` (nothing is saved or shown).
    """
    fig, ax = plt.subplots(figsize=(10, 10.5))
    ax.set_xlim(-1.2, 13.0)
    ax.set_axis_off()
    enc_x, dec_x = 2.8, 8.8

    # Inputs: embeddings and positional encodings.
    enc_in = _embedding(
        ax, enc_x, 0.9, r"Input embedding $\times\sqrt{d_\mathrm{model}}$", "source tokens", side=-1
    )
    dec_in = _embedding(
        ax,
        dec_x,
        0.9,
        r"Output embedding $\times\sqrt{d_\mathrm{model}}$",
        "target tokens, shifted right",
        side=1,
    )

    # Encoder layer: self-attention, FFN.
    enc_bottom, first = enc_in + 0.55, enc_in + 1.35
    enc = _sub_layers(
        ax,
        enc_x,
        first,
        [("Multi-head self-attention", "attention"), ("Feed-forward", "ffn")],
        side=-1,
    )
    enc_top = enc[-1] + 0.6
    _stack_frame(ax, enc_x, enc_bottom, enc_top, side=-1, name="encoder")
    _arrow(ax, (enc_x, enc_in + 0.2), (enc_x, first - _BOX_H / 2))
    _arrow(ax, (enc_x, enc[1] + _BOX_H / 2), (enc_x, enc[2] - _BOX_H / 2))

    # Decoder layer: masked self-attention, cross-attention, FFN.
    dec_bottom, first_d = dec_in + 0.55, dec_in + 1.35
    dec = _sub_layers(
        ax,
        dec_x,
        first_d,
        [
            ("Masked multi-head self-attention", "attention"),
            ("Multi-head cross-attention", "attention"),
            ("Feed-forward", "ffn"),
        ],
        side=1,
    )
    dec_top = dec[-1] + 0.6
    _stack_frame(ax, dec_x, dec_bottom, dec_top, side=1, name="decoder")
    _arrow(ax, (dec_x, dec_in + 0.2), (dec_x, first_d - _BOX_H / 2))
    _arrow(ax, (dec_x, dec[1] + _BOX_H / 2), (dec_x, dec[2] - _BOX_H / 2))
    _arrow(ax, (dec_x, dec[3] + _BOX_H / 2), (dec_x, dec[4] - _BOX_H / 2))

    # Cross-attention: Q from the decoder (below), K and V from the encoder's output.
    cross_y = dec[2]
    ax.text(
        dec_x - 0.12,
        cross_y - 0.52,
        "Q from the decoder",
        ha="right",
        va="center",
        fontsize=9,
        color="#b34700",
        fontweight="bold",
        zorder=5,
    )
    memory_y = enc_top + 0.75
    left_edge = dec_x - _BOX_W / 2
    # The vertical part of the memory line runs in the gap between the two frames,
    # clearly outside the decoder's frame (whose left edge is _FRAME_MARGIN left of the boxes).
    line_x = dec_x - (_BOX_W / 2 + _FRAME_MARGIN) - _MEMORY_GAP
    _arrow(ax, (enc_x, enc[-1] + _BOX_H / 2), (enc_x, memory_y))
    ax.plot(
        [enc_x, line_x, line_x],
        [memory_y, memory_y, cross_y],
        color="#b34700",
        lw=1.6,
        zorder=2,
    )
    _arrow(ax, (line_x, cross_y), (left_edge, cross_y), color="#b34700", lw=1.6)
    ax.text(
        enc_x,
        memory_y + 0.15,
        "encoder output: memory M\n(after the last of the N layers)",
        ha="center",
        va="bottom",
        fontsize=9,
    )
    ax.text(
        line_x - 0.12,
        (memory_y + cross_y) / 2,
        "K, V from the encoder",
        rotation=90,
        ha="right",
        va="center",
        fontsize=9,
        color="#b34700",
        fontweight="bold",
    )

    # Output layer: linear, softmax, probabilities.
    lin_y = dec_top + 0.75
    soft_y = lin_y + 0.95
    _arrow(ax, (dec_x, dec[-1] + _BOX_H / 2), (dec_x, lin_y - _BOX_H / 2))
    _box(ax, dec_x, lin_y, r"Linear  $D \to V$", "linear")
    _arrow(ax, (dec_x, lin_y + _BOX_H / 2), (dec_x, soft_y - _BOX_H / 2))
    _box(ax, dec_x, soft_y, "Softmax", "softmax")
    _arrow(ax, (dec_x, soft_y + _BOX_H / 2), (dec_x, soft_y + 0.75))
    ax.text(
        dec_x,
        soft_y + 0.8,
        "next-token probabilities",
        ha="center",
        va="bottom",
        fontsize=9.5,
        style="italic",
    )

    ax.set_ylim(-0.5, soft_y + 1.3)
    ax.set_title("The encoder-decoder Transformer (Vaswani et al., 2017)", fontsize=12)
    fig.tight_layout()
    return fig
