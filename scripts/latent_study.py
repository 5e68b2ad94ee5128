"""Chapter 18's study: held-out loss against cache size for MHA, GQA, MQA and MLA.

Run from the repository root (seeded; the committed results' time is in the JSON's
``seconds``, one thread on the course's shared 2-core machine)::

    python scripts/latent_study.py                                  # one thread (--threads)
    python scripts/latent_study.py --quick --out /tmp/latent.json   # a smoke test (seconds)
    python scripts/latent_study.py --add "NAME"   # run one variant, add it to the JSON

For every seed it trains eight variants of the same small character-level GPT (rotary
positions, ``H = 8`` query heads of ``Dh = D / H`` features): multi-head attention
(``Hkv = 8``), grouped-query attention with ``Hkv = 4`` and ``Hkv = 2``, multi-query
attention (``Hkv = 1``), and multi-head latent attention (``attention="mla"``,
``d_rope = Dh / 2``) with two latent ranks chosen so that its cache per token equals
GQA's with ``Hkv = 2`` and MQA's: ``kv_rank + d_rope = 2 · Hkv · Dh``; and, as a probe of
the rotary width, MLA with ``d_rope = Dh`` (as many rotation frequencies as the other
variants' RoPE) at GQA's ``Hkv = 2`` cache; and, as that probe's control, the same
rotary width and latent with ``d_nope = Dh / 2``, so that the per-head query-key width
``d_nope + d_rope`` (and the softmax scale) is the default MLA's ``Dh + Dh / 2`` again
(``GPT`` has no ``d_nope`` argument: its blocks' attention modules are replaced and the
weights re-initialised with ``GPT.reset_parameters`` after seeding). Each variant
starts from the same seed and sees the same batches (same steps, same learning-rate
schedule) on the first 90 % of :func:`attention_course.data.python_docs`, and is scored
on all of the last 10 % (:func:`attention_course.train.evaluate_lm`). The cache per
token per layer is :func:`attention_course.cache_per_token`. The results go to
``book/data/latent_study.json``, which ``book/18_latent_attention.ipynb`` reads; the
command line, the training run and the JSON's keys are the other studies'
(``scripts/_study.py``).

``--add NAME`` runs only the variant ``NAME`` for every seed and adds its entry and runs
to the existing ``--out`` file, keeping the other runs as they are (the variant must not be
in the file yet); the addition's command line, seconds and machine go to the file's
``additions`` list. The control variant was added to the committed results this way.
"""

from __future__ import annotations

import json
import shlex
import sys

import _study

from attention_course import GPT, MultiHeadLatentAttention, cache_per_token, count_parameters

DEFAULT_OUT = _study.ROOT / "book" / "data" / "latent_study.json"
CONFIG = {"d_model": 64, "num_heads": 8, "num_layers": 2, "max_len": 64, "pos": "rope"}
TRAINING = {"steps": 300, "batch_size": 24, "context": 64, "lr": 3e-3}
SEEDS = (0, 1, 2)
QUICK_CONFIG = {"d_model": 32, "num_heads": 8, "num_layers": 1, "max_len": 32, "pos": "rope"}
QUICK_TRAINING = {"steps": 3, "batch_size": 8, "context": 32, "lr": 3e-3}


def variants(config: dict) -> list[dict]:
    """The eight variants: a name, the GPT's extra arguments, and the cache numbers per token
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
    # A probe of one difference: a rotary part as wide as a head (Dh / 2 frequencies, as the
    # other variants' RoPE), at the cache of GQA with Hkv = H/4 again
    kv_rank = 2 * (H // 4) * Dh - Dh
    name = f"MLA, r = {kv_rank}, d_rope = {Dh}"
    result.append({"name": name, "attention": "mla", "kv_rank": kv_rank, "d_rope": Dh})
    # The probe's control: the same rotary part and latent, with d_nope = Dh / 2 so that the
    # query-key width d_nope + d_rope (and the scale) is the default MLA's Dh + Dh / 2
    name = f"MLA, r = {kv_rank}, d_rope = {Dh}, d_nope = {Dh // 2}"
    result.append(
        {"name": name, "attention": "mla", "kv_rank": kv_rank, "d_rope": Dh, "d_nope": Dh // 2}
    )
    for variant in result:
        if "kv_rank" in variant:
            rope = variant.get("d_rope", d_rope)
            variant["cache_per_token"] = cache_per_token(kv_rank=variant["kv_rank"], d_rope=rope)
        else:
            variant["cache_per_token"] = cache_per_token(
                num_kv_heads=variant["num_kv_heads"], d_head=Dh
            )
    return result


def build(vocab_size: int, config: dict, variant: dict) -> GPT:
    """The variant's GPT (seed first: its initial weights come from torch's generator)."""
    options = {k: v for k, v in variant.items() if k not in ("name", "cache_per_token", "d_nope")}
    model = GPT(vocab_size, **config, **options)
    if "d_nope" in variant:  # GPT has no d_nope: replace the blocks' attention, re-initialise
        for block in model.blocks:
            block.attn = MultiHeadLatentAttention(
                config["d_model"],
                config["num_heads"],
                variant["kv_rank"],
                d_nope=variant["d_nope"],
                d_rope=variant["d_rope"],
            )
        model.reset_parameters()
    return model


def main(argv: list[str] | None = None) -> dict:
    parser = _study.parser(
        __doc__, DEFAULT_OUT, quick="a tiny model, 3 steps, one seed", progress=True
    )
    parser.add_argument(
        "--add",
        metavar="NAME",
        help="run only this variant and add it to the existing --out file",
    )
    args = parser.parse_args(argv)
    start = _study.start(args)
    config = dict(QUICK_CONFIG if args.quick else CONFIG)
    training = dict(QUICK_TRAINING if args.quick else TRAINING)
    seeds = (0,) if args.quick else SEEDS
    table = variants(config)
    previous = None
    if args.add is not None:
        previous = json.loads(args.out.read_text())
        names = [v["name"] for v in table]
        if args.add not in names:
            raise SystemExit(f"--add: got {args.add!r}, expected one of {names}")
        if args.add in [v["name"] for v in previous["variants"]]:
            raise SystemExit(f"--add: {args.add!r} is already in {args.out}")
        if previous["config"] != config or previous["training"]["seeds"] != list(seeds):
            raise SystemExit(f"--add: {args.out} has another config or other seeds")
        table = [v for v in table if v["name"] == args.add]

    tokenizer, train_ids, val_ids = _study.char_data()
    runs = []
    for seed in seeds:
        for variant in table:
            _study.seed(seed)
            model = build(tokenizer.vocab_size, config, variant)
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
    if previous is not None:
        addition = {
            "command": shlex.join(["python", "scripts/latent_study.py", *sys.argv[1:]]),
            "variant": args.add,
            "seconds": _study.seconds_since(start),
            "machine": _study.machine(),
        }
        result = {
            **previous,
            "variants": previous["variants"] + table,
            "runs": previous["runs"] + runs,
            "additions": previous.get("additions", []) + [addition],
        }
        _study.write(args.out, result, digits=4)
        return result
    result = {
        "config": config,
        "training": {**training, "seeds": list(seeds), "eval": "evaluate_lm on all held-out text"},
        "variants": table,
        "runs": runs,
    }
    return _study.finish(args.out, result, start, digits=4)


if __name__ == "__main__":
    main()
