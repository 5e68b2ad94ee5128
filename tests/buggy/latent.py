"""Exercise 18: the absorbed MLA attention ``mla_absorbed_attention(q, latent, k_rope, w_ukv,
d_v) -> (output, q_absorbed)`` and ``kv_cache_bytes(config, tokens, batch=1)``, right and
with one mistake each. Each is written as a student would, on the package's ``apply_rope``
(which exercise 18 hands out)."""

import math

import numpy as np
import torch

from attention_course import apply_rope


def _mla(
    q,
    latent,
    k_rope,
    w_ukv,
    d_v,
    *,
    whole_query=False,
    rotate_k=False,
    no_broadcast=False,
    scale_width=None,
    uk_transposed=False,
    uv_transposed=False,
    weight_in_out=False,
    no_offset=False,
    positions_from_zero=False,
):
    B, H, T, _ = q.shape
    S, r = latent.shape[1], latent.shape[2]
    d_rope = k_rope.shape[-1]
    d_nope = q.shape[-1] - d_rope
    if weight_in_out:
        W = w_ukv.reshape(r, H, d_nope + d_v).permute(1, 2, 0)
    else:
        W = w_ukv.view(H, d_nope + d_v, r)
    w_uk, w_uv = W[:, :d_nope], W[:, d_nope:]  # (H, d_nope, r), (H, d_v, r)
    positions = torch.arange(T) if positions_from_zero else torch.arange(S - T, S)
    if whole_query:
        q = apply_rope(q, positions)
        q_nope, q_rope = q[..., :d_nope], q[..., d_nope:]
    else:
        q_nope, q_rope = q[..., :d_nope], apply_rope(q[..., d_nope:], positions)
    if rotate_k:
        k_rope = apply_rope(k_rope, torch.arange(S))
    if uk_transposed:
        q_absorbed = q_nope @ w_uk.transpose(-1, -2)[None]  # (dn, r) read as (r, dn)
    else:
        q_absorbed = torch.einsum("bhtd,hdr->bhtr", q_nope, w_uk)
    k_r = k_rope.transpose(-1, -2) if no_broadcast else k_rope[:, None].transpose(-1, -2)
    scores = q_absorbed @ latent[:, None].transpose(-1, -2) + q_rope @ k_r
    scores = scores / math.sqrt(scale_width or (d_nope + d_rope))
    keep = torch.ones(T, S, dtype=torch.bool).tril(diagonal=0 if no_offset else S - T)
    weights = torch.softmax(scores.masked_fill(~keep, float("-inf")), dim=-1)
    context = weights @ latent[:, None]  # (B, H, T, r)
    if uv_transposed:
        out = context @ w_uv[None]  # (r, d_v) expected, (d_v, r) given
    else:
        out = torch.einsum("bhtr,hvr->bhtv", context, w_uv)
    return out, q_absorbed


def reference_mla_absorbed_attention(q, latent, k_rope, w_ukv, d_v):
    """Right: W_UK folded into the queries, attention over the latent, W_UV after."""
    return _mla(q, latent, k_rope, w_ukv, d_v)


def mla_rope_whole_query(q, latent, k_rope, w_ukv, d_v):
    """RoPE applied to the whole query [q_nope | q_rope], not to q_rope alone."""
    return _mla(q, latent, k_rope, w_ukv, d_v, whole_query=True)


def mla_rotates_k_rope_again(q, latent, k_rope, w_ukv, d_v):
    """Rotates the cached k_rope, which the cache stores already rotated."""
    return _mla(q, latent, k_rope, w_ukv, d_v, rotate_k=True)


def mla_k_rope_not_broadcast(q, latent, k_rope, w_ukv, d_v):
    """``q_rope @ k_rope.transpose(-1, -2)``: k_rope (B, S, dr) has no head axis, so with
    B == H head h meets sequence h's key (and B != H, B > 1 raises)."""
    return _mla(q, latent, k_rope, w_ukv, d_v, no_broadcast=True)


def mla_scale_from_d_nope(q, latent, k_rope, w_ukv, d_v):
    """Scales the scores by 1/sqrt(d_nope) instead of 1/sqrt(d_nope + d_rope)."""
    d_nope = q.shape[-1] - k_rope.shape[-1]
    return _mla(q, latent, k_rope, w_ukv, d_v, scale_width=d_nope)


def mla_scale_from_latent(q, latent, k_rope, w_ukv, d_v):
    """Scales by 1/sqrt(kv_rank + d_rope), the width of the absorbed dot product."""
    width = latent.shape[-1] + k_rope.shape[-1]
    return _mla(q, latent, k_rope, w_ukv, d_v, scale_width=width)


def mla_uk_transposed(q, latent, k_rope, w_ukv, d_v):
    """Absorbs W_UK with the wrong transpose, q_nope @ W_UK_h.T (shape-valid only when
    kv_rank == d_nope, so it raises elsewhere)."""
    return _mla(q, latent, k_rope, w_ukv, d_v, uk_transposed=True)


def mla_uv_transposed(q, latent, k_rope, w_ukv, d_v):
    """Applies W_UV without its transpose after the weighted sum (shape-valid only when
    kv_rank == d_v)."""
    return _mla(q, latent, k_rope, w_ukv, d_v, uv_transposed=True)


def mla_weight_read_as_in_out(q, latent, k_rope, w_ukv, d_v):
    """Reads the nn.Linear weight w_ukv as (kv_rank, H * (d_nope + d_v)), in x out."""
    return _mla(q, latent, k_rope, w_ukv, d_v, weight_in_out=True)


def mla_mask_without_offset(q, latent, k_rope, w_ukv, d_v):
    """The causal mask of a (T, S) block aligned at the top left: the new queries miss the
    cached keys they may see."""
    return _mla(q, latent, k_rope, w_ukv, d_v, no_offset=True)


def mla_queries_at_zero(q, latent, k_rope, w_ukv, d_v):
    """Rotates the new queries at positions 0 .. T - 1 instead of S - T .. S - 1."""
    return _mla(q, latent, k_rope, w_ukv, d_v, positions_from_zero=True)


# ---------------------------------------------------------------- kv_cache_bytes


def _per_layer(config, *, twice=False, no_rope=False, keys_only=False, all_heads=False):
    kind, H, Dh = config["attention"], config["num_heads"], config["head_dim"]
    if kind == "mla":
        rope = 0 if no_rope else config["d_rope"]
        return (2 if twice else 1) * (config["kv_rank"] + rope)
    heads = {"mha": H, "gqa": config.get("num_kv_heads"), "mqa": 1}[kind]
    if all_heads:
        heads = H
    return (1 if keys_only else 2) * heads * Dh


def reference_kv_cache_bytes(config, tokens, batch=1):
    """Right: per token and layer MHA 2 H Dh, GQA 2 Hkv Dh, MQA 2 Dh, MLA kv_rank + d_rope."""
    numbers = _per_layer(config) * config["num_layers"] * tokens * batch
    return numbers * config["bytes_per_number"]


def kv_cache_bytes_numpy(config, tokens, batch=1):
    """Right, but returns a numpy int64 (accepted: a number is a number)."""
    return np.int64(reference_kv_cache_bytes(config, tokens, batch))


def kv_cache_bytes_mla_twice(config, tokens, batch=1):
    """Counts MLA's latent (and rotary key) once for the keys and once for the values."""
    numbers = _per_layer(config, twice=True) * config["num_layers"] * tokens * batch
    return numbers * config["bytes_per_number"]


def kv_cache_bytes_mla_no_rope(config, tokens, batch=1):
    """Forgets MLA's shared rotary key: kv_rank numbers per token per layer."""
    numbers = _per_layer(config, no_rope=True) * config["num_layers"] * tokens * batch
    return numbers * config["bytes_per_number"]


def kv_cache_bytes_keys_only(config, tokens, batch=1):
    """Counts the keys only for MHA, GQA and MQA."""
    numbers = _per_layer(config, keys_only=True) * config["num_layers"] * tokens * batch
    return numbers * config["bytes_per_number"]


def kv_cache_bytes_all_heads(config, tokens, batch=1):
    """GQA and MQA counted with all the query heads."""
    numbers = _per_layer(config, all_heads=True) * config["num_layers"] * tokens * batch
    return numbers * config["bytes_per_number"]


def kv_cache_bytes_numbers(config, tokens, batch=1):
    """Returns the count of numbers, not bytes."""
    return _per_layer(config) * config["num_layers"] * tokens * batch


def kv_cache_bytes_no_batch(config, tokens, batch=1):
    """Ignores the batch."""
    return _per_layer(config) * config["num_layers"] * tokens * config["bytes_per_number"]


def kv_cache_bytes_float(config, tokens, batch=1):
    """Returns a rounded float in gigabytes' style (bytes / 1e9): not a whole number."""
    return round(reference_kv_cache_bytes(config, tokens, batch) / 1e9, 3)


CATALOGUE = [
    (
        "mla_absorbed_attention",
        "RoPE on the whole query",
        mla_rope_whole_query,
        "mla-rope-on-whole-query",
    ),
    (
        "mla_absorbed_attention",
        "k_rope rotated again",
        mla_rotates_k_rope_again,
        "mla-k-rope-rotated-again",
    ),
    (
        "mla_absorbed_attention",
        "k_rope not broadcast",
        mla_k_rope_not_broadcast,
        "mla-k-rope-not-broadcast",
    ),
    ("mla_absorbed_attention", "scale from d_nope", mla_scale_from_d_nope, "mla-scale-from-d-nope"),
    (
        "mla_absorbed_attention",
        "scale from the latent",
        mla_scale_from_latent,
        "mla-scale-from-latent",
    ),
    ("mla_absorbed_attention", "W_UK transposed", mla_uk_transposed, "mla-uk-transposed"),
    ("mla_absorbed_attention", "W_UV transposed", mla_uv_transposed, "mla-uv-transposed"),
    (
        "mla_absorbed_attention",
        "w_ukv read as in x out",
        mla_weight_read_as_in_out,
        "mla-ukv-read-as-in-out",
    ),
    (
        "mla_absorbed_attention",
        "mask without offset",
        mla_mask_without_offset,
        "mla-causal-no-offset",
    ),
    ("mla_absorbed_attention", "queries at 0", mla_queries_at_zero, "mla-queries-at-zero"),
    ("kv_cache_bytes", "MLA counted twice", kv_cache_bytes_mla_twice, "cache-mla-keys-and-values"),
    ("kv_cache_bytes", "MLA without rope key", kv_cache_bytes_mla_no_rope, "cache-mla-no-rope-key"),
    ("kv_cache_bytes", "keys only", kv_cache_bytes_keys_only, "cache-keys-only"),
    ("kv_cache_bytes", "all heads", kv_cache_bytes_all_heads, "cache-kv-heads-ignored"),
    ("kv_cache_bytes", "numbers not bytes", kv_cache_bytes_numbers, "cache-bytes-ignored"),
    ("kv_cache_bytes", "batch ignored", kv_cache_bytes_no_batch, "cache-batch-ignored"),
    ("kv_cache_bytes", "rounded float", kv_cache_bytes_float, "whole number"),
]
