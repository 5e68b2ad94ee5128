"""scripts/study_modern_block.py, chapter 16's study, at its --quick size; and the
committed JSON that the chapter reads has the fields the chapter uses."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
COMMITTED = ROOT / "book" / "data" / "modern_block.json"
CONFIGS = ["gpt13", "rms", "swiglu", "rope", "gqa", "llama"]


def _check_fields(data: dict) -> None:
    for key in ("steps", "batch_size", "context", "lr", "seeds"):
        assert key in data["training"]
    assert data["val_chars"] > 0 and data["vocab_size"] > 0
    assert list(data["results"]) == CONFIGS
    base = data["results"]["gpt13"]["parameters"]
    for name in CONFIGS:
        result = data["results"][name]
        assert abs(result["parameters"] - base) / base < 0.01  # equal parameter counts
        assert result["d_ff"] > 0
        assert [run["seed"] for run in result["runs"]] == data["training"]["seeds"]
        for run in result["runs"]:
            assert 0 < run["val_loss"] < 10
            assert run["tokens_per_second"] > 0 and run["train_seconds"] > 0
            assert 0 < run["train_loss_last50"] < 10  # the name kv_heads_study.py writes too
    assert data["results"]["llama"]["options"] == {
        "pos": "rope",
        "norm": "rms",
        "ffn": "swiglu",
        "num_kv_heads": 2,
    }


def test_quick_study_writes_the_fields_the_chapter_reads(tmp_path, run_script):
    out = tmp_path / "study.json"
    run_script("study_modern_block.py", "--quick", "--no-progress", "--out", str(out))
    _check_fields(json.loads(out.read_text()))


@pytest.mark.skipif(not COMMITTED.exists(), reason="the study's JSON is not committed")
def test_committed_study_has_the_fields_the_chapter_reads():
    data = json.loads(COMMITTED.read_text())
    _check_fields(data)
    assert data["training"]["steps"] >= 500 and len(data["training"]["seeds"]) >= 2
