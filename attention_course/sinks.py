"""Attention sinks (chapter 19): the first tokens a window keeps, and a learned sink logit.

A softmax row must sum to 1. Xiao et al. (2024, "Efficient Streaming Language Models with
Attention Sinks", ICLR 2024, arXiv:2309.17453) observed that trained language models put a
large share of many rows' attention on the first token(s), whatever those tokens are, and
named such tokens *attention sinks* (注意力汇聚点). Their explanation, a hypothesis the paper
supports with experiments (not a proof): when a query has nothing useful to read, the
softmax still has to put its mass somewhere, and the first tokens, which every later token
sees, learn to take it. Two consequences, two pieces here:

- **StreamingLLM** (Xiao et al., 2024, §3.2): a sliding window that evicts the first tokens
  removes the sink, and the model degrades; keeping the first ``num_sink`` tokens beside
  the window restores it. :func:`streaming_mask` is that visibility rule for a full pass,
  :class:`StreamingAttentionCache` the KV cache that keeps ``num_sink + window``
  positions while decoding (:class:`~attention_course.kv.KVLayout` with ``num_sink``).
- **A learned sink** (OpenAI, 2025, "gpt-oss-120b & gpt-oss-20b Model Card",
  arXiv:2508.10925; the idea of a softmax whose denominator has one more term is also
  E. Miller's 2023 blog post "Attention Is Off By One", where that term is a fixed
  ``e^0``): each head has one learned logit that joins every row's softmax and whose share
  is then dropped, so a row may put weight on "nothing" and sum to less than 1:
  :func:`sink_attention`, used by :class:`~attention_course.CausalSelfAttention` with
  ``sinks=True``.
"""

from __future__ import annotations

import math

import torch

from ._validate import (
    LOW_PRECISION,
    check_positive_int,
    check_qkv,
    require_float,
    require_ndim,
    shape_str,
)
from .kv_cache import AttentionCache
from .relative_positions import _rotate  # the half-split rotation, without checks


def _check_num_sink(num_sink: object) -> None:
    if not isinstance(num_sink, int) or isinstance(num_sink, bool) or num_sink < 0:
        raise ValueError(f"num_sink: got {num_sink!r}, expected an int >= 0")


def streaming_mask(
    size: int, window: int, num_sink: int, device: torch.device | str | None = None
) -> torch.Tensor:
    """StreamingLLM's mask: a causal sliding window that always keeps the first ``num_sink`` keys.

    ``M[i, j] = j <= i and (j < num_sink or i - j < window)`` (Xiao et al., 2024,
    arXiv:2309.17453, §3.2: "attention sinks" plus a rolling window of recent tokens).
    ``num_sink = 0`` is :func:`~attention_course.sliding_window_mask`; ``window >= size``
    is :func:`~attention_course.causal_mask`.

    Shapes:
        returns: ``(size, size)`` bool, True = may attend; broadcasts to ``(B, H, T, S)``.

    Raises:
        ValueError: ``size`` or ``window`` not a positive int, ``num_sink`` not an int >= 0.
    """
    check_positive_int("size", size)
    check_positive_int("window", window)
    _check_num_sink(num_sink)
    i = torch.arange(size, device=device)[:, None]  # (size, 1): query positions
    j = torch.arange(size, device=device)[None, :]  # (1, size): key positions
    return _streaming_visible(i, j, window, num_sink)  # (size, size)


def _streaming_visible(i: torch.Tensor, j: torch.Tensor, window: int, num_sink: int):
    """The rule of :func:`streaming_mask` for query positions ``i`` and key positions ``j``
    (broadcasting), without checks."""
    return (j <= i) & ((j < num_sink) | (i - j < window))


def sink_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    sinks: torch.Tensor,
    mask: torch.Tensor | None = None,
    scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Scaled dot-product attention with one learned sink logit per head (gpt-oss).

    Each row's softmax runs over its ``S`` scores **and** the head's sink logit
    ``sinks[h]``; the sink's share is then dropped:

    .. math::
        w_{ij} = \\frac{e^{s_{ij}}}{e^{\\mathrm{sink}_h} + \\sum_{j'} e^{s_{ij'}}},
        \\qquad \\mathrm{out}_i = \\sum_j w_{ij} v_j

    so each row sums to ``1 - (sink's share) < 1``: a head can attend to "nothing"
    without putting that mass on some token. ``sinks[h] -> -inf`` gives plain
    :func:`~attention_course.scaled_dot_product_attention`. The sink is *not* a value:
    it takes weight and contributes nothing to the output.

    Masked keys get weight exactly 0 (a row whose keys are all masked puts everything
    on the sink: zero weights, zero output, no NaN). Half precision: the softmax runs
    in float32. Matches ``eager_attention_forward`` of Hugging Face's
    ``transformers.models.gpt_oss.modeling_gpt_oss`` (which takes ``module.sinks``);
    PyTorch's ``F.scaled_dot_product_attention`` has no sink.

    Shapes:
        query ``(B, H, T, Dk)``; key ``(B, H, S, Dk)``; value ``(B, H, S, Dv)`` (the same
        ``H``: call :func:`~attention_course.repeat_kv` first for grouped heads);
        sinks ``(H,)``; mask bool (True = may attend) or additive float, broadcastable to
        ``(B, H, T, S)``; scale defaults to ``Dk^-1/2``.
        returns: output ``(B, H, T, Dv)`` and weights ``(B, H, T, S)`` (rows sum to < 1).
    """
    for name, x in (("query", query), ("key", key), ("value", value)):
        require_float(name, x)
        require_ndim(name, x, (4,), "(B, H, T or S, Dh), 4-D")
    H = query.shape[1]
    if key.shape[1] != H or value.shape[1] != H:
        raise ValueError(
            f"key, value: got shapes {shape_str(key.shape)}, {shape_str(value.shape)}, expected "
            f"H={H} heads as query {shape_str(query.shape)} (repeat grouped heads with repeat_kv)"
        )
    check_qkv(query, key, value, mask)
    require_float("sinks", sinks)
    if sinks.shape != (H,):
        raise ValueError(
            f"sinks: got shape {shape_str(sinks.shape)}, expected ({H},): one per head"
        )
    if scale is not None and (isinstance(scale, bool) or not isinstance(scale, (int, float))):
        raise ValueError(f"scale: got {scale!r}, expected a float or None")
    if scale is None:
        scale = 1.0 / math.sqrt(query.shape[-1])  # 1/sqrt(Dk), chapter 4
    return _sink_attention(query, key, value, sinks, mask, scale)


def _sink_attention(query, key, value, sinks, mask, scale):
    """:func:`sink_attention` without its checks (for the attention module)."""
    scores = (query * scale) @ key.transpose(
        -2, -1
    )  # (B, H, T, Dk) @ (B, H, Dk, S) -> (B, H, T, S)
    work = torch.float32 if scores.dtype in LOW_PRECISION else scores.dtype
    scores = scores.to(work)
    keep = None
    if mask is not None:
        if mask.dtype == torch.bool:
            keep = mask
        else:  # additive: 0 keeps, -inf removes
            scores = scores + mask.to(work)
            keep = ~torch.isneginf(scores)
        # most negative finite value, not -inf: a fully masked row must not give NaN
        scores = scores.masked_fill(~keep, torch.finfo(work).min)
    B, H, T, S = scores.shape
    sink = sinks.to(work).view(1, H, 1, 1).expand(B, H, T, 1)  # (H,) -> (B, H, T, 1)
    logits = torch.cat([scores, sink], dim=-1)  # (B, H, T, S + 1): the sink is one more column
    weights = torch.softmax(logits, dim=-1)[..., :S]  # drop the sink's share: rows sum to < 1
    if keep is not None:
        weights = weights.masked_fill(~keep, 0.0)  # masked keys: exactly 0
    weights = weights.to(query.dtype)
    return weights @ value, weights  # (B, H, T, S) @ (B, H, S, Dv) -> (B, H, T, Dv)


def _shift_rotation(positions, keys: torch.Tensor, shift: int) -> torch.Tensor:
    """Rotate already-rotated keys ``(B, Hkv, n, Dh)`` by ``shift`` more positions with the
    rotary piece ``positions`` (a rotation composes: R(a) R(b) = R(a + b))."""
    at = torch.full((keys.shape[-2],), shift, device=keys.device)  # (n,): the same shift for all
    if positions.rotate_fn is not None:
        return positions.rotate_fn(keys, at)
    return _rotate(keys, at, positions.frequencies(keys.shape[-1], keys))


class StreamingAttentionCache(AttentionCache):
    """StreamingLLM's KV cache: the first ``num_sink`` positions plus a rolling window.

    Position ``p < num_sink`` is kept for ever (the attention sinks); every later position
    lives in a rolling buffer of the last ``window`` positions (as
    :class:`~attention_course.kv.RollingAttentionCache`): memory stops growing at
    ``num_sink + window`` positions (Xiao et al., 2024, arXiv:2309.17453, §3.2).
    :meth:`update` returns the kept sinks, then the cached window positions the oldest new
    query may see, then the new ones: exactly the keys :func:`streaming_mask` lets the new
    queries see (:class:`~attention_course.kv.KVLayout` with ``num_sink`` builds that mask).

    **Positions.** The package's attention modules store keys already rotated at their
    absolute positions (chapter 14). StreamingLLM instead numbers the positions *within the
    cache* (§3.2): the sinks are 0 .. num_sink - 1 and the window follows right after them,
    so a query never sees a distance larger than the cache, however long the stream. The
    two differ only in the sinks: the window's distances are the same either way.

    - ``positions=None``: keys as stored, at their absolute positions. A step-by-step decode
      then equals one full pass with :func:`streaming_mask` (the test checks it). With RoPE,
      the query at position ``t`` sees the sinks at distance ``t``: far beyond the training
      length in a long stream.
    - ``positions`` a rotary piece (:class:`~attention_course.relative_positions.
      RotaryPositions`): StreamingLLM's positions. Each step returns the sinks rotated
      ``shift`` positions further (a RoPE rotation composes), so that they sit just before
      the first window key; the query at ``t`` then sees sink ``j`` at distance
      ``num_sink + (window - 1) - j`` at most. No full pass equals this once the window has
      slid (each query would need its own copy of the sinks), so after the first eviction it
      takes one new token per step (a larger step raises ``ValueError``).

    Hugging Face counterpart: the ``SinkCache`` of earlier ``transformers`` releases
    (``window_length``, ``num_sink_tokens``), which rotates the kept window keys back as
    they slide instead of the sinks forward: the same distances, so the same scores.

    Attributes:
        window, num_sink: the sizes; ``length`` counts every position seen.
    """

    def __init__(self, window: int, num_sink: int, positions=None) -> None:
        from .kv import RollingAttentionCache

        check_positive_int("window", window)
        _check_num_sink(num_sink)
        if positions is not None and not callable(getattr(positions, "frequencies", None)):
            raise ValueError(
                f"positions: got {positions!r}, expected None or a rotary piece "
                "(attention_course.relative_positions.RotaryPositions)"
            )
        super().__init__()
        self.window = window
        self.num_sink = num_sink
        self.positions = positions
        self._recent = RollingAttentionCache(window)  # the last `window` positions
        self._sink_keys: torch.Tensor | None = None  # (B, Hkv, num_sink, Dh)
        self._sink_values: torch.Tensor | None = None

    @property
    def _sinks_stored(self) -> int:
        return min(self.length, self.num_sink)

    @property
    def keys(self) -> torch.Tensor | None:
        """The kept keys, sinks first, then the window positions after them (as stored)."""
        return self._kept(self._sink_keys, self._recent.keys)

    @property
    def values(self) -> torch.Tensor | None:
        return self._kept(self._sink_values, self._recent.values)

    def _kept(self, sinks, recent):
        if recent is None:
            return None
        a = self._sinks_stored
        n = min(self._recent.stored, self.length - a)  # window positions that are not sinks
        return torch.cat([sinks[:, :, :a], recent[:, :, recent.shape[2] - n :]], dim=2)

    @property
    def nbytes(self) -> int:
        """Bytes held by the sink and window buffers."""
        if self._sink_keys is None:
            return self._recent.nbytes
        sinks = sum(b.numel() * b.element_size() for b in (self._sink_keys, self._sink_values))
        return sinks + self._recent.nbytes

    def update(self, keys: torch.Tensor, values: torch.Tensor):
        """Keep the sinks and the window; return every key and value the new queries may see.

        Shapes: keys, values ``(B, Hkv, Tn, Dh)``; returns two ``(B, Hkv, a + m + Tn, Dh)``
        tensors: ``a = min(num_sink, length)`` sinks, then the last ``m`` cached non-sink
        positions the oldest new query sees (``m = min(length - a, window - 1)``), then the
        new ones (``length`` before the update).
        """
        t, Tn, W, ns = self.length, keys.shape[2], self.window, self.num_sink
        if self._sink_keys is None:
            B, Hkv, _, Dh = keys.shape
            self._sink_keys = keys.new_empty((B, Hkv, ns, Dh))
            self._sink_values = values.new_empty((B, Hkv, ns, Dh))
        a = min(ns, t)  # sinks already cached
        m = min(t - a, W - 1)  # cached window positions that are not sinks
        shift = t - m - a  # > 0 once a non-sink position has left the window
        if self.positions is not None and Tn > 1 and t + Tn - W > ns:
            raise ValueError(
                f"keys: got {Tn} new positions at position {t}, expected 1: with positions "
                "within the cache, each query needs its own shift of the sinks once the "
                "window slides; decode one token per step"
            )
        if t < ns:  # some new positions are sinks: keep them for ever
            n_new = min(ns - t, Tn)
            self._sink_keys[:, :, t : t + n_new] = keys[:, :, :n_new]
            self._sink_values[:, :, t : t + n_new] = values[:, :, :n_new]
        sink_keys = self._sink_keys[:, :, :a]
        if self.positions is not None and shift > 0 and a > 0:
            # StreamingLLM's positions: the sinks sit just before the first window key
            sink_keys = _shift_rotation(self.positions, sink_keys, shift)
        recent_keys, recent_values = self._recent.update(keys, values)  # (B, Hkv, n + Tn, Dh)
        recent_keys = recent_keys[:, :, recent_keys.shape[2] - (m + Tn) :]  # (B, Hkv, m + Tn, Dh)
        recent_values = recent_values[:, :, recent_values.shape[2] - (m + Tn) :]
        self.length = t + Tn
        all_keys = torch.cat([sink_keys, recent_keys], dim=2)  # (B, Hkv, a + m + Tn, Dh)
        all_values = torch.cat([self._sink_values[:, :, :a], recent_values], dim=2)
        return all_keys, all_values


def _streaming_cache_mask(T: int, S: int, window: int, num_sink: int, device=None) -> torch.Tensor:
    """Which of the keys a :class:`StreamingAttentionCache` returns each of ``T`` new queries
    (the last of ``S`` positions) may see: ``(T, a + m + T)`` bool, the rows of
    :func:`streaming_mask` at those queries, restricted to the returned keys' positions."""
    t = S - T  # positions cached before these queries
    a = min(num_sink, t)
    m = min(t - a, window - 1)
    key_pos = torch.cat(
        [
            torch.arange(a, device=device),  # the sinks
            torch.arange(t - m, S, device=device),  # the cached window, then the new positions
        ]
    )
    query_pos = torch.arange(t, S, device=device)
    return _streaming_visible(query_pos[:, None], key_pos[None, :], window, num_sink)


def _streaming_cache_keys(T: int, S: int, window: int, num_sink: int) -> int:
    """How many keys a :class:`StreamingAttentionCache` returns to ``T`` new queries, the
    last of ``S`` positions."""
    t = S - T
    a = min(num_sink, t)
    return a + min(t - a, window - 1) + T
