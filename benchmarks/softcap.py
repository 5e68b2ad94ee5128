"""What soft-capping the attention scores costs (chapter 20): the fused path against the
explicit one, in one process.

Run from the repository root::

    python -m benchmarks.softcap               # B=8, T=256, d_model=128, 4 heads, 21 rounds
    python -m benchmarks.softcap --quick       # small sizes, a few seconds
    python -m benchmarks.softcap --threads 1   # fix torch's CPU threads (default 1)

Two :class:`~attention_course.CausalSelfAttention` modules with the same weights, in
training mode, forward and backward (``out.sum().backward()``):

- ``fused``: ``softcap=None``, the default call: PyTorch's
  ``F.scaled_dot_product_attention`` (a fused kernel on this CPU build);
- ``softcap``: ``softcap=50.0`` (Gemma 2's attention cap): the explicit path of
  :meth:`~attention_course.CausalSelfAttention.attend` (scores, ``50 · tanh(s / 50)``,
  mask, softmax, weighted sum: the ``T × T`` scores are materialised and kept for the
  backward pass). Fused kernels have no step between the scores and the softmax, so this
  is the only path a capped model has.

Timing as :mod:`benchmarks.run`: one warm-up call each, then the two take turns (fused,
softcap, fused, ...) ``repeats`` times, so that a change of load hits both. Reported: each
one's median, and the capped call's time divided by the fused call's *of the same round*,
as a geometric mean over the rounds with a 95 % Student-t interval (on the logarithms).
"""

from __future__ import annotations

import argparse
import math
import platform
import statistics
import time

import torch

from attention_course import CausalSelfAttention

T95 = {4: 2.776, 6: 2.447, 8: 2.306, 10: 2.228, 14: 2.160, 20: 2.086, 30: 2.042}


def _t95(df: int) -> float:
    """The two-sided 95 % Student-t quantile for ``df`` degrees of freedom (from the table's
    nearest smaller entry, so never too narrow; 1.96 beyond 30)."""
    if df > 30:
        return 1.96
    keys = [k for k in T95 if k <= df]
    return T95[max(keys)] if keys else 12.706


def modules(d_model: int, num_heads: int, cap: float) -> dict:
    """The fused and capped modules, with the same weights (seed 0)."""
    torch.manual_seed(0)
    plain = CausalSelfAttention(d_model, num_heads)
    capped = CausalSelfAttention(d_model, num_heads, softcap=cap)
    capped.load_state_dict(plain.state_dict())
    return {"plain": plain.train(), "capped": capped.train()}


def compare(
    B: int = 8, T: int = 256, d_model: int = 128, num_heads: int = 4, repeats: int = 21,
    cap: float = 50.0,
) -> dict:  # fmt: skip
    """Time forward + backward of the two paths, interleaved; returns the medians (s) and
    the capped path's ratio to the fused one (geometric mean and 95 % interval over the
    rounds)."""
    m = modules(d_model, num_heads, cap)
    x = torch.randn(B, T, d_model, requires_grad=True)
    calls = {
        "fused": lambda: m["plain"](x),
        "softcap": lambda: m["capped"](x),
    }
    times = {name: [] for name in calls}
    for call in calls.values():  # warm-up
        call().sum().backward()
    for _ in range(repeats):
        for name, call in calls.items():
            start = time.perf_counter()
            call().sum().backward()
            times[name].append(time.perf_counter() - start)
    config = {"B": B, "T": T, "d_model": d_model, "num_heads": num_heads, "repeats": repeats}
    result = {"config": {**config, "cap": cap, "threads": torch.get_num_threads()}}
    result["median_seconds"] = {k: statistics.median(v) for k, v in times.items()}
    logs = [math.log(a / b) for a, b in zip(times["softcap"], times["fused"])]
    mean, sd = statistics.mean(logs), statistics.stdev(logs)
    half = _t95(len(logs) - 1) * sd / math.sqrt(len(logs))
    result["softcap_over_fused"] = {
        "ratio": math.exp(mean),
        "low": math.exp(mean - half),
        "high": math.exp(mean + half),
    }
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, a few seconds")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument("--repeats", type=int, default=21)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    sizes = {"B": 2, "T": 64, "d_model": 64} if args.quick else {}
    print(f"torch {torch.__version__}, Python {platform.python_version()}, "
          f"{platform.machine()}, {torch.get_num_threads()} thread(s)")  # fmt: skip
    r = compare(repeats=args.repeats, **sizes)
    print("config:", r["config"])
    for name, s in r["median_seconds"].items():
        print(f"{name:9} median {1e3 * s:8.2f} ms (forward + backward)")
    v = r["softcap_over_fused"]
    print(f"softcap / fused: {v['ratio']:.2f} (95 % interval {v['low']:.2f} to {v['high']:.2f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
