"""Buggy merges and simulated rings (exercise 23): ``merge_partials(state_a, state_b) ->
(m, l, acc)`` and ``simulated_ring_attention(query_shards, key_shards, value_shards,
causal=False) -> [W output shards]``."""

import math

import torch


def _zero_where_empty(m):
    return torch.where(torch.isneginf(m), torch.zeros_like(m), m)


def reference_merge(state_a, state_b):
    """Right: both sums rescaled to the larger maximum, -inf read as 0 for the exponents."""
    (m_a, l_a, acc_a), (m_b, l_b, acc_b) = state_a, state_b
    m = torch.maximum(m_a, m_b)
    c_a, c_b = torch.exp(m_a - _zero_where_empty(m)), torch.exp(m_b - _zero_where_empty(m))
    return m, c_a * l_a + c_b * l_b, c_a * acc_a + c_b * acc_b


def merge_lowest_for_empty(state_a, state_b):
    """Right: an empty row's maximum returned as the dtype's most negative number, not -inf
    (both say "nothing seen"); the sums are the same."""
    m, l, acc = reference_merge(state_a, state_b)  # noqa: E741
    return m.clamp_min(torch.finfo(m.dtype).min), l, acc


def merge_new_max_only(state_a, state_b):
    """The incoming block measured against the new maximum, the sums held added as they are
    (the chapter's first slip)."""
    (m_a, l_a, acc_a), (m_b, l_b, acc_b) = state_a, state_b
    m = torch.maximum(m_a, m_b)
    c_b = torch.exp(m_b - _zero_where_empty(m))
    return m, l_a + c_b * l_b, acc_a + c_b * acc_b


def merge_incoming_not_rescaled(state_a, state_b):
    """The held sums rescaled, the incoming block's added as they are."""
    (m_a, l_a, acc_a), (m_b, l_b, acc_b) = state_a, state_b
    m = torch.maximum(m_a, m_b)
    c_a = torch.exp(m_a - _zero_where_empty(m))
    return m, c_a * l_a + l_b, c_a * acc_a + acc_b


def merge_not_rescaled(state_a, state_b):
    """No rescaling at all: l_a + l_b, acc_a + acc_b (the chapter's second slip)."""
    (m_a, l_a, acc_a), (m_b, l_b, acc_b) = state_a, state_b
    return torch.maximum(m_a, m_b), l_a + l_b, acc_a + acc_b


def merge_l_not_rescaled(state_a, state_b):
    """acc rescaled, l added as it is."""
    m, _, acc = reference_merge(state_a, state_b)
    return m, state_a[1] + state_b[1], acc


def merge_divides(state_a, state_b):
    """Returns acc / l: the ring then divides a second time."""
    m, l, acc = reference_merge(state_a, state_b)  # noqa: E741
    return m, l, acc / l


def merge_lse_form(state_a, state_b):
    """The (output, log-sum-exp) form: m' = log(e^{m_a} l_a + e^{m_b} l_b), l' = 1,
    acc' = the normalised output. acc / l is right; the state is not the chapter's."""
    (m_a, l_a, acc_a), (m_b, l_b, acc_b) = state_a, state_b
    lse = torch.logaddexp(m_a + torch.log(l_a), m_b + torch.log(l_b))
    c_a = torch.exp(m_a - lse)
    c_b = torch.exp(m_b - lse)
    return lse, c_a * l_a + c_b * l_b, c_a * acc_a + c_b * acc_b


def merge_logsumexp_of_maxima(state_a, state_b):
    """m' = logsumexp(m_a, m_b), the sums measured against it (consistent, but not the
    maximum)."""
    (m_a, l_a, acc_a), (m_b, l_b, acc_b) = state_a, state_b
    m = torch.logaddexp(m_a, m_b)
    c_a, c_b = torch.exp(m_a - _zero_where_empty(m)), torch.exp(m_b - _zero_where_empty(m))
    return m, c_a * l_a + c_b * l_b, c_a * acc_a + c_b * acc_b


def merge_nan_on_empty(state_a, state_b):
    """No guard for -inf: a row empty in both gives e^{-inf - (-inf)} = NaN."""
    (m_a, l_a, acc_a), (m_b, l_b, acc_b) = state_a, state_b
    m = torch.maximum(m_a, m_b)
    c_a, c_b = torch.exp(m_a - m), torch.exp(m_b - m)
    return m, c_a * l_a + c_b * l_b, c_a * acc_a + c_b * acc_b


def merge_inverted(state_a, state_b):
    """e^{m - m_own} instead of e^{m_own - m}."""
    (m_a, l_a, acc_a), (m_b, l_b, acc_b) = state_a, state_b
    m = torch.maximum(m_a, m_b)
    ref = _zero_where_empty(m)
    c_a = torch.where(torch.isneginf(m_a), 0.0, torch.exp(ref - m_a))
    c_b = torch.where(torch.isneginf(m_b), 0.0, torch.exp(ref - m_b))
    return m, c_a * l_a + c_b * l_b, c_a * acc_a + c_b * acc_b


def merge_normalised_l_one(state_a, state_b):
    """Returns the normalised state: l = 1, acc the output acc / l."""
    m, l, acc = reference_merge(state_a, state_b)  # noqa: E741
    return m, torch.ones_like(l), acc / l


def _measured_from(m, ref, state_a, state_b):
    """m returned, the sums measured against ``ref`` (-inf read as 0)."""
    (m_a, l_a, acc_a), (m_b, l_b, acc_b) = state_a, state_b
    ref = _zero_where_empty(ref)
    c_a, c_b = torch.exp(m_a - ref), torch.exp(m_b - ref)
    return m, c_a * l_a + c_b * l_b, c_a * acc_a + c_b * acc_b


def merge_min_of_maxima(state_a, state_b):
    """m = the smaller maximum (the larger where one block is empty), the sums consistent
    with it."""
    (m_a, _, _), (m_b, _, _) = state_a, state_b
    smaller = torch.minimum(m_a, m_b)
    m = torch.where(torch.isneginf(smaller), torch.maximum(m_a, m_b), smaller)
    return _measured_from(m, m, state_a, state_b)


def merge_keeps_held_maximum(state_a, state_b):
    """m = m_a (m_b where A is empty), the sums consistent with it."""
    m = torch.where(torch.isneginf(state_a[0]), state_b[0], state_a[0])
    return _measured_from(m, m, state_a, state_b)


def merge_exponents_from_zero(state_a, state_b):
    """The -inf guard's 0 used for every row: factors e^{m_a}, e^{m_b}."""
    m = torch.maximum(state_a[0], state_b[0])
    return _measured_from(m, torch.zeros_like(m), state_a, state_b)


def merge_measured_from_held(state_a, state_b):
    """m = max(m_a, m_b), but l and acc measured against m_a (m_b where A is empty)."""
    m = torch.maximum(state_a[0], state_b[0])
    ref = torch.where(torch.isneginf(state_a[0]), state_b[0], state_a[0])
    return _measured_from(m, ref, state_a, state_b)


def merge_squeezed(state_a, state_b):
    """m and l returned without their last axis of size 1."""
    m, l, acc = reference_merge(state_a, state_b)  # noqa: E741
    return m.squeeze(-1), l.squeeze(-1), acc


# ---------------------------------------------------------------- rings


def _ring(query_shards, key_shards, value_shards, causal=False, merge=reference_merge, **bug):
    """A simulated ring written as a student would, with one ``bug`` switched on."""
    W = len(query_shards)
    outputs = []
    for r in range(W):
        scale = 1.0 if bug.get("unscaled") else 1.0 / math.sqrt(query_shards[r].shape[-1])
        if bug.get("scale_dv"):
            scale = 1.0 / math.sqrt(value_shards[r].shape[-1])
        q = query_shards[r] * scale
        n = q.shape[-2]
        state = None
        steps = list(range(W))
        if bug.get("steps") == "W - 1":
            steps = steps[:-1]
        elif bug.get("steps") == "skip own":
            steps = steps[1:]
        elif bug.get("steps") == "own twice":
            steps = [0, *steps]
        for t in steps:
            src = (r + t) % W if bug.get("reversed") else (r - t) % W
            got = (r - t) % W  # the block actually held
            if bug.get("mask_step"):  # the mask's offsets from the step, nothing skipped
                src = t
            later = src < r if bug.get("skip_earlier") else src > r
            if causal and later and not bug.get("no_skip") and not bug.get("mask_step"):
                continue
            s = q @ key_shards[got].transpose(-2, -1)
            if causal:
                i = torch.arange(n)[:, None] + (0 if bug.get("local") else r * n)
                j = torch.arange(n)[None, :] + (0 if bug.get("local") else src * n)
                hidden = j > i
                if (bug.get("no_skip") == "unmasked" or bug.get("skip_earlier")) and src > r:
                    hidden = torch.zeros_like(hidden)
                if src == r and bug.get("diagonal") == "none":
                    hidden = torch.zeros_like(hidden)
                elif src == r and bug.get("diagonal") == "hidden":
                    hidden = j >= i
                elif src == r and bug.get("diagonal") == "plus one":
                    hidden = torch.ones(n, n, dtype=torch.bool).tril(1).logical_not()
                s = s.masked_fill(hidden, -math.inf)
            m = s.amax(dim=-1, keepdim=True)
            p = torch.exp(s - _zero_where_empty(m))
            block = (m, p.sum(dim=-1, keepdim=True), p @ value_shards[got])
            if bug.get("normalise_blocks"):
                block = (block[0], block[1], block[2] / block[1])
            state = block if state is None else merge(state, block)
        outputs.append(state[2] / state[1])
    return outputs


def reference_ring(query_shards, key_shards, value_shards, causal=False):
    """Right: the statement's ring with the reference merge."""
    return _ring(query_shards, key_shards, value_shards, causal)


def ring_future_masked_not_skipped(query_shards, key_shards, value_shards, causal=False):
    """Right, and wasteful: later blocks are scored and fully masked instead of skipped;
    a merge that keeps empty rows empty makes them change nothing."""
    return _ring(query_shards, key_shards, value_shards, causal, no_skip=True)


def ring_vectorised_over_steps(query_shards, key_shards, value_shards, causal=False):
    """Right: each rank's blocks visited in the order of the ranks (0, 1, ...), not the
    ring's; the merge does not care about the order."""
    W = len(query_shards)
    outputs = []
    for r in range(W):
        q = query_shards[r] / math.sqrt(query_shards[r].shape[-1])
        n = q.shape[-2]
        state = None
        for src in range(W):
            if causal and src > r:
                break
            s = q @ key_shards[src].transpose(-2, -1)
            if causal and src == r:
                s = s.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), -math.inf)
            block = (
                s.amax(-1, keepdim=True),
                torch.exp(s - s.amax(-1, keepdim=True)).sum(-1, keepdim=True),
                torch.exp(s - s.amax(-1, keepdim=True)) @ value_shards[src],
            )
            state = block if state is None else reference_merge(state, block)
        outputs.append(state[2] / state[1])
    return outputs


def ring_new_max_only(query_shards, key_shards, value_shards, causal=False):
    """The ring with the merge that rescales the incoming block only."""
    return _ring(query_shards, key_shards, value_shards, causal, merge=merge_new_max_only)


def ring_merge_divides(query_shards, key_shards, value_shards, causal=False):
    """The merge divides acc by l, and the ring divides again at the end."""
    return _ring(query_shards, key_shards, value_shards, causal, merge=merge_divides)


def ring_reversed_sources(query_shards, key_shards, value_shards, causal=False):
    """The block held at step t labelled (r + t) mod W: the causal mask's offsets come from
    the wrong rank (the same ring at W = 2)."""
    return _ring(query_shards, key_shards, value_shards, causal, reversed=True)


def ring_local_mask(query_shards, key_shards, value_shards, causal=False):
    """Every scored block masked to a triangle by positions inside the block."""
    return _ring(query_shards, key_shards, value_shards, causal, local=True)


def ring_future_unmasked(query_shards, key_shards, value_shards, causal=False):
    """Later blocks are not skipped and not masked: the future is seen."""
    return _ring(query_shards, key_shards, value_shards, causal, no_skip="unmasked")


def ring_diagonal_unmasked(query_shards, key_shards, value_shards, causal=False):
    """The own block seen whole."""
    return _ring(query_shards, key_shards, value_shards, causal, diagonal="none")


def ring_diagonal_hidden(query_shards, key_shards, value_shards, causal=False):
    """The own block's mask hides the diagonal too."""
    return _ring(query_shards, key_shards, value_shards, causal, diagonal="hidden")


def ring_own_skipped(query_shards, key_shards, value_shards, causal=False):
    """Starts at step 1: the own block never scored."""
    return _ring(query_shards, key_shards, value_shards, causal, steps="skip own")


def ring_own_twice(query_shards, key_shards, value_shards, causal=False):
    """The own block merged at the start and again at step 0."""
    return _ring(query_shards, key_shards, value_shards, causal, steps="own twice")


def ring_w_minus_one_steps(query_shards, key_shards, value_shards, causal=False):
    """W - 1 steps (the number of passes), so the last block is never merged."""
    return _ring(query_shards, key_shards, value_shards, causal, steps="W - 1")


def ring_unscaled(query_shards, key_shards, value_shards, causal=False):
    """No 1/sqrt(Dk)."""
    return _ring(query_shards, key_shards, value_shards, causal, unscaled=True)


def ring_causal_ignored(query_shards, key_shards, value_shards, causal=False):
    """causal never used."""
    return _ring(query_shards, key_shards, value_shards, False)


def ring_four_d_only(query_shards, key_shards, value_shards, causal=False):
    """Right on (B, H, n, D) shards only: axes 2 and 3 hard-coded, so (n, D) and
    (B, n, D) shards raise IndexError."""
    W = len(query_shards)
    outputs = []
    for r in range(W):
        q = query_shards[r]
        n = q.size(2)
        state = None
        for t in range(W):
            src = (r - t) % W
            if causal and src > r:
                continue
            s = q @ key_shards[src].transpose(2, 3) / math.sqrt(q.size(3))
            if causal and src == r:
                s = s.masked_fill(~torch.ones(n, n, dtype=torch.bool).tril(), -math.inf)
            m = s.amax(-1, keepdim=True)
            p = torch.exp(s - m)
            block = (m, p.sum(-1, keepdim=True), p @ value_shards[src])
            state = block if state is None else reference_merge(state, block)
        outputs.append(state[2] / state[1])
    return outputs


def ring_diagonal_plus_one(query_shards, key_shards, value_shards, causal=False):
    """The own block masked with `tril(1)`: query i sees key i + 1."""
    return _ring(query_shards, key_shards, value_shards, causal, diagonal="plus one")


def ring_skips_earlier(query_shards, key_shards, value_shards, causal=False):
    """Skips the blocks of earlier ranks and keeps the later ones, unmasked."""
    return _ring(query_shards, key_shards, value_shards, causal, skip_earlier=True)


def ring_mask_from_step(query_shards, key_shards, value_shards, causal=False):
    """The causal mask's key positions from the step t (tn + j), not the source rank."""
    return _ring(query_shards, key_shards, value_shards, causal, mask_step=True)


def ring_causal_always(query_shards, key_shards, value_shards, causal=False):
    """causal=False gives the causal ring too."""
    return _ring(query_shards, key_shards, value_shards, True)


def ring_scale_dv(query_shards, key_shards, value_shards, causal=False):
    """Scale 1/sqrt(Dv) instead of 1/sqrt(Dk)."""
    return _ring(query_shards, key_shards, value_shards, causal, scale_dv=True)


def ring_outputs_reversed(query_shards, key_shards, value_shards, causal=False):
    """The output shards returned last rank first."""
    return _ring(query_shards, key_shards, value_shards, causal)[::-1]


def ring_blocks_normalised(query_shards, key_shards, value_shards, causal=False):
    """Each block's acc divided by its l before the merge."""
    return _ring(query_shards, key_shards, value_shards, causal, normalise_blocks=True)


def ring_one_rank_not_causal(query_shards, key_shards, value_shards, causal=False):
    """Right for W >= 2; at W = 1 it special-cases the ring and forgets causal."""
    if len(query_shards) == 1:
        return _ring(query_shards, key_shards, value_shards, False)
    return _ring(query_shards, key_shards, value_shards, causal)


def ring_gathered(query_shards, key_shards, value_shards, causal=False):
    """Right values from the whole sequence: the shards gathered, T x T scores, one
    softmax; not a ring."""
    q, k, v = (torch.cat(x, dim=-2) for x in (query_shards, key_shards, value_shards))
    s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if causal:
        T = q.shape[-2]
        s = s.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), -math.inf)
    out = s.softmax(-1) @ v
    return list(out.split(query_shards[0].shape[-2], dim=-2))


def ring_rotates_caller_lists(query_shards, key_shards, value_shards, causal=False):
    """Passes the blocks by rotating the caller's lists in place (W - 1 pops and inserts:
    the lists come back in another order)."""
    W = len(query_shards)
    outputs = [None] * W
    states = [None] * W
    for t in range(W):
        for r in range(W):
            src = (r - t) % W
            if causal and src > r:
                continue
            q = query_shards[r] / math.sqrt(query_shards[r].shape[-1])
            n = q.shape[-2]
            s = q @ key_shards[r].transpose(-2, -1)  # the block "arrived" at index r
            if causal and src == r:
                s = s.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), -math.inf)
            m = s.amax(-1, keepdim=True)
            p = torch.exp(s - m)
            block = (m, p.sum(-1, keepdim=True), p @ value_shards[r])
            states[r] = block if states[r] is None else reference_merge(states[r], block)
        if t < W - 1:
            key_shards.insert(0, key_shards.pop())
            value_shards.insert(0, value_shards.pop())
    for r in range(W):
        outputs[r] = states[r][2] / states[r][1]
    return outputs


CATALOGUE = [
    ("merge_partials", "new max only", merge_new_max_only, "ring-merge-held-not-rescaled"),
    (
        "merge_partials",
        "incoming not rescaled",
        merge_incoming_not_rescaled,
        "ring-merge-incoming-not-rescaled",
    ),
    ("merge_partials", "not rescaled", merge_not_rescaled, "ring-merge-not-rescaled"),
    ("merge_partials", "l not rescaled", merge_l_not_rescaled, "ring-merge-sum-not-rescaled"),
    ("merge_partials", "divides", merge_divides, "ring-merge-divided"),
    ("merge_partials", "lse form", merge_lse_form, "ring-merge-lse-for-max"),
    (
        "merge_partials",
        "logsumexp of maxima",
        merge_logsumexp_of_maxima,
        "ring-merge-logsumexp-of-maxima",
    ),
    ("merge_partials", "NaN on empty rows", merge_nan_on_empty, "ring-merge-empty-nan"),
    ("merge_partials", "inverted", merge_inverted, "ring-merge-rescale-inverted"),
    ("merge_partials", "squeezed", merge_squeezed, None),
    ("merge_partials", "normalised, l = 1", merge_normalised_l_one, "ring-merge-normalised"),
    ("merge_partials", "min of maxima", merge_min_of_maxima, "ring-merge-min-of-maxima"),
    ("merge_partials", "keeps m_a", merge_keeps_held_maximum, "ring-merge-held-maximum"),
    (
        "merge_partials",
        "exponents from zero",
        merge_exponents_from_zero,
        "ring-merge-exponents-from-zero",
    ),
    (
        "merge_partials",
        "measured from m_a",
        merge_measured_from_held,
        "ring-merge-measured-from-held",
    ),
    (
        "simulated_ring_attention",
        "new max only",
        ring_new_max_only,
        "ring-merge-held-not-rescaled",
    ),
    ("simulated_ring_attention", "merge divides", ring_merge_divides, "ring-merge-divided"),
    (
        "simulated_ring_attention",
        "reversed sources",
        ring_reversed_sources,
        "ring-block-source-reversed",
    ),
    ("simulated_ring_attention", "local mask", ring_local_mask, "ring-mask-local-positions"),
    (
        "simulated_ring_attention",
        "future unmasked",
        ring_future_unmasked,
        "ring-future-blocks-unmasked",
    ),
    (
        "simulated_ring_attention",
        "diagonal unmasked",
        ring_diagonal_unmasked,
        "ring-diagonal-unmasked",
    ),
    (
        "simulated_ring_attention",
        "diagonal hidden",
        ring_diagonal_hidden,
        "causal-mask-hides-diagonal",
    ),
    ("simulated_ring_attention", "own skipped", ring_own_skipped, "ring-own-block-skipped"),
    ("simulated_ring_attention", "own twice", ring_own_twice, "ring-own-block-twice"),
    (
        "simulated_ring_attention",
        "W - 1 steps",
        ring_w_minus_one_steps,
        "ring-last-block-missing",
    ),
    ("simulated_ring_attention", "unscaled", ring_unscaled, "scale-missing"),
    ("simulated_ring_attention", "causal ignored", ring_causal_ignored, "ring-causal-ignored"),
    ("simulated_ring_attention", "gathered", ring_gathered, "ring-holds-more-than-a-tile"),
    ("simulated_ring_attention", "rotates the lists", ring_rotates_caller_lists, None),
    ("simulated_ring_attention", "axes 2 and 3", ring_four_d_only, None),
    (
        "simulated_ring_attention",
        "diagonal plus one",
        ring_diagonal_plus_one,
        "ring-diagonal-plus-one",
    ),
    (
        "simulated_ring_attention",
        "earlier skipped",
        ring_skips_earlier,
        "ring-earlier-blocks-skipped",
    ),
    ("simulated_ring_attention", "mask from step", ring_mask_from_step, "ring-mask-from-step"),
    ("simulated_ring_attention", "causal always", ring_causal_always, "ring-causal-always"),
    ("simulated_ring_attention", "scale 1/sqrt(Dv)", ring_scale_dv, "ring-scale-dv"),
    (
        "simulated_ring_attention",
        "outputs reversed",
        ring_outputs_reversed,
        "ring-outputs-reversed",
    ),
    (
        "simulated_ring_attention",
        "blocks normalised",
        ring_blocks_normalised,
        "ring-blocks-normalised",
    ),
    ("simulated_ring_attention", "W = 1 not causal", ring_one_rank_not_causal, None),
]
