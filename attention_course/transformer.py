"""The encoder-decoder Transformer (Vaswani et al., 2017), built from the
course's own pieces: :class:`MultiHeadAttention`, :class:`PositionwiseFeedForward`,
:class:`LayerNorm` and :class:`PositionalEncoding`.

Post-norm (``norm_first=False``, the paper): ``x = LayerNorm(x + Sublayer(x))``.
Pre-norm (``norm_first=True``): ``x = x + Sublayer(LayerNorm(x))``, with a final
LayerNorm after the stack; it trains more easily when deep.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from ._validate import check_positive_int, check_probability, require_ndim, shape_str
from .attention import scaled_dot_product_attention
from .ffn import PositionwiseFeedForward
from .masking import causal_mask
from .multihead import (
    MultiHeadAttention,
    _fused_attention,
    _prepare_sdpa_mask,
    merge_heads,
    split_heads,
)
from .norms import LayerNorm
from .positional import PositionalEncoding


class EncoderLayer(nn.Module):
    """One encoder layer: self-attention, Add & Norm, feed-forward, Add & Norm.

    Matches ``nn.TransformerEncoderLayer(d_model, num_heads, d_ff, dropout,
    batch_first=True, norm_first=norm_first)`` with copied weights (mask
    convention aside: here True = may attend).

    Shapes:
        x: ``(B, T, D)``; mask: broadcastable to ``(B, H, T, T)``; returns ``(B, T, D)``
        (and the self-attention weights ``(B, H, T, T)`` if ``return_attention``).
    """

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        d_ff: int,
        dropout: float = 0.1,
        norm_first: bool = False,
    ) -> None:
        super().__init__()
        check_probability("dropout", dropout)
        self.norm_first = norm_first
        self.self_attn = MultiHeadAttention(d_model, num_heads, dropout=dropout)
        self.ffn = PositionwiseFeedForward(d_model, d_ff, dropout=dropout)
        self.norm1 = LayerNorm(d_model)
        self.norm2 = LayerNorm(d_model)
        self.dropout1 = nn.Dropout(dropout)
        self.dropout2 = nn.Dropout(dropout)

    def _self_attention(self, x, mask, need_weights):
        out, weights = self.self_attn(x, x, x, mask=mask, need_weights=need_weights)
        return self.dropout1(out), weights

    def forward(
        self, x: torch.Tensor, mask: torch.Tensor | None = None, return_attention: bool = False
    ):
        if self.norm_first:
            h, weights = self._self_attention(self.norm1(x), mask, return_attention)
            x = x + h
            x = x + self.dropout2(self.ffn(self.norm2(x)))
        else:
            h, weights = self._self_attention(x, mask, return_attention)
            x = self.norm1(x + h)  # Add & Norm
            x = self.norm2(x + self.dropout2(self.ffn(x)))  # Add & Norm
        return (x, weights) if return_attention else x


class LayerKVCache:
    """One decoder layer's share of a :class:`KVCache`.

    Attributes (None until the first step):
        keys, values: ``(B, H, t, Dh)``, the self-attention keys and values of the
        ``t = length`` target positions decoded so far; one position longer after
        every step (see :meth:`append`).
        memory_keys, memory_values: ``(B, H, S, Dh)``, the cross-attention keys and
        values, i.e. projections of the encoder memory; computed once, then reused.
    """

    def __init__(self) -> None:
        self.length = 0
        # Buffers (B, H, capacity, Dh) whose first `length` positions are filled.
        self._keys: torch.Tensor | None = None
        self._values: torch.Tensor | None = None
        self.memory_keys: torch.Tensor | None = None
        self.memory_values: torch.Tensor | None = None

    @property
    def keys(self) -> torch.Tensor | None:
        return None if self._keys is None else self._keys[:, :, : self.length]

    @property
    def values(self) -> torch.Tensor | None:
        return None if self._values is None else self._values[:, :, : self.length]

    def append(self, keys: torch.Tensor, values: torch.Tensor):
        """Store the new positions' keys and values after the cached ones; return all of them.

        ``torch.cat`` would copy the whole cache at every step; instead the buffers
        double in size when full, so a step writes only its own positions.

        Shapes: keys, values ``(B, H, Tn, Dh)``; returns two ``(B, H, t + Tn, Dh)`` views.
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
        target_keep: ``(B, t)`` bool, False at padded target positions (only when
            the model has a ``pad_id``), so that padded keys stay masked; None while
            no target position has been padded (then no key needs hiding).
        memory_mask: the source padding mask of the first step, ``(B, 1, 1, S)`` or None.
    """

    def __init__(self) -> None:
        self.layers: list[LayerKVCache] = []
        self.target_keep: torch.Tensor | None = None
        self.memory_mask: torch.Tensor | None = None
        # memory_mask converted once for F.scaled_dot_product_attention (see _SDPAMask)
        self._memory_sdpa_mask = None

    @property
    def length(self) -> int:
        """The number of target positions cached so far (the position of the next token)."""
        return self.layers[0].length if self.layers else 0


def _project_key_value(attn: MultiHeadAttention, x: torch.Tensor):
    """Keys and values of ``x`` for ``attn``, split into heads: what the KV cache stores.

    Shapes: x ``(B, L, D)``; returns two ``(B, H, L, Dh)`` tensors.
    """
    keys = split_heads(attn.w_k(x), attn.num_heads)  # (B, L, D) -> (B, H, L, Dh)
    values = split_heads(attn.w_v(x), attn.num_heads)  # (B, L, D) -> (B, H, L, Dh)
    return keys, values


def _attend(attn: MultiHeadAttention, x, keys, values, mask, need_weights: bool):
    """``attn(x, ., .)`` for keys and values that are already projected (taken from a cache).

    The same maths as :class:`MultiHeadAttention`'s forward, minus the key and
    value projections. Shapes: x ``(B, Tn, D)``; keys, values ``(B, H, L, Dh)``;
    returns ``(B, Tn, D)`` and weights ``(B, H, Tn, L)`` or None.
    """
    q = split_heads(attn.w_q(x), attn.num_heads)  # (B, Tn, D) -> (B, H, Tn, Dh)
    p = attn.dropout if attn.training else 0.0
    if need_weights:
        heads, weights = scaled_dot_product_attention(q, keys, values, mask=mask, dropout_p=p)
    else:
        heads, weights = _fused_attention(q, keys, values, mask, p), None
    return attn.w_o(merge_heads(heads)), weights  # (B, H, Tn, Dh) -> (B, Tn, D)


class DecoderLayer(nn.Module):
    """One decoder layer: masked self-attention, cross-attention, feed-forward.

    Cross-attention takes its **queries from the decoder** (the sequence being
    generated) and its **keys and values from the encoder output** ``memory``:
    each target position asks "which source positions matter to me?". (Some
    write-ups reverse this; it is wrong: the output length would then be the
    source length.)

    Matches ``nn.TransformerDecoderLayer(..., batch_first=True,
    norm_first=norm_first)`` with copied weights (``multihead_attn`` there is
    ``cross_attn`` here).

    With a :class:`LayerKVCache` (``cache=``), ``x`` holds only the new positions:
    their keys and values are appended to the cache, the queries attend to every
    cached position, and the memory is projected only once. ``tgt_mask`` then
    covers the new queries against all cached keys, ``(B, H, Tn, t + Tn)``.

    Shapes:
        x: ``(B, T, D)``; memory: ``(B, S, D)``; tgt_mask: broadcastable to
        ``(B, H, T, T)``; memory_mask: broadcastable to ``(B, H, T, S)``.
        returns ``(B, T, D)`` (and ``{"self": (B, H, T, T), "cross": (B, H, T, S)}``
        if ``return_attention``).
    """

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        d_ff: int,
        dropout: float = 0.1,
        norm_first: bool = False,
    ) -> None:
        super().__init__()
        check_probability("dropout", dropout)
        self.norm_first = norm_first
        self.self_attn = MultiHeadAttention(d_model, num_heads, dropout=dropout)
        self.cross_attn = MultiHeadAttention(d_model, num_heads, dropout=dropout)
        self.ffn = PositionwiseFeedForward(d_model, d_ff, dropout=dropout)
        self.norm1 = LayerNorm(d_model)
        self.norm2 = LayerNorm(d_model)
        self.norm3 = LayerNorm(d_model)
        self.dropout1 = nn.Dropout(dropout)
        self.dropout2 = nn.Dropout(dropout)
        self.dropout3 = nn.Dropout(dropout)

    def _self_attention(self, x, mask, need_weights, cache=None):
        if cache is None:
            out, weights = self.self_attn(x, x, x, mask=mask, need_weights=need_weights)
        else:
            # KV cache: project only the new positions, append them to the cached keys and
            # values, and let the new queries attend to all of them.
            keys, values = _project_key_value(self.self_attn, x)  # (B, H, Tn, Dh) each
            keys, values = cache.append(keys, values)  # (B, H, t + Tn, Dh) each
            out, weights = _attend(self.self_attn, x, keys, values, mask, need_weights)
        return self.dropout1(out), weights

    def _cross_attention(self, x, memory, mask, need_weights, cache=None):
        # queries from the decoder (x), keys and values from the encoder (memory)
        if cache is None:
            out, weights = self.cross_attn(x, memory, memory, mask=mask, need_weights=need_weights)
        else:
            if cache.memory_keys is None:  # the memory never changes: project it once
                cache.memory_keys, cache.memory_values = _project_key_value(self.cross_attn, memory)
            keys, values = cache.memory_keys, cache.memory_values  # (B, H, S, Dh) each
            out, weights = _attend(self.cross_attn, x, keys, values, mask, need_weights)
        return self.dropout2(out), weights

    def forward(
        self,
        x: torch.Tensor,
        memory: torch.Tensor,
        tgt_mask: torch.Tensor | None = None,
        memory_mask: torch.Tensor | None = None,
        return_attention: bool = False,
        cache: LayerKVCache | None = None,
    ):
        need = return_attention
        if self.norm_first:
            h, self_w = self._self_attention(self.norm1(x), tgt_mask, need, cache)
            x = x + h
            h, cross_w = self._cross_attention(self.norm2(x), memory, memory_mask, need, cache)
            x = x + h
            x = x + self.dropout3(self.ffn(self.norm3(x)))
        else:
            h, self_w = self._self_attention(x, tgt_mask, need, cache)
            x = self.norm1(x + h)
            h, cross_w = self._cross_attention(x, memory, memory_mask, need, cache)
            x = self.norm2(x + h)
            x = self.norm3(x + self.dropout3(self.ffn(x)))
        if return_attention:
            return x, {"self": self_w, "cross": cross_w}
        return x


class Encoder(nn.Module):
    """A stack of ``num_layers`` :class:`EncoderLayer` (final LayerNorm when pre-norm).

    Matches ``nn.TransformerEncoder`` (with ``norm=nn.LayerNorm(d_model)`` when
    ``norm_first``). The layers are built in a loop, not deep-copied.

    Shapes:
        x: ``(B, S, D)``; mask: broadcastable to ``(B, H, S, S)``; returns ``(B, S, D)``.
    """

    def __init__(
        self,
        num_layers: int,
        d_model: int,
        num_heads: int,
        d_ff: int,
        dropout: float = 0.1,
        norm_first: bool = False,
    ) -> None:
        super().__init__()
        check_positive_int("num_layers", num_layers)
        self.layers = nn.ModuleList(
            EncoderLayer(d_model, num_heads, d_ff, dropout, norm_first) for _ in range(num_layers)
        )
        self.norm = LayerNorm(d_model) if norm_first else None

    def forward(self, x, mask=None, return_attention: bool = False):
        weights = []
        for layer in self.layers:
            if return_attention:
                x, w = layer(x, mask, return_attention=True)
                weights.append(w)
            else:
                x = layer(x, mask)
        if self.norm is not None:
            x = self.norm(x)
        return (x, weights) if return_attention else x


class Decoder(nn.Module):
    """A stack of ``num_layers`` :class:`DecoderLayer` (final LayerNorm when pre-norm).

    Matches ``nn.TransformerDecoder``. With a :class:`KVCache` (``cache=``), ``x``
    holds only the new positions (see :class:`DecoderLayer`).

    Shapes:
        x: ``(B, T, D)``; memory: ``(B, S, D)``; returns ``(B, T, D)``.
    """

    def __init__(
        self,
        num_layers: int,
        d_model: int,
        num_heads: int,
        d_ff: int,
        dropout: float = 0.1,
        norm_first: bool = False,
    ) -> None:
        super().__init__()
        check_positive_int("num_layers", num_layers)
        self.layers = nn.ModuleList(
            DecoderLayer(d_model, num_heads, d_ff, dropout, norm_first) for _ in range(num_layers)
        )
        self.norm = LayerNorm(d_model) if norm_first else None

    def forward(
        self,
        x,
        memory,
        tgt_mask=None,
        memory_mask=None,
        return_attention: bool = False,
        cache: KVCache | None = None,
    ):
        if cache is None:
            layer_caches = [None] * len(self.layers)
        else:
            if not cache.layers:  # first step: one empty cache per layer
                cache.layers = [LayerKVCache() for _ in self.layers]
            if len(cache.layers) != len(self.layers):
                raise ValueError(
                    f"cache: got a KVCache for {len(cache.layers)} layers, expected "
                    f"{len(self.layers)} (use a new KVCache for every decoding run)"
                )
            layer_caches = cache.layers
        weights = []
        for layer, layer_cache in zip(self.layers, layer_caches):
            if return_attention:
                x, w = layer(x, memory, tgt_mask, memory_mask, True, cache=layer_cache)
                weights.append(w)
            else:
                x = layer(x, memory, tgt_mask, memory_mask, cache=layer_cache)
        if self.norm is not None:
            x = self.norm(x)
        return (x, weights) if return_attention else x


class Transformer(nn.Module):
    """The encoder-decoder Transformer for sequence-to-sequence tasks.

    ``src`` tokens -> embedding * sqrt(d_model) + positional encoding -> encoder
    -> ``memory``; ``tgt`` tokens (shifted right, starting with BOS) -> embedding
    -> decoder (masked self-attention, cross-attention to ``memory``) -> linear
    layer -> logits over the target vocabulary. Trained with cross-entropy on
    the next token (teacher forcing); decoded with :func:`greedy_decode`.

    ``forward`` builds the masks itself: the causal mask for the decoder's
    self-attention and, when ``pad_id`` is set, padding masks for the source
    keys (encoder self-attention and cross-attention) and target keys.

    ``nn.Transformer`` has no embeddings, positions or output layer, and always
    ends each stack with a LayerNorm (even in post-norm, where this model, like
    the paper, has none): with ``norm_first=True`` the stacks have the same
    parameters, with ``norm_first=False`` ``nn.Transformer`` has ``4 * d_model`` more.

    Shapes:
        src: ``(B, S)`` token ids; tgt: ``(B, T)`` token ids;
        returns logits ``(B, T, tgt_vocab_size)``.
    """

    def __init__(
        self,
        src_vocab_size: int,
        tgt_vocab_size: int,
        d_model: int = 512,
        num_heads: int = 8,
        num_encoder_layers: int = 6,
        num_decoder_layers: int = 6,
        d_ff: int = 2048,
        dropout: float = 0.1,
        max_len: int = 5000,
        norm_first: bool = False,
        pad_id: int | None = None,
    ) -> None:
        super().__init__()
        check_positive_int("src_vocab_size", src_vocab_size)
        check_positive_int("tgt_vocab_size", tgt_vocab_size)
        check_positive_int("max_len", max_len)
        if pad_id is not None and not (
            isinstance(pad_id, int)
            and not isinstance(pad_id, bool)
            and 0 <= pad_id < min(src_vocab_size, tgt_vocab_size)
        ):
            raise ValueError(
                f"pad_id: got {pad_id!r}, expected None or an int in [0, "
                f"{min(src_vocab_size, tgt_vocab_size)}) (a token id in both vocabularies)"
            )
        self.d_model = d_model
        self.max_len = max_len
        self.pad_id = pad_id
        self.src_vocab_size = src_vocab_size
        self.tgt_vocab_size = tgt_vocab_size
        self.src_embedding = nn.Embedding(src_vocab_size, d_model)
        self.tgt_embedding = nn.Embedding(tgt_vocab_size, d_model)
        self.positional = PositionalEncoding(d_model, max_len, dropout)
        self.encoder = Encoder(num_encoder_layers, d_model, num_heads, d_ff, dropout, norm_first)
        self.decoder = Decoder(num_decoder_layers, d_model, num_heads, d_ff, dropout, norm_first)
        self.output_layer = nn.Linear(d_model, tgt_vocab_size)
        self._reset_parameters()

    def _reset_parameters(self) -> None:
        # Xavier-uniform for every weight matrix, as nn.Transformer does.
        for p in self.parameters():
            if p.dim() > 1:
                nn.init.xavier_uniform_(p)

    # --- validation -----------------------------------------------------------------
    def _check_tokens(self, name: str, tokens: object, vocab_size: int) -> None:
        if not isinstance(tokens, torch.Tensor):
            raise ValueError(f"{name}: got {type(tokens).__name__}, expected a LongTensor (B, L)")
        require_ndim(name, tokens, (2,), "(B, L) token ids")
        if tokens.dtype not in (torch.long, torch.int, torch.int16, torch.int8, torch.uint8):
            raise ValueError(f"{name}: got dtype {tokens.dtype}, expected integer token ids")
        if tokens.shape[1] == 0 or tokens.shape[1] > self.max_len:
            raise ValueError(
                f"{name}: got length {tokens.shape[1]}, expected 1 to max_len={self.max_len} tokens"
            )
        if tokens.numel() and (int(tokens.min()) < 0 or int(tokens.max()) >= vocab_size):
            raise ValueError(
                f"{name}: got token ids in [{int(tokens.min())}, {int(tokens.max())}], "
                f"expected ids in [0, {vocab_size - 1}] (vocabulary size {vocab_size})"
            )

    # --- masks ----------------------------------------------------------------------
    def source_mask(self, src: torch.Tensor) -> torch.Tensor | None:
        """Key-padding mask for the source, ``(B, 1, 1, S)``, or None without ``pad_id``."""
        if self.pad_id is None:
            return None
        return (src != self.pad_id)[:, None, None, :]  # (B, S) -> (B, 1, 1, S)

    def target_mask(self, tgt: torch.Tensor) -> torch.Tensor:
        """Causal mask, combined with target key padding when ``pad_id`` is set.

        Shapes: returns ``(T, T)`` or ``(B, 1, T, T)``.
        """
        mask = causal_mask(tgt.shape[1], device=tgt.device)  # (T, T)
        if self.pad_id is not None:
            keys = (tgt != self.pad_id)[:, None, None, :]  # (B, T) -> (B, 1, 1, T)
            mask = mask & keys  # (T, T) & (B, 1, 1, T) -> (B, 1, T, T)
        return mask

    # --- the model --------------------------------------------------------------------
    def _cached_target_mask(self, tgt: torch.Tensor, cache: KVCache) -> torch.Tensor | None:
        """Mask for ``Tn`` new queries (positions ``t .. t + Tn - 1``) against all ``t + Tn`` keys.

        Records the new tokens' padding in ``cache.target_keep``.
        Shapes: returns None, ``(Tn, t + Tn)`` or ``(B, 1, Tn, t + Tn)``.
        """
        t, Tn = cache.length, tgt.shape[1]
        mask = None
        if Tn > 1:  # query i sits at position t + i and may see keys 0 .. t + i
            mask = torch.ones(Tn, t + Tn, dtype=torch.bool, device=tgt.device).tril(diagonal=t)
        # (A single new query may see every cached key: the causal mask is all True.)
        if self.pad_id is not None:
            keep = tgt != self.pad_id  # (B, Tn)
            if cache.target_keep is None and bool(keep.all()):
                return mask  # nothing padded so far: no key to hide (the usual case)
            if cache.target_keep is None:  # the first padded token: all earlier ones were kept
                cache.target_keep = keep.new_ones((tgt.shape[0], t))
            keep = torch.cat([cache.target_keep, keep], dim=1)  # (B, t + Tn)
            cache.target_keep = keep
            keys = keep[:, None, None, :]  # (B, t + Tn) -> (B, 1, 1, t + Tn)
            mask = keys if mask is None else mask & keys
        return mask

    def _embed(self, embedding: nn.Embedding, tokens: torch.Tensor, start: int = 0) -> torch.Tensor:
        # Multiply by sqrt(d_model), as the paper does (section 3.4, no reason given).
        # One reading: it keeps the embeddings comparable in size to the positional
        # encoding; whether it does depends on the initialisation and the vocabulary
        # size (chapter 9).
        x = embedding(tokens) * math.sqrt(self.d_model)  # (B, L) -> (B, L, D)
        return self.positional(x, start=start)  # positions start, ..., start + L - 1

    def encode(self, src: torch.Tensor, return_attention: bool = False):
        """Encode the source: ``(B, S)`` ids -> memory ``(B, S, D)``."""
        self._check_tokens("src", src, self.src_vocab_size)
        return self._encode(src, return_attention)

    def _encode(self, src: torch.Tensor, return_attention: bool = False):
        """:meth:`encode` after its check."""
        x = self._embed(self.src_embedding, src)
        return self.encoder(x, self.source_mask(src), return_attention=return_attention)

    def decode(
        self,
        tgt: torch.Tensor,
        memory: torch.Tensor,
        src: torch.Tensor | None = None,
        return_attention: bool = False,
        cache: KVCache | None = None,
    ):
        """Decode ``tgt (B, T)`` against ``memory (B, S, D)`` -> logits ``(B, T, V)``.

        Pass the ``src`` ids that produced ``memory`` so that padded source
        positions are masked in cross-attention (needed only with ``pad_id``).

        With ``cache`` (a :class:`KVCache`, empty at the first call), ``tgt`` holds
        only the *new* tokens, which continue at position ``cache.length``; the
        logits are those of the new positions and equal the last ``Tn`` rows of
        decoding the whole prefix at once. Pass the same ``memory`` and ``src``
        every time: the cache keeps what it derived from them at the first call.
        """
        self._check_tokens("tgt", tgt, self.tgt_vocab_size)
        if cache is not None:
            if not isinstance(cache, KVCache):
                raise ValueError(f"cache: got {type(cache).__name__}, expected a KVCache or None")
            if cache.layers and len(cache.layers) != len(self.decoder.layers):
                raise ValueError(
                    f"cache: got a KVCache for {len(cache.layers)} layers, expected "
                    f"{len(self.decoder.layers)} (use a new KVCache for every decoding run)"
                )
            if cache.length + tgt.shape[1] > self.max_len:
                raise ValueError(
                    f"tgt: got {tgt.shape[1]} new tokens after {cache.length} cached positions, "
                    f"expected at most max_len={self.max_len} positions in all"
                )
            if cache.length and cache.layers[0].keys.shape[0] != tgt.shape[0]:
                raise ValueError(
                    f"tgt: got batch size {tgt.shape[0]}, expected "
                    f"{cache.layers[0].keys.shape[0]} to match the cache"
                )
        require_ndim("memory", memory, (3,), f"(B, S, {self.d_model})")
        if memory.shape[0] != tgt.shape[0] or memory.shape[2] != self.d_model:
            raise ValueError(
                f"memory: got shape {shape_str(memory.shape)}, expected "
                f"({tgt.shape[0]}, S, {self.d_model}) to match tgt {shape_str(tgt.shape)}"
            )
        memory_mask = None
        if src is not None:
            self._check_tokens("src", src, self.src_vocab_size)
            if tuple(src.shape) != tuple(memory.shape[:2]):
                raise ValueError(
                    f"src: got shape {shape_str(src.shape)}, expected "
                    f"{shape_str(memory.shape[:2])}, the (B, S) of memory"
                )
            if cache is None or cache.length == 0:  # a cache keeps the first step's mask
                memory_mask = self.source_mask(src)
        return self._decode(tgt, memory, memory_mask, return_attention, cache)

    def _decode(self, tgt, memory, memory_mask, return_attention=False, cache=None):
        """:meth:`decode` after its checks, with the source mask already built.

        :func:`greedy_decode` checks its inputs once and then calls this at every step.
        """
        if cache is None:
            start, tgt_mask = 0, self.target_mask(tgt)
        else:
            start = cache.length
            if start == 0:  # the first step: keep the source mask for the whole run
                cache.memory_mask = memory_mask
                if memory_mask is not None:
                    cache._memory_sdpa_mask = _prepare_sdpa_mask(memory_mask, memory.dtype)
            memory_mask = cache.memory_mask
            tgt_mask = self._cached_target_mask(tgt, cache)
            if not return_attention:
                # The fused attention path: convert each mask once for all layers, not per layer.
                memory_mask = cache._memory_sdpa_mask
                if tgt_mask is not None:
                    tgt_mask = _prepare_sdpa_mask(tgt_mask, memory.dtype)
        y = self._embed(self.tgt_embedding, tgt, start=start)
        out = self.decoder(
            y, memory, tgt_mask, memory_mask, return_attention=return_attention, cache=cache
        )
        if return_attention:
            out, weights = out
            return self.output_layer(out), weights
        return self.output_layer(out)  # (B, T, D) -> (B, T, V)

    def forward(self, src: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        """Teacher-forced logits: position ``t`` predicts ``tgt[:, t + 1]``."""
        self._check_tokens("src", src, self.src_vocab_size)
        self._check_tokens("tgt", tgt, self.tgt_vocab_size)
        if src.shape[0] != tgt.shape[0]:
            raise ValueError(
                f"tgt: got batch size {tgt.shape[0]}, expected {src.shape[0]} to match src"
            )
        memory = self._encode(src)  # the ids were checked above: skip encode's and decode's checks
        return self._decode(tgt, memory, self.source_mask(src))


def greedy_decode(
    model: Transformer,
    src: torch.Tensor,
    max_len: int,
    bos_id: int,
    eos_id: int,
    *,
    use_cache: bool = True,
) -> torch.Tensor:
    """Generate with the most likely next token at every step.

    Starts each sequence with ``bos_id`` and appends ``argmax`` of the logits
    for the last position until a sequence has produced ``eos_id`` (it is then
    padded with ``model.pad_id``, or ``eos_id`` when the model has none) or
    ``max_len`` tokens exist. Runs in evaluation mode (dropout off) and under
    ``torch.inference_mode()`` (no autograd bookkeeping), and restores the
    model's previous mode afterwards.

    The encoder runs once. With ``use_cache=True`` (the default) the decoder keeps
    a :class:`KVCache` and processes only the newest token at each step; with
    ``use_cache=False`` it re-decodes the whole prefix every time, which gives
    the same tokens but does ``t`` positions of work at step ``t`` instead of one.

    Shapes:
        src: ``(B, S)``; returns a LongTensor ``(B, L)`` with ``L <= max_len``,
        ``[:, 0] == bos_id``.
    """
    if not isinstance(model, Transformer):
        raise ValueError(f"model: got {type(model).__name__}, expected a Transformer")
    check_positive_int("max_len", max_len)
    if max_len > model.max_len:
        raise ValueError(
            f"max_len: got {max_len}, expected at most the model's max_len={model.max_len}"
        )
    for name, token in (("bos_id", bos_id), ("eos_id", eos_id)):
        if (
            not isinstance(token, int)
            or isinstance(token, bool)
            or not 0 <= token < model.tgt_vocab_size
        ):
            raise ValueError(
                f"{name}: got {token!r}, expected a token id in [0, {model.tgt_vocab_size - 1}]"
            )
    model._check_tokens("src", src, model.src_vocab_size)
    if not isinstance(use_cache, bool):
        raise ValueError(f"use_cache: got {use_cache!r}, expected True or False")
    pad = model.pad_id if model.pad_id is not None else eos_id
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            out = _greedy_loop(model, src, max_len, bos_id, eos_id, pad, use_cache)
    finally:
        model.train(was_training)
    # A clone made outside inference mode is an ordinary tensor, usable in training later.
    return out.clone()


def _greedy_loop(model, src, max_len, bos_id, eos_id, pad, use_cache):
    """The loop of :func:`greedy_decode`, after its checks."""
    memory = model._encode(src)  # computed once, reused at every step
    memory_mask = model.source_mask(src)  # (B, 1, 1, S) or None, also reused
    cache = KVCache() if use_cache else None
    B = src.shape[0]
    out = torch.full((B, max_len), pad, dtype=torch.long, device=src.device)
    out[:, 0] = bos_id
    finished = torch.zeros(B, dtype=torch.bool, device=src.device)
    for t in range(1, max_len):  # out[:, :t] is decoded; predict out[:, t]
        if cache is not None:
            # Only the newest token goes in; the cache holds the keys and values of the rest.
            logits = model._decode(out[:, t - 1 : t], memory, memory_mask, cache=cache)  # (B, 1, V)
        else:
            logits = model._decode(out[:, :t], memory, memory_mask)  # (B, t, V): the whole prefix
        next_token = logits[:, -1].argmax(dim=-1)  # (B,)
        out[:, t] = next_token.masked_fill(finished, pad)  # pad after EOS
        finished |= next_token == eos_id
        if bool(finished.all()):
            return out[:, : t + 1]
    return out
