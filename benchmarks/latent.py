"""Multi-head latent attention: naive against absorbed, decoding with the cache (chapter 18).

Run from the repository root::

    python -m benchmarks.latent --threads 1 --out book/data/latent_decode.json   # ~3 min
    python -m benchmarks.latent --quick                                           # seconds

One :class:`attention_course.MultiHeadLatentAttention` layer at a DeepSeek-like shape,
scaled down (``d_model = 512``, 8 heads, ``d_nope = d_v = 64``, ``d_rope = 32``,
``kv_rank = 256 = 4 · d_nope``, as DeepSeek-V2's 512 = 4 · 128). For each context
length ``S`` its :class:`~attention_course.latent.LatentCache` holds ``S`` positions, and
one decoding step (one new token, batch 1) is timed in the naive form (every head's keys
and values rebuilt from the cached latent: ``w_ukv`` over ``S`` positions) and in the
absorbed form (``W_UK`` folded into the query, attention over the latent). The step is
timed again and again on the same cache: before each call the cache's ``length`` is set
back to ``S``, so the new token overwrites the same slot. Prefill (``T = S`` new tokens
at once, no cache) is timed the same way at the shorter lengths: there the naive form
needs fewer operations per (query, key) pair.

Timing: the two forms take turns (naive, absorbed, naive, ...) after a warm-up, in one
process, so that a change of load hits both; each reports the median over the repeats,
and the ratio naive / absorbed is given per repeat (the pairs of one turn) with its
lowest and highest value: with 7 repeats, the population (true) median of the per-repeat
ratio lies between them with probability 1 - 2 · 2^-7 = 98 % (a distribution-free interval
for a median), provided the repeats are independent, which a loaded shared machine, whose
load drifts from one repeat to the next, does not guarantee. FLOPs per call are counted by
``torch.utils.flop_counter.FlopCounterMode``: exact for the matrix products (and
attention's matrix products inside ``scaled_dot_product_attention``) only. The softmax,
the scaling, the mask, RMSNorm and the rotation are not counted, and the softmax, scaling
and mask also grow with ``S``.

Not a test: no unit test asserts a time (``tests/test_latent.py`` runs ``--quick`` and
checks only the fields).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch
from torch.utils.flop_counter import FlopCounterMode

from attention_course import MultiHeadLatentAttention

SHAPE = {"d_model": 512, "num_heads": 8, "kv_rank": 256, "d_nope": 64, "d_rope": 32, "d_v": 64}
SIZES = {
    "full": {"decode": [256, 1024, 4096, 16384], "prefill": [256, 1024], "repeats": 7},
    "quick": {"decode": [16, 64], "prefill": [16], "repeats": 3},
}


def _model() -> MultiHeadLatentAttention:
    torch.manual_seed(0)
    return MultiHeadLatentAttention(**SHAPE).eval()


def _flops(fn) -> int:
    with FlopCounterMode(display=False) as counter:
        fn()
    return counter.get_total_flops()


def _paired(fns: dict, repeats: int) -> dict:
    """Median seconds of each function, interleaved, and the per-repeat ratios."""
    for fn in fns.values():  # warm-up
        fn()
    times = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    ratios = [a / b for a, b in zip(times["naive"], times["absorbed"])]
    return {
        "naive_ms": 1000 * statistics.median(times["naive"]),
        "absorbed_ms": 1000 * statistics.median(times["absorbed"]),
        "ratio": statistics.median(ratios),
        "ratio_range": [min(ratios), max(ratios)],
    }


@torch.inference_mode()
def decode(model: MultiHeadLatentAttention, S: int, repeats: int) -> dict:
    """One new token after ``S`` cached positions, naive against absorbed."""
    g = torch.Generator().manual_seed(S)
    cache = model.new_cache()
    model(torch.randn(1, S, model.d_model, generator=g), cache=cache)  # fill the cache
    x = torch.randn(1, 1, model.d_model, generator=g)

    def step(absorbed: bool):
        def call():
            cache.length = S  # the same S cached positions at every call
            return model(x, cache=cache, absorbed=absorbed)

        return call

    fns = {"naive": step(False), "absorbed": step(True)}
    same = (fns["naive"]() - fns["absorbed"]()).abs().max().item()
    row = {"S": S, **_paired(fns, repeats), "max_abs_difference": same}
    row["naive_flops"], row["absorbed_flops"] = _flops(fns["naive"]), _flops(fns["absorbed"])
    return row


@torch.inference_mode()
def prefill(model: MultiHeadLatentAttention, T: int, repeats: int) -> dict:
    """``T`` tokens at once, no cache: the training (and prompt) shape."""
    x = torch.randn(1, T, model.d_model, generator=torch.Generator().manual_seed(T))
    fns = {"naive": lambda: model(x), "absorbed": lambda: model(x, absorbed=True)}
    row = {"T": T, **_paired(fns, repeats)}
    row["naive_flops"], row["absorbed_flops"] = _flops(fns["naive"]), _flops(fns["absorbed"])
    return row


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes, 3 repeats (for the test)")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument("--out", type=Path, default=None, help="write the results as JSON")
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parser.parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    sizes = SIZES["quick" if args.quick else "full"]
    begin = time.perf_counter()
    load_before = os.getloadavg() if hasattr(os, "getloadavg") else None
    model = _model()
    rows = {
        "decode": [decode(model, S, sizes["repeats"]) for S in sizes["decode"]],
        "prefill": [prefill(model, T, sizes["repeats"]) for T in sizes["prefill"]],
    }
    for kind, key in (("decode", "S"), ("prefill", "T")):
        for r in rows[kind]:
            low, high = r["ratio_range"]
            print(
                f"{kind:7} {key} = {r[key]:6}: naive {r['naive_ms']:9.3f} ms, absorbed "
                f"{r['absorbed_ms']:9.3f} ms, naive / absorbed x{r['ratio']:.2f} "
                f"(range {low:.2f}-{high:.2f}); GFLOP {r['naive_flops'] / 1e9:.3f} / "
                f"{r['absorbed_flops'] / 1e9:.3f}",
                flush=True,
            )
    result = {
        "shape": SHAPE,
        "batch": 1,
        "repeats": sizes["repeats"],
        "command": " ".join(["python -m benchmarks.latent", *argv]),
        **rows,
        "machine": {
            "torch": torch.__version__,
            "python": platform.python_version(),
            "threads": torch.get_num_threads(),
            "processor": platform.machine(),
            "load_before": None if load_before is None else [round(x, 2) for x in load_before],
            "load_after": [round(x, 2) for x in os.getloadavg()] if load_before else None,
        },
        "seconds": round(time.perf_counter() - begin, 1),
    }
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1) + "\n")
        print(f"wrote {args.out}")
    return result


if __name__ == "__main__":
    main()
