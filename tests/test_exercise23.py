"""Exercise 23 (ring attention simulated on one process): the checkers' references equal
the package's attention and chapter 23's formulas, every mistake of the catalogue is named
under every run seed, right answers in other forms pass, and the statements say what the
checks hold them to."""

from __future__ import annotations

import math
import os
import sys

import numpy as np
import pytest
import torch

import attention_course as ac
from attention_course.checks import check_merge_partials, check_simulated_ring_attention
from attention_course.checks.quiz_computed import (
    RING_CHAPTER_CONFIG,
    RING_COSTS_MAY_TIE,
    _ring_cost_mistakes,
    draw_ring_config,
    ring_costs_reference,
)
from attention_course.checks.ring import (
    _merge_variant,
    block_state,
    merge_reference,
    required_ring_mistakes,
    simulated_ring_reference,
)
from attention_course.quiz import check_quiz

sys.path.insert(0, os.path.dirname(__file__))
from buggy import ring  # noqa: E402

SEEDS = [0, 1, 2, 3, 7, 11, 42, 2024, 31337, 99991]


def _first_failure(report):
    return next(r for r in report.results if not r.passed)


# ---------------------------------------------------------------- the references


def test_merged_block_states_are_attention_over_both_blocks():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 7, 4, generator=g, dtype=torch.float64) for _ in range(3))
    s = q @ k.mT / 2.0
    a = block_state(s[..., :3] + 30.0, v[..., :3, :])  # A's maximum far above B's
    b = block_state(s[..., 3:], v[..., 3:, :])
    m, l, acc = merge_reference(a, b)  # noqa: E741
    full = torch.softmax(torch.cat([s[..., :3] + 30.0, s[..., 3:]], -1), -1) @ v
    torch.testing.assert_close(acc / l, full, rtol=1e-12, atol=1e-12)
    # the merge agrees with chapter 12's online_softmax_update folding B's scores into A
    folded = ac.tiled.online_softmax_update(*a, s[..., 3:], v[..., 3:, :])
    for x, y in zip((m, l, acc), folded, strict=True):
        torch.testing.assert_close(x, y, rtol=1e-12, atol=1e-12)


def test_two_empty_states_merge_to_an_empty_state():
    empty = (torch.full((3, 1), -math.inf), torch.zeros(3, 1), torch.zeros(3, 2))
    m, l, acc = merge_reference(empty, empty)  # noqa: E741
    assert torch.isneginf(m).all() and (l == 0).all() and (acc == 0).all()
    _, l_nan, _ = _merge_variant("empty gives nan")(empty, empty)
    assert torch.isnan(l_nan).all()  # the mistake the checker names


@pytest.mark.parametrize("W", [1, 2, 3, 4])
@pytest.mark.parametrize("causal", [False, True])
def test_simulated_ring_equals_full_attention(W, causal):
    g = torch.Generator().manual_seed(W)
    n = 3
    q, k, v = (torch.randn(2, 2, W * n, 4, generator=g, dtype=torch.float64) for _ in range(3))
    mask = ac.causal_mask(W * n) if causal else None
    full, _ = ac.scaled_dot_product_attention(q, k, v, mask)
    shards = [list(x.split(n, dim=-2)) for x in (q, k, v)]
    for impl in (simulated_ring_reference, ring.reference_ring):
        got = torch.cat(impl(*shards, causal), dim=-2)
        torch.testing.assert_close(got, full, rtol=1e-12, atol=1e-12)


def test_the_rings_mask_counts_chapter_23s_pairs(monkeypatch):
    """The reference ring's masking rule (skip later blocks, a triangle on the own block)
    leaves r n^2 + n(n+1)/2 unmasked pairs on rank r: chapter 23's count, and the package's
    ``ring_work`` (what the quiz's busiest_fraction is made of)."""
    import attention_course.checks.ring as checks_ring

    W, n = 4, 5
    seen = []  # (rank, unmasked pairs) of every block the ring scores, in order

    def recording(scores, values):
        seen.append(int(torch.isfinite(scores).sum()))
        return block_state(scores, values)

    monkeypatch.setattr(checks_ring, "block_state", recording)
    shards = [torch.zeros(1, n, 1, dtype=torch.float64) for _ in range(W)]
    simulated_ring_reference(shards, shards, shards, True)
    # rank r scores r + 1 blocks (its own, then the earlier ranks'), rank after rank
    starts = [r * (r + 1) // 2 for r in range(W + 1)]
    counted = [sum(seen[starts[r] : starts[r + 1]]) for r in range(W)]
    assert len(seen) == starts[W]
    assert counted == [r * n * n + n * (n + 1) // 2 for r in range(W)]
    assert counted == [w["unmasked"] for w in ac.ring_work(W, n)]


# ---------------------------------------------------------------- verdicts


@pytest.mark.parametrize(
    "check, right",
    [
        (check_merge_partials, ring.reference_merge),
        (check_merge_partials, ring.merge_lowest_for_empty),
        (check_simulated_ring_attention, ring.reference_ring),
        (check_simulated_ring_attention, ring.ring_future_masked_not_skipped),
        (check_simulated_ring_attention, ring.ring_vectorised_over_steps),
    ],
    ids=[
        "merge",
        "merge, lowest for empty",
        "ring",
        "ring, future masked not skipped",
        "ring, blocks in rank order",
    ],
)
def test_right_answers_pass_under_every_seed(check, right):
    for seed in SEEDS:
        report = check(right, seed=seed)
        assert report.passed, f"seed {seed}: {report}"


@pytest.mark.parametrize(
    "target, name, impl, mistake", ring.CATALOGUE, ids=[e[1] for e in ring.CATALOGUE]
)
def test_each_mistake_fails_and_is_named_under_every_seed(target, name, impl, mistake):
    check = {"merge_partials": check_merge_partials}.get(target, check_simulated_ring_attention)
    verdicts = None
    for seed in SEEDS:
        report = check(impl, seed=seed)
        assert not report.passed, f"seed {seed}: {report}"
        if mistake is not None:
            assert mistake in report.mistakes, f"seed {seed}: {report}"
        now = [r.passed for r in report.results]
        assert verdicts is None or now == verdicts, f"seed {seed}: verdicts changed"
        verdicts = now


@pytest.mark.parametrize(
    "impl, mistake",
    [
        (ring.merge_new_max_only, "ring-merge-held-not-rescaled"),
        (ring.merge_not_rescaled, "ring-merge-not-rescaled"),
        (ring.merge_lse_form, "ring-merge-lse-for-max"),
        (ring.merge_divides, "ring-merge-divided"),
        (ring.ring_new_max_only, "ring-merge-held-not-rescaled"),
        (ring.ring_reversed_sources, "ring-block-source-reversed"),
        (ring.ring_local_mask, "ring-mask-local-positions"),
        (ring.ring_own_twice, "ring-own-block-twice"),
        (ring.ring_w_minus_one_steps, "ring-last-block-missing"),
        (ring.ring_diagonal_unmasked, "ring-diagonal-unmasked"),
    ],
)
def test_the_first_failing_case_names_the_mistake(impl, mistake):
    target = check_merge_partials if impl.__name__.startswith("merge") else None
    report = (target or check_simulated_ring_attention)(impl)
    assert _first_failure(report).mistake == mistake, _first_failure(report).message


def test_a_ring_with_hard_coded_axes_fails_the_shards_without_b_and_h_and_is_told_why():
    """Shards (n, D) and (B, n, D): a ring that indexes axes 2 and 3 raises there, and the
    message says to use axes -2/-1 (it passed all ten cases when every shard was 4-d)."""
    for seed in SEEDS:
        report = check_simulated_ring_attention(ring.ring_four_d_only, seed=seed)
        failed = [r for r in report.results if not r.passed]
        assert [r.name.split(",")[2].strip() for r in failed] == [
            "shards (n",
            "shards (B",
        ], f"seed {seed}: {report}"
        assert all("use axes -2/-1" in r.message for r in failed), str(report)


def test_one_rank_that_forgets_causal_is_named_with_its_twin():
    """At W = 1 a ring that ignores causal=True and one whose own block is unmasked give
    the same output: the case names both, "one of", instead of neither."""
    for seed in SEEDS:
        report = check_simulated_ring_attention(ring.ring_one_rank_not_causal, seed=seed)
        failed = [r for r in report.results if not r.passed]
        assert len(failed) == 1 and failed[0].name.startswith("W = 1"), str(report)
        message = failed[0].message
        assert "Likely mistake: one of several mistakes" in message, message
        assert "causal=True is ignored" in message and "own block is not masked" in message


def test_merge_mistakes_are_named_in_the_ring_too():
    """A ring built on a merge that forgets to rescale fails with the merge's mistake."""
    report = check_simulated_ring_attention(ring.ring_new_max_only)
    assert "the sums already held are not rescaled" in str(report)


def test_the_empty_row_mistake_fails_only_the_empty_rows_case():
    report = check_merge_partials(ring.merge_nan_on_empty)
    failed = [r.name for r in report.results if not r.passed]
    assert len(failed) == 1 and failed[0].startswith("empty rows"), str(report)
    assert report.mistakes == ["ring-merge-empty-nan"]


def test_gathering_the_sequence_fails_the_tile_cases_and_keeps_under_six_tenths():
    report = check_simulated_ring_attention(ring.ring_gathered)
    failed = [r.name for r in report.results if not r.passed]
    assert failed and all(name.startswith("one tile at a time") for name in failed), failed
    assert report.score < 0.6, report.score
    assert "ring-holds-more-than-a-tile" in report.mistakes


def test_rotating_the_callers_lists_is_named():
    report = check_simulated_ring_attention(ring.ring_rotates_caller_lists)
    assert not report.passed and "changed the list `key_shards` in place" in str(report)


def test_the_required_mistakes_show_in_each_ring_case():
    """What the draws are redrawn for: at W = 2 a reversed ring is the same ring (not
    required), at W >= 3 it shows."""
    assert "ring-block-source-reversed" not in required_ring_mistakes(2, True)
    assert "ring-block-source-reversed" in required_ring_mistakes(3, True)
    assert "ring-merge-held-not-rescaled" not in required_ring_mistakes(1, False)


# ---------------------------------------------------------------- quiz 23.ring_costs


def test_ring_costs_reference_is_chapter_23s_numbers():
    step, total, share = ring_costs_reference(*RING_CHAPTER_CONFIG)
    assert step == 2 * 2**30  # chapter 23: "2.0 GiB per rank per step"
    assert total == 7 * step
    n, T = 2**17, 2**20
    assert math.isclose(share, (7 * n * n + n * (n + 1) / 2) / (T * (T + 1) / 2))
    # W = 2, n = 8: the chapter's 36 and 100 pairs, 100 of 136
    assert math.isclose(ring_costs_reference(1, 1, 16, 2, 4, 8)[2], 100 / 136)


def test_drawn_configurations_keep_every_mistake_distinct():
    for seed in range(200):
        config = draw_ring_config(seed)
        B, H, T, W, Dh, nbytes = config
        assert T % W == 0 and B >= 3 and H >= 6 and W >= 3
        right = ring_costs_reference(*config)
        for index, mistakes in enumerate(_ring_cost_mistakes(*config)):
            # the mistakes that tie by construction are named "one of" where they do
            values = [right[index], *(v for m, v in mistakes if m not in RING_COSTS_MAY_TIE)]
            assert len({round(v / right[index], 9) for v in values}) == len(values), config


def test_ring_costs_accepts_numpy_and_torch_and_names_mistakes():
    def as_numpy(*config):
        return np.array(ring_costs_reference(*config), dtype=np.float64)

    def as_torch(*config):
        step, total, share = ring_costs_reference(*config)
        return torch.tensor(step), torch.tensor(total), torch.tensor(share)

    def true_division(B, H, T, W, Dh, nbytes):
        n = T / W  # floats that are whole numbers count
        step = 2 * B * H * n * Dh * nbytes
        return step, (W - 1) * step, ((W - 1) * n * n + n * (n + 1) / 2) / (T * (T + 1) / 2)

    def exact_fraction(B, H, T, W, Dh, nbytes):
        from fractions import Fraction

        n = T // W
        step = 2 * B * H * n * Dh * nbytes
        busiest = Fraction((W - 1) * n * n + n * (n + 1) // 2, T * (T + 1) // 2)
        return step, (W - 1) * step, busiest

    def decimals(B, H, T, W, Dh, nbytes):
        from decimal import Decimal

        step, total, _ = ring_costs_reference(B, H, T, W, Dh, nbytes)
        n = T // W
        busiest = Decimal((W - 1) * n * n + n * (n + 1) // 2) / Decimal(T * (T + 1) // 2)
        return Decimal(step), Decimal(total), busiest

    for answer in (as_numpy, as_torch, true_division, exact_fraction, decimals):
        for seed in SEEDS:
            report = check_quiz("23.ring_costs", answer, seed=seed)
            assert report.passed, f"{answer.__name__}, seed {seed}: {report}"

    def wrong(which):
        def answer(B, H, T, W, Dh, nbytes):
            step, total, share = ring_costs_reference(B, H, T, W, Dh, nbytes)
            n = T // W
            if which == "K only":
                step, total = step // 2, total // 2
            elif which == "W sends":
                total = W * step
            elif which == "all ranks":
                total = W * (W - 1) * step
            elif which == "blocks":
                share = 2 / (W + 1)
            elif which == "ratio":
                share = ((W - 1) * n * n + n * (n + 1) / 2) / (n * (n + 1) / 2)
            elif which == "no diagonal":
                share = (2 * W - 1) / W**2
            return step, total, share

        return answer

    for which, phrase in [
        ("K only", "only the key block is counted"),
        ("W sends", "the last step sends nothing"),
        ("all ranks", "the bytes of all W ranks"),
        ("blocks", "counted in blocks"),
        ("ratio", "the busiest rank's work over the least busy rank's"),
        ("no diagonal", "the diagonal blocks counted as n^2/2 pairs"),
    ]:
        for seed in SEEDS:
            report = check_quiz("23.ring_costs", wrong(which), seed=seed)
            drawn = [r for r in report.results if "drawn" in r.name]
            assert all(not r.passed and phrase in r.message for r in drawn), (which, seed)


def _ring_costs_with(which):
    """A ring_costs answer with one mistake (the simulated student's)."""

    def answer(B, H, T, W, Dh, nbytes):
        n = T // W
        per_number = 2 * B * H * n * Dh
        step = per_number * nbytes
        busiest = (W - 1) * n * n + n * (n + 1) / 2
        share = busiest / (T * (T + 1) / 2)
        if which == "bits":
            step = step * 8
        elif which == "always 2 bytes":
            step = per_number * 2
        elif which == "always 4 bytes":
            step = per_number * 4
        elif which == "K only":
            step = step // 2
        elif which == "whole sequence":
            step = step * W
        total = (W - 1) * step
        if which == "W - 2 sends":
            total = (W - 2) * step
        elif which == "forward twice":
            total = 2 * (W - 1) * step
        elif which == "swapped":
            step, total = total, step
        elif which == "no diagonal":
            share = ((W - 1) * n * n + n * (n - 1) / 2) / (T * (T - 1) / 2)
        elif which == "own scores":
            share = busiest / (W * n * n)
        elif which == "own block whole":
            share = W * n * n / (T * (T + 1) / 2)
        elif which == "rounded":
            share = round(share, 4)
        return step, total, share

    return answer


@pytest.mark.parametrize(
    "which, phrase",
    [
        ("bits", "bits, not bytes"),
        ("always 2 bytes", "the bytes per number fixed at 2"),
        ("always 4 bytes", "the bytes per number fixed at 4"),
        ("K only", "only the key block is counted"),
        ("whole sequence", "the whole sequence's T positions"),
        ("W - 2 sends", "W - 2 sends"),
        ("forward twice", "counted twice, 2 (W - 1) sends"),
        ("swapped", "the two byte counts are swapped"),
        ("no diagonal", "the triangles counted without their diagonal"),
        ("own scores", "the busiest rank's share of its own W n^2 scores"),
        ("own block whole", "the own block counted whole"),
        ("rounded", "it is the right share rounded to"),
    ],
)
def test_ring_costs_names_each_mistake_in_every_failing_case_under_every_seed(which, phrase):
    """Every case the mistake fails names it, alone or "one of" with the mistakes that give
    the same number there: at W = 8 (the chapter's layer) 8 times the bytes is bits and the
    whole sequence at once, at 2 bytes half the bytes is the key block alone and the bytes
    per number left out; a fixed 2 or 4 bytes is never called "only the key block" alone."""
    for seed in SEEDS:
        report = check_quiz("23.ring_costs", _ring_costs_with(which), seed=seed)
        failed = [r for r in report.results if not r.passed]
        assert failed, f"{which}, seed {seed}: {report}"
        for result in failed:
            assert phrase in result.message, (which, seed, result.message)
            if "fixed at" not in phrase:
                continue
            for line in result.message.splitlines():
                if "only the key block" in line:
                    assert "fixed at" in line, (which, seed, result.message)
    chapter = check_quiz("23.ring_costs", _ring_costs_with(which)).results[0]
    if which in ("bits", "K only", "whole sequence", "swapped", "always 4 bytes"):
        assert not chapter.passed and phrase in chapter.message, chapter.message


# ---------------------------------------------------------------- the statements


def test_the_statements_say_keep_float64_and_quote_the_rules():
    import nbformat

    root = os.path.join(os.path.dirname(__file__), "..", "exercises")
    for folder in (root, os.path.join(root, "solutions")):
        nb = nbformat.read(os.path.join(folder, "23_ring_attention.ipynb"), 4)
        text = "\n".join(c.source for c in nb.cells)
        assert text.count("Keep float64: no float32 round trip") == 2
        assert "not wrong, only wasteful" in text  # future blocks masked instead of skipped
        assert "`F.scaled_dot_product_attention`" in text
        # task 2's shards come without (B, H) too; a ring with a private merge can pass
        assert "`(B, H, n, D)`, `(B, n, D)` and `(n, D)`" in text
        assert "can pass here while task 1 fails" in text
        assert "where task 1's check fails, this one fails too" not in text
        # task 3 accepts any real number, for each of the three
        assert "`fractions.Fraction` or `decimal.Decimal`" in text


def test_the_ring_and_tiled_references_are_absent_while_grading():
    """Exercise 23 hands out no reference: in its build the package's ring and online
    softmax, and the checkers' own merge and ring, are stubs."""
    from attention_course.grading import absent

    plan = absent.plan("23_ring_attention")
    assert {"online_softmax_update", "tiled_attention", "tiled_attention_loop"} <= set(
        plan.stubs["attention_course.tiled"]
    )
    assert {"ring_attention", "run_ring"} <= set(plan.stubs["attention_course.ring"])
    assert {"merge_reference", "simulated_ring_reference", "block_state"} <= set(
        plan.stubs["attention_course.checks.ring"]
    )
    assert "scaled_dot_product_attention" in plan.stubs["attention_course.attention"]


def _merge_in_float32(state_a, state_b):
    """The merge computed in float32 and cast back: right to float32's precision only."""
    dtype = state_a[0].dtype
    merged = ring.reference_merge(
        tuple(t.float() for t in state_a), tuple(t.float() for t in state_b)
    )
    return tuple(t.to(dtype) for t in merged)


def _ring_in_float32(query_shards, key_shards, value_shards, causal=False):
    dtype = query_shards[0].dtype
    shards = [[t.float() for t in x] for x in (query_shards, key_shards, value_shards)]
    return [out.to(dtype) for out in ring.reference_ring(*shards, causal)]


@pytest.mark.parametrize(
    "check, wrong",
    [(check_merge_partials, _merge_in_float32), (check_simulated_ring_attention, _ring_in_float32)],
    ids=["merge", "ring"],
)
def test_a_float32_round_trip_fails_and_its_message_leads_with_the_rule(check, wrong):
    report = check(wrong)
    assert not report.passed
    message = _first_failure(report).message
    assert "\nHint: keep float64: no float32 round trip." in message, message
