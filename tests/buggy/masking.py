"""Buggy causal and padding masks."""

import torch


def causal_mask_no_diagonal(size, device=None):
    """Excludes the diagonal: a token may not even look at itself (off by one)."""
    return torch.ones(size, size, dtype=torch.bool, device=device).tril(diagonal=-1)


def causal_mask_triu(size, device=None):
    """Uses triu: True on and above the diagonal, so every token sees the future."""
    return torch.ones(size, size, dtype=torch.bool, device=device).triu()


def causal_mask_inverted(size, device=None):
    """nn.Transformer's convention: True marks the positions to hide."""
    return torch.ones(size, size, dtype=torch.bool, device=device).triu(diagonal=1)


def causal_mask_float(size, device=None):
    """Right pattern, but float 0/1 instead of bool."""
    return torch.tril(torch.ones(size, size, device=device))


def causal_mask_all_true(size, device=None):
    """No masking at all: every position may see every other, the future included."""
    return torch.ones(size, size, dtype=torch.bool, device=device)


def padding_mask_inverted(lengths, max_len=None):
    """True at the padding (key_padding_mask's convention)."""
    max_len = int(lengths.max()) if max_len is None else max_len
    return torch.arange(max_len)[None, :] >= lengths[:, None]


def padding_mask_less_equal(lengths, max_len=None):
    """Compares with <=: position `length` is wrongly counted as a real token."""
    max_len = int(lengths.max()) if max_len is None else max_len
    return torch.arange(max_len)[None, :] <= lengths[:, None]


def padding_mask_ignores_max_len(lengths, max_len=None):
    """Always uses the longest length, ignoring `max_len`."""
    return torch.arange(int(lengths.max()))[None, :] < lengths[:, None]


def padding_mask_loop_floats(lengths, max_len=None):
    """A Python loop filling a float tensor of ones: right pattern, wrong dtype."""
    max_len = int(lengths.max()) if max_len is None else max_len
    mask = torch.zeros(len(lengths), max_len)
    for b, length in enumerate(lengths):
        mask[b, :length] = 1
    return mask


def causal_mask_ignores_device(size, device=None):
    """Builds the mask on the default device, whatever `device` says."""
    return torch.ones(size, size, dtype=torch.bool).tril()


def causal_mask_moves_to_cpu(size, device=None):
    """Builds on `device`, then moves it to the CPU "to be safe"."""
    return torch.ones(size, size, dtype=torch.bool, device=device).tril().cpu()


def padding_mask_tensor_only(lengths, max_len=None):
    """Uses tensor methods on `lengths` directly: crashes on a list of ints."""
    max_len = int(lengths.max()) if max_len is None else max_len
    return torch.arange(max_len, device=lengths.device)[None, :] < lengths[:, None]


def padding_mask_ignores_device(lengths, max_len=None):
    """Moves `lengths` to the CPU: the mask is not on the device of `lengths`."""
    lengths = torch.as_tensor(lengths)
    max_len = int(lengths.max()) if max_len is None else max_len
    return torch.arange(max_len)[None, :] < lengths.cpu()[:, None]


def padding_mask_batch_columns(lengths, max_len=None):
    """Takes the batch size len(lengths) as the default width instead of max(lengths)."""
    lengths = torch.as_tensor(lengths)
    max_len = len(lengths) if max_len is None else max_len
    return torch.arange(max_len, device=lengths.device)[None, :] < lengths[:, None]


def causal_mask_additive(size, device=None):
    """Returns the additive float form (0 allowed, -inf on the future), not a bool mask."""
    return torch.full((size, size), float("-inf"), device=device).triu(1)


CATALOGUE = [
    ("causal_mask", "diagonal excluded", causal_mask_no_diagonal, "diagonal is excluded"),
    ("causal_mask", "triu", causal_mask_triu, "use `torch.tril`, not `torch.triu`"),
    ("causal_mask", "inverted", causal_mask_inverted, "inverted"),
    ("causal_mask", "float mask", causal_mask_float, "expected torch.bool"),
    ("causal_mask", "ignores device", causal_mask_ignores_device, "`device` argument is ignored"),
    ("causal_mask", "moves to cpu", causal_mask_moves_to_cpu, "do not move it"),
    ("padding_mask", "inverted", padding_mask_inverted, "inverted"),
    ("padding_mask", "tensor only", padding_mask_tensor_only, "list of ints as well as a tensor"),
    ("padding_mask", "<= instead of <", padding_mask_less_equal, "<= instead of <"),
    ("padding_mask", "ignores max_len", padding_mask_ignores_max_len, "`max_len` is ignored"),
    ("padding_mask", "float mask", padding_mask_loop_floats, "expected torch.bool"),
    ("padding_mask", "ignores the device", padding_mask_ignores_device, "meta"),
    ("padding_mask", "len(lengths) columns", padding_mask_batch_columns, "batch size len(lengths)"),
    ("causal_mask", "additive float mask", causal_mask_additive, "additive float mask"),
    ("causal_mask", "all True", causal_mask_all_true, "the mask is all True"),
]


# ---------------------------------------------------------------- issue 24, round 3 (verdicts)
# Kept apart from CATALOGUE above; tests/test_verdicts_round3.py runs ROUND3.


def causal_mask_greater(size, device=None):
    """`i[None, :] > i[:, None]`: True strictly above the diagonal, the future (inverted)."""
    i = torch.arange(size, device=device)
    return i[None, :] > i[:, None]


def padding_mask_arange_on_cpu(lengths, max_len=None):
    """`torch.arange(max_len)` made on the CPU whatever the device of `lengths`."""
    lengths = torch.as_tensor(lengths)
    max_len = int(lengths.max()) if max_len is None else max_len
    return torch.arange(max_len)[None, :] < lengths[:, None]


ROUND3 = [
    ("causal_mask", "i[None, :] > i[:, None]", causal_mask_greater, "the mask is inverted"),
    (
        "padding_mask",
        "arange on the CPU",
        padding_mask_arange_on_cpu,
        "device=lengths.device",
    ),
]
