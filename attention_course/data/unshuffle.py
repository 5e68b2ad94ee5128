"""The unshuffle toy task (chapter 3): put shuffled linked pairs back in order.

An example has a length ``n``, a value offset ``o`` and a chain of values
``v_0 = o < v_1 < ... < v_{n+1}`` whose steps ``v_{k+1} - v_k`` are drawn from
``1 .. max_step`` (``max_step=1``: the consecutive chain ``o, o+1, ...``).
The model is shown the ``n`` pairs ``[v_1, v_2], [v_2, v_3], ..., [v_n, v_{n+1}]``
in a random order. Decoding starts from the link before the chain,
``[v_0, v_1]``; at every step the next pair is the one whose first number
equals the second number of the previous pair, so a model that has learned to
*align* the previous output with the right input can recover the order one
pair at a time.

Lengths, offsets and steps vary from example to example, so two examples are
in general *not* permutations of each other: a test set drawn with lengths and
offsets that training never used holds no reshuffled training example. Held-out
lengths inside the training range still only ask for new sets of familiar
pairs (interpolation); chains longer than any in training test extrapolation. (With
one length, one offset and ``max_step=1``, every example is a permutation of
the same pairs, and a model that ignores positions, such as
:class:`attention_course.alignment.PairAligner`, sees one example over and
over: chapter 3 explains why.)

Sequences are padded on the right to the longest length with the pair
``[PAD, PAD]``; ``PAD = 0`` is never a value of a chain because ``o >= 1``.
Everything is generated in memory with a private ``torch.Generator``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch

PAD = 0  # the padding value; offsets start at 1, so no chain contains it


@dataclass
class UnshuffleTask:
    """A generated data set of shuffled chains of different lengths and offsets.

    For example ``b`` of length ``n = lengths[b]``: ``pairs[b, :n]`` is its
    shuffled chain, ``order[b, i]`` (``i < n``) the input position of the
    ``i``-th pair of the chain, i.e. the position the ``i``-th decoding step
    must attend to, and ``previous[b, i]`` the pair before it (the start link
    ``[v_0, v_1]`` for ``i = 0``), the decoder's input under teacher forcing.
    ``targets[b, i]`` is the pair step ``i`` must output,
    ``pairs[b, order[b, i]]``. Positions ``>= n`` hold ``PAD`` (``order``: 0).

    Shapes:
        pairs, previous, targets: ``(N, L, 2)`` long with ``L = max(lengths)``;
        order: ``(N, L)`` long; lengths, offsets: ``(N,)`` long;
        mask: ``(N, L)`` bool, True at real pairs; values lie in
        ``[0, num_values)``.
    """

    pairs: torch.Tensor
    previous: torch.Tensor
    order: torch.Tensor
    lengths: torch.Tensor
    offsets: torch.Tensor
    num_values: int

    def __len__(self) -> int:
        return self.pairs.shape[0]

    @property
    def mask(self) -> torch.Tensor:
        """``(N, L)`` bool: True at the real pairs of each example, False at padding."""
        steps = torch.arange(self.pairs.shape[1])  # (L,)
        return steps[None, :] < self.lengths[:, None]  # (1, L) < (N, 1) -> (N, L)

    @property
    def targets(self) -> torch.Tensor:
        """``(N, L, 2)``: the pair each decoding step must output (``PAD`` after the end)."""
        rows = torch.arange(len(self))[:, None]  # (N, 1)
        out = self.pairs[rows, self.order]  # (N, L, 2): gather the pairs in chain order
        return out.masked_fill(~self.mask[:, :, None], PAD)


def _int_set(name: str, values: int | Iterable[int], smallest: int) -> list[int]:
    """``values`` as a sorted list of distinct ints ``>= smallest`` (one int allowed)."""
    items = [values] if isinstance(values, int) else list(values)
    if not items or any(
        not isinstance(v, int) or isinstance(v, bool) or v < smallest for v in items
    ):
        raise ValueError(
            f"{name}: got {values!r}, expected an int >= {smallest} or a non-empty "
            f"collection of them"
        )
    return sorted(set(items))


def make_unshuffle_task(
    num_samples: int,
    lengths: int | Iterable[int] = range(5, 21),
    offsets: int | Iterable[int] = range(1, 31),
    seed: int = 0,
    num_values: int | None = None,
    max_step: int = 2,
) -> UnshuffleTask:
    """``num_samples`` shuffled chains, each with a length and an offset drawn uniformly.

    ``lengths`` and ``offsets`` are the allowed values (an int or a collection
    of ints); give a test set lengths and offsets that the training set does
    not use, so that no test example is a reshuffled training example. Each
    step of a chain, ``v_{k+1} - v_k``, is drawn uniformly from
    ``1 .. max_step``. Values lie in ``[0, num_values)``; by default ``num_values = max(offsets) +
    max_step * (max(lengths) + 1) + 1``, the smallest that fits. Pass the
    same ``num_values`` to a training and a test set so that one embedding
    table serves both. Uses its own ``torch.Generator``
    (the global random state is untouched).

    Shapes:
        returns an :class:`UnshuffleTask` with tensors ``(N, max(lengths), ...)``.
    """
    if not isinstance(num_samples, int) or isinstance(num_samples, bool) or num_samples < 1:
        raise ValueError(f"num_samples: got {num_samples!r}, expected an int >= 1")
    lengths = _int_set("lengths", lengths, 2)
    offsets = _int_set("offsets", offsets, 1)  # >= 1: value 0 is the padding
    if not isinstance(max_step, int) or isinstance(max_step, bool) or max_step < 1:
        raise ValueError(f"max_step: got {max_step!r}, expected an int >= 1")
    # the largest value is v_{n+1} <= o + max_step * (n + 1)
    needed = max(offsets) + max_step * (max(lengths) + 1) + 1
    if num_values is None:
        num_values = needed
    elif not isinstance(num_values, int) or isinstance(num_values, bool) or num_values < needed:
        raise ValueError(
            f"num_values: got {num_values!r}, expected an int >= {needed} "
            f"(max(offsets) + max_step * (max(lengths) + 1) + 1)"
        )
    gen = torch.Generator().manual_seed(seed)
    L = max(lengths)
    length = torch.tensor(lengths)[torch.randint(len(lengths), (num_samples,), generator=gen)]
    offset = torch.tensor(offsets)[torch.randint(len(offsets), (num_samples,), generator=gen)]
    pairs = torch.full((num_samples, L, 2), PAD, dtype=torch.long)
    previous = torch.full((num_samples, L, 2), PAD, dtype=torch.long)
    order = torch.zeros(num_samples, L, dtype=torch.long)
    for b in range(num_samples):
        n, o = int(length[b]), int(offset[b])
        step = torch.randint(1, max_step + 1, (n + 1,), generator=gen)  # v_{k+1} - v_k
        v = o + torch.cat([torch.zeros(1, dtype=torch.long), step.cumsum(0)])  # (n + 2,)
        links = torch.stack([v[:-1], v[1:]], dim=-1)  # (n + 1, 2): [v_0, v_1], ..., [v_n, v_{n+1}]
        ordered = links[1:]  # (n, 2): the chain; links[0] is the start link
        perm = torch.randperm(n, generator=gen)  # perm[s] = chain index of the pair at input s
        pairs[b, :n] = ordered[perm]  # the shuffled input
        order[b, :n] = perm.argsort()  # order[i] = input position of the i-th pair
        previous[b, :n] = links[:-1]  # (n, 2): the pair before each step's target
    return UnshuffleTask(pairs, previous, order, length, offset, num_values)
