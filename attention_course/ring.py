"""Ring attention: the online softmax spread across processes (chapter 23).

A sequence too long for one device is cut into ``W`` contiguous shards, one per process
(a "rank"). Rank ``r`` keeps its queries and, in ``W`` steps, sees every key/value shard:
at each step it scores its queries against the block it holds and passes that block to
rank ``r + 1`` while receiving the next one from rank ``r - 1`` (Liu, Zaharia & Abbeel,
2023, "Ring Attention with Blockwise Transformers for Near-Infinite Context",
arXiv:2310.01889). The partial results merge exactly as chapter 12's tiles do, with a
running maximum, sum and weighted sum (:func:`attention_course.tiled.online_softmax_update`);
no rank ever holds the whole sequence or the whole ``T x T`` score matrix.

With a causal mask, contiguous shards leave the work unbalanced (rank ``r`` scores ``r + 1``
of the ``W`` blocks); ``layout="striped"`` gives rank ``r`` the positions ``r, r + W, ...``
instead and balances it (Brandon et al., 2023, "Striped Attention", arXiv:2311.09431).
:func:`ring_work` counts each rank's work, and ``trace=`` records what a real run did.

Communication is ``torch.distributed``'s point-to-point ``isend``/``irecv`` (gloo on CPU, the
only backend this package tests: nothing here is specific to gloo, but nccl is untested);
:func:`run_ring` starts the processes on this machine.
"""

from __future__ import annotations

import math
import os
import pickle
import queue as queue_module
import socket
import time
import traceback
from collections.abc import Callable
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from ._validate import LOW_PRECISION, check_positive_int, require_float, shape_str
from .tiled import online_softmax_update


def ring_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    causal: bool = False,
    group: dist.ProcessGroup | None = None,
    *,
    layout: str = "contiguous",
    trace: list | None = None,
) -> torch.Tensor:
    """Scaled dot-product attention over a sequence sharded across the ranks of a group.

    Called on every rank of ``group`` (the default group when None) at the same time. Rank
    ``r`` of ``W`` holds the ``r``-th contiguous shard of the sequence: positions
    ``r*T/W .. (r+1)*T/W - 1`` of the queries, keys and values. The key/value blocks travel
    around the ring ``W - 1`` times (rank ``r`` sends to ``r + 1`` and receives from
    ``r - 1``, the next transfer running while the current block is scored); each block is
    folded into the running state with :func:`~attention_course.tiled.online_softmax_update`.
    Returns the rank's shard of full attention ``softmax(Q K^T / sqrt(Dk)) V`` over the
    whole sequence (equal to it to 1e-5 in float32 and float64).

    ``causal``: query ``i`` sees key ``j`` when ``j <= i`` (global positions). A block from a
    later rank lies wholly in the future of every local query and is skipped (it is still
    passed on); the rank's own block gets a triangular mask; earlier blocks are seen whole.
    Rank ``r`` therefore scores ``r + 1`` tiles: counted in tiles, as this code computes them,
    the last rank works ``W`` times as much as the first; counted in unmasked query-key pairs
    (:func:`ring_work`), ``r n^2 + n(n+1)/2`` for ``n = T/W``, a ratio that tends to ``2W - 1``.

    ``layout="striped"``: rank ``r`` holds positions ``r, r + W, r + 2W, ...`` instead
    (Brandon et al., 2023, "Striped Attention: Faster Ring Attention for Causal
    Transformers", arXiv:2311.09431). With ``causal``, no block is then wholly in the
    future: local query ``a`` (position ``aW + r``) sees local key ``b`` of the block from
    rank ``s`` (position ``bW + s``) when ``b < a``, or ``b = a`` and ``s <= r``: every block
    is a triangle, with its diagonal when ``s <= r`` and without it otherwise, so every rank
    has about the same number of unmasked scores. Without ``causal`` the layout changes
    nothing but which positions a rank holds. :func:`shard_sequence` and
    :func:`gather_sequence` cut and reassemble in either layout.

    ``trace``: a list to which each forward step appends a dict with what this rank did:
    ``step``, ``source`` (the rank the block came from), ``scored`` (False: skipped as wholly
    in the future), ``scores`` (score entries computed, ``B*H*(T/W)^2`` or 0), ``unmasked``
    (of those, the ones not masked) and ``bytes_sent`` (the bytes of the tensors handed to
    ``isend`` at that step, summed over the send operations themselves: the key and value
    blocks, in the compute dtype, float32 for bfloat16/float16 inputs; 0 at the last step).
    Counted from the tensors the ring computes and sends, not from a formula.

    Differentiable: the backward pass is a second trip around the ring. Each key/value block
    travels with its gradient accumulators; every rank adds its queries' contribution, and
    after ``W`` passes the accumulated ``dK``, ``dV`` are back on the rank that owns the
    block. Each rank gets the gradients of its own shards.

    Per rank, memory: its shards, one incoming key/value block and one
    ``(B, H, T/W, T/W)`` block of scores, computed in one piece. Liu et al. also compute each
    rank's block blockwise (chapter 12's tiling, their "Blockwise" Transformers), so that no
    ``(T/W)^2`` block exists at long contexts; this function is the ring without that inner
    loop, fine at the sizes a CPU test uses (at ``T = 2^20``, ``W = 8``, ``H = 32`` the block
    alone is 2 TiB in float32). Each of the ``W - 1`` forward steps sends
    ``B * H * (T/W) * (Dk + Dv)`` numbers (a key and a value block), whether or not the
    block is scored; the backward sends the blocks ``W - 1`` times and their gradients
    ``W`` times.

    Shapes (on every rank, the same on all):
        query, key: ``(B, H, T/W, Dk)``; value: ``(B, H, T/W, Dv)``; returns
        ``(B, H, T/W, Dv)``.

    PyTorch's own ring (its experimental context parallelism,
    ``torch.distributed.tensor.experimental.context_parallel``) patches
    ``F.scaled_dot_product_attention`` inside a context over a ``DeviceMesh``; this function
    is the algorithm written out. Tests compare it with full attention on the gathered
    tensors.
    """
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError(
            "ring_attention: no torch.distributed process group; call "
            "torch.distributed.init_process_group first, or start the workers with run_ring"
        )
    for name, x in (("query", query), ("key", key), ("value", value)):
        require_float(name, x)
        if x.dim() != 4:
            raise ValueError(
                f"{name}: got shape {shape_str(x.shape)} ({x.dim()}-D), expected 4-D "
                f"(B, H, T/W, D), this rank's shard of the sequence"
            )
    if key.shape != query.shape:
        raise ValueError(
            f"key: got shape {shape_str(key.shape)}, expected the query's "
            f"{shape_str(query.shape)} (each rank holds the same positions of q, k and v)"
        )
    if value.shape[:3] != query.shape[:3]:
        raise ValueError(
            f"value: got shape {shape_str(value.shape)}, expected (B, H, T/W) = "
            f"{shape_str(query.shape[:3])} as in query, then Dv"
        )
    if not query.dtype == key.dtype == value.dtype:
        raise ValueError(
            f"query, key, value: got dtypes {query.dtype}, {key.dtype}, {value.dtype}, "
            f"expected one dtype for all three"
        )
    if not isinstance(causal, bool):
        raise ValueError(f"causal: got {causal!r}, expected True or False")
    _check_layout(layout)
    if trace is not None and not isinstance(trace, list):
        raise ValueError(f"trace: got {type(trace).__name__}, expected None or a list")
    _check_same_shapes(query, value, group)
    return _RingAttention.apply(query, key, value, causal, group, layout, trace)


LAYOUTS = ("contiguous", "striped")


def _check_layout(layout: object) -> None:
    if layout not in LAYOUTS:
        raise ValueError(f"layout: got {layout!r}, expected one of {LAYOUTS}")


def shard_sequence(x: torch.Tensor, rank: int, world_size: int, layout: str = "contiguous"):
    """Rank ``rank``'s shard of a sequence, along dim -2: the ``rank``-th contiguous piece
    of ``T/W`` positions, or (``layout="striped"``) positions ``rank, rank + W, ...``.

    Shapes: x ``(..., T, D)`` with ``T`` divisible by ``world_size``; returns
    ``(..., T/W, D)``.
    """
    _check_layout(layout)
    check_positive_int("world_size", world_size)
    if not isinstance(rank, int) or not 0 <= rank < world_size:
        raise ValueError(f"rank: got {rank!r}, expected an int in 0..{world_size - 1}")
    T = x.shape[-2]
    if T % world_size:
        raise ValueError(f"x: got T={T} positions, expected a multiple of W={world_size} ranks")
    if layout == "striped":
        return x[..., rank::world_size, :]
    n = T // world_size
    return x[..., rank * n : (rank + 1) * n, :]


def gather_sequence(shards: list[torch.Tensor], layout: str = "contiguous") -> torch.Tensor:
    """The whole sequence from the ranks' shards, ``[rank 0's, rank 1's, ...]``: the
    inverse of :func:`shard_sequence`.

    Shapes: each shard ``(..., T/W, D)``; returns ``(..., T, D)``.
    """
    _check_layout(layout)
    whole = torch.cat(shards, dim=-2)  # contiguous: rank after rank
    if layout == "contiguous":
        return whole
    # striped: position r + iW is row i of rank r's shard, row r*n + i of `whole`
    world, n = len(shards), shards[0].shape[-2]
    order = torch.arange(world * n).view(world, n).T.reshape(-1)  # position -> row of `whole`
    return whole[..., order.to(whole.device), :]


def ring_work(world_size: int, shard_len: int, causal: bool = True, layout: str = "contiguous"):
    """What each rank of a ring computes, without running one: per rank, a dict with
    ``scored`` (blocks scored), ``skipped`` (blocks passed on unscored) and ``unmasked``
    (query-key pairs not masked, per batch element and head). Uses the ring's own rule,
    the function :func:`ring_attention` scores its blocks with, on one head and ``T/W =
    shard_len`` positions per rank.

    Contiguous and causal, rank ``r`` scores ``r + 1`` blocks and ``r n^2 + n(n+1)/2``
    pairs (``n = shard_len``); striped and causal, every rank scores all ``W`` blocks and
    ``W n(n-1)/2 + (r+1) n`` pairs.
    """
    check_positive_int("world_size", world_size)
    check_positive_int("shard_len", shard_len)
    _check_layout(layout)
    ones = torch.ones(1, shard_len, 1)  # (H=1, n, Dk=1): every score is 1, masked -inf
    work = []
    for rank in range(world_size):
        counts = {"scored": 0, "skipped": 0, "unmasked": 0}
        for step in range(world_size):
            src = (rank - step) % world_size
            s = _block_scores(ones, ones, rank, src, causal, layout)
            if s is None:
                counts["skipped"] += 1
            else:
                counts["scored"] += 1
                counts["unmasked"] += int(torch.isfinite(s).sum())
        work.append(counts)
    return work


def _check_same_shapes(query, value, group) -> None:
    """Every rank must hold shards of one shape (the receive buffers are sized from the
    local ones). One small all-gather of the shapes; every rank raises the same error."""
    world = dist.get_world_size(group)
    mine = torch.tensor([*query.shape, value.shape[-1]], dtype=torch.long, device=query.device)
    everyone = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(everyone, mine, group=group)
    shapes = torch.stack(everyone)  # (W, 5): B, H, T/W, Dk, Dv
    if not bool((shapes == shapes[0]).all()):
        got = ", ".join(f"rank {r}: {tuple(s.tolist())}" for r, s in enumerate(shapes))
        raise ValueError(
            f"query, value: the ranks hold shards of different shapes (B, H, T/W, Dk, Dv): "
            f"{got}; cut the sequence into W equal contiguous shards"
        )


def _neighbours(group) -> tuple[int, int, int, int]:
    """``(rank, world size, next rank, previous rank)``; the neighbours as global ranks,
    which is what point-to-point operations take."""
    rank, world = dist.get_rank(group), dist.get_world_size(group)

    def global_rank(r: int) -> int:
        return r if group is None else dist.get_global_rank(group, r)

    return rank, world, global_rank((rank + 1) % world), global_rank((rank - 1) % world)


def _start_pass(tensors, send_to: int, recv_from: int, group, first_tag: int = 0):
    """Send ``tensors`` to ``send_to`` and receive as many of the same shapes from
    ``recv_from``, without waiting. Returns ``(requests, received, bytes_sent)``; the
    received tensors are valid after every request's ``wait()``; ``bytes_sent`` sums
    ``numel * element_size`` over the tensors of the ``isend`` operations handed to
    ``batch_isend_irecv`` (the payload, not the backend's framing on the wire). Each tensor
    gets its own tag (from ``first_tag``), so that messages in flight at the same time are
    never confused."""
    received = [torch.empty_like(t) for t in tensors]
    tags = range(first_tag, first_tag + len(tensors))
    ops = [dist.P2POp(dist.isend, t, send_to, group, tag=i) for i, t in zip(tags, tensors)]
    ops += [dist.P2POp(dist.irecv, t, recv_from, group, tag=i) for i, t in zip(tags, received)]
    sends = [op.tensor for op in ops if op.op is dist.isend]
    bytes_sent = sum(t.numel() * t.element_size() for t in sends)
    return dist.batch_isend_irecv(ops), received, bytes_sent


def _finish_pass(requests) -> None:
    for request in requests:
        request.wait()


def _block_scores(
    q, k, rank: int, src: int, causal: bool, layout: str = "contiguous"
) -> torch.Tensor | None:
    """Scores of the (already scaled) local queries against the block from rank ``src``;
    None when, with ``causal``, the block lies wholly in the queries' future.
    Shapes: q, k ``(B, H, Tl, Dk)``; returns ``(B, H, Tl, Tl)``."""
    if causal and layout == "contiguous" and src > rank:
        return None  # every key of this block comes after every local query
    s = q @ k.transpose(-2, -1)  # (B, H, Tl, Dk) @ (B, H, Dk, Tl) -> (B, H, Tl, Tl)
    if not causal:
        return s
    if layout == "contiguous":
        if src < rank:
            return s  # an earlier block: wholly in the past
        diagonal = 1  # the own block: the same positions, j <= i
    else:
        # striped: query a is position aW + rank, key b is bW + src; b <= a when
        # src <= rank (the diagonal kept), b < a when src > rank (the diagonal masked too)
        diagonal = 1 if src <= rank else 0
    future = torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device).triu(diagonal)
    return s.masked_fill(future, -math.inf)


class _RingAttention(torch.autograd.Function):
    """Forward: the ring with the online softmax. Backward: a second ring, the blocks
    carrying their gradient accumulators home."""

    @staticmethod
    def forward(ctx, query, key, value, causal, group, layout, trace):
        dtype = query.dtype
        compute = torch.float32 if dtype in LOW_PRECISION else dtype
        q, k, v = (x.detach().to(compute).contiguous() for x in (query, key, value))
        rank, world, send_to, recv_from = _neighbours(group)
        scale = 1.0 / math.sqrt(q.shape[-1])  # 1/sqrt(d_k), as in chapter 4
        q_scaled = q * scale
        m = torch.full((*q.shape[:-1], 1), -math.inf, dtype=compute, device=q.device)
        l = torch.zeros_like(m)  # noqa: E741 - the paper's name for the running sum
        acc = torch.zeros((*q.shape[:-1], v.shape[-1]), dtype=compute, device=q.device)
        for step in range(world):
            src = (rank - step) % world  # the rank whose block we hold at this step
            sent = 0  # the last step sends nothing
            if step < world - 1:  # pass the block on while we score it
                requests, (k_next, v_next), sent = _start_pass([k, v], send_to, recv_from, group)
            s = _block_scores(q_scaled, k, rank, src, causal, layout)
            if s is not None:
                m, l, acc = online_softmax_update(m, l, acc, s, v)  # noqa: E741
            if trace is not None:
                trace.append(
                    {
                        "step": step,
                        "source": src,
                        "scored": s is not None,
                        "scores": 0 if s is None else s.numel(),
                        "unmasked": 0 if s is None else int(torch.isfinite(s).sum()),
                        "bytes_sent": sent,
                    }
                )
            if step < world - 1:
                _finish_pass(requests)
                k, v = k_next, v_next
        output = acc / l  # every query sees at least its own key, so l > 0
        ctx.save_for_backward(query, key, value, output, m + torch.log(l))
        ctx.causal, ctx.group, ctx.layout = causal, group, layout
        return output.to(dtype)

    @staticmethod
    def backward(ctx, grad_output):
        query, key, value, output, lse = ctx.saved_tensors
        causal, group, layout = ctx.causal, ctx.group, ctx.layout
        compute = output.dtype
        q, k, v = (x.to(compute).contiguous() for x in (query, key, value))
        do = grad_output.to(compute)
        rank, world, send_to, recv_from = _neighbours(group)
        scale = 1.0 / math.sqrt(q.shape[-1])
        q_scaled = q * scale
        # delta_i = sum_j P_ij dP_ij = dO_i . O_i (the softmax's Jacobian, as in tiled.py)
        delta = (do * output).sum(dim=-1, keepdim=True)  # (B, H, Tl, 1)
        grad_q = torch.zeros_like(q)
        grad_k, grad_v = torch.zeros_like(k), torch.zeros_like(v)  # travel with k and v
        for step in range(world):
            src = (rank - step) % world
            if step < world - 1:
                requests, (k_next, v_next), _ = _start_pass([k, v], send_to, recv_from, group)
            s = _block_scores(q_scaled, k, rank, src, causal, layout)
            if s is not None:
                p = torch.exp(s - lse)  # this block's softmax weights, from the saved L
                grad_v = grad_v + p.transpose(-2, -1) @ do  # (B, H, Tl, Tl)^T @ (B, H, Tl, Dv)
                ds = p * (do @ v.transpose(-2, -1) - delta)  # dS = P * (dP - delta)
                grad_q = grad_q + ds @ k * scale
                grad_k = grad_k + ds.transpose(-2, -1) @ q_scaled
            # The accumulators follow their block; after the last step one more pass brings
            # every block's dK, dV home (W passes in all; none for a group of one).
            if world > 1:
                grad_requests, (grad_k, grad_v), _ = _start_pass(
                    [grad_k, grad_v], send_to, recv_from, group, first_tag=2
                )
                _finish_pass(grad_requests)
            if step < world - 1:
                _finish_pass(requests)
                k, v = k_next, v_next
        grads = (grad_q.to(query.dtype), grad_k.to(key.dtype), grad_v.to(value.dtype))
        return (*grads, None, None, None, None)


def ring_attention_worker(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    causal: bool = False,
    layout: str = "contiguous",
    trace: bool = False,
):
    """A worker for :func:`run_ring`: every rank receives the *whole* ``query``, ``key``,
    ``value``, keeps its shard of the sequence (:func:`shard_sequence`: with the default
    layout, rank ``r`` of ``W`` keeps positions ``r*T/W`` to ``(r+1)*T/W - 1``) and returns
    its shard of :func:`ring_attention`; with ``trace``, ``(shard, trace)``, the list of
    what the rank did at each forward step (see :func:`ring_attention`).

    ``gather_sequence(run_ring(ring_attention_worker, W, q, k, v), "contiguous")`` is full
    attention (for the default layout, ``torch.cat(..., dim=-2)``).

    Shapes: query, key ``(B, H, T, Dk)``; value ``(B, H, T, Dv)``, ``T`` divisible by the
    world size; returns ``(B, H, T/W, Dv)``.
    """
    rank, world = dist.get_rank(), dist.get_world_size()
    T = query.shape[-2]
    if T % world:
        raise ValueError(f"query: got T={T} positions, expected a multiple of W={world} ranks")
    shards = (shard_sequence(x, rank, world, layout) for x in (query, key, value))
    steps: list | None = [] if trace else None
    out = ring_attention(*shards, causal=causal, layout=layout, trace=steps)
    return (out, steps) if trace else out


def run_calls(calls: list) -> list:
    """A worker for :func:`run_ring` that runs several workers in turn in one launch
    (starting processes costs seconds): ``calls`` is a list of ``(fn, args, kwargs)``, each
    ``fn`` importable; returns ``[fn(*args, **kwargs) for each call]`` on every rank.
    """
    return [fn(*args, **kwargs) for fn, args, kwargs in calls]


def _free_port() -> int:
    """A TCP port that is free on the loopback interface now (the OS picks it). Another
    process may take it before rank 0 binds it: :func:`run_ring` then starts again with a
    new port (:class:`_PortTaken`)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _loopback_interface() -> str | None:
    """The loopback interface's name (``lo`` on Linux, ``lo0`` on macOS), or None."""
    try:
        names = [name for _, name in socket.if_nameindex()]
    except (OSError, AttributeError):
        return None
    return next((n for n in names if n.startswith("lo")), None)


def _worker(rank, world_size, port, backend, timeout, fn, args, results) -> None:
    """One process of :func:`run_ring`: join the group, run ``fn``, report, leave."""
    os.environ["MASTER_ADDR"] = "127.0.0.1"  # loopback only: nothing leaves this machine
    os.environ["MASTER_PORT"] = str(port)
    loopback = _loopback_interface()
    if backend == "gloo" and loopback is not None:
        # gloo's own connections otherwise use the address the host name resolves to.
        os.environ.setdefault("GLOO_SOCKET_IFNAME", loopback)
    torch.set_num_threads(1)  # W processes share the machine's cores
    if backend == "nccl":  # one GPU per rank (nccl cannot put two ranks on one GPU)
        torch.cuda.set_device(rank % torch.cuda.device_count())

    def report(status: str, payload) -> None:
        """Send the result or the traceback, and wait until it is in the pipe."""
        results.put((rank, status, time.time(), payload))
        results.close()
        results.join_thread()

    try:
        dist.init_process_group(
            backend, rank=rank, world_size=world_size, timeout=timedelta(seconds=timeout)
        )
        try:
            # Pickled here, with plain pickle: a tensor is copied, not shared with this
            # process (which is about to exit).
            status, payload = "ok", pickle.dumps(fn(*args))
        except BaseException:  # every failure goes to the parent, with its traceback
            status, payload = "error", traceback.format_exc()
        # Report before leaving the group: a peer that fails because this rank has gone
        # (its connections closed) reports after this rank's own cause.
        report(status, payload)
        dist.destroy_process_group()
    except BaseException:  # joining or leaving the group failed
        report("error", traceback.format_exc())
    # Leave at once: the group is destroyed, nothing else needs cleaning up, and a normal
    # exit (tearing down torch) takes seconds on a busy machine.
    os._exit(0)


PORT_ATTEMPTS = 3  # launches run_ring tries when the port it chose is taken meanwhile


class _PortTaken(RuntimeError):
    """A launch failed because its ``MASTER_PORT`` was in use when rank 0 bound it."""


def run_ring(
    fn: Callable,
    world_size: int,
    *args,
    backend: str = "gloo",
    timeout: float = 120.0,
) -> list:
    """Run ``fn(*args)`` on ``world_size`` new processes that form one ``torch.distributed``
    group, and return their results, ``[rank 0's, rank 1's, ...]``.

    What ``torchrun`` does on real machines, on this one: each worker is started with
    ``torch.multiprocessing`` (the ``spawn`` method, on every platform), sets
    ``MASTER_ADDR=127.0.0.1`` and a ``MASTER_PORT`` free at start-up, joins the group with
    ``init_process_group(backend)``, calls ``fn`` (which finds its rank with
    ``torch.distributed.get_rank()``) and leaves the group. gloo is told to use the
    loopback interface, so nothing is sent off the machine. Each worker uses one thread.

    ``fn`` and ``args`` are sent to new Python processes, so ``fn`` must be importable: a
    function at the top level of a module (e.g. :func:`ring_attention_worker`), not one
    defined in a notebook cell or a lambda. Results are pickled back (tensors copied). The
    new processes import the script that started them: in a script, call ``run_ring``
    under ``if __name__ == "__main__":`` (a notebook needs nothing).

    If a worker raises, the others are stopped and ``RuntimeError`` carries that worker's
    rank and traceback; a worker that dies without a word, or a run longer than ``timeout``
    seconds, also raises. No process is left behind.

    The port is chosen free in this process, then bound by rank 0 seconds later; if another
    process took it meanwhile (the group fails with ``EADDRINUSE``), the workers are stopped
    and the launch starts again with a new port, ``PORT_ATTEMPTS`` launches in all
    (``timeout`` applies to each).
    """
    if not isinstance(world_size, int) or isinstance(world_size, bool) or world_size < 1:
        raise ValueError(f"world_size: got {world_size!r}, expected a positive int")
    for attempt in range(PORT_ATTEMPTS):
        try:
            return _launch(fn, world_size, args, backend, timeout, _free_port())
        except _PortTaken:
            if attempt == PORT_ATTEMPTS - 1:
                raise
    raise AssertionError("unreachable")  # pragma: no cover


def _launch(fn: Callable, world_size: int, args: tuple, backend: str, timeout: float, port: int):
    """One launch of :func:`run_ring` on ``port``; raises :class:`_PortTaken` when a worker
    failed because the port was in use."""
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    workers = [
        ctx.Process(
            target=_worker,
            args=(rank, world_size, port, backend, timeout, fn, args, results),
            daemon=True,
        )
        for rank in range(world_size)
    ]
    for w in workers:
        w.start()
    outputs: dict[int, object] = {}
    failures: dict[int, tuple[float, str]] = {}  # rank -> (when, traceback)
    deadline = time.monotonic() + timeout
    grace_end = math.inf  # after a first failure, how long to wait for the others' reports
    try:
        while len(outputs) + len(failures) < world_size and time.monotonic() < grace_end:
            try:
                rank, status, when, payload = results.get(timeout=0.2)
            except queue_module.Empty:
                if failures:
                    continue
                dead = [r for r, w in enumerate(workers) if w.exitcode not in (None, 0)]
                if dead:
                    codes = ", ".join(f"rank {r}: exit code {workers[r].exitcode}" for r in dead)
                    raise RuntimeError(
                        f"run_ring: a worker died without a result ({codes}); a script that "
                        f"calls run_ring must do so under `if __name__ == '__main__':`"
                    ) from None
                if time.monotonic() > deadline:
                    missing = sorted(set(range(world_size)) - set(outputs))
                    raise RuntimeError(
                        f"run_ring: timed out after {timeout} s waiting for ranks {missing}"
                    ) from None
                continue
            if status == "ok":
                outputs[rank] = pickle.loads(payload)
            else:
                failures[rank] = (when, payload)
                grace_end = min(grace_end, time.monotonic() + 2.0)
        if failures:
            message = _failure_message(failures, world_size)
            if any("EADDRINUSE" in trace for _, trace in failures.values()):
                raise _PortTaken(message)
            raise RuntimeError(message)
        for w in workers:
            w.join(timeout=5.0)
    finally:
        for w in workers:  # on an error, stop the others (they may wait on a dead peer)
            if w.is_alive():
                w.terminate()
            w.join(timeout=5.0)
        results.close()
    return [outputs[r] for r in range(world_size)]


def _failure_message(failures: dict[int, tuple[float, str]], world_size: int) -> str:
    """The first failure in full (the likely cause); the ranks that failed after it (often
    because a peer went away) by their last line."""
    (first, (_, trace)), *later = sorted(failures.items(), key=lambda item: item[1][0])
    message = f"run_ring: rank {first} of {world_size} failed:\n{trace}"
    for rank, (_, trace) in later:
        last_line = trace.strip().splitlines()[-1]
        message += f"\nthen rank {rank} failed too: {last_line}"
    return message
