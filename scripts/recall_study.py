"""Chapter 22's study: multi-query associative recall with softmax attention, linear attention
and the gated delta rule as the token mixer, as the number of pairs grows past the state.

Run from the repository root (seeded; one thread; the JSON records the seconds it took)::

    python scripts/recall_study.py                                # the committed run
    python scripts/recall_study.py --quick --out /tmp/recall.json  # a smoke test (seconds)

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
(``d_model x d_model`` each, ``num_heads`` heads of ``d_model / num_heads``):

- ``softmax``: causal softmax attention (``F.scaled_dot_product_attention``); its memory of
  the past is every key and value (a cache growing with ``T``);
- ``linear``: :func:`attention_course.linear_attention` (``phi = elu + 1``, causal); a state
  of ``Dk x Dv`` (+ the ``Dk`` normaliser) per head;
- ``gated_delta``: :func:`attention_course.gated_delta_rule` (chunked, ``chunk_size`` 16) on
  l2-normalised ``q`` and ``k`` (as Qwen3-Next), ``beta = sigmoid(w_beta x)`` and
  ``g = -softplus(w_g x)``: ``w_beta`` and ``w_g`` are one extra ``nn.Linear(d_model, 2 H)``
  (with bias; the bias of ``g`` starts at -5, a decay ``a`` of about 0.993 per token: with
  bias 0, ``a`` starts near 0.5 and a 400-step trial learnt nothing), ``2 H (d_model + 1)``
  parameters more than the other two arms. Its output is multiplied by ``sqrt(Dh)``, undoing
  the function's ``1/sqrt(Dk)`` (with unit ``q`` and ``k`` that scale only shrinks what is
  read; a choice, not a need: in 400-step trials at N = 16 accuracy was 0.18 with it and 0.20
  without). The same
  ``Dk x Dv`` state per head as ``linear``.

Parameters are matched exactly between ``softmax`` and ``linear`` and up to that small gate
projection for ``gated_delta`` (the JSON records each count). Each (arm, seed) is trained
from scratch with AdamW on freshly drawn batches (the same batches for every arm of a seed),
the number of pairs drawn at every step from the whole grid (as Zoology trains on a mix of
sizes: a first version that trained one model per ``N`` for 800 steps left the gated delta
rule at ``N`` = 32 and 64 and softmax attention at ``N`` = 128 at chance, their training loss
never leaving ``ln(num_values)``, seed 0), then scored at every ``N`` on ``eval_sequences``
held-out sequences (drawn from a separate generator, the same for every arm): ``accuracy`` is
the share of query positions whose arg-max is the right
value (chance: ``1 / num_values``). ``paired``: per ``N``, the per-seed difference of
accuracy between two arms, with its mean and a 95 % Student-t interval over the seeds.
"""

from __future__ import annotations

import math
import time

import _study
import torch
import torch.nn as nn
import torch.nn.functional as F

from attention_course import RMSNorm, SwiGLU, count_parameters, gated_delta_rule, linear_attention

DEFAULT_OUT = _study.ROOT / "book" / "data" / "recall_study.json"
CONFIG = {"d_model": 32, "num_heads": 1, "num_layers": 2, "d_ff": 64}
TASK = {"num_keys": 256, "num_values": 64, "queries": 16, "pairs": [8, 16, 32, 64, 128]}
TRAINING = {"steps": 1500, "batch_size": 32, "lr": 5e-3, "eval_sequences": 512, "chunk_size": 16}
SEEDS = (0, 1, 2)
QUICK_SEEDS = (0, 1)
QUICK_CONFIG = {"d_model": 16, "num_heads": 1, "num_layers": 1, "d_ff": 32}
QUICK_TASK = {"num_keys": 32, "num_values": 8, "queries": 4, "pairs": [4, 8]}
QUICK_TRAINING = {**TRAINING, "steps": 3, "batch_size": 4, "eval_sequences": 8}
ARMS = ("softmax", "linear", "gated_delta")
PAIRS = (("gated_delta", "linear"), ("softmax", "gated_delta"))
T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776}


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
    mixes the positions. Shapes: ``x (B, T, D) -> (B, T, D)``."""

    def __init__(self, kind: str, d_model: int, num_heads: int, chunk_size: int):
        super().__init__()
        self.kind, self.num_heads, self.chunk_size = kind, num_heads, chunk_size
        self.w_q, self.w_k, self.w_v, self.w_o = (
            nn.Linear(d_model, d_model, bias=False) for _ in range(4)
        )
        if kind == "gated_delta":
            self.w_gate = nn.Linear(d_model, 2 * num_heads)  # beta and g, per head
            with torch.no_grad():  # start with a slow decay: a = e^{-softplus(-5)} ~ 0.993
                self.w_gate.bias[num_heads:] = -5.0

    def forward(self, x):
        B, T, D = x.shape
        H = self.num_heads
        # (B, T, H, Dh): the gated delta rule's layout; the others take (B, H, T, Dh)
        q, k, v = (w(x).view(B, T, H, D // H) for w in (self.w_q, self.w_k, self.w_v))
        if self.kind == "gated_delta":
            b, a = self.w_gate(x).chunk(2, dim=-1)  # (B, T, H) each
            out, _ = gated_delta_rule(
                F.normalize(q, dim=-1),
                F.normalize(k, dim=-1),
                v,
                g=-F.softplus(a),
                beta=torch.sigmoid(b),
                chunk_size=self.chunk_size,
            )  # (B, T, H, Dh)
            out = out * math.sqrt(D // H)  # undo the 1/sqrt(Dk): unit q, k give O(1) reads
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

    def __init__(self, kind: str, config: dict, task: dict, chunk_size: int):
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
                        Mixer(kind, D, config["num_heads"], chunk_size),
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


def train_and_score(kind, config, task, training, seed) -> list[dict]:
    """Train one model with mixer ``kind`` on batches whose number of pairs is drawn, per
    step, uniformly from ``task["pairs"]``; then score it at every ``N`` of the grid. One
    record per ``N`` (the training figures are the run's, the same in each)."""
    _study.seed(seed)
    model = RecallModel(kind, config, task, training["chunk_size"])
    optimizer = torch.optim.AdamW(model.parameters(), lr=training["lr"], weight_decay=0.01)
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
    records = []
    for pairs in grid:
        eval_gen = torch.Generator().manual_seed(10_000 + pairs)  # held out, the same for all
        correct = total = 0
        with torch.no_grad():
            for start in range(0, training["eval_sequences"], 128):
                n = min(128, training["eval_sequences"] - start)
                keys, values, is_query, targets = recall_batch(n, pairs, task, eval_gen)
                predicted = query_logits(model, keys, values, is_query).argmax(dim=-1)
                correct += int((predicted == targets).sum())
                total += targets.numel()
        records.append(
            {
                "arm": kind,
                "pairs": pairs,
                "seed": seed,
                "accuracy": correct / total,
                "train_loss_last50": sum(last) / len(last),
                "parameters": count_parameters(model),
                "train_seconds": train_seconds,
            }
        )
    return records


def paired(runs: list[dict], pairs_grid, seeds) -> list[dict]:
    """Per N and pair of arms: the per-seed accuracy differences, mean, 95 % t interval."""
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


def main(argv: list[str] | None = None) -> None:
    parser = _study.parser(__doc__, DEFAULT_OUT, quick="tiny sizes, a few seconds")
    args = parser.parse_args(argv)
    begin = _study.start(args)
    config, task, training = (
        (QUICK_CONFIG, QUICK_TASK, QUICK_TRAINING) if args.quick else (CONFIG, TASK, TRAINING)
    )
    seeds = QUICK_SEEDS if args.quick else SEEDS
    command = "python scripts/recall_study.py" + (" --quick" if args.quick else "")
    D, H = config["d_model"], config["num_heads"]
    data = {
        "command": command,
        "config": config,
        "task": task,
        "training": {**training, "seeds": list(seeds)},
        "state_size": {"Dk": D // H, "Dv": D // H, "heads": H, "layers": config["num_layers"]},
        "chance": 1 / task["num_values"],
        "runs": [],
    }
    for seed in seeds:  # seed-major: a run cut short keeps whole seeds
        for kind in ARMS:
            records = train_and_score(kind, config, task, training, seed)
            data["runs"].extend(records)
            accuracies = " ".join(f"{r['pairs']}:{r['accuracy']:.3f}" for r in records)
            print(
                f"seed {seed} {kind:12s} acc {accuracies} loss "
                f"{records[0]['train_loss_last50']:.3f} ({records[0]['train_seconds']:.1f} s)",
                flush=True,
            )
        done = sorted({r["seed"] for r in data["runs"]})
        data["training"]["seeds"] = done
        data["paired"] = paired(data["runs"], task["pairs"], done)
        _study.finish(args.out, data, begin, digits=4)


if __name__ == "__main__":
    main()
