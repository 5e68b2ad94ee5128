"""Chapter 21's study: a dense GPT against mixture-of-experts GPTs, and the experts' load.

Run from the repository root (seeded; one thread; the JSON records the seconds it took)::

    python scripts/moe_study.py                               # the committed run
    python scripts/moe_study.py --quick --out /tmp/moe.json   # a smoke test (seconds)

Every arm is ``GPT(V, **CONFIG, ffn=..., ...)`` (RoPE, RMSNorm, SwiGLU feed-forward
networks, chapter 16's block), trained with the same seed on the same batches of the
first 90 % of :func:`attention_course.data.python_docs` (AdamW, warm-up then cosine decay,
as :func:`attention_course.train.train_language_model`) and scored on all of the last
10 % (:func:`attention_course.train.evaluate_lm`); one learning rate for every arm, not
tuned per arm. The arms:

- ``dense``: one SwiGLU of width ``F`` per block;
- ``moe``: 8 experts of width ``F/2``, top-2: the same *active* parameters per token as
  ``dense`` (plus the router), four times its feed-forward parameters in all, trained
  with the load-balancing loss (coefficient ``aux_coef``, as Switch Transformers' α),
  computed once over both layers' tokens pooled, as Hugging Face's
  ``load_balancing_loss_func`` does (Switch Transformers add it per layer);
- ``dense_wide``: one SwiGLU of width ``4F``: the same *total* parameters as ``moe``
  (less the router), all active: four times ``moe``'s active feed-forward parameters,
  2.63 times its active parameters in the whole model (embeddings and attention are
  shared);
- ``moe_no_loss``: ``moe`` without the balancing loss;
- ``moe_bias``: ``moe`` without the loss, with DeepSeek-V3's balancing bias
  (:meth:`attention_course.MoE.update_router_bias` after every step, rate ``bias_rate``).

For the MoE arms it records, every ``load_every`` steps and per layer, the share of the
step's ``N·k`` token-to-expert assignments that each expert received: the busiest
expert's share (``1/E`` is perfect balance) and the entropy of the shares (``ln E`` is
perfect balance), and the same on the first 4,096 held-out characters at the end. The
results go to ``book/data/moe_study.json`` (chapter 21 reads it), with per-seed paired
differences of the held-out loss; the file is rewritten after every seed, so a run cut
short keeps the seeds it finished (``training.seeds``). ``throughput``: forward +
backward tokens per second of one training batch for ``dense``, ``moe`` and
``dense_wide``, interleaved repeats on this machine (a timing: it depends on the machine
and its load).
"""

from __future__ import annotations

import math
import time
from functools import partial

import _study
import torch
import torch.nn.functional as F

from attention_course import GPT, MoE, active_parameters, count_parameters, load_balancing_loss
from attention_course.train import _cosine_factor, evaluate_lm, lm_batch, optimization_step

DEFAULT_OUT = _study.ROOT / "book" / "data" / "moe_study.json"
CONFIG = {
    "d_model": 64,
    "num_heads": 4,
    "num_layers": 2,
    "max_len": 64,
    "pos": "rope",
    "norm": "rms",
}
WIDTH = 128  # F: the dense model's SwiGLU width
TRAINING = {
    "steps": 800,
    "batch_size": 16,
    "context": 64,
    "lr": 3e-3,
    "aux_coef": 0.01,
    "bias_rate": 1e-2,
    "load_every": 25,
}
SEEDS = (0, 1, 2)
QUICK_CONFIG = {
    "d_model": 32,
    "num_heads": 2,
    "num_layers": 1,
    "max_len": 32,
    "pos": "rope",
    "norm": "rms",
}
QUICK_WIDTH = 32
QUICK_TRAINING = {**TRAINING, "steps": 4, "batch_size": 4, "context": 32, "load_every": 2}
PAIRS = (  # (arm, minus arm)
    ("moe", "dense"),
    ("moe", "dense_wide"),
    ("moe_no_loss", "moe"),
    ("moe_bias", "moe"),
)


def arms(width: int) -> dict:
    """Each arm's GPT options and how it balances its experts ("loss", "none", "bias")."""
    moe = {"ffn": "moe", "d_ff": width // 2, "num_experts": 8, "top_k": 2}
    return {
        "dense": ({"ffn": "swiglu", "d_ff": width}, None),
        "moe": (moe, "loss"),
        "dense_wide": ({"ffn": "swiglu", "d_ff": 4 * width}, None),
        "moe_no_loss": (moe, "none"),
        "moe_bias": ({**moe, "router_bias": True}, "bias"),
    }


def load_stats(counts: torch.Tensor) -> dict:
    """The busiest expert's share of the assignments and the entropy of the shares (nats)."""
    share = counts.double() / counts.sum()
    entropy = -(share * share.clamp_min(1e-300).log()).sum()
    return {"max_share": float(share.max()), "entropy": float(entropy)}


def moe_layers(model: GPT) -> list[MoE]:
    return [block.ffn for block in model.blocks if isinstance(block.ffn, MoE)]


def train_arm(model: GPT, balance: str | None, train_ids, val_ids, training: dict, seed: int):
    """Train ``model`` (the balancing ``balance`` for an MoE), then score it; the record."""
    steps = training["steps"]
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
        lr=training["lr"],
        betas=(0.9, 0.95),
    )
    factor = partial(_cosine_factor, warmup=max(1, steps // 20), total=steps, floor=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
    gen = torch.Generator().manual_seed(seed)  # the same batches for every arm of a seed
    layers = moe_layers(model)
    train_loss, aux_loss, load = [], [], []
    begin = time.perf_counter()
    for i in range(steps):
        model.train()
        x, y = lm_batch(train_ids, training["batch_size"], training["context"], gen)
        if layers:
            logits, router_logits = model(x, return_router_logits=True)
        else:
            logits, router_logits = model(x), []
        lm = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        loss = lm
        if layers:
            pooled = torch.cat(router_logits)  # HF pools the layers' tokens
            aux = load_balancing_loss(pooled, layers[0].num_experts, layers[0].top_k)
            aux_loss.append(aux.item())
            if balance == "loss":
                loss = lm + training["aux_coef"] * aux
        optimization_step(model, loss, optimizer, scheduler, clip_norm=1.0)
        train_loss.append(lm.item())
        if layers:
            if balance == "bias":  # after the step, as DeepSeek-V3
                counts = [
                    m.update_router_bias(r, training["bias_rate"])
                    for m, r in zip(layers, router_logits)
                ]
            else:
                counts = [m.expert_load(r) for m, r in zip(layers, router_logits)]
            if i % training["load_every"] == 0 or i == steps - 1:
                load.append({"step": i + 1, "layers": [load_stats(c) for c in counts]})
    train_seconds = time.perf_counter() - begin
    model.eval()
    record = {
        "val_loss": evaluate_lm(model, val_ids, context=training["context"]),
        "train_loss_last50": sum(train_loss[-50:]) / len(train_loss[-50:]),
        "train_seconds": train_seconds,
        "tokens_per_second": steps * training["batch_size"] * training["context"] / train_seconds,
        "parameters": count_parameters(model),
        "active_parameters": active_parameters(model),
    }
    if layers:
        with torch.no_grad():
            held = val_ids[:4096].view(-1, training["context"])  # 4,096 held-out characters
            _, router_logits = model(held, return_router_logits=True)
        record["val_load"] = [load_stats(m.expert_load(r)) for m, r in zip(layers, router_logits)]
        record["load"] = load
        record["aux_loss_first"] = aux_loss[0]
        record["aux_loss_last50"] = sum(aux_loss[-50:]) / len(aux_loss[-50:])
        if balance == "bias":
            record["router_bias"] = [m.router_bias.tolist() for m in layers]
    return record


def interval(values: list[float]) -> dict:
    """Mean, SD and a 95 % Student-t interval (half-width) of paired differences."""
    t95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776}  # two-sided 0.975 quantiles by df
    n = len(values)
    x = torch.tensor(values, dtype=torch.float64)
    sd = float(x.std()) if n > 1 else float("nan")
    half = t95.get(n - 1, 1.96) * sd / math.sqrt(n) if n > 1 else float("nan")
    return {"values": values, "mean": float(x.mean()), "sd": sd, "ci95": half, "n": n}


def paired(runs: list, seeds: list) -> dict:
    """Per seed, each pair's difference of held-out loss (same seed, same batches)."""
    out = {}
    for arm, other in PAIRS:
        diffs = []
        for seed in seeds:
            loss = {r["arm"]: r["val_loss"] for r in runs if r["seed"] == seed}
            diffs.append(loss[arm] - loss[other])
        out[f"{arm}_minus_{other}"] = interval(diffs)
    return out


def throughput(vocab: int, config: dict, width: int, training: dict, repeats: int) -> dict:
    """Forward + backward tokens/s on one batch, the arms' models interleaved ``repeats``
    times (untrained weights: the routing of a random router, roughly even)."""
    models = {}
    for name in ("dense", "moe", "dense_wide"):
        _study.seed(0)
        options, _ = arms(width)[name]
        models[name] = GPT(vocab, **config, **options)
    gen = torch.Generator().manual_seed(0)
    x, y = lm_batch(
        torch.randint(0, vocab, (10_000,), generator=gen),
        training["batch_size"],
        training["context"],
        gen,
    )
    tokens = x.numel()
    times = {name: [] for name in models}
    for _ in range(repeats):
        for name, model in models.items():
            begin = time.perf_counter()
            logits = model(x)
            F.cross_entropy(logits.reshape(-1, vocab), y.reshape(-1)).backward()
            times[name].append(time.perf_counter() - begin)
            model.zero_grad(set_to_none=True)
    out = {}
    for name, seconds in times.items():
        rates = sorted(tokens / s for s in seconds[1:])  # the first repeat warms up
        out[name] = {"tokens_per_second": rates, "median": rates[len(rates) // 2]}
    return out


def main(argv: list[str] | None = None) -> dict:
    parser = _study.parser(__doc__, DEFAULT_OUT, quick="a tiny model, 4 steps, one seed")
    args = parser.parse_args(argv)
    begin = _study.start(args)
    config = QUICK_CONFIG if args.quick else CONFIG
    width = QUICK_WIDTH if args.quick else WIDTH
    training = QUICK_TRAINING if args.quick else TRAINING
    seeds = (0,) if args.quick else SEEDS
    tokenizer, train_ids, val_ids = _study.char_data()
    if args.quick:
        val_ids = val_ids[:4096]
    repeats = 3 if args.quick else 11
    speed = throughput(tokenizer.vocab_size, config, width, training, repeats)
    runs, done = [], []
    for seed in seeds:
        for name, (options, balance) in arms(width).items():
            _study.seed(seed)
            model = GPT(tokenizer.vocab_size, **config, **options)
            record = train_arm(model, balance, train_ids, val_ids, training, seed)
            runs.append({"arm": name, "seed": seed, **record})
            print(
                f"seed {seed} {name:12s} val {record['val_loss']:.4f} "
                f"({record['train_seconds']:.0f} s)",
                flush=True,
            )
        done.append(seed)
        # written after every seed: a run cut short keeps the seeds it finished
        data = {
            "command": "python scripts/moe_study.py" + (" --quick" if args.quick else ""),
            "config": config,
            "width": width,
            "arms": {name: {"options": o, "balance": b} for name, (o, b) in arms(width).items()},
            "training": {**training, "seeds": list(done)},
            "runs": runs,
            "paired": paired(runs, done),
            "throughput": speed,
        }
        _study.finish(args.out, data, begin, digits=5)
    return data


if __name__ == "__main__":
    main()
