"""What soft-capping the attention scores costs (chapter 20): the fused path against the
explicit one, with and without the cap, in one process.

Run from the repository root::

    python -m benchmarks.softcap               # B=8, T=256, d_model=128, 4 heads, 21 rounds
    python -m benchmarks.softcap --quick       # small sizes, a few seconds
    python -m benchmarks.softcap --threads 1   # fix torch's CPU threads (default 1)

Two :class:`~attention_course.CausalSelfAttention` modules with the same weights, in
training mode, forward and backward (``out.sum().backward()``), timed as three calls:

- ``fused``: ``softcap=None``, the default call: PyTorch's
  ``F.scaled_dot_product_attention`` (a fused kernel on this CPU build);
- ``explicit``: the same uncapped module called with ``need_weights=True``, which takes the
  explicit path (:func:`attention_course.scaled_dot_product_attention`: scores, mask,
  softmax, weighted sum, the ``T × T`` scores and weights materialised), without a cap;
- ``softcap``: ``softcap=50.0`` (Gemma 2's attention cap): the explicit path of
  :meth:`~attention_course.CausalSelfAttention.attend` (scores, ``50 · tanh(s / 50)``,
  mask, softmax, weighted sum). ``F.scaled_dot_product_attention`` has no step between the
  scores and the softmax, so this is the only path a capped model has in the package.

The ``explicit`` arm splits the capped call's extra time into the explicit path's share
(``explicit / fused``) and the cap's own elementwise work (``softcap / explicit``); which
is larger depends on the machine, the sizes and the load.

Timing as :mod:`benchmarks.run`: one warm-up call each, then the three take turns (fused,
explicit, softcap, fused, ...) ``repeats`` times, so that a change of load hits all of
them. Reported: each one's median, and for each pair the ratio of the two calls' times *of
the same round*, as a geometric mean over the rounds with a 95 % Student-t interval (on
the logarithms).
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


def _ratio(a: list[float], b: list[float]) -> dict:
    """``a / b`` round by round: the geometric mean and a 95 % Student-t interval (on the
    logarithms) over the rounds."""
    logs = [math.log(x / y) for x, y in zip(a, b)]
    mean, sd = statistics.mean(logs), statistics.stdev(logs)
    half = _t95(len(logs) - 1) * sd / math.sqrt(len(logs))
    return {"ratio": math.exp(mean), "low": math.exp(mean - half), "high": math.exp(mean + half)}


def compare(
    B: int = 8, T: int = 256, d_model: int = 128, num_heads: int = 4, repeats: int = 21,
    cap: float = 50.0,
) -> dict:  # fmt: skip
    """Time forward + backward of the three calls, interleaved; returns the medians (s) and
    the ratios ``softcap_over_fused``, ``explicit_over_fused`` and ``softcap_over_explicit``
    (geometric mean and 95 % interval over the rounds)."""
    m = modules(d_model, num_heads, cap)
    x = torch.randn(B, T, d_model, requires_grad=True)
    calls = {
        "fused": lambda: m["plain"](x),
        "explicit": lambda: m["plain"](x, need_weights=True)[0],
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
    for a, b in (("softcap", "fused"), ("explicit", "fused"), ("softcap", "explicit")):
        result[f"{a}_over_{b}"] = _ratio(times[a], times[b])
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
    for a, b in (("softcap", "fused"), ("explicit", "fused"), ("softcap", "explicit")):
        v = r[f"{a}_over_{b}"]
        print(f"{a} / {b}: {v['ratio']:.2f} (95 % interval {v['low']:.2f} to {v['high']:.2f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
