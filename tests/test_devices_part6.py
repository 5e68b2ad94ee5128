"""Part VI's package code on every device this machine has (the ``device`` fixture).

Each test builds a module (or calls a function) on the device, runs it forward (and
backward where it trains) and checks three things:

(a) every output, gradient, buffer and cache tensor is on that device (a mask, an
    ``arange``, an index or a buffer made on the CPU fails here on CUDA);
(b) the result equals the same computation on the CPU, both in float64, to ``TOL``
    (1e-10: float64 on CUDA differs from the CPU only by rounding, in the order of its
    sums and the last bit of an ``exp`` or a ``cos``; a decoding loop with a cache is
    compared with the full pass to 1e-9). The MoE
    layer scatters its experts' outputs with ``index_add_``, which CUDA runs with atomic
    adds in no fixed order (so does the backward of a gather); its tests use
    ``MOE_TOL`` (1e-8);
(c) float32 and bfloat16 inputs keep their dtype (outputs, caches), and stay close to the
    float64 result (float32 to 1e-4; bfloat16 loosely, to 5e-2, where no discrete choice
    such as a top-k can flip).

On a machine without CUDA only the ``cpu`` cases run: there (b) compares the CPU with
itself and checks nothing beyond determinism, so (a) and (b) bite only where the
``cuda`` cases run. (c) bites on both.

So that (a) bites on a laptop too, the last section runs the code whose forward pass
needs no data (no ``.item()``, no ``torch.where``) on PyTorch's ``meta`` device: tensors
with shapes and no storage. A tensor made without ``device=`` is on the CPU there too, and
an operation that mixes it with a meta tensor raises ("Tensor on device meta is not on
the expected device cpu"), as it would with a CUDA one. The MoE's expert loop and the
gated delta rule's input checks read data, so only their data-free parts (``route``, the
recurrences) run there; their device cases above cover the rest on CUDA.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch.testing import assert_close

from attention_course import (
    GPT,
    MoE,
    MultiHeadLatentAttention,
    StreamingAttentionCache,
    apply_rope,
    gated_delta_rule,
    linear_attention,
    load_balancing_loss,
    rope_frequencies,
    sink_attention,
    softcap,
    streaming_mask,
)
from attention_course.linear import _delta_chunked, _delta_recurrent
from attention_course.relative_positions import RotaryPositions

TOL = 1e-10  # float64, CUDA against the CPU
MOE_TOL = 1e-8  # float64 through index_add_ (atomic adds on CUDA, order not fixed)
LOOSE = {torch.float32: 1e-4, torch.bfloat16: 5e-2}  # against the float64 result
SCALINGS = [
    None,
    {"type": "linear", "factor": 4.0},
    {"type": "ntk", "factor": 4.0},
    {"type": "yarn", "factor": 4.0, "original_max_len": 16},
]


# ---- helpers ----------------------------------------------------------------------------


def _on(device: torch.device, *tensors) -> None:
    """(a): every tensor lives on ``device`` (compared by type: ``cuda`` is ``cuda:0``)."""
    for t in tensors:
        assert isinstance(t, torch.Tensor)
        assert t.device.type == device.type, f"a tensor on {t.device}, expected {device}"


def _tensors_of(obj, depth: int = 0) -> list[torch.Tensor]:
    """Every tensor an object (a cache) holds in its attributes, nested caches included."""
    if isinstance(obj, torch.Tensor):
        return [obj]
    if depth > 3:
        return []
    if isinstance(obj, (list, tuple)):
        return [t for item in obj for t in _tensors_of(item, depth + 1)]
    if hasattr(obj, "__dict__") and not isinstance(obj, (torch.nn.Module, type)):
        return [t for value in vars(obj).values() for t in _tensors_of(value, depth + 1)]
    return []


def _cache_on(device: torch.device, cache, expect_some: bool = True) -> list[torch.Tensor]:
    tensors = _tensors_of(cache)
    assert tensors or not expect_some, "the cache holds no tensor: nothing was checked"
    _on(device, *tensors)
    return tensors


def _module_on(device: torch.device, module: torch.nn.Module) -> None:
    _on(device, *module.parameters(), *module.buffers())


def _same(on_device: torch.Tensor, reference: torch.Tensor, tol: float = TOL) -> None:
    """(b): the device's result equals the CPU's (float64) to ``tol``."""
    assert on_device.dtype == reference.dtype
    assert_close(on_device.cpu(), reference, rtol=tol, atol=tol)


def _twins(module: torch.nn.Module, device: torch.device, randomize, seed: int = 0):
    """The module in float64 on the CPU (randomised: no default weight hides a bug) and a
    copy of it on ``device``."""
    reference = randomize(module.double(), seed)
    return reference, copy.deepcopy(reference).to(device)


def _same_grads(module, reference, device, tol: float = TOL) -> None:
    """Every parameter's gradient on the device equals the CPU's; at least one exists."""
    ref = dict(reference.named_parameters())
    seen = 0
    for name, p in module.named_parameters():
        if ref[name].grad is None:
            assert p.grad is None, name
            continue
        assert p.grad is not None, name
        _on(device, p.grad)
        _same(p.grad, ref[name].grad, tol)
        seen += 1
    assert seen > 0


def _loss(out: torch.Tensor, seed: int = 1) -> torch.Tensor:
    """A scalar that weighs every output entry differently (a plain sum would hide
    gradient errors that cancel)."""
    w = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed), dtype=out.dtype)
    return (out * w.to(out.device)).sum()


def _randn(*shape, seed: int = 0, dtype=torch.float64) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


# ---- latent.py: multi-head latent attention ----------------------------------------------


@pytest.mark.parametrize("absorbed", [False, True])
@pytest.mark.parametrize("q_rank", [None, 6])
def test_mla_forward_backward_on_device(device, randomize, absorbed, q_rank):
    layer = MultiHeadLatentAttention(16, 4, kv_rank=8, q_rank=q_rank)
    reference, on_device = _twins(layer, device, randomize)
    x = _randn(2, 5, 16)
    expected = reference(x, absorbed=absorbed)
    _loss(expected).backward()
    out = on_device(x.to(device), absorbed=absorbed)
    _on(device, out)
    _same(out, expected)
    _loss(out).backward()
    _same_grads(on_device, reference, device)


@pytest.mark.parametrize("absorbed", [False, True])
def test_mla_latent_cache_decoding_on_device(device, randomize, absorbed):
    """A prompt of 3, one token (no mask), then 2 (a rectangular causal mask): outputs and
    the cache's buffers on the device, equal to the CPU's."""
    reference, on_device = _twins(MultiHeadLatentAttention(16, 4, kv_rank=8), device, randomize)
    x = _randn(2, 6, 16)
    ref_cache, cache = reference.new_cache(), on_device.new_cache()
    with torch.no_grad():
        for part in (slice(0, 3), slice(3, 4), slice(4, 6)):
            expected = reference(x[:, part], cache=ref_cache, absorbed=absorbed)
            out = on_device(x[:, part].to(device), cache=cache, absorbed=absorbed)
            _on(device, out, cache.latent, cache.k_rope)
            _same(out, expected)
    tensors = _cache_on(device, cache)
    assert len(tensors) == 2 and cache.length == 6
    _same(cache.latent, ref_cache.latent)
    _same(cache.k_rope, ref_cache.k_rope)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("absorbed", [False, True])
def test_mla_keeps_float32_and_bfloat16(device, randomize, dtype, absorbed):
    reference, _ = _twins(MultiHeadLatentAttention(16, 4, kv_rank=8), device, randomize)
    layer = copy.deepcopy(reference).to(device, dtype)
    x = _randn(2, 5, 16)
    cache = layer.new_cache()
    with torch.no_grad():
        expected = reference(x, absorbed=absorbed)
        out = layer(x.to(device, dtype), cache=cache, absorbed=absorbed)
    assert out.dtype == dtype and cache.latent.dtype == cache.k_rope.dtype == dtype
    _on(device, out, *_cache_on(device, cache))
    tol = LOOSE[dtype]
    assert_close(out.double().cpu(), expected, rtol=tol, atol=tol)


def _mla_gpt(**kwargs):
    options = dict(d_model=16, num_heads=4, num_layers=2, max_len=32, pos="rope")
    return GPT(29, **{**options, "attention": "mla", "kv_rank": 8, **kwargs})


def test_gpt_mla_trains_and_decodes_on_device(device, randomize):
    reference, on_device = _twins(_mla_gpt(), device, randomize)
    ids = torch.randint(0, 29, (2, 7), generator=torch.Generator().manual_seed(2))
    expected = reference(ids)
    _loss(expected).backward()
    logits = on_device(ids.to(device))
    _on(device, logits)
    _same(logits, expected)
    _loss(logits).backward()
    _same_grads(on_device, reference, device)
    cache = on_device.eval().new_cache()
    with torch.no_grad():
        steps = [on_device(ids[:, :4].to(device), cache=cache)]
        steps += [on_device(ids[:, t : t + 1].to(device), cache=cache) for t in range(4, 7)]
    _on(device, *steps)
    _cache_on(device, cache.layers)
    _same(torch.cat(steps, dim=1), expected.detach(), 1e-9)  # the cached path, same logits


# ---- relative_positions.py: scaled RoPE --------------------------------------------------


@pytest.mark.parametrize("scaling", SCALINGS, ids=lambda s: "none" if s is None else s["type"])
def test_apply_rope_with_scaling_on_device(device, scaling):
    x = _randn(2, 3, 20, 8)
    per_sequence = torch.stack([torch.arange(5, 25), torch.arange(40, 60)])  # (B, T)
    for positions in (None, torch.arange(100, 120), per_sequence):
        expected = apply_rope(x, positions, scaling=scaling)
        moved = None if positions is None else positions.to(device)
        out = apply_rope(x.to(device), moved, scaling=scaling)
        _on(device, out)
        _same(out, expected)
    for dtype in (torch.float32, torch.bfloat16):
        out = apply_rope(x.to(device, dtype), scaling=scaling)
        assert out.dtype == dtype
        _on(device, out)
        tol = LOOSE[dtype]
        assert_close(out.double().cpu(), apply_rope(x, scaling=scaling), rtol=tol, atol=tol)


def test_rope_frequencies_are_the_same_on_every_device(device):
    """``rope_frequencies`` has no device argument: it returns CPU float64, by contract;
    ``RotaryPositions.frequencies`` puts them on the device of the tensor it is given."""
    for scaling in SCALINGS:
        inv_freq, factor = rope_frequencies(8, 10000.0, scaling)
        assert inv_freq.device.type == "cpu" and inv_freq.dtype == torch.float64
        pieces = RotaryPositions(scaling=scaling)
        for dtype in (torch.float64, torch.float32, torch.bfloat16):
            like = torch.zeros(1, device=device, dtype=dtype)
            on_device = pieces.frequencies(8, like)
            _on(device, on_device)
            assert on_device.dtype == (torch.float64 if dtype == torch.float64 else torch.float32)
            assert_close(on_device.double().cpu(), inv_freq, rtol=1e-6, atol=0)
        assert pieces.attention_factor == factor


@pytest.mark.parametrize("scaling", SCALINGS[1:], ids=lambda s: s["type"])
def test_rotary_positions_and_gpt_with_rope_scaling_on_device(device, randomize, scaling):
    q, k = _randn(2, 4, 6, 8, seed=1), _randn(2, 2, 6, 8, seed=2)
    pieces = RotaryPositions(scaling=scaling)
    callable_piece = RotaryPositions(scaling=lambda f: f / 4)
    for piece in (pieces, callable_piece):
        expected = piece.rotate(q, k, start=9)
        out = piece.rotate(q.to(device), k.to(device), start=9)
        _on(device, *out)
        for a, b in zip(out, expected, strict=True):
            _same(a, b)
    model = GPT(19, d_model=16, num_heads=2, num_layers=1, max_len=32, pos="rope")
    model = GPT(**{**model.config(), "rope_scaling": scaling})
    reference, on_device = _twins(model, device, randomize)
    ids = torch.randint(0, 19, (2, 9), generator=torch.Generator().manual_seed(3))
    expected = reference(ids)
    _loss(expected).backward()
    logits = on_device(ids.to(device))
    _same(logits, expected)
    _loss(logits).backward()
    _same_grads(on_device, reference, device)


# ---- sinks.py: StreamingLLM and learned sinks --------------------------------------------


def test_streaming_mask_is_made_on_the_device(device):
    mask = streaming_mask(9, 3, 2, device=device)
    _on(device, mask)
    assert mask.dtype == torch.bool
    assert torch.equal(mask.cpu(), streaming_mask(9, 3, 2))
    assert streaming_mask(9, 3, 2, device=str(device)).device.type == device.type


@pytest.mark.parametrize("mask_kind", ["none", "bool", "additive"])
def test_sink_attention_on_device(device, mask_kind):
    q, k, v = _randn(2, 3, 5, 4, seed=1), _randn(2, 3, 7, 4, seed=2), _randn(2, 3, 7, 6, seed=3)
    sinks = _randn(3, seed=4)
    mask = {
        "none": None,
        "bool": streaming_mask(7, 3, 1)[2:],  # (5, 7): the last 5 queries of 7
        "additive": torch.zeros(5, 7, dtype=torch.float64).masked_fill(
            ~streaming_mask(7, 3, 1)[2:], float("-inf")
        ),
    }[mask_kind]
    inputs = [t.clone().requires_grad_() for t in (q, k, v, sinks)]
    expected_out, expected_w = sink_attention(*inputs, mask=mask)
    _loss(expected_out).backward()
    moved = [t.to(device).requires_grad_() for t in (q, k, v, sinks)]
    out, weights = sink_attention(*moved, mask=None if mask is None else mask.to(device))
    _on(device, out, weights)
    _same(out, expected_out.detach())
    _same(weights, expected_w.detach())
    _loss(out).backward()
    for t, ref in zip(moved, inputs, strict=True):
        _on(device, t.grad)
        _same(t.grad, ref.grad)
    for dtype in (torch.float32, torch.bfloat16):
        cast = [t.detach().to(device, dtype) for t in (q, k, v, sinks)]
        out, weights = sink_attention(*cast, mask=None if mask is None else mask.to(device))
        assert out.dtype == weights.dtype == dtype
        tol = LOOSE[dtype]
        assert_close(out.double().cpu(), expected_out.detach(), rtol=tol, atol=tol)


@pytest.mark.parametrize("rotary", [False, True])
def test_streaming_cache_on_device(device, rotary):
    """Prompt of 4, then one token per step past the window (the rotary case shifts the
    sinks, with a ``torch.full`` of positions): every returned and stored tensor on the
    device, equal to the CPU's."""
    positions = RotaryPositions() if rotary else None
    ref_cache = StreamingAttentionCache(3, 2, positions)
    cache = StreamingAttentionCache(3, 2, positions)
    keys, values = _randn(1, 2, 9, 4, seed=5), _randn(1, 2, 9, 4, seed=6)
    for part in [slice(0, 4)] + [slice(t, t + 1) for t in range(4, 9)]:
        expected = ref_cache.update(keys[:, :, part], values[:, :, part])
        out = cache.update(keys[:, :, part].to(device), values[:, :, part].to(device))
        _on(device, *out)
        for a, b in zip(out, expected, strict=True):
            _same(a, b)
    _cache_on(device, cache)
    _on(device, cache.keys, cache.values)
    _same(cache.keys, ref_cache.keys)
    for dtype in (torch.float32, torch.bfloat16):
        typed = StreamingAttentionCache(3, 2, positions)
        for t in range(6):
            k, v = (x[:, :, t : t + 1].to(device, dtype) for x in (keys, values))
            out = typed.update(k, v)
        assert all(x.dtype == dtype for x in (*out, *_cache_on(device, typed)))


@pytest.mark.parametrize("layout", ["learned_sinks", "streaming"])
def test_gpt_with_sinks_trains_and_decodes_on_device(device, randomize, layout):
    options = dict(d_model=16, num_heads=4, num_kv_heads=2, num_layers=2, max_len=32, pos="rope")
    options |= {"sinks": True} if layout == "learned_sinks" else {"window": 3, "num_sink": 1}
    reference, on_device = _twins(GPT(17, **options), device, randomize)
    ids = torch.randint(0, 17, (2, 8), generator=torch.Generator().manual_seed(4))
    expected = reference(ids)
    _loss(expected).backward()
    logits = on_device(ids.to(device))
    _same(logits, expected)
    _loss(logits).backward()
    _same_grads(on_device, reference, device)
    ref_cache, cache = reference.eval().new_cache(), on_device.eval().new_cache()
    with torch.no_grad():
        for part in [slice(0, 3)] + [slice(t, t + 1) for t in range(3, 8)]:
            step = on_device(ids[:, part].to(device), cache=cache)
            _on(device, step)
            _same(step, reference(ids[:, part], cache=ref_cache))
    _cache_on(device, cache.layers)
    model32 = copy.deepcopy(on_device).float()
    with torch.no_grad():
        out32 = model32(ids.to(device))
    assert out32.dtype == torch.float32
    assert_close(out32.double().cpu(), expected.detach(), rtol=1e-4, atol=1e-4)


# ---- stability.py and the attention's qk_norm / softcap / final_softcap ------------------


def test_softcap_on_device_keeps_the_dtype(device):
    x = _randn(3, 7) * 20
    expected = softcap(x, 5.0)
    for dtype in (torch.float64, torch.float32, torch.bfloat16):
        out = softcap(x.to(device, dtype), 5.0)
        _on(device, out)
        assert out.dtype == dtype
        tol = TOL if dtype == torch.float64 else LOOSE[dtype]
        assert_close(out.double().cpu(), expected, rtol=tol, atol=tol)


@pytest.mark.parametrize(
    "options",
    [
        {"qk_norm": True},
        {"softcap": 2.0},
        {"qk_norm": True, "softcap": 2.0, "final_softcap": 3.0},
    ],
    ids=["qk_norm", "softcap", "all_three"],
)
def test_gpt_qk_norm_and_softcap_on_device(device, randomize, options):
    model = GPT(21, d_model=16, num_heads=4, num_layers=2, max_len=32, pos="rope", **options)
    reference, on_device = _twins(model, device, randomize)
    ids = torch.randint(0, 21, (2, 7), generator=torch.Generator().manual_seed(5))
    expected, expected_w = reference(ids, return_attention=True)
    _loss(expected).backward()
    logits, weights = on_device(ids.to(device), return_attention=True)
    _on(device, logits, *weights)
    _same(logits, expected)
    for a, b in zip(weights, expected_w, strict=True):
        _same(a, b.detach())
    _loss(logits).backward()
    _same_grads(on_device, reference, device)
    cache = on_device.eval().new_cache()
    with torch.no_grad():
        steps = [on_device(ids[:, :4].to(device), cache=cache)]
        steps += [on_device(ids[:, t : t + 1].to(device), cache=cache) for t in range(4, 7)]
    _cache_on(device, cache.layers)
    _same(torch.cat(steps, dim=1), expected.detach(), 1e-9)
    for dtype in (torch.float32, torch.bfloat16):
        with torch.no_grad():
            out = copy.deepcopy(on_device).to(dtype)(ids.to(device))
        assert out.dtype == dtype
        _on(device, out)
        tol = LOOSE[dtype] * (2 if dtype == torch.bfloat16 else 1)  # two layers, then a head
        assert_close(out.double().cpu(), expected.detach(), rtol=tol, atol=tol)


# ---- moe.py ------------------------------------------------------------------------------


@pytest.mark.parametrize("router_bias", [False, True])
def test_moe_layer_on_device(device, randomize, router_bias):
    """Forward, backward, the balancing loss, ``expert_load`` and ``update_router_bias`` on
    the device; to ``MOE_TOL`` (``index_add_`` is not deterministic on CUDA)."""
    layer = MoE(12, 10, num_experts=5, top_k=2, num_shared=1, router_bias=router_bias)
    reference, on_device = _twins(layer, device, randomize)
    if router_bias:  # a bias that changes the choice, not zeros
        reference.router_bias.copy_(0.5 * _randn(5, seed=9))
        on_device.router_bias.copy_(reference.router_bias)
    x = _randn(3, 6, 12, seed=7)
    expected, expected_logits = reference(x)
    aux = load_balancing_loss(expected_logits, 5, 2)
    (_loss(expected) + aux).backward()
    out, logits = on_device(x.to(device))
    _on(device, out, logits)
    _same(out, expected, MOE_TOL)
    _same(logits, expected_logits, MOE_TOL)
    aux_on_device = load_balancing_loss(logits, 5, 2)
    _on(device, aux_on_device)
    _same(aux_on_device, aux, MOE_TOL)
    (_loss(out) + aux_on_device).backward()
    _same_grads(on_device, reference, device, MOE_TOL)
    route = on_device.route(x.reshape(18, 12).to(device))
    _on(device, *route)
    for a, b in zip(route, reference.route(x.reshape(18, 12)), strict=True):
        _same(a.detach(), b.detach(), 0 if b.dtype == torch.int64 else MOE_TOL)
    load = on_device.expert_load(logits)
    _on(device, load)
    assert torch.equal(load.cpu(), reference.expert_load(expected_logits))
    assert int(load.sum()) == 18 * 2
    if router_bias:
        reference.update_router_bias(expected_logits, rate=0.1)
        used = on_device.update_router_bias(logits, rate=0.1)
        _on(device, used, on_device.router_bias)
        _same(on_device.router_bias, reference.router_bias)
    _module_on(device, on_device)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_moe_keeps_float32_and_bfloat16(device, randomize, dtype):
    """Outputs keep the input's dtype; the routing weights are float32 for bfloat16 (as
    documented). Values are compared in float32 only: in bfloat16 a rounded router logit
    may flip a top-k choice, which no tolerance covers."""
    reference, _ = _twins(MoE(12, 10, num_experts=4, top_k=2, router_bias=True), device, randomize)
    layer = copy.deepcopy(reference).to(device, dtype)
    x = _randn(2, 5, 12, seed=8)
    with torch.no_grad():
        out, logits = layer(x.to(device, dtype))
        _, weights, experts = layer.route(x.reshape(10, 12).to(device, dtype))
    assert out.dtype == logits.dtype == dtype
    assert weights.dtype == torch.float32 and experts.dtype == torch.int64
    _on(device, out, logits, weights, experts, layer.router_bias)
    if dtype == torch.float32:
        with torch.no_grad():
            expected, _ = reference(x)
        assert_close(out.double().cpu(), expected, rtol=1e-4, atol=1e-4)


def test_gpt_moe_trains_on_device(device, randomize):
    options = dict(d_model=16, num_heads=2, num_layers=2, max_len=32, pos="rope", norm="rms")
    options |= dict(ffn="moe", d_ff=12, num_experts=4, top_k=2, num_shared=1, router_bias=True)
    reference, on_device = _twins(GPT(23, **options), device, randomize)
    ids = torch.randint(0, 23, (2, 7), generator=torch.Generator().manual_seed(6))

    def step(model, tokens):
        logits, router_logits = model(tokens, return_router_logits=True)
        aux = load_balancing_loss(torch.cat(router_logits), 4, 2)
        (_loss(logits) + 0.01 * aux).backward()
        return logits, router_logits, aux

    expected, expected_router, expected_aux = step(reference, ids)
    logits, router_logits, aux = step(on_device, ids.to(device))
    _on(device, logits, aux, *router_logits)
    _same(logits, expected, MOE_TOL)
    _same(aux, expected_aux, MOE_TOL)
    for a, b in zip(router_logits, expected_router, strict=True):
        _same(a, b, MOE_TOL)
    _same_grads(on_device, reference, device, MOE_TOL)
    for block, ref_block in zip(on_device.blocks, reference.blocks, strict=True):
        ref_block.ffn.update_router_bias(expected_router[0], rate=0.1)
        block.ffn.update_router_bias(router_logits[0], rate=0.1)
        _same(block.ffn.router_bias, ref_block.ffn.router_bias)
    _module_on(device, on_device)


# ---- linear.py: linear attention and the gated delta rule --------------------------------


@pytest.mark.parametrize("causal", [False, True])
def test_linear_attention_float64_on_device(device, causal):
    """T = 70 crosses the causal form's 64-token chunk (a state carried from block to
    block)."""
    q, k, v = _randn(2, 70, 4, seed=1), _randn(2, 70, 4, seed=2), _randn(2, 70, 5, seed=3)
    inputs = [t.clone().requires_grad_() for t in (q, k, v)]
    expected = linear_attention(*inputs, causal=causal)
    _loss(expected).backward()
    moved = [t.to(device).requires_grad_() for t in (q, k, v)]
    out = linear_attention(*moved, causal=causal)
    _on(device, out)
    _same(out, expected.detach())
    _loss(out).backward()
    for t, ref in zip(moved, inputs, strict=True):
        _on(device, t.grad)
        _same(t.grad, ref.grad)
    for dtype in (torch.float32, torch.bfloat16):
        out = linear_attention(*(t.to(device, dtype) for t in (q, k, v)), causal=causal)
        assert out.dtype == dtype
        tol = LOOSE[dtype]
        assert_close(out.double().cpu(), expected.detach(), rtol=tol, atol=tol)


@pytest.mark.parametrize("chunk_size", [None, 3])
@pytest.mark.parametrize("with_state", [False, True])
def test_gated_delta_rule_float64_on_device(device, chunk_size, with_state):
    B, T, H, Dk, Dv = 2, 7, 2, 4, 3
    q = torch.nn.functional.normalize(_randn(B, T, H, Dk, seed=1), dim=-1)
    k = torch.nn.functional.normalize(_randn(B, T, H, Dk, seed=2), dim=-1)
    v = _randn(B, T, H, Dv, seed=3)
    g = -torch.rand(B, T, H, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    beta = torch.rand(B, T, H, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    state = _randn(B, H, Dk, Dv, seed=6) if with_state else None
    given = [q, k, v, g, beta] + ([state] if with_state else [])
    inputs = [t.clone().requires_grad_() for t in given]
    args = inputs + ([] if with_state else [None])
    expected, expected_state = gated_delta_rule(*args, chunk_size=chunk_size)
    (_loss(expected) + _loss(expected_state, seed=2)).backward()
    moved = [t.to(device).requires_grad_() for t in given]
    out, final = gated_delta_rule(*moved, *([] if with_state else [None]), chunk_size=chunk_size)
    _on(device, out, final)
    _same(out, expected.detach())
    _same(final, expected_state.detach())
    (_loss(out) + _loss(final, seed=2)).backward()
    for t, ref in zip(moved, inputs, strict=True):
        _on(device, t.grad)
        _same(t.grad, ref.grad)
    for dtype in (torch.float32, torch.bfloat16):
        cast = [t.to(device, dtype) for t in given] + ([] if with_state else [None])
        out, final = gated_delta_rule(*cast, chunk_size=chunk_size)
        assert out.dtype == final.dtype == dtype
        _on(device, out, final)
        tol = LOOSE[dtype]
        assert_close(out.double().cpu(), expected.detach(), rtol=tol, atol=tol)


# ---- the meta device: no tensor made on the CPU, on any machine --------------------------

META = torch.device("meta")


def _meta(*shape) -> torch.Tensor:
    return torch.empty(shape, device=META)


def _meta_gpt_block(**options):
    """One block of a GPT with ``options`` on the meta device (the GPT's own forward checks
    the token ids' values, which meta tensors do not have), and a fresh cache for it."""
    model = GPT(17, d_model=16, num_heads=4, num_layers=1, max_len=32, pos="rope", **options)
    return model.blocks[0].to(META), model.new_cache().layers[0]


def _mla_on_meta(absorbed: bool):
    layer = MultiHeadLatentAttention(16, 4, kv_rank=8, q_rank=6).to(META)
    cache = layer.new_cache()
    x = _meta(2, 5, 16)
    outs = [layer(x, absorbed=absorbed)]
    outs += [
        layer(x[:, part], cache=cache, absorbed=absorbed)
        for part in (slice(0, 3), slice(3, 4), slice(3, 5))
    ]
    return outs + _tensors_of(cache)


def _rope_on_meta():
    x = _meta(2, 3, 7, 8)
    outs = []
    for scaling in SCALINGS:
        outs += [
            apply_rope(x, scaling=scaling),
            apply_rope(x, torch.arange(7, device=META), scaling=scaling),
        ]
        pieces = RotaryPositions(scaling=scaling)
        outs += [*pieces.rotate(x, _meta(2, 1, 7, 8), start=4), pieces.frequencies(8, x)]
    return outs


def _sinks_on_meta():
    q, sinks = _meta(2, 3, 5, 4), _meta(3)
    mask = streaming_mask(5, 2, 1, device=META)
    outs = [mask, *sink_attention(q, q, q, sinks, mask=mask)]
    outs += [*sink_attention(q, q, q, sinks, mask=torch.zeros(5, 5, device=META))]
    for positions in (None, RotaryPositions()):
        cache, keys = StreamingAttentionCache(3, 2, positions), _meta(1, 2, 9, 4)
        outs += [*cache.update(keys[:, :, :4], keys[:, :, :4])]
        for t in range(4, 9):
            outs += [*cache.update(keys[:, :, t : t + 1], keys[:, :, t : t + 1])]
        outs += _tensors_of(cache)
    return outs


def _blocks_on_meta():
    """GPT blocks with Part VI's options. The non-MLA ones return their weights: without
    them the mask goes to PyTorch's fused kernel after a check of its values (``.any()``),
    which a meta tensor cannot answer; the weights path builds the same mask."""
    outs = []
    for options in (
        {"attention": "mla", "kv_rank": 8},
        {"sinks": True, "num_kv_heads": 2},
        {"window": 3, "num_sink": 1},
        {"qk_norm": True, "softcap": 2.0},
        {"rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_len": 8}},
    ):
        block, cache = _meta_gpt_block(**options)
        weights = "attention" not in options

        def run(x, cache=None, block=block, weights=weights):
            out = block(x, need_weights=weights, cache=cache)
            return list(out) if weights else [out]

        x = _meta(2, 6, 16)
        outs += run(x) + run(x[:, :3], cache)
        for t in range(3, 6):
            outs += run(x[:, t : t + 1], cache)
        outs += _tensors_of(cache)
    outs.append(softcap(_meta(2, 6, 17), 3.0))  # GPT's final_softcap
    return outs


def _moe_and_linear_on_meta():
    moe = MoE(12, 10, num_experts=4, top_k=2, router_bias=True).to(META)
    outs = [*moe.route(_meta(6, 12)), load_balancing_loss(_meta(6, 4), 4, 2)]
    outs += [
        linear_attention(_meta(2, 70, 4), _meta(2, 70, 4), _meta(2, 70, 5), causal=c)
        for c in (False, True)
    ]
    q, v, g, state = _meta(2, 2, 7, 4), _meta(2, 2, 7, 3), _meta(2, 2, 7), _meta(2, 2, 4, 3)
    outs += [*_delta_recurrent(q, q, v, g, g, state), *_delta_chunked(q, q, v, g, g, state, 3)]
    return outs


@pytest.mark.parametrize(
    "run",
    [
        lambda: _mla_on_meta(False),
        lambda: _mla_on_meta(True),
        _rope_on_meta,
        _sinks_on_meta,
        _blocks_on_meta,
        _moe_and_linear_on_meta,
    ],
    ids=[
        "mla_naive",
        "mla_absorbed",
        "rope_scaling",
        "sinks",
        "gpt_blocks",
        "moe_route_and_linear",
    ],
)
def test_part6_makes_no_tensor_on_the_cpu(run):
    """Runs on the meta device: a tensor made on the CPU inside would raise; every output
    and cache tensor must be a meta tensor."""
    outs = run()
    assert len(outs) > 3
    _on(META, *outs)
