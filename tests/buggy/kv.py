"""Buggy grouped key/value heads and sliding-window masks (chapter 15)."""

import torch


def repeat_kv_tiled(x, n_rep):
    """`x.repeat`: output head h gets key/value head h % Hkv (tiled, not interleaved)."""
    return x.repeat(1, n_rep, 1, 1)


def repeat_kv_expand_wrong_order(x, n_rep):
    """Expands to (B, n_rep, Hkv, S, Dh) before the reshape: the same tiling as `x.repeat`."""
    B, Hkv, S, Dh = x.shape
    return x[:, None].expand(B, n_rep, Hkv, S, Dh).reshape(B, n_rep * Hkv, S, Dh)


def repeat_kv_positions(x, n_rep):
    """repeat_interleave along dim=2, the positions, instead of the heads."""
    return torch.repeat_interleave(x, n_rep, dim=2)


def repeat_kv_features(x, n_rep):
    """repeat_interleave along the last axis, the features of each head."""
    return torch.repeat_interleave(x, n_rep, dim=-1)


def repeat_kv_batch(x, n_rep):
    """repeat along dim=0, the batch."""
    return x.repeat(n_rep, 1, 1, 1)


def repeat_kv_float32(x, n_rep):
    """Right copies, but cast to float32 "for speed"."""
    return torch.repeat_interleave(x.float(), n_rep, dim=1)


def repeat_kv_detached(x, n_rep):
    """Right values, built from `x.detach()`: no gradient reaches the key/value heads."""
    return torch.repeat_interleave(x.detach(), n_rep, dim=1)


def _band(size, device=None):
    i = torch.arange(size, device=device).reshape(size, 1)
    j = torch.arange(size, device=device).reshape(1, size)
    return i - j


def sliding_window_too_wide(size, window, device=None):
    """`i - j <= window`: window + 1 tokens visible (off by one)."""
    d = _band(size, device)
    return (d >= 0) & (d <= window)


def sliding_window_too_narrow(size, window, device=None):
    """`i - j < window - 1`: window - 1 tokens visible (off by one)."""
    d = _band(size, device)
    return (d >= 0) & (d < window - 1)


def sliding_window_not_causal(size, window, device=None):
    """A symmetric band `|i - j| < window`: the window also looks ahead."""
    return _band(size, device).abs() < window


def sliding_window_ignores_window(size, window, device=None):
    """Just the causal mask."""
    return torch.ones(size, size, dtype=torch.bool, device=device).tril()


def sliding_window_inverted(size, window, device=None):
    """True marks the positions to hide."""
    d = _band(size, device)
    return ~((d >= 0) & (d < window))


def sliding_window_no_check(size, window, device=None):
    """Right mask, but window = 0 gives an all-False mask instead of a ValueError."""
    d = _band(size, device)
    return (d >= 0) & (d < window)


def sliding_window_float(size, window, device=None):
    """Right pattern as float 0/1 instead of bool."""
    ones = torch.ones(size, size, device=device)
    return ones.tril().triu(diagonal=-(window - 1))


CATALOGUE = [
    ("repeat_kv", "x.repeat (tiled)", repeat_kv_tiled, "tiled, not interleaved"),
    (
        "repeat_kv",
        "expand in the wrong order",
        repeat_kv_expand_wrong_order,
        "tiled, not interleaved",
    ),
    ("repeat_kv", "repeat along the positions", repeat_kv_positions, "along the positions"),
    ("repeat_kv", "repeat along the features", repeat_kv_features, "along the features"),
    ("repeat_kv", "repeat along the batch", repeat_kv_batch, "along the batch"),
    ("repeat_kv", "casts to float32", repeat_kv_float32, "expected dtype torch.float64"),
    ("repeat_kv", "detached", repeat_kv_detached, "gradient"),
    ("sliding_window_mask", "window + 1 visible", sliding_window_too_wide, "one too wide"),
    ("sliding_window_mask", "window - 1 visible", sliding_window_too_narrow, "one too narrow"),
    ("sliding_window_mask", "symmetric band", sliding_window_not_causal, "not causal"),
    ("sliding_window_mask", "window ignored", sliding_window_ignores_window, "window is ignored"),
    ("sliding_window_mask", "inverted", sliding_window_inverted, "inverted"),
    ("sliding_window_mask", "no ValueError", sliding_window_no_check, "raise ValueError"),
    ("sliding_window_mask", "float mask", sliding_window_float, "expected dtype torch.bool"),
]
