"""One cache type per layer, written in one place; one mask per forward; position and
key/value layout pieces given to attention (issue #28).

These pin the structure, not only the numbers (the numbers are pinned by test_efficient,
test_gpt, test_kv and test_transformer): on the code before #28 the cache was written in
two places (``CausalSelfAttention.forward`` and ``MultiHeadAttention.attend``), the GPT's
cache carried the encoder-decoder's cross-attention slot, and a one-token step rebuilt its
mask in every layer.
"""

from __future__ import annotations

import ast
import inspect
import json
import re
from pathlib import Path

import pytest
import torch
from torch.testing import assert_close

import attention_course.fused as fused
from attention_course import (
    GPT,
    CausalSelfAttention,
    MultiHeadAttention,
    Transformer,
    apply_rope,
    greedy_decode,
)
from attention_course.fused import AttentionMask
from attention_course.kv import KVLayout, RollingAttentionCache
from attention_course.kv_cache import (
    AttentionCache,
    DecoderCache,
    KVCache,
    LayerKVCache,
    MemoryCache,
)
from attention_course.relative_positions import ALiBiPositions, RotaryPositions

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = re.compile(r"attention_course(\.|$)")
CACHE_TYPES = (AttentionCache, RollingAttentionCache, MemoryCache)


@pytest.fixture
def update_callers(monkeypatch):
    """Record, for every cache update, the function that called it."""
    callers = []
    for cls in CACHE_TYPES:
        original = cls.__dict__["update"]

        def update(self, keys, values, _original=original):
            callers.append(inspect.currentframe().f_back.f_code)
            return _original(self, keys, values)

        monkeypatch.setattr(cls, "update", update)
    return callers


def _small_transformer():
    torch.manual_seed(0)
    return Transformer(13, 11, d_model=16, num_heads=4, num_encoder_layers=2,
                       num_decoder_layers=3, d_ff=24, dropout=0.0, pad_id=0).eval()  # fmt: skip


@pytest.mark.parametrize(
    "kwargs", [{}, {"pos": "rope", "num_kv_heads": 2}, {"pos": "alibi", "window": 3}],
    ids=["learned", "rope-gqa", "alibi-window"],
)  # fmt: skip
def test_a_gpt_writes_its_cache_in_one_place_once_per_layer(update_callers, kwargs):
    torch.manual_seed(0)
    model = GPT(20, d_model=16, num_heads=4, num_layers=3, max_len=32, **kwargs).eval()
    cache = model.new_cache()
    ids = torch.randint(0, 20, (2, 9))
    with torch.no_grad():
        model(ids[:, :5], cache=cache)
        assert len(update_callers) == 3  # one update per layer for the prompt
        for t in range(5, 9):
            model(ids[:, t : t + 1], cache=cache)
    assert len(update_callers) == 3 * 5
    assert {code.co_qualname for code in update_callers} == {"MultiHeadAttention._remember"}


def test_the_encoder_decoder_writes_its_caches_in_the_same_one_place(update_callers):
    model = _small_transformer()
    src = torch.randint(1, 13, (2, 6))
    with torch.no_grad():
        tokens = greedy_decode(model, src, 6, 1, 2)
    assert tokens.shape[1] > 2
    assert {code.co_qualname for code in update_callers} == {"MultiHeadAttention._remember"}
    # self-attention: every layer at every step; the memory: every layer at the first step
    steps = tokens.shape[1] - 1
    assert len(update_callers) == 3 * steps + 3


def test_decoder_only_and_encoder_decoder_share_the_one_update_site(update_callers):
    torch.manual_seed(0)
    gpt = GPT(20, d_model=16, num_heads=4, num_layers=2).eval()
    model = _small_transformer()
    with torch.no_grad():
        gpt(torch.randint(0, 20, (1, 3)), cache=gpt.new_cache())
        greedy_decode(model, torch.randint(1, 13, (1, 4)), 3, 1, 2)
    assert len(update_callers) > 4 and len(set(update_callers)) == 1


def test_attend_never_sees_a_cache():
    assert "cache" not in inspect.signature(MultiHeadAttention.attend).parameters
    source = inspect.getsource(MultiHeadAttention.attend)
    assert ".update(" not in source


def test_one_cache_type_per_layer_decoder_agnostic_and_the_encoder_decoder_on_top():
    gpt_cache = GPT(20, d_model=16, num_heads=4, num_layers=2).new_cache()
    assert type(gpt_cache) is DecoderCache and len(gpt_cache.layers) == 2
    assert all(type(layer) is AttentionCache for layer in gpt_cache.layers)
    # nothing of the encoder-decoder in a GPT's cache
    for name in ("memory_mask", "target_keep", "memory", "cross_attn"):
        assert not hasattr(gpt_cache, name) and not hasattr(gpt_cache.layers[0], name)
    windowed = GPT(20, d_model=16, num_heads=4, num_layers=2, window=4).new_cache()
    assert all(type(layer) is RollingAttentionCache for layer in windowed.layers)
    # the encoder-decoder's cache extends the decoder's: each layer is a self-attention
    # AttentionCache with the memory's cache added
    assert issubclass(KVCache, DecoderCache) and issubclass(LayerKVCache, AttentionCache)
    model = _small_transformer()
    src = torch.randint(1, 13, (2, 6))
    cache = KVCache()
    with torch.no_grad():
        model.decode(torch.ones(2, 1, dtype=torch.long), model.encode(src), src=src, cache=cache)
    assert all(isinstance(layer.memory, MemoryCache) for layer in cache.layers)
    assert cache.nbytes == sum(layer.nbytes for layer in cache.layers)
    assert cache.layers[0].nbytes > AttentionCache.nbytes.fget(cache.layers[0])  # + memory


class _MaskRecorder:
    """Records the mask each layer's attention is given (GPT: CausalSelfAttention.forward)."""

    def __init__(self, monkeypatch, cls, arg):
        self.masks = []
        original = cls.forward

        def forward(module, *args, **kwargs):
            bound = inspect.signature(original).bind(module, *args, **kwargs)
            self.masks.append(bound.arguments.get(arg))
            return original(module, *args, **kwargs)

        monkeypatch.setattr(cls, "forward", forward)


@pytest.mark.parametrize("T", [1, 5])
@pytest.mark.parametrize(
    "kwargs", [{}, {"pos": "alibi"}, {"window": 3}], ids=["causal", "alibi", "window"]
)
@pytest.mark.parametrize("return_attention", [False, True])
def test_a_gpt_builds_one_mask_per_forward_and_gives_it_to_every_layer(
    monkeypatch, T, kwargs, return_attention
):
    torch.manual_seed(0)
    model = GPT(20, d_model=16, num_heads=4, num_layers=3, max_len=32, **kwargs).eval()
    cache = model.new_cache()
    with torch.no_grad():
        model(torch.randint(0, 20, (2, 4)), cache=cache)
    recorder = _MaskRecorder(monkeypatch, CausalSelfAttention, "mask")
    built = []
    original = fused.prepare_fused_mask
    monkeypatch.setattr(fused, "prepare_fused_mask", lambda *a: built.append(1) or original(*a))
    with torch.no_grad():
        model(torch.randint(0, 20, (2, T)), cache=cache, return_attention=return_attention)
    masks = recorder.masks
    assert len(masks) == 3 and all(type(m) is AttentionMask for m in masks)
    assert masks[0] is masks[1] is masks[2]  # one object, built once
    assert len(built) <= 1  # converted for the fused kernel at most once


def test_the_transformer_builds_each_mask_once_per_forward(monkeypatch):
    model = _small_transformer()
    src, tgt = torch.randint(1, 13, (2, 6)), torch.randint(1, 11, (2, 5))
    src[1, 4:] = 0
    tgt[0, 3:] = 0
    built = []
    original = fused.prepare_fused_mask
    monkeypatch.setattr(fused, "prepare_fused_mask", lambda *a: built.append(1) or original(*a))
    from attention_course import transformer

    self_masks = _MaskRecorder(monkeypatch, transformer.DecoderLayer, "tgt_mask").masks
    with torch.no_grad():
        model(src, tgt)
    # one source mask (encoder and cross-attention) and one target mask, each converted once
    assert len(built) == 2
    assert len(self_masks) == 3 and all(type(m) is AttentionMask for m in self_masks)
    assert self_masks[0] is self_masks[1] is self_masks[2]


def test_the_classifier_converts_its_padding_mask_once(monkeypatch):
    # chapter 11's classifier: one mask for every encoder layer, converted once (it was
    # converted again in each of the 3 layers)
    from attention_course import TransformerClassifier

    model = TransformerClassifier(20, 3, d_model=16, num_heads=4, num_layers=3, d_ff=32).eval()
    tokens = torch.randint(1, 20, (2, 7))
    tokens[1, 5:] = 0  # padding
    built = []
    original = fused.prepare_fused_mask
    monkeypatch.setattr(fused, "prepare_fused_mask", lambda *a: built.append(1) or original(*a))
    with torch.no_grad():
        logits = model(tokens)
    assert len(built) == 1 and logits.shape == (2, 3)


# --- the pieces attention is given ---------------------------------------------------------


def test_a_gpt_gives_every_layer_the_same_pieces():
    model = GPT(20, d_model=16, num_heads=4, num_layers=3, pos="rope", num_kv_heads=2, window=5)
    assert isinstance(model.attention_positions, RotaryPositions)
    assert isinstance(model.kv_layout, KVLayout)
    assert (model.kv_layout.num_kv_heads, model.kv_layout.window) == (2, 5)
    for block in model.blocks:
        assert block.attn.positions is model.attention_positions
        assert block.attn.layout is model.kv_layout
    assert GPT(20, d_model=16, num_heads=4, pos="learned").attention_positions is None
    alibi = GPT(20, d_model=16, num_heads=4, pos="alibi").attention_positions
    assert isinstance(alibi, ALiBiPositions) and alibi.num_heads == 4


def test_a_position_piece_given_to_the_attention_module_is_the_same_as_its_name():
    torch.manual_seed(0)
    by_name = CausalSelfAttention(16, 4, pos="rope", rope_fn=None).double().eval()
    given = CausalSelfAttention(16, 4, positions=RotaryPositions()).double().eval()
    given.load_state_dict(by_name.state_dict())
    assert given.pos == "rope" and given.rope_fn is None
    x = torch.randn(2, 7, 16, dtype=torch.float64)
    assert_close(given(x), by_name(x))
    with pytest.raises(ValueError, match="positions"):
        CausalSelfAttention(16, 4, pos="rope", positions=RotaryPositions())
    with pytest.raises(ValueError, match="positions"):
        CausalSelfAttention(16, 4, positions="rope")
    with pytest.raises(ValueError, match="layout"):
        CausalSelfAttention(16, 4, num_kv_heads=2, layout=KVLayout(4, 2))
    with pytest.raises(ValueError, match="layout"):
        CausalSelfAttention(16, 4, layout=KVLayout(2))


def test_rotary_positions_rotate_as_apply_rope_and_take_a_custom_rotation():
    torch.manual_seed(0)
    q = torch.randn(2, 4, 6, 8, dtype=torch.float64)
    k = torch.randn(2, 2, 6, 8, dtype=torch.float64)
    positions = torch.arange(3, 9)
    rq, rk = RotaryPositions().rotate(q, k, start=3)
    assert torch.equal(rq, apply_rope(q, positions)) and torch.equal(rk, apply_rope(k, positions))
    rq, _ = RotaryPositions(base=500.0).rotate(q, k, start=3)
    assert torch.equal(rq, apply_rope(q, positions, base=500.0))
    seen = []
    mine = RotaryPositions(rotate=lambda x, p: seen.append(p.tolist()) or -x)
    rq, rk = mine.rotate(q, k, start=3)
    assert torch.equal(rq, -q) and torch.equal(rk, -k) and seen == [list(range(3, 9))] * 2


def test_a_scaling_rope_variant_fits_the_position_piece():
    """Part VI's scaled RoPE plugs in as ``scaling=``: linear position interpolation by 2
    (frequencies halved) rotates position 2p as the plain rotation rotates p."""
    torch.manual_seed(0)
    q = torch.randn(1, 2, 8, 16, dtype=torch.float64)
    scaled = RotaryPositions(scaling=lambda inv_freq: inv_freq / 2)
    rq, _ = scaled.rotate(q, q, start=0)  # positions 0 .. 7
    assert_close(rq[:, :, 0::2], apply_rope(q[:, :, 0::2], torch.arange(4)))  # 0, 2, 4, 6
    assert not torch.allclose(rq, RotaryPositions().rotate(q, q)[0])
    with torch.no_grad():  # and a model built with it runs, with its cache
        attn = CausalSelfAttention(16, 2, positions=scaled).double().eval()
        x = torch.randn(2, 6, 16, dtype=torch.float64)
        cache = AttentionCache()
        parts = [attn(x[:, a:b], cache=cache) for a, b in [(0, 4), (4, 5), (5, 6)]]
        assert_close(torch.cat(parts, dim=1), attn(x))
    with pytest.raises(ValueError, match="scaling"):
        RotaryPositions(rotate=apply_rope, scaling=lambda f: f)


def test_alibi_positions_put_their_bias_into_the_one_mask():
    from attention_course.relative_positions import alibi_causal_mask

    visible = KVLayout(4, window=3).visible(2, 5)  # (2, 5) sliding window
    got = ALiBiPositions(4).score_mask(2, 5, visible, None, torch.float64)
    want = alibi_causal_mask(4, 2, 5, None, torch.float64, True, keep=visible)
    assert torch.equal(got, want) and got.shape == (4, 2, 5)
    assert torch.isneginf(got[:, ~visible]).all()
    layout = GPT(20, d_model=16, num_heads=4, pos="alibi").kv_layout  # one query: still biased
    from attention_course.gpt import causal_attention_mask

    one = causal_attention_mask(1, 6, layout, ALiBiPositions(4), dtype=torch.float64)
    assert one.dense.shape == (4, 1, 6) and not torch.isinf(one.dense).any()
    assert causal_attention_mask(1, 6, layout, RotaryPositions()).dense is None


def test_kv_layout_repeats_the_heads_and_makes_the_caches():
    layout = KVLayout(8, 2, window=4)
    assert layout.n_rep == 4 and type(layout.new_cache()) is RollingAttentionCache
    k = torch.randn(1, 2, 5, 3)
    expanded, _ = layout.expand(k, k)
    assert torch.equal(expanded, torch.repeat_interleave(k, 4, dim=1))
    assert type(KVLayout(8).new_cache()) is AttentionCache
    assert KVLayout(8).expand(k, k)[0] is k  # nothing to repeat
    with pytest.raises(ValueError, match="num_kv_heads"):
        KVLayout(8, 3)
    with pytest.raises(ValueError, match="RollingAttentionCache"):
        layout.check_cache(AttentionCache())


# --- chapter 14 swaps the layout through the pieces -----------------------------------------


def _assigned_package_attributes(path: Path) -> list[str]:
    """Assignments in a notebook's code cells whose target is an attribute of the package
    (``attention_course.gpt.apply_rope = ...``, ``ac.x = ...``, setattr on the package)."""
    found = []
    for cell in json.loads(path.read_text())["cells"]:
        if cell["cell_type"] != "code":
            continue
        source = "".join(cell["source"])
        lines = [line for line in source.splitlines() if not line.startswith(("%", "!"))]
        tree = ast.parse("\n".join(lines))
        package_names = {"attention_course"}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.startswith("attention_course"):
                        package_names.add(alias.asname or alias.name.split(".")[0])
            elif isinstance(node, ast.ImportFrom) and PACKAGE.match(node.module or ""):
                for alias in node.names:  # modules and functions, not classes
                    if alias.name[:1].islower():
                        package_names.add(alias.asname or alias.name)
        for node in ast.walk(tree):
            targets = []
            if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            elif isinstance(node, ast.Call) and getattr(node.func, "id", None) == "setattr":
                targets = node.args[:1]
            for target in targets:
                root = target
                while isinstance(root, ast.Attribute):
                    root = root.value
                if root is not target or isinstance(node, ast.Call):
                    if isinstance(root, ast.Name) and root.id in package_names:
                        found.append(ast.unparse(target))
    return found


def test_the_package_attribute_finder_finds_the_old_patch(tmp_path):
    cell = ("import attention_course.gpt\nfrom attention_course import relative_positions as P\n"
            "attention_course.gpt.apply_rope = f\nP.apply_rope = f\nsetattr(P, 'x', 1)\n"
            "model.attn.w_q = None\n")  # fmt: skip
    notebook = tmp_path / "nb.ipynb"
    notebook.write_text(json.dumps({"cells": [{"cell_type": "code", "source": [cell]}]}))
    found = _assigned_package_attributes(notebook)
    assert found == ["attention_course.gpt.apply_rope", "P.apply_rope", "P"]


def test_chapter_14_assigns_no_package_attribute():
    (chapter,) = ROOT.glob("book/14_*.ipynb")
    assert _assigned_package_attributes(chapter) == []
