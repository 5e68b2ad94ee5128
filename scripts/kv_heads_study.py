"""Chapter 15's quality study: the same GPT with Hkv = H, H/2 and 1 key/value heads.

Run from the repository root (seeded; the committed results took 30 minutes with one
thread on the course's shared 2-core machine)::

    python scripts/kv_heads_study.py                              # one thread (--threads)
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
committed file, from an earlier version of this script, records neither). The command line,
the training run and the JSON's keys are the other studies' (``scripts/_study.py``).
"""

from __future__ import annotations

import _study

from attention_course import GPT, count_parameters

DEFAULT_OUT = _study.ROOT / "attention_course" / "assets" / "kv_heads15.json"
CONFIG = {"d_model": 96, "num_heads": 8, "num_layers": 3, "max_len": 64}
TRAINING = {"steps": 600, "batch_size": 32, "context": 64, "lr": 3e-3}
SEEDS = (0, 1, 2)
QUICK_CONFIG = {"d_model": 32, "num_heads": 4, "num_layers": 1, "max_len": 32}
QUICK_TRAINING = {"steps": 3, "batch_size": 8, "context": 32, "lr": 3e-3}


def main(argv: list[str] | None = None) -> dict:
    parser = _study.parser(
        __doc__, DEFAULT_OUT, quick="a tiny model, 3 steps, one seed", progress=True
    )
    args = parser.parse_args(argv)
    start = _study.start(args)
    config = dict(QUICK_CONFIG if args.quick else CONFIG)
    training = dict(QUICK_TRAINING if args.quick else TRAINING)
    seeds = (0,) if args.quick else SEEDS
    H = config["num_heads"]
    kv_heads = (H, H // 2, 1)

    tokenizer, train_ids, val_ids = _study.char_data()
    runs = []
    for seed in seeds:
        for hkv in kv_heads:
            _study.seed(seed)
            model = GPT(tokenizer.vocab_size, num_kv_heads=hkv, **config)
            run = _study.train_and_score(
                model, train_ids, val_ids, training, seed, progress=not args.no_progress
            )
            runs.append(
                {"num_kv_heads": hkv, "seed": seed, "parameters": count_parameters(model), **run}
            )
            print(
                f"seed {seed} Hkv {hkv}: held-out loss {run['val_loss']:.4f} nats/char "
                f"({run['train_seconds']:.0f} s)"
            )
    result = {
        "config": config,
        "training": {**training, "seeds": list(seeds), "eval": "evaluate_lm on all held-out text"},
        "num_kv_heads": list(kv_heads),
        "runs": runs,
    }
    return _study.finish(args.out, result, start, digits=4)


if __name__ == "__main__":
    main()
