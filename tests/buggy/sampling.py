"""Buggy top-k / top-p filters (filter_logits, chapter 13)."""

import torch


def _top_k(logits, top_k):
    k = min(top_k, logits.size(-1))
    kth = torch.topk(logits, k).values[..., -1:]
    return logits.masked_fill(logits < kth, float("-inf"))


def _top_p(logits, top_p):
    probs = logits.softmax(-1)
    sorted_probs, order = probs.sort(dim=-1, descending=True)
    before = sorted_probs.cumsum(-1) - sorted_probs
    remove_sorted = before >= top_p
    remove = remove_sorted.scatter(-1, order, remove_sorted)
    return logits.masked_fill(remove, float("-inf"))


def _check(top_k, top_p):
    if top_k is not None and top_k < 1:
        raise ValueError(f"top_k: got {top_k}")
    if top_p is not None and not 0 < top_p <= 1:
        raise ValueError(f"top_p: got {top_p}")


def _top_p_with(logits, top_p, probs, keep_at_equality=False):
    sorted_probs, order = probs.sort(dim=-1, descending=True)
    before = sorted_probs.cumsum(-1) - sorted_probs
    remove_sorted = before > top_p if keep_at_equality else before >= top_p
    remove = remove_sorted.scatter(-1, order, remove_sorted)
    return logits.masked_fill(remove, float("-inf"))


def filter_logits_softmax_over_batch(logits, top_k=None, top_p=None):
    """Takes top-p's softmax over dim 0 (the batch), not over the vocabulary."""
    _check(top_k, top_p)
    if top_k is not None:
        logits = _top_k(logits, top_k)
    if top_p is not None:
        logits = _top_p_with(logits, top_p, logits.softmax(0))
    return logits


def filter_logits_top_p_at_equality(logits, top_k=None, top_p=None):
    """Keeps a token while the probability before it is <= top_p (not < top_p)."""
    _check(top_k, top_p)
    if top_k is not None:
        logits = _top_k(logits, top_k)
    if top_p is not None:
        logits = _top_p_with(logits, top_p, logits.softmax(-1), keep_at_equality=True)
    return logits


def filter_logits_keeps_k_plus_one(logits, top_k=None, top_p=None):
    """Takes the threshold at sorted index k instead of k - 1: keeps k + 1 tokens."""
    _check(top_k, top_p)
    if top_k is not None and top_k < logits.size(-1):
        kth = logits.sort(dim=-1, descending=True).values[..., top_k : top_k + 1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None:
        logits = _top_p(logits, top_p)
    return logits


def filter_logits_drops_crossing_token(logits, top_k=None, top_p=None):
    """Removes every token where the cumulative sum exceeds top_p, without the shift:
    the token that crosses top_p is dropped too (the most probable one is kept)."""
    _check(top_k, top_p)
    if top_k is not None:
        logits = _top_k(logits, top_k)
    if top_p is not None:
        sorted_probs, order = logits.softmax(-1).sort(dim=-1, descending=True)
        remove_sorted = sorted_probs.cumsum(-1) > top_p
        remove_sorted[..., 0] = False
        remove = remove_sorted.scatter(-1, order, remove_sorted)
        logits = logits.masked_fill(remove, float("-inf"))
    return logits


def filter_logits_fills_zero(logits, top_k=None, top_p=None):
    """Sets the dropped logits to 0: they keep probability exp(0) / sum."""
    _check(top_k, top_p)
    kept = logits
    if top_k is not None:
        kept = _top_k(kept, top_k)
    if top_p is not None:
        kept = _top_p(kept, top_p)
    return torch.where(torch.isfinite(kept), logits, torch.zeros_like(logits))


def filter_logits_top_p_wins(logits, top_k=None, top_p=None):
    """`if top_p ... elif top_k`: top_k is ignored whenever top_p is given."""
    _check(top_k, top_p)
    if top_p is not None:
        return _top_p(logits, top_p)
    if top_k is not None:
        return _top_k(logits, top_k)
    return logits.clone()


def filter_logits_ascending(logits, top_k=None, top_p=None):
    """Sorts in ascending order: keeps the smallest logits and probabilities."""
    _check(top_k, top_p)
    if top_k is not None:
        k = min(top_k, logits.size(-1))
        kth = logits.sort(dim=-1).values[..., k - 1 : k]
        logits = logits.masked_fill(logits > kth, float("-inf"))
    if top_p is not None:
        sorted_probs, order = logits.softmax(-1).sort(dim=-1)
        remove_sorted = sorted_probs.cumsum(-1) - sorted_probs >= top_p
        remove = remove_sorted.scatter(-1, order, remove_sorted)
        logits = logits.masked_fill(remove, float("-inf"))
    return logits


def filter_logits_top_p_first(logits, top_k=None, top_p=None):
    """Applies top_p before top_k, to probabilities not renormalised over the k kept."""
    _check(top_k, top_p)
    if top_p is not None:
        logits = _top_p(logits, top_p)
    if top_k is not None:
        logits = _top_k(logits, top_k)
    return logits


def filter_logits_scatter_k_indices(logits, top_k=None, top_p=None):
    """Keeps exactly the k indices torch.topk returns: tokens tied at the k-th value go."""
    _check(top_k, top_p)
    if top_k is not None:
        k = min(top_k, logits.size(-1))
        keep = torch.zeros_like(logits, dtype=torch.bool)
        keep = keep.scatter(-1, torch.topk(logits, k).indices, True)
        logits = logits.masked_fill(~keep, float("-inf"))
    if top_p is not None:
        logits = _top_p(logits, top_p)
    return logits


def filter_logits_no_clamp(logits, top_k=None, top_p=None):
    """Calls torch.topk(logits, top_k) without clamping: crashes when top_k > V."""
    _check(top_k, top_p)
    if top_k is not None:
        kth = torch.topk(logits, top_k).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None:
        logits = _top_p(logits, top_p)
    return logits


def filter_logits_in_place(logits, top_k=None, top_p=None):
    """Writes -inf into the caller's tensor (`logits[mask] = -inf`)."""
    _check(top_k, top_p)
    if top_k is not None:
        mask = _top_k(logits, top_k).isinf() & ~logits.isinf()
        logits[mask] = float("-inf")
    if top_p is not None:
        mask = _top_p(logits, top_p).isinf() & ~logits.isinf()
        logits[mask] = float("-inf")
    return logits


def filter_logits_no_validation(logits, top_k=None, top_p=None):
    """Never checks its arguments: top_k=0 or top_p=1.5 pass silently."""
    if top_k is not None and top_k >= 1:
        logits = _top_k(logits, top_k)
    if top_p is not None and top_p > 0:
        logits = _top_p(logits, top_p)
    return logits


def filter_logits_float32(logits, top_k=None, top_p=None):
    """Casts to float32 "for speed": float64 logits come back as float32."""
    _check(top_k, top_p)
    logits = logits.float()
    if top_k is not None:
        logits = _top_k(logits, top_k)
    if top_p is not None:
        logits = _top_p(logits, top_p)
    return logits


def filter_logits_ties_strict(logits, top_k=None, top_p=None):
    """Keeps the logits strictly above the (k + 1)-th largest: ties at the k-th dropped."""
    _check(top_k, top_p)
    out = logits.clone()
    if top_k is not None and top_k < out.size(-1):
        following = torch.topk(out, top_k + 1).values[..., -1:]
        out = out.masked_fill(out <= following, float("-inf"))
    return _top_p(out, top_p) if top_p is not None else out


def filter_logits_dim_one(logits, top_k=None, top_p=None):
    """Written for (B, V) logits: dim=1 everywhere, the wrong axis on (B, T, V)."""
    _check(top_k, top_p)
    out = logits.clone()
    if top_k is not None:
        kth = torch.topk(out, min(top_k, out.size(1)), dim=1).values[:, -1:]
        out = out.masked_fill(out < kth, float("-inf"))
    if top_p is not None:
        sorted_probs, order = out.softmax(1).sort(dim=1, descending=True)
        remove_sorted = (sorted_probs.cumsum(1) - sorted_probs) >= top_p
        out = out.masked_fill(remove_sorted.scatter(1, order, remove_sorted), float("-inf"))
    return out


def filter_logits_kth_smallest(logits, top_k=None, top_p=None):
    """Takes the threshold from an ascending sort: keeps every logit >= the k-th smallest."""
    _check(top_k, top_p)
    out = logits.clone()
    if top_k is not None and top_k < out.size(-1):
        kth = out.sort(dim=-1).values[..., top_k - 1 : top_k]
        out = out.masked_fill(out < kth, float("-inf"))
    return _top_p(out, top_p) if top_p is not None else out


def filter_logits_fills_minus_1e9(logits, top_k=None, top_p=None):
    """Fills the dropped logits with -1e9 instead of -inf."""
    out = filter_logits_kth_largest_reference(logits, top_k, top_p)
    return out.masked_fill(out == float("-inf"), -1e9)


def filter_logits_kth_largest_reference(logits, top_k=None, top_p=None):
    """A correct filter (used by the buggy ones above)."""
    _check(top_k, top_p)
    out = _top_k(logits, top_k) if top_k is not None else logits.clone()
    return _top_p(out, top_p) if top_p is not None else out


CATALOGUE = [
    ("filter_logits", "keeps k + 1", filter_logits_keeps_k_plus_one, "keeps k + 1"),
    (
        "filter_logits",
        "top-p softmax over the batch",
        filter_logits_softmax_over_batch,
        "your softmax for top-p runs over the wrong axis",
    ),
    (
        "filter_logits",
        "top-p keeps at equality",
        filter_logits_top_p_at_equality,
        "equals top_p exactly (`<=`)",
    ),
    ("filter_logits", "fills -1e9", filter_logits_fills_minus_1e9, "you filled them with -1e+09"),
    ("filter_logits", "ties dropped by >", filter_logits_ties_strict, "the k-th largest, not >"),
    ("filter_logits", "dim=1 on (B, T, V)", filter_logits_dim_one, "works along the wrong axis"),
    (
        "filter_logits",
        "threshold from an ascending sort",
        filter_logits_kth_smallest,
        "still hold their original logits: your filter keeps too many tokens",
    ),
    (
        "filter_logits",
        "drops the crossing token",
        filter_logits_drops_crossing_token,
        "drops the token that crosses top_p",
    ),
    ("filter_logits", "fills 0", filter_logits_fills_zero, "0 instead of -inf"),
    (
        "filter_logits",
        "ignores top_k with top_p",
        filter_logits_top_p_wins,
        "ignores top_k when top_p is given",
    ),
    ("filter_logits", "sorts ascending", filter_logits_ascending, "keeps the smallest"),
    (
        "filter_logits",
        "top_p before top_k",
        filter_logits_top_p_first,
        "top_p is applied to the probabilities before top_k",
    ),
    (
        "filter_logits",
        "ties dropped",
        filter_logits_scatter_k_indices,
        "ties at the k-th value are dropped",
    ),
    ("filter_logits", "top_k not clamped", filter_logits_no_clamp, "clamp it"),
    ("filter_logits", "in place", filter_logits_in_place, "in place"),
    ("filter_logits", "no validation", filter_logits_no_validation, "returned without raising"),
    ("filter_logits", "float32", filter_logits_float32, "expected dtype torch.float64"),
]


# Round 5 (a fresh student, set 13): tests/test_verdicts_round5.py runs it.


def filter_logits_top_p_on_logits(logits, top_k=None, top_p=None):
    """top-p run on the raw logits (no softmax), sorted in descending order as it should."""
    _check(top_k, top_p)
    if top_k is not None:
        logits = _top_k(logits, top_k)
    if top_p is not None:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        keep_sorted = (sorted_logits.cumsum(-1) - sorted_logits) < top_p
        keep = torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)
        logits = logits.masked_fill(~keep, float("-inf"))
    return logits
