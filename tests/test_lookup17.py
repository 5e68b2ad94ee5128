"""Exercise 17's answers cannot be looked up (issue 25, gap 3).

Exercise 17's checks run on chapter 17's shipped model and a fixed evaluation batch
(`checks.interpret._eval_ids`: the margins of its answers are proven for that batch), so a
fresh batch cannot stop a table of answers. What follows the run seed is the numbering of
the heads: every case of ``find_induction_head`` and ``ablation_effect`` asks again on the
same model with the heads of every layer renumbered at random (`_renumbering`, a
derangement per layer drawn from the run seed). The function is the same, so the answers
keep their margins; only their numbers change. So:

- a table of ``ablation_effect`` keyed on (layer, head) of the shipped model (what chapter
  17 prints, head by head) fails every case under every seed, with the reason named;
- a table recorded on the check cell's own calls (run seed 0, keyed on the model's
  weights) passes the check cell, as exercise 1's table does (`test_grader_seed.py`: the
  check cell's inputs are fixed so that its committed output is), and scores 0 under any
  other seed, which the grader draws afresh for each run;
- a table of ``find_induction_head``'s answers keyed on (period, layers, heads) fails
  every case under every seed;
- the solved twin keeps full marks under every seed (`test_seed.py`).
"""

from __future__ import annotations

import hashlib
import itertools
import os
import random
import secrets

import pytest
import torch

from attention_course import interpret as ref
from attention_course.checks import check_ablation_effect, check_find_induction_head
from attention_course.checks import interpret as checks
from attention_course.checks._data import drawing_from

# two seeds drawn afresh for each run: the same in every pytest-xdist worker of one run
# (they collect the parametrized ids separately and must agree), different between runs
_RUN = os.environ.get("PYTEST_XDIST_TESTRUNUID")
_DRAW = random.Random(_RUN) if _RUN else secrets.SystemRandom()
SEEDS = [0, 1, 2, 12345, *(_DRAW.randrange(1, 2**31 - 1) for _ in range(2))]
FRESH = [s for s in SEEDS if s != 0]
PERIOD = checks._PERIOD


def _fingerprint(model) -> str:
    digest = hashlib.sha256()
    for name, value in model.state_dict().items():
        digest.update(name.encode())
        digest.update(value.detach().contiguous().numpy().tobytes())
    return digest.hexdigest()


# ---------------------------------------------------------------- the renumbering


def test_the_renumbering_follows_the_run_seed_and_moves_every_head():
    def draw(seed):
        with drawing_from(seed):
            return checks._renumbering(2, 4, seed=1721)

    drawn = {seed: draw(seed) for seed in SEEDS}
    for orders, exponents in drawn.values():
        assert all(sorted(o) == [0, 1, 2, 3] for o in orders)
        assert all(old != new for o in orders for new, old in enumerate(o))  # derangements
        assert all(-3 <= e <= 3 for layer in exponents for pair in layer for e in pair)
    assert all(draw(seed) == r for seed, r in drawn.items())  # reproducible
    assert len({repr(r.exponents) for r in drawn.values()}) == len(SEEDS)


def test_rescaling_by_powers_of_two_is_the_same_function_bit_for_bit():
    """The exponents alone (no head renumbered) change every stored weight of attention
    and not one bit of the logits or the attention weights."""
    ids = checks._eval_ids(PERIOD)
    model = ref.load_induction_model()
    with drawing_from(7):
        exponents = checks._renumbering(2, 4, seed=1721).exponents
    scaled = checks._renumbered(
        ref.load_induction_model(), checks._Renumbering([[0, 1, 2, 3]] * 2, exponents)
    )
    assert not torch.equal(scaled.blocks[1].attn.w_q.weight, model.blocks[1].attn.w_q.weight)
    with torch.no_grad():
        logits, weights = model(ids, return_attention=True)
        scaled_logits, scaled_weights = scaled(ids, return_attention=True)
    assert torch.equal(scaled_logits, logits)
    assert all(torch.equal(a, b) for a, b in zip(scaled_weights, weights, strict=True))


def test_renumbering_keeps_the_function_and_every_heads_effect():
    """Every one of the 81 orders of the 2 x 4 heads gives the same logits (to float32
    rounding), and on the ablation cases' models each head keeps its effect under its new
    number and rescaled weights, while two heads of one layer differ by more than 0.02 nats: twenty
    times the check's tolerance, so a value keyed on the old numbers never passes."""
    ids = checks._eval_ids(PERIOD)
    derangements = [
        list(p) for p in itertools.permutations(range(4)) if all(a != b for a, b in enumerate(p))
    ]
    model = ref.load_induction_model()
    with torch.no_grad():
        logits = model(ids)
        for orders in itertools.product(derangements, repeat=2):
            same = checks._Renumbering(list(orders), [[(0, 0)] * 4] * 2)  # orders only
            renumbered = checks._renumbered(ref.load_induction_model(), same)
            torch.testing.assert_close(renumbered(ids), logits, atol=1e-4, rtol=1e-4)
    for variant in ("trained", "permuted", "harmful"):
        base = checks._variant(variant)
        effects = [
            [ref.ablation_effect(base, ids, PERIOD, layer, head) for head in range(4)]
            for layer in range(2)
        ]
        for row in effects:
            gaps = [abs(a - b) for a, b in itertools.combinations(row, 2)]
            assert min(gaps) > 0.02, (variant, effects)
        for seed in SEEDS[:4]:
            with drawing_from(seed):
                drawn = checks._renumbering(2, 4, seed=1721)
            renumbered = checks._renumbered(checks._variant(variant), drawn)
            for layer, order in enumerate(drawn.orders):
                for new, old in enumerate(order):
                    got = ref.ablation_effect(renumbered, ids, PERIOD, layer, new)
                    assert abs(got - effects[layer][old]) < 1e-5, (variant, seed, layer, new)


# ---------------------------------------------------------------- ablation_effect tables


def _shipped_table():
    """``ablation_effect`` as a table of the shipped model's eight heads."""
    model, ids = ref.load_induction_model(), checks._eval_ids(PERIOD)
    table = {
        (layer, head): ref.ablation_effect(model, ids, PERIOD, layer, head)
        for layer in range(2)
        for head in range(4)
    }

    def ablation_effect(model, ids, period, layer, head):
        return table[layer, head]

    return ablation_effect


@pytest.mark.parametrize("seed", SEEDS)
def test_a_table_keyed_on_layer_and_head_fails_every_case(seed):
    report = check_ablation_effect(_shipped_table(), seed=seed)
    assert report.score == 0.0, report
    for result in report.results:
        assert not result.passed
        assert "a table keyed on (layer, head)" in result.message, result.message
        assert "Likely mistake: a value fixed in advance" in result.message
    # the cases on the shipped model itself fail on the renumbered twin, which names its order
    assert "renumbered at random" in report.results[0].message


def _recorded_table():
    """``ablation_effect`` replaying the check cell's own calls (run seed 0), keyed on the
    model's weights and (layer, head): what a student can record at home."""
    table = {}

    def recorder(model, ids, period, layer, head):
        value = ref.ablation_effect(model, ids, period, layer, head)
        table[_fingerprint(model), layer, head] = value
        return value

    assert check_ablation_effect(recorder).passed

    def ablation_effect(model, ids, period, layer, head):
        return table[_fingerprint(model), layer, head]  # KeyError: a model never recorded

    return ablation_effect


def test_a_table_recorded_on_the_check_cell_passes_it_and_nothing_else():
    replay = _recorded_table()
    assert check_ablation_effect(replay).score == 1.0  # the check cell's run seed, 0
    for seed in FRESH:
        report = check_ablation_effect(replay, seed=seed)
        assert report.score == 0.0, (seed, report)
        assert "raised KeyError" in report.results[0].message
        assert "renumbered at random" in report.results[0].message


# ---------------------------------------------------------------- find_induction_head tables


def test_answers_keyed_on_period_and_size_fail_every_case():
    """The shipped model's answer (and the grown models' answers) by period and size: each
    case's renumbered twin rejects it, naming the answer as the one before renumbering."""
    table = {}

    def recorder(model, ids, period):
        answer = ref.find_induction_head(model, ids, period)
        table.setdefault((period, model.num_layers, model.num_heads), answer)
        return answer

    check_find_induction_head(recorder)

    def find_induction_head(model, ids, period):
        return table[period, model.num_layers, model.num_heads]

    for seed in SEEDS:
        report = check_find_induction_head(find_induction_head, seed=seed)
        assert report.score == 0.0, (seed, report)
        assert all(not r.passed for r in report.results)
        assert "before its heads were renumbered" in report.results[0].message
        assert "an answer fixed in advance or recorded on another model" in (
            report.results[0].message
        )


def test_answers_recorded_on_the_check_cell_fail_under_a_fresh_seed():
    table = {}

    def recorder(model, ids, period):
        answer = ref.find_induction_head(model, ids, period)
        table[_fingerprint(model), period] = answer
        return answer

    assert check_find_induction_head(recorder).passed

    def find_induction_head(model, ids, period):
        return table[_fingerprint(model), period]

    assert check_find_induction_head(find_induction_head).score == 1.0  # run seed 0
    for seed in FRESH:
        report = check_find_induction_head(find_induction_head, seed=seed)
        assert report.score == 0.0, (seed, report)
        assert "raised KeyError" in report.results[0].message


# ---------------------------------------------------------------- the reference


@pytest.mark.parametrize("seed", SEEDS)
def test_the_reference_keeps_full_marks(seed):
    assert check_find_induction_head(ref.find_induction_head, seed=seed).score == 1.0
    assert check_ablation_effect(ref.ablation_effect, seed=seed).score == 1.0
