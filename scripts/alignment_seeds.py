"""Chapter 3's seed comparison: the supervised and the read-out-only run, two seeds each.

Run from the repository root (seeded; the numbers are reproducible on one machine)::

    python scripts/alignment_seeds.py                               # one thread (--threads)
    python scripts/alignment_seeds.py --quick --out /tmp/s.json     # a smoke test

The data and the two training protocols are chapter 3's (cells "The model" and "Without
alignment labels"), step for step: the unshuffle task with held-out lengths (7, 12, 17)
and offsets (5, 15, 25), a :class:`attention_course.alignment.PairAligner` of
``d_model=32``, Adam at 3e-3, batches of 64 drawn by a generator seeded with 0 (the same
batch order for every run), and

- ``supervised``: 300 steps on the pointer loss plus the read-out loss (the alignment
  is told where to point);
- ``readout_only``: 1,500 steps on the read-out loss alone (the pointer loss is
  computed and recorded, never minimised).

The seed is ``seed_everything(seed)`` (``_study.seed``) just before the model is built, so
it sets the initial weights; everything else is the same for both seeds. The read-out-only run at
seed 0 is the chapter's own run. The chapter's supervised model is built after other
random draws, so its weights are not this script's seed 0.

Each run is decoded free-running on the 500 test chains. Recorded: the step and
sequence accuracies, how often the largest weight is on the right input, the mean
weight on the right input, the watched pointer loss (first step, its highest value
and the step of it, the mean of the last 20 steps), and, for the steps whose largest
weight is on a wrong input, how often that input shares a number with the right pair,
against the share expected if the wrong input were drawn at random from the others. The
command line and the JSON's metadata are the other studies' (``scripts/_study.py``).
"""

from __future__ import annotations

import _study
import torch

from attention_course.alignment import PairAligner, unshuffle_losses
from attention_course.data.unshuffle import make_unshuffle_task

DEFAULT_OUT = _study.ROOT / "book" / "data" / "alignment_seeds.json"
TEST_LENGTHS, TEST_OFFSETS = (7, 12, 17), (5, 15, 25)
NUM_VALUES = 73
FULL = {"supervised_steps": 300, "readout_only_steps": 1500, "seeds": [0, 1], "train": 2000}
QUICK = {"supervised_steps": 5, "readout_only_steps": 10, "seeds": [0, 1], "train": 200}


def _shares_a_number(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """(..., 2) pairs a and b -> (...) bool: some number of a is a number of b."""
    return (a[..., :, None] == b[..., None, :]).flatten(-2).any(-1)


def run(train, test, seed: int, steps: int, supervised: bool) -> dict:
    _study.seed(seed)
    model = PairAligner(NUM_VALUES, d_model=32, hidden_dim=32)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    batches = torch.Generator().manual_seed(0)  # the chapter's batch order, for every seed
    watched = []
    for _ in range(steps):
        index = torch.randint(0, len(train), (64,), generator=batches)
        L = int(train.lengths[index].max())
        batch = (
            train.pairs[index, :L],
            train.previous[index, :L],
            train.order[index, :L],
            train.mask[index, :L],
        )
        pointer, readout = unshuffle_losses(model, *batch)
        optimizer.zero_grad()
        (pointer + readout if supervised else readout).backward()
        optimizer.step()
        watched.append(pointer.item())

    model.eval()
    chosen, outputs, weights = model.unshuffle(test.pairs, test.previous[:, 0], test.mask)
    real = test.mask  # (N, L)
    right = (outputs == test.targets).all(-1)  # (N, L): the output pair is right
    wrong = (chosen != test.order) & real  # (N, L): the largest weight is on a wrong input
    rows = torch.arange(len(test))[:, None]  # (N, 1)
    picked = test.pairs[rows, chosen]  # (N, L, 2): the input with the largest weight
    shares = _shares_a_number(picked, test.targets)  # (N, L)
    # chance: the share of the other real inputs that share a number with the right pair
    sharing_inputs = _shares_a_number(test.pairs[:, None, :, :], test.targets[:, :, None, :])
    sharing_inputs = (sharing_inputs & test.mask[:, None, :]).sum(-1) - 1  # (N, L): minus itself
    chance = sharing_inputs.float() / (test.lengths[:, None] - 1).float()  # (N, L)
    on_right = weights.gather(-1, test.order[..., None])[..., 0]  # (N, L): alpha_{i, order[i]}
    peak = max(range(len(watched)), key=watched.__getitem__)
    return {
        "seed": seed,
        "steps": steps,
        "per_step": right[real].float().mean().item(),
        "whole_sequence": (right | ~real).all(-1).float().mean().item(),
        "pointer": (chosen == test.order)[real].float().mean().item(),
        "mean_weight_on_right_input": on_right[real].mean().item(),
        "watched_pointer_loss": {
            "first": watched[0],
            "highest": watched[peak],
            "highest_at_step": peak,
            "last_20_mean": sum(watched[-20:]) / len(watched[-20:]),
        },
        "wrong_steps": int(wrong.sum()),
        "wrong_shares_a_number": shares[wrong].float().mean().item() if wrong.any() else None,
        "wrong_shares_a_number_by_chance": chance[wrong].mean().item() if wrong.any() else None,
    }


def main(argv: list[str] | None = None) -> dict:
    parser = _study.parser(__doc__, DEFAULT_OUT, quick="a few steps, a small training set")
    args = parser.parse_args(argv)
    start = _study.start(args)
    size = QUICK if args.quick else FULL

    train_lengths = [n for n in range(5, 21) if n not in TEST_LENGTHS]
    train_offsets = [o for o in range(1, 31) if o not in TEST_OFFSETS]
    train = make_unshuffle_task(
        size["train"], train_lengths, train_offsets, seed=0, num_values=NUM_VALUES
    )
    test = make_unshuffle_task(500, TEST_LENGTHS, TEST_OFFSETS, seed=1, num_values=NUM_VALUES)

    results = {"supervised": [], "readout_only": []}
    for seed in size["seeds"]:
        for name, steps in (
            ("supervised", size["supervised_steps"]),
            ("readout_only", size["readout_only_steps"]),
        ):
            result = run(train, test, seed, steps, supervised=name == "supervised")
            results[name].append(result)
            print(
                f"{name:13s} seed {seed}: pointer {result['pointer']:.3f}, "
                f"per step {result['per_step']:.3f}, "
                f"whole sequence {result['whole_sequence']:.3f}",
                flush=True,
            )
    data = {
        "training": {**size, "batch_size": 64, "lr": 3e-3, "batch_order_seed": 0},
        "test_chains": len(test),
        "test_steps": int(test.mask.sum()),
        "results": results,
    }
    return _study.finish(args.out, data, start)


if __name__ == "__main__":
    main()
