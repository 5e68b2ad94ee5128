"""The unshuffle toy task (chapter 3): put shuffled pairs ``[j, j+1]`` back in order.

A sequence is the chain ``[1, 2], [2, 3], ..., [n, n+1]`` in a random order.
Decoding starts from the start token ``[0, 1]``; at every step the next pair is
the one whose first number equals the second number of the previous pair, so
a model that has learned to *align* the previous output with the right input
can recover the order one pair at a time. Everything is generated in memory.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

START = (0, 1)


@dataclass
class UnshuffleTask:
    """A generated data set of shuffled chains.

    ``pairs[b, perm[b, k]]`` is the pair ``[k + 1, k + 2]``, so ``order[b, i]``
    (the inverse permutation) is the input position of the ``i``-th pair of
    the chain: the position the ``i``-th decoding step must attend to.
    ``previous[b, i]`` is the pair before it (the start token for ``i = 0``),
    the decoder's input under teacher forcing.

    Shapes:
        pairs: ``(N, n, 2)``; previous: ``(N, n, 2)``; order: ``(N, n)``;
        num_values: ``n + 2`` (the numbers ``0 .. n + 1``).
    """

    pairs: torch.Tensor
    previous: torch.Tensor
    order: torch.Tensor
    num_values: int

    def __len__(self) -> int:
        return self.pairs.shape[0]


def chain(num_pairs: int) -> torch.Tensor:
    """The ordered chain ``[1, 2], [2, 3], ..., [n, n+1]``. Shapes: returns ``(n, 2)``."""
    first = torch.arange(1, num_pairs + 1)  # (n,)
    return torch.stack([first, first + 1], dim=-1)  # (n,), (n,) -> (n, 2)


def make_unshuffle_task(
    num_samples: int,
    num_pairs: int,
    seed: int = 0,
    exclude: UnshuffleTask | None = None,
) -> UnshuffleTask:
    """``num_samples`` random shufflings of a chain of ``num_pairs`` pairs.

    Uses its own ``torch.Generator`` (the global random state is untouched).
    Pass a training set as ``exclude`` to draw only shufflings it does not
    contain, so that a test set measures generalisation to unseen orders.
    """
    if not isinstance(num_pairs, int) or num_pairs < 2:
        raise ValueError(f"num_pairs: got {num_pairs!r}, expected an int >= 2")
    if not isinstance(num_samples, int) or num_samples < 1:
        raise ValueError(f"num_samples: got {num_samples!r}, expected an int >= 1")
    seen = set() if exclude is None else {tuple(o) for o in exclude.order.tolist()}
    if exclude is not None and exclude.pairs.shape[1] != num_pairs:
        raise ValueError(
            f"exclude: got sequences of {exclude.pairs.shape[1]} pairs, expected {num_pairs}"
        )
    gen = torch.Generator().manual_seed(seed)
    orders = []
    while len(orders) < num_samples:
        order = torch.randperm(num_pairs, generator=gen)
        if tuple(order.tolist()) not in seen:
            orders.append(order)
    order = torch.stack(orders)  # (N, n): order[b, i] = input position of the i-th pair
    perm = order.argsort(dim=-1)  # (N, n): perm[b, s] = chain index of the pair at position s
    ordered = chain(num_pairs)  # (n, 2)
    pairs = ordered[perm]  # (N, n, 2): the shuffled input
    start = torch.tensor([START])  # (1, 2)
    previous = torch.cat([start, ordered[:-1]])  # (n, 2): [0, 1], [1, 2], ..., [n-1, n]
    previous = previous.expand(num_samples, -1, -1).clone()  # (n, 2) -> (N, n, 2)
    return UnshuffleTask(pairs, previous, order, num_values=num_pairs + 2)
