"""Chapter 22's study: multi-query associative recall with softmax attention, linear attention,
the delta rule and the gated delta rule as the token mixer, as the number of pairs grows.

Run from the repository root (seeded; one thread per run; the JSON records the seconds)::

    python scripts/recall_study.py --workers 2                    # the committed run
    python scripts/recall_study.py --quick --out /tmp/recall.json  # a smoke test (seconds)

``--workers`` only sets how many runs go at once (each run is seeded and single-threaded,
so its numbers do not depend on it).

The task is multi-query associative recall (MQAR; Arora et al., 2023, "Zoology: Measuring and
Improving Recall in Efficient Language Models", arXiv:2312.04927), in a simplified layout: a
sequence of ``N`` key-value pairs (``N`` distinct keys out of ``num_keys``, values drawn out of
``num_values``), then ``Q`` queries, each one of the ``N`` keys (drawn with replacement). A
pair is ONE position whose embedding is ``E_key[k] + E_value[v]``; a query is one position
``E_key[k] + e_query``. The model must output, at each query position, the value stored under
that key (cross-entropy on the query positions only). Folding a pair into one position removes
the "look at the previous token" step of Zoology's layout (which needs positions or a short
convolution), so that the only thing measured is whether the mixer can store ``N``
associations and read them back.

The model (``RecallModel``): the embeddings, then ``num_layers`` pre-norm blocks
``x + mixer(RMSNorm(x))``, ``x + SwiGLU(RMSNorm(x))``, then RMSNorm and a linear read-out to
the values. No positional information (the pairs are a set). Only the token mixer differs
between the arms, and inside the mixer the same bias-free ``w_q, w_k, w_v, w_o``
(``d_model x d_model`` each, ``num_heads`` heads of ``Dh = d_model / num_heads``):

- ``softmax``: causal softmax attention (``F.scaled_dot_product_attention``); its memory of
  the past is every key and value (a cache growing with ``T``);
- ``linear``: :func:`attention_course.linear_attention` (``phi = elu + 1``, causal; Katharopoulos
  et al., 2020); a state of ``Dk x Dv`` (+ the ``Dk`` normaliser) per head;
- ``delta``: the delta rule (Schlag et al., 2021), i.e. :func:`attention_course.gated_delta_rule`
  with ``g = 0`` (no decay), ``beta = sigmoid(w_beta x)``;
- ``gated_delta``: :func:`attention_course.gated_delta_rule` (Yang et al., 2024) with the same
  ``beta`` and a learnt decay ``a = exp(g)``, ``g = -softplus(w_g x)``.

PROTOCOL (written before the reported runs; every setup choice is the same for every arm where
it makes sense, and none was tuned on one arm):

1. The two delta arms share everything but ``g``: ``w_beta`` (and ``w_g``) are one extra
   ``nn.Linear(d_model, H)`` (``2 H`` for the gated arm) with bias; the bias of ``beta`` starts
   at 0 (``beta`` about 0.5). Both l2-normalise ``q`` and ``k`` (as Qwen3-Next; the delta rule
   needs unit keys for ``beta <= 1`` to keep the update stable; linear attention's ``elu + 1``
   does not, so it gets none, as in Katharopoulos et al.). Both run chunked (``chunk_size``
   16; the same result as the recurrence to 1e-5). Both multiply the rule's output by
   ``sqrt(Dh)``, undoing the function's ``1/sqrt(Dk)``: with unit ``q`` and ``k`` the read
   ``S^T q`` of a stored pair is the value itself, so the output is then on the scale of the
   values, as softmax attention's and linear attention's outputs are (weighted averages of the
   values). Qwen3-Next keeps ``1/sqrt(Dk)`` but follows the rule with a (gated) RMSNorm, which
   removes any scale; these bare arms have no such norm. (The earlier version applied this to
   the gated arm only, after a one-seed trial; here it is a rule for both delta arms.)
2. The gated arm's ``g`` bias starts at -7: ``a = exp(-softplus(-7)) = 0.9991`` per token,
   ``a^144 = 0.88`` over the longest sequence, so the gated arm starts close to the delta arm
   and any faster decay is learnt, not imposed. (The earlier version's -5, ``a^128 = 0.42``, was
   picked in a one-seed trial on that arm alone; it is dropped.)
3. Learning rate per arm: each arm is trained at every ``lr`` of ``lr_grid`` on the SELECTION
   seed (not a reported seed) and scored on a validation set (sequences from a generator of
   its own, not the reported evaluation sequences); the arm's ``lr`` is the one with the
   highest validation accuracy averaged over the grid of ``N`` (a tie: the smaller ``lr``).
   Fixed in advance; the grid results are recorded (``selection``).
4. Then every arm is trained on every reported seed at its chosen ``lr``. Every run is
   reported and counted, whatever it does: a run whose mean training loss over the last 50
   steps stays above ``ln(num_values) - 0.05`` is flagged ``learnt: false`` (it never left
   chance), never dropped.
5. For the two delta arms, the learnt ``beta`` and decay ``a = exp(g)`` on the evaluation
   sequences (pair and query positions, per layer): mean and the 10/50/90 % quantiles
   (``gates``; ``a`` is 1 by construction in the delta arm).

Each run is trained from scratch with AdamW (weight decay 0.01, linear warm-up over the first
tenth, gradient norm clipped at 1) on freshly drawn batches (the same batches for every arm of
a seed), the number of pairs drawn at every step from the whole grid (as Zoology trains on a
mix of sizes: an earlier version that trained one model per ``N`` for 800 steps left several
arm-``N`` cells at chance), then scored at every ``N`` on ``eval_sequences`` held-out
sequences (the same for every arm): ``accuracy`` is the share of query positions whose arg-max
is the right value (chance: ``1 / num_values``). ``paired``: per ``N``, the per-seed
difference of accuracy between two arms over ALL reported seeds (failed runs included), with
its mean and a 95 % Student-t interval.

EXTENSION (POST HOC, decided after a reader saw the pre-registered run: both delta arms chose
the grid's largest ``lr``, 1e-2, with the selection accuracy still rising)::

    python scripts/recall_study.py --extend-lr 0.03 --workers 2

leaves every pre-registered field of the JSON as it is and adds an entry named
``delta_lr_extension`` to ``additions`` (a later run's entries, each with its ``seconds``):
the delta arms only (softmax and linear attention chose an interior ``lr``) are trained on the
selection seed at the extra rates; the same rule (3.) is applied to the union of the
original and the extra rates; an arm whose choice moves is retrained on every reported seed
at its new ``lr`` (``runs``), and ``paired`` is recomputed with those runs in place of its
pre-registered ones (the other arms' runs are the pre-registered ones).
"""

from __future__ import annotations

import json
import math
import time
from concurrent.futures import ProcessPoolExecutor

import _study
import torch
import torch.nn as nn
import torch.nn.functional as F

from attention_course import RMSNorm, SwiGLU, count_parameters, gated_delta_rule, linear_attention

DEFAULT_OUT = _study.ROOT / "book" / "data" / "recall_study.json"
CONFIG = {"d_model": 32, "num_heads": 1, "num_layers": 2, "d_ff": 64}
TASK = {"num_keys": 256, "num_values": 64, "queries": 16, "pairs": [8, 16, 32, 64, 128]}
TRAINING = {
    "steps": 1200,
    "batch_size": 32,
    "lr_grid": [1e-3, 3e-3, 1e-2],
    "eval_sequences": 512,
    "chunk_size": 16,
    "g_bias_init": -7.0,
}
SEEDS = (0, 1, 2, 3)
SELECTION_SEED = 100
QUICK_SEEDS = (0, 1)
QUICK_CONFIG = {"d_model": 16, "num_heads": 1, "num_layers": 1, "d_ff": 32}
QUICK_TASK = {"num_keys": 32, "num_values": 8, "queries": 4, "pairs": [4, 8]}
QUICK_TRAINING = {
    **TRAINING,
    "steps": 3,
    "batch_size": 4,
    "eval_sequences": 8,
    "lr_grid": [1e-3, 1e-2],
}
ARMS = ("softmax", "linear", "delta", "gated_delta")
DELTA_ARMS = ("delta", "gated_delta")
PAIRS = (("delta", "linear"), ("gated_delta", "delta"), ("gated_delta", "linear"))
T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571}
QUANTILES = (0.1, 0.5, 0.9)
EXTENSION = "delta_lr_extension"  # the name of the post hoc extension in ``additions``
EVAL_BASE, VALIDATION_BASE = 10_000, 20_000  # generators of the reported / selection sets


def recall_batch(batch: int, pairs: int, task: dict, gen: torch.Generator):
    """``batch`` sequences of ``pairs`` key-value pairs then ``task["queries"]`` queries.

    Returns ``keys (B, T)``, ``values (B, T)`` (the value of a pair position; ``-1`` at the
    query positions), ``is_query (B, T)`` bool and ``targets (B, Q)``, ``T = pairs + Q``."""
    Q = task["queries"]
    keys = torch.rand(batch, task["num_keys"], generator=gen).argsort(dim=-1)[:, :pairs]
    values = torch.randint(task["num_values"], (batch, pairs), generator=gen)
    pick = torch.randint(pairs, (batch, Q), generator=gen)  # which pair each query asks
    query_keys = keys.gather(1, pick)
    targets = values.gather(1, pick)
    all_keys = torch.cat([keys, query_keys], dim=1)
    all_values = torch.cat([values, torch.full((batch, Q), -1)], dim=1)
    is_query = torch.zeros(batch, pairs + Q, dtype=torch.bool)
    is_query[:, pairs:] = True
    return all_keys, all_values, is_query, targets


class Mixer(nn.Module):
    """The token mixer: the same ``w_q, w_k, w_v, w_o`` for every arm; ``kind`` decides what
    mixes the positions. Shapes: ``x (B, T, D) -> (B, T, D)``. With ``record = True`` a delta
    arm keeps its last ``beta`` and ``g`` (``(B, T, H)`` each) in ``self.gates``."""

    def __init__(
        self, kind: str, d_model: int, num_heads: int, chunk_size: int, g_bias_init: float = -7.0
    ):
        super().__init__()
        self.kind, self.num_heads, self.chunk_size = kind, num_heads, chunk_size
        self.w_q, self.w_k, self.w_v, self.w_o = (
            nn.Linear(d_model, d_model, bias=False) for _ in range(4)
        )
        self.record, self.gates = False, None
        if kind in DELTA_ARMS:  # beta (and g), per head; beta's bias starts at 0
            self.w_gate = nn.Linear(d_model, (2 if kind == "gated_delta" else 1) * num_heads)
            nn.init.zeros_(self.w_gate.bias)
            if kind == "gated_delta":  # a = e^{-softplus(-7)} ~ 0.9991: start near the delta rule
                with torch.no_grad():
                    self.w_gate.bias[num_heads:] = g_bias_init

    def forward(self, x):
        B, T, D = x.shape
        H = self.num_heads
        # (B, T, H, Dh): the gated delta rule's layout; the others take (B, H, T, Dh)
        q, k, v = (w(x).view(B, T, H, D // H) for w in (self.w_q, self.w_k, self.w_v))
        if self.kind in DELTA_ARMS:
            gate = self.w_gate(x)  # (B, T, H) or (B, T, 2H)
            beta = torch.sigmoid(gate[..., :H])
            g = -F.softplus(gate[..., H:]) if self.kind == "gated_delta" else torch.zeros_like(beta)
            if self.record:
                self.gates = (beta.detach(), g.detach())
            out, _ = gated_delta_rule(
                F.normalize(q, dim=-1),
                F.normalize(k, dim=-1),
                v,
                g=g,
                beta=beta,
                chunk_size=self.chunk_size,
            )  # (B, T, H, Dh)
            out = out * math.sqrt(D // H)  # undo the 1/sqrt(Dk): a stored pair reads back v
        else:
            q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # (B, H, T, Dh)
            if self.kind == "softmax":
                out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            else:
                out = linear_attention(q, k, v, causal=True)
            out = out.transpose(1, 2)  # (B, T, H, Dh)
        return self.w_o(out.reshape(B, T, D))


class RecallModel(nn.Module):
    """Embeddings, pre-norm blocks (mixer, SwiGLU), read-out to the values."""

    def __init__(self, kind: str, config: dict, task: dict, chunk_size: int, g_bias_init=-7.0):
        super().__init__()
        D = config["d_model"]
        self.key_embedding = nn.Embedding(task["num_keys"], D)
        self.value_embedding = nn.Embedding(task["num_values"], D)
        self.query_marker = nn.Parameter(torch.randn(D) * 0.02)
        self.blocks = nn.ModuleList()
        for _ in range(config["num_layers"]):
            self.blocks.append(
                nn.ModuleList(
                    [
                        RMSNorm(D),
                        Mixer(kind, D, config["num_heads"], chunk_size, g_bias_init),
                        RMSNorm(D),
                        SwiGLU(D, config["d_ff"]),
                    ]
                )
            )
        self.norm = RMSNorm(D)
        self.head = nn.Linear(D, task["num_values"], bias=False)

    def forward(self, keys, values, is_query):
        x = self.key_embedding(keys)  # (B, T, D)
        pair_part = self.value_embedding(values.clamp_min(0))
        x = x + torch.where(is_query[..., None], self.query_marker, pair_part)
        for norm1, mixer, norm2, ffn in self.blocks:
            x = x + mixer(norm1(x))
            x = x + ffn(norm2(x))
        return self.head(self.norm(x))  # (B, T, num_values)


def query_logits(model, keys, values, is_query):
    logits = model(keys, values, is_query)
    return logits[is_query].view(keys.shape[0], -1, logits.shape[-1])  # (B, Q, V)


def _summary(values: torch.Tensor) -> dict:
    """Mean and the 10/50/90 % quantiles of a 1-D tensor."""
    qs = torch.quantile(values.double(), torch.tensor(QUANTILES, dtype=torch.float64))
    return {
        "mean": float(values.double().mean()),
        **{f"q{round(100 * q)}": float(v) for q, v in zip(QUANTILES, qs)},
    }


def score(model, task, training, pairs: int, base: int) -> tuple[float, list | None]:
    """Accuracy at ``pairs`` on ``eval_sequences`` sequences drawn from the generator seeded
    ``base + pairs``; for a delta arm also the per-layer ``beta`` / ``a`` summaries."""
    eval_gen = torch.Generator().manual_seed(base + pairs)
    mixers = [block[1] for block in model.blocks]
    delta = mixers[0].kind in DELTA_ARMS
    for m in mixers:
        m.record = delta
    betas, decays = [[] for _ in mixers], [[] for _ in mixers]
    correct = total = 0
    with torch.no_grad():
        for start in range(0, training["eval_sequences"], 128):
            n = min(128, training["eval_sequences"] - start)
            keys, values, is_query, targets = recall_batch(n, pairs, task, eval_gen)
            predicted = query_logits(model, keys, values, is_query).argmax(dim=-1)
            correct += int((predicted == targets).sum())
            total += targets.numel()
            if delta:
                for i, m in enumerate(mixers):
                    beta, g = m.gates
                    betas[i].append(beta.flatten())
                    decays[i].append(g.exp().flatten())
    for m in mixers:
        m.record, m.gates = False, None
    gates = None
    if delta:
        gates = [
            {"layer": i, "beta": _summary(torch.cat(b)), "decay": _summary(torch.cat(a))}
            for i, (b, a) in enumerate(zip(betas, decays))
        ]
    return correct / total, gates


def train_and_score(kind, config, task, training, seed, lr, base=EVAL_BASE) -> list[dict]:
    """Train one model with mixer ``kind`` at learning rate ``lr`` on batches whose number of
    pairs is drawn, per step, uniformly from ``task["pairs"]``; then score it at every ``N``
    of the grid on the sequences of generator ``base + N``. One record per ``N`` (the
    training figures are the run's, the same in each)."""
    torch.set_num_threads(1)
    _study.seed(seed)
    model = RecallModel(kind, config, task, training["chunk_size"], training["g_bias_init"])
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    steps, grid = training["steps"], task["pairs"]
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda i: min(1.0, (i + 1) / max(1, steps // 10))
    )
    gen = torch.Generator().manual_seed(1000 + seed)  # the same batches for every arm
    losses = []
    begin = time.perf_counter()
    model.train()
    for _ in range(steps):
        pairs = grid[int(torch.randint(len(grid), (1,), generator=gen))]
        keys, values, is_query, targets = recall_batch(training["batch_size"], pairs, task, gen)
        logits = query_logits(model, keys, values, is_query)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        losses.append(loss.item())
    train_seconds = time.perf_counter() - begin
    model.eval()
    last = losses[-50:]
    loss_last50 = sum(last) / len(last)
    records = []
    for pairs in grid:
        accuracy, gates = score(model, task, training, pairs, base)
        record = {
            "arm": kind,
            "pairs": pairs,
            "seed": seed,
            "lr": lr,
            "accuracy": accuracy,
            "train_loss_last50": loss_last50,
            "learnt": loss_last50 < math.log(task["num_values"]) - 0.05,
            "parameters": count_parameters(model),
            "train_seconds": train_seconds,
        }
        if gates is not None:
            record["gates"] = gates
        records.append(record)
    return records


def paired(runs: list[dict], pairs_grid, seeds) -> list[dict]:
    """Per N and pair of arms: the per-seed accuracy differences (every seed, failed runs
    included), mean, 95 % t interval."""
    table = {(r["arm"], r["pairs"], r["seed"]): r["accuracy"] for r in runs}
    result = []
    for a, b in PAIRS:
        for n in pairs_grid:
            diffs = [table[a, n, s] - table[b, n, s] for s in seeds if (a, n, s) in table]
            if len(diffs) != len(seeds):
                continue
            mean = sum(diffs) / len(diffs)
            if len(diffs) > 1:
                sd = math.sqrt(sum((d - mean) ** 2 for d in diffs) / (len(diffs) - 1))
                half = T95.get(len(diffs) - 1, 2.0) * sd / math.sqrt(len(diffs))
            else:
                half = math.inf
            result.append(
                {
                    "arm": a,
                    "minus": b,
                    "pairs": n,
                    "differences": diffs,
                    "mean": mean,
                    "ci95": [mean - half, mean + half],
                }
            )
    return result


def select_lr(selection: list[dict], arms=ARMS) -> dict:
    """Per arm, the ``lr`` whose validation accuracy averaged over ``N`` is highest (a tie:
    the smaller ``lr``)."""
    chosen = {}
    for arm in arms:
        by_lr = {}
        for r in selection:
            if r["arm"] == arm:
                by_lr.setdefault(r["lr"], []).append(r["accuracy"])
        means = {lr: sum(a) / len(a) for lr, a in by_lr.items()}
        chosen[arm] = min(means, key=lambda lr: (-round(means[lr], 10), lr))
    return chosen


def _show(records: list[dict]) -> list[dict]:
    r = records[0]
    accuracies = " ".join(f"{x['pairs']}:{x['accuracy']:.3f}" for x in records)
    print(
        f"seed {r['seed']} {r['arm']:12s} lr {r['lr']:.0e} acc {accuracies} loss "
        f"{r['train_loss_last50']:.3f} ({r['train_seconds']:.1f} s)",
        flush=True,
    )
    return records


def _run_all(jobs, workers: int):
    """``train_and_score(*job)`` for every job, ``workers`` at a time: yields each job's
    records in the order of ``jobs`` (printed as they come)."""
    if workers <= 1:
        for job in jobs:
            yield _show(train_and_score(*job))
        return
    with ProcessPoolExecutor(max_workers=workers) as pool:
        futures = [pool.submit(train_and_score, *job) for job in jobs]
        for future in futures:
            yield _show(future.result())


def main(argv: list[str] | None = None) -> None:
    parser = _study.parser(__doc__, DEFAULT_OUT, quick="tiny sizes, a few seconds")
    parser.add_argument("--workers", type=int, default=1, help="runs at once (default 1)")
    parser.add_argument(
        "--extend-lr",
        type=float,
        nargs="+",
        help="post hoc: add these lr to the delta arms' grid in the JSON at --out (see EXTENSION)",
    )
    args = parser.parse_args(argv)
    if args.extend_lr:
        extend(args)
        return
    begin = _study.start(args)
    config, task, training = (
        (QUICK_CONFIG, QUICK_TASK, QUICK_TRAINING) if args.quick else (CONFIG, TASK, TRAINING)
    )
    seeds = QUICK_SEEDS if args.quick else SEEDS
    command = "python scripts/recall_study.py" + (" --quick" if args.quick else "")
    if args.workers > 1:
        command += f" --workers {args.workers}"
    D, H = config["d_model"], config["num_heads"]
    data = {
        "command": command,
        "config": config,
        "task": task,
        "training": {**training, "seeds": list(seeds), "selection_seed": SELECTION_SEED},
        "state_size": {"Dk": D // H, "Dv": D // H, "heads": H, "layers": config["num_layers"]},
        "chance": 1 / task["num_values"],
    }
    # 1. the learning rate of each arm, on the selection seed and the validation sequences
    jobs = [
        (kind, config, task, training, SELECTION_SEED, lr, VALIDATION_BASE)
        for kind in ARMS
        for lr in training["lr_grid"]
    ]
    selection = [r for records in _run_all(jobs, args.workers) for r in records]
    for r in selection:
        r.pop("gates", None)  # the gates are recorded for the reported runs
    chosen = select_lr(selection)
    print("chosen lr:", chosen, flush=True)
    data["selection"] = selection
    data["chosen_lr"] = chosen
    # 2. every reported seed at each arm's chosen lr, on the held-out evaluation sequences
    # (seed-major; the file is written after each whole seed, so a run cut short keeps them)
    jobs = [(kind, config, task, training, s, chosen[kind]) for s in seeds for kind in ARMS]
    data["runs"] = []
    for records in _run_all(jobs, args.workers):
        data["runs"].extend(records)
        done = sorted({r["seed"] for r in data["runs"]})
        if len(data["runs"]) % (len(ARMS) * len(task["pairs"])) == 0:
            data["training"]["seeds"] = done
            data["paired"] = paired(data["runs"], task["pairs"], done)
            _study.finish(args.out, data, begin, digits=4)


def extend(args) -> None:
    """The post hoc extension of the delta arms' ``lr`` grid (see EXTENSION in the docstring):
    reads the JSON at ``args.out``, leaves its fields as they are, and adds (or replaces) the
    ``additions`` entry named ``delta_lr_extension``."""
    begin = _study.start(args)
    data = json.loads(args.out.read_text())
    config, task = data["config"], data["task"]
    training = {k: v for k, v in data["training"].items() if k not in ("seeds", "selection_seed")}
    seeds, selection_seed = data["training"]["seeds"], data["training"]["selection_seed"]
    extra = [lr for lr in args.extend_lr if lr not in training["lr_grid"]]
    command = "python scripts/recall_study.py" + (
        " --quick" if "--quick" in data["command"] else ""
    )
    command += " --extend-lr " + " ".join(f"{lr:g}" for lr in extra)
    if args.workers > 1:
        command += f" --workers {args.workers}"
    ext = {
        "name": EXTENSION,
        "post_hoc": True,
        "command": command,
        "arms": list(DELTA_ARMS),
        "lr_grid_added": extra,
        "lr_grid": sorted(training["lr_grid"] + extra),
    }
    jobs = [
        (kind, config, task, training, selection_seed, lr, VALIDATION_BASE)
        for kind in DELTA_ARMS
        for lr in extra
    ]
    ext["selection"] = [r for records in _run_all(jobs, args.workers) for r in records]
    for r in ext["selection"]:
        r.pop("gates", None)
    ext["chosen_lr"] = select_lr(data["selection"] + ext["selection"], DELTA_ARMS)
    moved = [a for a in DELTA_ARMS if ext["chosen_lr"][a] != data["chosen_lr"][a]]
    print("extension: chosen lr", ext["chosen_lr"], "moved:", moved, flush=True)
    ext["moved"], ext["runs"], ext["seeds_done"] = moved, [], []

    def write():
        kept = [r for r in data["runs"] if r["arm"] not in moved or r["seed"] not in done]
        ext["seeds_done"] = done
        ext["paired"] = paired(kept + ext["runs"], task["pairs"], done) if moved and done else []
        ext["seconds"] = _study.seconds_since(begin)
        others = [a for a in data.get("additions", []) if a.get("name") != EXTENSION]
        data["additions"] = others + [ext]
        _study.write(args.out, data, digits=4)

    done = []
    write()
    jobs = [
        (kind, config, task, training, s, ext["chosen_lr"][kind]) for s in seeds for kind in moved
    ]
    for records in _run_all(jobs, args.workers):
        ext["runs"].extend(records)
        finished = sorted({r["seed"] for r in ext["runs"]})
        if len(ext["runs"]) == len(finished) * len(moved) * len(task["pairs"]):
            done = finished  # a whole seed (every moved arm) is in
            write()


if __name__ == "__main__":
    main()
