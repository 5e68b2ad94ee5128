"""scripts/rope_scaling_study.py (chapter 19's RoPE-scaling study), run at small size,
and the committed results the chapter loads."""

from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
METHODS = ["none", "linear", "ntk", "yarn"]
CONTROL = "none_at_L"


def _check_results(data: dict) -> None:
    """The fields chapter 19 reads, and the facts that hold by construction."""
    config = data["config"]
    L, lengths = config["L"], config["lengths"]
    assert lengths[0] == L and data["methods"] == METHODS
    assert data["command"].startswith("python scripts/rope_scaling_study.py")
    assert data["seconds"] > 0 and data["machine"]["threads"] == 1
    keys = {str(n) for n in lengths}
    # without fine-tuning: at n = L no method scales, so all four are the same model
    plain = data["no_finetune"]
    for method in METHODS:
        assert set(plain["loss_at"][method]) == keys
        assert all(0 < v < 20 for v in plain["loss_at"][method].values())
        assert plain["loss_at"][method][str(L)] == plain["loss_at"]["none"][str(L)]
        assert len(plain["curves"][method]) == lengths[-1] == plain["curve_at"]
    for method in METHODS[1:]:
        for n in lengths[1:]:
            d = plain["diff_to_none"][method][str(n)]
            expected = plain["loss_at"][method][str(n)] - plain["loss_at"]["none"][str(n)]
            assert abs(d["mean"] - expected) < 1e-4
            assert d["low"] <= d["mean"] <= d["high"]
    assert set(data["alibi"]["loss_at"]) == keys and len(data["alibi"]["curve"]) == lengths[-1]
    # fine-tuned: one run per method (and the control) per seed, the same batches
    tuned = data["finetuned"]
    runs = tuned["runs"]
    assert [(r["seed"], r["method"]) for r in runs] == [
        (seed, m) for seed in config["seeds"] for m in (*METHODS, CONTROL)
    ]
    ft = config["finetune"]
    for r in runs:
        assert set(r["loss_at"]) == keys and all(0 < v < 20 for v in r["loss_at"].values())
        assert r["train_seconds"] > 0
        if r["method"] in ("none", CONTROL):
            assert r["scaling"] is None and r["loss_at_rescaled"] == {}
        else:
            assert r["scaling"]["type"] == r["method"] and r["scaling"]["factor"] == ft["factor"]
            assert set(r["loss_at_rescaled"]) == {str(n) for n in lengths if n > ft["context"]}
        assert r["context"] == (L if r["method"] == CONTROL else ft["context"])
    for method in METHODS[1:]:
        for n in lengths:
            d = tuned["diff_to_none"][method][str(n)]
            assert d["n"] == len(config["seeds"])


def test_quick_study_writes_what_the_chapter_reads(tmp_path, run_script):
    out = tmp_path / "rope_scaling.json"
    run_script("rope_scaling_study.py", "--no-progress", "--quick", "--out", str(out))
    data = json.loads(out.read_text())
    assert data["config"]["finetune"]["steps"] == 2
    _check_results(data)


def test_committed_study_results():
    data = json.loads((ROOT / "book" / "data" / "rope_scaling.json").read_text())
    _check_results(data)
    assert data["config"]["L"] == 64 and data["config"]["lengths"] == [64, 128, 256, 512]
    assert len(data["config"]["seeds"]) >= 3
    assert data["model"]["asset"] == "attention_course/assets/position_study.pt"
    # the study's no-fine-tune loss of plain RoPE at 64, 128 and 256 is chapter 14's first
    # seed's (its committed JSON), up to the bfloat16 rounding of the shipped weights
    chapter14 = json.loads((ROOT / "attention_course/assets/position_study.json").read_text())
    first = chapter14["results"]["rope"][0]["loss_at"]
    for n in ("64", "128", "256"):
        assert abs(data["no_finetune"]["loss_at"]["none"][n] - first[n]) < 0.02
