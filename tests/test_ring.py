"""ring_attention and run_ring (chapter 23): 2 and 3 processes on this machine (gloo over
the loopback interface), every rank's shard against full attention on the gathered
tensors, forward and backward.

Each process start costs a few seconds (a new Python importing torch), so one launch per
world size runs every case and returns the numbers; the asserts run here, in the parent.
"""

from __future__ import annotations

import socket

import pytest
import torch
import torch.distributed as dist

from attention_course import (
    causal_mask,
    gather_sequence,
    ring_attention,
    ring_attention_worker,
    ring_work,
    run_calls,
    run_ring,
    scaled_dot_product_attention,
    shard_sequence,
)
from attention_course import ring as ring_module

CASES = [  # (name, B, H, T per rank, Dk, Dv, causal, dtype)
    ("B=2 not causal", 2, 3, 5, 4, 6, False, torch.float64),
    ("B=2 causal", 2, 3, 5, 4, 6, True, torch.float64),
    ("B=1 causal float32", 1, 2, 4, 8, 8, True, torch.float32),
    ("one position per rank", 3, 1, 1, 4, 2, True, torch.float64),
    ("bfloat16 causal", 2, 2, 4, 8, 8, True, torch.bfloat16),
]
TOLERANCE = {torch.float64: 1e-10, torch.float32: 1e-5, torch.bfloat16: 3e-2}
STRIPED_CASES = [  # (name, B, H, T per rank, Dk, Dv, causal, dtype)
    ("striped causal", 2, 3, 5, 4, 6, True, torch.float64),
    ("striped not causal", 1, 2, 4, 4, 3, False, torch.float64),
    ("striped causal float32", 1, 2, 4, 8, 8, True, torch.float32),
]


def _inputs(world: int, B, H, Tl, Dk, Dv, dtype, seed: int):
    """The full tensors (the same on every rank: built from one seed)."""
    gen = torch.Generator().manual_seed(seed)
    T = world * Tl
    q = torch.randn(B, H, T, Dk, generator=gen, dtype=dtype)
    k = torch.randn(B, H, T, Dk, generator=gen, dtype=dtype)
    v = torch.randn(B, H, T, Dv, generator=gen, dtype=dtype)
    grad_out = torch.randn(B, H, T, Dv, generator=gen, dtype=dtype)
    return q, k, v, grad_out


def _every_case() -> dict:
    """Run on every rank: each case's output shard and the gradients of the rank's shards."""
    rank, world = dist.get_rank(), dist.get_world_size()
    results = {}
    for seed, (name, B, H, Tl, Dk, Dv, causal, dtype) in enumerate(CASES):
        q, k, v, grad_out = _inputs(world, B, H, Tl, Dk, Dv, dtype, seed)
        rows = slice(rank * Tl, (rank + 1) * Tl)
        shards = [x[..., rows, :].clone().requires_grad_() for x in (q, k, v)]
        out = ring_attention(*shards, causal=causal)
        (out * grad_out[..., rows, :]).sum().backward()
        results[name] = (out.detach(), *(x.grad for x in shards))
    # The striped layout (rank r holds positions r, r + W, ...), forward and backward, with
    # the trace of every forward step.
    for seed, (name, B, H, Tl, Dk, Dv, causal, dtype) in enumerate(STRIPED_CASES):
        q, k, v, grad_out = _inputs(world, B, H, Tl, Dk, Dv, dtype, 50 + seed)
        shards = [
            shard_sequence(x, rank, world, "striped").clone().requires_grad_() for x in (q, k, v)
        ]
        steps = []
        out = ring_attention(*shards, causal=causal, layout="striped", trace=steps)
        (out * shard_sequence(grad_out, rank, world, "striped")).sum().backward()
        results[name] = (out.detach(), *(x.grad for x in shards))
        results[name + " trace"] = steps
    # The contiguous causal ring's trace (the first float64 case) and run_calls.
    q, k, v, _ = _inputs(world, 2, 3, 5, 4, 6, torch.float64, 1)
    results["contiguous trace"] = run_calls(
        [(ring_attention_worker, (q, k, v), {"causal": True, "trace": True})]
    )[0][1]
    # bfloat16 inputs: the ring computes, and so sends, float32 blocks.
    q, k, v, _ = _inputs(world, 1, 2, 4, 8, 8, torch.bfloat16, 7)
    results["bfloat16 trace"] = ring_attention_worker(q, k, v, True, trace=True)[1]
    # _start_pass counts the bytes of the tensors it hands to isend, whatever they are.
    _, _, send_to, recv_from = ring_module._neighbours(None)
    payload = [
        torch.ones(3, dtype=torch.float64),
        torch.ones(2, 5),
        torch.ones(4, dtype=torch.long),
    ]
    requests, received, sent = ring_module._start_pass(payload, send_to, recv_from, None, 10)
    ring_module._finish_pass(requests)
    results["start_pass"] = (sent, [x.tolist() for x in received])
    # The notebook's form: every rank gets the whole tensors and keeps its shard.
    q, k, v, _ = _inputs(world, 2, 2, 3, 4, 3, torch.float32, 5)
    results["package worker"] = ring_attention_worker(q, k, v, True)
    # Shards of different lengths: every rank raises the same ValueError (no hang).
    x = torch.randn(1, 1, rank + 1, 4)
    try:
        ring_attention(x, x, x)
        results["unequal shards"] = "no error"
    except ValueError as error:
        results["unequal shards"] = str(error)
    try:
        ring_attention(x, x, x, layout="zigzag")
        results["bad layout"] = "no error"
    except ValueError as error:
        results["bad layout"] = str(error)
    # A ring over a sub-group, ranks 1..W-1: its ranks are not the global ones.
    group = dist.new_group(list(range(1, world)))
    results["group"] = None
    if rank >= 1:
        q, k, v, _ = _inputs(world - 1, 1, 2, 3, 4, 4, torch.float64, 99)
        grank = dist.get_rank(group)  # the rank inside the group decides the shard
        rows = slice(grank * 3, (grank + 1) * 3)
        shards = [x[..., rows, :].clone().requires_grad_() for x in (q, k, v)]
        out = ring_attention(*shards, causal=True, group=group)
        out.sum().backward()
        results["group"] = (out.detach(), *(x.grad for x in shards))
    return results


def _full_attention(name: str, world: int):
    """Full attention and its gradients on the gathered tensors, in one process, in float64
    (from the same, possibly rounded, inputs)."""
    index = [c[0] for c in CASES].index(name)
    _, B, H, Tl, Dk, Dv, causal, dtype = CASES[index]
    q, k, v, grad_out = (x.double() for x in _inputs(world, B, H, Tl, Dk, Dv, dtype, index))
    q, k, v = (x.requires_grad_() for x in (q, k, v))
    mask = causal_mask(world * Tl) if causal else None
    out, _ = scaled_dot_product_attention(q, k, v, mask)
    (out * grad_out).sum().backward()
    return out.detach(), q.grad, k.grad, v.grad


@pytest.fixture(scope="module", params=[2, 3], ids=["W=2", "W=3"])
def ring_results(request):
    world = request.param
    return world, run_ring(_every_case, world, timeout=120.0)


@pytest.mark.slow
@pytest.mark.parametrize("name", [c[0] for c in CASES])
def test_ring_attention_equals_full_attention(ring_results, name):
    """Each rank's output shard and gradients (q, k, v of its shard) equal full attention's
    on the gathered tensors: to 1e-5 in float32, 1e-10 in float64, 3e-2 in bfloat16."""
    world, results = ring_results
    expected = _full_attention(name, world)
    dtype = results[0][name][0].dtype
    tol = TOLERANCE[dtype]
    for what, i in (("output", 0), ("grad query", 1), ("grad key", 2), ("grad value", 3)):
        gathered = torch.cat([results[r][name][i] for r in range(world)], dim=-2)
        assert gathered.dtype == dtype
        gathered = gathered.double()
        torch.testing.assert_close(
            gathered, expected[i], rtol=tol, atol=tol, msg=lambda m, w=what: f"{w}: {m}"
        )


@pytest.mark.slow
def test_ring_attention_worker_and_subgroup(ring_results):
    """The package's worker (whole tensors in, the rank's output shard out), and a ring
    over the sub-group of ranks 1..W-1 (the group's ranks, not the global ones)."""
    world, results = ring_results
    q, k, v, _ = _inputs(world, 2, 2, 3, 4, 3, torch.float32, 5)
    expected, _ = scaled_dot_product_attention(q, k, v, causal_mask(world * 3))
    gathered = torch.cat([r["package worker"] for r in results], dim=-2)
    torch.testing.assert_close(gathered, expected, rtol=1e-5, atol=1e-5)
    q, k, v, _ = _inputs(world - 1, 1, 2, 3, 4, 4, torch.float64, 99)
    q, k, v = (x.requires_grad_() for x in (q, k, v))
    expected, _ = scaled_dot_product_attention(q, k, v, causal_mask((world - 1) * 3))
    expected.sum().backward()
    assert results[0]["group"] is None
    # W = 2: a group of one rank (no passes at all); W = 3: a ring of two.
    for i, want in enumerate((expected.detach(), q.grad, k.grad, v.grad)):
        got = torch.cat([r["group"][i] for r in results[1:]], dim=-2)
        torch.testing.assert_close(got, want)


@pytest.mark.slow
def test_ring_attention_refuses_unequal_shards(ring_results):
    world, results = ring_results
    for r in range(world):
        message = results[r]["unequal shards"]
        assert message.startswith("query, value: the ranks hold shards of different shapes")
        assert f"rank {world - 1}: (1, 1, {world}, 4, 4)" in message


@pytest.mark.slow
def test_ring_attention_refuses_an_unknown_layout(ring_results):
    world, results = ring_results
    for r in range(world):
        assert results[r]["bad layout"].startswith("layout: got 'zigzag', expected one of")


def _rank1_fails():
    """Rank 1 raises; rank 0 waits for it in a barrier that would never end."""
    if dist.get_rank() == 1:
        raise ArithmeticError("rank 1 gives up")
    dist.barrier()


@pytest.mark.slow
def test_run_ring_reports_a_failing_worker():
    """The error names the rank and carries its traceback; the waiting rank is stopped
    (no hang: a hang would end in run_ring's timeout error instead)."""
    cause = r"^run_ring: rank 1 of 2 failed:\n(.|\n)*ArithmeticError: rank 1 gives up"
    with pytest.raises(RuntimeError, match=cause) as error:
        run_ring(_rank1_fails, 2, timeout=60.0)
    # Rank 0, waiting for rank 1, failed after it, or was stopped: it comes second if at all.
    assert "then rank 1" not in str(error.value)


def test_ring_attention_without_a_process_group():
    q = torch.randn(1, 1, 2, 4)
    with pytest.raises(RuntimeError, match="init_process_group"):
        ring_attention(q, q, q)


def test_run_ring_bad_world_size():
    with pytest.raises(ValueError, match="world_size: got 0"):
        run_ring(ring_attention_worker, 0)


def test_block_scores_skips_the_future_and_masks_the_diagonal():
    """The causal rule per block, without processes: a later rank's block is skipped, the
    own block gets a triangular mask, an earlier block is scored whole."""
    q, k = torch.randn(2, 3, 4), torch.randn(2, 3, 4)
    assert ring_module._block_scores(q, k, rank=1, src=2, causal=True) is None
    own = ring_module._block_scores(q, k, rank=1, src=1, causal=True)
    assert torch.isneginf(own[..., 0, 1:]).all() and torch.isfinite(own[..., 1, :2]).all()
    torch.testing.assert_close(ring_module._block_scores(q, k, 1, 0, True), q @ k.mT)
    torch.testing.assert_close(ring_module._block_scores(q, k, 1, 2, False), q @ k.mT)


@pytest.mark.slow
@pytest.mark.parametrize("name", [c[0] for c in STRIPED_CASES])
def test_striped_ring_equals_full_attention(ring_results, name):
    """The striped layout: the ranks' shards, put back in sequence order, equal full
    attention (output and the gradients of q, k, v) on the whole tensors."""
    world, results = ring_results
    index = [c[0] for c in STRIPED_CASES].index(name)
    _, B, H, Tl, Dk, Dv, causal, dtype = STRIPED_CASES[index]
    q, k, v, grad_out = (x.double() for x in _inputs(world, B, H, Tl, Dk, Dv, dtype, 50 + index))
    q, k, v = (x.requires_grad_() for x in (q, k, v))
    out, _ = scaled_dot_product_attention(q, k, v, causal_mask(world * Tl) if causal else None)
    (out * grad_out).sum().backward()
    tol = TOLERANCE[dtype]
    for what, i, want in (
        ("output", 0, out.detach()),
        ("grad query", 1, q.grad),
        ("grad key", 2, k.grad),
        ("grad value", 3, v.grad),
    ):
        got = gather_sequence([results[r][name][i] for r in range(world)], "striped")
        assert got.dtype == dtype
        torch.testing.assert_close(
            got.double(), want, rtol=tol, atol=tol, msg=lambda m, w=what: f"{w}: {m}"
        )


@pytest.mark.slow
def test_trace_counts_the_work_and_the_bytes(ring_results):
    """The trace of the real run: blocks scored and skipped, unmasked pairs and bytes sent
    per step, against the formulas (and against ring_work, which runs no processes)."""
    world, results = ring_results
    B, H, n, Dk, Dv = 2, 3, 5, 4, 6
    float_bytes = 8
    for layout, key in (("contiguous", "contiguous trace"), ("striped", "striped causal trace")):
        expected_work = ring_work(world, n, causal=True, layout=layout)
        for r in range(world):
            steps = results[r][key]
            assert [s["step"] for s in steps] == list(range(world))
            assert [s["source"] for s in steps] == [(r - t) % world for t in range(world)]
            scored = sum(s["scored"] for s in steps)
            unmasked = sum(s["unmasked"] for s in steps)
            if layout == "contiguous":  # rank r scores r + 1 blocks, skips the rest
                assert scored == r + 1
                assert unmasked == B * H * (r * n * n + n * (n + 1) // 2)
            else:  # every block scored; the triangles differ by the diagonal only
                assert scored == world
                assert unmasked == B * H * (world * n * (n - 1) // 2 + (r + 1) * n)
            assert scored == expected_work[r]["scored"]
            assert world - scored == expected_work[r]["skipped"]
            assert unmasked == B * H * expected_work[r]["unmasked"]
            assert all(s["scores"] == (B * H * n * n if s["scored"] else 0) for s in steps)
            # each step but the last sends one key and one value block: B*H*(T/W)*(Dk+Dv)
            sent = [s["bytes_sent"] for s in steps]
            assert sent == [B * H * n * (Dk + Dv) * float_bytes] * (world - 1) + [0]
    # float32: 4 bytes a number
    steps = results[0]["striped causal float32 trace"]
    assert steps[0]["bytes_sent"] == 1 * 2 * 4 * (8 + 8) * 4
    # bfloat16 inputs are computed and sent in float32: twice bfloat16's 2 bytes a number
    for r in range(world):
        sent = [s["bytes_sent"] for s in results[r]["bfloat16 trace"]]
        assert sent == [1 * 2 * 4 * (8 + 8) * 4] * (world - 1) + [0]


@pytest.mark.slow
def test_start_pass_counts_the_tensors_it_sends(ring_results):
    """bytes_sent is read off the isend operations: 3 float64 + 10 float32 + 4 int64
    numbers = 24 + 40 + 32 bytes, and the tensors arrive."""
    world, results = ring_results
    for r in range(world):
        sent, received = results[r]["start_pass"]
        assert sent == 3 * 8 + 10 * 4 + 4 * 8
        assert received == [[1.0] * 3, [[1.0] * 5] * 2, [1] * 4]


def _port_taken_first(monkeypatch):
    """Make run_ring's first port one that a listening socket already holds; later ports
    are free. Returns the socket and the list of ports handed out."""
    taken = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    ports = []
    real = ring_module._free_port

    def next_port():
        ports.append(taken.getsockname()[1] if not ports else real())
        return ports[-1]

    monkeypatch.setattr(ring_module, "_free_port", next_port)
    return taken, ports


@pytest.mark.slow
def test_run_ring_retries_when_its_port_is_taken(monkeypatch):
    """Another process binds the port between _free_port and rank 0's TCPStore: the launch
    fails with EADDRINUSE, and run_ring starts again on a new port."""
    taken, ports = _port_taken_first(monkeypatch)
    with taken:
        assert run_ring(run_calls, 2, [], timeout=60.0) == [[], []]
    assert len(ports) == 2 and ports[0] != ports[1]


@pytest.mark.slow
def test_run_ring_gives_up_after_port_attempts(monkeypatch):
    """With every attempt's port taken, the error says so (EADDRINUSE), after
    PORT_ATTEMPTS launches (one here)."""
    monkeypatch.setattr(ring_module, "PORT_ATTEMPTS", 1)
    taken, ports = _port_taken_first(monkeypatch)
    with taken, pytest.raises(RuntimeError, match="EADDRINUSE"):
        run_ring(run_calls, 2, [], timeout=60.0)
    assert len(ports) == 1


@pytest.mark.parametrize("world", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("n", [1, 3, 16])
def test_ring_work_formulas(world, n):
    """Contiguous: rank r scores r + 1 blocks and r n^2 + n(n+1)/2 pairs; striped: all W
    blocks and W n(n-1)/2 + (r+1) n pairs; in both, the ranks together see the T(T+1)/2
    pairs of the causal mask. Not causal: every rank scores every pair."""
    T = world * n
    contiguous = ring_work(world, n, causal=True)
    striped = ring_work(world, n, causal=True, layout="striped")
    for r in range(world):
        assert contiguous[r] == {
            "scored": r + 1,
            "skipped": world - r - 1,
            "unmasked": r * n * n + n * (n + 1) // 2,
        }
        assert striped[r] == {
            "scored": world,
            "skipped": 0,
            "unmasked": world * n * (n - 1) // 2 + (r + 1) * n,
        }
    for work in (contiguous, striped):
        assert sum(w["unmasked"] for w in work) == T * (T + 1) // 2
    full = ring_work(world, n, causal=False, layout="striped")
    assert all(w == {"scored": world, "skipped": 0, "unmasked": T * n} for w in full)


@pytest.mark.parametrize("world", [2, 3, 4])
def test_striped_block_masks_are_the_causal_mask(world):
    """Each striped block's mask is the global causal mask restricted to the rank's and the
    source's positions (query aW + r, key bW + s)."""
    n = 4
    mask = causal_mask(world * n)  # True = may attend
    ones = torch.ones(1, n, 1)
    for r in range(world):
        for src in range(world):
            s = ring_module._block_scores(ones, ones, r, src, True, "striped")
            want = mask[r::world, src::world]
            assert torch.equal(torch.isfinite(s[0]), want), (r, src)


@pytest.mark.parametrize("layout", ["contiguous", "striped"])
@pytest.mark.parametrize("world", [1, 2, 3])
def test_shard_and_gather_sequence_are_inverse(layout, world):
    x = torch.arange(2 * world * 4 * 3.0).view(2, world * 4, 3)
    shards = [shard_sequence(x, r, world, layout) for r in range(world)]
    assert all(s.shape == (2, 4, 3) for s in shards)
    assert torch.equal(gather_sequence(shards, layout), x)
    if layout == "striped":  # rank 1 holds positions 1, 1 + W, ...
        assert torch.equal(shards[-1][0, :, 0], x[0, world - 1 :: world, 0])


def test_layout_and_trace_are_validated():
    with pytest.raises(ValueError, match="layout: got 'zigzag'"):
        ring_work(2, 3, layout="zigzag")
    with pytest.raises(ValueError, match="layout: got 'zigzag'"):
        shard_sequence(torch.zeros(1, 4, 2), 0, 2, "zigzag")
    with pytest.raises(ValueError, match="x: got T=5 positions, expected a multiple of W=2"):
        shard_sequence(torch.zeros(1, 5, 2), 0, 2)
    with pytest.raises(ValueError, match="world_size"):
        ring_work(0, 3)
    with pytest.raises(ValueError, match="rank: got 2, expected an int in 0..1"):
        shard_sequence(torch.zeros(1, 4, 2), 2, 2)
