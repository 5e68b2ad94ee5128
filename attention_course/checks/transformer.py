"""Checkers for the Transformer layers: ``EncoderLayer`` and ``DecoderLayer``."""

from __future__ import annotations

import torch

from attention_course import transformer as ref

from ._compare import expect_close, expect_grad
from ._data import leaf, randn
from ._modules import backward_both, build_pair, compare_param_grads
from ._report import Report
from ._runner import Case, CaseFailed, call_student, class_problem, run_cases, single_failure

_PRE_WHEN_POST = (
    "this is pre-norm (x + sublayer(norm(x))) but norm_first=False asks for post-norm: "
    "x = norm(x + sublayer(x))"
)
_POST_WHEN_PRE = (
    "this is post-norm (norm(x + sublayer(x))) but norm_first=True asks for pre-norm: "
    "x = x + sublayer(norm(x))"
)
_NORM_ON_SUBLAYER = (
    "the norm is applied to the sublayer's output only (x + norm(sublayer(x))): post-norm "
    "normalises the sum, norm(x + sublayer(x))"
)
_RESIDUAL_FROM_NORMED = (
    "the residual starts from the normalised x (h = norm(x); x = h + sublayer(h)): pre-norm "
    "adds the sublayer to the un-normalised stream, x = x + sublayer(norm(x))"
)


def _sublayers(module, tgt_mask=None):
    def sa(h, mask=tgt_mask):
        return module.self_attn(h, h, h, mask=mask)[0]

    return sa, module.ffn


def _encoder_variants(module, x, mask, norm_first: bool) -> list[tuple[str, callable]]:
    sa, ffn = _sublayers(module, mask)
    n1, n2 = module.norm1, module.norm2

    def post(x, sa=sa, n1=n1, n2=n2, res1=True, res2=True):
        y = n1(x + sa(x) if res1 else sa(x))
        return n2(y + ffn(y) if res2 else ffn(y))

    def pre(x, sa=sa, n1=n1, n2=n2, res1=True, res2=True):
        y = x + sa(n1(x)) if res1 else sa(n1(x))
        return y + ffn(n2(y)) if res2 else ffn(n2(y))

    def no_mask(h):
        return module.self_attn(h, h, h)[0]

    good = pre if norm_first else post
    variants = [
        (
            _POST_WHEN_PRE if norm_first else _PRE_WHEN_POST,
            lambda: (post if norm_first else pre)(x),
        ),
        (
            "the residual connection around self-attention is missing",
            lambda: good(x, res1=False),
        ),
        (
            "the residual connection around the feed-forward network is missing",
            lambda: good(x, res2=False),
        ),
        ("both residual connections are missing", lambda: good(x, res1=False, res2=False)),
        (
            "norm1 and norm2 are swapped: norm1 goes with self-attention, norm2 with the FFN",
            lambda: good(x, n1=n2, n2=n1),
        ),
    ]
    if norm_first:
        variants += [
            (
                _RESIDUAL_FROM_NORMED,
                lambda: (lambda y: n2(y) + ffn(n2(y)))(n1(x) + sa(n1(x))),
            ),
            (
                "there is an extra LayerNorm at the end of the pre-norm layer (the final norm "
                "belongs to the Encoder stack, not to each layer)",
                lambda: n2(pre(x)),
            ),
        ]
    else:
        variants.append((_NORM_ON_SUBLAYER, lambda: (lambda y: y + n2(ffn(y)))(x + n1(sa(x)))))
    if mask is not None:
        variants.append(("the mask is not passed to self-attention", lambda: good(x, sa=no_mask)))
    return variants


_ENCODER_ATTRIBUTES = ("self_attn", "ffn", "norm1", "norm2", "norm_first")


def _encoder_case(candidate, init: dict, x, mask=None, grad=False, train=False):
    def run():
        student, reference = build_pair(candidate, ref.EncoderLayer, kwargs=init)
        student.train(train)
        reference.train(train)
        mine, theirs = (leaf(x), leaf(x)) if grad else (x, x)
        expected = reference(theirs, mask)
        kwargs = {} if mask is None else {"mask": mask}
        got = call_student(
            student,
            mine,
            what="layer(x" + (", mask)" if mask is not None else ")"),
            arg_names=("x",),
            **kwargs,
        )
        with torch.no_grad():
            variants = _encoder_variants(reference, x, mask, init.get("norm_first", False))
        expect_close(got, expected, "the output", mistakes=variants)
        if grad:
            backward_both(got, expected)
            compare_param_grads(student, reference, "EncoderLayer")
            expect_grad(mine.grad, theirs.grad, "`x`")

    return run


def _attributes_case(candidate, reference_cls, names, init):
    def run():
        student, _ = build_pair(candidate, reference_cls, kwargs=init)
        missing = [name for name in names if not hasattr(student, name)]
        if missing:
            raise CaseFailed(
                "missing attribute(s): "
                + ", ".join(f"`{n}`" for n in missing)
                + f"; the contract names them {', '.join(names)}"
            )
        if student.norm_first is not init.get("norm_first", False):
            raise CaseFailed(
                f"`norm_first` should be {init.get('norm_first', False)}, got "
                f"{student.norm_first!r}"
            )

    return run


def check_encoder_layer(candidate, *, timeout: float = 10.0) -> Report:
    """Check the class ``EncoderLayer(d_model, num_heads, d_ff, dropout=0.1,
    norm_first=False)``."""
    target = "encoder_layer"
    problem = class_problem(candidate, target, "EncoderLayer")
    if problem:
        return single_failure(target, "is an nn.Module class", problem)
    B, T, D = 2, 5, 8
    x = randn(B, T, D, seed=151)
    post = {"d_model": D, "num_heads": 2, "d_ff": 16, "dropout": 0.0}
    pre = {**post, "norm_first": True}
    padding = (torch.arange(T) < torch.tensor([3, 5])[:, None])[:, None, None, :]  # (B,1,1,T)
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    cases = [
        Case(
            "attributes (self_attn, ffn, norm1, norm2, norm_first)",
            _attributes_case(candidate, ref.EncoderLayer, _ENCODER_ATTRIBUTES, pre),
        ),
        Case("post-norm (norm_first=False)", _encoder_case(candidate, post, x)),
        Case("pre-norm (norm_first=True)", _encoder_case(candidate, pre, x)),
        Case(
            "post-norm with a padding mask (B, 1, 1, T)", _encoder_case(candidate, post, x, padding)
        ),
        Case("pre-norm with a causal mask (T, T)", _encoder_case(candidate, pre, x, causal)),
        Case("T = 1", _encoder_case(candidate, post, x[:, :1])),
        Case(
            "H = 1",
            _encoder_case(
                candidate, {**post, "d_model": 6, "num_heads": 1}, randn(B, T, 6, seed=152)
            ),
        ),
        Case(
            "dropout=0.2 is off in eval mode", _encoder_case(candidate, {**post, "dropout": 0.2}, x)
        ),
        Case(
            "gradients reach every parameter and x (post-norm)",
            _encoder_case(candidate, post, x, padding, grad=True, train=True),
        ),
        Case(
            "gradients reach every parameter and x (pre-norm)",
            _encoder_case(candidate, pre, x, causal, grad=True, train=True),
        ),
    ]
    return run_cases(target, cases, timeout)


# ---------------------------------------------------------------- DecoderLayer

_QUERIES_FROM_MEMORY = (
    "the cross-attention takes its queries from the encoder memory: queries come from the "
    "decoder stream and keys/values from memory, cross_attn(x, memory, memory)"
)
_KV_FROM_X = (
    "the cross-attention never looks at the encoder: its keys and values must be the memory, "
    "cross_attn(x, memory, memory)"
)


def _decoder_variants(module, x, memory, tgt_mask, memory_mask, norm_first: bool):
    n1, n2, n3, ffn = module.norm1, module.norm2, module.norm3, module.ffn

    def sa(h, mask=tgt_mask):
        return module.self_attn(h, h, h, mask=mask)[0]

    def ca(q, kv, mask=memory_mask):
        return module.cross_attn(q, kv, kv, mask=mask)[0]

    def ca_good(q):
        return ca(q, memory)

    def post(x, sa=sa, ca=ca_good, n1=n1, n2=n2, n3=n3, res=(True, True, True), cross_first=False):
        first, second = (ca, sa) if cross_first else (sa, ca)
        y = n1(x + first(x) if res[0] else first(x))
        z = n2(y + second(y) if res[1] else second(y))
        return n3(z + ffn(z) if res[2] else ffn(z))

    def pre(x, sa=sa, ca=ca_good, n1=n1, n2=n2, n3=n3, res=(True, True, True), cross_first=False):
        first, second = (ca, sa) if cross_first else (sa, ca)
        y = x + first(n1(x)) if res[0] else first(n1(x))
        z = y + second(n2(y)) if res[1] else second(n2(y))
        return z + ffn(n3(z)) if res[2] else ffn(n3(z))

    good = pre if norm_first else post
    variants = [
        (_QUERIES_FROM_MEMORY, lambda: good(x, ca=lambda q: ca(memory, q))),
        (_KV_FROM_X, lambda: good(x, ca=lambda q: ca(q, q))),
        (
            _POST_WHEN_PRE if norm_first else _PRE_WHEN_POST,
            lambda: (post if norm_first else pre)(x),
        ),
        (
            "the residual connection around self-attention is missing",
            lambda: good(x, res=(False, True, True)),
        ),
        (
            "the residual connection around cross-attention is missing",
            lambda: good(x, res=(True, False, True)),
        ),
        (
            "the residual connection around the feed-forward network is missing",
            lambda: good(x, res=(True, True, False)),
        ),
        (
            "norm2 and norm3 are swapped: norm1 goes with self-attention, norm2 with "
            "cross-attention, norm3 with the FFN",
            lambda: good(x, n2=n3, n3=n2),
        ),
        (
            "cross-attention comes before self-attention: the order is masked self-attention, "
            "then cross-attention, then the FFN",
            lambda: good(x, cross_first=True),
        ),
    ]
    if tgt_mask is not None:
        variants.append(
            (
                "tgt_mask is not passed to the self-attention (the decoder can see the future)",
                lambda: good(x, sa=lambda h: sa(h, None)),
            )
        )
    if memory_mask is not None:
        variants.append(
            (
                "memory_mask is not passed to the cross-attention",
                lambda: good(x, ca=lambda q: ca(q, memory, None)),
            )
        )
    return variants


_DECODER_ERROR_HINT = (
    "in cross-attention the queries come from the decoder stream x and the keys/values from "
    "memory, cross_attn(x, memory, memory); tgt_mask goes to the self-attention and "
    "memory_mask to the cross-attention"
)


def _decoder_case(
    candidate, init, x, memory, tgt_mask=None, memory_mask=None, grad=False, train=False
):
    def run():
        student, reference = build_pair(candidate, ref.DecoderLayer, kwargs=init)
        student.train(train)
        reference.train(train)
        if grad:
            mine, theirs = (leaf(x), leaf(memory)), (leaf(x), leaf(memory))
        else:
            mine = theirs = (x, memory)
        expected = reference(*theirs, tgt_mask=tgt_mask, memory_mask=memory_mask)
        kwargs = {}
        if tgt_mask is not None:
            kwargs["tgt_mask"] = tgt_mask
        if memory_mask is not None:
            kwargs["memory_mask"] = memory_mask
        got = call_student(
            student,
            *mine,
            what="layer(x, memory" + "".join(f", {k}=..." for k in kwargs) + ")",
            arg_names=("x", "memory"),
            error_hint=_DECODER_ERROR_HINT,
            **kwargs,
        )
        with torch.no_grad():
            variants = _decoder_variants(
                reference, x, memory, tgt_mask, memory_mask, init.get("norm_first", False)
            )
        expect_close(got, expected, "the output", mistakes=variants)
        if grad:
            backward_both(got, expected)
            compare_param_grads(student, reference, "DecoderLayer")
            expect_grad(mine[0].grad, theirs[0].grad, "`x`")
            expect_grad(mine[1].grad, theirs[1].grad, "`memory`")

    return run


_DECODER_ATTRIBUTES = ("self_attn", "cross_attn", "ffn", "norm1", "norm2", "norm3", "norm_first")


def check_decoder_layer(candidate, *, timeout: float = 10.0) -> Report:
    """Check the class ``DecoderLayer(d_model, num_heads, d_ff, dropout=0.1,
    norm_first=False)``."""
    target = "decoder_layer"
    problem = class_problem(candidate, target, "DecoderLayer")
    if problem:
        return single_failure(target, "is an nn.Module class", problem)
    B, T, S, D = 2, 4, 6, 8
    x, memory = randn(B, T, D, seed=161), randn(B, S, D, seed=162)
    post = {"d_model": D, "num_heads": 2, "d_ff": 16, "dropout": 0.0}
    pre = {**post, "norm_first": True}
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    memory_padding = (torch.arange(S) < torch.tensor([4, 6])[:, None])[:, None, None, :]
    square = randn(B, S, D, seed=163)  # T = S: queries from memory would not change the shape
    cases = [
        Case(
            "attributes (self_attn, cross_attn, ffn, norm1..3, norm_first)",
            _attributes_case(candidate, ref.DecoderLayer, _DECODER_ATTRIBUTES, pre),
        ),
        Case(
            "post-norm, causal tgt_mask, T != S", _decoder_case(candidate, post, x, memory, causal)
        ),
        Case("pre-norm, causal tgt_mask, T != S", _decoder_case(candidate, pre, x, memory, causal)),
        Case("no masks", _decoder_case(candidate, post, x, memory)),
        Case(
            "memory_mask (B, 1, 1, S) hides padded source positions",
            _decoder_case(candidate, post, x, memory, causal, memory_padding),
        ),
        Case(
            "T = S (the query/memory roles must still be right)",
            _decoder_case(candidate, pre, square, memory),
        ),
        Case("T = 1", _decoder_case(candidate, post, x[:, :1], memory)),
        Case(
            "dropout=0.2 is off in eval mode",
            _decoder_case(candidate, {**post, "dropout": 0.2}, x, memory, causal),
        ),
        Case(
            "gradients reach every parameter, x and memory (post-norm)",
            _decoder_case(
                candidate, post, x, memory, causal, memory_padding, grad=True, train=True
            ),
        ),
        Case(
            "gradients reach every parameter, x and memory (pre-norm)",
            _decoder_case(candidate, pre, x, memory, causal, grad=True, train=True),
        ),
    ]
    return run_cases(target, cases, timeout)
