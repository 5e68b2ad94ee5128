"""benchmarks/softcap.py (chapter 20's cost of soft-capping): not a timing test. The two
modules it times compute the same attention up to the cap, and its report is well formed."""

from __future__ import annotations

import torch


def test_the_timed_modules_share_weights_and_differ_only_by_the_cap():
    from benchmarks.softcap import modules

    m = modules(d_model=16, num_heads=2, cap=50.0)
    assert m["plain"].softcap is None and m["capped"].softcap == 50.0
    x = torch.randn(2, 7, 16)
    with torch.no_grad():
        plain, capped = m["plain"](x), m["capped"](x)
    # small scores: the cap is nearly the identity, so the outputs agree closely ...
    torch.testing.assert_close(capped, plain, atol=1e-4, rtol=1e-4)
    # ... and with a tiny cap they do not (the cap is applied)
    tight = modules(d_model=16, num_heads=2, cap=1e-3)["capped"]
    with torch.no_grad():
        assert (tight(x) - plain).abs().max() > 1e-3


def test_the_report_has_medians_and_an_interval_around_the_ratio():
    from benchmarks.softcap import compare

    r = compare(B=1, T=8, d_model=16, num_heads=2, repeats=3)
    assert set(r["median_seconds"]) == {"fused", "softcap"}
    assert all(v > 0 for v in r["median_seconds"].values())
    ratio = r["softcap_over_fused"]
    assert 0 < ratio["low"] <= ratio["ratio"] <= ratio["high"]
    assert r["config"]["repeats"] == 3 and r["config"]["cap"] == 50.0
