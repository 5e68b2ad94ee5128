"""Chapter 16's study: chapter 13's GPT block against the "Llama-style" block.

Run from the repository root (seeded; the losses are reproducible on one machine)::

    python scripts/study_modern_block.py                               # one thread (--threads)
    python scripts/study_modern_block.py --quick --out /tmp/m.json     # a smoke test

Every configuration is a :class:`attention_course.GPT` of two layers, ``d_model=64``,
four query heads, character-level on :func:`attention_course.data.python_docs`
(first 90 % to train, last 10 % held out). Each one changes chapter 13's block
(learned positions, LayerNorm, GELU feed-forward of width ``4 * d_model``, four
key/value heads) in one respect, and the last one in all of them at once:

- ``rms``: RMSNorm instead of LayerNorm;
- ``swiglu``: a SwiGLU feed-forward network instead of GELU;
- ``rope``: rotary positions instead of learned ones;
- ``gqa``: two key/value heads shared by the four query heads;
- ``llama``: all four (``pos="rope", norm="rms", ffn="swiglu", num_kv_heads=2``).

Parameter counts are matched: each configuration's feed-forward width ``d_ff`` is the
one that brings its parameter count closest to the baseline's (the script records both
counts; they differ by well under 1 %). Every configuration is trained with the same
seeds, on the same batches (the batches depend only on the seed), for the same number of
AdamW steps with the same learning-rate schedule (:func:`train_language_model`), then
scored on the whole held-out text (:func:`evaluate_lm`). Tokens per second is the
training throughput of that run on the machine that ran it (recorded in the JSON, with
the number of threads torch used). The runs go one after another, configuration by
configuration and seed by seed; the committed JSON's ran on one thread each, on a
two-core machine shared with other jobs, so the load, and with it the throughput,
varied from run to run: compare the runs of one configuration before reading a
difference between configurations. The command line, the training run and the JSON's
keys are the other studies' (``scripts/_study.py``).
"""

from __future__ import annotations

import math

import _study

from attention_course import GPT, count_parameters

DEFAULT_OUT = _study.ROOT / "book" / "data" / "modern_block.json"
BASE = {"d_model": 64, "num_heads": 4, "num_layers": 2, "max_len": 64}
# name -> the GPT options that differ from chapter 13's block (d_ff is matched later)
CONFIGS = {
    "gpt13": {},
    "rms": {"norm": "rms"},
    "swiglu": {"ffn": "swiglu"},
    "rope": {"pos": "rope"},
    "gqa": {"num_kv_heads": 2},
    "llama": {"pos": "rope", "norm": "rms", "ffn": "swiglu", "num_kv_heads": 2},
}
FULL = {"steps": 800, "batch_size": 32, "context": 64, "lr": 3e-3, "seeds": [0, 1]}
QUICK = {"steps": 4, "batch_size": 4, "context": 64, "lr": 3e-3, "seeds": [0]}


def matched_d_ff(vocab_size: int, options: dict, target: int) -> int:
    """The feed-forward width that brings ``GPT(**BASE, **options)`` closest to ``target``
    parameters (the count is linear in ``d_ff``: two evaluations find the line)."""
    count = {f: count_parameters(GPT(vocab_size, **BASE, **options, d_ff=f)) for f in (1, 2)}
    slope = count[2] - count[1]
    return max(1, round(1 + (target - count[1]) / slope))


SCHEDULE = (
    "one run after another, configuration by configuration, seeds in order; "
    "throughput depends on the load of the machine at the time of each run"
)


def main(argv: list[str] | None = None) -> dict:
    parser = _study.parser(__doc__, DEFAULT_OUT, quick="a few steps, one seed", progress=True)
    args = parser.parse_args(argv)
    start = _study.start(args)
    training = QUICK if args.quick else FULL

    tokenizer, train_ids, val_ids = _study.char_data()
    V = tokenizer.vocab_size
    target = count_parameters(GPT(V, **BASE))

    results = {}
    for name, options in CONFIGS.items():
        d_ff = 4 * BASE["d_model"] if not options else matched_d_ff(V, options, target)
        runs = []
        for seed in training["seeds"]:
            _study.seed(seed)
            model = GPT(V, **BASE, **options, d_ff=d_ff)
            run = _study.train_and_score(
                model, train_ids, val_ids, training, seed, progress=not args.no_progress
            )
            runs.append({"seed": seed, **run})
            print(
                f"{name:7} d_ff={d_ff:4} seed {seed}: held-out {run['val_loss']:.4f} nats/char, "
                f"{run['tokens_per_second']:,.0f} tokens/s",
                flush=True,
            )
        results[name] = {
            "options": options,
            "d_ff": d_ff,
            "parameters": count_parameters(model),
            "runs": runs,
        }

    data = {
        "base": BASE,
        "training": training,
        "vocab_size": V,
        "train_chars": len(train_ids),
        "val_chars": len(val_ids),
        "uniform_loss": math.log(V),
        "results": results,
    }
    return _study.finish(args.out, data, start, schedule=SCHEDULE)


if __name__ == "__main__":
    main()
