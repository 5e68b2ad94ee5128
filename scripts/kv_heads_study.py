"""Chapter 15's quality study: the same GPT with Hkv = H, H/2 and 1 key/value heads.

Run from the repository root (seeded; the committed results took 30 minutes with one
thread on the course's shared 2-core machine)::

    OMP_NUM_THREADS=1 python scripts/kv_heads_study.py
    python scripts/kv_heads_study.py --quick --out /tmp/kv.json   # a smoke test (seconds)

For every seed and every number of key/value heads it builds
``GPT(V, d_model, num_heads, num_layers, num_kv_heads=Hkv)`` with the same seed, trains
it with :func:`attention_course.train.train_language_model` on the same batches (same
steps, same learning-rate schedule) on the first 90 % of
:func:`attention_course.data.python_docs`, and scores it on the whole last 10 %
(:func:`attention_course.train.evaluate_lm`). The results go to a small JSON file that
``book/15_sharing_keys_values.ipynb`` loads and displays (default
``attention_course/assets/kv_heads15.json``). The models use full causal attention over
contexts of ``context`` characters (no sliding window). The text is Python 3.11.7's built-in
documentation topics, shipped with the package as one snapshot (``python_docs()``), the
same on every Python; the JSON records the Python version and torch's thread count (the
committed file, from an earlier version of this script, records neither).
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import torch

from attention_course import GPT, CharTokenizer, count_parameters, seed_everything
from attention_course.data import python_docs, split_text
from attention_course.train import evaluate_lm, train_language_model

DEFAULT_OUT = (
    Path(__file__).resolve().parents[1] / "attention_course" / "assets" / "kv_heads15.json"
)
CONFIG = {"d_model": 96, "num_heads": 8, "num_layers": 3, "max_len": 64}
TRAINING = {"steps": 600, "batch_size": 32, "context": 64, "lr": 3e-3}
SEEDS = (0, 1, 2)
QUICK_CONFIG = {"d_model": 32, "num_heads": 4, "num_layers": 1, "max_len": 32}
QUICK_TRAINING = {"steps": 3, "batch_size": 8, "context": 32, "lr": 3e-3}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a tiny model, 3 steps, one seed")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse_args(argv)
    config = dict(QUICK_CONFIG if args.quick else CONFIG)
    training = dict(QUICK_TRAINING if args.quick else TRAINING)
    seeds = (0,) if args.quick else SEEDS
    H = config["num_heads"]
    kv_heads = (H, H // 2, 1)

    text = python_docs()
    tokenizer = CharTokenizer(text)
    train_ids, val_ids = split_text(tokenizer.encode(text), 0.1)
    runs = []
    start = time.perf_counter()
    for seed in seeds:
        for hkv in kv_heads:
            seed_everything(seed)
            model = GPT(tokenizer.vocab_size, num_kv_heads=hkv, **config)
            run = train_language_model(
                model,
                train_ids,
                val_ids,
                steps=training["steps"],
                batch_size=training["batch_size"],
                context=training["context"],
                lr=training["lr"],
                eval_every=training["steps"],
                eval_tokens=4096,
                seed=seed,
                progress=not args.no_progress,
            )
            val = evaluate_lm(model, val_ids, context=training["context"])
            last = run["train_loss"][-50:]
            runs.append(
                {
                    "num_kv_heads": hkv,
                    "seed": seed,
                    "parameters": count_parameters(model),
                    "val_loss": round(val, 4),
                    "train_loss_last50": round(sum(last) / len(last), 4),
                    "seconds": round(run["seconds"], 1),
                }
            )
            print(
                f"seed {seed} Hkv {hkv}: held-out loss {val:.4f} nats/char ({run['seconds']:.0f} s)"
            )
    result = {
        "config": config,
        "training": {**training, "seeds": list(seeds), "eval": "evaluate_lm on all held-out text"},
        "num_kv_heads": list(kv_heads),
        "runs": runs,
        "torch": torch.__version__,
        "machine": platform.machine(),
        "python": platform.python_version(),
        "threads": torch.get_num_threads(),
        "seconds": round(time.perf_counter() - start, 1),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out}")
    return result


if __name__ == "__main__":
    main()
