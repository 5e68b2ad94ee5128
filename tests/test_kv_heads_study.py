"""scripts/kv_heads_study.py (chapter 15's quality study), run at its --quick size."""

from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _check_fields(result: dict) -> None:
    """The fields book/15_sharing_keys_values.ipynb reads."""
    for key in ("steps", "batch_size", "context", "lr", "seeds"):
        assert key in result["training"], key
    H = result["config"]["num_heads"]
    assert result["num_kv_heads"] == [H, H // 2, 1]
    runs = result["runs"]
    assert len(runs) == 3 * len(result["training"]["seeds"])
    for run in runs:
        assert run["num_kv_heads"] in result["num_kv_heads"]
        assert run["parameters"] > 0 and 0 < run["val_loss"] < 10
        assert 0 < run["train_loss_last50"] < 10 and run["train_seconds"] > 0


def test_quick_study_writes_the_fields_the_chapter_reads(tmp_path, run_script):
    out = tmp_path / "kv.json"
    run_script("kv_heads_study.py", "--quick", "--no-progress", "--out", str(out))
    data = json.loads(out.read_text())
    _check_fields(data)
    # fewer key/value heads, fewer parameters (w_k and w_v shrink), same seed otherwise
    params = {run["num_kv_heads"]: run["parameters"] for run in data["runs"]}
    assert params[4] > params[2] > params[1]


def test_committed_study_has_the_fields_the_chapter_reads():
    path = ROOT / "attention_course" / "assets" / "kv_heads15.json"
    _check_fields(json.loads(path.read_text()))
