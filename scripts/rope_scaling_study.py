"""Chapter 19's study: chapter 14's RoPE model read at 2, 4 and 8 times its training length.

Chapter 14's shipped RoPE model (``attention_course/assets/position_study.pt``,
``state_dicts["rope"]``: the first seed's model, ``d_model=64``, two layers, four heads
of ``Dh = 16``, trained on windows of ``L = 64`` characters of
:func:`attention_course.data.python_docs`) is scored as chapter 14 scores it
(``position_study.per_position_loss``: the first ``eval_chars`` held-out characters in
non-overlapping windows) at ``L, 2L, 4L, 8L`` with four RoPE settings
(:func:`attention_course.rope_frequencies`):

- ``none``: plain RoPE, positions past ``L`` extrapolated;
- ``linear``: position interpolation (Chen et al., 2023);
- ``ntk``: NTK-aware scaling (bloc97, 2023);
- ``yarn``: YaRN (Peng et al., 2023) with ``original_max_len = L``, betas 32 and 1.

**Without fine-tuning** the factor is ``s = n / L`` at evaluation length ``n`` (no
scaling at ``n = L``, where all four are the same model). A 95 % interval for each
method's difference from ``none`` treats the windows as the sample (paired: the same
windows); it covers the text sampled, not training (the shipped model is one seed).

**With a short fine-tune at 2L**, for each setting and each seed: the shipped weights,
``steps`` AdamW steps on windows of ``2L`` with the setting at ``s = 2`` (``none``:
no scaling, fine-tuned at 2L as it is), the same batches for every setting (the seed
draws them), then the same evaluation with the factor it was fine-tuned with
(``s = 2`` at every length), and, past ``2L``, with ``s = n / L`` again
(``loss_at_rescaled``). Differences from ``none`` are paired by seed (same batches)
with a t interval over the seeds. A control, ``none_at_L``, fine-tunes without scaling
on windows of ``L`` (same steps, same tokens per step): the shipped model is not
trained to convergence, so part of any fine-tune's gain is just more training.

ALiBi's curve: chapter 14's shipped ALiBi model (``state_dicts["alibi"]``, the same
seed) scored the same way at every length, and chapter 14's JSON means (two seeds) at
``L, 2L, 4L`` beside it.

Run from the repository root (seeded; the committed results' seconds are in the JSON,
one thread on the course's shared 2-core machine)::

    python scripts/rope_scaling_study.py                          # one thread (--threads)
    python scripts/rope_scaling_study.py --quick --out /tmp/r.json  # seconds

Results: ``book/data/rope_scaling.json`` (losses in nats/char), which
``book/19_longer_than_trained.ipynb`` loads.
"""

from __future__ import annotations

import json
import math
import sys

import _study
import torch
from position_study import per_position_loss

from attention_course import GPT

DEFAULT_OUT = _study.ROOT / "book" / "data" / "rope_scaling.json"
ASSET = _study.ROOT / "attention_course" / "assets" / "position_study.pt"
CHAPTER14 = _study.ROOT / "attention_course" / "assets" / "position_study.json"
METHODS = ("none", "linear", "ntk", "yarn")
CONTROL = "none_at_L"  # fine-tuned at L, not 2L: what more training alone does
FULL = {
    "L": 64,
    "lengths": [64, 128, 256, 512],
    "eval_chars": 32768,
    "finetune": {"context": 128, "factor": 2, "steps": 200, "batch_size": 16, "lr": 1e-3},
    "seeds": [0, 1, 2],
}
QUICK = {
    "L": 64,
    "lengths": [64, 128],
    "eval_chars": 1024,
    "finetune": {"context": 128, "factor": 2, "steps": 2, "batch_size": 2, "lr": 1e-3},
    "seeds": [0],
}
# two-sided 95 % Student t quantiles by degrees of freedom (scipy is not a dependency)
T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306}


def scaling_for(method: str, factor: float, L: int) -> dict | None:
    """The ``rope_scaling`` dict of ``method`` at factor ``s`` (None when ``s <= 1`` or
    for ``"none"``)."""
    if method == "none" or factor <= 1:
        return None
    if method == "yarn":
        return {"type": "yarn", "factor": float(factor), "original_max_len": L}
    return {"type": method, "factor": float(factor)}


def load_model(pos: str, rope_scaling: dict | None = None, state: dict | None = None) -> GPT:
    """Chapter 14's shipped model for ``pos`` (float32, eval mode), with ``rope_scaling``;
    ``state``: other weights of the same shape (a fine-tuned copy)."""
    saved = torch.load(ASSET, weights_only=True)
    config = {**saved["config"], "max_len": 8 * saved["config"]["max_len"], "pos": pos}
    model = GPT(**config, rope_scaling=rope_scaling)
    if state is None:
        state = {k: v.float() for k, v in saved["state_dicts"][pos].items()}
    model.load_state_dict(state)
    return model.eval()


@torch.no_grad()
def window_losses(model: GPT, ids: torch.Tensor, length: int) -> torch.Tensor:
    """Mean cross-entropy of each non-overlapping window of ``length`` tokens: ``(n,)``."""
    n = (ids.numel() - 1) // length
    x = ids[: n * length].view(n, length)
    y = ids[1 : n * length + 1].view(n, length)
    out = []
    for i in range(0, n, 64):
        logits = model(x[i : i + 64]).double()  # (b, length, V)
        loss = torch.nn.functional.cross_entropy(
            logits.transpose(1, 2), y[i : i + 64], reduction="none"
        )
        out.append(loss.mean(1))
    return torch.cat(out)


def interval(diffs: list[float]) -> dict:
    """Mean of paired differences and its 95 % t interval (n >= 2), else the mean alone."""
    n = len(diffs)
    mean = sum(diffs) / n
    if n < 2:
        return {"mean": mean, "n": n}
    sd = math.sqrt(sum((d - mean) ** 2 for d in diffs) / (n - 1))
    half = (T975[n - 1] if n - 1 in T975 else 1.96) * sd / math.sqrt(n)
    return {"mean": mean, "low": mean - half, "high": mean + half, "n": n}


def no_finetune(config: dict, val_ids: torch.Tensor) -> dict:
    L, lengths = config["L"], config["lengths"]
    loss_at, curves, diff_to_none = {}, {}, {}
    per_window = {}
    for method in METHODS:
        loss_at[method], per_window[method] = {}, {}
        for n in lengths:
            model = load_model("rope", scaling_for(method, n / L, L))
            w = window_losses(model, val_ids, n)
            per_window[method][n] = w
            loss_at[method][str(n)] = float(w.mean())
            if n == lengths[-1]:
                curves[method] = per_position_loss(model, val_ids, n).tolist()
        print(
            f"no fine-tune {method:7}: "
            + ", ".join(f"{n}: {loss_at[method][str(n)]:.3f}" for n in lengths)
        )
    for method in METHODS[1:]:
        diff_to_none[method] = {}
        for n in lengths:
            d = (per_window[method][n] - per_window["none"][n]).tolist()
            diff_to_none[method][str(n)] = interval(d) if n != L else {"mean": 0.0, "n": len(d)}
    return {
        "factor_rule": "s = n / L at evaluation length n (no scaling at n = L)",
        "loss_at": loss_at,
        "curve_at": lengths[-1],
        "curves": curves,
        "diff_to_none": diff_to_none,
        "interval_note": "95 % t interval over the evaluation windows (paired), one model",
    }


def alibi(config: dict, val_ids: torch.Tensor) -> dict:
    model = load_model("alibi")
    lengths = config["lengths"]
    loss_at = {str(n): float(per_position_loss(model, val_ids, n).mean()) for n in lengths}
    curve = per_position_loss(model, val_ids, lengths[-1]).tolist()
    chapter14 = json.loads(CHAPTER14.read_text())
    ch14 = {
        pos: {
            n: sum(r["loss_at"][n] for r in chapter14["results"][pos])
            / len(chapter14["results"][pos])
            for n in chapter14["results"][pos][0]["loss_at"]
        }
        for pos in ("rope", "alibi")
    }
    print("alibi (shipped weights): " + ", ".join(f"{n}: {v:.3f}" for n, v in loss_at.items()))
    return {
        "loss_at": loss_at,
        "curve": curve,
        "chapter14_mean_loss_at": ch14,
        "chapter14_seeds": [r["seed"] for r in chapter14["results"]["alibi"]],
    }


def finetune(config: dict, train_ids, val_ids, progress: bool) -> dict:
    L, lengths, ft = config["L"], config["lengths"], config["finetune"]
    runs = []
    ratio = ft["context"] // L
    for seed in config["seeds"]:
        for method in (*METHODS, CONTROL):
            scaling = None if method == CONTROL else scaling_for(method, ft["factor"], L)
            model = load_model("rope", scaling)
            _study.seed(seed)
            training = {k: ft[k] for k in ("steps", "batch_size", "context", "lr")}
            if method == CONTROL:  # the same tokens per step, in windows of L
                training.update(context=L, batch_size=ft["batch_size"] * ratio)
            history = _study.train(model, train_ids, None, training, seed, progress)
            loss_at = {str(n): float(window_losses(model, val_ids, n).mean()) for n in lengths}
            rescaled = {}
            if method not in ("none", CONTROL):  # s = n / L past the fine-tuning length
                for n in (n for n in lengths if n > ft["context"]):
                    again = load_model("rope", scaling_for(method, n / L, L), model.state_dict())
                    rescaled[str(n)] = float(window_losses(again, val_ids, n).mean())
            runs.append(
                {
                    "method": method,
                    "seed": seed,
                    "scaling": scaling,
                    "context": training["context"],
                    "loss_at": loss_at,
                    "loss_at_rescaled": rescaled,
                    "train_loss_last_step": history["train_loss"][-1],
                    "train_seconds": history["seconds"],
                }
            )
            print(
                f"fine-tuned seed {seed} {method:7}: "
                + ", ".join(f"{n}: {loss_at[str(n)]:.3f}" for n in lengths)
                + f"  ({history['seconds']:.0f} s)"
            )
    mean_loss_at, diff_to_none = {}, {}
    for method in (*METHODS, CONTROL):
        mine = [r for r in runs if r["method"] == method]
        mean_loss_at[method] = {
            str(n): sum(r["loss_at"][str(n)] for r in mine) / len(mine) for n in lengths
        }
        if method == "none":
            continue
        base = {r["seed"]: r for r in runs if r["method"] == "none"}
        diff_to_none[method] = {
            str(n): interval(
                [r["loss_at"][str(n)] - base[r["seed"]]["loss_at"][str(n)] for r in mine]
            )
            for n in lengths
        }
    return {
        "factor_rule": f"s = {ft['factor']} (the fine-tuning factor) at every length; "
        "loss_at_rescaled: s = n / L past the fine-tuning length",
        "control": f"{CONTROL}: no scaling, fine-tuned on windows of L (same steps, same "
        "tokens per step): what the extra training alone does",
        "runs": runs,
        "mean_loss_at": mean_loss_at,
        "diff_to_none": diff_to_none,
        "interval_note": "95 % t interval over the seeds, paired (same batches for every method)",
    }


def main(argv: list[str] | None = None) -> dict:
    parser = _study.parser(__doc__, DEFAULT_OUT, quick="a tiny evaluation, 2 steps", progress=True)
    args = parser.parse_args(argv)
    command = " ".join(
        ["python", "scripts/rope_scaling_study.py", *(sys.argv[1:] if argv is None else argv)]
    )
    config = json.loads(json.dumps(QUICK if args.quick else FULL))
    start = _study.start(args)
    tok, train_ids, val_ids = _study.char_data()
    val_ids = val_ids[: config["eval_chars"] + 1]
    saved = torch.load(ASSET, weights_only=True)
    if saved["config"]["vocab_size"] != tok.vocab_size:
        raise SystemExit(f"{ASSET}: vocab_size {saved['config']['vocab_size']} != {tok.vocab_size}")
    result = {
        "command": command,
        "config": config,
        "model": {
            "asset": "attention_course/assets/position_study.pt",
            "state_dict": "rope (alibi for ALiBi): chapter 14's first seed",
            **saved["config"],
        },
        "methods": list(METHODS),
        "no_finetune": no_finetune(config, val_ids),
        "alibi": alibi(config, val_ids),
        "finetuned": finetune(config, train_ids, val_ids, progress=not args.no_progress),
        "note": "losses in nats/char on the first eval_chars held-out characters",
    }
    data = _study.finish(args.out, result, start, digits=5)
    print(f"the study took {data['seconds']:.0f} s")
    return data


if __name__ == "__main__":
    main()
