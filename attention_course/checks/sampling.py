"""Checker for ``filter_logits(logits, top_k=None, top_p=None)``: top-k and top-p
(nucleus) truncation with ``-inf`` outside the kept set."""

from __future__ import annotations

import math

import torch

from attention_course import sampling as ref

from ._compare import expect_close, expect_tensor, first_mistake, fmt_values, match_tolerances
from ._data import draw_until, randn
from ._runner import TRIVIAL, Case, CaseFailed, call_student, checker, expect_value_error

NEG_INF = float("-inf")

_CLAMP_HINT = (
    "top_k may be larger than the vocabulary V (then every token is kept): clamp it, "
    "`k = min(top_k, logits.size(-1))`, before calling `torch.topk`"
)


# ---------------------------------------------------------------- known mistakes

_TOP_P_ON_LOGITS = (
    "top-p on the logits, not the probabilities: your filter sorts and sums the raw logits; "
    "take the softmax of the (top-k filtered) logits first, `torch.softmax(logits, dim=-1)`, "
    "then sort those probabilities in descending order and accumulate them"
)
_TOP_P_CROSSING_DROPPED = (
    "your filter drops the token that crosses top_p: keep a token while the probability of "
    "the tokens *before* it is below top_p (shift the cumulative sum right by one), so the "
    "set reaches top_p"
)
_TOP_P_WRONG_AXIS = (
    "your softmax for top-p runs over the wrong axis (dim=0, across the batch): take it "
    "over the vocabulary, `torch.softmax(logits, dim=-1)`, then sort and accumulate"
)
_TOP_P_AT_EQUALITY = (
    "your filter also keeps a token when the probability of the tokens before it equals "
    "top_p exactly (`<=`): keep a token while that probability is strictly below top_p (`<`)"
)
_TOP_P_ASCENDING = (
    "your filter keeps the smallest probabilities, not the largest: it sorts in ascending "
    "order; sort with `descending=True` before the cumulative sum"
)


def _scatter_back(sorted_values: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
    """Put values given in sorted order back at the tokens' own positions."""
    return torch.zeros_like(sorted_values).scatter(-1, order, sorted_values)


def _top_p_keep(logits: torch.Tensor, top_p: float, *, variant: str) -> torch.Tensor:
    """Which tokens a (mistaken) top-p rule keeps, as a bool tensor."""
    # "logits...": the rule run on the raw logits, as if they were probabilities
    if variant.startswith("logits"):
        probs = logits.double()
    elif variant == "dim 0":  # the softmax across the batch
        probs = logits.double().softmax(0)
    else:
        probs = logits.double().softmax(-1)
    descending = variant != "ascending"
    sorted_probs, order = probs.sort(dim=-1, descending=descending)
    cumulative = sorted_probs.cumsum(-1)
    if variant in ("no shift", "logits, no shift"):  # cumulative > top_p removed: the crossing
        keep_sorted = cumulative <= top_p  # token goes too
    elif variant == "no shift, first kept":
        keep_sorted = cumulative <= top_p
        keep_sorted[..., 0] = True
    elif variant in ("logits, <=", "<="):
        keep_sorted = (cumulative - sorted_probs) <= top_p
    else:  # "ascending": the right rule on the wrong end of the distribution; "logits"
        keep_sorted = (cumulative - sorted_probs) < top_p  # the right rule on the logits;
        # "dim 0": the right rule on probabilities taken across the batch
    return _scatter_back(keep_sorted, order)


def _keep_only(logits: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    return logits.masked_fill(~keep, NEG_INF)


def _mistakes(logits: torch.Tensor, top_k: int | None, top_p: float | None):
    """Known mistakes, each a function computing what it returns on these inputs."""
    V = logits.shape[-1]
    expected = ref.filter_logits(logits, top_k=top_k, top_p=top_p)
    mistakes = []

    def after_top_k(x: torch.Tensor) -> torch.Tensor:
        return ref.filter_logits(x, top_k=top_k) if top_k is not None else x

    if top_k is not None and top_p is not None:
        mistakes += [
            (
                "your filter ignores top_k when top_p is given: apply top_k first, then top_p "
                "to the tokens top_k kept",
                lambda: ref.filter_logits(logits, top_p=top_p),
            ),
            (
                "your filter ignores top_p when top_k is given: apply top_k first, then top_p "
                "to the tokens top_k kept",
                lambda: ref.filter_logits(logits, top_k=top_k),
            ),
            (
                "top_p is applied to the probabilities before top_k (not renormalised over the "
                "k tokens top_k kept): apply top_k first, then take the softmax of what is "
                "left for top_p",
                lambda: ref.filter_logits(ref.filter_logits(logits, top_p=top_p), top_k=top_k),
            ),
        ]
    if top_k is not None:
        mistakes += [
            (
                "your filter keeps k + 1 tokens (off by one): the k-th largest logit is "
                "`torch.topk(logits, k).values[..., -1]`, i.e. sorted index k - 1, not k",
                lambda: ref.filter_logits(logits, top_k=top_k + 1, top_p=top_p),
            ),
            (
                "your filter keeps the smallest logits, not the largest: it sorts in "
                "ascending order; use `torch.topk` (largest=True by default) or "
                "`sort(descending=True)`",
                lambda: logits.masked_fill(
                    logits > logits.topk(min(top_k, V), dim=-1, largest=False).values[..., -1:],
                    NEG_INF,
                ),
            ),
            (
                "ties at the k-th value are dropped: keep every logit >= the k-th largest "
                "(compare values with the k-th largest; do not scatter exactly k indices)",
                lambda: _keep_only(
                    logits,
                    torch.zeros_like(logits, dtype=torch.bool).scatter(
                        -1, logits.topk(min(top_k, V), dim=-1).indices, True
                    ),
                ),
            ),
        ]
    if top_k is not None and top_p is None:
        mistakes.append(
            (
                "ties at the k-th value are dropped: keep every logit >= the k-th largest, not >",
                lambda: logits.masked_fill(
                    logits <= logits.topk(min(top_k, V), dim=-1).values[..., -1:], NEG_INF
                ),
            )
        )
    if top_p is not None:
        before = after_top_k(logits)
        candidates = [
            *([(_TOP_P_WRONG_AXIS, "dim 0")] if before.dim() > 1 and before.shape[0] > 1 else []),
            (_TOP_P_AT_EQUALITY, "<="),
            (_TOP_P_ON_LOGITS, "logits"),
            (_TOP_P_ON_LOGITS, "logits, <="),
            (_TOP_P_ON_LOGITS, "logits, no shift"),
            (_TOP_P_CROSSING_DROPPED, "no shift"),
            (_TOP_P_CROSSING_DROPPED, "no shift, first kept"),
            (_TOP_P_ASCENDING, "ascending"),
        ]
        for description, variant in candidates:
            keep = _top_p_keep(before, top_p, variant=variant)
            if torch.equal(keep, torch.isfinite(before)):
                # A rule that keeps every token top_k left says nothing about how it sorts
                # or sums: a filter that keeps too many tokens would match it too.
                continue
            mistakes.append((description, lambda keep=keep: _keep_only(before, keep)))
    kept = torch.isfinite(expected)
    mistakes += [
        (
            "your filter fills the dropped logits with 0 instead of -inf: a logit of 0 still "
            "has probability exp(0) / sum(exp(logits)) > 0 after the softmax; fill with "
            "float('-inf')",
            lambda: torch.where(kept, logits, torch.zeros_like(logits)),
        ),
        (
            "you returned probabilities (a softmax): return the logits, with -inf at the "
            "dropped tokens; the sampler takes the softmax afterwards",
            lambda: expected.softmax(-1),
        ),
        (
            "you returned log-probabilities renormalised over the kept tokens: return the "
            "logits themselves, unchanged where kept and -inf elsewhere",
            lambda: expected.log_softmax(-1),
        ),
    ]
    return mistakes


def _fill_hint(logits: torch.Tensor, expected: torch.Tensor):
    """A hint for a filter that keeps the right tokens unchanged but leaves finite values
    where -inf belongs: one constant different from the input logits there (a fill
    value such as -1e9, not one of the known mistakes), or the input logits themselves
    (too many tokens kept)."""
    kept = torch.isfinite(expected)

    def hint(got: torch.Tensor) -> str | None:
        if got.shape != expected.shape or not got.is_floating_point():
            return None
        if not torch.equal(got[kept].to(logits.dtype), logits[kept]):
            return None
        extra = ~kept & torch.isfinite(got)  # finite where -inf belongs
        if not bool(extra.any()):
            return None
        values, original = got[extra].to(logits.dtype), logits[extra]
        if torch.equal(values, original):
            return (
                "these positions still hold their original logits: your filter keeps too "
                "many tokens"
            )
        fills = values[values != original]  # the positions that were written to
        if bool((fills == fills[0]).all()):
            return (
                f"the dropped logits must be exactly -inf, you filled them with "
                f"{fmt_values(fills[:1])[1:-1]}: a finite value keeps a small probability"
            )
        return None

    return hint


def _axis_hint(candidate, logits: torch.Tensor, expected: torch.Tensor, kwargs: dict):
    """On (B, T, V) logits: a hint when the student's filter is right on the same rows
    flattened to (B * T, V), i.e. it works along a fixed axis (dim=1), not dim=-1."""

    def hint(got: torch.Tensor) -> str | None:
        if logits.dim() < 3:
            return None
        flat = logits.reshape(-1, logits.shape[-1]).clone()
        again = candidate(flat, **kwargs)
        if not isinstance(again, torch.Tensor) or again.numel() != expected.numel():
            return None
        again = again.detach().cpu().reshape(expected.shape).to(expected.dtype)
        if torch.equal(torch.isfinite(again), torch.isfinite(expected)) and torch.equal(
            again[torch.isfinite(expected)], expected[torch.isfinite(expected)]
        ):
            return (
                f"on {tuple(logits.shape)} logits your filter works along the wrong axis "
                "(it is right on the same rows flattened to (B * T, V)): use dim=-1"
            )
        return None

    return hint


# ---------------------------------------------------------------- comparing


def _indices(kept_row: torch.Tensor, limit: int = 12) -> str:
    """``[2, 5, 7]``: the positions of the kept tokens in one row."""
    positions = [str(int(i)) for i in kept_row.nonzero().reshape(-1)]
    more = ", ..." if len(positions) > limit else ""
    return "[" + ", ".join(positions[:limit]) + more + "]"


def _expect_filtered(got, expected: torch.Tensor, name: str, mistakes, hints) -> None:
    """Compare the kept sets first (which tokens are finite), row by row, so the message
    names the tokens; then the values (kept logits unchanged, -inf elsewhere, dtype)."""
    got_t = expect_tensor(got, name).detach().cpu()
    if (
        tuple(got_t.shape) == tuple(expected.shape)
        and got_t.is_floating_point()
        and not bool(got_t.isnan().any())
    ):
        got_kept, expected_kept = torch.isfinite(got_t), torch.isfinite(expected)
        if not torch.equal(got_kept, expected_kept):
            wrong_rows = (got_kept != expected_kept).any(-1)  # (...,)
            if wrong_rows.dim() == 0:
                row, where, count = (), "", ""
            else:
                row = tuple(int(i) for i in wrong_rows.nonzero()[0])
                where = "row [" + ", ".join([str(i) for i in row] + [":"]) + "]: "
                count = f" in {int(wrong_rows.sum())} of {wrong_rows.numel()} rows"
            message = (
                f"{name}: the wrong tokens are kept{count}\n"
                f"{where}expected finite logits at {_indices(expected_kept[row])} "
                "(-inf elsewhere)\n"
                f"{' ' * len(where)}got finite logits at      {_indices(got_kept[row])}"
            )
            atol, rtol = match_tolerances(expected.dtype)
            # Several mistakes can give the same output on one input: name all of them.
            matches = []
            for mistake in mistakes:
                if mistake[0] in [m[0] for m in matches]:
                    continue  # two ways to the same mistake: name it once
                if first_mistake(got_t, [mistake], atol, rtol, expected) is not None:
                    matches.append(mistake)
            if len(matches) == 1:
                message += f"\nLikely mistake: {matches[0][0]}."
            elif matches:  # the first three: the most specific to this case come first
                message += "\nLikely mistake, one of these (they give the same output here):"
                message += "".join(f"\n- {description}." for description, _ in matches[:3])
            else:
                for hint in hints:
                    try:
                        text = hint(got_t)
                    except Exception:  # noqa: BLE001 - a hint that cannot be computed is silent
                        text = None
                    if text:
                        message += f"\nHint: {text}."
                        break
            raise CaseFailed(message)
    expect_close(got, expected, name, mistakes=mistakes, hints=hints)


# ---------------------------------------------------------------- cases


def _describe_call(logits: torch.Tensor, top_k, top_p) -> str:
    args = [f"logits {tuple(logits.shape)} {str(logits.dtype).replace('torch.', '')}"]
    if top_k is not None:
        args.append(f"top_k={top_k}")
    if top_p is not None:
        args.append(f"top_p={top_p}")
    return "filter_logits(" + ", ".join(args) + ")"


def _compare_case(candidate, make_logits, top_k=None, top_p=None, error_hint=None):
    def run():
        logits = make_logits()
        expected = ref.filter_logits(logits, top_k=top_k, top_p=top_p)
        kwargs = {}
        if top_k is not None:
            kwargs["top_k"] = top_k
        if top_p is not None:
            kwargs["top_p"] = top_p
        what = _describe_call(logits, top_k, top_p)
        got = call_student(
            candidate, logits, what=what, arg_names=("logits",), error_hint=error_hint, **kwargs
        )
        _expect_filtered(
            got,
            expected,
            f"the filtered logits of {what}",
            mistakes=_mistakes(logits, top_k, top_p),
            hints=[_axis_hint(candidate, logits, expected, kwargs), _fill_hint(logits, expected)],
        )

    return run


def _value_error_case(candidate, name: str, bad_values):
    """Bad ``top_k`` / ``top_p`` must raise ValueError whose message names the argument."""

    def run():
        logits = randn(2, 6, seed=70)
        allowed = "top_k >= 1" if name == "top_k" else "0 < top_p <= 1"
        for value in bad_values:
            expect_value_error(
                lambda value=value: candidate(logits.clone(), **{name: value}),
                f"filter_logits(logits, {name}={value!r})",
                name,
                example=f"{name}: got {{{name}!r}}, expected ...",
                other_error="check the argument at the top of the function and raise "
                f"ValueError naming `{name}`.",
                returned=f"check the argument first and raise ValueError naming `{name}` "
                f"unless {allowed}",
            )

    return run


def _probabilities(*values: float, dtype=torch.float64):
    """Logits whose softmax is ``values`` (where these are powers of two, every partial
    sum is exact in floating point, so a case on a boundary is not at the mercy of rounding)."""
    return lambda: torch.tensor([math.log(v) for v in values], dtype=dtype)


def _scaled(*shape: int, seed: int, scale: float = 2.0, dtype=torch.float64):
    """Random logits, spread enough that top-p keeps a few tokens, not most."""
    return lambda: (randn(*shape, seed=seed) * scale).to(dtype)


def _summing_to_one(*shape: int, seed: int):
    """:func:`_scaled` logits, redrawn (`draw_until`) until no row's sorted probabilities
    add up to more than 1.0 in floating point: where rounding pushes the last cumulative
    sum above 1, a rule that removes ``cumulative > top_p`` drops a token at top_p = 1,
    on some draws and not others."""

    def keep(logits: torch.Tensor) -> bool:
        probs = logits.softmax(-1).sort(dim=-1, descending=True).values
        return bool((probs.cumsum(-1) <= 1.0).all())

    return lambda: draw_until(lambda name: randn(*shape, seed=name) * 2.0, keep, seed)


_MUST_SHOW = ("ignores top_k", "ignores top_p", "before top_k", "k + 1", "smallest logits")
"""The mistakes that a drawn case with both top_k and top_p must expose under every seed."""


def _scaled_both(
    *shape: int, seed: int, top_k: int, top_p: float, scale: float = 2.0, dtype=torch.float64
):
    """:func:`_scaled` logits for a case with both ``top_k`` and ``top_p``, redrawn
    (`draw_until`) until each mistake of ``_MUST_SHOW`` keeps other tokens than the
    reference, and no row's cumulative probability lies within 1e-4 of ``top_p`` (so
    rounding cannot move the boundary): on some draws top_p already stops before the
    k-th token in every row, and a filter that keeps k + 1 tokens, or ignores top_k,
    passes the case."""

    def draw(name: int) -> torch.Tensor:
        return (randn(*shape, seed=name) * scale).to(dtype)

    def keep(logits: torch.Tensor) -> bool:
        expected = torch.isfinite(ref.filter_logits(logits, top_k=top_k, top_p=top_p))
        kept = ref.filter_logits(logits, top_k=top_k)
        cumulative = kept.double().softmax(-1).sort(-1, descending=True).values.cumsum(-1)
        if bool(((cumulative - top_p).abs() < 1e-4).any()):
            return False
        for description, wrong in _mistakes(logits, top_k, top_p):
            if any(key in description for key in _MUST_SHOW):
                if torch.equal(torch.isfinite(wrong()), expected):
                    return False
        return True

    return lambda: draw_until(draw, keep, seed)


def _tied():
    """Logits tied at the 2nd-largest value: three of them in row 0, four in row 1."""
    return lambda: torch.tensor(
        [[1.0, 2.0, 2.0, 3.0, 2.0, -1.0], [0.5, 0.5, 0.5, 0.5, -2.0, 4.0]], dtype=torch.float64
    )


@checker("filter_logits")
def check_filter_logits(candidate) -> list[Case]:
    """Check ``filter_logits(logits, top_k=None, top_p=None) -> (..., V)``: -inf outside
    the top-k / top-p set, top_k first when both are given."""
    return [
        Case(
            "top_k=3 on (4, 10) logits",
            _compare_case(candidate, _scaled(4, 10, seed=1), top_k=3),
            covers=frozenset({"top_k", "dtype=float64"}),
        ),
        Case(
            "top_p=0.8 on (4, 12) logits",
            _compare_case(candidate, _scaled(4, 12, seed=2), top_p=0.8),
            covers=frozenset({"top_p", "dtype=float64"}),
        ),
        Case(
            "top_p=0.6 crossed by the 2nd token (probabilities 0.5, 0.25, 0.125, 0.125)",
            _compare_case(candidate, _probabilities(0.125, 0.5, 0.125, 0.25), top_p=0.6),
            covers=frozenset({"top_p", "top_p crossing"}),
        ),
        Case(
            "top_p=0.75 reached exactly by 0.5 + 0.25",
            _compare_case(candidate, _probabilities(0.25, 0.125, 0.5, 0.125), top_p=0.75),
            covers=frozenset({"top_p", "top_p reached exactly"}),
        ),
        Case(
            "top_k=3 and top_p=0.72: top_p on the renormalised 3 tokens",
            _compare_case(candidate, _probabilities(0.1, 0.4, 0.2, 0.3), top_k=3, top_p=0.72),
            covers=frozenset({"top_k", "top_p", "top_k+top_p"}),
        ),
        Case(
            "top_k=5 and top_p=0.9 on (3, 16) logits",
            _compare_case(
                candidate,
                _scaled_both(3, 16, seed=3, scale=1.0, top_k=5, top_p=0.9),
                top_k=5,
                top_p=0.9,
            ),
            covers=frozenset({"top_k", "top_p", "top_k+top_p"}),
        ),
        Case(
            "ties at the k-th value are kept (top_k=2)",
            _compare_case(candidate, _tied(), top_k=2),
            covers=frozenset({"top_k", "ties at the k-th value"}),
        ),
        Case(
            "batch shape (B, T, V) = (2, 3, 9), top_k=4 and top_p=0.7",
            _compare_case(
                candidate, _scaled_both(2, 3, 9, seed=4, top_k=4, top_p=0.7), top_k=4, top_p=0.7
            ),
            covers=frozenset({"top_k", "top_p", "top_k+top_p", "shape=(B, T, V)"}),
        ),
        Case(
            "float32 logits, top_k=6 and top_p=0.85",
            _compare_case(
                candidate,
                _scaled_both(3, 20, seed=5, dtype=torch.float32, top_k=6, top_p=0.85),
                top_k=6,
                top_p=0.85,
            ),
            covers=frozenset({"top_k", "top_p", "dtype=float32"}),
        ),
        Case(
            "top_k = V = 8 keeps every token",
            _compare_case(candidate, _scaled(2, 8, seed=6), top_k=8),
            weight=TRIVIAL,
            covers=frozenset({"top_k", "top_k>=V"}),
            support=True,
        ),
        Case(
            "top_k=20 > V=8 keeps every token",
            _compare_case(candidate, _scaled(2, 8, seed=7), top_k=20, error_hint=_CLAMP_HINT),
            weight=TRIVIAL,
            covers=frozenset({"top_k", "top_k>=V"}),
            support=True,
        ),
        Case(
            "top_p=1.0 keeps every token",
            _compare_case(candidate, _summing_to_one(3, 7, seed=8), top_p=1.0),
            weight=TRIVIAL,
            covers=frozenset({"top_p", "top_p=1"}),
            support=True,
        ),
        Case(
            "top_k < 1 raises ValueError naming top_k",
            _value_error_case(candidate, "top_k", (0, -3)),
            covers=frozenset({"top_k", "bad top_k"}),
            support=True,
        ),
        Case(
            "top_p outside (0, 1] raises ValueError naming top_p",
            _value_error_case(candidate, "top_p", (0.0, 1.5, -0.1)),
            covers=frozenset({"top_p", "bad top_p"}),
            support=True,
        ),
    ]
