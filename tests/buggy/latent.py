"""Exercise 18: the absorbed MLA attention ``mla_absorbed_attention(q, latent, k_rope, w_ukv,
d_v) -> (output, q_absorbed)`` and ``kv_cache_bytes(config, tokens, batch=1)``, right and
with one mistake each. Each is written as a student would, on the package's ``apply_rope``
(which exercise 18 hands out)."""

import math

import numpy as np
import torch

import attention_course as ac
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
    rope_head_zero=False,
    softmax_dim=-1,
    no_mask=False,
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
    rope_scores = q_rope @ k_r
    if rope_head_zero:  # the shared key's term kept for head 0 only
        rope_scores = rope_scores * (torch.arange(H) == 0).to(q.dtype).view(H, 1, 1)
    scores = q_absorbed @ latent[:, None].transpose(-1, -2) + rope_scores
    scores = scores / math.sqrt(scale_width or (d_nope + d_rope))
    keep = torch.ones(T, S, dtype=torch.bool).tril(diagonal=0 if no_offset else S - T)
    if no_mask:
        keep = torch.ones(T, S, dtype=torch.bool)
    weights = torch.softmax(scores.masked_fill(~keep, float("-inf")), dim=softmax_dim)
    weights = weights.nan_to_num()  # a column with no key left (softmax over the queries)
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


def mla_rope_term_on_head_zero(q, latent, k_rope, w_ukv, d_v):
    """The shared rotary key's term added to head 0's scores only."""
    return _mla(q, latent, k_rope, w_ukv, d_v, rope_head_zero=True)


def mla_softmax_over_queries(q, latent, k_rope, w_ukv, d_v):
    """The softmax over dim -2 (the queries), NaN of empty columns zeroed."""
    return _mla(q, latent, k_rope, w_ukv, d_v, softmax_dim=-2)


def mla_no_causal_mask(q, latent, k_rope, w_ukv, d_v):
    """No causal mask: every new query sees every position, the later new ones too."""
    return _mla(q, latent, k_rope, w_ukv, d_v, no_mask=True)


def mla_causal_mask_hides_diagonal(q, latent, k_rope, w_ukv, d_v):
    """The mask keeps j < S - T + t (the query's own position hidden), NaN rows zeroed."""
    B, H, T, _ = q.shape
    S, r = latent.shape[1], latent.shape[2]
    d_rope = k_rope.shape[-1]
    d_nope = q.shape[-1] - d_rope
    W = w_ukv.view(H, d_nope + d_v, r)
    q_absorbed = torch.einsum("bhtd,hdr->bhtr", q[..., :d_nope], W[:, :d_nope])
    q_rope = apply_rope(q[..., d_nope:], torch.arange(S - T, S))
    scores = q_absorbed @ latent[:, None].transpose(-1, -2)
    scores = (scores + q_rope @ k_rope[:, None].transpose(-1, -2)) / math.sqrt(d_nope + d_rope)
    keep = torch.ones(T, S, dtype=torch.bool).tril(diagonal=S - T - 1)
    weights = torch.softmax(scores.masked_fill(~keep, float("-inf")), dim=-1).nan_to_num()
    out = torch.einsum("bhtr,hvr->bhtv", weights @ latent[:, None], W[:, d_nope:])
    return out, q_absorbed


def mla_q_absorbed_scaled(q, latent, k_rope, w_ukv, d_v):
    """Returns q_absorbed already multiplied by 1/sqrt(d_nope + d_rope)."""
    out, q_absorbed = _mla(q, latent, k_rope, w_ukv, d_v)
    return out, q_absorbed / math.sqrt(q.shape[-1])


def mla_naive_form(q, latent, k_rope, w_ukv, d_v):
    """The naive form the task asks to avoid: per-head keys (B, H, S, d_nope) and values
    (B, H, S, d_v) built from the latent. Its results are the right ones, and the checker
    grades the results only: it passes (the statement says so)."""
    B, H, T, _ = q.shape
    S, r = latent.shape[1], latent.shape[2]
    d_rope = k_rope.shape[-1]
    d_nope = q.shape[-1] - d_rope
    W = w_ukv.view(H, d_nope + d_v, r)
    k = torch.einsum("hnr,bsr->bhsn", W[:, :d_nope], latent)
    v = torch.einsum("hvr,bsr->bhsv", W[:, d_nope:], latent)
    keys = torch.cat([k, k_rope[:, None].expand(B, H, S, d_rope)], dim=-1)
    queries = torch.cat([q[..., :d_nope], apply_rope(q[..., d_nope:], torch.arange(S - T, S))], -1)
    keep = torch.ones(T, S, dtype=torch.bool).tril(diagonal=S - T)
    scores = (queries @ keys.transpose(-1, -2) / math.sqrt(d_nope + d_rope)).masked_fill(
        ~keep, float("-inf")
    )
    q_absorbed = torch.einsum("bhtn,hnr->bhtr", q[..., :d_nope], W[:, :d_nope])
    return scores.softmax(-1) @ v, q_absorbed


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


def kv_cache_bytes_int32(config, tokens, batch=1):
    """Counts in numpy's int32 (numpy < 2's default integer on Windows): wraps around above
    2^31 bytes. Not in CATALOGUE: which *drawn* cases exceed 2^31 depends on the run seed
    (tests/test_seed.py wants the same verdict in every case under every seed); the two
    fixed cases above 2^31 and 2^32 fail it under every seed, which
    tests/test_exercises_18_19.py checks."""
    factors = [_per_layer(config), config["num_layers"], tokens, batch]
    with np.errstate(over="ignore"):
        return int(np.prod([*factors, config["bytes_per_number"]], dtype=np.int32))


def kv_cache_bytes_bits(config, tokens, batch=1):
    """Multiplies by 8: bits, not bytes."""
    return reference_kv_cache_bytes(config, tokens, batch) * 8


def kv_cache_bytes_mla_latent_twice(config, tokens, batch=1):
    """MLA's latent counted for keys and for values, the rotary key once: 2 kv_rank + d_rope."""
    if config["attention"] != "mla":
        return reference_kv_cache_bytes(config, tokens, batch)
    per = 2 * config["kv_rank"] + config["d_rope"]
    return per * config["num_layers"] * tokens * batch * config["bytes_per_number"]


def kv_cache_bytes_mla_per_head(config, tokens, batch=1):
    """MLA's latent and rotary key counted once per head."""
    if config["attention"] != "mla":
        return reference_kv_cache_bytes(config, tokens, batch)
    per = config["num_heads"] * (config["kv_rank"] + config["d_rope"])
    return per * config["num_layers"] * tokens * batch * config["bytes_per_number"]


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
    (
        "mla_absorbed_attention",
        "rope term on head 0 only",
        mla_rope_term_on_head_zero,
        "mla-k-rope-head-zero-only",
    ),
    (
        "mla_absorbed_attention",
        "softmax over the queries",
        mla_softmax_over_queries,
        "softmax-over-queries",
    ),
    ("mla_absorbed_attention", "no causal mask", mla_no_causal_mask, "no-causal-mask"),
    (
        "mla_absorbed_attention",
        "mask hides the diagonal",
        mla_causal_mask_hides_diagonal,
        "causal-mask-hides-diagonal",
    ),
    ("mla_absorbed_attention", "q_absorbed scaled", mla_q_absorbed_scaled, "mla-q-absorbed-scaled"),
    ("kv_cache_bytes", "bits", kv_cache_bytes_bits, "cache-counted-in-bits"),
    (
        "kv_cache_bytes",
        "MLA latent twice, rope once",
        kv_cache_bytes_mla_latent_twice,
        "cache-mla-keys-and-values",
    ),
    ("kv_cache_bytes", "MLA per head", kv_cache_bytes_mla_per_head, "cache-mla-per-head"),
]


# ---------------------------------------------------------------- the module


class _MLA(torch.nn.Module):
    """A student's MultiHeadLatentAttention (the contract's names), with switches for one
    mistake each; right with every switch off."""

    whole_rope = False  # RoPE on the whole query and key (naive form)
    scale_d_nope = False
    no_broadcast = False  # absorbed: q_rope @ k_rope.transpose(-1, -2)
    uk_transposed = False  # absorbed: q_nope @ W_UK_h.T
    positions_from_zero = False  # with a cache: new tokens rotated at 0 .. T - 1
    no_offset = False  # with a cache: the causal mask aligned at the top left

    def __init__(
        self,
        d_model,
        num_heads,
        kv_rank,
        q_rank=None,
        d_nope=None,
        d_rope=None,
        d_v=None,
        rope_base=10000.0,
        eps=1e-6,
    ):
        super().__init__()
        H = num_heads
        self.H, self.r, self.q_rank = H, kv_rank, q_rank
        self.dn = d_nope or d_model // H
        self.dr = d_rope or d_model // (2 * H)
        if self.dr % 2:
            raise ValueError(f"d_rope: got {self.dr}, expected an even int")
        self.dv = d_v or d_model // H
        self.base = rope_base
        dq = self.dn + self.dr
        if q_rank is None:
            self.w_q = torch.nn.Linear(d_model, H * dq, bias=False)
        else:
            self.w_dq = torch.nn.Linear(d_model, q_rank, bias=False)
            self.q_norm = ac.RMSNorm(q_rank, eps)
            self.w_uq = torch.nn.Linear(q_rank, H * dq, bias=False)
        self.w_dkv = torch.nn.Linear(d_model, kv_rank + self.dr, bias=False)
        self.kv_norm = ac.RMSNorm(kv_rank, eps)
        self.w_ukv = torch.nn.Linear(kv_rank, H * (self.dn + self.dv), bias=False)
        self.w_o = torch.nn.Linear(H * self.dv, d_model, bias=False)

    def new_cache(self):
        return ac.latent.LatentCache()

    def forward(self, x, cache=None, absorbed=False):
        B, T, _ = x.shape
        H, dn, dr, dv, r = self.H, self.dn, self.dr, self.dv, self.r
        start = 0 if cache is None else cache.length
        q = self.w_q(x) if self.q_rank is None else self.w_uq(self.q_norm(self.w_dq(x)))
        q = q.view(B, T, H, dn + dr).transpose(1, 2)
        latent, k_rope = self.w_dkv(x).split([r, dr], dim=-1)
        latent = self.kv_norm(latent)
        positions = torch.arange(T) if self.positions_from_zero else torch.arange(start, start + T)
        q_nope, q_rope = q[..., :dn], apply_rope(q[..., dn:], positions, self.base)
        k_rope = apply_rope(k_rope, torch.arange(start, start + T), self.base)
        if cache is not None:
            latent, k_rope = cache.update(latent, k_rope)
        S = latent.shape[1]
        W = self.w_ukv.weight.view(H, dn + dv, r)
        w_uk, w_uv = W[:, :dn], W[:, dn:]
        keep = torch.ones(T, S, dtype=torch.bool).tril(diagonal=0 if self.no_offset else S - T)
        scale = dn**-0.5 if self.scale_d_nope else (dn + dr) ** -0.5
        if absorbed:
            if self.uk_transposed:
                q_lat = q_nope @ w_uk.transpose(-1, -2)[None]
            else:
                q_lat = q_nope @ w_uk[None]
            k_r = (
                k_rope.transpose(-1, -2) if self.no_broadcast else k_rope[:, None].transpose(-1, -2)
            )
            scores = q_lat @ latent[:, None].transpose(-1, -2) + q_rope @ k_r
            weights = torch.softmax((scores * scale).masked_fill(~keep, float("-inf")), -1)
            heads = (weights @ latent[:, None]) @ w_uv.transpose(-1, -2)[None]
        else:
            kv = self.w_ukv(latent).view(B, S, H, dn + dv).transpose(1, 2)
            k_nope, v = kv[..., :dn], kv[..., dn:]
            k = torch.cat([k_nope, k_rope[:, None].expand(B, H, S, dr)], dim=-1)
            qq = torch.cat([q_nope, q_rope], dim=-1)
            if self.whole_rope:  # rotate everything: undo the rope part, rotate the whole
                qq = apply_rope(q, positions, self.base)
                unrot = apply_rope(k_rope, -torch.arange(S), self.base)
                k = apply_rope(
                    torch.cat([k_nope, unrot[:, None].expand(B, H, S, dr)], -1),
                    torch.arange(S),
                    self.base,
                )
            scores = qq @ k.transpose(-1, -2) * scale
            weights = torch.softmax(scores.masked_fill(~keep, float("-inf")), -1)
            heads = weights @ v
        return self.w_o(heads.transpose(1, 2).reshape(B, T, H * dv))


class MLAStudent(_MLA):
    """Right: a student's own module (no mistake switched on)."""


class MLARopeOnWholeKey(_MLA):
    """RoPE applied to the whole query and the whole key [k_nope | k_rope]."""

    whole_rope = True


class MLAScaleFromDNope(_MLA):
    """Scores scaled by 1/sqrt(d_nope)."""

    scale_d_nope = True


class MLAKRopeNotBroadcast(_MLA):
    """Absorbed form: k_rope (B, S, dr) used without a head axis."""

    no_broadcast = True


class MLAUKTransposed(_MLA):
    """Absorbed form: q_nope @ W_UK_h.T."""

    uk_transposed = True


class MLAPositionsFromZero(_MLA):
    """With a cache the new tokens are rotated at 0 .. T - 1."""

    positions_from_zero = True


class MLAMaskWithoutOffset(_MLA):
    """With a cache the causal mask of the (T, S) block is aligned at the top left."""

    no_offset = True


CATALOGUE += [
    (
        "multi_head_latent_attention",
        "RoPE on the whole key",
        MLARopeOnWholeKey,
        "mla-rope-on-whole-query",
    ),
    (
        "multi_head_latent_attention",
        "scale from d_nope",
        MLAScaleFromDNope,
        "mla-scale-from-d-nope",
    ),
    (
        "multi_head_latent_attention",
        "k_rope not broadcast",
        MLAKRopeNotBroadcast,
        "mla-k-rope-not-broadcast",
    ),
    ("multi_head_latent_attention", "W_UK transposed", MLAUKTransposed, "mla-uk-transposed"),
    (
        "multi_head_latent_attention",
        "positions from 0",
        MLAPositionsFromZero,
        "mla-queries-at-zero",
    ),
    (
        "multi_head_latent_attention",
        "mask without offset",
        MLAMaskWithoutOffset,
        "mla-causal-no-offset",
    ),
]
