"""Chapter 17's reproducibility note: the induction-head run with other seeds and threads.

Run from the repository root (a few minutes on a shared 2-core machine)::

    python scripts/induction_seeds.py
    python scripts/induction_seeds.py --steps 20 --out /tmp/seeds.json   # a smoke test

It repeats the training of ``book/17_induction_heads.ipynb`` (a two-layer attention-only
``GPT``, four heads, ``d_model=64``, rotary positions, untied head; 300 AdamW steps at
5e-3 on batches of 64 repeated-token sequences, each batch with its own period in 10..20,
the loss on the second half only; the second-half loss measured every 10 steps on 64
held-out sequences of period 16) for seeds 0, 1 and 2 on one thread, and for seed 0 on
two threads. For each run it records the loss curve, the phase change (the first measured
step whose loss is below half of step 0's) and the final loss. The chapter prints them
from ``book/data/induction_seeds.json``; its own run (seed 0, one thread) is the first row.
The command line and the JSON's metadata are the other studies' (``scripts/_study.py``;
each run sets its own threads).
"""

from __future__ import annotations

import _study
import torch
import torch.nn.functional as F

from attention_course import GPT
from attention_course.data import repeated_tokens

DEFAULT_OUT = _study.ROOT / "book" / "data" / "induction_seeds.json"
V, PERIOD, EVERY = 32, 16, 10


def second_half_loss(model, ids, period):
    # logits at period .. 2*period - 2 predict tokens period + 1 .. 2*period - 1
    logits = model(ids)  # (B, T, V)
    return F.cross_entropy(logits[:, period:-1].reshape(-1, V), ids[:, period + 1 :].reshape(-1))


def run(seed: int, threads: int, steps: int) -> dict:
    """The chapter's training loop; the second-half loss every EVERY steps."""
    torch.set_num_threads(threads)
    eval_ids = repeated_tokens(64, PERIOD, V, torch.Generator().manual_seed(1234))
    _study.seed(seed)
    model = GPT(V, d_model=64, num_heads=4, num_layers=2, max_len=64, pos="rope", ffn="none",
                tie_weights=False)  # fmt: skip
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-3, weight_decay=0.0)
    data_gen = torch.Generator().manual_seed(seed)
    curve = []
    for step in range(steps + 1):
        if step % EVERY == 0:
            with torch.no_grad():
                curve.append(round(second_half_loss(model, eval_ids, PERIOD).item(), 4))
        if step == steps:
            break
        period = int(torch.randint(10, 21, (1,), generator=data_gen))  # a new period per batch
        ids = repeated_tokens(64, period, V, data_gen)  # (64, 2 * period)
        loss = second_half_loss(model, ids, period)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    below = [i * EVERY for i, loss in enumerate(curve) if loss < curve[0] / 2]
    return {"seed": seed, "threads": torch.get_num_threads(),  # the count it ran with
            "phase_step": below[0] if below else None,
            "final_loss": curve[-1], "curve": curve}  # fmt: skip


def main(argv: list[str] | None = None) -> dict:
    parser = _study.parser(__doc__, DEFAULT_OUT, threads=False)
    parser.add_argument("--steps", type=int, default=300)
    args = parser.parse_args(argv)
    start = _study.start(args)
    runs = []
    for seed, threads in [(0, 1), (1, 1), (2, 1), (0, 2)]:
        runs.append(run(seed, threads, args.steps))
        r = runs[-1]
        print(f"seed {seed}, {threads} thread(s): phase change at step {r['phase_step']}, "
              f"final loss {r['final_loss']:.4f}")  # fmt: skip
    result = {"steps": args.steps, "every": EVERY, "runs": runs}
    return _study.finish(args.out, result, start, threads=False)


if __name__ == "__main__":
    main()
