"""A decoder-only language model (chapter 13): causal self-attention and the GPT stack.

A decoder-only model keeps only the Transformer's decoder, without the cross-attention:
a stack of causal self-attention blocks that reads tokens ``0 .. t`` and predicts token
``t + 1`` (Radford et al., 2018, "Improving Language Understanding by Generative
Pre-Training"; Radford et al., 2019, "Language Models are Unsupervised Multitask
Learners", GPT-2). :class:`GPT` is a switchboard: its constructor takes every option the
later chapters of Part V measure (positions, norms, feed-forward networks, key/value
layouts). Every option is implemented (see the class docstring's list); an invalid
value raises ``ValueError`` naming the argument.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from ._validate import check_positive_int, check_probability, require_float, require_ndim
from .attention import masked_softmax
from .embedding import check_token_ids
from .ffn import make_ffn, swiglu_hidden_size
from .fused import AttentionMask, FusedMask
from .kv import KVLayout
from .kv_cache import AttentionCache, DecoderCache
from .latent import LatentCache, MultiHeadLatentAttention
from .moe import MoE
from .multihead import MultiHeadAttention, _check_heads, _merge_heads, _split_heads
from .norms import RMSNorm, make_norm
from .positional import sinusoidal_positional_encoding
from .relative_positions import attention_positions
from .sinks import _sink_weights
from .stability import check_cap, softcap

POSITIONS = ("learned", "sinusoidal", "rope", "alibi", "none")
NORMS = ("layer", "rms")
FFNS = ("relu", "gelu", "swiglu", "moe", "none")  # "none": attention-only blocks (chapter 17)
ATTENTIONS = ("mha", "mla")  # "mla": multi-head latent attention (chapter 18)
# Absolute positions are added to the embeddings: the model cannot go beyond max_len.
ABSOLUTE_POSITIONS = ("learned", "sinusoidal")


def _check_choice(name: str, value: object, choices: tuple) -> None:
    if value not in choices:
        raise ValueError(f"{name}: got {value!r}, expected one of {choices}")


def _is_position_piece(positions: object) -> bool:
    """Has the two methods of :mod:`attention_course.relative_positions`'s pieces."""
    return callable(getattr(positions, "rotate", None)) and callable(
        getattr(positions, "score_mask", None)
    )


def _check_rope_fn(rope_fn: object, pos: str | None) -> None:
    if rope_fn is None:
        return
    if isinstance(rope_fn, str):  # the name GPT.config() stores for a custom rotation
        raise ValueError(
            f"rope_fn: got the name {rope_fn!r}, expected the function itself: a config (or a "
            "checkpoint) stores only the name of a custom rotation, since a function is code, "
            "not data; rebuild with GPT(**{**config, 'rope_fn': the_function})"
        )
    if not callable(rope_fn):
        raise ValueError(f"rope_fn: got {rope_fn!r}, expected a function (x, positions) -> x")
    if pos != "rope":
        raise ValueError(f"rope_fn: given with pos={pos!r}, expected pos='rope' (it rotates q, k)")


def _check_qk_norm_softcap(qk_norm: object, cap: object, positions) -> float | None:
    """``qk_norm`` a bool; ``softcap`` None or a number > 0, not with scores-side positions."""
    if not isinstance(qk_norm, bool):
        raise ValueError(f"qk_norm: got {qk_norm!r}, expected True or False")
    if cap is None:
        return None
    cap = check_cap("softcap", cap)
    if positions is not None and getattr(positions, "on_scores", True):
        raise ValueError(
            "softcap: given with pos='alibi' (a position piece that acts on the scores), "
            "expected pos=None or 'rope': ALiBi's bias travels in the additive mask, which is "
            "added after the cap, so the bias would escape it"
        )
    return cap


def _check_latent(
    attention, kv_rank, d_rope, pos, num_kv_heads, window, rope_fn, others=None
) -> None:
    """The arguments of latent attention (chapter 18): all or none of them."""
    _check_choice("attention", attention, ATTENTIONS)
    if attention == "mha":
        for name, value in (("kv_rank", kv_rank), ("d_rope", d_rope)):
            if value is not None:
                raise ValueError(f"{name}: got {value!r} with attention='mha', expected None")
        return
    if kv_rank is None:
        raise ValueError("kv_rank: got None with attention='mla', expected a positive int")
    if pos != "rope":
        raise ValueError(
            f"pos: got {pos!r} with attention='mla', expected 'rope' (latent attention rotates "
            "part of its queries and keys itself)"
        )
    for name, value in (("num_kv_heads", num_kv_heads), ("window", window), ("rope_fn", rope_fn)):
        if value is not None:
            raise ValueError(f"{name}: got {value!r} with attention='mla', expected None")
    # options of CausalSelfAttention that latent attention does not have: (value, default)
    for name, (value, default) in (others or {}).items():
        if value != default:
            raise ValueError(
                f"{name}: got {value!r} with attention='mla', expected {default!r} (an option "
                "of the package's CausalSelfAttention, not of MultiHeadLatentAttention)"
            )


def _check_moe_options(
    ffn: str, num_experts: object, top_k: object, num_shared: object, router_bias: object
) -> None:
    """``num_experts`` is given exactly when ``ffn="moe"``; the other MoE options keep their
    defaults otherwise (:class:`~attention_course.MoE` checks their values)."""
    if ffn == "moe":
        if num_experts is None:
            raise ValueError("num_experts: got None with ffn='moe', expected a positive int")
        return
    for name, value, default in (
        ("num_experts", num_experts, None),
        ("top_k", top_k, 2),
        ("num_shared", num_shared, 0),
        ("router_bias", router_bias, False),
    ):
        if value != default or type(value) is not type(default):
            raise ValueError(
                f"{name}: got {value!r} with ffn={ffn!r}, expected ffn='moe' (or the default "
                f"{default!r})"
            )


def causal_attention_mask(
    T: int, S: int, layout: KVLayout, positions=None, device=None, dtype=torch.float32
) -> AttentionMask:
    """The one mask of a decoder-only forward pass: ``T`` new queries, the last of ``S``
    positions, built once by the model and given to every layer.

    Which keys a query sees is the key/value ``layout``'s
    (:meth:`~attention_course.kv.KVLayout.visible`: causal, or a sliding window, over
    the keys the layer is given); a position piece that acts on the scores (ALiBi's
    ``score_mask``) turns it into one additive float mask ``(H, T, S)``, its bias with
    ``-inf`` where a key is hidden. Otherwise a single new query, which may see every key
    it is given, needs no mask (``dense`` None).
    """
    S = layout.visible_keys(T, S)
    on_scores = positions is not None and getattr(positions, "on_scores", True)
    if T == 1 and not on_scores:
        return AttentionMask(None)
    visible = layout.visible(T, S, device)  # (T, S) bool, True = may attend
    if on_scores:
        return AttentionMask(positions.score_mask(T, S, visible, device, dtype))  # (H, T, S)
    return AttentionMask(visible)


class CausalSelfAttention(MultiHeadAttention):
    """Masked (causal) multi-head self-attention (因果自注意力) of a decoder-only model.

    Token ``t`` attends to tokens ``0 .. t`` only. It *is* a
    :class:`~attention_course.MultiHeadAttention` (same ``w_q, w_k, w_v, w_o``,
    same :meth:`~attention_course.MultiHeadAttention.attend`: one implementation of the
    attention maths in the package) whose queries, keys and values all come from ``x``
    and whose mask is causal. With ``cache`` (an
    :class:`~attention_course.kv_cache.AttentionCache`, chapter 12's KV cache) ``x``
    holds only the new positions; they attend to every cached one and to themselves
    causally.

    PyTorch counterpart: ``nn.MultiheadAttention(d_model, num_heads, bias=bias,
    batch_first=True)`` called as ``mha(x, x, x, attn_mask=~causal_mask(T))`` (PyTorch's
    boolean mask marks what may *not* be attended, the opposite of the course's; see
    :func:`~attention_course.masking.to_torch_mha_mask`) with copied weights (its
    ``in_proj_weight`` stacks ``w_q, w_k, w_v``). Hugging Face:
    the attention module of ``GPT2Model`` (``GPT2Attention``), which has biases.

    ``pos`` (chapter 14): ``"rope"`` rotates ``q`` and ``k`` after the projections
    (:func:`~attention_course.apply_rope`, at absolute positions: cached keys are stored
    already rotated, and new queries are rotated at ``cache.length + t``);
    ``"alibi"`` adds :func:`~attention_course.alibi_bias` to the scores through the
    causal mask (one additive float mask ``(H, T, S)``). ``rope_fn``: the function that
    rotates them, called as ``rope_fn(x, positions)`` on ``(B, H, T, Dh)`` (or
    ``(B, Hkv, T, Dh)``) with ``positions (T,)``; None means
    :func:`~attention_course.apply_rope` (half-split). Chapter 14 passes another layout
    (interleaved) or a deliberately wrong rotation to see what it does to a trained
    model, without patching the package: what varies between chapters is an argument
    the module is given, never a package attribute a chapter reassigns.

    Chapter 15: ``num_kv_heads`` (grouped keys and values; 1 is multi-query attention):
    ``w_k`` and ``w_v`` map ``D -> Hkv * Dh`` and query head ``h`` uses key/value head
    ``h // (H / Hkv)`` (:func:`~attention_course.repeat_kv`; as
    ``F.scaled_dot_product_attention(..., enable_gqa=True)``); the cache stores the
    ``Hkv`` heads only. ``window``: the causal mask intersected with
    :func:`~attention_course.sliding_window_mask`; the cache must then be a
    :class:`~attention_course.kv.RollingAttentionCache` (at most ``window`` positions).

    The pieces it is given: ``positions`` (a position piece of
    :mod:`attention_course.relative_positions`: :class:`~attention_course.relative_positions.
    RotaryPositions`, :class:`~attention_course.relative_positions.ALiBiPositions`, or one of
    the same shape, e.g.
    a scaled RoPE) and ``layout`` (a :class:`~attention_course.kv.KVLayout`: key/value
    heads, window, cache type). Without them they are made from ``pos``/``rope_fn`` and
    ``num_kv_heads``/``window`` (:func:`~attention_course.relative_positions.attention_positions`);
    a model gives every layer the same ones. The module calls them, in order: project,
    ``positions.rotate``, the cache (:meth:`~attention_course.MultiHeadAttention._remember`),
    ``layout.expand``, :meth:`~attention_course.MultiHeadAttention.attend`.

    Chapter 19: ``sinks=True`` gives each head one learned sink logit, the parameter
    ``sinks (H,)`` (gpt-oss): every row's softmax also runs over it and its share is
    dropped (:func:`~attention_course.sinks.sink_attention`; rows sum to < 1). It starts at
    0 (Hugging Face's port draws N(0, 0.02); 0 leaves every other weight's random draw as
    in the model without sinks). Attention then always takes that path (PyTorch's fused
    kernel has no sink), and dropout, if any, drops weights after the sink's share is
    removed (as gpt-oss's ``eager_attention_forward``). A layout with ``num_sink``
    (StreamingLLM's kept first tokens) is another thing: positions the window keeps, not
    a parameter.

    Chapter 20, keeping the scores in range:

    - ``qk_norm=True`` (QK-norm as Qwen3 applies it; = Hugging Face's ``Qwen3Attention``):
      attributes ``q_norm`` and ``k_norm``, each an :class:`~attention_course.RMSNorm`
      ``(Dh, eps=1e-6)`` shared by the heads, normalise every head's query and key vector
      over its ``Dh`` entries after the projections and *before* RoPE (and before the
      cache: the cache stores normalised, rotated keys). With ``qk_norm=False`` both are
      None. (OLMo 2 normalises the whole projection before the heads are split,
      ``RMSNorm(H * Dh)`` on the queries and ``RMSNorm(Hkv * Dh)`` on the keys in Hugging
      Face's ``Olmo2Attention``; that is not this option.) Dehghani et al. (2023, "Scaling
      Vision Transformers to 22 Billion Parameters", arXiv:2302.05442) and Wortsman et al.
      (2023, "Small-scale proxies for large-scale Transformer training instabilities",
      arXiv:2309.14322) apply a LayerNorm to the queries and keys (QK-layernorm) against
      growing attention logits; Qwen3 uses an RMSNorm.
    - ``softcap`` (a number > 0, or None): the scores, scaled by ``Dh^-1/2``, go through
      :func:`~attention_course.softcap` (``cap * tanh(s / cap)``) *before* the mask and
      the softmax (= Gemma 2's ``eager_attention_forward`` with ``softcap`` and
      ``query_pre_attn_scalar = Dh``). PyTorch's fused ``F.scaled_dot_product_attention``
      has no step between the product and the softmax, so a soft-capped module always
      takes the explicit path (its :meth:`attend`: scores, cap, mask, softmax, weighted
      sum), weights asked for or not; Hugging Face's Gemma 2 says the same with
      ``_supports_sdpa = False`` ("sdpa does not support softcapping"). With
      ``pos="alibi"`` it raises ``ValueError``: ALiBi's bias is carried by the additive
      mask, which comes after the cap.

    An invalid value raises ``ValueError`` naming the argument
    (``num_heads % num_kv_heads != 0`` too; ``rope_fn`` without ``pos="rope"``, or not
    callable).

    Attention weights: ``forward(x, need_weights=True)`` returns ``(out, weights)`` with
    ``weights (B, H, T, S)`` per head (the softmax, after the mask: each row sums to 1,
    zero above the diagonal), for heatmaps (chapters 13, 17). The default returns
    ``out`` alone, computed by PyTorch's fused kernel (without ``softcap``).

    Shapes:
        x: ``(B, T, D)``; returns ``(B, T, D)``, or ``((B, T, D), (B, H, T, S))`` with
        ``need_weights=True``; ``S = T`` plus the cached positions (with a ``window``, plus
        at most ``window - 1`` of them: those the rolling cache returns).
    """

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        num_kv_heads: int | None = None,
        bias: bool = False,
        dropout: float = 0.0,
        pos: str | None = None,
        window: int | None = None,
        max_len: int = 4096,
        rope_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
        qk_norm: bool = False,
        softcap: float | None = None,
        *,
        positions=None,
        layout: KVLayout | None = None,
        sinks: bool = False,
    ) -> None:
        super().__init__(d_model, num_heads, dropout=dropout, bias=bias)
        if not isinstance(sinks, bool):
            raise ValueError(f"sinks: got {sinks!r}, expected True or False")
        if layout is None:
            layout = KVLayout(num_heads, num_kv_heads, window)
        elif not isinstance(layout, KVLayout) or layout.num_heads != num_heads:
            raise ValueError(f"layout: got {layout!r}, expected a KVLayout for {num_heads} heads")
        elif num_kv_heads is not None or window is not None:
            raise ValueError("layout: given with num_kv_heads or window, expected one or the other")
        if pos is not None:
            _check_choice("pos", pos, ("rope", "alibi"))
        check_positive_int("max_len", max_len)
        _check_rope_fn(rope_fn, pos)
        if positions is None:
            positions = attention_positions(pos, num_heads, rope_fn)
        elif pos is not None or rope_fn is not None:
            raise ValueError("positions: given with pos or rope_fn, expected one or the other")
        elif not _is_position_piece(positions):
            raise ValueError(
                f"positions: got {positions!r}, expected a position piece with rotate(q, k, "
                "start) and score_mask(T, S, visible, device, dtype) "
                "(attention_course.relative_positions)"
            )
        if layout.num_kv_heads != num_heads:  # grouped keys and values (chapter 15): D -> Hkv * Dh
            self.w_k = nn.Linear(d_model, layout.num_kv_heads * self.d_head, bias=bias)
            self.w_v = nn.Linear(d_model, layout.num_kv_heads * self.d_head, bias=bias)
        softcap = _check_qk_norm_softcap(qk_norm, softcap, positions)
        self.layout = layout
        self.positions = positions
        self.qk_norm = qk_norm
        self.softcap = softcap  # None: the fused kernel may run; a number: the explicit path
        if qk_norm:  # Qwen3: one RMSNorm over Dh each for q and k, shared by the heads
            self.q_norm = RMSNorm(self.d_head, eps=1e-6)
            self.k_norm = RMSNorm(self.d_head, eps=1e-6)
        else:
            self.q_norm = self.k_norm = None
        self.num_kv_heads = layout.num_kv_heads
        self.window = layout.window
        self.pos = None if positions is None else getattr(positions, "name", None)
        self.max_len = max_len
        # a function given by the caller, not a closure over weights
        self.rope_fn = getattr(positions, "rotate_fn", None)
        # gpt-oss's learned sinks (chapter 19): one logit per head, or None
        self.sinks = nn.Parameter(torch.zeros(num_heads)) if sinks else None

    def forward(
        self,
        x: torch.Tensor,
        need_weights: bool = False,
        cache: AttentionCache | None = None,
        mask: AttentionMask | torch.Tensor | FusedMask | None = None,
    ):
        """``mask``: the model's :class:`~attention_course.fused.AttentionMask` (built
        once, given to every layer: :func:`causal_attention_mask`); None builds it here."""
        require_float("x", x)
        require_ndim("x", x, (3,), f"(B, T, {self.d_model})")
        if x.shape[-1] != self.d_model:
            raise ValueError(
                f"x: got shape {tuple(x.shape)}, expected (B, T, d_model={self.d_model})"
            )
        T = x.shape[1]
        start = 0 if cache is None else cache.length  # positions already cached
        if cache is not None:
            self.layout.check_cache(cache)
        if mask is None:
            mask = causal_attention_mask(
                T, start + T, self.layout, self.positions, x.device, x.dtype
            )
        q = _split_heads(self.w_q(x), self.num_heads)  # (B, T, D) -> (B, H, T, Dh)
        k = _split_heads(self.w_k(x), self.num_kv_heads)  # (B, T, Hkv*Dh) -> (B, Hkv, T, Dh)
        v = _split_heads(self.w_v(x), self.num_kv_heads)  # (B, T, Hkv*Dh) -> (B, Hkv, T, Dh)
        if self.qk_norm:  # per head, over its Dh entries, before RoPE (Qwen3); same shapes
            q, k = self.q_norm(q), self.k_norm(k)
        if self.positions is not None:  # e.g. RoPE: rotate at absolute positions start + t
            q, k = self.positions.rotate(q, k, start)  # same shapes
        # the cache stores the Hkv heads (rotated), never the repeated copies
        if cache is not None:
            k, v = self._remember(k, v, cache)  # (B, Hkv, S, Dh) each
        k, v = self.layout.expand(k, v)  # (B, Hkv, S, Dh) -> (B, H, S, Dh)
        out, weights = self.attend(q, k, v, mask, need_weights)
        return (out, weights) if need_weights else out

    def attend(self, q, k, v, mask=None, need_weights: bool = True):
        """:meth:`MultiHeadAttention.attend <attention_course.MultiHeadAttention.attend>`,
        or, with ``softcap`` or learned ``sinks``, the explicit path that has a step for them.

        PyTorch's fused kernel has no step between the scores and the softmax, so a module
        with either takes this path whether or not weights are asked for: ``scores =
        (q / sqrt(Dh)) @ kᵀ``, then ``softcap(scores, cap)`` (chapter 20; before the mask,
        as in Gemma 2: a hidden key stays hidden), then the softmax under the mask
        (:func:`~attention_course.masked_softmax`; with ``sinks``, chapter 19, over the scores
        and the head's sink logit, the sink's share dropped), dropout on the weights in
        training (after the sink's drop, as gpt-oss), ``weights @ v`` and ``w_o``. Returns
        the weights (after the cap and the mask) only with ``need_weights``.

        Shapes: q ``(B, H, T, Dh)``; k, v ``(B, H, S, Dh)``; returns ``(B, T, D)`` and
        ``(B, H, T, S)`` or None.
        """
        if self.softcap is None and self.sinks is None:
            return super().attend(q, k, v, mask, need_weights)
        if isinstance(mask, AttentionMask):
            mask = mask.dense  # bool or additive float, or None
        elif isinstance(mask, FusedMask):  # back to a plain additive mask (-inf = hidden)
            empty = mask.empty
            mask = mask.additive
            if empty is not None:
                mask = mask.masked_fill(empty, float("-inf"))
        scores = (q * self.d_head**-0.5) @ k.transpose(-2, -1)  # (B, H, T, S)
        if self.softcap is not None:
            scores = softcap(scores, self.softcap)  # into (-cap, cap), before the mask
        if self.sinks is None:
            weights = masked_softmax(scores, mask)  # hidden keys get exactly 0
        else:  # rows sum to < 1: the sink's share is dropped
            weights = _sink_weights(scores, self.sinks, mask).to(q.dtype)
        if self.training and self.dropout > 0.0:
            weights = F.dropout(weights, p=self.dropout, training=True)
        heads = weights @ v  # (B, H, T, S) @ (B, H, S, Dh) -> (B, H, T, Dh)
        out = self.w_o(_merge_heads(heads))  # (B, T, D)
        return out, (weights if need_weights else None)


class GPTBlock(nn.Module):
    """One pre-norm block: ``x + attn(norm1(x))``, then ``x + ffn(norm2(x))``.

    As ``nn.TransformerEncoderLayer(norm_first=True, batch_first=True)`` with a causal
    mask (and GPT-2's block), without that layer's attention biases.

    Shapes: x ``(B, T, D)``; returns ``(B, T, D)`` (and ``(B, H, T, S)`` weights if asked).
    """

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        d_ff: int,
        dropout: float,
        ffn: str,
        max_len: int,
        norm: str = "layer",
        pos: str | None = None,
        num_kv_heads: int | None = None,
        window: int | None = None,
        rope_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
        qk_norm: bool = False,
        softcap: float | None = None,
        *,
        positions=None,
        layout: KVLayout | None = None,
        sinks: bool = False,
        attn: MultiHeadLatentAttention | None = None,
        num_experts: int | None = None,
        top_k: int = 2,
        num_shared: int = 0,
        router_bias: bool = False,
    ) -> None:
        super().__init__()
        self.norm1 = make_norm(norm, d_model)
        if attn is not None:  # a given attention module (chapter 18: latent attention)
            self.attn = attn
        else:
            self.attn = CausalSelfAttention(
                d_model,
                num_heads,
                num_kv_heads,
                dropout=dropout,
                pos=pos,
                window=window,
                max_len=max_len,
                rope_fn=rope_fn,
                qk_norm=qk_norm,
                softcap=softcap,
                positions=positions,
                layout=layout,
                sinks=sinks,
            )
        if ffn == "none":  # attention-only (chapter 17): no FFN, so no norm before it
            self.norm2, self.ffn = nn.Identity(), None
        elif ffn == "moe":  # chapter 21: E SwiGLU experts of width d_ff, k per token
            self.norm2 = make_norm(norm, d_model)
            self.ffn = MoE(d_model, d_ff, num_experts, top_k, num_shared, router_bias=router_bias)
        else:
            self.norm2 = make_norm(norm, d_model)
            self.ffn = make_ffn(ffn, d_model, d_ff, dropout)
        self.dropout = nn.Dropout(dropout)

    def forward(
        self, x, mask=None, need_weights: bool = False, cache=None, need_router_logits=False
    ):
        """Returns ``x``; ``(x, weights)`` with ``need_weights``; ``need_router_logits``
        (an MoE block) appends the router's logits ``(B·T, E)``."""
        if isinstance(self.attn, MultiHeadLatentAttention):  # its own positions and mask
            a = self.attn(self.norm1(x), cache=cache)
        else:
            a = self.attn(self.norm1(x), need_weights=need_weights, cache=cache, mask=mask)
        a, weights = a if need_weights else (a, None)
        x = x + self.dropout(a)
        router_logits = None
        if self.ffn is not None:
            h = self.ffn(self.norm2(x))
            if isinstance(self.ffn, MoE):  # (B, T, D) and the router logits (B·T, E)
                h, router_logits = h
            x = x + self.dropout(h)
        out = (x, weights) if need_weights else (x,)
        if need_router_logits:
            out = (*out, router_logits)
        return out if len(out) > 1 else x


class GPT(nn.Module):
    """A decoder-only Transformer language model: ``ids (B, T) -> logits (B, T, V)``.

    Token embedding (plus learned or sinusoidal positions), ``num_layers`` pre-norm
    blocks (:class:`GPTBlock`: ``norm1``, ``attn`` (a :class:`CausalSelfAttention`),
    ``norm2``, ``ffn``), a final ``norm`` and a bias-free linear ``head``. Logit ``t``
    is the model's prediction of token ``t + 1`` from tokens ``0 .. t``.

    - ``tie_weights`` (weight tying, 权重共享; Press & Wolf, 2017, "Using the Output
      Embedding to Improve Language Models"): ``head.weight`` *is* ``tok_emb.weight``
      (one Parameter, ``V * D`` fewer parameters), as in GPT-2.
    - Embeddings are not multiplied by ``sqrt(d_model)`` (GPT-2 does not), except with
      ``pos="sinusoidal"``, which follows Vaswani et al. (2017, "Attention Is All You
      Need", arXiv:1706.03762, §3.4: embeddings multiplied by ``sqrt(d_model)``): token
      embeddings ~ N(0, d_model^-1/2) (the paper does not state an initialisation; this
      is fairseq's Transformer's) multiplied by ``sqrt(d_model)`` before the fixed
      table is added. Why: the table's entries lie in [-1, 1] (rms about 0.71) and are
      not trained, so GPT-2's unscaled N(0, 0.02) token embeddings would start about 35
      times smaller than the positions they are added to; scaled, both have unit-order
      rms. With tied weights the head then shares these larger embeddings, and the
      untrained model favours repeating the current token: its loss on random targets
      starts well above ``log V`` (about 6.9 nats for V = 103, d_model = 64, against
      ``log V`` = 4.6). "learned", "rope", "alibi" and "none" keep GPT-2's convention
      (their initial values and random draws are unchanged).
    - ``norm="layer"`` uses ``torch.nn.LayerNorm``: the course's
      :class:`~attention_course.LayerNorm` computes the same (chapter 7's tests), but
      PyTorch's fused kernel trains faster, which the checkpoint's time budget needs.
    - Initialisation (GPT-2's): every linear and embedding weight ~ N(0, 0.02)
      (the token embedding's std is d_model^-1/2 with ``pos="sinusoidal"``, above),
      biases 0, LayerNorms (1, 0); the projections that write into the residual stream
      (``attn.w_o`` and ``ffn.linear2``) ~ N(0, 0.02 / sqrt(2 * num_layers)). The
      untrained model's loss is then close to ``log V`` (not with "sinusoidal", above).
    - The feed-forward ``"gelu"`` is the exact (erf) GELU, as ``F.gelu`` and
      ``nn.TransformerEncoderLayer(activation="gelu")``; GPT-2 uses the tanh
      approximation.
    - ``norm="rms"`` (chapter 16) uses :class:`~attention_course.RMSNorm` (``eps=None``,
      as ``nn.RMSNorm``) for ``norm1``, ``norm2`` and the final ``norm``.
    - ``ffn="swiglu"`` (chapter 16) uses a bias-free :class:`~attention_course.SwiGLU`;
      its ``w2`` gets the residual initialisation. With ``d_ff=None`` its width is
      LLaMA's ``2/3 * 4 * d_model`` rounded up to a multiple of 8 (``d_model=128 ->
      344``), which keeps the FFN's weights close to a ``4 * d_model`` GELU FFN's;
      the other FFNs default to ``4 * d_model``.
    - ``ffn="none"`` (chapter 17): an attention-only model (Elhage et al., 2021, "A
      Mathematical Framework for Transformer Circuits"): each block is
      ``x + attn(norm1(x))`` alone; its ``ffn`` is None and ``norm2`` an ``nn.Identity``
      (``d_ff`` is ignored).

    Implemented: ``pos`` "learned", "sinusoidal", "none" (chapter 13), "rope" and "alibi"
    (chapter 14, inside attention: see :class:`CausalSelfAttention`; ``rope_fn`` replaces
    the rotation, e.g. by another layout); ``num_kv_heads``
    (grouped keys and values) and ``window`` (sliding-window attention, with a rolling
    KV cache from :meth:`new_cache`) (chapter 15); ``norm`` "layer" and "rms", ``ffn``
    "relu", "gelu" and "swiglu" (chapter 16); ``ffn="none"`` (chapter 17);
    ``rope_scaling`` (chapter 19, with ``pos="rope"`` only): a RoPE scaling dict (see
    :func:`~attention_course.rope_frequencies`: linear, NTK-aware or YaRN) for every
    layer. It adds no weights, so a model trained without it reads longer contexts with
    it: ``GPT(**{**model.config(), "rope_scaling": {...}})`` then ``load_state_dict``;
    ``attention="mla"`` (chapter 18): every block's attention is a
    :class:`~attention_course.MultiHeadLatentAttention` with ``kv_rank`` and ``d_rope``
    (default ``D / (2H)``), which rotates its own queries and keys (so ``pos="rope"``,
    no ``rope_fn``, ``num_kv_heads``, ``window`` or the options of chapters 19-20) and
    whose cache (:meth:`new_cache`) keeps the latent and the rotary key (no attention
    weights are returned); ``num_sink``
    (with ``window``: StreamingLLM's kept first tokens, :func:`~attention_course.sinks.
    streaming_mask`) and ``sinks`` (gpt-oss's learned sink logit per head,
    :func:`~attention_course.sinks.sink_attention`) (chapter 19); ``qk_norm``
    and ``softcap`` in every layer's attention (chapter 20: see
    :class:`CausalSelfAttention`; ``softcap`` with ``pos="alibi"`` raises ``ValueError``)
    and ``final_softcap``, :func:`~attention_course.softcap` on the output logits
    (Gemma 2's ``final_logit_softcapping``: ``logits = cap * tanh(logits / cap)`` after
    the head).

    Chapter 21: ``ffn="moe"`` makes every block's feed-forward network a
    :class:`~attention_course.MoE` of ``num_experts`` SwiGLU experts of width ``d_ff``
    (default as ``"swiglu"``), ``top_k`` per token, ``num_shared`` shared experts and,
    with ``router_bias=True``, DeepSeek-V3's balancing bias (update it after each step
    with each layer's :meth:`~attention_course.MoE.update_router_bias`). Every expert's
    ``w2`` (and the shared one's) gets the residual initialisation, the router N(0,
    0.02). ``num_experts`` is required with ``ffn="moe"``; with another ``ffn``, giving
    it (or a ``top_k``, ``num_shared``, ``router_bias`` other than the default) raises
    ``ValueError``. The balancing loss needs the router's logits:
    ``forward(ids, return_router_logits=True)`` returns ``(logits, router_logits)``, a
    list with each layer's ``(B·T, E)`` (``torch.cat`` them for
    :func:`~attention_course.load_balancing_loss`, as Hugging Face pools the layers'
    tokens); with ``return_attention`` too, ``(logits, weights, router_logits)``.

    ``forward(ids, return_attention=True)`` also returns a list with each layer's
    attention weights ``(B, H, T, S)``. With ``cache`` (from :meth:`new_cache`) ``ids``
    holds only the new tokens; their positions continue after the cached ones (see
    :func:`~attention_course.generate`).

    PyTorch counterpart: ``nn.TransformerEncoder`` of ``nn.TransformerEncoderLayer(
    norm_first=True, activation="gelu", batch_first=True)`` with a causal mask, between
    an ``nn.Embedding`` and a final ``nn.LayerNorm`` + ``nn.Linear`` (the tests build it
    and compare). Hugging Face: ``GPT2LMHeadModel``.

    Shapes:
        ids: ``(B, T)`` integer token ids, ``T <= max_len`` for absolute positions;
        returns ``(B, T, V)`` logits (and ``num_layers`` tensors ``(B, H, T, S)``).
    """

    def __init__(
        self,
        vocab_size: int,
        d_model: int = 128,
        num_heads: int = 4,
        num_layers: int = 4,
        d_ff: int | None = None,
        max_len: int = 256,
        dropout: float = 0.0,
        pos: str = "learned",
        norm: str = "layer",
        ffn: str = "gelu",
        num_kv_heads: int | None = None,
        window: int | None = None,
        tie_weights: bool = True,
        rope_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
        rope_scaling: dict | None = None,
        attention: str = "mha",
        kv_rank: int | None = None,
        d_rope: int | None = None,
        num_sink: int = 0,
        sinks: bool = False,
        qk_norm: bool = False,
        softcap: float | None = None,
        final_softcap: float | None = None,
        num_experts: int | None = None,
        top_k: int = 2,
        num_shared: int = 0,
        router_bias: bool = False,
    ) -> None:
        super().__init__()
        for name, value in (
            ("vocab_size", vocab_size),
            ("d_model", d_model),
            ("num_heads", num_heads),
            ("num_layers", num_layers),
            ("max_len", max_len),
        ):
            check_positive_int(name, value)
        _check_choice("ffn", ffn, FFNS)
        if d_ff is None:
            d_ff = swiglu_hidden_size(d_model) if ffn in ("swiglu", "moe") else 4 * d_model
        check_positive_int("d_ff", d_ff)
        check_probability("dropout", dropout)
        _check_choice("pos", pos, POSITIONS)
        _check_choice("norm", norm, NORMS)
        _check_moe_options(ffn, num_experts, top_k, num_shared, router_bias)
        if not isinstance(tie_weights, bool):
            raise ValueError(f"tie_weights: got {tie_weights!r}, expected True or False")
        _check_heads(d_model, num_heads)  # the attention module's own message
        _check_latent(
            attention,
            kv_rank,
            d_rope,
            pos,
            num_kv_heads,
            window,
            rope_fn,
            {
                "num_sink": (num_sink, 0),
                "sinks": (sinks, False),
                "qk_norm": (qk_norm, False),
                "softcap": (softcap, None),
                "rope_scaling": (rope_scaling, None),
            },
        )
        # The pieces every layer's attention is given (one of each, shared): the key/value
        # layout (chapter 15) and the positions inside attention (chapter 14); their own
        # checks and messages.
        kv_layout = KVLayout(num_heads, num_kv_heads, window, num_sink)
        if num_sink and pos == "alibi":
            raise ValueError(
                "num_sink: given with pos='alibi', expected another pos (ALiBi's bias assumes "
                "the keys a cache returns are consecutive positions; the kept sinks are not)"
            )
        if not isinstance(sinks, bool):
            raise ValueError(f"sinks: got {sinks!r}, expected True or False")
        _check_rope_fn(rope_fn, pos)
        if rope_scaling is not None and pos != "rope":
            raise ValueError(
                f"rope_scaling: given with pos={pos!r}, expected pos='rope' (it scales RoPE)"
            )
        if rope_scaling is not None and rope_fn is not None:
            raise ValueError(
                "rope_scaling: given with rope_fn, expected one of them (rope_scaling "
                "changes the frequencies of the built-in rotation; a rope_fn has its own)"
            )
        attention_pos = pos if pos in ("rope", "alibi") else None  # inside attention (ch. 14)
        if attention == "mla":  # the latent attention rotates its own queries and keys
            attention_pos = None
        attention_pieces = attention_positions(attention_pos, num_heads, rope_fn, rope_scaling)
        _check_qk_norm_softcap(qk_norm, softcap, attention_pieces)  # chapter 20
        if final_softcap is not None:
            final_softcap = check_cap("final_softcap", final_softcap)

        self.vocab_size = vocab_size
        self.d_model = d_model
        self.num_heads = num_heads
        self.num_layers = num_layers
        self.d_ff = d_ff
        self.max_len = max_len
        self.pos = pos
        # the arguments `norm` and `ffn` by name (what config() returns); `self.norm` is
        # the final norm module, and each block's `ffn` its feed-forward network
        self.norm_type = norm
        self.ffn_type = ffn
        self.tie_weights = tie_weights
        self.num_kv_heads = num_kv_heads
        self.window = window
        self.rope_fn = rope_fn
        self.rope_scaling = None if rope_scaling is None else dict(rope_scaling)
        self.attention, self.kv_rank, self.d_rope = attention, kv_rank, d_rope
        self.num_sink = num_sink
        self.sinks = sinks  # learned sink logits in every layer (chapter 19)
        self.qk_norm = qk_norm
        self.softcap = softcap
        self.final_softcap = final_softcap
        self.num_experts = num_experts  # chapter 21: None unless ffn="moe"
        self.top_k = top_k
        self.num_shared = num_shared
        self.router_bias = router_bias
        self.tok_emb = nn.Embedding(vocab_size, d_model)
        if pos == "learned":
            self.pos_emb = nn.Embedding(max_len, d_model)
        elif pos == "sinusoidal":
            table = sinusoidal_positional_encoding(max_len, d_model)
            self.register_buffer("pos_table", table, persistent=False)
        self.drop = nn.Dropout(dropout)
        self.kv_layout = kv_layout
        self.attention_positions = attention_pieces  # None for positions outside attention
        self.blocks = nn.ModuleList(
            GPTBlock(
                d_model,
                num_heads,
                d_ff,
                dropout,
                ffn,
                max_len,
                norm,
                qk_norm=qk_norm,
                softcap=softcap,
                positions=attention_pieces,
                layout=kv_layout,
                sinks=sinks,
                attn=None
                if attention == "mha"
                else MultiHeadLatentAttention(d_model, num_heads, kv_rank, d_rope=d_rope),
                num_experts=num_experts,
                top_k=top_k,
                num_shared=num_shared,
                router_bias=router_bias,
            )
            for _ in range(num_layers)
        )
        self.norm = make_norm(norm, d_model)
        self.head = nn.Linear(d_model, vocab_size, bias=False)
        self.reset_parameters()
        if tie_weights:
            self.head.weight = self.tok_emb.weight  # one Parameter, two uses

    def config(self) -> dict:
        """The constructor's arguments: ``GPT(**model.config())`` builds the same model.

        Only plain values (numbers, strings, None), so that ``scripts/train_gpt.py`` can
        store them in a checkpoint that ``torch.load(..., weights_only=True)`` reads. A
        custom ``rope_fn`` is code, not data: the config holds its name only, and
        ``GPT(**config)`` then raises a ValueError asking for the function itself
        (``GPT(**{**config, "rope_fn": fn})``), instead of silently rotating another way.
        """
        rope_fn = self.rope_fn
        if rope_fn is not None:
            rope_fn = getattr(rope_fn, "__qualname__", None) or repr(rope_fn)
        return {
            "vocab_size": self.vocab_size,
            "d_model": self.d_model,
            "num_heads": self.num_heads,
            "num_layers": self.num_layers,
            "d_ff": self.d_ff,
            "max_len": self.max_len,
            "dropout": self.drop.p,
            "pos": self.pos,
            "norm": self.norm_type,
            "ffn": self.ffn_type,
            "tie_weights": self.tie_weights,
            "num_kv_heads": self.num_kv_heads,
            "window": self.window,
            "rope_fn": rope_fn,
            "rope_scaling": None if self.rope_scaling is None else dict(self.rope_scaling),
            "attention": self.attention,
            "kv_rank": self.kv_rank,
            "d_rope": self.d_rope,
            "num_sink": self.num_sink,
            "sinks": self.sinks,
            "qk_norm": self.qk_norm,
            "softcap": self.softcap,
            "final_softcap": self.final_softcap,
            "num_experts": self.num_experts,
            "top_k": self.top_k,
            "num_shared": self.num_shared,
            "router_bias": self.router_bias,
        }

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """GPT-2's initialisation; Vaswani et al.'s token embeddings for "sinusoidal"
        (see the class docstring)."""
        residual_std = 0.02 / math.sqrt(2 * self.num_layers)
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, 0.0, 0.02)
                if getattr(module, "bias", None) is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.LayerNorm):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)
            elif isinstance(module, RMSNorm) and module.weight is not None:
                nn.init.ones_(module.weight)
            elif isinstance(module, CausalSelfAttention) and module.sinks is not None:
                nn.init.zeros_(module.sinks)  # a sink logit of 0: e^0 = 1 beside the scores
        if self.pos == "sinusoidal":  # Vaswani et al. (2017, §3.4); same draws, rescaled
            self.tok_emb.weight.mul_(self.d_model**-0.5 / 0.02)
        for block in self.blocks:
            nn.init.normal_(block.attn.w_o.weight, 0.0, residual_std)
            if block.ffn is None:  # attention-only
                continue
            if self.ffn_type == "moe":  # every expert writes into the residual stream
                downs = [expert.w2 for expert in block.ffn.experts]
                if block.ffn.shared is not None:
                    downs.append(block.ffn.shared.w2)
            else:
                downs = [block.ffn.w2 if self.ffn_type == "swiglu" else block.ffn.linear2]
            for down in downs:
                nn.init.normal_(down.weight, 0.0, residual_std)

    def new_cache(self) -> DecoderCache:
        """An empty KV cache (chapter 12) for this model: a
        :class:`~attention_course.kv_cache.DecoderCache` with one cache per layer, an
        :class:`~attention_course.kv_cache.AttentionCache` (with ``window``, chapter 15: a
        :class:`~attention_course.kv.RollingAttentionCache` keeping the last ``window``
        positions; with ``num_sink``, chapter 19: a
        :class:`~attention_course.sinks.StreamingAttentionCache` that also keeps the first
        ``num_sink``, numbering positions within the cache with RoPE, as StreamingLLM; with
        ``attention="mla"``, chapter 18: a :class:`~attention_course.latent.LatentCache`)."""
        if self.attention == "mla":
            return DecoderCache([LatentCache() for _ in range(self.num_layers)])
        layers = [
            self.kv_layout.new_cache(self.attention_positions) for _ in range(self.num_layers)
        ]
        return DecoderCache(layers)

    def forward(
        self,
        ids: torch.Tensor,
        return_attention: bool = False,
        cache: DecoderCache | None = None,
        return_router_logits: bool = False,
    ):
        if return_router_logits and self.ffn_type != "moe":
            raise ValueError(
                f"return_router_logits: the model has no router (ffn={self.ffn_type!r}), "
                "expected ffn='moe'"
            )
        start = cache.length if cache is not None else 0
        limit = self.max_len - start if self.pos in ABSOLUTE_POSITIONS else 2**62
        if limit < 1:
            raise ValueError(
                f"cache: holds {start} positions, expected fewer than max_len={self.max_len} "
                "(absolute positions end there)"
            )
        check_token_ids("ids", ids, self.vocab_size, limit)
        if self.attention == "mla" and return_attention:
            raise ValueError(
                "return_attention: got True, expected False with attention='mla' (its absorbed "
                "form never builds per-head keys, and it returns no weights)"
            )
        T = ids.shape[1]
        x = self.tok_emb(ids)  # (B, T) -> (B, T, D)
        if self.pos == "sinusoidal":  # Vaswani et al. (2017, §3.4): unit-order, like the table
            x = x * math.sqrt(self.d_model)
        if self.pos == "learned":
            positions = torch.arange(start, start + T, device=ids.device)  # (T,)
            x = x + self.pos_emb(positions)  # (B, T, D) + (T, D)
        elif self.pos == "sinusoidal":
            x = x + self.pos_table[start : start + T].to(x.dtype)
        x = self.drop(x)
        # One mask for every layer, built once from the pieces the layers are given.
        mask = None  # latent attention builds its own
        if self.attention == "mha":
            mask = causal_attention_mask(
                T, start + T, self.kv_layout, self.attention_positions, x.device, x.dtype
            )
        weights, router_logits = [], []
        for i, block in enumerate(self.blocks):
            layer_cache = cache.layers[i] if cache is not None else None
            out = block(
                x,
                mask,
                need_weights=return_attention,
                cache=layer_cache,
                need_router_logits=return_router_logits,
            )
            if not (return_attention or return_router_logits):
                x = out
                continue
            x, *extra = out
            if return_attention:
                weights.append(extra.pop(0))
            if return_router_logits:
                router_logits.append(extra.pop(0))  # (B·T, E) for this layer
        logits = self.head(self.norm(x))  # (B, T, D) -> (B, T, V)
        if self.final_softcap is not None:  # Gemma 2: every logit into (-cap, cap)
            logits = softcap(logits, self.final_softcap)
        out = (logits, weights) if return_attention else (logits,)
        if return_router_logits:
            out = (*out, router_logits)
        return out if len(out) > 1 else logits


def load_gpt_checkpoint(path=None, map_location="cpu") -> GPT:
    """Load a :class:`GPT` saved by ``scripts/train_gpt.py`` (in evaluation mode).

    ``path=None`` loads the checkpoint that ships with the package,
    ``attention_course/assets/gpt13.pt`` (chapter 13's model, trained on
    :func:`~attention_course.data.python_docs`). The file holds ``config`` (the
    constructor's arguments), ``state_dict`` (weights stored in bfloat16, loaded into a
    float32 model), ``vocab`` (the :class:`~attention_course.CharTokenizer`'s
    characters) and ``info`` (training settings and the held-out loss it reached).
    The returned model has these as attributes ``vocab`` and ``info``;
    ``CharTokenizer(model.vocab)`` rebuilds the tokenizer it was trained with.
    """
    from pathlib import Path

    if path is None:
        path = Path(__file__).parent / "assets" / "gpt13.pt"
    data = torch.load(path, map_location=map_location, weights_only=True)
    model = GPT(**data["config"])
    state = {k: v.float() for k, v in data["state_dict"].items()}
    model.load_state_dict(state)
    model.vocab = data.get("vocab")
    model.info = data.get("info", {})
    return model.eval()
