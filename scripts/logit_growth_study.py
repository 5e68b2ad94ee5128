"""Chapter 20's study: attention logits, learning rate, QK-norm and soft-capping.

Wortsman et al. (2023, "Small-scale proxies for large-scale Transformer training
instabilities", arXiv:2309.14322) found that small models trained at high learning rates
show an instability of large ones: the attention logits ``q·k/√Dh`` grow, the attention
entropy collapses (Zhai et al., 2023, "Stabilizing Transformer Training by Preventing
Attention Entropy Collapse", arXiv:2303.06296), and the loss gets worse or diverges; a
LayerNorm on queries and keys (QK-layernorm) removes it. This script runs that experiment
on chapter 13's GPT architecture (learned positions, pre-norm LayerNorm blocks, GELU FFN,
tied embeddings; smaller than the shipped model so that the whole ladder fits a CPU budget)
on :func:`attention_course.data.python_docs`:

- a ladder of peak learning rates ``lrs``; at each, three models trained from the same
  initial weights (same seed) on the same batches for the same steps: the baseline,
  ``qk_norm=True`` (Qwen3's per-head RMSNorm) and ``softcap=cap`` (Gemma 2's cap on the
  scaled scores, before the mask);
- at ``checkpoints`` steps, on a fixed held-out batch: per layer the largest attention
  logit (the scaled score ``q·k/√Dh`` over visible keys, *before* any cap: what the
  product of the query and key has grown to) and the mean attention entropy (nats, of the
  softmax rows, after the cap and the mask);
- at the end, the held-out loss on ``eval_tokens`` tokens of the last 10 % (nats/char);
- one more model per seed at the top learning rate: the baseline with PaLM's z-loss
  (Chowdhery et al., 2022, "PaLM: Scaling Language Modeling with Pathways",
  arXiv:2204.02311, §5: ``1e-4 · log² Z`` added to the loss, Z the softmax normaliser of
  the output logits);
- the size (``FULL``): d_model 64, 4 heads, 2 layers, windows of 64, batches of 16, 400
  steps, learning rates 1e-3 to 1e-1 (the top one is where the baseline's loss has clearly
  degraded at this size; no run diverged), three seeds, a cap of 10 (chapter 20 says why):
  48 runs in about 24 minutes of one thread on the shared machine.

Training as chapter 13's :func:`attention_course.train.train_language_model`: AdamW
(betas 0.9, 0.95, weight decay 0.1 on matrices and embeddings), linear warm-up over 5 % of
the steps, cosine decay to 0.1 × the peak, gradient norm clipped to 1. A run whose loss
becomes NaN or infinite stops there (its step in ``diverged_at``, its ``val_loss`` None).

Run from the repository root (seeded; one thread; ``seconds`` in the JSON says how long it
took on the course's shared 2-core machine)::

    python scripts/logit_growth_study.py                                  # the full ladder
    python scripts/logit_growth_study.py --quick --out /tmp/logits.json   # seconds, for tests

The results go to ``book/data/logit_growth_study.json`` (chapter 20 reads it).
"""

from __future__ import annotations

import math
import sys
import time
from functools import partial

import _study
import torch
import torch.nn.functional as F

from attention_course import GPT
from attention_course.train import _cosine_factor, evaluate_lm, lm_batch

DEFAULT_OUT = _study.ROOT / "book" / "data" / "logit_growth_study.json"
FULL = {
    "d_model": 64,
    "num_heads": 4,
    "num_layers": 2,
    "context": 64,
    "batch_size": 16,
    "steps": 400,
    "lrs": [1e-3, 3e-3, 1e-2, 3e-2, 1e-1],
    "softcap": 10.0,
    "z_loss": 1e-4,
    "seeds": [0, 1, 2],
    "checkpoints": [0, 25, 50, 100, 200, 300, 400],
    "probe_windows": 8,
    "eval_tokens": 16384,
    "curve_every": 10,
}
QUICK = {
    **FULL,
    "d_model": 16,
    "num_heads": 2,
    "num_layers": 1,
    "context": 16,
    "batch_size": 4,
    "steps": 4,
    "lrs": [1e-3, 1e-1],
    "seeds": [0],
    "checkpoints": [0, 2, 4],
    "curve_every": 2,
    "probe_windows": 2,
    "eval_tokens": 256,
}
VARIANTS = ("baseline", "qk_norm", "softcap")


def build(vocab_size: int, config: dict, variant: str, seed: int) -> GPT:
    """Chapter 13's architecture at the study's size; ``variant`` picks the remedy. The seed
    is set just before, so every variant starts from the same draws of the shared weights
    (QK-norm's gains start at 1 and draw nothing)."""
    _study.seed(seed)
    return GPT(
        vocab_size,
        d_model=config["d_model"],
        num_heads=config["num_heads"],
        num_layers=config["num_layers"],
        max_len=config["context"],
        qk_norm=variant == "qk_norm",
        softcap=config["softcap"] if variant == "softcap" else None,
    )


@torch.no_grad()
def probe(model: GPT, x: torch.Tensor) -> dict:
    """Per layer, on the held-out windows ``x (n, T)``: the largest scaled attention score
    over visible keys, before any cap (``max_logit``), and the mean entropy of the attention
    rows (``entropy``, nats; the weights the model uses, after the cap and the mask)."""
    was_training = model.training
    model.eval()
    inputs = []
    hooks = [
        block.attn.register_forward_pre_hook(
            lambda m, args, kw: inputs.append(args[0]), with_kwargs=True
        )
        for block in model.blocks
    ]
    try:
        _, weights = model(x, return_attention=True)
    finally:
        for h in hooks:
            h.remove()
        model.train(was_training)
    T = x.shape[1]
    visible = torch.ones(T, T, dtype=torch.bool).tril()
    max_logit, entropy = [], []
    for block, h, w in zip(model.blocks, inputs, weights):
        attn = block.attn
        q = attn.w_q(h).view(*h.shape[:2], attn.num_heads, -1).transpose(1, 2)  # (n, H, T, Dh)
        k = attn.w_k(h).view(*h.shape[:2], attn.num_heads, -1).transpose(1, 2)
        if attn.qk_norm:
            q, k = attn.q_norm(q), attn.k_norm(k)
        scores = (q @ k.transpose(-2, -1)) * attn.d_head**-0.5  # (n, H, T, T), before any cap
        max_logit.append(float(scores.masked_fill(~visible, float("-inf")).max()))
        plogp = torch.where(w > 0, w * w.clamp_min(1e-30).log(), torch.zeros_like(w))
        entropy.append(float(-plogp.sum(-1).mean()))  # mean over n, H and the T rows
    return {"max_logit": max_logit, "entropy": entropy}


def train_run(model, train_ids, probe_x, config: dict, lr: float, seed: int, z_loss: float):
    """Train ``model`` (chapter 13's optimiser and schedule; batches from ``seed``), probing at
    the checkpoints; with ``z_loss`` > 0 add ``z_loss · mean(logsumexp(logits)²)``."""
    steps = config["steps"]
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
        lr=lr,
        betas=(0.9, 0.95),
    )
    factor = partial(_cosine_factor, warmup=max(1, steps // 20), total=steps, floor=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
    gen = torch.Generator().manual_seed(seed)
    probes, losses, diverged_at = [], [], None
    begin = time.perf_counter()
    for i in range(steps + 1):
        if i in config["checkpoints"]:
            probes.append({"step": i, **probe(model, probe_x)})
        if i == steps:
            break
        model.train()
        x, y = lm_batch(train_ids, config["batch_size"], config["context"], gen)
        logits = model(x)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        total = loss
        if z_loss > 0:
            total = loss + z_loss * torch.logsumexp(logits, dim=-1).pow(2).mean()
        if not torch.isfinite(total):
            diverged_at = i
            break
        optimizer.zero_grad(set_to_none=True)
        total.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        losses.append(loss.item())
    last, every = losses[-50:], config["curve_every"]
    return {
        "train_seconds": time.perf_counter() - begin,
        "train_loss_last50": sum(last) / len(last) if last else None,
        "diverged_at": diverged_at,
        # the mean training loss of each block of curve_every steps
        "train_curve": [
            sum(losses[i : i + every]) / len(losses[i : i + every])
            for i in range(0, len(losses), every)
        ],
        "probes": probes,
    }


def t_interval(values: list[float]) -> dict:
    """Mean of ``values`` over seeds with a 95 % Student-t interval (n - 1 degrees of freedom)."""
    t95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571}
    n = len(values)
    mean = sum(values) / n
    if n < 2:
        return {"mean": mean, "ci95": None, "n": n}
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    t = t95.get(n - 1, t95[5])  # beyond 5 degrees of freedom: df = 5's, a little too wide
    return {"mean": mean, "ci95": t * sd / math.sqrt(n), "n": n}


def summarise(runs: list, config: dict) -> dict:
    """Per learning rate: each variant's held-out loss over seeds, and the paired difference
    (variant minus baseline, seed by seed) with its t interval over the seeds."""
    out = {}
    for lr in config["lrs"]:
        row = {}
        by = {(r["variant"], r["seed"]): r for r in runs if r["lr"] == lr and not r["z_loss"]}
        for variant in VARIANTS:
            vals = [by[(variant, s)]["val_loss"] for s in config["seeds"]]
            row[variant] = t_interval(vals) if None not in vals else None
            if variant != "baseline":
                base = [by[("baseline", s)]["val_loss"] for s in config["seeds"]]
                if None in vals or None in base:
                    row[f"{variant}_minus_baseline"] = None
                else:
                    row[f"{variant}_minus_baseline"] = t_interval(
                        [v - b for v, b in zip(vals, base)]
                    )
        out[f"{lr:g}"] = row
    return out


def main(argv: list[str] | None = None) -> dict:
    parser = _study.parser(__doc__, DEFAULT_OUT, quick="tiny sizes, 4 steps, one seed")
    parser.add_argument("--seeds", type=int, nargs="+", help="override the seeds")
    args = parser.parse_args(argv)
    config = dict(QUICK if args.quick else FULL)
    if args.seeds:
        config["seeds"] = args.seeds
    begin = _study.start(args)
    tok, train_ids, val_ids = _study.char_data()
    n, T = config["probe_windows"], config["context"]
    probe_x = val_ids[: n * T].view(n, T)  # the first held-out windows, the same for every run
    eval_ids = val_ids[: config["eval_tokens"]]
    plan = [(lr, v, s, 0.0) for s in config["seeds"] for lr in config["lrs"] for v in VARIANTS]
    plan += [(max(config["lrs"]), "baseline", s, config["z_loss"]) for s in config["seeds"]]
    runs = []
    for lr, variant, seed, z in plan:
        model = build(tok.vocab_size, config, variant, seed)
        run = train_run(model, train_ids, probe_x, config, lr, seed, z)
        val = None if run["diverged_at"] is not None else evaluate_lm(model, eval_ids, T)
        if val is not None and not math.isfinite(val):
            val = None
        runs.append(
            {"lr": lr, "variant": variant, "seed": seed, "z_loss": z, "val_loss": val, **run}
        )
        last = run["probes"][-1]
        print(
            f"lr {lr:g} {variant:8} seed {seed} z {z:g}: held-out {val}, "
            f"max logit {[round(v, 1) for v in last['max_logit']]}, "
            f"entropy {[round(v, 2) for v in last['entropy']]} ({run['train_seconds']:.0f} s)",
            flush=True,
        )
    result = {
        "command": "python scripts/logit_growth_study.py "
        + " ".join(sys.argv[1:] if argv is None else argv),
        "config": config,
        "vocab_size": tok.vocab_size,
        "note": "val_loss: nats/char on the first eval_tokens held-out characters (None: "
        "diverged); max_logit: largest q·k/√Dh over visible keys, before any cap; entropy: "
        "mean attention-row entropy in nats; ci95: Student-t over the seeds",
        "runs": runs,
        "summary": summarise(runs, config),
    }
    return _study.finish(args.out, result, begin, digits=5)


if __name__ == "__main__":
    main()
