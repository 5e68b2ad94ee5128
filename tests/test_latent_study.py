"""scripts/latent_study.py (chapter 18's study), run at its --quick size, and the
committed results' fields."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _check_fields(result: dict) -> None:
    """The fields book/18_latent_attention.ipynb reads."""
    for key in ("steps", "batch_size", "context", "lr", "seeds"):
        assert key in result["training"], key
    H, D = result["config"]["num_heads"], result["config"]["d_model"]
    Dh = D // H
    names = [v["name"] for v in result["variants"]]
    assert names[0] == "MHA" and names[3] == "MQA" and len(names) == 8
    cache = {v["name"]: v["cache_per_token"] for v in result["variants"]}
    # 2 Hkv Dh numbers per token per layer; MLA: kv_rank + Dh / 2, matched to GQA and MQA
    assert [cache[n] for n in names[:4]] == [2 * H * Dh, H * Dh, H * Dh // 2, 2 * Dh]
    assert cache[names[4]] == cache[names[2]] == cache[names[6]] == cache[names[7]]
    assert cache[names[5]] == cache[names[3]]
    for v in result["variants"][4:6]:
        assert v["attention"] == "mla" and v["kv_rank"] + Dh // 2 == v["cache_per_token"]
    probe = result["variants"][6]  # the rotary-width probe: d_rope = Dh
    assert probe["attention"] == "mla" and probe["d_rope"] == Dh
    assert probe["kv_rank"] + Dh == probe["cache_per_token"]
    control = result["variants"][7]  # the probe's rotary width and latent, d_nope = Dh / 2
    assert control["attention"] == "mla" and control["d_rope"] == Dh
    assert control["kv_rank"] == probe["kv_rank"] and control["d_nope"] == Dh // 2
    runs = result["runs"]
    assert len(runs) == 8 * len(result["training"]["seeds"])
    for seed in result["training"]["seeds"]:
        assert sorted(r["variant"] for r in runs if r["seed"] == seed) == sorted(names)
    for run in runs:
        assert run["parameters"] > 0 and 0 < run["val_loss"] < 10
        assert 0 < run["train_loss_last50"] < 10 and run["train_seconds"] > 0
    assert result["seconds"] > 0 and "machine" in result


def test_quick_study_writes_the_fields_the_chapter_reads(tmp_path, run_script):
    out = tmp_path / "latent.json"
    run_script("latent_study.py", "--quick", "--no-progress", "--out", str(out))
    data = json.loads(out.read_text())
    _check_fields(data)
    # the two latent ranks differ in parameters (w_dkv, kv_norm and w_ukv shrink with r)
    params = {run["variant"]: run["parameters"] for run in data["runs"]}
    mla = [v["name"] for v in data["variants"][4:6]]
    assert params[mla[0]] > params[mla[1]]


def test_add_runs_one_variant_and_keeps_the_others(tmp_path, run_script):
    full = tmp_path / "full.json"
    run_script("latent_study.py", "--quick", "--no-progress", "--out", str(full))
    data = json.loads(full.read_text())
    control = data["variants"][7]["name"]
    # the same file without the control variant, then --add puts it back
    partial = tmp_path / "partial.json"
    without = {
        **data,
        "variants": data["variants"][:7],
        "runs": [r for r in data["runs"] if r["variant"] != control],
    }
    partial.write_text(json.dumps(without))
    run_script(
        "latent_study.py", "--quick", "--no-progress", "--out", str(partial), "--add", control
    )
    added = json.loads(partial.read_text())
    _check_fields(added)
    assert added["runs"][:-1] == without["runs"]  # the other runs are kept as they were
    # seeded: the added run reproduces the full run's loss for that variant
    timing = ("train_seconds", "tokens_per_second", "eval_seconds")
    same = {k: v for k, v in added["runs"][-1].items() if k not in timing}
    assert same == {k: v for k, v in data["runs"][-1].items() if k not in timing}
    (addition,) = added["additions"]
    assert addition["variant"] == control and addition["seconds"] > 0
    assert "--add" in addition["command"]
    # a variant already in the file is refused
    process = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "latent_study.py"), "--quick", "--no-progress"]
        + ["--out", str(partial), "--add", control],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"},
        check=False,
    )
    assert process.returncode != 0 and "already in" in process.stderr


def test_committed_study_has_the_fields_the_chapter_reads():
    data = json.loads((ROOT / "book" / "data" / "latent_study.json").read_text())
    _check_fields(data)
    assert len(data["training"]["seeds"]) >= 3
