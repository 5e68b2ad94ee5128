"""scripts/sinks_study.py (chapter 19's attention-sink study), run at small size, and the
committed results the chapter reads (book/data/sinks_study.json)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
COMMITTED = ROOT / "book" / "data" / "sinks_study.json"
SETTINGS = {"full", "window", "streaming", "streaming_absolute"}


def _interval(value: dict) -> None:
    assert set(value) == {"mean", "ci95", "n"}
    assert value["n"] >= 1 and (value["n"] == 1 or value["ci95"] >= 0)


def _check(data: dict) -> None:
    """The fields chapter 19 reads, and the facts that hold whatever the numbers are."""
    config = data["config"]
    assert data["command"].startswith("python scripts/sinks_study.py")
    assert data["seconds"] > 0 and data["machine"]["threads"] == 1

    first = data["first_token"]
    layers = len(first["share_first"])
    heads = len(first["share_first"][0])
    T, q0 = first["length"], config["first_token"]["from_query"]
    assert first["windows"] >= 1 and T == 128  # chapter 13's model: max_len 128
    for key in ("share_first", "share_first4", "share_second"):
        assert len(first[key]) == layers and all(len(r) == heads for r in first[key])
        assert all(0 <= v <= 1 for r in first[key] for v in r)
    # the first four keys hold at least what the first holds, head by head
    assert all(
        f4 >= f1 - 1e-9
        for r1, r4 in zip(first["share_first"], first["share_first4"])
        for f1, f4 in zip(r1, r4)
    )
    uniform = sum(1 / (i + 1) for i in range(q0, T)) / (T - q0)
    assert first["uniform_first"] == pytest.approx(uniform, abs=1e-5)
    assert len(first["curve_first"]) == layers and len(first["curve_first"][0]) == T - q0
    assert len(first["uniform_curve"]) == T - q0
    for layer in first["by_layer"]:
        _interval(layer)

    d = config["decode"]
    decode = data["decode"]
    assert decode["sequences"] >= 1
    assert set(decode["loss_far"]) == SETTINGS == set(decode["curves"])
    for curve in decode["curves"].values():
        assert len(curve) == d["length"] // d["bin"] and all(0 < v < 20 for v in curve)
    for key in ("window_minus_streaming", "absolute_minus_streaming", "full_minus_streaming"):
        _interval(decode[key])
        # a paired difference is the difference of the two means (same sequences)
        a, b = key.split("_minus_")
        a = "streaming_absolute" if a == "absolute" else a
        diff = decode["loss_far"][a]["mean"] - decode["loss_far"][b]["mean"]
        assert decode[key]["mean"] == pytest.approx(diff, abs=1e-4)
    # before the window fills, every cache holds every key: the same losses
    first_window = decode["loss_first_window"]
    assert max(first_window.values()) - min(first_window.values()) < 1e-3

    runs = data["learned_sinks"]["runs"]
    seeds = config["train"]["seeds"]
    assert [(r["seed"], r["sinks"]) for r in runs] == [(s, k) for s in seeds for k in (False, True)]
    for r in runs:
        assert r["train_seconds"] > 0 and 0 < r["train_loss_last_step"] < 20
        assert (r["sink_logits"] is None) == (not r["sinks"])
        if r["sinks"]:
            assert len(r["sink_logits"]) == config["train"]["num_layers"]
        assert set(r["short"]["loss"]) == {"full", "window", "streaming"}
        _interval(r["short"]["window_minus_full"])
        assert set(r["decode"]["loss_far"]) == SETTINGS
    paired = data["learned_sinks"]["paired"]
    for key in ("short_window_minus_full", "decode_window_minus_streaming"):
        assert [p["seed"] for p in paired[key]] == seeds


def test_quick_study_writes_what_the_chapter_reads(tmp_path, run_script):
    out = tmp_path / "sinks.json"
    run_script("sinks_study.py", "--no-progress", "--quick", "--out", str(out))
    data = json.loads(out.read_text())
    assert data["config"]["train"]["steps"] == 3
    _check(data)


def test_committed_results():
    if not COMMITTED.exists():
        pytest.fail(f"{COMMITTED.relative_to(ROOT)} is missing: run scripts/sinks_study.py")
    data = json.loads(COMMITTED.read_text())
    _check(data)
    assert data["config"]["train"]["steps"] == 800 and len(data["config"]["train"]["seeds"]) >= 2
