"""Checkers for exercise 23 (ring attention, simulated on one process): the merge of two
partial softmax results, and a ring of ``W`` simulated ranks built on it.

Both targets keep chapter 23's notation: a partial result is the state ``(m, l, acc)`` of
chapter 12's online softmax over some of a row's keys (``m`` the largest score, ``l`` the
sum of ``e^{s - m}``, ``acc`` the sum of ``e^{s - m} v``), and two of them merge by
rescaling both to the larger maximum. The ring is graded on one process: no
``torch.distributed``, the ranks simulated one after another, and each answer compared with
full attention on the gathered sequence.

Every drawn input is redrawn (`_data.draw_until`) until each known mistake that the case
is built to show changes the answer, so no run seed lets a mistake pass.
"""

from __future__ import annotations

import math
import re

import numpy as np
import torch
import torch.nn.functional as F

from ._compare import expect_close, expect_grad, expect_tuple, fmt_shape, matches
from ._data import draw_until, randn
from ._mistakes import says
from ._runner import TRIVIAL, Case, CaseFailed, call_student, checker, forbid_builtins
from ._sizes import record_sizes
from .logit_range import keep_float64_hint
from .tiled import _NUMPY

_STATE = ("m", "l", "acc")

# ---------------------------------------------------------------- the merge


def _shift(m: torch.Tensor) -> torch.Tensor:
    """``m`` with -inf read as 0: the reference point of a row that has seen nothing."""
    return torch.where(torch.isneginf(m), torch.zeros_like(m), m)


def merge_reference(state_a, state_b):
    """Chapter 23's merge of two partial results, each ``(m, l, acc)`` with m, l
    ``(..., T, 1)`` and acc ``(..., T, Dv)``: both sums rescaled to ``m = max(m_a, m_b)``,
    ``l = e^{m_a - m} l_a + e^{m_b - m} l_b``, ``acc = e^{m_a - m} acc_a + e^{m_b - m}
    acc_b``. A row empty in both (m = -inf) stays empty: (-inf, 0, 0), no NaN."""
    (m_a, l_a, acc_a), (m_b, l_b, acc_b) = state_a, state_b
    m = torch.maximum(m_a, m_b)
    c_a, c_b = torch.exp(m_a - _shift(m)), torch.exp(m_b - _shift(m))
    return m, c_a * l_a + c_b * l_b, c_a * acc_a + c_b * acc_b


def _merge_variant(mistake: str):
    """The merge with one known mistake (see `_MERGE_MISTAKES`)."""

    def merge(state_a, state_b):
        (m_a, l_a, acc_a), (m_b, l_b, acc_b) = state_a, state_b
        m = torch.maximum(m_a, m_b)
        if mistake == "max of incoming":
            m = m_b
        elif mistake == "min of maxima":  # the smaller maximum, the larger where one is empty
            smaller = torch.minimum(m_a, m_b)
            m = torch.where(torch.isneginf(smaller), m, smaller)
        elif mistake == "held maximum":  # m_a, or m_b where A is empty
            m = torch.where(torch.isneginf(m_a), m_b, m_a)
        elif mistake == "logsumexp of maxima":
            m = torch.logaddexp(m_a, m_b)
        elif mistake == "lse for max":
            m = torch.logaddexp(m_a + torch.log(l_a), m_b + torch.log(l_b))
        ref = m if mistake == "empty gives nan" else _shift(m)
        if mistake == "exponents from zero":  # e^{m_a}, e^{m_b}: the -inf guard's 0 everywhere
            ref = torch.zeros_like(m)
        elif mistake == "measured from held":  # the sums measured against m_a (m_b, 0 if empty)
            ref = _shift(torch.where(torch.isneginf(m_a), m_b, m_a))
        c_a, c_b = torch.exp(m_a - ref), torch.exp(m_b - ref)
        if mistake == "inverted":
            c_a = torch.where(torch.isneginf(m_a), 0.0, torch.exp(ref - m_a))
            c_b = torch.where(torch.isneginf(m_b), 0.0, torch.exp(ref - m_b))
        la, aa = c_a * l_a, c_a * acc_a
        lb, ab = c_b * l_b, c_b * acc_b
        if mistake in ("held not rescaled", "none rescaled"):
            la, aa = l_a, acc_a
        if mistake in ("incoming not rescaled", "none rescaled"):
            lb, ab = l_b, acc_b
        if mistake == "sum not rescaled":
            la, lb = l_a, l_b
        if mistake == "acc not rescaled":
            aa, ab = acc_a, acc_b
        l, acc = la + lb, aa + ab  # noqa: E741
        if mistake == "divided":
            acc = acc / l
        elif mistake == "normalised":  # the state returned normalised: l = 1, acc / l
            l, acc = torch.ones_like(l), acc / l  # noqa: E741
        if mistake == "empty max zero":
            m = _shift(m)
        return m, l, acc

    return merge


_MERGE_MISTAKES = [
    ("ring-merge-held-not-rescaled", "held not rescaled"),
    ("ring-merge-incoming-not-rescaled", "incoming not rescaled"),
    ("ring-merge-not-rescaled", "none rescaled"),
    ("ring-merge-sum-not-rescaled", "sum not rescaled"),
    ("ring-merge-acc-not-rescaled", "acc not rescaled"),
    ("ring-merge-rescale-inverted", "inverted"),
    ("ring-merge-divided", "divided"),
    ("ring-merge-lse-for-max", "lse for max"),
    ("ring-merge-logsumexp-of-maxima", "logsumexp of maxima"),
    ("ring-merge-max-of-incoming", "max of incoming"),
    ("ring-merge-empty-nan", "empty gives nan"),
    ("ring-merge-empty-max-zero", "empty max zero"),
    ("ring-merge-normalised", "normalised"),
    ("ring-merge-min-of-maxima", "min of maxima"),
    ("ring-merge-held-maximum", "held maximum"),
    ("ring-merge-exponents-from-zero", "exponents from zero"),
    ("ring-merge-measured-from-held", "measured from held"),
]
"""(mistake id, variant of `_merge_variant`), in the order they are tried."""


def _accept_lowest(m):
    """The student's ``m`` with the most negative finite number read as -inf (both are a
    fine maximum for a row that has seen nothing)."""
    if not isinstance(m, torch.Tensor) or not m.is_floating_point():
        return m
    return m.masked_fill(m.detach() <= torch.finfo(m.dtype).min, -math.inf)


def _same_state(got, want, dtype) -> bool:
    from ._compare import match_tolerances

    atol, rtol = match_tolerances(dtype)
    return all(
        isinstance(g, torch.Tensor)
        and tuple(g.shape) == tuple(w.shape)
        and matches(g.detach().cpu(), w, atol, rtol)
        for g, w in zip(got, want, strict=True)
    )


def _merge_diagnosis(got, a, b, expected) -> str | None:
    """The id of the known mistake whose whole merged state equals the candidate's."""
    dtype = expected[0].dtype
    for mistake, variant in _MERGE_MISTAKES:
        try:
            with torch.no_grad():
                wrong = _merge_variant(variant)(a, b)
        except Exception:  # noqa: BLE001 - a variant that cannot be computed says nothing
            continue
        wrong = (_accept_lowest(wrong[0]), *wrong[1:])
        if _same_state(wrong, expected, dtype):
            continue  # this mistake gives the right answer here: it says nothing
        if _same_state(got, wrong, dtype):
            return mistake
    return None


def block_state(scores: torch.Tensor, values: torch.Tensor):
    """One block's partial result: ``m`` the row's largest score, ``l = sum e^{s - m}``,
    ``acc = e^{s - m} @ values``; a row whose scores are all -inf is empty, (-inf, 0, 0).
    scores ``(..., T, Sb)``, values ``(..., Sb, Dv)``."""
    m = scores.amax(dim=-1, keepdim=True)
    p = torch.exp(scores - _shift(m))
    return m, p.sum(dim=-1, keepdim=True), p @ values


def _draw_states(batch, T, Sb, Dv, seed, dtype, *, offset=6.0, empty=None, big=0.0):
    """Two partial results of the same rows over two blocks of ``Sb`` keys each, from
    drawn scores. Even rows: block B's scores are ``offset`` higher (the incoming block
    raises the maximum); odd rows: block A's are. ``big`` is added to every score (maxima
    near 1,000). ``empty``: rows set to (-inf, 0, 0) in A, in B, in both (lists of row
    indices under the keys "a", "b")."""

    def draw(name):
        s_a = randn(*batch, T, Sb, seed=name)
        s_b = randn(*batch, T, Sb, seed=name + 1)
        rows = torch.arange(T)
        up = torch.where(rows % 2 == 0, offset, -offset).to(torch.float64)[:, None]
        s_b = s_b + up + big
        s_a = s_a + big
        v_a = randn(*batch, Sb, Dv, seed=name + 2)
        v_b = randn(*batch, Sb, Dv, seed=name + 3)
        for key, s in (("a", s_a), ("b", s_b)):
            for row in (empty or {}).get(key, ()):
                s[..., row, :] = -math.inf
        a = block_state(s_a.to(dtype), v_a.to(dtype))
        b = block_state(s_b.to(dtype), v_b.to(dtype))
        return a, b

    def shows(states):
        a, b = states
        want = merge_reference(a, b)
        return all(
            not _same_state(_merge_variant(v)(a, b), want, torch.float64)
            for _, v in _MERGE_MISTAKES
            if v in _SHOWN_BY_EVERY_DRAW
        )

    return draw_until(draw, shows, seed)


# the mistakes every drawn pair of states shows (the rows alternate which block's maximum is
# the larger); the -inf mistakes show only where rows are empty, by construction
_SHOWN_BY_EVERY_DRAW = (
    "held not rescaled",
    "incoming not rescaled",
    "none rescaled",
    "sum not rescaled",
    "acc not rescaled",
    "divided",
    "max of incoming",
    "logsumexp of maxima",
    "normalised",
    "min of maxima",
    "held maximum",
    "exponents from zero",
    "measured from held",
)


def _state_what(a, b) -> str:
    dtype = str(a[0].dtype).replace("torch.", "")
    return (
        f"merge_partials(state_a, state_b), m {fmt_shape(a[0].shape)}, acc "
        f"{fmt_shape(a[2].shape)}, {dtype}"
    )


def _expect_merged(got, expected, a, b, what: str) -> None:
    got = expect_tuple(got, 3, what, _STATE)
    for value, want, name in zip(got, expected, _STATE, strict=True):
        if isinstance(value, torch.Tensor) and tuple(value.shape) != tuple(want.shape):
            message = (
                f"{name} returned by {what}: expected shape {fmt_shape(want.shape)}, got "
                f"{fmt_shape(value.shape)}"
            )
            if name != "acc" and tuple(value.shape) == tuple(want.shape[:-1]):
                message += (
                    f"\nHint: {name} lost its last axis of size 1: m and l are (..., T, 1), "
                    "one number per query row; keep it (`keepdim=True`, no squeeze)"
                )
            raise CaseFailed(message)
    got = (_accept_lowest(got[0]), got[1], got[2])
    mistake = _merge_diagnosis(got, a, b, expected)
    for value, want, name in zip(got, expected, _STATE, strict=True):
        try:
            expect_close(
                value, want, f"{name} returned by {what}", hints=[keep_float64_hint(want.detach())]
            )
        except CaseFailed as error:
            message = str(error)
            if mistake is not None:
                message = message.split("\nHint:")[0] + f"\nLikely mistake: {says(mistake)}."
            raise CaseFailed(message) from None


def _merge_case(candidate, batch, T, Sb, Dv, seed, *, dtype=torch.float64, **options):
    def run():
        a, b = _draw_states(batch, T, Sb, Dv, seed, dtype, **options)
        expected = merge_reference(a, b)
        what = _state_what(a, b)
        given = [tuple(t.clone() for t in a), tuple(t.clone() for t in b)]
        got = call_student(candidate, *given, what=what, arg_names=("state_a", "state_b"))
        for name, state, original in zip(("state_a", "state_b"), given, (a, b), strict=True):
            for part, x, y in zip(_STATE, state, original, strict=True):
                if not torch.equal(torch.nan_to_num(x), torch.nan_to_num(y)):
                    raise CaseFailed(
                        f"{what} changed `{part}` of `{name}` in place (`l_a *= ...`, "
                        "`acc_a.mul_(...)`): compute new tensors and leave both states unchanged"
                    )
        _expect_merged(got, expected, a, b, what)

    return run


def _start_case(candidate, seed):
    """A is the empty start state in every row: the merge returns B (a merge that
    returns its first argument, or adds the two, passes too: a support case)."""

    def run():
        _, b = _draw_states((2,), 4, 3, 5, seed, torch.float64)
        a = (torch.full_like(b[0], -math.inf), torch.zeros_like(b[1]), torch.zeros_like(b[2]))
        what = "merge_partials(empty start state, state_b): m_a = -inf, l_a = 0, acc_a = 0"
        got = call_student(candidate, a, b, what=what, arg_names=("state_a", "state_b"))
        _expect_merged(got, merge_reference(a, b), a, b, what)

    return run


def _merge_grad_case(candidate, seed):
    """The gradients of the merged output acc / l reach all six tensors of both states."""

    def run():
        a, b = _draw_states((2,), 5, 3, 4, seed, torch.float64)
        mine = [t.detach().clone().requires_grad_(True) for t in (*a, *b)]
        theirs = [t.detach().clone().requires_grad_(True) for t in (*a, *b)]
        want = merge_reference(tuple(theirs[:3]), tuple(theirs[3:]))
        what = _state_what(a, b) + ", gradients"
        got = call_student(
            candidate, tuple(mine[:3]), tuple(mine[3:]), what=what, arg_names=("state_a",)
        )
        got = expect_tuple(got, 3, what, _STATE)
        _expect_merged(
            tuple(t.detach() if isinstance(t, torch.Tensor) else t for t in got), want, a, b, what
        )
        upstream = randn(*want[2].shape, seed=seed + 9)
        (want[2] / want[1]).backward(upstream)
        out = got[2] / got[1]
        if not out.requires_grad:
            raise CaseFailed(
                "the merged acc / l does not require grad, so no gradient reaches the two "
                "states: no `torch.no_grad()`, `.detach()`, `.data` or `.item()`"
            )
        call_student(out.backward, upstream, what="backpropagating through acc / l")
        names = ("`m_a`", "`l_a`", "`acc_a`", "`m_b`", "`l_b`", "`acc_b`")
        for name, x, y in zip(names, mine, theirs, strict=True):
            expect_grad(x.grad, y.grad, name)

    return run


@checker("merge_partials", chapter="23_ring_attention")
def check_merge_partials(candidate) -> list[Case]:
    """Check ``merge_partials(state_a, state_b) -> (m, l, acc)``: two partial results of
    the same query rows, each ``(m, l, acc)`` (m, l ``(..., T, 1)``, acc ``(..., T, Dv)``),
    merged by rescaling both to the larger maximum; a row empty in both stays empty."""
    return [
        Case(
            "(B, H) = (2, 3), T = 6, Dv = 5: in even rows the incoming block B has the larger "
            "maximum, in odd rows the held block A",
            _merge_case(candidate, (2, 3), 6, 4, 5, 2301),
            covers=frozenset({"B, H", "dtype=float64"}),
        ),
        Case(
            "no batch axes, m (7, 1), acc (7, 3): maxima 12 apart",
            _merge_case(candidate, (), 7, 5, 3, 2311, offset=12.0),
            covers=frozenset({"no batch axes"}),
        ),
        Case(
            "scores near 1,000 (exponents must be taken from the maxima)",
            _merge_case(candidate, (2,), 6, 3, 4, 2321, big=1000.0),
            covers=frozenset({"large scores"}),
        ),
        Case(
            "empty rows (m = -inf, l = 0, acc = 0): in A only, in B only, in both (a block "
            "wholly in a row's causal future)",
            _merge_case(candidate, (2,), 8, 3, 4, 2331, empty={"a": (0, 5, 7), "b": (2, 3, 7)}),
            covers=frozenset({"empty rows"}),
        ),
        Case(
            "float32 states give float32 results",
            _merge_case(candidate, (2, 2), 6, 4, 3, 2341, dtype=torch.float32),
            covers=frozenset({"dtype=float32"}),
        ),
        Case(
            "A is the empty start state: the merge returns B",
            _start_case(candidate, 2351),
            weight=TRIVIAL,
            support=True,
            covers=frozenset({"start state"}),
        ),
        Case(
            "gradients of acc / l reach m, l and acc of both states",
            _merge_grad_case(candidate, 2361),
            covers=frozenset({"grad"}),
        ),
    ]


# ---------------------------------------------------------------- the simulated ring


def simulated_ring_reference(query_shards, key_shards, value_shards, causal=False, **mistake):
    """Ring attention simulated on one process, contiguous layout: rank ``r`` holds the
    ``r``-th shards; at step ``t = 0 .. W-1`` it holds the key/value block of rank
    ``src = (r - t) mod W``, scores its queries against it (scale 1/sqrt(Dk)) and merges the
    block's partial result into its state with :func:`merge_reference`; with ``causal``, a
    block from a later rank is skipped, the own block masked to a triangle (global
    positions ``r n + i`` against ``src n + j``). Returns the ``W`` output shards
    ``acc / l``. ``mistake`` switches on one known mistake (see `_ring_mistakes`)."""
    W = len(query_shards)
    merge = _merge_variant(mistake["merge"]) if "merge" in mistake else merge_reference
    outputs = []
    for r in range(W):
        q = query_shards[r]
        n = q.shape[-2]
        scale = 1.0 if mistake.get("unscaled") else 1.0 / math.sqrt(q.shape[-1])
        if mistake.get("scale") == "Dv":
            scale = 1.0 / math.sqrt(value_shards[r].shape[-1])
        state = None
        steps = range(W)
        if mistake.get("own") == "skipped":
            steps = range(1, W)
        elif mistake.get("own") == "twice":
            steps = [0, *range(W)]
        elif mistake.get("steps") == "W - 1":
            steps = range(W - 1)
        for t in steps:
            src = (r - t) % W
            label = (r + t) % W if mistake.get("source") == "reversed" else src
            if mistake.get("source") == "step":  # the mask's offsets from the step t
                label = t
            s = (q @ key_shards[src].transpose(-2, -1)) * scale  # (..., n, n)
            if causal:
                earlier = mistake.get("skip") == "earlier"  # the past skipped, not the future
                if (label < r if earlier else label > r) and not mistake.get("future"):
                    continue
                rows = torch.arange(n)[:, None] + (r * n if not mistake.get("local") else 0)
                cols = torch.arange(n)[None, :] + (label * n if not mistake.get("local") else 0)
                hidden = cols > rows
                if (mistake.get("future") == "unmasked" or earlier) and label > r:
                    hidden = torch.zeros_like(hidden)
                if label == r:
                    diagonal = mistake.get("diagonal")
                    if diagonal == "unmasked":
                        hidden = torch.zeros_like(hidden)
                    elif diagonal == "hidden":
                        hidden = cols >= rows
                    elif diagonal == "transposed":
                        hidden = cols < rows
                    elif diagonal == "plus one":  # tril(1): one key of the future seen
                        hidden = cols > rows + 1
                s = s.masked_fill(hidden.to(s.device), -math.inf)
            block = block_state(s, value_shards[src])
            if mistake.get("normalised"):  # each block divided by its own l before merging
                block = (block[0], block[1], block[2] / block[1])
            state = block if state is None else merge(state, block)
        if state is None:  # no block merged: an empty state
            shape = (*q.shape[:-1], value_shards[r].shape[-1])
            state = (None, torch.zeros(*q.shape[:-1], 1, dtype=q.dtype), q.new_zeros(shape))
        outputs.append(state[2] / state[1])
    if mistake.get("outputs") == "reversed":  # the shards returned last rank first
        outputs = outputs[::-1]
    return outputs


def _ring_variants(qs, ks, vs, causal):
    """(mistake id, compute) pairs: the ring with one known mistake, gathered output."""

    def variant(**mistake):
        return lambda: torch.cat(simulated_ring_reference(qs, ks, vs, causal, **mistake), dim=-2)

    found = [
        ("ring-own-block-skipped", variant(own="skipped")),
        ("ring-own-block-twice", variant(own="twice")),
        ("ring-last-block-missing", variant(steps="W - 1")),
        ("scale-missing", variant(unscaled=True)),
        ("ring-scale-dv", variant(scale="Dv")),
        ("ring-outputs-reversed", variant(outputs="reversed")),
        ("ring-blocks-normalised", variant(normalised=True)),
    ]
    if not causal:
        found.append(
            (
                "ring-causal-always",
                lambda: torch.cat(simulated_ring_reference(qs, ks, vs, True), dim=-2),
            )
        )
    if causal:
        found = [
            (
                "ring-causal-ignored",
                lambda: torch.cat(simulated_ring_reference(qs, ks, vs, False), dim=-2),
            ),
            ("ring-block-source-reversed", variant(source="reversed")),
            ("ring-mask-local-positions", variant(local=True)),
            ("ring-mask-local-positions", variant(local=True, future=True)),
            ("ring-future-blocks-unmasked", variant(future="unmasked")),
            ("ring-diagonal-unmasked", variant(diagonal="unmasked")),
            ("causal-mask-hides-diagonal", variant(diagonal="hidden")),
            ("causal-mask-inverted", variant(diagonal="transposed")),
            ("ring-diagonal-plus-one", variant(diagonal="plus one")),
            ("ring-earlier-blocks-skipped", variant(skip="earlier")),
            ("ring-mask-from-step", variant(source="step")),
            *found,
        ]
    return found + [(mistake, variant(merge=name)) for mistake, name in _MERGE_MISTAKES]


def one_of(mistakes, expected: torch.Tensor):
    """The known mistakes, those that give the same output on this case named together:
    "one of several mistakes ...: A; or B" (at W = 1 a ring that ignores causal=True and
    one that leaves its own block unmasked are the same ring; naming one would be a guess).
    A mistake that gives the right answer here is dropped."""
    outputs = []
    for description, compute in mistakes:
        try:
            out = compute()
        except Exception:  # noqa: BLE001 - a mistake that cannot be computed does not match
            continue
        if not isinstance(out, torch.Tensor):
            continue
        out = out.detach().cpu()
        if out.shape == expected.shape and matches(expected, out, 1e-12, 1e-9):
            continue
        outputs.append((description, out))
    kept, seen = [], set()
    for index, (description, out) in enumerate(outputs):
        if index in seen:
            continue
        twins = [description]
        for other_index, (other, value) in enumerate(outputs):
            if (
                other_index > index
                and value.shape == out.shape
                and matches(out, value, 1e-12, 1e-9)
            ):
                seen.add(other_index)
                if other not in twins:
                    twins.append(other)
        if len(twins) > 1:
            clauses = "; or ".join(text.split(": ")[0] for text in twins)
            description = (
                "one of several mistakes that all give your values on this case: " + clauses
            )
        kept.append((description, lambda out=out: out))
    return kept


def _ring_mistakes(qs, ks, vs, causal):
    """(message, compute) pairs for `expect_close`."""
    return [(says(mistake), compute) for mistake, compute in _ring_variants(qs, ks, vs, causal)]


def required_ring_mistakes(W: int, causal: bool) -> set[str]:
    """The ids of the mistakes a ring of ``W`` ranks shows on every input the checker
    draws (the draws are redrawn until they do): the rest give the right answer here by
    construction (a reversed ring is the same ring at W = 2; a merge that keeps its sums
    consistent with another maximum gives the right acc / l), or show on some draws only."""
    shown = {"ring-own-block-skipped", "scale-missing"}
    if W >= 2:
        shown |= {
            "ring-own-block-twice",
            "ring-last-block-missing",
            "ring-merge-held-not-rescaled",
            "ring-merge-not-rescaled",
            "ring-merge-sum-not-rescaled",
            "ring-merge-acc-not-rescaled",
            "ring-merge-rescale-inverted",
            "ring-merge-divided",
        }
        if not causal:
            shown.add("ring-merge-incoming-not-rescaled")
    if causal:
        shown |= {
            "ring-diagonal-unmasked",
            "causal-mask-hides-diagonal",
            "causal-mask-inverted",
        }
        if W >= 2:
            shown |= {
                "ring-causal-ignored",
                "ring-mask-local-positions",
                "ring-future-blocks-unmasked",
            }
        if W >= 3:
            shown.add("ring-block-source-reversed")
    return shown


def _ring_shows(qs, ks, vs, causal) -> bool:
    """Whether every mistake of :func:`required_ring_mistakes` changes this ring's output
    by a clear margin (so that no run seed lets one pass)."""
    required = required_ring_mistakes(len(qs), causal)
    with torch.no_grad():
        want = torch.cat(simulated_ring_reference(qs, ks, vs, causal), dim=-2)
        for mistake, compute in _ring_variants(qs, ks, vs, causal):
            if mistake not in required:
                continue
            wrong = compute()
            finite = bool(torch.isfinite(wrong).all())
            if finite and float((wrong - want).abs().max()) < 1e-3:
                return False
    return True


def _ring_case(
    candidate,
    W,
    batch,
    n,
    Dk,
    Dv,
    seed,
    *,
    causal=False,
    dtype=torch.float64,
    grad=False,
    guard=False,
):
    """``W`` ranks of ``n`` positions each, shards ``(*batch, n, D)``. Key ``j`` of block
    ``s`` gets a score offset of ``-3 s`` (a constant feature of queries and keys): the
    blocks a rank receives later (lower ranks) hold the larger scores, so each step of a
    ring raises some rows' maximum, and merges that forget to rescale show."""

    def draw(name):
        T = W * n
        q = randn(*batch, T, Dk, seed=name)
        k = randn(*batch, T, Dk, seed=name + 1)
        v = randn(*batch, T, Dv, seed=name + 2)
        if Dk > 1:
            q[..., -1] = math.sqrt(Dk)
            k[..., -1] = -3.0 * (torch.arange(T) // n).to(torch.float64)
        return q.to(dtype), k.to(dtype), v.to(dtype)

    def keep(qkv):
        q, k, v = (t.to(torch.float64) for t in qkv)
        return _ring_shows(*(list(x.split(n, dim=-2)) for x in (q, k, v)), causal)

    def run():
        q, k, v = draw_until(draw, keep, seed)
        theirs = [t.detach().clone().requires_grad_(grad) for t in (q, k, v)]
        mine = [t.detach().clone().requires_grad_(grad) for t in (q, k, v)]
        want = _full_attention(*theirs, causal)
        shards = [list(x.split(n, dim=-2)) for x in mine]
        given = [list(s) for s in shards]  # the lists handed over, checked after the call
        flag = ", causal=True" if causal else ""
        what = (
            f"simulated_ring_attention({W} query shards {fmt_shape(shards[0][0].shape)}, key "
            f"shards, value shards {fmt_shape(shards[2][0].shape)}{flag})"
        )
        refused = [(np, name) for name in _NUMPY] if guard else []
        with (
            forbid_builtins([(F, "scaled_dot_product_attention")], _NO_BUILTIN),
            forbid_builtins(refused, _NO_NUMPY, package_may=True),
            forbid_builtins([(torch, "from_numpy")] if guard else [], _NO_NUMPY, package_may=True),
            record_sizes() as largest,
        ):
            got = call_student(
                candidate,
                *given,
                **({"causal": True} if causal else {}),
                what=what,
                arg_names=("query_shards", "key_shards", "value_shards"),
                error_hint=_axes_hint(batch),
            )
        for name, before, after in zip(("query", "key", "value"), shards, given, strict=True):
            if len(after) != len(before) or any(x is not y for x, y in zip(before, after)):
                raise CaseFailed(
                    f"{what} changed the list `{name}_shards` in place (rotated, popped or "
                    "reassigned its items): leave the caller's lists as they were; to pass "
                    "blocks around, index them, `key_shards[(r - t) % W]`, or copy the list"
                )
        outputs = _expect_shards(got, W, want, n, what)
        if guard:
            _expect_one_tile(largest, what, W, batch, n, Dk, Dv)
        with torch.no_grad():
            pieces = (list(x.detach().split(n, dim=-2)) for x in (q, k, v))
            # two mistakes that give the same output here (at W = 1 an unmasked own block
            # is a ring without the mask) are named together, "one of"
            mistakes = one_of(_ring_mistakes(*pieces, causal), want.detach())
        gathered = outputs if isinstance(outputs, torch.Tensor) else torch.cat(outputs, dim=-2)
        expect_close(
            gathered,
            want.detach(),
            f"the output shards of {what}, gathered along the sequence",
            mistakes=mistakes,
            hints=[keep_float64_hint(want.detach())],
        )
        if grad:
            upstream = randn(*want.shape, seed=seed + 9).to(want.dtype)
            want.backward(upstream)
            if not gathered.requires_grad:
                raise CaseFailed(
                    "the output shards do not require grad, so no gradient can flow back to "
                    "the shards: no `torch.no_grad()`, `.detach()`, `.data` or `.numpy()`"
                )
            call_student(
                gathered.backward, upstream, what="backpropagating through your output shards"
            )
            for name, a, b in zip(("`query`", "`key`", "`value`"), mine, theirs, strict=True):
                expect_grad(a.grad, b.grad, name + " shards")

    return run


def _axes_hint(batch):
    """For shards with fewer than two leading axes: a ring that fails on them has most
    likely hard-coded the axes of (B, H, n, D) shards."""
    if len(batch) >= 2:
        return None
    shape = "(n, D)" if not batch else "(B, n, D)"

    def hint(text: str) -> str | None:
        if not re.search(r"dim|out of range|index|size|shape", text, re.IGNORECASE):
            return None
        return (
            f"the shards here are {shape}, with {len(batch) or 'no'} leading "
            f"{'axis' if len(batch) == 1 else 'axes'}: use axes -2/-1 (`k.transpose(-2, -1)`, "
            "`q.shape[-2]`, `q.shape[-1]`), not 2 and 3, which only (B, H, n, D) shards have"
        )

    return hint


_NO_NUMPY = (
    "do not use numpy in simulated_ring_attention: compute in PyTorch, because the size of "
    "every tensor a simulated rank creates is part of the check (scores in numpy are still "
    "scores)"
)

_NO_BUILTIN = (
    "do not call `F.scaled_dot_product_attention`: the task is the ring, each rank scoring "
    "one block at a time and merging it with your merge_partials"
)


def _full_attention(q, k, v, causal):
    """Full attention on the gathered sequence: ``softmax(q k^T / sqrt(Dk)) v``, causal
    with j <= i."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if causal:
        T = q.shape[-2]
        hidden = torch.ones(T, T, dtype=torch.bool).triu(1)
        scores = scores.masked_fill(hidden, -math.inf)
    return scores.softmax(dim=-1) @ v


def _expect_shards(got, W, want, n, what):
    """A list (or tuple) of ``W`` tensors, each one rank's ``(..., n, Dv)`` output."""
    if isinstance(got, torch.Tensor):
        raise CaseFailed(
            f"{what} returned one tensor of shape {fmt_shape(got.shape)}: return the list of "
            f"the {W} ranks' output shards, [rank 0's, rank 1's, ...], each "
            f"{fmt_shape((*want.shape[:-2], n, want.shape[-1]))}"
        )
    if not isinstance(got, (list, tuple)):
        raise CaseFailed(
            f"{what} returned {type(got).__name__}: return a list of the {W} ranks' output shards"
        )
    if len(got) != W:
        raise CaseFailed(
            f"{what} returned {len(got)} shards: expected one per rank, {W} (rank 0's first)"
        )
    shape = (*want.shape[:-2], n, want.shape[-1])
    for r, out in enumerate(got):
        if not isinstance(out, torch.Tensor):
            raise CaseFailed(
                f"{what}: shard {r} is a {type(out).__name__}, expected a tensor {fmt_shape(shape)}"
            )
        if tuple(out.shape) != tuple(shape):
            raise CaseFailed(
                f"{what}: rank {r}'s output shard has shape {fmt_shape(out.shape)}, expected "
                f"{fmt_shape(shape)} (its n = T/W queries, Dv values each)"
            )
    return list(got)


def _expect_one_tile(largest, what, W, batch, n, Dk, Dv) -> None:
    """No tensor larger than the whole inputs or one rank's tile of scores (times the
    widest head, for a tile computed by broadcasting)."""
    heads = math.prod(batch)
    T = W * n
    tile = heads * n * n * max(Dk, Dv)
    limit = max(heads * T * max(Dk, Dv), tile)
    if largest.elements <= limit:
        return
    raise CaseFailed(
        f"{what}: "
        + says(
            "ring-holds-more-than-a-tile",
            elements=f"{largest.elements:,}",
            shape=fmt_shape(largest.shape),
            op=largest.op,
            limit=f"{limit:,}",
        ),
        mistake="ring-holds-more-than-a-tile",
    )


_MEMORY = 3.0
"""The weight of each "one tile at a time" case: the ring exists to hold one block's tile,
so right values from the whole score matrix keep the score below 0.6 (as exercise 12's)."""


@checker(
    "simulated_ring_attention",
    chapter="23_ring_attention",
    answer_builtins=(
        "torch.nn.functional.scaled_dot_product_attention",
        "torch._C._nn.scaled_dot_product_attention",
    ),
)
def check_simulated_ring_attention(candidate) -> list[Case]:
    """Check ``simulated_ring_attention(query_shards, key_shards, value_shards,
    causal=False) -> [W output shards]``: ``W`` ranks simulated on one process, contiguous
    shards ``(..., n, D)``; at step ``t`` rank ``r`` holds the block of rank ``(r - t) mod W``,
    scores it and merges its partial result; with ``causal`` later blocks are skipped and
    the own block masked to a triangle. Compared with full attention on the gathered
    sequence; in the "one tile" case no tensor is larger than the inputs or one rank's
    ``n x n`` tile (times the head width)."""
    return [
        Case(
            "W = 2 ranks, (B, H) = (2, 2), n = 3 positions each, Dk = 4, Dv = 5",
            _ring_case(candidate, 2, (2, 2), 3, 4, 5, 2401),
            covers=frozenset({"W=2", "B, H", "Dk!=Dv", "dtype=float64"}),
        ),
        Case(
            "W = 3, causal (later blocks skipped, the own block a triangle), n = 3",
            _ring_case(candidate, 3, (2, 2), 3, 4, 3, 2411, causal=True),
            covers=frozenset({"W=3", "causal"}),
        ),
        Case(
            "W = 4, causal, (B, H) = (1, 3), n = 2",
            _ring_case(candidate, 4, (1, 3), 2, 4, 4, 2421, causal=True),
            covers=frozenset({"W=4", "causal"}),
        ),
        Case(
            "W = 4, not causal, shards (n, D) with no batch axes, n = 3, Dk = 3, Dv = 2",
            _ring_case(candidate, 4, (), 3, 3, 2, 2431),
            covers=frozenset({"W=4", "Dk!=Dv", "no batch axes"}),
        ),
        Case(
            "W = 2, causal, shards (B, n, D) with one batch axis, B = 3, n = 4",
            _ring_case(candidate, 2, (3,), 4, 4, 4, 2441, causal=True),
            covers=frozenset({"W=2", "causal", "one batch axis"}),
        ),
        Case(
            "W = 1: one rank, causal (the ring is chapter 5's masked attention)",
            _ring_case(candidate, 1, (2, 2), 4, 4, 3, 2451, causal=True),
            weight=TRIVIAL,
            covers=frozenset({"W=1", "causal"}),
        ),
        Case(
            "float32 shards give float32 outputs, W = 3, causal",
            _ring_case(candidate, 3, (2, 2), 3, 4, 4, 2461, causal=True, dtype=torch.float32),
            covers=frozenset({"dtype=float32", "causal"}),
        ),
        Case(
            "gradients flow to the query, key and value shards, W = 3, causal",
            _ring_case(candidate, 3, (1, 2), 3, 4, 3, 2471, causal=True, grad=True),
            covers=frozenset({"grad", "causal"}),
        ),
        Case(
            "one tile at a time: W = 4, n = 12, Dk = Dv = 3, causal (no rank's row of scores, "
            "no T × T)",
            _ring_case(candidate, 4, (1, 2), 12, 3, 3, 2481, causal=True, guard=True),
            weight=_MEMORY,
            covers=frozenset({"one tile", "causal"}),
        ),
        Case(
            "one tile at a time: W = 3, n = 10, Dk = Dv = 2, not causal",
            _ring_case(candidate, 3, (2, 1), 10, 2, 2, 2491, guard=True),
            weight=_MEMORY,
            covers=frozenset({"one tile", "W=3"}),
        ),
    ]
