"""Chapter 14's length-extrapolation study: one small GPT, five position settings.

The same character-level GPT (``d_model=64``, two layers, four heads) is trained on
the first 90 % of :func:`attention_course.data.python_docs` with windows of
``L = 64`` characters, once per ``pos`` setting ("learned", "sinusoidal", "rope",
"alibi", "none") and per seed, with the same batches for every setting. Each model is
then scored on the held-out 10 % in non-overlapping windows of ``L``, ``2L`` and
``4L`` characters, and the loss at every position of the ``4L`` windows is recorded.
Learned and sinusoidal positions are built with ``max_len = 4L`` so that they *can* be
evaluated at ``4L``: the learned rows beyond ``L`` receive no gradient (they keep their
random initial directions, only shrunk by AdamW's weight decay, which ``train.py`` applies
to the embeddings too), and the sinusoidal rows beyond ``L`` are fixed but unseen.

Run from the repository root (seeded; the committed results took 1245 s for the ten
models, and the sinusoidal rerun 249 s, with OMP_NUM_THREADS=1 on the course's 2-core
machine, shared with other jobs; more threads may be faster)::

    python scripts/position_study.py                     # one thread (--threads)
    python scripts/position_study.py --quick --out /tmp/study.json   # seconds
    python scripts/position_study.py --only sinusoidal   # retrain one setting, merge

``--only POS`` retrains just that setting (same config and seeds as the file already at
``--out``) and merges it into that file and its ``.pt``: the other settings' entries are
kept as they are, and ``reruns`` records which setting was retrained, in how many seconds,
why (``--reason``) and the per-seed ``loss_at`` it replaced. The committed sinusoidal
results come from such a rerun, after ``GPT(pos="sinusoidal")`` took Vaswani et al.'s
scaled token embeddings (see :class:`attention_course.GPT`).

``attention_course/assets/position_study.json`` holds the results the chapter
loads, and ``position_study.pt`` (next to it) the weights of the first seed's five
models in bfloat16 (``{"config": GPT kwargs without pos, "state_dicts": {pos: ...}}``). The
command line, the training run and the JSON's keys are the other studies'
(``scripts/_study.py``).
"""

from __future__ import annotations

import json

import _study
import torch
import torch.nn.functional as F

from attention_course import GPT

DEFAULT_OUT = _study.ROOT / "attention_course" / "assets" / "position_study.json"
POSITIONS = ("learned", "sinusoidal", "rope", "alibi", "none")
FULL = {
    "L": 64,
    "steps": 800,
    "batch_size": 32,
    "d_model": 64,
    "num_layers": 2,
    "num_heads": 4,
    "lr": 3e-3,
    "seeds": [0, 1],
    "eval_chars": 32768,
}
QUICK = {
    "L": 16,
    "steps": 3,
    "batch_size": 4,
    "d_model": 16,
    "num_layers": 1,
    "num_heads": 2,
    "lr": 3e-3,
    "seeds": [0],
    "eval_chars": 1024,
}


@torch.no_grad()
def per_position_loss(model: GPT, ids: torch.Tensor, length: int) -> torch.Tensor:
    """Cross-entropy at each position of non-overlapping windows of ``length`` tokens of
    ``ids`` (every window full), averaged over the windows: a ``(length,)`` tensor."""
    n = (ids.numel() - 1) // length
    x = ids[: n * length].view(n, length)
    y = ids[1 : n * length + 1].view(n, length)
    total = torch.zeros(length, dtype=torch.float64)
    for i in range(0, n, 64):
        logits = model(x[i : i + 64]).double()  # (b, length, V)
        loss = F.cross_entropy(
            logits.transpose(1, 2), y[i : i + 64], reduction="none"
        )  # (b, length)
        total += loss.sum(0)
    return total / n


def run(config: dict, progress: bool = True, positions=POSITIONS) -> dict:
    tok, train_ids, val_ids = _study.char_data()
    val_ids = val_ids[: config["eval_chars"] + 1]
    L = config["L"]
    lengths = [L, 2 * L, 4 * L]
    results, weights = {}, {}
    for pos in positions:
        runs = []
        for seed in config["seeds"]:
            _study.seed(seed)
            model = GPT(
                tok.vocab_size,
                d_model=config["d_model"],
                num_heads=config["num_heads"],
                num_layers=config["num_layers"],
                max_len=4 * L,
                pos=pos,
            )
            training = {**config, "context": L}
            history = _study.train(model, train_ids, None, training, seed, progress)
            if seed == config["seeds"][0]:
                weights[pos] = {k: v.to(torch.bfloat16) for k, v in model.state_dict().items()}
            curve = per_position_loss(model, val_ids, 4 * L)
            loss_at = {str(n): float(per_position_loss(model, val_ids, n).mean()) for n in lengths}
            runs.append(
                {
                    "seed": seed,
                    "loss_at": loss_at,
                    "curve": curve.tolist(),
                    "train_loss_last_step": history["train_loss"][-1],
                    "train_seconds": history["seconds"],
                }
            )
            print(
                f"{pos:10} seed {seed}: "
                + ", ".join(f"{n}: {loss_at[str(n)]:.3f}" for n in lengths)
                + f"  ({history['seconds']:.0f} s)"
            )
        results[pos] = runs
    return {
        "config": config,
        "vocab_size": tok.vocab_size,
        "lengths": lengths,
        "positions": list(POSITIONS),
        "results": results,
        "note": "losses in nats/char on the first eval_chars held-out characters",
    }, weights


def main(argv: list[str] | None = None) -> dict:
    parser = _study.parser(
        __doc__, DEFAULT_OUT, quick="a tiny run (seconds), for tests", progress=True
    )
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument(
        "--only",
        choices=POSITIONS,
        default=None,
        help="retrain only this setting, with the config of the file at --out, and merge",
    )
    parser.add_argument("--reason", default="", help="with --only: why it was retrained")
    args = parser.parse_args(argv)
    config = dict(QUICK if args.quick else FULL)
    if args.steps is not None:
        config["steps"] = args.steps
    old = None
    if args.only is not None:
        old = json.loads(args.out.read_text())
        config = old["config"]  # the same config and seeds as the results merged into
    start = _study.start(args)
    positions = POSITIONS if args.only is None else (args.only,)
    data, weights = run(config, progress=not args.no_progress, positions=positions)
    seconds = _study.seconds_since(start)
    if old is None:
        data["machine"] = _study.machine()
        data["seconds"] = seconds
    else:
        if data["vocab_size"] != old["vocab_size"]:
            raise SystemExit(f"--only: vocab_size {data['vocab_size']} != {old['vocab_size']}")
        replaced = [{"seed": r["seed"], "loss_at": r["loss_at"]} for r in old["results"][args.only]]
        old["results"][args.only] = data["results"][args.only]
        reruns = old.setdefault("reruns", [])
        reruns.append(
            {
                "pos": args.only,
                "seconds": seconds,
                "reason": args.reason,
                "replaced": replaced,
                "machine": _study.machine(),
            }
        )
        data = old

    _study.write(args.out, data, digits=5)
    model_config = {
        "vocab_size": data["vocab_size"],
        "d_model": config["d_model"],
        "num_heads": config["num_heads"],
        "num_layers": config["num_layers"],
        "max_len": 4 * config["L"],
    }
    if old is not None:
        saved = torch.load(args.out.with_suffix(".pt"), weights_only=True)
        if saved["config"] != model_config:
            raise SystemExit(f"--only: {saved['config']} != {model_config}")
        saved["state_dicts"][args.only] = weights[args.only]
        weights = saved["state_dicts"]
    torch.save({"config": model_config, "state_dicts": weights}, args.out.with_suffix(".pt"))
    print(f"the study took {seconds:.0f} s")
    return data


if __name__ == "__main__":
    main()
