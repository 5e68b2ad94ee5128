"""The architecture figure of chapter 10 is drawn by code: check what it shows."""

import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from attention_course.diagram import draw_transformer


def test_draw_transformer_labels_every_block():
    fig = draw_transformer()
    try:
        assert isinstance(fig, Figure)
        texts = [t.get_text() for t in fig.axes[0].texts]
        # encoder: 2 Add & Norm, decoder: 3
        assert texts.count("Add & Norm") == 5
        assert texts.count("Feed-forward") == 2
        for label in (
            "Multi-head self-attention",
            "Masked multi-head self-attention",
            "Multi-head cross-attention",
            "Softmax",
            "Q from the decoder",
        ):
            assert label in texts, label
        assert any("K, V from" in t and "encoder" in t for t in texts)
        assert sum("positional" in t for t in texts) == 2
        assert sum(t.startswith("N×") for t in texts) == 2
        assert any(t.startswith("Linear") for t in texts)
        assert any("Input embedding" in t for t in texts)
        assert any("Output embedding" in t for t in texts)
    finally:
        plt.close(fig)


def test_plot_attention_shared_colour_scale():
    import torch

    from attention_course.plot import plot_attention, plot_attention_heads

    weights = torch.softmax(torch.randn(3, 4, 5, generator=torch.Generator().manual_seed(0)), -1)
    ax = plot_attention(weights[0], vmax=1.0)
    assert ax.images[0].get_clim() == (0.0, 1.0)
    assert len(ax.figure.axes) == 2  # the heatmap and its colour bar
    plt.close(ax.figure)
    ax = plot_attention(weights[0])  # default: the matrix's own maximum
    assert ax.images[0].get_clim()[1] == float(weights[0].max())
    plt.close(ax.figure)
    fig = plot_attention_heads(weights, ncols=3, vmax=1.0, colorbar=True)
    assert all(a.images[0].get_clim() == (0.0, 1.0) for a in fig.axes[:3] if a.images)
    assert len(fig.axes) == 6  # three heads, three colour bars
    plt.close(fig)


def test_memory_line_runs_clearly_between_the_two_frames():
    """The orange memory line (encoder output -> cross-attention) must not sit on a
    frame's edge: its vertical part lies in the gap between the stacks, with room on
    both sides."""
    from matplotlib.patches import FancyBboxPatch

    fig = draw_transformer()
    try:
        ax = fig.axes[0]
        (memory,) = [line for line in ax.lines if line.get_color() != "black"]
        xs = memory.get_xdata()
        assert xs[1] == xs[2], "the line turns down at one x"
        frames = sorted(
            (p.get_x(), p.get_x() + p.get_width())
            for p in ax.patches
            if isinstance(p, FancyBboxPatch) and p.get_zorder() == 1
        )
        assert len(frames) == 2, frames
        (_, enc_right), (dec_left, _) = frames
        assert enc_right + 0.3 < xs[1] < dec_left - 0.3, (enc_right, xs[1], dec_left)
    finally:
        plt.close(fig)
