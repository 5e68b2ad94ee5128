"""scripts/kv_cache_generation.py (chapter 15's memory curve while generating)."""

from __future__ import annotations

import json


def test_small_run_counts_bytes_as_the_formula_says(tmp_path, run_script):
    out = tmp_path / "gen.json"
    args = [
        "--tokens",
        "96",
        "--every",
        "16",
        "--window",
        "32",
        "--threads",
        "2",
        "--out",
        str(out),
    ]
    run_script("kv_cache_generation.py", *args)
    result = json.loads(out.read_text())
    # --threads holds through the seeding (seed_everything alone sets the chapters' one thread)
    assert result["machine"]["threads"] == 2
    cfg = result["config"]
    # float32 keys and values: 2 tensors * layers * Hkv heads * Dh numbers * 4 bytes
    per_token = (
        2 * cfg["num_layers"] * cfg["num_kv_heads"] * (cfg["d_model"] // cfg["num_heads"]) * 4
    )
    full, rolling = result["curves"]["full"], result["curves"]["rolling"]
    assert [p["generated"] for p in full] == list(range(16, 97, 16))
    # after n steps the cache holds n positions: the prompt and the first n - 1 generated
    # tokens (the newest one is read at the next step)
    assert [p["stored"] for p in full] == [p["generated"] * per_token for p in full]
    assert all(p["allocated"] >= p["stored"] for p in full)
    assert [p["stored"] for p in rolling] == [min(p["generated"], 32) * per_token for p in rolling]
    assert {p["allocated"] for p in rolling if p["generated"] >= 32} == {32 * per_token}
