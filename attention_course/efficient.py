"""Chapter 12's machinery around attention: the fused kernel's mask and the KV cache.

:func:`fused_attention` runs PyTorch's ``F.scaled_dot_product_attention`` with the
course's mask convention (True = may attend) and zero output for fully masked
rows; a :class:`FusedMask` is a mask converted for it once, to be reused by every
layer. :class:`KVCache` keeps a decoder's keys and values between generation
steps; every attention module owns one :class:`AttentionCache` slot of it.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F


class FusedMask(NamedTuple):
    """A course mask converted once for ``F.scaled_dot_product_attention``.

    Converting costs a few small operations; a decoder that applies the same mask
    in every layer (or at every decoding step, for the source padding) converts it
    once with :func:`prepare_fused_mask` and passes this to :func:`fused_attention`.

    Attributes:
        additive: float, 0 where a query may attend and -inf elsewhere, except on
            fully masked rows, which are all 0 (attend everywhere: finite, and zeroed later).
        empty: bool ``(..., T, 1)``, True on the fully masked rows; None when there are none.
    """

    additive: torch.Tensor
    empty: torch.Tensor | None


def prepare_fused_mask(mask: torch.Tensor, dtype: torch.dtype) -> FusedMask:
    """Convert a bool (True = may attend) or additive float mask into a :class:`FusedMask`."""
    if mask.dtype == torch.bool:
        # The kernels are faster with an additive float mask than with a bool one.
        additive = torch.full(mask.shape, float("-inf"), dtype=dtype, device=mask.device)
        additive.masked_fill_(mask, 0.0)  # 0 where a query may attend, -inf elsewhere
    else:
        additive = mask.to(dtype)
    empty = torch.isneginf(additive).all(dim=-1, keepdim=True)  # (.., T, 1): no key allowed
    if not bool(empty.any()):  # the usual case: every query may attend somewhere
        return FusedMask(additive, None)
    return FusedMask(additive.masked_fill(empty, 0.0), empty)


def fused_attention(q, k, v, mask, dropout_p: float) -> torch.Tensor:
    """``F.scaled_dot_product_attention`` with fully masked rows returning zeros.

    PyTorch's kernels may return NaN for a query that may attend to nothing.
    We let such rows attend everywhere (a harmless, finite computation) and
    zero their output afterwards. ``mask`` is None, a course mask, or a
    :class:`FusedMask` prepared earlier.

    Shapes: q ``(..., T, Dk)``; k ``(..., S, Dk)``; v ``(..., S, Dv)``; returns ``(..., T, Dv)``.
    """
    if mask is None:
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p)
    if not isinstance(mask, FusedMask):
        mask = prepare_fused_mask(mask, q.dtype)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask.additive, dropout_p=dropout_p)
    if mask.empty is None:
        return out
    return out.masked_fill(mask.empty, 0.0)  # (.., T, 1) broadcasts over Dh


class AttentionCache:
    """The projected keys and values one attention module keeps between decoding steps.

    A growing cache (self-attention) appends the new positions at every
    :meth:`update`; a ``static`` one (cross-attention: the encoder memory never
    changes) is filled once and then only read (:attr:`filled`).

    Attributes:
        keys, values: ``(B, H, length, Dh)``, or None while empty.
    """

    def __init__(self, static: bool = False) -> None:
        self.static = static
        self.length = 0
        # Buffers (B, H, capacity, Dh) whose first `length` positions are filled.
        self._keys: torch.Tensor | None = None
        self._values: torch.Tensor | None = None

    @property
    def filled(self) -> bool:
        """True when a static cache holds its keys and values: nothing to project again."""
        return self.static and self._keys is not None

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
        full, so a step writes only its own positions. A static cache keeps its first
        keys and values as they are.

        Shapes: keys, values ``(B, H, Tn, Dh)``; returns two ``(B, H, length, Dh)`` views.
        """
        if self.static:
            if self._keys is None:
                self._keys, self._values, self.length = keys, values, keys.shape[2]
            return self.keys, self.values
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


class LayerKVCache:
    """One decoder layer's share of a :class:`KVCache`: one slot per attention module.

    Attributes:
        self_attn: the self-attention keys and values of the ``length`` target
            positions decoded so far, one position longer after every step.
        cross_attn: the cross-attention keys and values, i.e. projections of the
            encoder memory, computed once, then reused.
        keys, values, memory_keys, memory_values: their tensors, ``(B, H, t, Dh)``
            and ``(B, H, S, Dh)`` (None until the first step).
    """

    def __init__(self) -> None:
        self.self_attn = AttentionCache()
        self.cross_attn = AttentionCache(static=True)

    length = property(lambda self: self.self_attn.length)
    keys = property(lambda self: self.self_attn.keys)
    values = property(lambda self: self.self_attn.values)
    memory_keys = property(lambda self: self.cross_attn.keys)
    memory_values = property(lambda self: self.cross_attn.values)


class KVCache:
    """What a decoder keeps between generation steps: the KV cache (键值缓存).

    When a decoder generates one token at a time, the newest token's query must
    meet the keys and values of every earlier position. Under the causal mask an
    earlier position never looks at a later one, so its keys and values never
    change: keep them instead of recomputing the whole prefix at every step.
    Each step then projects one new position per layer, and its cost grows with
    the prefix only through one attention row (``1 x t`` scores), not ``t x t``.

    Use: create an empty cache, then call :meth:`Transformer.decode` with only the
    new tokens and ``cache=cache``; the positions continue where the cache ends.

    Like the memory's keys and values, the source padding mask is taken at the
    first step and reused: a cache belongs to one ``memory`` and one ``src``.

    Attributes:
        layers: one :class:`LayerKVCache` per decoder layer (filled at the first step).
        target_keep: ``(B, t)`` bool, False at padded target positions, so that padded
            keys stay masked; None while no target position has been padded.
        memory_mask: the source padding mask of the first step, ``(B, 1, 1, S)`` or None,
            and ``fused_memory_mask`` the same converted once for the fused kernel.
    """

    def __init__(self) -> None:
        self.layers: list[LayerKVCache] = []
        self.target_keep: torch.Tensor | None = None
        self.memory_mask: torch.Tensor | None = None
        self.fused_memory_mask: FusedMask | None = None

    @property
    def length(self) -> int:
        """The number of target positions cached so far (the position of the next token)."""
        return self.layers[0].length if self.layers else 0

    @property
    def nbytes(self) -> int:
        """Bytes held by every layer's key and value buffers (allocated, chapter 15)."""
        return sum(layer.self_attn.nbytes + layer.cross_attn.nbytes for layer in self.layers)

    def begin_step(self, num_layers: int, memory_mask, dtype, keep: torch.Tensor | None):
        """Update the cache's bookkeeping before a decoding step; return the target keep mask.

        At the first step: :meth:`start`. Then the new tokens' padding ``keep (B, Tn)``
        (None for a model without ``pad_id``) goes through :meth:`extend_keep`.
        """
        if self.length == 0:
            self.start(num_layers, memory_mask, dtype)
        return None if keep is None else self.extend_keep(keep)

    def start(self, num_layers: int, memory_mask: torch.Tensor | None, dtype: torch.dtype):
        """Begin a run: one empty slot per layer; keep the source mask (and its fused form)."""
        self.layers = [LayerKVCache() for _ in range(num_layers)]
        self.target_keep = None
        self.memory_mask = memory_mask
        fused = None if memory_mask is None else prepare_fused_mask(memory_mask, dtype)
        self.fused_memory_mask = fused

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
