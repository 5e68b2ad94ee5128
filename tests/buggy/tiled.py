"""Buggy online-softmax steps and tiled attention loops (chapter 12), each as a student
writes it."""

import math

import torch


def _block(m, scores):
    return torch.maximum(m, scores.amax(dim=-1, keepdim=True))


def update_new_max_only(m, l, acc, scores, values):  # noqa: E741
    """Measures the new terms against the new maximum but never rescales the old sums by
    e^{m - m'} (neither l nor acc)."""
    m_new = _block(m, scores)
    p = torch.exp(scores - m_new)
    return m_new, l + p.sum(-1, keepdim=True), acc + p @ values


def update_sum_not_rescaled(m, l, acc, scores, values):  # noqa: E741
    """Rescales acc by e^{m - m'} but adds the new terms to the old l as it is."""
    m_new = _block(m, scores)
    shift = torch.where(torch.isneginf(m_new), 0.0, m_new)
    p, c = torch.exp(scores - shift), torch.exp(m - shift)
    return m_new, l + p.sum(-1, keepdim=True), c * acc + p @ values


def update_acc_not_rescaled(m, l, acc, scores, values):  # noqa: E741
    """Rescales l but not acc (chapter 12's warning box)."""
    m_new = _block(m, scores)
    shift = torch.where(torch.isneginf(m_new), 0.0, m_new)
    p, c = torch.exp(scores - shift), torch.exp(m - shift)
    return m_new, c * l + p.sum(-1, keepdim=True), acc + p @ values


def update_divides_early(m, l, acc, scores, values):  # noqa: E741
    """Returns acc already divided by l' (the output so far), not the unnormalised sum."""
    m_new = _block(m, scores)
    shift = torch.where(torch.isneginf(m_new), 0.0, m_new)
    p, c = torch.exp(scores - shift), torch.exp(m - shift)
    l_new = c * l + p.sum(-1, keepdim=True)
    return m_new, l_new, (c * acc + p @ values) / l_new


def update_nan_on_masked_block(m, l, acc, scores, values):  # noqa: E741
    """The textbook recurrence without a guard: a row that has seen only -inf scores gets
    e^{-inf - (-inf)} = NaN."""
    m_new = _block(m, scores)
    p, c = torch.exp(scores - m_new), torch.exp(m - m_new)
    return m_new, c * l + p.sum(-1, keepdim=True), c * acc + p @ values


def update_block_max_only(m, l, acc, scores, values):  # noqa: E741
    """Takes the block's maximum as the new maximum, forgetting the running one."""
    m_new = scores.amax(dim=-1, keepdim=True)
    shift = torch.where(torch.isneginf(m_new), 0.0, m_new)
    p, c = torch.exp(scores - shift), torch.exp(m - shift)
    return m_new, c * l + p.sum(-1, keepdim=True), c * acc + p @ values


def update_inverted_factor(m, l, acc, scores, values):  # noqa: E741
    """Rescales by e^{m' - m} instead of e^{m - m'}."""
    m_new = _block(m, scores)
    shift = torch.where(torch.isneginf(m_new), 0.0, m_new)
    p = torch.exp(scores - shift)
    c = torch.where(torch.isneginf(m), 0.0, torch.exp(shift - m))
    return m_new, c * l + p.sum(-1, keepdim=True), c * acc + p @ values


def update_raw_exp(m, l, acc, scores, values):  # noqa: E741
    """Adds e^{s} of the raw scores, no maximum subtracted: overflows near s = 1000."""
    p = torch.exp(scores)
    return _block(m, scores), l + p.sum(-1, keepdim=True), acc + p @ values


def update_old_max_exponent(m, l, acc, scores, values):  # noqa: E741
    """Takes the exponents from the OLD maximum and rescales after: e^{s - m} e^{m - m'},
    which is e^{s} on the first block (m = -inf read as 0) and overflows near s = 1000."""
    m_new = _block(m, scores)

    def z(x):
        return torch.where(torch.isinf(x), torch.zeros_like(x), x)

    p = torch.exp(scores - z(m)) * torch.exp(z(m) - z(m_new))
    c = torch.exp(m - z(m_new))
    return m_new, c * l + p.sum(-1, keepdim=True), c * acc + p @ values


def update_masked_max_zero(m, l, acc, scores, values):  # noqa: E741
    """Right sums, but a fully masked row's maximum becomes 0 instead of staying -inf."""
    m_new, l_new, acc_new = _good_update(m, l, acc, scores, values)
    return torch.where(torch.isneginf(m_new), 0.0, m_new), l_new, acc_new


def update_masked_as_lowest(m, l, acc, scores, values):  # noqa: E741
    """Clamps the scores to the dtype's most negative number "to avoid -inf": a fully
    masked block then counts every masked key, e^{min - min} = 1."""
    return _good_update(m, l, acc, scores.clamp_min(torch.finfo(scores.dtype).min), values)


# ---------------------------------------------------------------- tiled loops


def _good_update(m, l, acc, s, v):  # noqa: E741
    m_new = _block(m, s)
    shift = torch.where(torch.isneginf(m_new), 0.0, m_new)
    p, c = torch.exp(s - shift), torch.exp(m - shift)
    return m_new, c * l + p.sum(-1, keepdim=True), c * acc + p @ v


def _tiles(
    query,
    key,
    value,
    block_q,
    block_k,
    causal,
    *,
    update=_good_update,
    start=-math.inf,
    divide=True,
):
    T, S = query.shape[-2], key.shape[-2]
    out = []
    for q0 in range(0, T, block_q):
        q = query[..., q0 : q0 + block_q, :] / math.sqrt(query.shape[-1])
        Tb = q.shape[-2]
        m = torch.full((*q.shape[:-1], 1), start, dtype=q.dtype)
        l = torch.zeros_like(m)  # noqa: E741
        acc = torch.zeros((*q.shape[:-1], value.shape[-1]), dtype=q.dtype)
        for k0 in range(0, S, block_k):
            s = q @ key[..., k0 : k0 + block_k, :].transpose(-2, -1)
            if causal:
                i = torch.arange(q0, q0 + Tb)[:, None]
                j = torch.arange(k0, k0 + s.shape[-1])[None, :]
                s = s.masked_fill(j > i, -math.inf)
            m, l, acc = update(m, l, acc, s, value[..., k0 : k0 + block_k, :])  # noqa: E741
        out.append(acc / l if divide else acc)
    return torch.cat(out, dim=-2)


def loop_new_max_only(query, key, value, block_q, block_k, causal=False):
    """Tiles with an update that never rescales the old sums by e^{m - m'}."""
    return _tiles(query, key, value, block_q, block_k, causal, update=update_new_max_only)


def loop_sum_not_rescaled(query, key, value, block_q, block_k, causal=False):
    """Tiles with an update that rescales acc but not l."""
    return _tiles(query, key, value, block_q, block_k, causal, update=update_sum_not_rescaled)


def loop_divides_inside(query, key, value, block_q, block_k, causal=False):
    """Divides acc by l after every block (inside the loop), then again at the end."""

    def update(m, l, acc, s, v):  # noqa: E741
        m, l, acc = _good_update(m, l, acc, s, v)  # noqa: E741
        return m, l, acc / l

    return _tiles(query, key, value, block_q, block_k, causal, update=update)


def loop_starts_at_zero(query, key, value, block_q, block_k, causal=False):
    """The running maximum starts at 0, not -inf: very negative rows underflow to 0 / 0."""
    return _tiles(query, key, value, block_q, block_k, causal, start=0.0)


def loop_full_scores(query, key, value, block_q, block_k, causal=False):
    """Right values, but computes the whole T x S score matrix first and slices it into
    tiles (the memory tiling exists to save)."""
    scores = query @ key.transpose(-2, -1) / math.sqrt(query.shape[-1])  # (..., T, S)
    T, S = scores.shape[-2:]
    if causal:
        scores = scores.masked_fill(
            torch.ones(T, S, dtype=torch.bool).tril().logical_not(), -math.inf
        )
    out = []
    for q0 in range(0, T, block_q):
        s_rows = scores[..., q0 : q0 + block_q, :]
        m = torch.full((*s_rows.shape[:-1], 1), -math.inf, dtype=query.dtype)
        l = torch.zeros_like(m)  # noqa: E741
        acc = torch.zeros((*s_rows.shape[:-1], value.shape[-1]), dtype=query.dtype)
        for k0 in range(0, S, block_k):
            m, l, acc = _good_update(  # noqa: E741
                m, l, acc, s_rows[..., k0 : k0 + block_k], value[..., k0 : k0 + block_k, :]
            )
        out.append(acc / l)
    return torch.cat(out, dim=-2)


def loop_full_causal_mask(query, key, value, block_q, block_k, causal=False):
    """Tiles the scores but builds the whole T x S causal mask up front."""
    T, S = query.shape[-2], key.shape[-2]
    keep = torch.ones(T, S, dtype=torch.bool).tril() if causal else None
    scale = 1 / math.sqrt(query.shape[-1])
    out = []
    for q0 in range(0, T, block_q):
        q = query[..., q0 : q0 + block_q, :] * scale
        m = torch.full((*q.shape[:-1], 1), -math.inf, dtype=q.dtype)
        l = torch.zeros_like(m)  # noqa: E741
        acc = torch.zeros((*q.shape[:-1], value.shape[-1]), dtype=q.dtype)
        for k0 in range(0, S, block_k):
            s = q @ key[..., k0 : k0 + block_k, :].transpose(-2, -1)
            if keep is not None:
                s = s.masked_fill(~keep[q0 : q0 + block_q, k0 : k0 + block_k], -math.inf)
            m, l, acc = _good_update(m, l, acc, s, value[..., k0 : k0 + block_k, :])  # noqa: E741
        out.append(acc / l)
    return torch.cat(out, dim=-2)


def loop_query_blocks_only(query, key, value, block_q, block_k, causal=False):
    """One loop, over query blocks: each block's full row of scores (block_q x S) and an
    ordinary softmax; no key tiles, no online softmax."""
    T, S = query.shape[-2], key.shape[-2]
    out = []
    for q0 in range(0, T, block_q):
        q = query[..., q0 : q0 + block_q, :]
        s = q @ key.transpose(-2, -1) / math.sqrt(query.shape[-1])  # (..., block_q, S)
        if causal:
            i = torch.arange(q0, q0 + q.shape[-2])[:, None]
            s = s.masked_fill(torch.arange(S)[None, :] > i, -math.inf)
        out.append(torch.softmax(s, dim=-1) @ value)
    return torch.cat(out, dim=-2)


def loop_key_blocks_only(query, key, value, block_q, block_k, causal=False):
    """One loop, over key blocks, with all T queries at once: a T x block_k column."""
    return _tiles(query, key, value, query.shape[-2], block_k, causal)


def loop_numpy_mask(query, key, value, block_q, block_k, causal=False):
    """Tiles the scores but builds the whole T x S causal mask once, in numpy."""
    import numpy as np

    T, S = query.shape[-2], key.shape[-2]
    full = np.tril(np.ones((T, S), dtype=bool))
    scale = 1 / math.sqrt(query.shape[-1])
    out = []
    for q0 in range(0, T, block_q):
        q = query[..., q0 : q0 + block_q, :] * scale
        m = torch.full((*q.shape[:-1], 1), -math.inf, dtype=q.dtype)
        l = torch.zeros_like(m)  # noqa: E741
        acc = torch.zeros((*q.shape[:-1], value.shape[-1]), dtype=q.dtype)
        for k0 in range(0, S, block_k):
            s = q @ key[..., k0 : k0 + block_k, :].transpose(-2, -1)
            if causal:
                keep = torch.from_numpy(full[q0 : q0 + block_q, k0 : k0 + block_k].copy())
                s = s.masked_fill(~keep, -math.inf)
            m, l, acc = _good_update(m, l, acc, s, value[..., k0 : k0 + block_k, :])  # noqa: E741
        out.append(acc / l)
    return torch.cat(out, dim=-2)


def loop_square_causal_mask(query, key, value, block_q, block_k, causal=False):
    """Builds causal_mask(T), T x T, once and pads its tiles with False where k >= T:
    smaller than T x S when S > T, still the whole quadratic mask at once."""
    from attention_course.masking import causal_mask

    T, S = query.shape[-2], key.shape[-2]
    full = causal_mask(T) if causal else None
    scale = 1 / math.sqrt(query.shape[-1])
    out = []
    for q0 in range(0, T, block_q):
        q = query[..., q0 : q0 + block_q, :] * scale
        m = torch.full((*q.shape[:-1], 1), -math.inf, dtype=q.dtype)
        l = torch.zeros_like(m)  # noqa: E741
        acc = torch.zeros((*q.shape[:-1], value.shape[-1]), dtype=q.dtype)
        for k0 in range(0, S, block_k):
            s = q @ key[..., k0 : k0 + block_k, :].transpose(-2, -1)
            if full is not None:
                tile = full[q0 : q0 + block_q, k0 : k0 + s.shape[-1]]
                keep = torch.zeros(s.shape[-2:], dtype=torch.bool)
                keep[:, : tile.shape[-1]] = tile
                s = s.masked_fill(~keep, -math.inf)
            m, l, acc = _good_update(m, l, acc, s, value[..., k0 : k0 + block_k, :])  # noqa: E741
        out.append(acc / l)
    return torch.cat(out, dim=-2)


def loop_float64_state(query, key, value, block_q, block_k, causal=False):
    """Creates the running state in float64 whatever the input's dtype: a float32 input
    meets a float64 state."""
    T, S = query.shape[-2], key.shape[-2]
    out = []
    for q0 in range(0, T, block_q):
        q = query[..., q0 : q0 + block_q, :] / math.sqrt(query.shape[-1])
        m = torch.full((*q.shape[:-1], 1), -math.inf, dtype=torch.float64)
        l = torch.zeros_like(m)  # noqa: E741
        acc = torch.zeros((*q.shape[:-1], value.shape[-1]), dtype=torch.float64)
        for k0 in range(0, S, block_k):
            s = q @ key[..., k0 : k0 + block_k, :].transpose(-2, -1)
            if causal:
                i = torch.arange(q0, q0 + q.shape[-2])[:, None]
                j = torch.arange(k0, k0 + s.shape[-1])[None, :]
                s = s.masked_fill(j > i, -math.inf)
            m, l, acc = _good_update(m, l, acc, s, value[..., k0 : k0 + block_k, :])  # noqa: E741
        out.append(acc / l)
    return torch.cat(out, dim=-2)


def loop_drops_last_query_block(query, key, value, block_q, block_k, causal=False):
    """`for q0 in range(0, T - block_q + 1, block_q)`: the last, shorter block of queries
    is never visited (the output has fewer rows)."""
    kept = query.shape[-2] // block_q * block_q
    return _tiles(query[..., :kept, :], key, value, block_q, block_k, causal)


def loop_scales_by_dv(query, key, value, block_q, block_k, causal=False):
    """Scales the scores by 1/sqrt(Dv), the values' width, instead of 1/sqrt(Dk)."""
    fix = math.sqrt(query.shape[-1] / value.shape[-1])
    return _tiles(query * fix, key, value, block_q, block_k, causal)


def loop_returns_acc_divided_inside(query, key, value, block_q, block_k, causal=False):
    """Sets acc = acc / l after every update and returns acc (no division at the end)."""

    def update(m, l, acc, s, v):  # noqa: E741
        m, l, acc = _good_update(m, l, acc, s, v)  # noqa: E741
        return m, l, acc / l

    out = _tiles(query, key, value, block_q, block_k, causal, update=update, divide=False)
    return out


def loop_drops_last_key_block(query, key, value, block_q, block_k, causal=False):
    """`for k0 in range(0, S - block_k + 1, block_k)`: the last, shorter block of keys is
    never visited when block_k does not divide S."""
    S = key.shape[-2]
    kept = S // block_k * block_k
    return _tiles(query, key[..., :kept, :], value[..., :kept, :], block_q, block_k, causal)


def loop_ignores_causal(query, key, value, block_q, block_k, causal=False):
    """Accepts `causal` and never uses it."""
    return _tiles(query, key, value, block_q, block_k, False)


def loop_calls_the_builtin(query, key, value, block_q, block_k, causal=False):
    """Hands the whole job to `F.scaled_dot_product_attention` (no tiles of its own)."""
    import torch.nn.functional as F

    return F.scaled_dot_product_attention(query, key, value, is_causal=causal)


CATALOGUE = [
    (
        "online_softmax_update",
        "new max only",
        update_new_max_only,
        "not rescaled when the maximum grows",
    ),
    (
        "online_softmax_update",
        "sum not rescaled",
        update_sum_not_rescaled,
        "running sum l is not rescaled",
    ),
    (
        "online_softmax_update",
        "acc not rescaled",
        update_acc_not_rescaled,
        "accumulator acc is not rescaled",
    ),
    ("online_softmax_update", "divides early", update_divides_early, "divided by l too early"),
    (
        "online_softmax_update",
        "NaN on a masked block",
        update_nan_on_masked_block,
        "fully masked block gives NaN",
    ),
    ("online_softmax_update", "block max only", update_block_max_only, "the block's maximum only"),
    ("online_softmax_update", "inverted factor", update_inverted_factor, "factor is inverted"),
    ("online_softmax_update", "raw exp", update_raw_exp, "of the raw scores overflows"),
    (
        "online_softmax_update",
        "masked scores clamped to the lowest number",
        update_masked_as_lowest,
        "counts its masked keys",
    ),
    (
        "online_softmax_update",
        "exponents from the old maximum",
        update_old_max_exponent,
        "measured from the old maximum",
    ),
    (
        "tiled_attention_loop",
        "new max only",
        loop_new_max_only,
        "not rescaled when the maximum grows",
    ),
    (
        "tiled_attention_loop",
        "sum not rescaled",
        loop_sum_not_rescaled,
        "running sum l is not rescaled",
    ),
    (
        "tiled_attention_loop",
        "divides inside the loop",
        loop_divides_inside,
        "divided by l too early",
    ),
    ("tiled_attention_loop", "max starts at 0", loop_starts_at_zero, "starts at 0 instead of -inf"),
    ("tiled_attention_loop", "whole T x S scores", loop_full_scores, "at least T·S = 61 × 67"),
    (
        "tiled_attention_loop",
        "whole T x S causal mask",
        loop_full_causal_mask,
        "at least T·S = 61 × 67",
    ),
    (
        "tiled_attention_loop",
        "last key block dropped",
        loop_drops_last_key_block,
        "last, shorter block of keys",
    ),
    ("tiled_attention_loop", "causal ignored", loop_ignores_causal, "causal=True is ignored"),
    ("tiled_attention_loop", "query blocks only", loop_query_blocks_only, "a whole row of scores"),
    ("tiled_attention_loop", "key blocks only", loop_key_blocks_only, "a whole column of scores"),
    ("tiled_attention_loop", "numpy mask", loop_numpy_mask, "do not use numpy"),
    (
        "tiled_attention_loop",
        "last query block dropped",
        loop_drops_last_query_block,
        "last, shorter block of queries",
    ),
    ("tiled_attention_loop", "scaled by sqrt(Dv)", loop_scales_by_dv, "1/sqrt(Dv)"),
    (
        "tiled_attention_loop",
        "acc divided inside, returned",
        loop_returns_acc_divided_inside,
        "divided by l too early",
    ),
    (
        "tiled_attention_loop",
        "causal_mask(T) at once",
        loop_square_causal_mask,
        "a causal_mask(T), say",
    ),
    (
        "tiled_attention_loop",
        "calls F.scaled_dot_product_attention",
        loop_calls_the_builtin,
        "do not call `F.scaled_dot_product_attention`",
    ),
]


# Round 5 (a fresh student, set 12): tests/test_verdicts_round5.py runs it.


def update_l_without_keepdim(m, l, acc, scores, values):  # noqa: E741
    """Right values, but l' squeezed to (T,): the checker's last (chained) case crashed."""
    m2 = torch.maximum(m, scores.amax(-1, keepdim=True))
    r = torch.where(torch.isneginf(m2), torch.zeros_like(m2), m2)
    c, p = torch.exp(m - r), torch.exp(scores - r)
    return m2, (c * l + p.sum(-1, keepdim=True)).squeeze(-1), c * acc + p @ values


def update_block_own_max(m, l, acc, scores, values):  # noqa: E741
    """The new block's exponents e^{s - max(block)}, the old sums rescaled to m'."""
    bm = scores.amax(-1, keepdim=True)
    m2 = torch.maximum(m, bm)
    safe = torch.where(torch.isinf(m2), torch.zeros_like(m2), m2)
    sb = torch.where(torch.isinf(bm), torch.zeros_like(bm), bm)
    c, p = torch.exp(m - safe), torch.exp(scores - sb)
    return m2, c * l + p.sum(-1, keepdim=True), c * acc + p @ values


def update_max_over_block(m, l, acc, scores, values):  # noqa: E741
    """One maximum over the whole block (`amax(-2).amax(-1)`), not one per query row."""
    m2 = torch.maximum(m, scores.amax(-2, keepdim=True).amax(-1, keepdim=True))
    safe = torch.where(torch.isinf(m2), torch.zeros_like(m2), m2)
    c, p = torch.exp(m - safe), torch.exp(scores - safe)
    return m2, c * l + p.sum(-1, keepdim=True), c * acc + p @ values


def update_global_max(m, l, acc, scores, values):  # noqa: E741
    """One maximum per call, `scores.max()`."""
    m2 = torch.maximum(m, scores.max())
    safe = torch.where(torch.isneginf(m2), torch.zeros_like(m2), m2)
    c, p = torch.exp(m - safe), torch.exp(scores - safe)
    return m2, c * l + p.sum(-1, keepdim=True), c * acc + p @ values
