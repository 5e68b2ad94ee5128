"""Multi-head latent attention (chapter 18): keys and values compressed into one latent.

Chapter 15 made the KV cache smaller by sharing key/value heads: ``2 · Hkv · Dh`` numbers
per token per layer. Multi-head latent attention (多头潜在注意力, MLA; DeepSeek-AI, 2024,
"DeepSeek-V2: A Strong, Economical, and Efficient Mixture-of-Experts Language Model",
arXiv:2405.04434, §2.1) caches instead a low-rank (低秩) latent ``c = kv_norm(W_DKV x)`` of
``kv_rank`` numbers, from which every head's keys and values are up-projected
(``W_UK``, ``W_UV``), plus one rotary key of ``d_rope`` numbers shared by all heads:
``kv_rank + d_rope`` numbers per token per layer.

Why the extra rotary key: at decoding time the up-projection ``W_UK`` can be folded into
the queries (``q · (W_UK c) = (W_UK^T q) · c``), so attention runs over the cached latent
and the keys are never built. RoPE would sit between the two matrices
(``q^T R_m^T R_n W_UK c``): ``R_n`` depends on the key's position, so ``W_UK`` could not be
folded once. MLA therefore leaves the latent's keys unrotated (``k_nope``) and adds a
small decoupled rotary part: ``q = [q_nope | q_rope]``, ``k = [k_nope | k_rope]``.

:func:`cache_per_token` counts what a token costs in the cache of one layer for MHA, GQA,
MQA and MLA.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ._validate import check_positive_int, require_float, require_ndim, shape_str
from .masking import causal_mask
from .norms import RMSNorm
from .relative_positions import _check_base, _rope_frequencies, _rotate


def _check_width(name: str, value: object, default: int | float, even: bool = False) -> int:
    """``value`` (or ``default`` when None) as a positive int; ``even``: divisible by 2."""
    if value is None:
        value = default
        if not float(value).is_integer() or value < 1:
            raise ValueError(
                f"{name}: its default {value!r} is not a positive int for these d_model and "
                f"num_heads; pass {name} explicitly"
            )
        value = int(value)
    check_positive_int(name, value)
    if even and value % 2 != 0:
        raise ValueError(f"{name}: got {value}, expected an even number (RoPE rotates pairs)")
    return value


class LatentCache:
    """What one :class:`MultiHeadLatentAttention` layer keeps between decoding steps.

    Only the latent (after ``kv_norm``) and the shared rotary key (already rotated at its
    absolute position) of every position seen: ``kv_rank + d_rope`` numbers per token,
    whatever the number of heads. The keys and values of the heads are never stored.
    As :class:`~attention_course.kv_cache.AttentionCache`, the buffers double when full so
    that a step writes only its own positions.

    Hugging Face's ``DeepseekV3Attention`` caches the same two tensors (as single-head
    ``(B, 1, S, .)`` tensors) and expands them into keys and values at every step, as
    :meth:`MultiHeadLatentAttention.forward` does with ``absorbed=False``.

    Attributes:
        latent: ``(B, length, kv_rank)``, or None while empty.
        k_rope: ``(B, length, d_rope)``, or None while empty.
        length: the number of positions seen (the position of the next token).
    """

    def __init__(self) -> None:
        self.length = 0
        self._latent: torch.Tensor | None = None  # (B, capacity, kv_rank)
        self._k_rope: torch.Tensor | None = None  # (B, capacity, d_rope)

    @property
    def latent(self) -> torch.Tensor | None:
        return None if self._latent is None else self._latent[:, : self.length]

    @property
    def k_rope(self) -> torch.Tensor | None:
        return None if self._k_rope is None else self._k_rope[:, : self.length]

    @property
    def nbytes(self) -> int:
        """Bytes held by the two buffers (their allocated capacity)."""
        if self._latent is None:
            return 0
        return sum(b.numel() * b.element_size() for b in (self._latent, self._k_rope))

    def update(self, latent: torch.Tensor, k_rope: torch.Tensor):
        """Append the new positions; return every cached latent and rotary key.

        Shapes: latent ``(B, Tn, kv_rank)``, k_rope ``(B, Tn, d_rope)``; returns
        ``(B, length, kv_rank)`` and ``(B, length, d_rope)`` views.
        """
        t, Tn = self.length, latent.shape[1]
        if self._latent is None or t + Tn > self._latent.shape[1]:
            capacity = max(2 * (t + Tn), 64)
            self._latent = _grow(self._latent, latent, t, capacity)
            self._k_rope = _grow(self._k_rope, k_rope, t, capacity)
        self._latent[:, t : t + Tn] = latent
        self._k_rope[:, t : t + Tn] = k_rope
        self.length = t + Tn
        return self.latent, self.k_rope


def _grow(buffer: torch.Tensor | None, new: torch.Tensor, filled: int, capacity: int):
    """A ``(B, capacity, n)`` buffer holding the first ``filled`` positions of ``buffer``."""
    grown = new.new_empty((new.shape[0], capacity, new.shape[2]))
    if buffer is not None:
        grown[:, :filled] = buffer[:, :filled]
    return grown


class MultiHeadLatentAttention(nn.Module):
    """Multi-head latent attention (DeepSeek-V2, arXiv:2405.04434, §2.1; also DeepSeek-V3).

    Causal self-attention whose keys and values come from a shared low-rank latent.
    For an input ``x (B, T, D)`` (``D = d_model``, ``H = num_heads``, ``r = kv_rank``):

    - queries: ``w_q(x)`` when ``q_rank`` is None, else ``w_uq(q_norm(w_dq(x)))`` (the
      queries compressed too, as in the paper, to save activations in training); per head
      ``q = [q_nope (d_nope) | q_rope (d_rope)]``;
    - ``w_dkv(x) = [a (r) | k_rope (d_rope)]``: the latent ``c = kv_norm(a)``, and one
      rotary key shared by every head;
    - ``w_ukv(c)``: per head ``[k_nope (d_nope) | v (d_v)]``: the up-projections ``W_UK``
      and ``W_UV`` stacked, head by head;
    - ``q_rope`` and ``k_rope`` rotated by :func:`~attention_course.apply_rope`'s half-split
      rotation at absolute positions (``cache.length + t``); keys ``[k_nope | k_rope]``;
      scores scaled by ``(d_nope + d_rope)^-1/2``; causal; heads merged, then ``w_o``.

    ``forward(x, absorbed=True)`` computes the same output without building the keys and
    values: ``W_UK`` is folded into the queries (``q_nope -> W_UK^T q_nope``, ``r`` numbers
    per head), attention runs over the latent itself (keys ``[c | k_rope]``, values ``c``,
    one key/value "head" shared by all query heads, as multi-query attention), and ``W_UV``
    is applied after the weighted sum. Equal to the naive form to rounding error (1e-5 in
    float32): it is the paper's inference form.

    Every ``nn.Linear`` is bias-free. Defaults: ``d_nope = d_v = D / H``,
    ``d_rope = D / (2H)``.

    Hugging Face counterpart: ``DeepseekV3Attention``
    (``transformers.models.deepseek_v3``) with ``rope_interleave=False`` and its weights
    ``q_a_proj, q_a_layernorm, q_b_proj`` (or ``q_proj``), ``kv_a_proj_with_mqa,
    kv_a_layernorm, kv_b_proj, o_proj`` = ``w_dq, q_norm, w_uq`` (or ``w_q``), ``w_dkv,
    kv_norm, w_ukv, w_o``. DeepSeek's released weights use the interleaved RoPE layout
    (HF's default ``rope_interleave=True``): chapter 14's permutation of the rotary
    features converts them.

    Raises:
        ValueError: a width that is not a positive int, ``d_rope`` odd (or its default
        ``D / (2H)`` not an integer), a bad ``rope_base``, a bad ``x`` or ``cache``.

    Shapes:
        x: ``(B, T, D)``; returns ``(B, T, D)``.
    """

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        kv_rank: int,
        q_rank: int | None = None,
        d_nope: int | None = None,
        d_rope: int | None = None,
        d_v: int | None = None,
        rope_base: float = 10000.0,
        eps: float = 1e-6,
    ) -> None:
        super().__init__()
        check_positive_int("d_model", d_model)
        check_positive_int("num_heads", num_heads)
        check_positive_int("kv_rank", kv_rank)
        if q_rank is not None:
            check_positive_int("q_rank", q_rank)
        d_nope = _check_width("d_nope", d_nope, d_model / num_heads)
        d_rope = _check_width("d_rope", d_rope, d_model / (2 * num_heads), even=True)
        d_v = _check_width("d_v", d_v, d_model / num_heads)
        _check_base(rope_base)
        self.d_model, self.num_heads, self.kv_rank, self.q_rank = (
            d_model,
            num_heads,
            kv_rank,
            q_rank,
        )
        self.d_nope, self.d_rope, self.d_v = d_nope, d_rope, d_v
        self.rope_base = rope_base
        self.d_qk = d_nope + d_rope  # width of one head's query and key
        self.scale = self.d_qk**-0.5
        H = num_heads
        if q_rank is None:
            self.w_q = nn.Linear(d_model, H * self.d_qk, bias=False)
        else:  # queries through their own low-rank bottleneck
            self.w_dq = nn.Linear(d_model, q_rank, bias=False)
            self.q_norm = RMSNorm(q_rank, eps)
            self.w_uq = nn.Linear(q_rank, H * self.d_qk, bias=False)
        self.w_dkv = nn.Linear(d_model, kv_rank + d_rope, bias=False)  # [latent | k_rope]
        self.kv_norm = RMSNorm(kv_rank, eps)
        self.w_ukv = nn.Linear(kv_rank, H * (d_nope + d_v), bias=False)  # per head [k_nope | v]
        self.w_o = nn.Linear(H * d_v, d_model, bias=False)

    def new_cache(self) -> LatentCache:
        """An empty :class:`LatentCache` for this layer."""
        return LatentCache()

    def forward(
        self, x: torch.Tensor, cache: LatentCache | None = None, absorbed: bool = False
    ) -> torch.Tensor:
        """Causal attention of ``x`` (after the ``cache``'s positions, which it extends).

        ``absorbed``: False builds every head's keys and values from the latent (the
        training form); True folds ``W_UK`` and ``W_UV`` around attention over the latent
        (the inference form). Same output.
        """
        require_float("x", x)
        require_ndim("x", x, (3,), f"(B, T, {self.d_model})")
        if x.shape[-1] != self.d_model:
            raise ValueError(
                f"x: got shape {shape_str(x.shape)}, expected (B, T, d_model={self.d_model})"
            )
        if cache is not None and not isinstance(cache, LatentCache):
            raise ValueError(
                f"cache: got {type(cache).__name__}, expected a LatentCache (new_cache() makes one)"
            )
        if not isinstance(absorbed, bool):
            raise ValueError(f"absorbed: got {absorbed!r}, expected True or False")
        B, T, _ = x.shape
        H = self.num_heads
        start = 0 if cache is None else cache.length  # positions already cached

        # Queries: (B, T, D) -> (B, H, T, d_nope + d_rope), per head [q_nope | q_rope]
        q = self.w_q(x) if self.q_rank is None else self.w_uq(self.q_norm(self.w_dq(x)))
        q = q.view(B, T, H, self.d_qk).transpose(1, 2)
        q_nope, q_rope = q.split([self.d_nope, self.d_rope], dim=-1)

        # The latent and the shared rotary key: (B, T, D) -> (B, T, r + d_rope)
        latent, k_rope = self.w_dkv(x).split([self.kv_rank, self.d_rope], dim=-1)
        latent = self.kv_norm(latent)  # (B, T, r): what the cache keeps

        # RoPE on the rotary parts only, at absolute positions start .. start + T - 1
        positions = torch.arange(start, start + T, device=x.device)  # (T,)
        inv_freq = _rope_frequencies(self.d_rope, self.rope_base, x)  # (d_rope/2,)
        q_rope = _rotate(q_rope, positions, inv_freq)  # (B, H, T, d_rope)
        k_rope = _rotate(k_rope, positions, inv_freq)  # (B, T, d_rope), one for all heads

        if cache is not None:
            latent, k_rope = cache.update(latent, k_rope)  # (B, S, r), (B, S, d_rope)
        S = latent.shape[1]
        # The last T of S positions: query i sees keys j <= i + S - T (None: a single
        # new query sees every key)
        mask = None if T == 1 else causal_mask(T, x.device, S=S)  # (T, S)
        if absorbed:
            heads = self._attend_absorbed(q_nope, q_rope, latent, k_rope, mask)
        else:
            heads = self._attend_naive(q_nope, q_rope, latent, k_rope, mask)
        # (B, H, T, d_v) -> (B, T, H * d_v) -> (B, T, D)
        return self.w_o(heads.transpose(1, 2).reshape(B, T, H * self.d_v))

    def _attend_naive(self, q_nope, q_rope, latent, k_rope, mask):
        """Build every head's keys and values from the latent, then attend (the training
        form): ``(B, H, T, d_nope)``, ``(B, H, T, d_rope)``, ``(B, S, r)``, ``(B, S, d_rope)``
        -> ``(B, H, T, d_v)``."""
        B, S, _ = latent.shape
        H = self.num_heads
        kv = self.w_ukv(latent).view(B, S, H, self.d_nope + self.d_v).transpose(1, 2)
        k_nope, v = kv.split([self.d_nope, self.d_v], dim=-1)  # (B, H, S, d_nope), (B, H, S, d_v)
        k_rope = k_rope[:, None].expand(B, H, S, self.d_rope)  # shared by every head
        q = torch.cat([q_nope, q_rope], dim=-1)  # (B, H, T, d_nope + d_rope)
        k = torch.cat([k_nope, k_rope], dim=-1)  # (B, H, S, d_nope + d_rope)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.scale)

    def _attend_absorbed(self, q_nope, q_rope, latent, k_rope, mask):
        """Attention over the latent, ``W_UK`` folded into the queries and ``W_UV`` applied
        after the weighted sum (the inference form); same shapes as :meth:`_attend_naive`.

        ``q_nope · k_nope = q_nope · (W_UK c) = (W_UK^T q_nope) · c``: a query of ``r``
        numbers per head meets the cached latent directly. Likewise
        ``sum_j w_j (W_UV c_j) = W_UV (sum_j w_j c_j)``.
        """
        B, H, T, _ = q_nope.shape
        S, r = latent.shape[1], self.kv_rank
        w_ukv = self.w_ukv.weight.view(H, self.d_nope + self.d_v, r)  # per head [W_UK; W_UV]
        w_uk, w_uv = w_ukv.split([self.d_nope, self.d_v], dim=1)  # (H, d_nope, r), (H, d_v, r)
        q_latent = q_nope @ w_uk  # (B, H, T, d_nope) @ (H, d_nope, r) -> (B, H, T, r)
        # Every head meets the same keys [c | k_rope]: stack the heads' queries on one axis,
        # (B, H, T, .) -> (B, H * T, .), so that one product per sequence reads the cache
        # once (a broadcast over H would copy the cache H times).
        scores = q_latent.reshape(B, H * T, r) @ latent.transpose(1, 2)  # (B, H*T, S)
        scores = scores + q_rope.reshape(B, H * T, self.d_rope) @ k_rope.transpose(1, 2)
        scores = scores.view(B, H, T, S) * self.scale
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))  # the diagonal is always visible
        weights = torch.softmax(scores, dim=-1)  # (B, H, T, S)
        mixed = (weights.view(B, H * T, S) @ latent).view(B, H, T, r)  # sum_j w_j c_j
        return mixed @ w_uv.transpose(1, 2)  # (B, H, T, r) @ (H, r, d_v) -> (B, H, T, d_v)

    def extra_repr(self) -> str:
        return (
            f"d_model={self.d_model}, num_heads={self.num_heads}, kv_rank={self.kv_rank}, "
            f"q_rank={self.q_rank}, d_nope={self.d_nope}, d_rope={self.d_rope}, d_v={self.d_v}"
        )


def cache_per_token(
    *,
    num_kv_heads: int | None = None,
    d_head: int | None = None,
    kv_rank: int | None = None,
    d_rope: int | None = None,
    dtype: torch.dtype | None = None,
) -> int:
    """What one token costs in the cache of one layer: numbers, or bytes with ``dtype``.

    - MHA, GQA, MQA (chapter 15): ``num_kv_heads`` and ``d_head`` give
      ``2 · Hkv · Dh`` numbers (a key and a value per key/value head; MHA: ``Hkv = H``,
      MQA: ``Hkv = 1``);
    - MLA: ``kv_rank`` and ``d_rope`` give ``kv_rank + d_rope`` numbers (the latent and
      the shared rotary key).

    Multiply by the number of layers for a model, and by the batch and length for a
    cache. ``dtype`` (e.g. ``torch.bfloat16``) returns bytes instead of numbers.

    Raises:
        ValueError: neither or both pairs given, or a count that is not a positive int.
    """
    attention = num_kv_heads is not None or d_head is not None
    latent = kv_rank is not None or d_rope is not None
    if attention == latent:
        raise ValueError(
            "num_kv_heads: give num_kv_heads and d_head (MHA, GQA, MQA) or kv_rank and d_rope "
            "(MLA), not both and not neither"
        )
    if attention:
        check_positive_int("num_kv_heads", num_kv_heads)
        check_positive_int("d_head", d_head)
        numbers = 2 * num_kv_heads * d_head
    else:
        check_positive_int("kv_rank", kv_rank)
        if d_rope is None or isinstance(d_rope, bool) or not isinstance(d_rope, int) or d_rope < 0:
            raise ValueError(f"d_rope: got {d_rope!r}, expected an int >= 0")
        numbers = kv_rank + d_rope
    if dtype is None:
        return numbers
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"dtype: got {dtype!r}, expected None or a torch.dtype")
    return numbers * dtype.itemsize
