"""Attention with a fixed-size state: linear attention and the gated delta rule (chapter 22).

Softmax attention compares a query with every key it may see: ``T x S`` work, and a cache
that grows with the sequence. Replace ``exp(q . k)`` by a product of feature maps
``phi(q) . phi(k)`` and the sum over the keys factorises:

.. math::
    o_i = \\frac{\\phi(q_i)^\\top \\sum_{j \\le i} \\phi(k_j) v_j^\\top}
               {\\phi(q_i)^\\top \\sum_{j \\le i} \\phi(k_j)}

The two sums are a state of fixed size, ``(Dk, Dv)`` and ``(Dk,)``, updated once per
token (Katharopoulos et al., 2020, "Transformers are RNNs: Fast Autoregressive Transformers
with Linear Attention", arXiv:2006.16236, whose feature map is ``phi(x) = elu(x) + 1``).
:func:`linear_attention` computes it.

Linear attention only ever *adds* to its state, so old associations are never removed.
The delta rule (Schlag et al., 2021, "Linear Transformers Are Secretly Fast Weight
Programmers", arXiv:2102.11174) writes ``beta_t (v_t - S^T k_t)``: it first reads what the
state holds for ``k_t`` and stores only the correction. The gated delta rule (Yang et al.,
2024, "Gated Delta Networks: Improving Mamba2 with Delta Rule", arXiv:2412.06464) also
decays the state by ``a_t = e^{g_t}`` at every step; Qwen3-Next's linear-attention layers use
it. :func:`gated_delta_rule` computes it token by token, or chunk by chunk with that paper's
chunkwise WY (UT transform) form (= Hugging Face's
``torch_recurrent_gated_delta_rule`` / ``torch_chunk_gated_delta_rule`` in
``transformers.models.qwen3_next.modeling_qwen3_next``).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ._validate import LOW_PRECISION, check_positive_int, check_qkv, require_float, shape_str

# Causal linear attention works through the sequence in blocks of this many positions: one
# (C x C) tile of scores inside a block, the running state between blocks.
_LINEAR_CHUNK = 64


def _feature_map(x: torch.Tensor) -> torch.Tensor:
    """``phi(x) = elu(x) + 1``: positive, so that the normaliser ``phi(q) . sum phi(k)`` is
    never 0 (Katharopoulos et al., 2020)."""
    return F.elu(x) + 1.0


def linear_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    causal: bool = True,
) -> torch.Tensor:
    """Linear attention (Katharopoulos et al., 2020) with ``phi(x) = elu(x) + 1``.

    ``out_i = phi(q_i)^T S_i / phi(q_i)^T z_i`` with the state ``S_i = sum_j phi(k_j) v_j^T``
    ``(Dk, Dv)`` and the normaliser ``z_i = sum_j phi(k_j)`` ``(Dk,)``, the sums over
    ``j <= i`` when ``causal`` (then ``S = T`` is required), over every ``j`` otherwise. There
    is no ``1/sqrt(Dk)`` scale (the paper has none).

    It equals the explicit quadratic form (``A = phi(Q) phi(K)^T``, masked, each row divided
    by its sum, times ``V``) without ever building that ``T x S`` matrix:

    - not causal: ``S`` and ``z`` are summed once over all keys, ``O(S Dk Dv)`` work; the
      largest temporary is the ``(..., Dk, Dv)`` state.
    - causal: the sequence is processed in blocks of ``C = 64`` positions (the chunked form
      between the quadratic and the token-by-token recurrent one). Inside a block, a
      ``C x C`` masked tile of ``phi(q) phi(k)^T``; from the blocks before it, the running
      state. Memory: one ``(..., C, C)`` tile and one ``(..., Dk, Dv)`` state besides the
      inputs and output, whatever ``T``; the same result as updating ``S_i`` one token at a
      time, in ``T / C`` Python steps instead of ``T``.

    Half-precision inputs are accumulated in float32. Differentiable (plain autograd, which
    keeps every block's tile and state for the backward pass: ``T/C`` tiles of ``C x C`` and
    ``T/C`` states, still never ``T x S``). No PyTorch built-in computes it; tests compare it
    with the quadratic form.

    Shapes:
        query: ``(..., T, Dk)``; key: ``(..., S, Dk)``; value: ``(..., S, Dv)`` (leading axes
        broadcast); returns ``(..., T, Dv)``.
    """
    target = check_qkv(query, key, value)  # (..., T, S)
    if not isinstance(causal, bool):
        raise ValueError(f"causal: got {causal!r}, expected True or False")
    T, S = target[-2:]
    if causal and S != T:
        raise ValueError(
            f"key: got S={S} positions for T={T} queries (query {shape_str(query.shape)}, key "
            f"{shape_str(key.shape)}); causal linear attention needs S = T (position i sees "
            f"keys 0..i); pass causal=False to attend to every key"
        )
    dtype = query.dtype
    compute = torch.float32 if dtype in LOW_PRECISION else dtype
    phi_q = _feature_map(query.to(compute))  # (..., T, Dk)
    phi_k = _feature_map(key.to(compute))  # (..., S, Dk)
    v = value.to(compute)  # (..., S, Dv)
    if not causal:
        state = phi_k.transpose(-2, -1) @ v  # sum_j phi(k_j) v_j^T: (..., Dk, S) @ (..., S, Dv)
        z = phi_k.sum(dim=-2, keepdim=True)  # sum_j phi(k_j): (..., 1, Dk)
        numerator = phi_q @ state  # (..., T, Dk) @ (..., Dk, Dv) -> (..., T, Dv)
        denominator = (phi_q * z).sum(dim=-1, keepdim=True)  # phi(q_i) . z: (..., T, 1)
        return (numerator / denominator).to(dtype)
    return _causal_linear_attention(phi_q, phi_k, v, _LINEAR_CHUNK).to(dtype)


def _causal_linear_attention(phi_q, phi_k, v, chunk: int) -> torch.Tensor:
    """The chunked causal form. Shapes: phi_q, phi_k ``(..., T, Dk)``; v ``(..., T, Dv)``."""
    batch = torch.broadcast_shapes(phi_q.shape[:-2], phi_k.shape[:-2], v.shape[:-2])
    T, Dk, Dv = phi_q.shape[-2], phi_q.shape[-1], v.shape[-1]
    options = {"dtype": phi_q.dtype, "device": phi_q.device}
    state = torch.zeros((*batch, Dk, Dv), **options)  # S = sum over earlier blocks of phi(k) v^T
    z = torch.zeros((*batch, 1, Dk), **options)  # z = sum over earlier blocks of phi(k)
    lower = torch.ones(chunk, chunk, dtype=torch.bool, device=phi_q.device).tril()  # j <= i
    outputs = []
    for t0 in range(0, T, chunk):
        q = phi_q[..., t0 : t0 + chunk, :]  # (..., C, Dk)
        k = phi_k[..., t0 : t0 + chunk, :]  # (..., C, Dk)
        vc = v[..., t0 : t0 + chunk, :]  # (..., C, Dv)
        C = q.shape[-2]  # the last block may be shorter
        # Inside the block: the C x C tile of phi(q_i) . phi(k_j), keeping j <= i.
        tile = (q @ k.transpose(-2, -1)).masked_fill(~lower[:C, :C], 0.0)  # (..., C, C)
        # Earlier blocks enter through the state; this block's keys through the tile.
        numerator = q @ state + tile @ vc  # (..., C, Dv)
        denominator = (q * z).sum(dim=-1, keepdim=True) + tile.sum(dim=-1, keepdim=True)
        outputs.append(numerator / denominator)  # (..., C, Dv) / (..., C, 1)
        # Then fold the block into the state, for the blocks after it.
        state = state + k.transpose(-2, -1) @ vc  # (..., Dk, C) @ (..., C, Dv)
        z = z + k.sum(dim=-2, keepdim=True)
    return torch.cat(outputs, dim=-2)  # (..., T, Dv)


def _check_delta_inputs(query, key, value, g, beta, initial_state) -> None:
    """Shapes and ranges of :func:`gated_delta_rule`'s inputs; raises ValueError naming one."""
    for name, x in (("query", query), ("key", key), ("value", value), ("g", g), ("beta", beta)):
        require_float(name, x)
    for name, x in (("query", query), ("key", key), ("value", value)):
        if x.dim() != 4:
            raise ValueError(
                f"{name}: got shape {shape_str(x.shape)} ({x.dim()}-D), expected 4-D (B, T, H, D)"
            )
    if query.shape != key.shape:
        raise ValueError(
            f"key: got shape {shape_str(key.shape)}, expected the query's {shape_str(query.shape)}"
            f" (B, T, H, Dk)"
        )
    if value.shape[:3] != query.shape[:3]:
        raise ValueError(
            f"value: got shape {shape_str(value.shape)}, expected (B, T, H) = "
            f"{shape_str(query.shape[:3])} as in query, then Dv"
        )
    for name, x in (("g", g), ("beta", beta)):
        if x.shape != query.shape[:3]:
            raise ValueError(
                f"{name}: got shape {shape_str(x.shape)}, expected (B, T, H) = "
                f"{shape_str(query.shape[:3])}, one number per token and head"
            )
    if not query.dtype == key.dtype == value.dtype:
        raise ValueError(
            f"query, key, value: got dtypes {query.dtype}, {key.dtype}, {value.dtype}, "
            f"expected one dtype for all three"
        )
    if bool((g > 0).any()):
        raise ValueError(
            f"g: got a largest value {g.max().item():.4g}, expected log-decays <= 0 "
            f"(the state is multiplied by a = e^g <= 1)"
        )
    if bool(((beta < 0) | (beta > 1)).any()):
        raise ValueError(
            f"beta: got values in [{beta.min().item():.4g}, {beta.max().item():.4g}], "
            f"expected writing strengths in [0, 1]"
        )
    if initial_state is not None:
        require_float("initial_state", initial_state)
        B, _, H, Dk = query.shape
        expected = (B, H, Dk, value.shape[-1])
        if tuple(initial_state.shape) != expected:
            raise ValueError(
                f"initial_state: got shape {shape_str(initial_state.shape)}, expected "
                f"(B, H, Dk, Dv) = {shape_str(expected)}"
            )


def gated_delta_rule(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    initial_state: torch.Tensor | None = None,
    chunk_size: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The gated delta rule (Yang, Kautz & Hatamizadeh, 2024, arXiv:2412.06464).

    Per batch element and head, a state ``S`` of shape ``(Dk, Dv)`` (an associative memory:
    ``S^T k`` reads the value stored under key ``k``), updated at every token ``t``:

    .. math::
        S_t = a_t S_{t-1} + \\beta_t k_t (v_t - a_t S_{t-1}^\\top k_t)^\\top, \\quad
        o_t = S_t^\\top q_t / \\sqrt{D_k}, \\quad a_t = e^{g_t}

    First decay the memory by ``a_t``, read what it now holds for ``k_t``, then write a
    fraction ``beta_t`` of the difference to ``v_t``. With ``a = 1`` it is the delta rule
    (Schlag et al., 2021); with ``beta = 1`` and a unit-norm ``k_t`` the old value under
    ``k_t`` is replaced. The caller normalises ``q`` and ``k`` (Qwen3-Next l2-normalises them);
    nothing here does.

    ``chunk_size=None`` runs the recurrence token by token (``T`` Python steps).
    ``chunk_size=C`` runs the chunked (parallel) form: inside a chunk the ``C`` updates are
    rewritten, with the WY / UT transform, as one unit-lower-triangular ``C x C`` solve and
    matrix products; the state passes from chunk to chunk (``ceil(T / C)`` steps). Same
    result to 1e-5; ``T`` need not be a multiple of ``C`` (the last chunk is shorter).

    Hugging Face's counterparts (``transformers.models.qwen3_next.modeling_qwen3_next``):
    ``torch_recurrent_gated_delta_rule`` and ``torch_chunk_gated_delta_rule`` with
    ``use_qk_l2norm_in_kernel=False``, ``output_final_state=True``; they compute in float32,
    this function in the input's dtype (half precision in float32). They also accept fewer
    query/key heads than value heads and repeat them (``repeat_interleave``); here q, k and v
    have the same ``H``: repeat them first.

    Args:
        g: log-decays ``g_t <= 0``; ``a_t = e^{g_t}`` multiplies the state.
        beta: writing strengths in ``[0, 1]``.
        initial_state: the state before the first token (zeros when None), e.g. the state
            returned for the previous part of the sequence.
        chunk_size: None (recurrent) or a positive int (chunked).

    Shapes:
        query, key: ``(B, T, H, Dk)``; value: ``(B, T, H, Dv)``; g, beta: ``(B, T, H)``;
        initial_state: ``(B, H, Dk, Dv)``; returns ``(output (B, T, H, Dv), state (B, H, Dk,
        Dv))``, the state after the last token.
    """
    _check_delta_inputs(query, key, value, g, beta, initial_state)
    if chunk_size is not None:
        check_positive_int("chunk_size", chunk_size)
    dtype = query.dtype
    compute = torch.float32 if dtype in LOW_PRECISION else dtype
    # (B, T, H, D) -> (B, H, T, D): one independent recurrence per batch element and head.
    q, k, v = (x.transpose(1, 2).to(compute) for x in (query, key, value))
    g, beta = (x.transpose(1, 2).to(compute) for x in (g, beta))  # (B, H, T)
    q = q / math.sqrt(q.shape[-1])  # o_t = S_t^T q_t / sqrt(Dk): scale the queries once
    B, H, _, Dk = k.shape
    if initial_state is None:
        state = torch.zeros((B, H, Dk, v.shape[-1]), dtype=compute, device=q.device)
    else:
        state = initial_state.to(compute)
    if chunk_size is None:
        output, state = _delta_recurrent(q, k, v, g, beta, state)
    else:
        output, state = _delta_chunked(q, k, v, g, beta, state, chunk_size)
    return output.transpose(1, 2).to(dtype), state.to(dtype)  # (B, T, H, Dv), (B, H, Dk, Dv)


def _delta_recurrent(q, k, v, g, beta, state):
    """Token by token. Shapes: q, k ``(B, H, T, Dk)`` (q already scaled); v ``(B, H, T, Dv)``;
    g, beta ``(B, H, T)``; state ``(B, H, Dk, Dv)``."""
    outputs = []
    for t in range(q.shape[2]):
        a = g[:, :, t, None, None].exp()  # (B, H, 1, 1): the decay a_t = e^{g_t}
        state = a * state  # decay first: a_t S_{t-1}
        k_t = k[:, :, t]  # (B, H, Dk)
        read = (state * k_t[..., None]).sum(dim=-2)  # (a_t S_{t-1})^T k_t: (B, H, Dv)
        delta = beta[:, :, t, None] * (v[:, :, t] - read)  # beta_t (v_t - read): (B, H, Dv)
        state = state + k_t[..., :, None] * delta[..., None, :]  # + k_t delta^T: (B, H, Dk, Dv)
        outputs.append((state * q[:, :, t, :, None]).sum(dim=-2))  # S_t^T q_t: (B, H, Dv)
    return torch.stack(outputs, dim=2), state  # (B, H, T, Dv)


def _delta_chunked(q, k, v, g, beta, state, chunk: int):
    """Chunk by chunk, with the WY (UT transform) representation (Yang et al., 2024's
    chunkwise algorithm; as Qwen3-Next's ``torch_chunk_gated_delta_rule``).

    Inside a chunk of positions ``r = 1..C`` let ``G_r = g_1 + ... + g_r`` (the decay from
    the chunk's start is ``e^{G_r}``) and ``S_0`` the state before it. Unrolling the update
    gives ``S_r = e^{G_r} S_0 + sum_{s<=r} e^{G_r - G_s} k_s u_s^T`` for "pseudo-values" ``u_s``
    that satisfy ``u_r = beta_r (v_r - e^{G_r} S_0^T k_r - sum_{s<r} e^{G_r - G_s} (k_r.k_s) u_s)``,
    i.e. the unit-lower-triangular system

        (I + L) U = diag(beta) V - diag(beta e^G) K S_0,   L_rs = beta_r e^{G_r-G_s} k_r.k_s (s<r)

    so ``U = W_v - W_k S_0`` with ``W_v = (I + L)^-1 diag(beta) V`` and
    ``W_k = (I + L)^-1 diag(beta e^G) K``, both independent of ``S_0``. Then

        O = (Q * e^G) S_0 + (Q K^T * Gamma) U,   Gamma_rs = e^{G_r - G_s} for s <= r, else 0
        S_C = e^{G_C} S_0 + (K * e^{G_C - G})^T U

    The intra-chunk term is weighted by the decays ``Gamma``, not by a 0/1 causal mask
    (issue 15 of NVlabs/GatedDeltaNet reports that the paper's chunkwise output formula
    writes the mask there).

    Shapes: as :func:`_delta_recurrent`.
    """
    T = q.shape[2]
    outputs = []
    for t0 in range(0, T, chunk):
        rows = slice(t0, t0 + chunk)
        q_c, k_c, v_c = q[:, :, rows], k[:, :, rows], v[:, :, rows]  # (B, H, C, D)
        b_c = beta[:, :, rows, None]  # (B, H, C, 1)
        G = g[:, :, rows].cumsum(dim=-1)  # (B, H, C): log of the decay since the chunk's start
        C = G.shape[-1]  # the last chunk may be shorter
        lower = torch.ones(C, C, dtype=torch.bool, device=q.device).tril()  # s <= r
        # Gamma_rs = e^{G_r - G_s} for s <= r. Mask before exp: for s > r, G_r - G_s >= 0 and
        # could overflow.
        diff = (G[..., :, None] - G[..., None, :]).masked_fill(~lower, -math.inf)
        gamma = diff.exp()  # (B, H, C, C)
        # L_rs = beta_r e^{G_r - G_s} k_r.k_s, strictly below the diagonal.
        L = (b_c * (k_c @ k_c.transpose(-2, -1)) * gamma).tril(diagonal=-1)  # (B, H, C, C)
        eye = torch.eye(C, dtype=q.dtype, device=q.device)
        rhs = torch.cat([b_c * v_c, b_c * G[..., None].exp() * k_c], dim=-1)  # (B, H, C, Dv+Dk)
        # One forward substitution solves (I + L) X = rhs for both right-hand sides.
        solved = torch.linalg.solve_triangular(eye + L, rhs, upper=False, unitriangular=True)
        w_v, w_k = solved.split([v_c.shape[-1], k_c.shape[-1]], dim=-1)
        u = w_v - w_k @ state  # (B, H, C, Dv): the pseudo-values, now that S_0 is known
        inter = (q_c * G[..., None].exp()) @ state  # what the earlier chunks contribute
        intra = ((q_c @ k_c.transpose(-2, -1)) * gamma) @ u  # (B, H, C, C) @ (B, H, C, Dv)
        outputs.append(inter + intra)
        G_last = G[..., -1:]  # (B, H, 1)
        state = G_last[..., None].exp() * state + (
            (k_c * (G_last - G)[..., None].exp()).transpose(-2, -1) @ u
        )  # e^{G_C} S_0 + (K * e^{G_C - G})^T U: (B, H, Dk, Dv)
    return torch.cat(outputs, dim=2), state
