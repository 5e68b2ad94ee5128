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


def repeat_kv_detached_when_one(x, n_rep):
    """n_rep = 1 returns a detached copy (to avoid aliasing): no gradient reaches w_k, w_v
    in a model with num_kv_heads == num_heads (student 15's wrong verdict)."""
    if n_rep == 1:
        return x.detach().clone()
    return torch.repeat_interleave(x, n_rep, dim=1)


def repeat_kv_one_short(x, n_rep):
    """`repeat_interleave(x, n_rep - 1)`: one copy too few (at Hkv = 2, n_rep = 3 it looks
    like the swapped numbers; only Hkv = 3, n_rep = 2 tells them apart)."""
    return torch.repeat_interleave(x, n_rep - 1, dim=1)


def repeat_kv_swapped(x, n_rep):
    """Each head repeated Hkv times instead of n_rep times."""
    return torch.repeat_interleave(x, x.shape[1], dim=1)


def repeat_kv_positions_reshaped(x, n_rep):
    """Copies along the positions (an expand after the position axis), reshaped to heads."""
    B, Hkv, S, Dh = x.shape
    return x[:, :, :, None].expand(B, Hkv, S, n_rep, Dh).reshape(B, Hkv * n_rep, S, Dh)


def repeat_kv_features_reshaped(x, n_rep):
    """Copies along the features, reshaped to heads."""
    B, Hkv, S, Dh = x.shape
    return torch.repeat_interleave(x, n_rep, dim=-1).reshape(B, Hkv * n_rep, S, Dh)


def repeat_kv_first_batch(x, n_rep):
    """Batch element 0 expanded over the batch."""
    B, Hkv, S, Dh = x.shape
    return torch.repeat_interleave(x[:1], n_rep, dim=1).expand(B, Hkv * n_rep, S, Dh)


def repeat_kv_averaged(x, n_rep):
    """The copies divided by n_rep."""
    return torch.repeat_interleave(x, n_rep, dim=1) / n_rep


def repeat_kv_divides_by_hkv(x, n_rep):
    """Output head h takes input head h // Hkv (an IndexError when n_rep > Hkv)."""
    Hkv = x.shape[1]
    return x[:, torch.arange(Hkv * n_rep) // Hkv]


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


def sliding_window_shifted(size, window, device=None):
    """`0 < i - j <= window`: the diagonal out, one key too far back in."""
    d = _band(size, device)
    return (d > 0) & (d <= window)


def sliding_window_modulo(size, window, device=None):
    """Compares rolling-cache slots (positions mod window) instead of positions."""
    i = torch.arange(size, device=device).reshape(size, 1)
    j = torch.arange(size, device=device).reshape(1, size)
    return (i >= j) & (i % window >= j % window)


def sliding_window_additive(size, window, device=None):
    """The right pattern as an additive float mask, 0 / -inf."""
    d = _band(size, device)
    return torch.zeros(size, size, device=device).masked_fill(
        ~((d >= 0) & (d < window)), -torch.inf
    )


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
    ("repeat_kv", "detached when n_rep = 1", repeat_kv_detached_when_one, "does not require grad"),
    ("repeat_kv", "n_rep - 1 copies", repeat_kv_one_short, "one copy too few"),
    ("repeat_kv", "Hkv copies", repeat_kv_swapped, "two numbers swapped"),
    (
        "repeat_kv",
        "expand after the positions, reshaped",
        repeat_kv_positions_reshaped,
        "reshaped into heads, so each output head holds a mix of positions",
    ),
    (
        "repeat_kv",
        "features repeated, reshaped",
        repeat_kv_features_reshaped,
        "each feature is repeated",
    ),
    ("repeat_kv", "batch element 0 only", repeat_kv_first_batch, "batch element 0 is right"),
    ("repeat_kv", "copies averaged", repeat_kv_averaged, "do not average"),
    ("repeat_kv", "h // Hkv", repeat_kv_divides_by_hkv, "h // Hkv"),
    ("sliding_window_mask", "window + 1 visible", sliding_window_too_wide, "one too wide"),
    ("sliding_window_mask", "window - 1 visible", sliding_window_too_narrow, "one too narrow"),
    ("sliding_window_mask", "symmetric band", sliding_window_not_causal, "not causal"),
    ("sliding_window_mask", "window ignored", sliding_window_ignores_window, "window is ignored"),
    ("sliding_window_mask", "inverted", sliding_window_inverted, "inverted"),
    ("sliding_window_mask", "no ValueError", sliding_window_no_check, "raise ValueError"),
    ("sliding_window_mask", "float mask", sliding_window_float, "expected dtype torch.bool"),
    ("sliding_window_mask", "band shifted one back", sliding_window_shifted, "shifted one step"),
    ("sliding_window_mask", "slots, not positions", sliding_window_modulo, "no modulo"),
    ("sliding_window_mask", "additive 0 / -inf", sliding_window_additive, "additive float mask"),
]


# ---------------------------------------------------------------- issue 24, round 3 (verdicts)
# Kept apart from CATALOGUE above; tests/test_verdicts_round3.py runs ROUND3.


def window_mask_too_narrow(size, window, device=None):
    """`i - j < window - 1`: each token sees only window - 1 tokens (at size 1, window 1
    it sees nothing, which an inverted mask would give too)."""
    i = torch.arange(size, device=device)[:, None]
    j = torch.arange(size, device=device)[None, :]
    return (i - j >= 0) & (i - j < window - 1)


ROUND3 = [
    ("sliding_window_mask", "one too narrow", window_mask_too_narrow, "one too narrow"),
]


# Round 5 (a fresh student, set 15): tests/test_verdicts_round5.py runs it.


def repeat_kv_scales_input_in_place(x, n_rep):
    """`x.mul_(1.0)` on the input: on a leaf that requires grad PyTorch raises."""
    x.mul_(1.0)
    return torch.repeat_interleave(x, n_rep, dim=1)


def sliding_window_capped(size, window, device=None):
    """`min(window, size - 1)`: right for window < size, one too narrow from size on."""
    if window < 1:
        raise ValueError(f"window: got {window}, expected >= 1")
    d = _band(size, device)
    return (d >= 0) & (d < min(window, size - 1) if size > 1 else d < window)
