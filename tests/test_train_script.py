"""scripts/train_gpt.py, which trains chapter 13's checkpoint, run for a few steps."""

from __future__ import annotations

from pathlib import Path

import torch

from attention_course import GPT, generate, load_gpt_checkpoint

ROOT = Path(__file__).resolve().parents[1]


def test_train_script_writes_a_loadable_checkpoint(tmp_path, run_script):
    out = tmp_path / "gpt.pt"
    args = ["--steps", "3", "--d-model", "32", "--num-layers", "1", "--context", "32"]
    result = run_script("train_gpt.py", *args, "--out", str(out), timeout=120)
    assert "held-out loss" in result.stdout
    assert out.stat().st_size < 5_000_000
    model = load_gpt_checkpoint(out)
    assert isinstance(model, GPT) and not model.training
    assert model.config()["d_model"] == 32 and model.info["steps"] == 3
    assert len(model.vocab) == model.vocab_size
    data = torch.load(out, weights_only=True)
    assert all(v.dtype == torch.bfloat16 for v in data["state_dict"].values())
    assert generate(model, torch.zeros(1, 1, dtype=torch.long), 5).shape == (1, 6)


def test_the_shipped_checkpoint_loads_by_default():
    path = ROOT / "attention_course" / "assets" / "gpt13.pt"
    if not path.exists():  # pragma: no cover - only before the checkpoint is committed
        return
    model = load_gpt_checkpoint()
    assert model.info["val_loss"] <= 1.45
    assert path.stat().st_size <= 5_000_000
