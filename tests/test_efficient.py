"""The fast paths (chapter 12): tiled attention, the fused multi-head path, the KV cache.

Every fast path is checked against the explicit implementation it replaces:
same outputs, same gradients, same tokens. Speed is never asserted here (see
``python -m benchmarks``); memory is, where it can be counted exactly: the
largest tensor tiled attention ever creates, and the peak measured by the
benchmark's own method.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.testing import assert_close
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from attention_course import (
    MultiHeadAttention,
    Transformer,
    causal_mask,
    copy_weights_from_torch,
    greedy_decode,
    padding_mask,
    scaled_dot_product_attention,
    split_heads,
    tiled_attention,
    to_additive_mask,
    to_torch_mha_mask,
)
from attention_course.embedding import embed_tokens
from attention_course.kv_cache import AttentionCache, MemoryCache
from attention_course.transformer import KVCache

ROOT = Path(__file__).resolve().parents[1]
B, H = 2, 3


def randn(*shape, dtype=torch.float32):
    return torch.randn(*shape, dtype=dtype)


def make_mask(kind: str, t: int, s: int) -> torch.Tensor | None:
    """Masks of every kind the course accepts, each broadcastable to (B, H, t, s)."""
    if kind == "none":
        return None
    if kind == "causal":  # (t, s): query i sees keys 0..i (rectangular when t != s)
        return causal_mask(max(t, s))[:t, :s]
    if kind == "padding":  # (B, 1, 1, s)
        return padding_mask(torch.tensor([s, max(1, s // 2)]), s)[:, None, None, :]
    if kind == "random":  # (B, H, t, s)
        return torch.rand(B, H, t, s) > 0.4
    if kind == "additive":  # float (1, H, t, s), 0 / -inf
        return to_additive_mask(torch.rand(1, H, t, s) > 0.4)
    if kind == "empty rows":  # (B, 1, t, s) with query rows that may attend to nothing
        mask = torch.rand(B, 1, t, s) > 0.4
        mask[0, 0, 1] = False
        mask[1, 0, -1] = False
        return mask
    raise ValueError(kind)


MASKS = ["none", "causal", "padding", "random", "additive", "empty rows"]


# --- tiled attention ----------------------------------------------------------------------


@pytest.mark.parametrize("kind", MASKS)
@pytest.mark.parametrize(
    "t, s, dk, dv, block",
    [(16, 16, 8, 8, 4), (13, 29, 8, 5, 5), (29, 13, 6, 7, 8), (7, 11, 4, 4, 128), (9, 6, 3, 2, 1)],
    ids=["square", "T<S,Dk!=Dv", "T>S", "one-block", "block=1"],
)
def test_tiled_attention_equals_sdpa_in_float32(kind, t, s, dk, dv, block):
    q, k, v = randn(B, H, t, dk), randn(B, H, s, dk), randn(B, H, s, dv)
    mask = make_mask(kind, t, s)
    out = tiled_attention(q, k, v, mask=mask, block_size=block)
    ref, _ = scaled_dot_product_attention(q, k, v, mask=mask)
    assert out.shape == (B, H, t, dv) and out.dtype == torch.float32
    assert_close(out, ref, atol=1e-5, rtol=1e-5)
    if kind != "empty rows":  # PyTorch's kernel gives NaN there; ours gives zeros
        assert_close(
            out, F.scaled_dot_product_attention(q, k, v, attn_mask=mask), atol=1e-5, rtol=1e-5
        )
    else:
        assert bool((out[0, :, 1] == 0).all()) and bool((out[1, :, -1] == 0).all())


def test_tiled_attention_broadcasts_leading_axes():
    t, s, d = 10, 7, 4
    q = randn(B, H, t, d)
    k = randn(1, H, s, d)  # one set of keys shared by the batch
    v = randn(B, 1, s, d)  # one set of values shared by the heads
    mask = make_mask("padding", t, s)
    ref, _ = scaled_dot_product_attention(q, k, v, mask=mask)
    assert_close(tiled_attention(q, k, v, mask=mask, block_size=3), ref, atol=1e-5, rtol=1e-5)
    # 3-D (B, T, D) and 2-D (T, D) inputs work too
    ref3, _ = scaled_dot_product_attention(q[:, 0], k[:, 0], v[:, 0])
    assert_close(tiled_attention(q[:, 0], k[:, 0], v[:, 0], block_size=3), ref3)
    ref2, _ = scaled_dot_product_attention(q[0, 0], k[0, 0], v[0, 0], mask=causal_mask(10)[:, :7])
    out2 = tiled_attention(q[0, 0], k[0, 0], v[0, 0], mask=causal_mask(10)[:, :7], block_size=4)
    assert_close(out2, ref2)


@pytest.mark.parametrize("kind", ["none", "causal", "additive", "empty rows"])
def test_tiled_attention_gradients_equal_the_explicit_ones(kind):
    t, s = 11, 9
    q = randn(B, H, t, 4, dtype=torch.float64).requires_grad_()
    k = randn(B, 1, s, 4, dtype=torch.float64).requires_grad_()  # broadcast over heads
    v = randn(B, H, s, 3, dtype=torch.float64).requires_grad_()
    mask = make_mask(kind, t, s)
    if mask is not None and mask.is_floating_point():
        mask = mask.double()
    grad = torch.randn(B, H, t, 3, dtype=torch.float64)
    ours = torch.autograd.grad(tiled_attention(q, k, v, mask=mask, block_size=4), (q, k, v), grad)
    ref, _ = scaled_dot_product_attention(q, k, v, mask=mask)
    theirs = torch.autograd.grad(ref, (q, k, v), grad)
    for name, a, b in zip("qkv", ours, theirs):
        assert bool(torch.isfinite(a).all()), name
        assert_close(a, b, msg=f"gradient with respect to {name}")
    if kind == "empty rows":
        assert bool((ours[0][0, :, 1] == 0).all())  # a query that sees nothing learns nothing


def test_tiled_attention_passes_gradcheck():
    q = randn(1, 2, 5, 3, dtype=torch.float64).requires_grad_()
    k = randn(1, 2, 7, 3, dtype=torch.float64).requires_grad_()
    v = randn(1, 2, 7, 2, dtype=torch.float64).requires_grad_()
    mask = causal_mask(7)[:5]
    assert torch.autograd.gradcheck(
        lambda *x: tiled_attention(*x, mask=mask, block_size=2), (q, k, v)
    )


class LargestTensor(TorchDispatchMode):
    """Records the largest memory block (storage) of any tensor an operation returns.

    Storage bytes, not numel: an ``expand``-ed view has many elements but no memory.
    """

    def __init__(self):
        super().__init__()
        self.nbytes = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for x in tree_flatten(out)[0]:
            if isinstance(x, torch.Tensor):
                self.nbytes = max(self.nbytes, x.untyped_storage().nbytes())
        return out


@pytest.mark.parametrize("kind", ["none", "causal", "padding"])
def test_tiled_attention_never_materialises_the_scores(kind):
    t = s = 64
    d, block = 4, 8
    q, k, v = (randn(B, H, n, d).requires_grad_() for n in (t, s, s))
    mask = make_mask(kind, t, s)
    with LargestTensor() as seen:
        out = tiled_attention(q, k, v, mask=mask, block_size=block)
        out.sum().backward()  # the backward pass recomputes tiles instead of storing them
    inputs = 4 * B * H * t * d  # bytes of q, k, v, the output and each gradient
    tile = 4 * H * block * block  # one group (a batch element) of score tiles
    scores = 4 * B * H * t * s  # the T x S scores of every batch element and head
    assert seen.nbytes <= max(inputs, tile)
    assert seen.nbytes <= scores / 10

    with LargestTensor() as naive:  # the explicit path, for contrast
        scaled_dot_product_attention(q, k, v, mask=mask)[0].sum().backward()
    assert naive.nbytes >= scores


def test_tiled_attention_keeps_half_precision_dtype():
    q, k, v = (randn(B, H, 12, 8).to(torch.bfloat16) for _ in range(3))
    out = tiled_attention(q, k, v, mask=causal_mask(12), block_size=5)
    ref, _ = scaled_dot_product_attention(q.float(), k.float(), v.float(), mask=causal_mask(12))
    assert out.dtype == torch.bfloat16
    assert_close(out.float(), ref, atol=3e-2, rtol=3e-2)


@pytest.mark.parametrize("block", [0, -1, 2.5, True])
def test_tiled_attention_rejects_a_bad_block_size(block):
    q = randn(2, 4)
    with pytest.raises(ValueError, match="block_size"):
        tiled_attention(q, q, q, block_size=block)


# --- the fused multi-head path ------------------------------------------------------------


@pytest.mark.parametrize("kind", ["none", "causal", "random", "additive", "empty rows"])
def test_fused_path_gives_the_explicit_outputs_and_gradients(randomize, kind):
    d, t = 12, 6
    mha = randomize(MultiHeadAttention(d, H).double())
    x = randn(B, t, d, dtype=torch.float64).requires_grad_()
    mask = make_mask(kind, t, t)
    if mask is not None and mask.is_floating_point():
        mask = mask.double()

    def run(need_weights):
        mha.zero_grad()
        x.grad = None
        out, _ = mha(x, x, x, mask=mask, need_weights=need_weights)
        out.square().sum().backward()
        return out, [x.grad, *(p.grad for p in mha.parameters())]

    fused, fused_grads = run(False)
    explicit, explicit_grads = run(True)
    assert_close(fused, explicit)
    for a, b in zip(fused_grads, explicit_grads):
        assert bool(torch.isfinite(a).all())
        assert_close(a, b)


def test_fused_path_matches_nn_multihead_attention_forward_and_backward(randomize):
    d, t = 16, 7
    theirs = nn.MultiheadAttention(d, 4, batch_first=True)
    ours = MultiHeadAttention(d, 4)
    randomize(theirs)
    copy_weights_from_torch(ours, theirs)
    x = randn(B, t, d).requires_grad_()
    mask = causal_mask(t)
    out, _ = ours(x, x, x, mask=mask, need_weights=False)
    ref, _ = theirs(x, x, x, attn_mask=to_torch_mha_mask(mask), need_weights=False)
    assert_close(out, ref)
    (grad_ours,) = torch.autograd.grad(out.sum(), x)
    (grad_theirs,) = torch.autograd.grad(ref.sum(), x)
    assert_close(grad_ours, grad_theirs)


# --- the KV cache -------------------------------------------------------------------------


@pytest.mark.parametrize("need_weights", [True, False], ids=["weights", "fused"])
def test_attention_fed_through_a_cache_chunk_by_chunk_equals_causal_attention(need_weights):
    """MultiHeadAttention with an AttentionCache: each chunk's queries see all earlier keys."""
    torch.manual_seed(0)
    attn = MultiHeadAttention(12, 3).double().eval()
    x = torch.randn(2, 9, 12, dtype=torch.float64)
    full, _ = attn(x, x, x, mask=causal_mask(9))
    cache, start, outputs = AttentionCache(), 0, []
    for size in [1, 3, 1, 4]:
        new = x[:, start : start + size]
        mask = causal_mask(size, S=start + size)  # the new queries are the last ones
        out, weights = attn(new, new, new, mask=mask, need_weights=need_weights, cache=cache)
        assert (weights is None) != need_weights
        outputs.append(out)
        start += size
        assert cache.length == start and cache.keys.shape == (2, 3, start, 4)
    assert_close(torch.cat(outputs, dim=1), full)


def test_a_memory_cache_projects_the_memory_once():
    torch.manual_seed(0)
    attn = MultiHeadAttention(8, 2).double().eval()
    x, memory = torch.randn(2, 3, 8, dtype=torch.float64), torch.randn(2, 5, 8, dtype=torch.float64)
    cache = MemoryCache()
    first, _ = attn(x[:, :1], memory, memory, cache=cache)
    assert cache.filled
    keys = cache.keys
    # later steps read the stored projections: even a different "memory" changes nothing
    second, _ = attn(x[:, 1:], torch.zeros_like(memory), torch.zeros_like(memory), cache=cache)
    assert cache.keys is not None and torch.equal(cache.keys, keys)
    assert_close(torch.cat([first, second], dim=1), attn(x, memory, memory)[0])


def test_attend_on_projected_heads_is_the_module_after_its_projections():
    """The entry point for variants that transform q, k, v first (rotary positions, ...)."""
    torch.manual_seed(0)
    attn = MultiHeadAttention(8, 2, kdim=5, vdim=6).double().eval()
    q, k, v = (torch.randn(2, n, d, dtype=torch.float64) for n, d in [(3, 8), (4, 5), (4, 6)])
    mask = causal_mask(3, S=4)
    heads = [split_heads(w(t), 2) for w, t in [(attn.w_q, q), (attn.w_k, k), (attn.w_v, v)]]
    out, weights = attn.attend(*heads, mask=mask)
    expected, expected_weights = attn(q, k, v, mask=mask)
    assert_close(out, expected)
    assert_close(weights, expected_weights)


BOS, EOS, PAD = 1, 2, 0


def small_model(randomize, norm_first, pad_id, dtype=torch.float64, layers=2, max_len=128):
    model = Transformer(13, 11, d_model=16, num_heads=4, num_encoder_layers=layers,
                        num_decoder_layers=layers, d_ff=24, dropout=0.1, max_len=max_len,
                        norm_first=norm_first, pad_id=pad_id)  # fmt: skip
    return randomize(model).to(dtype).eval()


def padded_source(pad_id):
    src = torch.randint(3, 13, (5, 9))
    if pad_id is not None:
        src[1, 6:] = pad_id  # two sources with padding
        src[3, 2:] = pad_id
    return src


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("pad_id", [None, PAD], ids=["no-pad", "pad"])
@pytest.mark.parametrize("norm_first", [False, True], ids=["post-norm", "pre-norm"])
def test_cached_greedy_decode_gives_the_recomputed_tokens(randomize, norm_first, pad_id, dtype):
    model = small_model(randomize, norm_first, pad_id, dtype)
    src = padded_source(pad_id)
    cached = greedy_decode(model, src, 70, BOS, EOS)  # > 64 positions: the buffers grow once
    recomputed = greedy_decode(model, src, 70, BOS, EOS, use_cache=False)
    assert torch.equal(cached, recomputed)
    assert cached.shape[1] > 2  # not a trivial run that stopped at once


@pytest.mark.parametrize("norm_first", [False, True], ids=["post-norm", "pre-norm"])
def test_decode_with_cache_equals_decoding_the_whole_prefix(randomize, norm_first):
    model = small_model(randomize, norm_first, PAD)
    src = padded_source(PAD)
    tgt = torch.randint(3, 11, (5, 75))
    tgt[:, 0] = BOS
    tgt[2, 40:] = PAD  # a target that ended: its padded keys stay masked
    memory = model.encode(src)
    full, full_weights = model.decode(tgt, memory, src=src, return_attention=True)
    cache, start = KVCache(), 0
    for size in [1, 3, 1, 64, 6]:  # chunks of new tokens, one at a time or several at once
        new = tgt[:, start : start + size]
        logits, weights = model.decode(new, memory, src=src, return_attention=True, cache=cache)
        assert_close(logits, full[:, start : start + size])
        for layer_w, full_w in zip(weights, full_weights):
            end = start + size  # the new queries see the keys 0 .. end - 1
            assert_close(layer_w["self"], full_w["self"][:, :, start:end, :end])
            assert_close(layer_w["cross"], full_w["cross"][:, :, start:end])
        start += size
        assert cache.length == start
    assert start == tgt.shape[1]


@pytest.mark.parametrize("norm_first", [False, True], ids=["post-norm", "pre-norm"])
def test_fused_cached_steps_mask_padding_that_appears_mid_run(randomize, norm_first):
    """One token at a time on the fast path (no weights requested, masks converted once).

    No target is padded at first, so the cache keeps no padding mask; from step 7 one
    target is padded and from step 12 another, and their padded keys must stay hidden.
    A fully padded source row gives fully masked cross-attention rows: zeros, not NaN.
    """
    model = small_model(randomize, norm_first, PAD)
    src = padded_source(PAD)
    src[0] = PAD  # nothing to attend to in cross-attention for sequence 0
    tgt = torch.randint(3, 11, (5, 20))
    tgt[:, 0] = BOS
    tgt[4, 7:] = PAD
    tgt[2, 12:] = PAD
    memory = model.encode(src)
    full = model.decode(tgt, memory, src=src)
    cache = KVCache()
    for t in range(tgt.shape[1]):
        logits = model.decode(tgt[:, t : t + 1], memory, src=src, cache=cache)
        assert torch.isfinite(logits).all()
        assert_close(logits, full[:, t : t + 1])
        assert (cache.target_keep is None) == (t < 7)
    assert cache.target_keep.tolist() == (tgt != PAD).tolist()


def test_greedy_decode_returns_an_ordinary_tensor_usable_in_training(randomize):
    """greedy_decode runs under inference_mode; what it returns must still work with autograd."""
    model = small_model(randomize, False, PAD).train()
    src = padded_source(PAD)
    tokens = greedy_decode(model, src, 6, BOS, EOS)
    assert not tokens.is_inference() and model.training  # the mode is restored
    model(src, tokens).sum().backward()  # e.g. training on the model's own outputs
    assert model.tgt_embedding.weight.grad is not None


def test_the_cache_holds_projected_keys_values_and_memory(randomize):
    model = small_model(randomize, False, PAD, layers=3)
    src = padded_source(PAD)
    memory = model.encode(src)
    cache = KVCache()
    tokens = torch.full((5, 1), BOS)
    for _ in range(4):
        logits = model.decode(tokens[:, -1:], memory, src=src, cache=cache)
        tokens = torch.cat([tokens, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    assert cache.length == 4 and len(cache.layers) == 3
    for layer, layer_cache in zip(model.decoder.layers, cache.layers):
        assert layer_cache.keys.shape == layer_cache.values.shape == (5, 4, 4, 4)  # (B, H, t, Dh)
        memory_keys = split_heads(layer.cross_attn.w_k(memory), 4)  # (B, H, S, Dh)
        assert_close(layer_cache.memory_keys, memory_keys)
        assert_close(layer_cache.memory_values, split_heads(layer.cross_attn.w_v(memory), 4))
    # the first layer's self-attention keys are the projections of the embedded tokens
    first = model.decoder.layers[0]
    x = embed_tokens(model.tgt_embedding, model.positional, tokens[:, :4])
    assert_close(cache.layers[0].keys, split_heads(first.self_attn.w_k(x), 4))


def test_decode_with_cache_rejects_bad_use(randomize):
    model = small_model(randomize, False, PAD, max_len=10)
    src = padded_source(PAD)
    tgt = torch.randint(3, 11, (5, 6))
    memory = model.encode(src)
    with pytest.raises(ValueError, match="cache"):
        model.decode(tgt[:, :1], memory, src=src, cache={})
    cache = KVCache()
    model.decode(tgt[:, :5], memory, src=src, cache=cache)
    with pytest.raises(ValueError, match="max_len=10"):
        model.decode(tgt, memory, src=src, cache=cache)  # 5 + 6 > 10 positions
    with pytest.raises(ValueError, match="batch size"):
        model.decode(tgt[:2, :1], memory[:2], src=src[:2], cache=cache)
    other = small_model(randomize, False, PAD, layers=3)
    with pytest.raises(ValueError, match="expected 3"):
        other.decode(tgt[:, :1], other.encode(src), src=src, cache=cache)
    with pytest.raises(ValueError, match="use_cache"):
        greedy_decode(model, src, 5, BOS, EOS, use_cache="yes")


# --- the benchmark's memory measurement ---------------------------------------------------


@pytest.mark.skipif(
    not os.access("/proc/self/clear_refs", os.W_OK), reason="needs Linux /proc/self/clear_refs"
)
def test_benchmark_memory_method_counts_the_naive_scores_and_not_the_tiles():
    """One fresh subprocess per implementation, as in ``python -m benchmarks``."""
    sys.path.insert(0, str(ROOT))
    from benchmarks.run import _measure_peak

    cfg = {"B": 1, "H": 2, "T": 2048, "Dh": 32, "block_size": 128}
    scores = 4 * cfg["B"] * cfg["H"] * cfg["T"] ** 2  # bytes of one float32 T x S matrix
    naive, _ = _measure_peak("naive", cfg, torch.device("cpu"), threads=1)
    tiled, _ = _measure_peak("tiled", cfg, torch.device("cpu"), threads=1)
    # naive: the scores and the weights exist at once; tiled: the output and a few tiles
    assert 1.9 * scores <= naive <= 3.5 * scores
    assert tiled <= naive / 10
