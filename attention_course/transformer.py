"""The encoder-decoder Transformer (Vaswani et al., 2017), built from the
course's own pieces: :class:`MultiHeadAttention`, :class:`PositionwiseFeedForward`,
:class:`LayerNorm` and :class:`PositionalEncoding`.

Post-norm (``norm_first=False``, the paper): ``x = LayerNorm(x + Sublayer(x))``.
Pre-norm (``norm_first=True``): ``x = x + Sublayer(LayerNorm(x))``, with a final
LayerNorm after the stack; it trains more easily when deep.
"""

from __future__ import annotations

import torch
from torch import nn

from ._validate import check_positive_int, check_probability, require_ndim, shape_str
from .embedding import check_token_ids, embed_tokens, xavier_init_
from .ffn import PositionwiseFeedForward
from .fused import AttentionMask
from .kv_cache import KVCache, LayerKVCache
from .masking import causal_mask
from .multihead import MultiHeadAttention
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
        # With a KV cache, x holds the new positions; their keys and values join the cached
        # ones (the layer's cache *is* its self-attention's AttentionCache).
        slot = {} if cache is None else {"cache": cache}
        out, weights = self.self_attn(x, x, x, mask=mask, need_weights=need_weights, **slot)
        return self.dropout1(out), weights

    def _cross_attention(self, x, memory, mask, need_weights, cache=None):
        # queries from the decoder (x), keys and values from the encoder (memory)
        slot = {} if cache is None else {"cache": cache.memory}  # the memory, projected once
        out, weights = self.cross_attn(
            x, memory, memory, mask=mask, need_weights=need_weights, **slot
        )
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


class _LayerStack(nn.Module):
    """``num_layers`` layers of ``layer_type``, built in a loop (not deep-copied), then a
    final LayerNorm when ``norm_first`` (the stacks of ``nn.Transformer`` with pre-norm)."""

    layer_type: type[nn.Module]

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
            self.layer_type(d_model, num_heads, d_ff, dropout, norm_first)
            for _ in range(num_layers)
        )
        self.norm = LayerNorm(d_model) if norm_first else None

    def _run(self, x, *args, return_attention: bool = False, caches=None):
        """Apply the layers in turn; collect their attention weights if asked."""
        weights = []
        for i, layer in enumerate(self.layers):
            kwargs = {"return_attention": True} if return_attention else {}
            if caches is not None:
                kwargs["cache"] = caches[i]
            x = layer(x, *args, **kwargs)
            if return_attention:
                x, w = x
                weights.append(w)
        if self.norm is not None:
            x = self.norm(x)
        return (x, weights) if return_attention else x


class Encoder(_LayerStack):
    """A stack of ``num_layers`` :class:`EncoderLayer` (final LayerNorm when pre-norm).

    Matches ``nn.TransformerEncoder`` (with ``norm=nn.LayerNorm(d_model)`` when
    ``norm_first``). Arguments: ``(num_layers, d_model, num_heads, d_ff, dropout=0.1,
    norm_first=False)``.

    Shapes:
        x: ``(B, S, D)``; mask: broadcastable to ``(B, H, S, S)``; returns ``(B, S, D)``
        (and a list of per-layer weights ``(B, H, S, S)`` if ``return_attention``).
    """

    layer_type = EncoderLayer

    def forward(self, x, mask=None, return_attention: bool = False):
        return self._run(x, mask, return_attention=return_attention)


class Decoder(_LayerStack):
    """A stack of ``num_layers`` :class:`DecoderLayer` (final LayerNorm when pre-norm).

    Matches ``nn.TransformerDecoder``; same arguments as :class:`Encoder`. With a
    :class:`KVCache` (``cache=``), ``x`` holds only the new positions (see
    :class:`DecoderLayer`).

    Shapes:
        x: ``(B, T, D)``; memory: ``(B, S, D)``; returns ``(B, T, D)``.
    """

    layer_type = DecoderLayer

    def forward(
        self,
        x,
        memory,
        tgt_mask=None,
        memory_mask=None,
        return_attention: bool = False,
        cache: KVCache | None = None,
    ):
        if cache is not None and len(cache.layers) != len(self.layers):
            raise ValueError(
                f"cache: got a KVCache for {len(cache.layers)} layers, expected "
                f"{len(self.layers)} (start it with cache.start, or use Transformer.decode)"
            )
        caches = None if cache is None else cache.layers
        args = (memory, tgt_mask, memory_mask)
        return self._run(x, *args, return_attention=return_attention, caches=caches)


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
        for name, n in (("src_vocab_size", src_vocab_size), ("tgt_vocab_size", tgt_vocab_size)):
            check_positive_int(name, n)
        check_positive_int("max_len", max_len)
        _check_pad_id(pad_id, min(src_vocab_size, tgt_vocab_size))
        self.d_model, self.max_len, self.pad_id = d_model, max_len, pad_id
        self.src_vocab_size, self.tgt_vocab_size = src_vocab_size, tgt_vocab_size
        self.src_embedding = nn.Embedding(src_vocab_size, d_model)
        self.tgt_embedding = nn.Embedding(tgt_vocab_size, d_model)
        self.positional = PositionalEncoding(d_model, max_len, dropout)
        self.encoder = Encoder(num_encoder_layers, d_model, num_heads, d_ff, dropout, norm_first)
        self.decoder = Decoder(num_decoder_layers, d_model, num_heads, d_ff, dropout, norm_first)
        self.output_layer = nn.Linear(d_model, tgt_vocab_size)
        xavier_init_(self)

    def _check_ids(self, name: str, tokens) -> None:
        vocab_size = self.src_vocab_size if name == "src" else self.tgt_vocab_size
        check_token_ids(name, tokens, vocab_size, self.max_len)

    def source_mask(self, src: torch.Tensor) -> torch.Tensor | None:
        """Key-padding mask for the source, ``(B, 1, 1, S)``, or None without ``pad_id``."""
        return None if self.pad_id is None else _key_mask(src != self.pad_id)

    def target_mask(self, tgt: torch.Tensor) -> torch.Tensor:
        """Causal mask ``(T, T)``, and target key padding ``(B, 1, T, T)`` with ``pad_id``."""
        keep = None if self.pad_id is None else tgt != self.pad_id  # (B, T)
        return _with_keys(causal_mask(tgt.shape[1], tgt.device), keep)

    def encode(self, src: torch.Tensor, return_attention: bool = False):
        """Encode the source: ``(B, S)`` ids -> memory ``(B, S, D)``."""
        self._check_ids("src", src)
        return self._encode(src, AttentionMask(self.source_mask(src)), return_attention)

    def _encode(self, src, src_mask: AttentionMask, return_attention: bool = False):
        """:meth:`encode` after its checks, with the source mask built (once, for every layer)."""
        x = embed_tokens(self.src_embedding, self.positional, src)
        return self.encoder(x, src_mask, return_attention=return_attention)

    def decode(
        self,
        tgt: torch.Tensor,
        memory: torch.Tensor,
        src: torch.Tensor | None = None,
        return_attention: bool = False,
        cache: KVCache | None = None,
    ):
        """Decode ``tgt (B, T)`` against ``memory (B, S, D)`` -> logits ``(B, T, V)``.

        Pass the ``src`` ids that produced ``memory`` so that padded source positions
        are masked in cross-attention (needed only with ``pad_id``). With ``cache`` (a
        :class:`KVCache`, empty at the first call), ``tgt`` holds only the *new* tokens,
        which continue at position ``cache.length``; their logits equal the last ``Tn``
        rows of decoding the whole prefix at once. Pass the same ``memory`` and ``src``
        every time: the cache keeps what it derived from them at the first call.
        """
        self._check_ids("tgt", tgt)
        _check_decode_inputs(self, tgt, memory, src, cache)
        # the source mask is kept by a cache at its first step: built only when needed
        needed = src is not None and (cache is None or cache.length == 0)
        memory_mask = self.source_mask(src) if needed else None
        return self._decode(tgt, memory, memory_mask, return_attention, cache)

    def _decode(self, tgt, memory, memory_mask, return_attention=False, cache=None):
        """:meth:`decode` after its checks (:func:`greedy_decode` calls it at every step)."""
        # Each mask is built once, as one AttentionMask, and given to every layer (which
        # converts it for the fused kernel at most once).
        if cache is None:
            start, tgt_mask = 0, AttentionMask(self.target_mask(tgt))
            if not isinstance(memory_mask, AttentionMask):
                memory_mask = AttentionMask(memory_mask)
        else:  # the new tokens continue where the cache ends
            start, keep = cache.length, None if self.pad_id is None else tgt != self.pad_id
            keep = cache.begin_step(len(self.decoder.layers), memory_mask, keep)
            tgt_mask = AttentionMask(_step_mask(tgt.shape[1], start, keep, tgt.device))
            memory_mask = cache.memory_mask  # the first step's, converted once for the run
        y = embed_tokens(self.tgt_embedding, self.positional, tgt, start=start)
        out = self.decoder(y, memory, tgt_mask, memory_mask, return_attention, cache=cache)
        if return_attention:
            return self.output_layer(out[0]), out[1]
        return self.output_layer(out)  # (B, T, D) -> (B, T, V)

    def forward(self, src: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        """Teacher-forced logits: position ``t`` predicts ``tgt[:, t + 1]``."""
        self._check_ids("src", src)
        self._check_ids("tgt", tgt)
        if src.shape[0] != tgt.shape[0]:
            raise ValueError(
                f"tgt: got batch size {tgt.shape[0]}, expected {src.shape[0]} to match src"
            )
        # One source mask: the encoder's self-attention and the decoder's cross-attention
        # hide the same padded source keys.
        src_mask = AttentionMask(self.source_mask(src))
        return self._decode(tgt, self._encode(src, src_mask), src_mask)


def _step_mask(Tn: int, t: int, keep: torch.Tensor | None, device) -> torch.Tensor | None:
    """Mask of ``Tn`` new queries (positions ``t .. t + Tn - 1``) against all ``t + Tn`` keys.

    ``keep (B, t + Tn)`` hides padded keys. Returns None, ``(Tn, t + Tn)`` or
    ``(B, 1, Tn, t + Tn)``: a single new query may see every key, so it needs no causal mask.
    """
    causal = causal_mask(Tn, device, S=t + Tn) if Tn > 1 else None
    return _with_keys(causal, keep)


def _key_mask(keep: torch.Tensor) -> torch.Tensor:
    """``keep (B, S)`` (True at real tokens) as a key mask ``(B, 1, 1, S)``."""
    return keep[:, None, None, :]


def _with_keys(mask: torch.Tensor | None, keep: torch.Tensor | None) -> torch.Tensor | None:
    """``mask`` (or everything, if None) and the keys where ``keep (B, S)`` is True."""
    if keep is None:
        return mask
    keys = _key_mask(keep)  # (B, S) -> (B, 1, 1, S)
    return keys if mask is None else mask & keys  # (T, S) & (B, 1, 1, S) -> (B, 1, T, S)


def _is_token_id(token: object, vocab_size: int) -> bool:
    return isinstance(token, int) and not isinstance(token, bool) and 0 <= token < vocab_size


def _check_pad_id(pad_id: object, vocab_size: int) -> None:
    if pad_id is not None and not _is_token_id(pad_id, vocab_size):
        raise ValueError(
            f"pad_id: got {pad_id!r}, expected None or an int in [0, {vocab_size}) "
            f"(a token id in both vocabularies)"
        )


def _check_token_id(name: str, token: object, vocab_size: int) -> None:
    if not _is_token_id(token, vocab_size):
        raise ValueError(f"{name}: got {token!r}, expected a token id in [0, {vocab_size - 1}]")


def _check_decode_inputs(model: Transformer, tgt, memory, src, cache) -> None:
    """The checks of :meth:`Transformer.decode` beyond the target ids."""
    if cache is not None:
        if not isinstance(cache, KVCache):
            raise ValueError(f"cache: got {type(cache).__name__}, expected a KVCache or None")
        layers = len(model.decoder.layers)
        if cache.layers and len(cache.layers) != layers:
            raise ValueError(
                f"cache: got a KVCache for {len(cache.layers)} layers, expected "
                f"{layers} (use a new KVCache for every decoding run)"
            )
        if cache.length + tgt.shape[1] > model.max_len:
            raise ValueError(
                f"tgt: got {tgt.shape[1]} new tokens after {cache.length} cached positions, "
                f"expected at most max_len={model.max_len} positions in all"
            )
        if cache.length and cache.layers[0].keys.shape[0] != tgt.shape[0]:
            raise ValueError(
                f"tgt: got batch size {tgt.shape[0]}, expected "
                f"{cache.layers[0].keys.shape[0]} to match the cache"
            )
    D = model.d_model
    require_ndim("memory", memory, (3,), f"(B, S, {D})")
    if memory.shape[0] != tgt.shape[0] or memory.shape[2] != D:
        raise ValueError(
            f"memory: got shape {shape_str(memory.shape)}, expected "
            f"({tgt.shape[0]}, S, {D}) to match tgt {shape_str(tgt.shape)}"
        )
    if src is not None:
        model._check_ids("src", src)
        if tuple(src.shape) != tuple(memory.shape[:2]):
            raise ValueError(
                f"src: got shape {shape_str(src.shape)}, expected "
                f"{shape_str(memory.shape[:2])}, the (B, S) of memory"
            )


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
    _check_token_id("bos_id", bos_id, model.tgt_vocab_size)
    _check_token_id("eos_id", eos_id, model.tgt_vocab_size)
    model._check_ids("src", src)
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
    # the source mask ((B, 1, 1, S) or none) and the memory: built once, reused at every step
    memory_mask = AttentionMask(model.source_mask(src))
    memory = model._encode(src, memory_mask)  # src was checked by greedy_decode
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
