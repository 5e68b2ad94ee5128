"""Cheaper keys and values (chapter 15): grouped heads and sliding windows.

At decoding time a model keeps every layer's keys and values (chapter 12's KV cache):
``2 · layers · Hkv · Dh`` numbers per token. Two ways to make that smaller:

- **Grouped keys and values** (grouped-query attention, GQA; Ainslie et al., 2023,
  "GQA: Training Generalized Multi-Query Transformer Models from Multi-Head
  Checkpoints"): ``Hkv < H`` key/value heads, each shared by ``H / Hkv`` query heads.
  ``Hkv = 1`` is multi-query attention (MQA; Shazeer, 2019, "Fast Transformer Decoding:
  One Write-Head is All You Need"). The cache stores only the ``Hkv`` heads;
  :func:`repeat_kv` makes the copies after reading it.
- **Sliding-window attention** (Beltagy et al., 2020, "Longformer"; used by Mistral 7B,
  Jiang et al., 2023): each token sees itself and the ``window - 1`` tokens before it
  (:func:`sliding_window_mask`), so the cache needs only the last ``window`` positions:
  :class:`RollingAttentionCache`, a rolling buffer whose size stops growing.

:class:`KVLayout` gathers both choices (``num_kv_heads``, ``window``) into the piece an
attention module is given: it repeats the key/value heads, says which keys a query sees
and makes the matching cache.
"""

from __future__ import annotations

import torch

from ._validate import check_positive_int, require_ndim
from .kv_cache import AttentionCache
from .masking import causal_mask
from .sinks import (
    StreamingAttentionCache,
    _check_num_sink,
    _streaming_cache_keys,
    _streaming_cache_mask,
)


def repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    """Repeat each key/value head ``n_rep`` times: output head ``h`` is input head ``h // n_rep``.

    Query heads ``g · n_rep .. (g + 1) · n_rep - 1`` form group ``g`` and share key/value
    head ``g``: neighbours share, as in Hugging Face LLaMA's ``repeat_kv`` and
    ``torch.repeat_interleave(x, n_rep, dim=1)``, which this equals. (``x.repeat(1, n_rep,
    1, 1)`` would instead give head ``h`` the key/value head ``h % Hkv``: a different model.)
    ``F.scaled_dot_product_attention(q, k, v, enable_gqa=True)`` does the same grouping;
    its fused kernels can do it without copies (its math fallback copies too). This
    function materialises the copies: a model that calls it saves cache memory, not the
    per-step memory traffic. ``n_rep = 1`` returns ``x`` itself.

    Shapes:
        x: ``(B, Hkv, S, Dh)``; returns ``(B, Hkv · n_rep, S, Dh)``.
    """
    require_ndim("x", x, (4,), "(B, Hkv, S, Dh)")
    check_positive_int("n_rep", n_rep)
    return _repeat_kv(x, n_rep)


def _repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    """:func:`repeat_kv` without its checks, for the attention modules, which checked their
    head counts once, in their constructor."""
    if n_rep == 1:
        return x
    B, Hkv, S, Dh = x.shape
    x = x[:, :, None].expand(B, Hkv, n_rep, S, Dh)  # -> (B, Hkv, n_rep, S, Dh), no copy
    return x.reshape(B, Hkv * n_rep, S, Dh)  # (B, Hkv, n_rep, S, Dh) -> (B, H, S, Dh): copies


def sliding_window_mask(
    size: int,
    window: int,
    device: torch.device | str | None = None,
    *,
    S: int | None = None,
) -> torch.Tensor:
    """Causal sliding-window mask: query ``i`` may attend to key ``j`` when ``0 <= i - j < window``.

    Each token sees itself and the ``window - 1`` tokens before it; ``window >= size``
    gives :func:`~attention_course.causal_mask`. Stacked, ``L`` layers still let
    information travel ``L · (window - 1)`` positions back (the receptive field grows by
    ``window - 1`` positions per layer: one window minus the token itself). Hugging Face
    builds the same mask for Mistral's ``sliding_window`` (there, key ``j`` is visible when
    ``i - j < sliding_window``).

    With ``S`` keys (``S >= size``) the ``size`` queries are the *last* ``size`` of ``S``
    positions (new tokens meeting a cache): query ``i`` sits at ``i + S - size``, and the
    result equals the last ``size`` rows of ``sliding_window_mask(S, window)``.

    Shapes:
        returns: ``(size, S)`` bool (``S`` defaults to ``size``); broadcasts to ``(B, H, T, S)``.

    Raises:
        ValueError: ``window < 1`` (or not an int), ``size < 1``, ``S < size``.
    """
    check_positive_int("size", size)
    check_positive_int("window", window)
    if S is None:
        S = size
    elif not isinstance(S, int) or isinstance(S, bool) or S < size:
        raise ValueError(f"S: got {S!r}, expected None or an int >= size={size}")
    ones = torch.ones(size, S, dtype=torch.bool, device=device)
    offset = S - size  # query i is at position i + offset
    # j <= i + offset (causal), and j > i + offset - window (inside the window)
    return ones.tril(diagonal=offset).triu(diagonal=offset - window + 1)


class RollingAttentionCache(AttentionCache):
    """A KV cache slot for sliding-window attention: a rolling buffer of ``window`` positions.

    A token at position ``p`` never looks further back than ``p - window + 1``, so only
    the last ``window`` positions need keeping: position ``p`` is stored in slot
    ``p % window`` and overwrites the one ``window`` positions older (Mistral's "rolling
    buffer cache", Jiang et al., 2023). The buffer is allocated once,
    ``(B, Hkv, window, Dh)``: decoding memory stops growing with the length.

    :attr:`length` counts every position seen (the position of the next token), as in
    :class:`~attention_course.kv_cache.AttentionCache`; :attr:`keys` and :attr:`values`
    return the stored ones, oldest first. :meth:`update` returns the last
    ``min(length, window - 1)`` cached positions followed by the new ones: everything the
    new queries may see (with :func:`sliding_window_mask` and ``S`` = that count).

    Hugging Face counterpart: the sliding-window layers of ``transformers``'
    ``DynamicCache`` / ``SlidingWindowCache``.
    """

    def __init__(self, window: int) -> None:
        check_positive_int("window", window)
        super().__init__()
        self.window = window

    def _last(self, n: int, buffer: torch.Tensor) -> torch.Tensor:
        """The last ``n`` stored positions in order: ``(B, Hkv, window, Dh) -> (B, Hkv, n, Dh)``."""
        slots = torch.arange(self.length - n, self.length, device=buffer.device) % self.window
        return buffer[:, :, slots]  # (B, Hkv, n, Dh), a copy

    @property
    def stored(self) -> int:
        """How many positions the buffer holds: ``min(length, window)``."""
        return min(self.length, self.window)

    @property
    def keys(self) -> torch.Tensor | None:
        return None if self._keys is None else self._last(self.stored, self._keys)

    @property
    def values(self) -> torch.Tensor | None:
        return None if self._values is None else self._last(self.stored, self._values)

    @property
    def nbytes(self) -> int:
        """Bytes held by the key and value buffers."""
        if self._keys is None:
            return 0
        return sum(b.numel() * b.element_size() for b in (self._keys, self._values))

    def update(self, keys: torch.Tensor, values: torch.Tensor):
        """Return the visible cached positions followed by the new ones; keep the last ``window``.

        Shapes: keys, values ``(B, Hkv, Tn, Dh)``; returns two
        ``(B, Hkv, min(length, window - 1) + Tn, Dh)`` tensors (``length`` before the update).
        """
        t, Tn, W = self.length, keys.shape[2], self.window
        if self._keys is None:
            B, Hkv, _, Dh = keys.shape
            self._keys = keys.new_empty((B, Hkv, W, Dh))
            self._values = values.new_empty((B, Hkv, W, Dh))
        n = min(t, W - 1)  # the oldest new query (position t) sees back to t - W + 1
        all_keys = torch.cat([self._last(n, self._keys), keys], dim=2)  # (B, Hkv, n + Tn, Dh)
        all_values = torch.cat([self._last(n, self._values), values], dim=2)
        m = min(Tn, W)  # only the last W new positions survive
        slots = torch.arange(t + Tn - m, t + Tn, device=keys.device) % W  # slot = position % W
        self._keys[:, :, slots] = keys[:, :, Tn - m :]
        self._values[:, :, slots] = values[:, :, Tn - m :]
        self.length = t + Tn
        return all_keys, all_values


class KVLayout:
    """The key/value layout an attention module is given: heads shared, window, cache.

    - ``num_kv_heads``: ``num_heads`` (multi-head attention, the default), fewer (GQA:
      each key/value head serves ``num_heads / num_kv_heads`` query heads) or 1 (MQA).
    - ``window``: None (every earlier key) or sliding-window attention over the last
      ``window`` positions, with a :class:`RollingAttentionCache`.
    - ``num_sink`` (chapter 19, with a ``window``): StreamingLLM's attention sinks, the
      first ``num_sink`` positions kept beside the window
      (:func:`~attention_course.sinks.streaming_mask`), with a
      :class:`~attention_course.sinks.StreamingAttentionCache`. 0 (the default): none.

    The attention module projects ``num_kv_heads`` key/value heads, stores them in
    :meth:`new_cache`'s cache, :meth:`expand` repeats them for the query heads, and
    :meth:`visible` is the causal (or sliding-window) mask.

    Raises:
        ValueError: a count that is not a positive int, ``num_heads % num_kv_heads != 0``,
        ``num_sink`` not an int >= 0 or given without a ``window``.
    """

    def __init__(
        self,
        num_heads: int,
        num_kv_heads: int | None = None,
        window: int | None = None,
        num_sink: int = 0,
    ):
        check_positive_int("num_heads", num_heads)
        num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        check_positive_int("num_kv_heads", num_kv_heads)
        if num_heads % num_kv_heads != 0:
            raise ValueError(
                f"num_kv_heads: got {num_kv_heads}, expected a divisor of num_heads={num_heads} "
                "(each key/value head serves num_heads / num_kv_heads query heads)"
            )
        if window is not None:
            check_positive_int("window", window)
        _check_num_sink(num_sink)
        if num_sink and window is None:
            raise ValueError(
                f"num_sink: got {num_sink} without a window, expected window= too (attention "
                "sinks are the first positions a sliding window keeps)"
            )
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.window = window
        self.num_sink = num_sink
        self.n_rep = num_heads // num_kv_heads  # query heads per key/value head

    def expand(self, k: torch.Tensor, v: torch.Tensor):
        """``(B, Hkv, S, Dh)`` keys and values -> ``(B, H, S, Dh)`` (:func:`repeat_kv`)."""
        if self.n_rep == 1:  # multi-head attention: nothing to repeat
            return k, v
        return _repeat_kv(k, self.n_rep), _repeat_kv(v, self.n_rep)

    def new_cache(self, positions=None) -> AttentionCache:
        """An empty cache for one layer: a :class:`RollingAttentionCache` with a window, a
        :class:`~attention_course.sinks.StreamingAttentionCache` with sinks too (given the
        model's rotary ``positions``, it numbers positions within the cache, as StreamingLLM;
        see its docstring)."""
        if self.window is None:
            return AttentionCache()
        if self.num_sink:
            return StreamingAttentionCache(self.window, self.num_sink, positions)
        return RollingAttentionCache(self.window)

    def check_cache(self, cache) -> None:
        """Raise ``ValueError`` unless ``cache`` fits this layout (a window's rolling cache)."""
        if self.window is None:
            return
        if self.num_sink:
            if (
                not isinstance(cache, StreamingAttentionCache)
                or cache.window != self.window
                or cache.num_sink != self.num_sink
            ):
                raise ValueError(
                    f"cache: got {type(cache).__name__}, expected a StreamingAttentionCache("
                    f"window={self.window}, num_sink={self.num_sink}) (GPT.new_cache makes one)"
                )
            return
        if not isinstance(cache, RollingAttentionCache) or cache.window != self.window:
            raise ValueError(
                f"cache: got {type(cache).__name__}, expected a RollingAttentionCache("
                f"window={self.window}) (GPT.new_cache makes one)"
            )

    def visible_keys(self, T: int, S: int) -> int:
        """How many keys ``T`` new queries (the last of ``S`` positions) are given: all
        ``S``, or with a window the new ones and at most ``window - 1`` cached ones (those
        a :class:`RollingAttentionCache` returns)."""
        if self.num_sink:  # the kept sinks too
            return _streaming_cache_keys(T, S, self.window, self.num_sink)
        return S if self.window is None else T + min(S - T, self.window - 1)

    def visible(self, T: int, S: int, device=None) -> torch.Tensor:
        """Which of the ``S`` keys (:meth:`visible_keys`) each of the ``T`` new queries may
        see: :func:`~attention_course.causal_mask` or :func:`sliding_window_mask`, ``(T, S)``
        (with sinks: :func:`~attention_course.sinks.streaming_mask`'s rows over the keys
        the streaming cache returns)."""
        if self.window is None:
            return causal_mask(T, device, S=S)
        if self.num_sink:
            return _streaming_cache_mask(T, S, self.window, self.num_sink, device)
        return sliding_window_mask(T, self.window, device, S=S)

    def __repr__(self) -> str:
        heads = f"num_heads={self.num_heads}, num_kv_heads={self.num_kv_heads}"
        sinks = f", num_sink={self.num_sink}" if self.num_sink else ""
        return f"KVLayout({heads}, window={self.window}{sinks})"
