"""How many CPU threads should the chapters run with? One, and this measures why.

Run from the repository root::

    python -m benchmarks.threads            # about a minute on 2 cores
    python -m benchmarks.threads --busy     # ... while another process trains (all cores)
    python -m benchmarks.threads --quick    # a few seconds; for the test

Workloads of the chapters' own sizes, each timed with 1 thread and with 2 (and 4 and 8
where the machine has that many cores), interleaved in one process (1, 2, 1, 2, ...)
after a warm-up, so that a machine that gets busier during the run slows both alike:

* ``gpt_step``: one AdamW step of chapter 13's small GPT (D = 96, 4 heads, 3 layers,
  a batch of 32 windows of 64 characters), the chapter's longest loop;
* ``additive_step``: one Adam step of chapter 3's additive-attention pair aligner;
* ``attention``: scaled dot-product attention on (8, 4, 64, 24), the exercises' size.

``--busy`` measures the same while a second process runs chapter 13's training step with
torch's default thread count (other work a reader runs, say; a second pytest worker now
runs on one thread, which competes less).

For each it prints the median time per call with each thread count, and the ratio
(time with t threads / time with 1) with the lowest and highest ratio over the repeats:
a ratio above 1 means more threads are slower. The numbers depend on the machine and its
load; this is why ``attention_course.device.CHAPTER_THREADS`` is 1 (set by
``seed_everything``), not a claim about every machine.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

import torch

from attention_course import GPT, scaled_dot_product_attention
from attention_course.alignment import PairAligner


def _gpt_step() -> Callable[[], None]:
    torch.manual_seed(0)
    model = GPT(80, d_model=96, num_heads=4, num_layers=3, max_len=64)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    x = torch.randint(0, 80, (32, 64))
    y = torch.randint(0, 80, (32, 64))

    def step() -> None:
        logits = model(x)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 80), y.reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()

    return step


def _additive_step() -> Callable[[], None]:
    torch.manual_seed(0)
    model = PairAligner(num_values=20)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    pairs = torch.randint(0, 20, (64, 10, 2))
    previous = torch.randint(0, 20, (64, 10, 2))
    target = torch.randint(0, 20, (64, 10, 2))

    def step() -> None:
        context, _ = model(pairs, previous)
        logits = model.read(context)  # (B, T, 2, V)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 20), target.reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()

    return step


def _attention() -> Callable[[], None]:
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(8, 4, 64, 24, generator=g) for _ in range(3))

    def call() -> None:
        scaled_dot_product_attention(q, k, v)

    return call


WORKLOADS = {"gpt_step": _gpt_step, "additive_step": _additive_step, "attention": _attention}


def _time(fn: Callable[[], None], calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls


def measure(name: str, thread_counts: list[int], repeats: int, calls: int) -> dict:
    fn = WORKLOADS[name]()
    before = torch.get_num_threads()
    times: dict[int, list[float]] = {t: [] for t in thread_counts}
    try:
        for t in thread_counts:  # warm-up
            torch.set_num_threads(t)
            _time(fn, max(1, calls // 2))
        for _ in range(repeats):
            for t in thread_counts:  # interleaved
                torch.set_num_threads(t)
                times[t].append(_time(fn, calls))
    finally:
        torch.set_num_threads(before)
    one = times[thread_counts[0]]
    result = {"workload": name, "repeats": repeats, "calls": calls, "threads": {}}
    for t in thread_counts:
        ratios = [a / b for a, b in zip(times[t], one)]
        result["threads"][t] = {
            "median_ms": round(1000 * statistics.median(times[t]), 3),
            "ratio_to_1": round(statistics.median(ratios), 2),
            "ratio_range": [round(min(ratios), 2), round(max(ratios), 2)],
        }
    return result


def _busy_forever() -> None:
    """The competing process of ``--busy``: chapter 13's step, default threads, forever."""
    step = _gpt_step()
    while True:
        step()


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="few repeats (for the test)")
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.add_argument("--busy", action="store_true", help="measure while another process trains")
    args = parser.parse_args(argv)
    rival = None
    if args.busy:
        code = "from benchmarks.threads import _busy_forever; _busy_forever()"
        rival = subprocess.Popen([sys.executable, "-c", code])
        time.sleep(3.0)  # let it start training
    cores = os.cpu_count() or 1
    counts = [1] + [t for t in (2, 4, 8) if t <= max(cores, 2)]
    repeats, calls = (2, 2) if args.quick else (7, 10)
    try:
        results = [measure(name, counts, repeats, calls) for name in WORKLOADS]
    finally:
        if rival is not None:
            rival.kill()
            rival.wait()
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        print(
            f"torch {torch.__version__}, {cores} cores, OMP_NUM_THREADS="
            f"{os.environ.get('OMP_NUM_THREADS', '(unset)')}"
            + (", while another process trains" if args.busy else ", no other work")
        )
        for r in results:
            for t, row in r["threads"].items():
                low, high = row["ratio_range"]
                print(
                    f"{r['workload']:14} threads={t}: {row['median_ms']:9.3f} ms per call, "
                    f"x{row['ratio_to_1']:.2f} the time with 1 thread "
                    f"(range {low:.2f}-{high:.2f})"
                )
    return results


if __name__ == "__main__":
    main()
