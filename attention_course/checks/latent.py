"""Checkers for exercise 18 (multi-head latent attention, DeepSeek-AI 2024, "DeepSeek-V2",
arXiv:2405.04434, section 2.1): the absorbed attention over a latent cache, and the bytes
of a model's KV cache.

``mla_absorbed_attention(q, latent, k_rope, w_ukv, d_v) -> (output, q_absorbed)``: the
attention step of :class:`~attention_course.latent.MultiHeadLatentAttention` with
``absorbed=True``, given what the module has computed before it:

* ``q (B, H, T, d_nope + d_rope)``: the new tokens' queries, per head ``[q_nope | q_rope]``,
  **not yet rotated**;
* ``latent (B, S, kv_rank)``: the cached latent (after ``kv_norm``) of all S positions, the
  T new ones last;
* ``k_rope (B, S, d_rope)``: the shared rotary key, as the cache stores it (already
  rotated at positions 0 .. S - 1);
* ``w_ukv``: the module's ``w_ukv.weight``, ``(H * (d_nope + d_v), kv_rank)``, per head
  ``[k_nope | v]`` rows.

It returns ``output (B, H, T, d_v)`` (each head's result, before ``w_o``) and the absorbed
queries ``q_absorbed (B, H, T, kv_rank)``, ``q_nope @ W_UK_h`` per head: the part of the
score that runs over the latent. The queries sit at positions S - T .. S - 1; the scale is
``(d_nope + d_rope)^-1/2``; causal.

The expected values come from the naive form written out here (:func:`naive_mla`: keys and
values decompressed from the latent), which ``tests/test_exercises_18_19.py`` checks
against the package's ``MultiHeadLatentAttention``; the named mistakes are the same
computation with one thing wrong (RoPE on the whole query, the shared rotary key rotated
twice or not broadcast over the heads, the scale from d_nope or from the latent width,
absorption with the wrong transpose, ``w_ukv`` read the wrong way, the causal mask or the
positions without the cached tokens, the rotary term on head 0 only, the softmax over the
queries, no mask or one that hides the diagonal, ``q_absorbed`` returned scaled).

What is graded is the two results, nothing else: the checker cannot see *how* they were
computed, so the naive form (per-head keys and values built from the latent) returns the
same tensors and passes. The exercise's statement says so; nothing here pretends to detect
it.

``kv_cache_bytes(config, tokens, batch=1) -> int``: the bytes of the KV cache of a model
described by ``config`` (MHA, GQA, MQA or MLA) after ``tokens`` tokens; checked on
configurations drawn from the run seed, so that no number can be looked up, and on two
fixed ones (the same under every run seed) whose caches pass 2^31 and 2^32 bytes, so that a
count in 32-bit integers fails in the check cell as in the grader (named: the wrong
number differs from the right one by a multiple of 2^32).
"""

from __future__ import annotations

import math

import torch

from ._answers import is_number, plain, show
from ._compare import expect_close, expect_tuple
from ._data import generator, randn
from ._mistakes import says
from ._modules import build_pair, expect_same_grads
from ._runner import TRIVIAL, Case, CaseFailed, call_student, checker, expect_value_error

# ---------------------------------------------------------------- the naive form


def _rope(x: torch.Tensor, positions: torch.Tensor, base: float = 10000.0) -> torch.Tensor:
    """Half-split RoPE in float64 (chapter 14's layout), an independent implementation."""
    half = x.shape[-1] // 2
    i = torch.arange(half, dtype=torch.float64)
    angles = positions.to(torch.float64)[:, None] * base ** (-2.0 * i / x.shape[-1])
    cos, sin = angles.cos(), angles.sin()
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def naive_mla(q, latent, k_rope, w_ukv, d_v, variant: str | None = None, base: float = 10000.0):
    """``(output (B, H, T, d_v), q_absorbed (B, H, T, kv_rank))`` computed in float64 and
    cast back to q's dtype, right (``variant=None``) or with one known mistake."""
    dtype = q.dtype
    q, latent, k_rope, w_ukv = (t.detach().to(torch.float64) for t in (q, latent, k_rope, w_ukv))
    B, H, T, Dq = q.shape
    S, r = latent.shape[1], latent.shape[2]
    dr = k_rope.shape[-1]
    dn = Dq - dr
    if variant == "in_out":
        W = w_ukv.reshape(r, H, dn + d_v).permute(1, 2, 0)
    elif variant == "split":
        W = torch.cat(
            [w_ukv[: H * dn].reshape(H, dn, r), w_ukv[H * dn :].reshape(H, d_v, r)], dim=1
        )
    else:
        W = w_ukv.reshape(H, dn + d_v, r)
    W_UK, W_UV = W[:, :dn], W[:, dn:]  # (H, dn, r), (H, dv, r)
    positions = torch.arange(S - T, S)
    if variant == "queries_at_zero":
        positions = torch.arange(T)
    if variant == "whole_query":
        q = _rope(q, positions, base)
        q_nope, q_rope = q[..., :dn], q[..., dn:]
    else:
        q_nope, q_rope = q[..., :dn], _rope(q[..., dn:], positions, base)
    kr = _rope(k_rope, torch.arange(S), base) if variant == "rotate_again" else k_rope
    if variant == "whole_key":  # the naive form with RoPE on the whole query and key
        k_nope = torch.einsum("bsr,hdr->bhsd", latent, W_UK)
        unrotated = _rope(k_rope, -torch.arange(S), base)[:, None].expand(B, H, S, dr)
        k = _rope(torch.cat([k_nope, unrotated], dim=-1), torch.arange(S), base)
        q_full = _rope(torch.cat([q_nope, q[..., dn:]], dim=-1), positions, base)
        keep = torch.ones(T, S, dtype=torch.bool).tril(diagonal=S - T)
        scores = (q_full @ k.transpose(-1, -2) * (dn + dr) ** -0.5).masked_fill(~keep, -math.inf)
        v = torch.einsum("bsr,hvr->bhsv", latent, W_UV)
        q_lat = torch.einsum("bhtd,hdr->bhtr", q_nope, W_UK)
        return (torch.softmax(scores, dim=-1) @ v).to(dtype), q_lat.to(dtype)
    if variant == "uk_transposed":
        q_lat = torch.einsum("bhtd,hrd->bhtr", q_nope, W_UK)  # needs dn == r
    else:
        q_lat = torch.einsum("bhtd,hdr->bhtr", q_nope, W_UK)
    if variant == "not_broadcast":
        rope_scores = q_rope @ kr.transpose(-1, -2)  # (B, H, T, dr) @ (B, dr, S): B vs H
    else:
        rope_scores = q_rope @ kr[:, None].transpose(-1, -2)
    if variant == "rope_head_zero":  # the shared key's term given to head 0 only
        only_first = torch.zeros(H, 1, 1, dtype=rope_scores.dtype)
        only_first[0] = 1
        rope_scores = rope_scores * only_first
    scores = q_lat @ latent[:, None].transpose(-1, -2) + rope_scores
    width = {"scale_d_nope": dn, "scale_latent": r + dr}.get(variant, dn + dr)
    scores = scores * width**-0.5
    offset = 0 if variant == "no_offset" else S - T
    keep = torch.ones(T, S, dtype=torch.bool).tril(diagonal=offset)
    if variant == "no_mask":
        keep = torch.ones(T, S, dtype=torch.bool)
    if variant == "hides_diagonal":  # j < i: the first position sees nothing (NaN zeroed)
        keep = torch.ones(T, S, dtype=torch.bool).tril(diagonal=offset - 1)
    masked = scores.masked_fill(~keep, float("-inf"))
    if variant in ("softmax_queries", "hides_diagonal"):  # a row or column of -inf: NaN
        dim = -2 if variant == "softmax_queries" else -1
        weights = torch.softmax(masked, dim=dim).nan_to_num()
    else:
        weights = torch.softmax(masked, dim=-1)
    context = weights @ latent[:, None]  # (B, H, T, r)
    if variant == "uv_transposed":
        out = torch.einsum("bhtr,hrv->bhtv", context, W_UV)  # needs dv == r
    else:
        out = torch.einsum("bhtr,hvr->bhtv", context, W_UV)
    if variant == "q_absorbed_scaled":
        q_lat = q_lat * width**-0.5
    return out.to(dtype), q_lat.to(dtype)


_MLA_VARIANTS = {
    "whole_query": "mla-rope-on-whole-query",
    "whole_key": "mla-rope-on-whole-query",
    "rotate_again": "mla-k-rope-rotated-again",
    "not_broadcast": "mla-k-rope-not-broadcast",
    "scale_d_nope": "mla-scale-from-d-nope",
    "scale_latent": "mla-scale-from-latent",
    "uk_transposed": "mla-uk-transposed",
    "uv_transposed": "mla-uv-transposed",
    "in_out": "mla-ukv-read-as-in-out",
    "split": "mla-ukv-split-wrong",
    "no_offset": "mla-causal-no-offset",
    "queries_at_zero": "mla-queries-at-zero",
    "rope_head_zero": "mla-k-rope-head-zero-only",
    "softmax_queries": "softmax-over-queries",
    "no_mask": "no-causal-mask",
    "hides_diagonal": "causal-mask-hides-diagonal",
    "q_absorbed_scaled": "mla-q-absorbed-scaled",
}


def _mla_mistakes(inputs, d_v, which: int):
    return [
        (says(mistake), lambda v=variant: naive_mla(*inputs, d_v, v)[which])
        for variant, mistake in _MLA_VARIANTS.items()
    ]


def _mla_error_hint(text: str) -> str | None:
    if "must match the size" in text or "cannot be multiplied" in text:
        return (
            "k_rope (B, S, d_rope) and latent (B, S, kv_rank) have no head axis: give them "
            "one, `k_rope[:, None]`, before multiplying with the (B, H, T, .) queries; "
            "w_ukv is (H * (d_nope + d_v), kv_rank): view it as (H, d_nope + d_v, kv_rank)"
        )
    return None


def _mla_inputs(B, H, T, S, dn, dr, dv, r, seed, dtype):
    q = randn(B, H, T, dn + dr, seed=seed, dtype=dtype)
    latent = randn(B, S, r, seed=seed + 1, dtype=dtype)
    k_rope = _rope(randn(B, S, dr, seed=seed + 2), torch.arange(S)).to(dtype)
    w_ukv = (randn(H * (dn + dv), r, seed=seed + 3) / math.sqrt(r)).to(dtype)
    return q, latent, k_rope, w_ukv


def _mla_case(candidate, B, H, T, S, dn, dr, dv, r, *, seed, dtype=torch.float64):
    def run():
        inputs = _mla_inputs(B, H, T, S, dn, dr, dv, r, seed, dtype)
        expected = naive_mla(*inputs, dv)
        what = (
            f"mla_absorbed_attention(q {tuple(inputs[0].shape)}, latent "
            f"{tuple(inputs[1].shape)}, k_rope {tuple(inputs[2].shape)}, w_ukv "
            f"{tuple(inputs[3].shape)}, d_v={dv})"
        )
        got = call_student(
            candidate,
            *(t.clone() for t in inputs),
            dv,
            what=what,
            arg_names=("q", "latent", "k_rope", "w_ukv"),
            error_hint=_mla_error_hint,
        )
        got = expect_tuple(got, 2, what, ("output", "q_absorbed"))
        expect_close(
            got[0],
            expected[0],
            f"the output of {what}",
            mistakes=_mla_mistakes(inputs, dv, 0),
        )
        expect_close(
            got[1],
            expected[1],
            f"q_absorbed of {what} (each head's q_nope @ W_UK_h, (B, H, T, kv_rank))",
            mistakes=_mla_mistakes(inputs, dv, 1),
        )

    return run


@checker("mla_absorbed_attention", chapter="18_latent_attention")
def check_mla_absorbed_attention(candidate) -> list[Case]:
    """Check ``mla_absorbed_attention(q, latent, k_rope, w_ukv, d_v) -> (output (B, H, T,
    d_v), q_absorbed (B, H, T, kv_rank))``: MLA's attention run over the latent, W_UK folded
    into the queries, W_UV applied after the weighted sum."""
    return [
        Case(
            "B=2, H=3, T=S=4 (no earlier tokens), d_nope=4, d_rope=2, d_v=4, kv_rank=6",
            _mla_case(candidate, 2, 3, 4, 4, 4, 2, 4, 6, seed=1),
            covers=frozenset({"B>1", "S=T"}),
        ),
        Case(
            "S=7 cached positions, T=3 new, d_v=6 != d_nope=4, d_rope=4, kv_rank=5",
            _mla_case(candidate, 1, 2, 3, 7, 4, 4, 6, 5, seed=11),
            covers=frozenset({"S!=T", "d_v!=d_nope"}),
        ),
        Case(
            "B=2 sequences and H=2 heads, S=5, T=2: the shared rotary key per sequence",
            _mla_case(candidate, 2, 2, 2, 5, 4, 2, 4, 3, seed=21),
            covers=frozenset({"B>1", "B=H", "S!=T"}),
        ),
        Case(
            "kv_rank = d_nope = d_v = 4, S=6, T=3: the transposes of W_UK and W_UV",
            _mla_case(candidate, 1, 2, 3, 6, 4, 2, 4, 4, seed=31),
            covers=frozenset({"kv_rank=d_nope=d_v", "S!=T"}),
        ),
        Case(
            "one decoding step: T=1 query over S=9 cached positions, H=4",
            _mla_case(candidate, 2, 4, 1, 9, 2, 2, 2, 3, seed=41),
            covers=frozenset({"T=1", "S!=T", "B>1"}),
        ),
        Case(
            "H=1, T=S=3",
            _mla_case(candidate, 1, 1, 3, 3, 4, 2, 2, 3, seed=51),
            weight=TRIVIAL,
            covers=frozenset({"H=1"}),
        ),
        Case(
            "float32, B=2, H=2, S=6, T=4, kv_rank=8",
            _mla_case(candidate, 2, 2, 4, 6, 6, 2, 4, 8, seed=61, dtype=torch.float32),
            covers=frozenset({"dtype=float32", "S!=T"}),
        ),
    ]


# ---------------------------------------------------------------- the module


def _module_pieces(module, x_new: torch.Tensor, x_all: torch.Tensor):
    """What ``module`` (the reference) computes before its attention step for the last
    tokens ``x_new`` of ``x_all``: (q not rotated, latent, k_rope rotated)."""
    B, T, _ = x_new.shape
    H, dq = module.num_heads, module.d_nope + module.d_rope
    with torch.no_grad():
        if module.q_rank is None:
            q = module.w_q(x_new)
        else:
            q = module.w_uq(module.q_norm(module.w_dq(x_new)))
        q = q.view(B, T, H, dq).transpose(1, 2)
        a, k_rope = module.w_dkv(x_all).split([module.kv_rank, module.d_rope], dim=-1)
        latent = module.kv_norm(a)
        S = x_all.shape[1]
        k_rope = _rope(k_rope.to(torch.float64), torch.arange(S), module.rope_base)
    return q, latent, k_rope.to(x_all.dtype)


def _module_mistakes(module, x_new, x_all):
    """(message, output) of the module with each known mistake, from the reference's
    pieces (``naive_mla``'s variants, then the reference's ``w_o``)."""
    q, latent, k_rope = _module_pieces(module, x_new, x_all)
    base = module.rope_base
    B, T, _ = x_new.shape

    def output(variant):
        with torch.no_grad():
            heads = naive_mla(q, latent, k_rope, module.w_ukv.weight, module.d_v, variant, base)[0]
            return module.w_o(heads.transpose(1, 2).reshape(B, T, -1))

    return [(says(m), lambda v=v: output(v)) for v, m in _MLA_VARIANTS.items()]


def _mla_init_text(args, kwargs) -> str:
    parts = [repr(a) for a in args] + [f"{k}={v!r}" for k, v in kwargs.items()]
    return f"MultiHeadLatentAttention({', '.join(parts)})"


def _module_case(candidate, args, kwargs, *, B=2, T=5, seed, absorbed=False, dtype=torch.float64):
    def run():
        from attention_course.latent import MultiHeadLatentAttention

        student, reference = build_pair(
            candidate, MultiHeadLatentAttention, args, kwargs, dtype=dtype, seed=seed
        )
        x = randn(B, T, args[0], seed=seed + 1, dtype=dtype)
        with torch.no_grad():
            expected = reference(x, absorbed=absorbed)
        extra = {"absorbed": True} if absorbed else {}
        what = f"{_mla_init_text(args, kwargs)}(x {tuple(x.shape)}" + (
            ", absorbed=True)" if absorbed else ")"
        )
        with torch.no_grad():
            got = call_student(student, x.clone(), what=what, arg_names=("x",), **extra)
        expect_close(
            got,
            expected,
            f"the output of {what}",
            mistakes=_module_mistakes(reference, x, x),
        )

    return run


def _latent_cache_case(candidate, args, kwargs, chunks, *, seed, absorbed_last=True):
    """Feed ``chunks`` tokens at a time through one cache; each chunk's output must be the
    full pass's rows, and the cache must hold the latent and the rotated k_rope."""

    def run():
        from attention_course.latent import MultiHeadLatentAttention

        student, reference = build_pair(
            candidate, MultiHeadLatentAttention, args, kwargs, seed=seed
        )
        total = sum(chunks)
        x = randn(2, total, args[0], seed=seed + 1)
        with torch.no_grad():
            full = reference(x)
        name = _mla_init_text(args, kwargs)
        cache = call_student(student.new_cache, what=f"{name}.new_cache()")
        start = 0
        for i, n in enumerate(chunks):
            absorbed = absorbed_last and i == len(chunks) - 1
            what = (
                f"{name}(x[:, {start}:{start + n}], cache=cache"
                + (", absorbed=True)" if absorbed else ")")
                + f" after {start} cached tokens"
            )
            chunk = x[:, start : start + n]
            extra = {"absorbed": True} if absorbed else {}
            with torch.no_grad():
                got = call_student(student, chunk.clone(), what=what, cache=cache, **extra)
            expect_close(
                got,
                full[:, start : start + n],
                f"the output of {what}",
                mistakes=_module_mistakes(reference, chunk, x[:, : start + n]),
            )
            start += n
        _, latent, k_rope = _module_pieces(reference, x[:, :0], x)
        for attr, want in (("latent", latent), ("k_rope", k_rope)):
            held = getattr(cache, attr, None)
            if not isinstance(held, torch.Tensor):
                raise CaseFailed(
                    f"the cache after {total} tokens has no tensor `{attr}` (got "
                    f"{type(held).__name__}): new_cache() must return an object whose `latent` "
                    "(B, S, kv_rank) and `k_rope` (B, S, d_rope) hold every position so far"
                )
            expect_close(
                held,
                want,
                f"cache.{attr} after {total} tokens"
                + (
                    " (already rotated at each position)"
                    if attr == "k_rope"
                    else " (after kv_norm)"
                ),
            )
        length = plain(getattr(cache, "length", None))
        if length != total:
            raise CaseFailed(
                f"cache.length after {total} tokens: expected {total}, got {show(length)}"
            )

    return run


def _grad_module_case(candidate, args, kwargs, *, seed, absorbed):
    def run():
        from attention_course.latent import MultiHeadLatentAttention

        student, reference = build_pair(
            candidate, MultiHeadLatentAttention, args, kwargs, seed=seed
        )
        x0 = randn(2, 4, args[0], seed=seed + 1)
        mine, theirs = x0.clone().requires_grad_(True), x0.clone().requires_grad_(True)
        extra = {"absorbed": True} if absorbed else {}
        what = f"{_mla_init_text(args, kwargs)}(x" + (", absorbed=True)" if absorbed else ")")
        got = call_student(student, mine, what=what, **extra)
        expected = reference(theirs, **extra)
        got = expect_close(got, expected.detach(), f"the output of {what}")
        expect_same_grads(got, expected, {"x": (mine, theirs)}, (student, reference))

    return run


def _odd_rope_case(candidate):
    def run():
        expect_value_error(
            lambda: candidate(16, 2, 6, d_rope=3),
            "MultiHeadLatentAttention(16, 2, 6, d_rope=3)",
            "d_rope",
            example="d_rope: got {d_rope!r}, expected an even int",
            other_error="check d_rope in __init__ and raise ValueError naming it.",
            returned="RoPE rotates feature pairs, so d_rope must be even; raise ValueError "
            "naming `d_rope`",
        )

    return run


@checker("multi_head_latent_attention", "MultiHeadLatentAttention", chapter="18_latent_attention")
def check_multi_head_latent_attention(candidate) -> list[Case]:
    """Check the class ``MultiHeadLatentAttention(d_model, num_heads, kv_rank, q_rank=None,
    d_nope=None, d_rope=None, d_v=None, rope_base=10000.0, eps=1e-6)`` with ``forward(x,
    cache=None, absorbed=False)`` and ``new_cache()``: given the reference's weights, the
    naive and absorbed forms, the latent cache, gradients."""
    D16 = (16, 2, 6)  # d_nope = d_v = 8, d_rope = 4 by default
    return [
        Case("D=16, H=2, kv_rank=6 (defaults), B=2, T=5", _module_case(candidate, D16, {}, seed=1)),
        Case(
            "absorbed=True: the same output",
            _module_case(candidate, D16, {}, seed=11, absorbed=True),
            covers=frozenset({"absorbed"}),
        ),
        Case(
            "q_rank=5: the queries through their own bottleneck",
            _module_case(candidate, D16, {"q_rank": 5}, seed=21),
            covers=frozenset({"q_rank"}),
        ),
        Case(
            "d_nope=4, d_rope=2, d_v=6, B=H=2, absorbed=True",
            _module_case(
                candidate, (12, 2, 5), {"d_nope": 4, "d_rope": 2, "d_v": 6}, seed=31, absorbed=True
            ),
            covers=frozenset({"d_nope", "d_rope", "d_v", "absorbed"}),
        ),
        Case(
            "kv_rank = d_nope = d_v = 4, absorbed=True: the transposes of W_UK and W_UV",
            _module_case(
                candidate,
                (8, 2, 4),
                {"d_nope": 4, "d_rope": 2, "d_v": 4},
                seed=41,
                absorbed=True,
                B=1,
            ),
            covers=frozenset({"d_nope", "d_rope", "d_v", "absorbed"}),
        ),
        Case(
            "rope_base=100.0, eps=0.5, T=12",
            _module_case(candidate, D16, {"rope_base": 100.0, "eps": 0.5}, seed=51, T=12),
            covers=frozenset({"rope_base", "eps"}),
        ),
        Case(
            "a cache: 3 tokens, then 1, then 2 (the last absorbed)",
            _latent_cache_case(candidate, D16, {"q_rank": 5}, [3, 1, 2], seed=61),
            weight=2.0,  # the cache is what the latent is for
            covers=frozenset({"cache", "absorbed", "q_rank"}),
        ),
        Case(
            "H=1, T=1",
            _module_case(candidate, (8, 1, 3), {}, seed=71, B=1, T=1),
            weight=TRIVIAL,
            covers=frozenset({"H=1", "T=1"}),
        ),
        Case(
            "float32",
            _module_case(candidate, D16, {}, seed=81, dtype=torch.float32),
            covers=frozenset({"dtype=float32"}),
        ),
        Case(
            "gradients reach x and every weight (naive and absorbed)",
            _grad_module_case(candidate, D16, {"q_rank": 5}, seed=91, absorbed=True),
            covers=frozenset({"grad", "absorbed", "q_rank"}),
        ),
        Case(
            "an odd d_rope raises ValueError naming d_rope",
            _odd_rope_case(candidate),
            covers=frozenset({"odd d_rope"}),
            support=True,
        ),
    ]


# ---------------------------------------------------------------- the cache's bytes

_KINDS = ("mha", "gqa", "mqa", "mla")


def expected_cache_bytes(config: dict, tokens: int, batch: int = 1, variant: str | None = None):
    """The bytes of the KV cache, right (``variant=None``) or with one known mistake."""
    kind = config["attention"]
    L, H, Dh = config["num_layers"], config["num_heads"], config["head_dim"]
    per_layer = {
        "mha": 2 * H * Dh,
        "gqa": 2 * config.get("num_kv_heads", H) * Dh,
        "mqa": 2 * Dh,
        "mla": config.get("kv_rank", 0) + config.get("d_rope", 0),
    }[kind]
    if variant == "mla_twice" and kind == "mla":
        per_layer = 2 * (config["kv_rank"] + config["d_rope"])
    elif variant == "mla_latent_twice" and kind == "mla":
        per_layer = 2 * config["kv_rank"] + config["d_rope"]
    elif variant == "mla_per_head" and kind == "mla":
        per_layer = H * (config["kv_rank"] + config["d_rope"])
    elif variant == "mla_no_rope" and kind == "mla":
        per_layer = config["kv_rank"]
    elif variant == "mla_rope_per_head" and kind == "mla":
        per_layer = config["kv_rank"] + H * config["d_rope"]
    elif variant == "mla_decompressed" and kind == "mla":
        per_layer = 2 * H * Dh
    elif variant == "keys_only" and kind != "mla":
        per_layer //= 2
    elif variant == "kv_heads_ignored" and kind in ("gqa", "mqa"):
        per_layer = 2 * H * Dh
    numbers = per_layer * tokens * batch * (1 if variant == "layers" else L)
    if variant == "batch":
        numbers //= batch
    if variant == "bits":
        return numbers * config["bytes_per_number"] * 8
    return numbers * (1 if variant == "bytes" else config["bytes_per_number"])


# A factor of 8 can also be a ratio of heads (H / Hkv): when two mistakes give the same
# number the message names both, bits last (the MHA case, where nothing else multiplies
# by 8, names the bits alone)
_CACHE_VARIANTS = {
    "mla_twice": "cache-mla-keys-and-values",
    "mla_latent_twice": "cache-mla-keys-and-values",
    "mla_per_head": "cache-mla-per-head",
    "mla_no_rope": "cache-mla-no-rope-key",
    "mla_rope_per_head": "cache-mla-rope-per-head",
    "mla_decompressed": "cache-mla-decompressed",
    "keys_only": "cache-keys-only",
    "kv_heads_ignored": "cache-kv-heads-ignored",
    "layers": "cache-layers-ignored",
    "bytes": "cache-bytes-ignored",
    "batch": "cache-batch-ignored",
    "bits": "cache-counted-in-bits",
}


def draw_config(kind: str, seed: int) -> dict:
    """A configuration of ``kind`` drawn from the run seed (sizes of today's models' scale)."""
    g = generator(seed)

    def pick(*values):
        return values[int(torch.randint(len(values), (1,), generator=g))]

    H = pick(8, 12, 16, 32, 40, 64, 128)
    config = {
        "attention": kind,
        "num_layers": pick(12, 24, 28, 32, 40, 48, 61, 80),
        "num_heads": H,
        "head_dim": pick(64, 96, 128, 192),
        # bfloat16 for MLA, float32 for the others: with 2 bytes a count in numbers would
        # equal the keys alone of MHA, GQA and MQA, and the message could not tell them apart
        "bytes_per_number": 2 if kind == "mla" else 4,
    }
    if kind == "gqa":
        config["num_kv_heads"] = pick(*[h for h in (2, 4, 8) if H % h == 0 and h < H])
    if kind == "mla":
        config["kv_rank"] = pick(256, 384, 512, 768)
        config["d_rope"] = pick(32, 64)
    return config


# Configurations written out (the same under every run seed) whose caches exceed 2^31 and
# 2^32 bytes: a count done in 32-bit integers (numpy's int32, the default integer of numpy < 2
# on Windows) wraps around there, in the check cell as in the grader
_LARGE_CONFIGS = {
    # DeepSeek-V3's attention: 61 layers, 128 heads, kv_rank 512, d_rope 64, bfloat16
    "mla": {
        "attention": "mla",
        "num_layers": 61,
        "num_heads": 128,
        "head_dim": 192,
        "bytes_per_number": 2,
        "kv_rank": 512,
        "d_rope": 64,
    },
    # a 7B-sized MHA model (32 layers of 32 heads of 128) in float32
    "mha": {
        "attention": "mha",
        "num_layers": 32,
        "num_heads": 32,
        "head_dim": 128,
        "bytes_per_number": 4,
    },
}


def _cache_case(
    candidate,
    kind: str,
    *,
    seed: int,
    tokens: int,
    batch: int | None = None,
    fixed: bool = False,
):
    def run():
        config = dict(_LARGE_CONFIGS[kind]) if fixed else draw_config(kind, seed)
        kwargs = {} if batch is None else {"batch": batch}
        b = 1 if batch is None else batch
        expected = expected_cache_bytes(config, tokens, b)
        what = f"kv_cache_bytes({config}, tokens={tokens}" + (
            f", batch={batch})" if batch is not None else ")"
        )
        got = call_student(candidate, dict(config), tokens, what=what, **kwargs)
        value = plain(got)
        if not is_number(value) or (isinstance(value, float) and not value.is_integer()):
            raise CaseFailed(
                f"{what} returned {show(value)}: expected a whole number of bytes (an int)"
            )
        if int(value) == expected:
            return
        message = f"{what}: expected {expected:,} bytes, got {show(value)}"
        if (int(value) - expected) % 2**32 == 0:
            raise CaseFailed(message + f"\nLikely mistake: {says('cache-integer-overflow')}.")
        named = []
        for variant, mistake in _CACHE_VARIANTS.items():
            wrong = expected_cache_bytes(config, tokens, b, variant)
            if wrong != expected and wrong == int(value):
                named.append(says(mistake))
        if named:
            also = "".join(f"\nOr (the same number here): {m}." for m in named[1:])
            raise CaseFailed(message + f"\nLikely mistake: {named[0]}." + also)
        raise CaseFailed(
            message + "\nHint: per token and layer MHA caches 2 H Dh numbers, GQA 2 Hkv Dh, "
            "MQA 2 Dh; MLA its latent and its shared rotary key; then layers, tokens, batch "
            "and bytes_per_number."
        )

    return run


@checker("kv_cache_bytes", chapter="18_latent_attention")
def check_kv_cache_bytes(candidate) -> list[Case]:
    """Check ``kv_cache_bytes(config, tokens, batch=1) -> int``: the bytes of the keys and
    values (or MLA's latent and rotary key) cached by every layer after ``tokens`` tokens,
    on configurations drawn from the run seed."""
    return [
        Case("MHA, 1,000 tokens", _cache_case(candidate, "mha", seed=1, tokens=1000)),
        Case("GQA, 4,096 tokens", _cache_case(candidate, "gqa", seed=2, tokens=4096)),
        Case("MQA, 512 tokens", _cache_case(candidate, "mqa", seed=3, tokens=512)),
        Case("MLA, 32,768 tokens", _cache_case(candidate, "mla", seed=4, tokens=32768)),
        Case(
            "MLA, 100 tokens, batch=8",
            _cache_case(candidate, "mla", seed=5, tokens=100, batch=8),
            covers=frozenset({"batch"}),
        ),
        Case(
            "GQA, 7 tokens, batch=3",
            _cache_case(candidate, "gqa", seed=6, tokens=7, batch=3),
            covers=frozenset({"batch"}),
        ),
        Case(
            "MLA, one token",
            _cache_case(candidate, "mla", seed=7, tokens=1),
            weight=TRIVIAL,
            covers=frozenset({"tokens=1"}),
        ),
        Case(
            "MHA of 32 layers x 32 heads x 128 in float32, 3,000 tokens: more than 2^31 bytes",
            _cache_case(candidate, "mha", seed=8, tokens=3000, fixed=True),
            covers=frozenset({"> 2^31 bytes"}),
        ),
        Case(
            "DeepSeek-V3's MLA, 32,768 tokens, batch=2: more than 2^32 bytes",
            _cache_case(candidate, "mla", seed=9, tokens=32768, batch=2, fixed=True),
            covers=frozenset({"> 2^32 bytes", "batch"}),
        ),
    ]
