"""benchmarks/linear.py (chapter 22's three forms of causal linear attention): not a timing
test. The three forms compute the same function, the memory counts are exact, and the report
is well formed."""

from __future__ import annotations

import torch

from benchmarks.linear import FORMS, compare, inputs, largest_elements


def test_the_three_forms_compute_the_same_function():
    q, k, v = (x.double() for x in inputs(70, B=2, H=2, D=8))
    reference = FORMS["quadratic"](q, k, v)
    for name in ("recurrent", "chunked"):
        torch.testing.assert_close(FORMS[name](q, k, v), reference, rtol=1e-10, atol=1e-10)


def test_the_largest_tensors_are_counted_exactly():
    H, D = 4, 64
    for T in (128, 256):
        sizes = largest_elements(T, B=1, H=H, D=D)
        assert sizes["quadratic"] == H * T * T  # the masked scores
        assert sizes["recurrent"] == H * T * D  # the stacked output: no T x T anywhere
        assert sizes["chunked"] == H * T * D  # the output; tiles are 64 x 64 < T x D


def test_the_report_has_medians_and_intervals():
    r = compare(lengths=(16, 32), B=1, H=1, D=4, repeats=3)
    assert set(r) == {16, 32}
    for row in r.values():
        assert set(row["per_token"]) == set(FORMS) and all(v > 0 for v in row["per_token"].values())
        for name in ("quadratic", "recurrent"):
            ratio = row[f"{name}_over_chunked"]
            assert 0 < ratio["low"] <= ratio["ratio"] <= ratio["high"]
