"""check_filter_logits beyond the catalogue: its messages name the tokens kept, finite
fills, unnamed ValueErrors and wrong exception types."""

from __future__ import annotations

import torch

from attention_course import filter_logits
from attention_course.checks import check_filter_logits


def test_reference_passes_every_case():
    report = check_filter_logits(filter_logits)
    assert report.passed and report.score == 1.0
    assert len(report.results) == 14


def test_a_large_finite_fill_gets_a_hint():
    def fills_minus_1e9(logits, top_k=None, top_p=None):
        out = filter_logits(logits, top_k=top_k, top_p=top_p)
        return out.masked_fill(torch.isinf(out), -1e9)

    text = str(check_filter_logits(fills_minus_1e9))
    assert "the dropped logits must be exactly -inf, you filled them with -1e+09" in text


def test_the_message_lists_the_tokens_kept():
    def keeps_one_more(logits, top_k=None, top_p=None):
        if top_k is not None:
            top_k += 1
        return filter_logits(logits, top_k=top_k, top_p=top_p)

    text = str(check_filter_logits(keeps_one_more))
    assert "row [0, :]: expected finite logits at [6, 7, 9] (-inf elsewhere)" in text
    assert "got finite logits at      [6, 7, 8, 9]" in text


def test_a_value_error_must_name_the_argument():
    def vague(logits, top_k=None, top_p=None):
        if top_k is not None and top_k < 1 or top_p is not None and not 0 < top_p <= 1:
            raise ValueError("bad argument")
        return filter_logits(logits, top_k=top_k, top_p=top_p)

    report = check_filter_logits(vague)
    assert report.num_passed == 12
    assert "should name the argument" in str(report)


def test_a_wrong_exception_type_is_reported():
    def asserts(logits, top_k=None, top_p=None):
        assert top_k is None or top_k >= 1, "top_k"
        assert top_p is None or 0 < top_p <= 1, "top_p"
        return filter_logits(logits, top_k=top_k, top_p=top_p)

    text = str(check_filter_logits(asserts))
    assert "raised AssertionError: top_k" in text and "raise ValueError naming `top_k`" in text


def test_returning_probabilities_is_named():
    def probabilities(logits, top_k=None, top_p=None):
        return filter_logits(logits, top_k=top_k, top_p=top_p).softmax(-1)

    assert "you returned probabilities" in str(check_filter_logits(probabilities))
