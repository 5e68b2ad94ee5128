"""The KV cache (chapter 12): keys and values kept between decoding steps.

One type per layer: an :class:`AttentionCache` keeps one attention module's keys and
values between generation steps (any decoder: the GPT's layers hold one each); a
:class:`DecoderCache` is a decoder's list of them. The encoder-decoder adds its
cross-attention on top: a :class:`LayerKVCache` is an :class:`AttentionCache` plus a
:class:`MemoryCache` (the encoder memory's keys and values, projected once), and a
:class:`KVCache` a :class:`DecoderCache` of those plus the source and target padding.
Chapter 15's sliding window keeps a fixed-size one (:class:`attention_course.kv.
RollingAttentionCache`). In the package's attention modules, and so in its models (the
GPT, the Transformer), the one place that writes a cache is
``MultiHeadAttention._remember`` (:mod:`attention_course.multihead`); ``attend`` never
sees a cache. (Exercise 13's checker keeps its own small decoder, and exercise 15 asks
students to write a cache update: both are written apart from these on purpose.)
"""

from __future__ import annotations

import torch

from .fused import AttentionMask


class AttentionCache:
    """The projected keys and values one attention module keeps between decoding steps.

    The cache of one layer of any decoder (a GPT's or the encoder-decoder's): every
    :meth:`update` appends the new positions. The package's models never call
    :meth:`update` themselves: ``MultiHeadAttention._remember``, the one place in their
    attention modules that writes a cache, does.

    Attributes:
        keys, values: ``(B, H, length, Dh)``, or None while empty.
        length: the number of positions seen (the position of the next token).
    """

    #: True when the cache holds keys and values that need no new projection (only a
    #: :class:`MemoryCache` once filled); a growing cache always takes the new positions.
    filled = False

    def __init__(self) -> None:
        self.length = 0
        # Buffers (B, H, capacity, Dh) whose first `length` positions are filled.
        self._keys: torch.Tensor | None = None
        self._values: torch.Tensor | None = None

    @property
    def keys(self) -> torch.Tensor | None:
        return None if self._keys is None else self._keys[:, :, : self.length]

    @property
    def values(self) -> torch.Tensor | None:
        return None if self._values is None else self._values[:, :, : self.length]

    @property
    def nbytes(self) -> int:
        """Bytes held by the key and value buffers: their allocated capacity (chapter 15),
        which can exceed the ``length`` filled positions (the buffers grow by doubling)."""
        if self._keys is None:
            return 0
        return sum(b.numel() * b.element_size() for b in (self._keys, self._values))

    def update(self, keys: torch.Tensor, values: torch.Tensor):
        """Store the new positions' keys and values after the cached ones; return all of them.

        ``torch.cat`` would copy the whole cache at every step (x-transformers writes
        ``k = cat((cached_k, k), dim=-2)``); instead the buffers double in size when
        full, so a step writes only its own positions.

        Shapes: keys, values ``(B, H, Tn, Dh)``; returns two ``(B, H, length, Dh)`` views.
        """
        t, Tn = self.length, keys.shape[2]
        if self._keys is None or t + Tn > self._keys.shape[2]:
            capacity = max(2 * (t + Tn), 64)
            self._keys = _grow(self._keys, keys, t, capacity)
            self._values = _grow(self._values, values, t, capacity)
        self._keys[:, :, t : t + Tn] = keys
        self._values[:, :, t : t + Tn] = values
        self.length = t + Tn
        return self.keys, self.values


def _grow(buffer: torch.Tensor | None, new: torch.Tensor, filled: int, capacity: int):
    """A ``(B, H, capacity, Dh)`` buffer holding the first ``filled`` positions of ``buffer``."""
    B, H, _, Dh = new.shape
    grown = new.new_empty((B, H, capacity, Dh))
    if buffer is not None:
        grown[:, :, :filled] = buffer[:, :, :filled]
    return grown


class MemoryCache:
    """Cross-attention's keys and values: projections of the encoder memory, made once.

    The memory never changes while a target is decoded, so the first :meth:`update`
    stores its keys and values and every later one returns them unchanged (and, once
    :attr:`filled`, the attention module does not project the memory again).

    Attributes:
        keys, values: ``(B, H, S, Dh)``, or None until the first step.
    """

    def __init__(self) -> None:
        self.keys: torch.Tensor | None = None
        self.values: torch.Tensor | None = None

    @property
    def filled(self) -> bool:
        """True once the memory's keys and values are stored: nothing to project again."""
        return self.keys is not None

    @property
    def length(self) -> int:
        return 0 if self.keys is None else self.keys.shape[2]

    @property
    def nbytes(self) -> int:
        if self.keys is None:
            return 0
        return sum(b.numel() * b.element_size() for b in (self.keys, self.values))

    def update(self, keys: torch.Tensor, values: torch.Tensor):
        """Keep the first keys and values given; return the kept ones."""
        if self.keys is None:
            self.keys, self.values = keys, values
        return self.keys, self.values


class DecoderCache:
    """What a decoder keeps between generation steps: one cache per layer.

    Decoder-agnostic: ``layers[i]`` is the :class:`AttentionCache` (or a subclass: a
    :class:`~attention_course.kv.RollingAttentionCache` for sliding windows, a
    :class:`LayerKVCache` for the encoder-decoder) of layer ``i``'s self-attention.
    :meth:`GPT.new_cache <attention_course.GPT.new_cache>` makes one.

    Attributes:
        layers: one cache per decoder layer.
    """

    def __init__(self, layers: list[AttentionCache] | None = None) -> None:
        self.layers: list = [] if layers is None else list(layers)

    @property
    def length(self) -> int:
        """The number of positions cached so far (the position of the next token)."""
        return self.layers[0].length if self.layers else 0

    @property
    def nbytes(self) -> int:
        """Bytes held by every layer's key and value buffers (allocated, chapter 15)."""
        return sum(layer.nbytes for layer in self.layers)


class LayerKVCache(AttentionCache):
    """One encoder-decoder layer's cache: its self-attention cache plus the memory's.

    It *is* the layer's :class:`AttentionCache` (the keys and values of the ``length``
    target positions decoded so far); the encoder-decoder adds :attr:`memory`, a
    :class:`MemoryCache` for the cross-attention.

    Attributes:
        keys, values: the self-attention's, ``(B, H, t, Dh)``.
        memory: the cross-attention's :class:`MemoryCache`; ``memory_keys`` and
            ``memory_values`` its tensors, ``(B, H, S, Dh)`` (None until the first step).
    """

    def __init__(self) -> None:
        super().__init__()
        self.memory = MemoryCache()

    memory_keys = property(lambda self: self.memory.keys)
    memory_values = property(lambda self: self.memory.values)

    @property
    def nbytes(self) -> int:
        return super().nbytes + self.memory.nbytes


class KVCache(DecoderCache):
    """What the encoder-decoder's decoder keeps between generation steps: the KV cache (键值缓存).

    When a decoder generates one token at a time, the newest token's query must
    meet the keys and values of every earlier position. Under the causal mask an
    earlier position never looks at a later one, so its keys and values never
    change: keep them instead of recomputing the whole prefix at every step.
    Each step then projects one new position per layer, and its cost grows with
    the prefix only through one attention row (``1 x t`` scores), not ``t x t``.

    Use: create an empty cache, then call :meth:`Transformer.decode` with only the
    new tokens and ``cache=cache``; the positions continue where the cache ends.

    A :class:`DecoderCache` whose layers are :class:`LayerKVCache` (self-attention plus
    the memory's keys and values). Like the memory's keys and values, the source padding
    mask is taken at the first step and reused: a cache belongs to one ``memory`` and
    one ``src``.

    Attributes:
        layers: one :class:`LayerKVCache` per decoder layer (filled at the first step).
        target_keep: ``(B, t)`` bool, False at padded target positions, so that padded
            keys stay masked; None while no target position has been padded.
        memory_mask: the source padding mask of the first step, an :class:`AttentionMask`
            (its ``dense`` is ``(B, 1, 1, S)`` or None), converted once for every layer.
    """

    def __init__(self) -> None:
        super().__init__()
        self.target_keep: torch.Tensor | None = None
        self.memory_mask: AttentionMask = AttentionMask()

    def begin_step(self, num_layers: int, memory_mask, keep: torch.Tensor | None):
        """Update the cache's bookkeeping before a decoding step; return the target keep mask.

        At the first step: :meth:`start`. Then the new tokens' padding ``keep (B, Tn)``
        (None for a model without ``pad_id``) goes through :meth:`extend_keep`.
        """
        if self.length == 0:
            self.start(num_layers, memory_mask)
        return None if keep is None else self.extend_keep(keep)

    def start(self, num_layers: int, memory_mask: torch.Tensor | AttentionMask | None):
        """Begin a run: one empty slot per layer; keep the source mask (``(B, 1, 1, S)``)."""
        self.layers = [LayerKVCache() for _ in range(num_layers)]
        self.target_keep = None
        if not isinstance(memory_mask, AttentionMask):
            memory_mask = AttentionMask(memory_mask)
        self.memory_mask = memory_mask

    def extend_keep(self, keep: torch.Tensor) -> torch.Tensor | None:
        """Record which new target positions are real (``keep (B, Tn)``, False at padding).

        Returns the keep mask of all ``t + Tn`` positions, or None while none is padded
        (then no key needs hiding: the usual case, and no mask to build).
        """
        if self.target_keep is None:
            if bool(keep.all()):
                return None
            # the first padded token: all earlier ones were kept
            self.target_keep = keep.new_ones((keep.shape[0], self.length))
        self.target_keep = torch.cat([self.target_keep, keep], dim=1)  # (B, t + Tn)
        return self.target_keep
