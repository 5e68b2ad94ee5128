"""Chapter 18's study: held-out loss against cache size for MHA, GQA, MQA and MLA.

Run from the repository root (seeded; the committed results' time is in the JSON's
``seconds``, one thread on the course's shared 2-core machine)::

    python scripts/latent_study.py                                  # one thread (--threads)
    python scripts/latent_study.py --quick --out /tmp/latent.json   # a smoke test (seconds)

For every seed it trains six variants of the same small character-level GPT (rotary
positions, ``H = 8`` query heads of ``Dh = D / H`` features): multi-head attention
(``Hkv = 8``), grouped-query attention with ``Hkv = 4`` and ``Hkv = 2``, multi-query
attention (``Hkv = 1``), and multi-head latent attention (``attention="mla"``,
``d_rope = Dh / 2``) with two latent ranks chosen so that its cache per token equals
GQA's with ``Hkv = 2`` and MQA's: ``kv_rank + d_rope = 2 · Hkv · Dh``. Each variant
starts from the same seed and sees the same batches (same steps, same learning-rate
schedule) on the first 90 % of :func:`attention_course.data.python_docs`, and is scored
on all of the last 10 % (:func:`attention_course.train.evaluate_lm`). The cache per
token per layer is :func:`attention_course.cache_per_token`. The results go to
``book/data/latent_study.json``, which ``book/18_latent_attention.ipynb`` reads; the
command line, the training run and the JSON's keys are the other studies'
(``scripts/_study.py``).
"""

from __future__ import annotations

import _study

from attention_course import GPT, cache_per_token, count_parameters

DEFAULT_OUT = _study.ROOT / "book" / "data" / "latent_study.json"
CONFIG = {"d_model": 64, "num_heads": 8, "num_layers": 2, "max_len": 64, "pos": "rope"}
TRAINING = {"steps": 300, "batch_size": 24, "context": 64, "lr": 3e-3}
SEEDS = (0, 1, 2)
QUICK_CONFIG = {"d_model": 32, "num_heads": 8, "num_layers": 1, "max_len": 32, "pos": "rope"}
QUICK_TRAINING = {"steps": 3, "batch_size": 8, "context": 32, "lr": 3e-3}


def variants(config: dict) -> list[dict]:
    """The six variants: a name, the GPT's extra arguments, and the cache numbers per token
    per layer (:func:`~attention_course.cache_per_token`)."""
    H = config["num_heads"]
    Dh = config["d_model"] // H
    d_rope = Dh // 2  # MultiHeadLatentAttention's default D / (2H)
    result = []
    for name, hkv in (
        ("MHA", H),
        (f"GQA, Hkv = {H // 2}", H // 2),
        (f"GQA, Hkv = {H // 4}", H // 4),
    ):
        result.append({"name": name, "num_kv_heads": hkv})
    result.append({"name": "MQA", "num_kv_heads": 1})
    for hkv in (H // 4, 1):  # latent ranks with the cache of GQA (Hkv = H/4) and of MQA
        kv_rank = 2 * hkv * Dh - d_rope
        result.append({"name": f"MLA, r = {kv_rank}", "attention": "mla", "kv_rank": kv_rank})
    for variant in result:
        if "kv_rank" in variant:
            variant["cache_per_token"] = cache_per_token(kv_rank=variant["kv_rank"], d_rope=d_rope)
        else:
            variant["cache_per_token"] = cache_per_token(
                num_kv_heads=variant["num_kv_heads"], d_head=Dh
            )
    return result


def main(argv: list[str] | None = None) -> dict:
    parser = _study.parser(
        __doc__, DEFAULT_OUT, quick="a tiny model, 3 steps, one seed", progress=True
    )
    args = parser.parse_args(argv)
    start = _study.start(args)
    config = dict(QUICK_CONFIG if args.quick else CONFIG)
    training = dict(QUICK_TRAINING if args.quick else TRAINING)
    seeds = (0,) if args.quick else SEEDS
    table = variants(config)

    tokenizer, train_ids, val_ids = _study.char_data()
    runs = []
    for seed in seeds:
        for variant in table:
            options = {k: v for k, v in variant.items() if k not in ("name", "cache_per_token")}
            _study.seed(seed)
            model = GPT(tokenizer.vocab_size, **config, **options)
            run = _study.train_and_score(
                model, train_ids, val_ids, training, seed, progress=not args.no_progress
            )
            runs.append(
                {
                    "variant": variant["name"],
                    "seed": seed,
                    "parameters": count_parameters(model),
                    **run,
                }
            )
            print(
                f"seed {seed} {variant['name']}: held-out loss {run['val_loss']:.4f} nats/char "
                f"({run['train_seconds']:.0f} s)",
                flush=True,
            )
    result = {
        "config": config,
        "training": {**training, "seeds": list(seeds), "eval": "evaluate_lm on all held-out text"},
        "variants": table,
        "runs": runs,
    }
    return _study.finish(args.out, result, start, digits=4)


if __name__ == "__main__":
    main()
