"""Chapter 19's attention-sink study: where the attention goes, and what a window costs.

Three measurements, each on the held-out last 10 % of :func:`attention_course.data.python_docs`:

(a) ``first_token``: chapter 13's model (:func:`attention_course.load_gpt_checkpoint`,
    learned positions, ``max_len`` 128) on non-overlapping 128-character windows: the mean
    weight each layer and head puts on the window's first token (and first four), over the
    queries ``i >= from_query``, beside the uniform share ``1 / (i + 1)`` (resp.
    ``min(4, i + 1) / (i + 1)``) as a control: a head that spread its weight evenly over the
    keys it sees would give exactly that.
(b) ``decode``: chapter 14's shipped RoPE model (``attention_course/assets/position_study.pt``,
    ``state_dicts["rope"]``, trained on windows of ``L = 64``; RoPE, because its scores
    depend on distances only, so it can run at any position, which learned positions cannot)
    decodes ``length = 8 L`` characters one token at a time through three caches, beside
    full causal attention (one pass; distances up to ``8 L``): a plain sliding window of
    ``window`` keys (:class:`~attention_course.kv.RollingAttentionCache`), and StreamingLLM's
    ``num_sink`` first tokens plus a window of ``window - num_sink`` (the same number of keys), with
    positions numbered within the cache (Xiao et al., 2024, §3.2; ``streaming``) or kept
    absolute (``streaming_absolute``). The loss at every position, averaged over the
    sequences (in bins of ``bin`` positions), and per setting the mean over positions
    ``>= window`` with paired differences (95 % normal intervals over the sequences).
(c) ``learned_sinks``: the same small RoPE model trained twice per seed, without and with
    gpt-oss's learned sink logit (``GPT(sinks=True)``), same data, steps and seeds; each is
    then scored (c1) at the training length with full attention, a plain window of
    ``short_window`` keys and StreamingLLM's ``num_sink`` + ``short_window - num_sink``
    (positions ``>= short_window``), and (c2) decoded to ``8 L`` as in (b). "What the window
    costs" = plain window minus full attention (c1), plain window minus StreamingLLM (c2).

Run from the repository root (seeded; one thread; the committed results' ``seconds`` says
how long it took on the course's shared 2-core machine)::

    python scripts/sinks_study.py                                   # about 15 minutes
    python scripts/sinks_study.py --quick --out /tmp/sinks.json     # seconds, for tests

The results go to ``book/data/sinks_study.json`` (chapter 19 reads it); the command line,
the training run and the JSON's metadata are the other studies' (``scripts/_study.py``).
"""

from __future__ import annotations

import math
import sys

import _study
import torch
import torch.nn.functional as F

from attention_course import GPT, load_gpt_checkpoint
from attention_course.kv_cache import DecoderCache
from attention_course.sinks import StreamingAttentionCache

DEFAULT_OUT = _study.ROOT / "book" / "data" / "sinks_study.json"
FULL = {
    "first_token": {"windows": 256, "from_query": 16, "batch": 32},
    "decode": {"length": 512, "window": 64, "num_sink": 4, "sequences": 64, "bin": 8},
    "train": {
        "L": 64,
        "steps": 800,
        "batch_size": 32,
        "d_model": 64,
        "num_layers": 2,
        "num_heads": 4,
        "lr": 3e-3,
        "seeds": [0, 1],
    },
    "short": {"short_window": 16, "num_sink": 4, "windows": 512},
}
QUICK = {
    "first_token": {"windows": 4, "from_query": 4, "batch": 4},
    "decode": {"length": 32, "window": 8, "num_sink": 2, "sequences": 3, "bin": 4},
    "train": {
        "L": 16,
        "steps": 3,
        "batch_size": 4,
        "d_model": 16,
        "num_layers": 1,
        "num_heads": 2,
        "lr": 3e-3,
        "seeds": [0],
    },
    "short": {"short_window": 4, "num_sink": 1, "windows": 4},
}
SETTINGS = ("full", "window", "streaming", "streaming_absolute")


def interval(x: torch.Tensor) -> dict:
    """Mean of ``x (n,)`` with a 95 % normal interval (``mean ± 1.96 sd / sqrt(n)``)."""
    x = x.double()
    n = x.numel()
    half = 1.96 * float(x.std()) / math.sqrt(n) if n > 1 else float("nan")
    return {"mean": float(x.mean()), "ci95": half, "n": n}


def windows(ids: torch.Tensor, length: int, count: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The first ``count`` non-overlapping windows of ``length`` tokens and their targets."""
    n = min(count, (ids.numel() - 1) // length)
    x = ids[: n * length].view(n, length)
    y = ids[1 : n * length + 1].view(n, length)
    return x, y


# ------------------------------------------------------------------ (a) the first token
@torch.no_grad()
def first_token_share(model: GPT, x: torch.Tensor, from_query: int, batch: int) -> dict:
    """Mean attention weight on key 0 (and keys 0-3, and key 1) by layer and head, over the
    queries ``i >= from_query`` of the windows ``x``, with the uniform shares."""
    T = x.shape[1]
    on_first, on_four, on_second, per_window = [], [], [], []
    for b in range(0, x.shape[0], batch):
        _, weights = model(x[b : b + batch], return_attention=True)
        w = torch.stack(weights)[:, :, :, from_query:]  # (layers, b, H, T - q0, T)
        on_first.append(w[..., 0].sum(1))  # (layers, H, T - q0): summed over the windows
        on_four.append(w[..., :4].sum(-1).sum(1))
        on_second.append(w[..., 1].sum(1))
        per_window.append(w[..., 0].mean(dim=(2, 3)))  # (layers, b): per window
    n = x.shape[0]
    first = torch.stack(on_first).sum(0) / n  # (layers, H, T - q0)
    four = torch.stack(on_four).sum(0) / n
    second = torch.stack(on_second).sum(0) / n
    per_window = torch.cat(per_window, dim=1)  # (layers, n)
    i = torch.arange(from_query, T, dtype=torch.float64)
    uniform = (1 / (i + 1)).mean()
    uniform_four = (torch.clamp(i + 1, max=4) / (i + 1)).mean()
    return {
        "share_first": first.mean(-1).tolist(),  # (layers, H)
        "share_first4": four.mean(-1).tolist(),
        "share_second": second.mean(-1).tolist(),
        "uniform_first": float(uniform),
        "uniform_first4": float(uniform_four),
        "by_layer": [interval(per_window[layer]) for layer in range(per_window.shape[0])],
        "curve_first": first.mean(1).tolist(),  # (layers, T - q0): by query position
        "uniform_curve": (1 / (i + 1)).tolist(),
    }


# ------------------------------------------------------------------ (b) decoding far
def with_layout(model: GPT, **changes) -> GPT:
    """The same weights in a GPT whose config has ``changes`` (e.g. a window)."""
    other = GPT(**{**model.config(), **changes})
    other.load_state_dict(model.state_dict())
    return other.eval()


@torch.no_grad()
def decode_losses(model: GPT, x: torch.Tensor, y: torch.Tensor, setting: str, d: dict):
    """Per-sequence, per-position loss ``(n, length)`` of decoding ``x`` one token at a time
    with the cache of ``setting``."""
    W, ns = d["window"], d["num_sink"]
    if setting == "full":
        m, cache = with_layout(model), None
    elif setting == "window":
        m = with_layout(model, window=W)
        cache = m.new_cache()  # a RollingAttentionCache per layer
    elif setting == "streaming":  # positions within the cache (GPT.new_cache with RoPE)
        m = with_layout(model, window=W - ns, num_sink=ns)
        cache = m.new_cache()
    else:  # streaming_absolute: keys kept at their absolute positions
        m = with_layout(model, window=W - ns, num_sink=ns)
        layers = [StreamingAttentionCache(W - ns, ns) for _ in range(m.num_layers)]
        cache = DecoderCache(layers)
    if cache is None:
        logits = m(x)
    else:
        logits = torch.cat([m(x[:, t : t + 1], cache=cache) for t in range(x.shape[1])], dim=1)
    return F.cross_entropy(logits.double().transpose(1, 2), y, reduction="none")  # (n, length)


def decode_study(model: GPT, x, y, d: dict) -> dict:
    losses = {s: decode_losses(model, x, y, s, d) for s in SETTINGS}
    W, b = d["window"], d["bin"]
    far = {s: v[:, W:].mean(1) for s, v in losses.items()}  # (n,): per sequence, positions >= W
    curves = {s: v.mean(0).view(-1, b).mean(1).tolist() for s, v in losses.items()}
    return {
        "loss_far": {s: interval(v) for s, v in far.items()},
        "window_minus_streaming": interval(far["window"] - far["streaming"]),
        "absolute_minus_streaming": interval(far["streaming_absolute"] - far["streaming"]),
        "full_minus_streaming": interval(far["full"] - far["streaming"]),
        "loss_first_window": {s: float(v[:, :W].mean()) for s, v in losses.items()},
        "curves": curves,
    }


# ------------------------------------------------------------------ (c) learned sinks
@torch.no_grad()
def short_window_cost(model: GPT, x, y, s: dict) -> dict:
    """At the training length: full attention, a plain window of ``short_window`` keys,
    StreamingLLM with the same number of keys; losses at positions ``>= short_window``."""
    W, ns = s["short_window"], s["num_sink"]
    losses = {}
    for name, changes in (
        ("full", {}),
        ("window", {"window": W}),
        ("streaming", {"window": W - ns, "num_sink": ns}),
    ):
        logits = with_layout(model, **changes)(x)  # one full pass (absolute positions)
        loss = F.cross_entropy(logits.double().transpose(1, 2), y, reduction="none")
        losses[name] = loss[:, W:].mean(1)  # (n,)
    return {
        "loss": {k: interval(v) for k, v in losses.items()},
        "window_minus_full": interval(losses["window"] - losses["full"]),
        "streaming_minus_full": interval(losses["streaming"] - losses["full"]),
    }


def learned_sinks_study(tok, train_ids, val_ids, config: dict, progress: bool) -> list:
    t, d, s = config["train"], config["decode"], config["short"]
    L = t["L"]
    short_x, short_y = windows(val_ids, L, s["windows"])
    long_x, long_y = windows(val_ids, d["length"], d["sequences"])
    runs = []
    for seed in t["seeds"]:
        for sinks in (False, True):
            _study.seed(seed)
            model = GPT(
                tok.vocab_size,
                d_model=t["d_model"],
                num_heads=t["num_heads"],
                num_layers=t["num_layers"],
                max_len=L,
                pos="rope",
                sinks=sinks,
            )
            history = _study.train(model, train_ids, None, {**t, "context": L}, seed, progress)
            model.eval()
            share = first_token_share(model, short_x, s["short_window"], 64)
            run = {
                "seed": seed,
                "sinks": sinks,
                "train_seconds": history["seconds"],
                "train_loss_last_step": history["train_loss"][-1],
                "sink_logits": ([b.attn.sinks.tolist() for b in model.blocks] if sinks else None),
                "share_first": share["share_first"],
                "uniform_first": share["uniform_first"],
                "short": short_window_cost(model, short_x, short_y, s),
                "decode": decode_study(model, long_x, long_y, d),
            }
            runs.append(run)
            c1, c2 = run["short"]["window_minus_full"], run["decode"]["window_minus_streaming"]
            print(
                f"seed {seed} sinks={sinks}: full {run['short']['loss']['full']['mean']:.3f}, "
                f"window cost at L {c1['mean']:+.4f} ± {c1['ci95']:.4f}, "
                f"window - streaming at 8L {c2['mean']:+.4f} ± {c2['ci95']:.4f} "
                f"({history['seconds']:.0f} s)",
                flush=True,
            )
    return runs


def paired_over_seeds(runs: list) -> dict:
    """Per seed: the with-sink model's window cost minus the without-sink model's."""
    out = {}
    for key, path in (
        ("short_window_minus_full", ("short", "window_minus_full")),
        ("decode_window_minus_streaming", ("decode", "window_minus_streaming")),
    ):
        diffs = []
        for seed in sorted({r["seed"] for r in runs}):
            pair = {r["sinks"]: r for r in runs if r["seed"] == seed}
            cost = {k: pair[k][path[0]][path[1]]["mean"] for k in (False, True)}
            diffs.append({"seed": seed, "with_sink_minus_without": cost[True] - cost[False]})
        out[key] = diffs
    return out


def main(argv: list[str] | None = None) -> dict:
    parser = _study.parser(__doc__, DEFAULT_OUT, quick="tiny sizes, 3 steps", progress=True)
    args = parser.parse_args(argv)
    config = QUICK if args.quick else FULL
    begin = _study.start(args)
    tok, train_ids, val_ids = _study.char_data()

    # (a) chapter 13's model
    a = config["first_token"]
    gpt13 = load_gpt_checkpoint()
    x, _ = windows(val_ids, gpt13.max_len, a["windows"])
    first = {"windows": x.shape[0], "length": x.shape[1]}
    first.update(first_token_share(gpt13, x, a["from_query"], a["batch"]))
    print(
        "(a) share on the first token by layer:", [round(v["mean"], 3) for v in first["by_layer"]]
    )

    # (b) chapter 14's RoPE model, decoded to 8 L
    d = config["decode"]
    saved = torch.load(_study.ROOT / "attention_course/assets/position_study.pt", weights_only=True)
    rope = GPT(**saved["config"], pos="rope")
    rope.load_state_dict({k: v.float() for k, v in saved["state_dicts"]["rope"].items()})
    rope.eval()
    long_x, long_y = windows(val_ids, d["length"], d["sequences"])
    decode = decode_study(rope, long_x, long_y, d)
    far = decode["loss_far"]
    print("(b) loss at positions >= window:", {s: round(v["mean"], 3) for s, v in far.items()})

    # (c) learned sinks
    runs = learned_sinks_study(tok, train_ids, val_ids, config, progress=not args.no_progress)

    result = {
        "command": "python scripts/sinks_study.py "
        + " ".join(sys.argv[1:] if argv is None else argv),
        "config": config,
        "note": "losses in nats/char on held-out python_docs(); ci95: 1.96 sd / sqrt(n) over "
        "the sequences (windows), not over seeds",
        "first_token": first,
        "decode": {
            "model": "position_study.pt state_dicts['rope'] (chapter 14, trained at L = 64)",
            "sequences": long_x.shape[0],
            **decode,
        },
        "learned_sinks": {"runs": runs, "paired": paired_over_seeds(runs)},
    }
    return _study.finish(args.out, result, begin, digits=5)


if __name__ == "__main__":
    main()
