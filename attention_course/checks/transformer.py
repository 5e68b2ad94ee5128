"""Checkers for the Transformer layers: ``EncoderLayer`` and ``DecoderLayer``."""

from __future__ import annotations

from collections.abc import Callable

import torch

from attention_course import transformer as ref

from ._compare import expect_close, expect_like, expect_tuple, fmt_shape, tolerances
from ._data import randn
from ._dropout import expect_dropout_of, is_unchanged
from ._modules import ModulePair, build_pair
from ._runner import TRIVIAL, Case, CaseFailed, call_student, checker

# ---------------------------------------------------------------- shared: dropout, weights

_HEAD_AVERAGED = (
    "the weights are averaged over the heads: return one map per head, (B, H, T, S), as "
    "MultiHeadAttention returns them"
)


def _covers(*items: str) -> frozenset[str]:
    return frozenset(items)


def _post_and_pre(
    names: tuple[str, str], runs: tuple[Callable, Callable], crossed: str, *covers: str
) -> list[Case]:
    """The same check post-norm, then pre-norm (``names`` and ``runs`` in that order). Both
    cases cover ``crossed`` and ``covers``, and ``crossed`` crossed with their value of
    ``norm_first``; the pre-norm case also covers ``norm_first`` (set away from its default)."""
    (post_name, pre_name), (post_run, pre_run) = names, runs
    return [
        Case(
            post_name, post_run, covers=_covers(crossed, *covers, f"norm_first=False x {crossed}")
        ),
        Case(
            pre_name,
            pre_run,
            covers=_covers(crossed, *covers, "norm_first", f"norm_first=True x {crossed}"),
        ),
    ]


def _record(module, name: str, store: dict, handles: list) -> None:
    """Record the first input and the first output (its first element, for a tuple) of the
    student's submodule ``name``, and its second and third positional inputs (an
    attention's key and value) as ``name.in1`` and ``name.in2``."""
    sub = getattr(module, name, None)
    if not isinstance(sub, torch.nn.Module):
        raise CaseFailed(f"your layer has no submodule `{name}` (the contract names it)")

    def before(_, args):
        for index, value in enumerate(args[:3]):
            store.setdefault(f"{name}.in{index or ''}", value)

    def after(_, args, out):
        store.setdefault(f"{name}.out", out[0] if isinstance(out, (tuple, list)) else out)

    handles.append(sub.register_forward_pre_hook(before))
    handles.append(sub.register_forward_hook(after))


def _run_recorded(student, names, args, kwargs, what: str) -> tuple[object, dict]:
    """Run the student's layer once, recording its submodules' inputs and outputs."""
    store: dict = {}
    handles: list = []
    try:
        for name in names:
            _record(student, name, store, handles)
        got = call_student(student, *args, what=what, **kwargs)
    finally:
        for handle in handles:
            handle.remove()
    return got, store


def _recorded(store: dict, key: str, shape) -> torch.Tensor:
    """The recorded input or output ``key`` (e.g. ``"norm1.in"``), which must have the
    stream's shape (B, T, D)."""
    value = store.get(key)
    module, side = key.split(".")
    if not isinstance(value, torch.Tensor):
        raise CaseFailed(
            f"your forward never calls self.{module} (or it does not return a tensor): "
            "use the layer's own submodules"
        )
    if tuple(value.shape) != tuple(shape):
        what = "input" if side == "in" else "output"
        raise CaseFailed(
            f"the {what} of self.{module} has shape {fmt_shape(value.shape)}, expected the "
            f"stream's shape {fmt_shape(shape)}"
        )
    return value.detach()


_WRONG_WITHOUT_DROPOUT = (
    "the output is already wrong with dropout off (the same layer in eval mode differs from "
    "the reference): fix the eval-mode cases above first; this case checks only where "
    "dropout is applied"
)


def _expect_right_in_eval(student, reference, args: tuple, kwargs: dict, what: str) -> None:
    """Before checking dropout in training mode, make sure that the layer is right without
    it, so that a structural mistake is not reported as a dropout mistake."""
    student.eval()
    reference.eval()
    with torch.no_grad():
        expected = reference(*args, **kwargs)
        got = call_student(student, *args, what=f"{what} in eval mode", **kwargs)
    if not isinstance(got, torch.Tensor) or got.shape != expected.shape:
        return  # the eval-mode cases report the type and shape
    atol, rtol = tolerances(expected.dtype)
    if not torch.allclose(got.detach().to(expected.dtype), expected, atol=atol, rtol=rtol):
        raise CaseFailed(_WRONG_WITHOUT_DROPOUT)


def _expect_residual_dropout(residual, sublayer_out, p: float, k: int, sublayer: str) -> None:
    """The residual branch ``residual`` must be ``dropout{k}(sublayer_out)``."""
    where = (
        f"on the output of the {sublayer}, before it is added to the stream: "
        f"x + dropout{k}(sublayer(...))"
    )
    if is_unchanged(residual, sublayer_out):
        raise CaseFailed(
            f"what is added to the stream after the {sublayer} is not dropped out (no "
            f"dropout there; a dropout elsewhere, e.g. after the norm, does not count): in "
            f"training mode with dropout={p:g}, about {p:.0%} of the {sublayer}'s output must "
            f"be zeroed by self.dropout{k} = nn.Dropout(dropout) before the residual "
            f"addition; it goes {where}"
        )
    expect_dropout_of(
        residual,
        sublayer_out,
        p,
        f"what is added to the stream after the {sublayer}",
        ignored=f"residual dropout is never applied around the {sublayer}",
        where=where,
    )


def _expect_sublayer_inputs(seen, pairs) -> None:
    """Each sublayer receives exactly what the layout gives it, in training mode too: a
    dropout between the norm and the sublayer changes its input. ``pairs``: (sublayer's
    recorded input key, what it should equal, its description, the sublayer's name, k)."""
    for key, want, described, sublayer, k in pairs:
        got = seen(key)
        if got.shape != want.shape or not torch.allclose(got, want, rtol=1e-6, atol=1e-7):
            raise CaseFailed(
                f"in training mode the {sublayer} does not receive {described}: something "
                f"between them changes its input (an extra dropout?); the {sublayer} takes "
                f"{described} as it is, and dropout goes only on its output, "
                f"x + dropout{k}(sublayer(...))"
            )


def _expect_attention_keys(store: dict, name: str, want, described: str, sublayer: str):
    """An attention's key and value (its 2nd and 3rd positional inputs, when given so) are
    ``want`` itself in training mode too: no dropout on them, nor on ``memory``."""
    for index, role in ((1, "keys"), (2, "values")):
        got = store.get(f"{name}.in{index}")
        if not isinstance(got, torch.Tensor):
            continue  # passed by keyword: not recorded
        if got.shape != want.shape or not torch.allclose(got, want, rtol=1e-6, atol=1e-7):
            raise CaseFailed(
                f"in training mode the {sublayer}'s {role} are not {described}: something "
                "changes them (an extra dropout?); the attention takes them as they are, and "
                "dropout goes only on the sublayer's output"
            )


def _sublayer_drops(student, name: str, call) -> bool:
    """Whether the student's sublayer ``name`` gives another result in training mode than
    in eval mode on the same input (it was built with dropout > 0)."""
    sub = getattr(student, name)
    what = f"self.{name}(...)"
    with torch.no_grad():
        trained = call_student(lambda: call(sub), what=f"{what} in training mode")
        call_student(sub.eval, what=f"{what}.eval()")
        try:
            evaluated = call_student(lambda: call(sub), what=f"{what} in eval mode")
        finally:
            call_student(sub.train, what=f"{what}.train()")
    if isinstance(trained, (tuple, list)):
        trained, evaluated = trained[0], evaluated[0]
    return not (isinstance(trained, torch.Tensor) and is_unchanged(trained, evaluated))


def _expect_sublayer_dropout(student, name: str, p: float, call) -> None:
    """The student's sublayer ``name`` must have been built with the dropout argument."""
    if not _sublayer_drops(student, name, call):
        kind = "PositionwiseFeedForward" if name == "ffn" else "MultiHeadAttention"
        raise CaseFailed(
            f"the `dropout` argument does not reach self.{name}: in training mode with "
            f"dropout={p:g} it gives the same output as in eval mode; build it with "
            f"{kind}(..., dropout=dropout)"
        )


def _expect_some_dropout(student, branches, p: float, ffn_call) -> None:
    """Name the mistake "dropout ignored everywhere" before the finer checks."""
    if all(is_unchanged(r, s) for r, s in branches) and not _sublayer_drops(
        student, "ffn", ffn_call
    ):
        raise CaseFailed(
            f"the `dropout` argument is ignored: in training mode with dropout={p:g} nothing "
            "is dropped, neither inside the sublayers nor on the residual branches; pass "
            "`dropout` to MultiHeadAttention, PositionwiseFeedForward and every nn.Dropout"
        )


def _expect_attention_weights(got, expected: torch.Tensor, name: str, swapped=None) -> None:
    mistakes = [(_HEAD_AVERAGED, lambda: expected.mean(dim=1))]
    if swapped is not None:
        mistakes.insert(0, swapped)
    expect_close(got, expected, name, mistakes=mistakes)


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
_NORM_ON_SUBLAYER_PRE = (
    "the norm is applied to the sublayer's output (x + norm(sublayer(x))): pre-norm "
    "normalises the sublayer's input, x + sublayer(norm(x))"
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
            (_NORM_ON_SUBLAYER_PRE, lambda: (lambda y: y + n2(ffn(y)))(x + n1(sa(x)))),
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
        pair = ModulePair(candidate, ref.EncoderLayer, init=init, train=train)
        got, expected = pair.call(
            x,
            mask=mask,
            what="layer(x" + (", mask)" if mask is not None else ")"),
            arg_names=("x",),
            grad=grad,
        )
        with torch.no_grad():
            variants = _encoder_variants(pair.reference, x, mask, init.get("norm_first", False))
        expect_close(got, expected, "the output", mistakes=variants)
        if grad:
            pair.expect_grads(got, expected, ("`x`",))

    return run


def _encoder_dropout_case(candidate, init: dict, x, mask=None):
    """Training mode with dropout > 0, checked by its properties through the student's own
    submodules: what is added to the stream is dropout(sublayer output)."""
    p = init["dropout"]
    norm_first = init.get("norm_first", False)

    def run():
        student, reference = build_pair(candidate, ref.EncoderLayer, kwargs=init)
        kwargs = {} if mask is None else {"mask": mask}
        _expect_right_in_eval(student, reference, (x,), kwargs, "layer(x)")
        student.train()
        got, store = _run_recorded(
            student,
            ("self_attn", "ffn", "norm1", "norm2"),
            (x,),
            kwargs,
            "layer(x" + (", mask)" if mask is not None else ")") + " in training mode",
        )
        expect_like(got, x, "the output")

        def seen(key: str) -> torch.Tensor:
            """What the student's submodule received or returned, e.g. seen("norm1.in")."""
            return _recorded(store, key, x.shape)

        if norm_first:
            inputs = [
                ("self_attn.in", seen("norm1.out"), "norm1(x)", "self-attention", 1),
                ("ffn.in", seen("norm2.out"), "norm2(x)", "feed-forward network", 2),
            ]
        else:
            inputs = [
                ("self_attn.in", x, "the layer's input x", "self-attention", 1),
                ("ffn.in", seen("norm1.out"), "norm1's output", "feed-forward network", 2),
            ]
        _expect_sublayer_inputs(seen, inputs)
        query = seen("self_attn.in")
        _expect_attention_keys(store, "self_attn", query, "its queries", "self-attention")
        sa, ff = seen("self_attn.out"), seen("ffn.out")
        if norm_first:
            first = seen("norm2.in") - x  # x + dropout1(sa(norm1(x))) - x
            second = got.detach() - seen("norm2.in")
        else:
            first = seen("norm1.in") - x  # x + dropout1(sa(x)) - x
            second = seen("norm2.in") - seen("norm1.out")
        ffn_in = seen("ffn.in")
        _expect_some_dropout(student, ((first, sa), (second, ff)), p, lambda m: m(ffn_in))
        _expect_residual_dropout(first, sa, p, 1, "self-attention")
        _expect_residual_dropout(second, ff, p, 2, "feed-forward network")
        _expect_sublayer_dropout(student, "ffn", p, lambda m: m(ffn_in))
        h = seen("self_attn.in")
        _expect_sublayer_dropout(student, "self_attn", p, lambda m: m(h, h, h))

    return run


def _encoder_attention_case(candidate, init: dict, x, mask=None):
    """``return_attention=True`` returns ``(x, weights (B, H, T, T))``."""

    def run():
        pair = ModulePair(candidate, ref.EncoderLayer, init=init, train=False)
        reference = pair.reference
        what = "layer(x" + (", mask" if mask is not None else "") + ", return_attention=True)"
        got, (expected_x, expected_w) = pair.call(
            x, mask=mask, return_attention=True, what=what, arg_names=("x",)
        )
        if isinstance(got, torch.Tensor):
            raise CaseFailed(
                f"{what} returned a single tensor of shape {fmt_shape(got.shape)}: with "
                "return_attention=True return the pair (x, weights), with the self-attention "
                "weights (B, H, T, T)"
            )
        got_x, got_w = expect_tuple(got, 2, what, ("x", "weights"))
        with torch.no_grad():
            variants = _encoder_variants(reference, x, mask, init.get("norm_first", False))
        expect_close(got_x, expected_x, "the output x", mistakes=variants)
        _expect_attention_weights(got_w, expected_w, "the attention weights")

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


@checker(
    "encoder_layer",
    "EncoderLayer",
    answer_builtins=("torch.nn.TransformerEncoderLayer", "torch.nn.TransformerEncoder"),
)
def check_encoder_layer(candidate) -> list[Case]:
    """Check the class ``EncoderLayer(d_model, num_heads, d_ff, dropout=0.1,
    norm_first=False)``."""
    B, T, D = 2, 5, 8
    x = randn(B, T, D, seed=151)
    post = {"d_model": D, "num_heads": 2, "d_ff": 16, "dropout": 0.0}
    pre = {**post, "norm_first": True}
    padding = (torch.arange(T) < torch.tensor([3, 5])[:, None])[:, None, None, :]  # (B,1,1,T)
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    big = randn(4, 8, 16, seed=153)
    big_post = {"d_model": 16, "num_heads": 2, "d_ff": 32, "dropout": 0.3}
    big_pre = {**big_post, "norm_first": True}
    big_padding = (torch.arange(8) < torch.tensor([8, 5, 8, 6])[:, None])[:, None, None, :]
    return [
        Case(
            "attributes (self_attn, ffn, norm1, norm2, norm_first)",
            _attributes_case(candidate, ref.EncoderLayer, _ENCODER_ATTRIBUTES, pre),
            weight=TRIVIAL,
            support=True,
        ),
        Case(
            "post-norm (norm_first=False)",
            _encoder_case(candidate, post, x),
            covers=_covers("norm_first=False"),
        ),
        Case(
            "pre-norm (norm_first=True)",
            _encoder_case(candidate, pre, x),
            covers=_covers("norm_first", "norm_first=True"),
        ),
        *_post_and_pre(
            ("post-norm with a padding mask (B, 1, 1, T)", "pre-norm with a causal mask (T, T)"),
            (_encoder_case(candidate, post, x, padding), _encoder_case(candidate, pre, x, causal)),
            "mask",
        ),
        *_post_and_pre(  # each mask shape in each branch: one branch may drop one shape
            ("post-norm with a causal mask (T, T)", "pre-norm with a padding mask (B, 1, 1, T)"),
            (_encoder_case(candidate, post, x, causal), _encoder_case(candidate, pre, x, padding)),
            "mask",
        ),
        Case("T = 1", _encoder_case(candidate, post, x[:, :1]), weight=TRIVIAL),
        Case(
            "H = 1",
            _encoder_case(
                candidate, {**post, "d_model": 6, "num_heads": 1}, randn(B, T, 6, seed=152)
            ),
            weight=TRIVIAL,
        ),
        Case(
            "dropout=0.2 is off in eval mode",
            _encoder_case(candidate, {**post, "dropout": 0.2}, x),
            covers=_covers("dropout", "mode=eval"),
        ),
        *_post_and_pre(
            (
                "post-norm, training mode, dropout=0.3: residual and sublayer dropout",
                "pre-norm, training mode, dropout=0.3: residual and sublayer dropout",
            ),
            (
                _encoder_dropout_case(candidate, big_post, big, big_padding),
                _encoder_dropout_case(candidate, big_pre, big),
            ),
            "dropout",
            "mode=train",
            "dropout>0 in training",
        ),
        Case(
            "post-norm, return_attention=True: (x, weights (B, H, T, T))",
            _encoder_attention_case(candidate, post, x, padding),
            covers=_covers("return_attention", "mask", "norm_first=False x return_attention"),
        ),
        Case(
            "pre-norm, return_attention=True",
            _encoder_attention_case(candidate, pre, x),
            covers=_covers("return_attention", "norm_first", "norm_first=True x return_attention"),
        ),
        *_post_and_pre(
            (
                "gradients reach every parameter and x (post-norm)",
                "gradients reach every parameter and x (pre-norm)",
            ),
            (
                _encoder_case(candidate, post, x, padding, grad=True, train=True),
                _encoder_case(candidate, pre, x, causal, grad=True, train=True),
            ),
            "grad",
            "mask",
            "mode=train",
        ),
    ]


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
    if tgt_mask is not None or memory_mask is not None:
        variants.append(
            (
                "tgt_mask and memory_mask are swapped: tgt_mask (T, T) goes to the "
                "self-attention, memory_mask (over the S memory positions) to the "
                "cross-attention",
                lambda: good(
                    x, sa=lambda h: sa(h, memory_mask), ca=lambda q: ca(q, memory, tgt_mask)
                ),
            )
        )
    if norm_first:

        def from_normed(x):  # every residual starts from the normalised stream
            h = n1(x)
            y = h + sa(h)
            h = n2(y)
            z = h + ca_good(h)
            h = n3(z)
            return h + ffn(h)

        def norm_on_sublayer(x):  # x + norm(sublayer(x)) around each sublayer
            y = x + n1(sa(x))
            z = y + n2(ca_good(y))
            return z + n3(ffn(z))

        variants += [(_RESIDUAL_FROM_NORMED, lambda: from_normed(x))]
        variants += [(_NORM_ON_SUBLAYER_PRE, lambda: norm_on_sublayer(x))]
        variants.append(
            (
                "the memory is normalised too: norm2 belongs to the decoder stream x only "
                "(a pre-norm encoder stack ends with its own final LayerNorm); pass memory to "
                "the cross-attention unchanged, cross_attn(norm2(x), memory, memory)",
                lambda: good(x, ca=lambda q: ca(q, n2(memory))),
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
        pair = ModulePair(candidate, ref.DecoderLayer, init=init, train=train)
        masks = {"tgt_mask": tgt_mask, "memory_mask": memory_mask}
        given = "".join(f", {k}=..." for k, v in masks.items() if v is not None)
        got, expected = pair.call(
            x,
            memory,
            what=f"layer(x, memory{given})",
            arg_names=("x", "memory"),
            grad=grad,
            error_hint=_DECODER_ERROR_HINT,
            **masks,
        )
        with torch.no_grad():
            variants = _decoder_variants(
                pair.reference, x, memory, tgt_mask, memory_mask, init.get("norm_first", False)
            )
        expect_close(got, expected, "the output", mistakes=variants)
        if grad:
            pair.expect_grads(got, expected, ("`x`", "`memory`"))

    return run


def _decoder_dropout_case(candidate, init: dict, x, memory, tgt_mask=None, memory_mask=None):
    """Training mode with dropout > 0: each of the three residual branches is
    dropout(sublayer output), and the sublayers were built with the dropout argument."""
    p = init["dropout"]
    norm_first = init.get("norm_first", False)

    def run():
        student, reference = build_pair(candidate, ref.DecoderLayer, kwargs=init)
        kwargs = {}
        if tgt_mask is not None:
            kwargs["tgt_mask"] = tgt_mask
        if memory_mask is not None:
            kwargs["memory_mask"] = memory_mask
        _expect_right_in_eval(student, reference, (x, memory), kwargs, "layer(x, memory)")
        student.train()
        what = "layer(x, memory" + "".join(f", {k}=..." for k in kwargs) + ") in training mode"
        got, store = _run_recorded(
            student,
            ("self_attn", "cross_attn", "ffn", "norm1", "norm2", "norm3"),
            (x, memory),
            kwargs,
            what,
        )
        expect_like(got, x, "the output")

        def seen(key: str) -> torch.Tensor:
            """What the student's submodule received or returned, e.g. seen("norm1.in")."""
            return _recorded(store, key, x.shape)

        sa, ca = (
            seen("self_attn.out"),
            seen("cross_attn.out"),
        )
        ff = seen("ffn.out")
        if norm_first:
            inputs = [
                ("self_attn.in", seen("norm1.out"), "norm1(x)", "self-attention", 1),
                ("cross_attn.in", seen("norm2.out"), "norm2(x)", "cross-attention", 2),
                ("ffn.in", seen("norm3.out"), "norm3(x)", "feed-forward network", 3),
            ]
        else:
            inputs = [
                ("self_attn.in", x, "the layer's input x", "self-attention", 1),
                ("cross_attn.in", seen("norm1.out"), "norm1's output", "cross-attention", 2),
                ("ffn.in", seen("norm2.out"), "norm2's output", "feed-forward network", 3),
            ]
        _expect_sublayer_inputs(seen, inputs)
        query = seen("self_attn.in")
        _expect_attention_keys(store, "self_attn", query, "its queries", "self-attention")
        _expect_attention_keys(store, "cross_attn", memory, "the memory", "cross-attention")
        if norm_first:
            first = seen("norm2.in") - x
            second = seen("norm3.in") - seen("norm2.in")
            third = got.detach() - seen("norm3.in")
        else:
            first = seen("norm1.in") - x
            second = seen("norm2.in") - seen("norm1.out")
            third = seen("norm3.in") - seen("norm2.out")
        ffn_in = seen("ffn.in")
        branches = ((first, sa), (second, ca), (third, ff))
        _expect_some_dropout(student, branches, p, lambda m: m(ffn_in))
        _expect_residual_dropout(first, sa, p, 1, "self-attention")
        _expect_residual_dropout(second, ca, p, 2, "cross-attention")
        _expect_residual_dropout(third, ff, p, 3, "feed-forward network")
        _expect_sublayer_dropout(student, "ffn", p, lambda m: m(ffn_in))
        h = seen("self_attn.in")
        _expect_sublayer_dropout(student, "self_attn", p, lambda m: m(h, h, h))
        q = seen("cross_attn.in")
        _expect_sublayer_dropout(student, "cross_attn", p, lambda m: m(q, memory, memory))

    return run


_SELF_CROSS_SWAPPED = (
    'the "self" and "cross" weights are swapped: "self" is the decoder\'s self-attention '
    '(B, H, T, T), "cross" the cross-attention to memory (B, H, T, S)'
)


def _decoder_attention_case(candidate, init: dict, x, memory, tgt_mask=None, memory_mask=None):
    """``return_attention=True`` returns ``(x, {"self": (B, H, T, T), "cross": (B, H, T, S)})``."""

    def run():
        pair = ModulePair(candidate, ref.DecoderLayer, init=init, train=False)
        reference = pair.reference
        masks = {"tgt_mask": tgt_mask, "memory_mask": memory_mask}
        given = "".join(f", {k}=..." for k, v in masks.items() if v is not None)
        what = f"layer(x, memory{given}, return_attention=True)"
        got, (expected_x, expected_w) = pair.call(
            x, memory, what=what, arg_names=("x", "memory"), return_attention=True, **masks
        )
        if isinstance(got, torch.Tensor):
            raise CaseFailed(
                f"{what} returned a single tensor of shape {fmt_shape(got.shape)}: with "
                'return_attention=True return (x, {"self": self_weights, "cross": '
                "cross_weights})"
            )
        got_x, got_w = expect_tuple(got, 2, what, ("x", "weights"))
        with torch.no_grad():
            variants = _decoder_variants(
                reference, x, memory, tgt_mask, memory_mask, init.get("norm_first", False)
            )
        expect_close(got_x, expected_x, "the output x", mistakes=variants)
        if not isinstance(got_w, dict) or set(got_w) != {"self", "cross"}:
            shown = sorted(got_w) if isinstance(got_w, dict) else type(got_w).__name__
            raise CaseFailed(
                'the weights must be a dict {"self": self_weights, "cross": cross_weights}, '
                f"got {shown}"
            )
        for key, other in (("self", "cross"), ("cross", "self")):
            _expect_attention_weights(
                got_w[key],
                expected_w[key],
                f'weights["{key}"]',
                swapped=(_SELF_CROSS_SWAPPED, lambda other=other: expected_w[other]),
            )

    return run


_DECODER_ATTRIBUTES = ("self_attn", "cross_attn", "ffn", "norm1", "norm2", "norm3", "norm_first")


@checker(
    "decoder_layer",
    "DecoderLayer",
    answer_builtins=("torch.nn.TransformerDecoderLayer", "torch.nn.TransformerDecoder"),
)
def check_decoder_layer(candidate) -> list[Case]:
    """Check the class ``DecoderLayer(d_model, num_heads, d_ff, dropout=0.1,
    norm_first=False)``."""
    B, T, S, D = 2, 4, 6, 8
    x, memory = randn(B, T, D, seed=161), randn(B, S, D, seed=162)
    post = {"d_model": D, "num_heads": 2, "d_ff": 16, "dropout": 0.0}
    pre = {**post, "norm_first": True}
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    memory_padding = (torch.arange(S) < torch.tensor([4, 6])[:, None])[:, None, None, :]
    square = randn(B, S, D, seed=163)  # T = S: queries from memory would not change the shape
    big_x, big_memory = randn(4, 8, 16, seed=164), randn(4, 10, 16, seed=165)
    big_post = {"d_model": 16, "num_heads": 2, "d_ff": 32, "dropout": 0.3}
    big_pre = {**big_post, "norm_first": True}
    big_causal = torch.ones(8, 8, dtype=torch.bool).tril()
    big_memory_padding = (torch.arange(10) < torch.tensor([10, 7, 9, 10])[:, None])[
        :, None, None, :
    ]  # (B, 1, 1, S)
    masked = (x, memory, causal, memory_padding)  # both masks
    big_inputs = (big_x, big_memory, big_causal, big_memory_padding)
    return [
        Case(
            "attributes (self_attn, cross_attn, ffn, norm1..3, norm_first)",
            _attributes_case(candidate, ref.DecoderLayer, _DECODER_ATTRIBUTES, pre),
            weight=TRIVIAL,
            support=True,
        ),
        *_post_and_pre(
            ("post-norm, causal tgt_mask, T != S", "pre-norm, causal tgt_mask, T != S"),
            (
                _decoder_case(candidate, post, x, memory, causal),
                _decoder_case(candidate, pre, x, memory, causal),
            ),
            "tgt_mask",
        ),
        Case(
            "no masks",
            _decoder_case(candidate, post, x, memory),
            covers=_covers("norm_first=False"),
        ),
        *_post_and_pre(
            (
                "post-norm, memory_mask (B, 1, 1, S) hides padded source positions",
                "pre-norm, memory_mask (B, 1, 1, S) hides padded source positions",
            ),
            (
                _decoder_case(candidate, post, *masked),
                _decoder_case(candidate, pre, *masked),
            ),
            "memory_mask",
            "tgt_mask",
        ),
        Case(
            "T = S (the query/memory roles must still be right)",
            _decoder_case(candidate, pre, square, memory),
            covers=_covers("norm_first", "norm_first=True"),
        ),
        Case("T = 1", _decoder_case(candidate, post, x[:, :1], memory), weight=TRIVIAL),
        Case(
            "dropout=0.2 is off in eval mode",
            _decoder_case(candidate, {**post, "dropout": 0.2}, x, memory, causal),
            covers=_covers("dropout", "mode=eval"),
        ),
        *_post_and_pre(
            (
                "post-norm, training mode, dropout=0.3: residual and sublayer dropout",
                "pre-norm, training mode, dropout=0.3: residual and sublayer dropout",
            ),
            (
                _decoder_dropout_case(candidate, big_post, *big_inputs),
                _decoder_dropout_case(candidate, big_pre, *big_inputs),
            ),
            "dropout",
            "mode=train",
            "dropout>0 in training",
        ),
        *_post_and_pre(
            (
                'post-norm, return_attention=True: (x, {"self": ..., "cross": ...})',
                "pre-norm, return_attention=True",
            ),
            (
                _decoder_attention_case(candidate, post, *masked),
                _decoder_attention_case(candidate, pre, *masked),
            ),
            "return_attention",
            "tgt_mask",
            "memory_mask",
        ),
        *_post_and_pre(
            (
                "gradients reach every parameter, x and memory (post-norm)",
                "gradients reach every parameter, x and memory (pre-norm)",
            ),
            (
                _decoder_case(candidate, post, *masked, grad=True, train=True),
                _decoder_case(candidate, pre, *masked, grad=True, train=True),
            ),
            "grad",
            "mode=train",
            "tgt_mask",
            "memory_mask",
        ),
    ]
