"""Chapter 15's memory curve: the KV cache while a model *generates*, full vs rolling.

Run from the repository root (about a minute on one thread of a shared 2-core machine)::

    python scripts/kv_cache_generation.py                 # one thread (--threads)
    python scripts/kv_cache_generation.py --tokens 512 --out /tmp/gen.json   # a smoke test

A tiny untrained GPT (8 query heads, 2 key/value heads, two layers, ``Dh = 8``, rotary
positions so that any length is allowed) starts from a one-token prompt and generates
``tokens`` tokens one at a time, greedily, with a KV cache: once with the growing cache of
chapter 12 and once with a sliding window of ``window`` positions and Mistral's rolling
buffer (``GPT(..., window=W).new_cache()``). After every ``every`` generated tokens it
records the bytes of keys and values the cache stores (``numel() * element_size()`` of
what each layer's cache holds) and the bytes it has allocated (``cache.nbytes``). These
are counts, not timings: they are the same on every machine, whatever tokens the
untrained model happens to choose. The results go to ``book/data/kv_cache_generation.json``,
which ``book/15_sharing_keys_values.ipynb`` plots; the chapter re-generates the first
points live and checks them against the file. The command line and the JSON's metadata are
the other studies' (``scripts/_study.py``).
"""

from __future__ import annotations

import _study
import torch

from attention_course import GPT

DEFAULT_OUT = _study.ROOT / "book" / "data" / "kv_cache_generation.json"
CONFIG = {
    "vocab_size": 64,
    "d_model": 64,
    "num_heads": 8,
    "num_layers": 2,
    "pos": "rope",
    "num_kv_heads": 2,
}


def stored_bytes(cache) -> int:
    """The keys and values each layer's cache holds for the positions seen so far."""
    return sum(
        t.numel() * t.element_size() for layer in cache.layers for t in (layer.keys, layer.values)
    )


@torch.no_grad()
def generation_curve(window: int | None, tokens: int, every: int) -> list[dict]:
    """Generate ``tokens`` tokens greedily with a cache; the cache's bytes every ``every``."""
    _study.seed(0)
    model = GPT(**CONFIG, window=window).eval()
    cache = model.new_cache()
    token = torch.zeros(1, 1, dtype=torch.long)  # a one-token prompt
    points = []
    for n in range(1, tokens + 1):
        logits = model(token, cache=cache)  # (1, 1, V): only the newest token is read
        token = logits[:, -1].argmax(dim=-1, keepdim=True)  # greedy: the next input
        if n % every == 0:
            points.append(
                {"generated": n, "stored": stored_bytes(cache), "allocated": cache.nbytes}
            )
    return points


def main(argv: list[str] | None = None) -> dict:
    parser = _study.parser(__doc__, DEFAULT_OUT)
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--every", type=int, default=256)
    parser.add_argument("--window", type=int, default=512)
    args = parser.parse_args(argv)
    start = _study.start(args)
    curves = {
        "full": generation_curve(None, args.tokens, args.every),
        "rolling": generation_curve(args.window, args.tokens, args.every),
    }
    result = {
        "config": CONFIG,
        "window": args.window,
        "tokens": args.tokens,
        "every": args.every,
        "prompt_tokens": 1,
        "curves": curves,
    }
    result = _study.finish(args.out, result, start)
    for name, points in curves.items():
        last = points[-1]
        print(
            f"{name:8} after {last['generated']} tokens: stored {last['stored']:,} B, "
            f"allocated {last['allocated']:,} B"
        )
    return result


if __name__ == "__main__":
    main()
