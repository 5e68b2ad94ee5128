"""Causal linear attention three ways (chapter 22): time per token and memory against ``T``.

Run from the repository root::

    python -m benchmarks.linear               # B=1, H=4, Dk=Dv=64, T = 256 .. 4096, 7 rounds
    python -m benchmarks.linear --quick       # small sizes, a few seconds
    python -m benchmarks.linear --threads 1   # fix torch's CPU threads (default 1)

The same function, ``out_i = phi(q_i)^T S_i / phi(q_i)^T z_i`` with ``phi = elu + 1``
(Katharopoulos et al., 2020, arXiv:2006.16236), computed three ways, forward only
(``torch.inference_mode``):

- ``quadratic``: the explicit masked ``T x T`` matrix ``phi(Q) phi(K)^T``, each row divided
  by its sum, times ``V`` (softmax attention's shape of work, ``O(T^2)``);
- ``recurrent``: one token at a time, the state ``S`` ``(Dk, Dv)`` and ``z`` ``(Dk,)``
  updated, then read (``T`` Python steps of ``O(Dk Dv)``);
- ``chunked``: :func:`attention_course.linear_attention` (blocks of 64: a ``64 x 64`` tile
  inside a block, the state between blocks; ``T / 64`` steps).

Timing as :mod:`benchmarks.run`: one warm-up call each, then the forms take turns
``repeats`` times at each ``T``; reported: the median seconds per token and, against the
chunked form of the same round, a geometric-mean ratio with a 95 % Student-t interval.
Memory: the number of elements of the largest tensor each form creates
(:func:`attention_course.checks._sizes.record_sizes`: counted, not measured, so the same on
every machine).
"""

from __future__ import annotations

import argparse
import math
import platform
import statistics
import time

import torch
import torch.nn.functional as F

from attention_course import linear_attention
from attention_course.checks._sizes import record_sizes

T95 = {4: 2.776, 6: 2.447, 8: 2.306, 10: 2.228, 14: 2.160, 20: 2.086, 30: 2.042}


def _t95(df: int) -> float:
    if df > 30:
        return 1.96
    keys = [k for k in T95 if k <= df]
    return T95[max(keys)] if keys else 12.706


def quadratic(q, k, v):
    """The explicit form: ``(..., T, T)`` scores, masked, rows normalised."""
    phi_q, phi_k = F.elu(q) + 1, F.elu(k) + 1
    T = q.shape[-2]
    scores = phi_q @ phi_k.transpose(-2, -1)  # (..., T, T)
    scores = scores.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), 0.0)
    return (scores / scores.sum(dim=-1, keepdim=True)) @ v


def recurrent(q, k, v):
    """Token by token: ``S += phi(k_t) v_t^T``, ``z += phi(k_t)``, then read with ``phi(q_t)``."""
    phi_q, phi_k = F.elu(q) + 1, F.elu(k) + 1
    state = q.new_zeros(*q.shape[:-2], q.shape[-1], v.shape[-1])  # (..., Dk, Dv)
    z = q.new_zeros(*q.shape[:-2], q.shape[-1])  # (..., Dk)
    outputs = []
    for t in range(q.shape[-2]):
        state = state + phi_k[..., t, :, None] * v[..., t, None, :]
        z = z + phi_k[..., t, :]
        numerator = (phi_q[..., t, :, None] * state).sum(dim=-2)  # (..., Dv)
        outputs.append(numerator / (phi_q[..., t, :] * z).sum(dim=-1, keepdim=True))
    return torch.stack(outputs, dim=-2)


def chunked(q, k, v):
    return linear_attention(q, k, v, causal=True)


FORMS = {"quadratic": quadratic, "recurrent": recurrent, "chunked": chunked}


def inputs(T: int, B: int = 1, H: int = 4, D: int = 64, dtype=torch.float32):
    gen = torch.Generator().manual_seed(T)
    return tuple(torch.randn(B, H, T, D, generator=gen, dtype=dtype) for _ in range(3))


def largest_elements(T: int, B: int = 1, H: int = 4, D: int = 64) -> dict:
    """Per form: the elements of the largest tensor it creates for one call (exact)."""
    q, k, v = inputs(T, B, H, D)
    result = {}
    with torch.inference_mode():
        for name, form in FORMS.items():
            with record_sizes() as largest:
                form(q, k, v)
            result[name] = largest.elements
    return result


def compare(lengths=(256, 512, 1024, 2048, 4096), B=1, H=4, D=64, repeats=7) -> dict:
    """Interleaved timings at each ``T``: median seconds per token, and each form's time over
    the chunked form's of the same round (geometric mean, 95 % interval)."""
    result = {}
    with torch.inference_mode():
        for T in lengths:
            q, k, v = inputs(T, B, H, D)
            times = {name: [] for name in FORMS}
            for form in FORMS.values():  # warm-up
                form(q, k, v)
            for _ in range(repeats):
                for name, form in FORMS.items():
                    start = time.perf_counter()
                    form(q, k, v)
                    times[name].append(time.perf_counter() - start)
            row = {"per_token": {n: statistics.median(t) / T for n, t in times.items()}}
            for name in ("quadratic", "recurrent"):
                logs = [math.log(a / b) for a, b in zip(times[name], times["chunked"])]
                mean = statistics.mean(logs)
                half = _t95(len(logs) - 1) * statistics.stdev(logs) / math.sqrt(len(logs))
                row[f"{name}_over_chunked"] = {
                    "ratio": math.exp(mean),
                    "low": math.exp(mean - half),
                    "high": math.exp(mean + half),
                }
            result[T] = row
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, a few seconds")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    lengths = (64, 128, 256) if args.quick else (256, 512, 1024, 2048, 4096)
    repeats = 3 if args.quick else args.repeats
    print(f"torch {torch.__version__}, Python {platform.python_version()}, "
          f"{platform.machine()}, {torch.get_num_threads()} thread(s)")  # fmt: skip
    print("B=1, H=4, Dk=Dv=64, forward only; microseconds per token (median); / chunked")
    for T, row in compare(lengths, repeats=repeats).items():
        cells = "  ".join(f"{n} {1e6 * s:8.2f}" for n, s in row["per_token"].items())
        ratios = "  ".join(
            f"{n} {row[f'{n}_over_chunked']['ratio']:.2f} "
            f"[{row[f'{n}_over_chunked']['low']:.2f}, {row[f'{n}_over_chunked']['high']:.2f}]"
            for n in ("quadratic", "recurrent")
        )
        print(f"T={T:5d}  {cells}   {ratios}")
    print("largest tensor (elements):")
    for T in lengths:
        print(f"T={T:5d}", largest_elements(T))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
