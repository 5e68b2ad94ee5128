"""RoPE scaling (chapter 19): ``rope_frequencies``, ``apply_rope(scaling=)``,
``RotaryPositions(scaling=dict)`` and ``GPT(rope_scaling=)``.

The frequencies are compared with Hugging Face's ``transformers.modeling_rope_utils``
(``_compute_linear_scaling_rope_parameters``, ``_compute_yarn_parameters``,
``_compute_dynamic_ntk_parameters`` where it equals the static NTK-aware rule), and the
rotation with ``LlamaRotaryEmbedding`` + ``apply_rotary_pos_emb`` (the test-only
``transformers`` dependency; those tests are skipped when it is absent). The rest checks
the formulas by hand, the validation messages and the model round trip.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch.testing import assert_close

from attention_course import GPT, apply_rope, rope_frequencies
from attention_course.relative_positions import RotaryPositions, yarn_correction_range


def _hf():
    transformers = pytest.importorskip("transformers", reason="transformers (dev extra) absent")
    from transformers import LlamaConfig
    from transformers import modeling_rope_utils as rope_utils

    return transformers, LlamaConfig, rope_utils


def _llama_config(LlamaConfig, head_dim, base, rope_parameters, max_len=64):
    num_heads = 2
    return LlamaConfig(
        hidden_size=head_dim * num_heads,
        num_attention_heads=num_heads,
        num_key_value_heads=num_heads,
        head_dim=head_dim,
        max_position_embeddings=max_len,
        rope_parameters={"rope_theta": base, **rope_parameters},
    )


# ---- the formulas by hand -------------------------------------------------------------


def test_no_scaling_is_ropes_frequencies():
    inv_freq, factor = rope_frequencies(8, 100.0)
    assert inv_freq.dtype == torch.float64 and inv_freq.shape == (4,)
    assert_close(
        inv_freq, torch.tensor([100.0 ** (-2 * i / 8) for i in range(4)], dtype=torch.float64)
    )
    assert factor == 1.0


def test_linear_divides_every_frequency_by_the_factor():
    plain, _ = rope_frequencies(16)
    inv_freq, factor = rope_frequencies(16, scaling={"type": "linear", "factor": 4})
    assert_close(inv_freq, plain / 4, rtol=0, atol=0)
    assert factor == 1.0


def test_ntk_keeps_the_highest_frequency_and_divides_the_lowest_by_the_factor():
    d, s = 16, 4.0
    plain, _ = rope_frequencies(d)
    inv_freq, factor = rope_frequencies(d, scaling={"type": "ntk", "factor": s})
    assert factor == 1.0
    assert inv_freq[0].item() == 1.0 and plain[0].item() == 1.0
    assert_close(inv_freq[-1], plain[-1] / s)
    # in between, pair i is divided by s^(2i / (d - 2))
    ratio = plain / inv_freq
    assert_close(ratio, s ** (2 * torch.arange(d // 2, dtype=torch.float64) / (d - 2)))


def test_yarn_keeps_the_fast_pairs_interpolates_the_slow_and_ramps_between():
    d, base, s, L0 = 64, 10000.0, 4.0, 64
    low, high = yarn_correction_range(d, base, L0, 32, 1)
    # by hand: pair i turns L0 * base^(-2i/d) / (2 pi) times over L0
    turns = L0 * base ** (-2 * torch.arange(d // 2, dtype=torch.float64) / d) / (2 * math.pi)
    index = lambda r: d * math.log(L0 / (2 * math.pi * r)) / (2 * math.log(base))  # noqa: E731
    assert (low, high) == (max(math.floor(index(32)), 0), math.ceil(index(1)))
    assert (low, high) == (0, 9)
    # high: the first pair that turns at most once over L0 (beta_slow = 1)
    assert turns[high].item() <= 1 < turns[high - 1].item()
    plain, _ = rope_frequencies(d, base)
    inv_freq, factor = rope_frequencies(
        d, base, {"type": "yarn", "factor": s, "original_max_len": L0}
    )
    assert_close(inv_freq[: low + 1], plain[: low + 1], rtol=0, atol=0)
    assert_close(inv_freq[high:], plain[high:] / s, rtol=1e-15, atol=0)
    ramp = torch.tensor(
        [(i - low) / (high - low) for i in range(low + 1, high)], dtype=torch.float64
    )
    middle = plain[low + 1 : high]
    assert_close(inv_freq[low + 1 : high], middle * (1 - ramp) + middle / s * ramp)
    assert factor == pytest.approx(0.1 * math.log(4) + 1)


def test_yarn_defaults_are_beta_fast_32_and_beta_slow_1():
    a = rope_frequencies(32, scaling={"type": "yarn", "factor": 8, "original_max_len": 2048})
    b = rope_frequencies(
        32,
        scaling={
            "type": "yarn",
            "factor": 8,
            "original_max_len": 2048,
            "beta_fast": 32,
            "beta_slow": 1,
        },
    )
    assert_close(a[0], b[0], rtol=0, atol=0) and a[1] == b[1]


# ---- equal to Hugging Face -----------------------------------------------------------


@pytest.mark.parametrize(
    "head_dim,base,factor", [(8, 10000.0, 2.0), (64, 10000.0, 4.0), (16, 500.0, 8.0)]
)
def test_linear_equals_hugging_face(head_dim, base, factor):
    _, LlamaConfig, rope_utils = _hf()
    config = _llama_config(LlamaConfig, head_dim, base, {"rope_type": "linear", "factor": factor})
    hf_freq, hf_factor = rope_utils._compute_linear_scaling_rope_parameters(config)
    inv_freq, ours = rope_frequencies(head_dim, base, {"type": "linear", "factor": factor})
    assert_close(inv_freq.float(), hf_freq, rtol=1e-6, atol=0)
    assert ours == hf_factor == 1.0


@pytest.mark.parametrize(
    "head_dim,base,factor,L0,betas",
    [
        (64, 10000.0, 4.0, 64, {}),
        (16, 10000.0, 4.0, 64, {}),  # the chapter's model: Dh = 16, L0 = 64
        (128, 10000.0, 8.0, 4096, {}),
        (128, 1000000.0, 4.0, 32768, {}),  # Qwen3's published YaRN setting
        (32, 10000.0, 2.5, 512, {"beta_fast": 16, "beta_slow": 2}),
        (8, 10000.0, 16.0, 8, {}),  # ramp clamped at both ends
    ],
)
def test_yarn_equals_hugging_face(head_dim, base, factor, L0, betas):
    _, LlamaConfig, rope_utils = _hf()
    params = {"rope_type": "yarn", "factor": factor, "original_max_position_embeddings": L0}
    config = _llama_config(
        LlamaConfig, head_dim, base, {**params, **betas}, max_len=int(L0 * factor)
    )
    hf_freq, hf_factor = rope_utils._compute_yarn_parameters(config)
    scaling = {"type": "yarn", "factor": factor, "original_max_len": L0, **betas}
    inv_freq, ours = rope_frequencies(head_dim, base, scaling)
    # Hugging Face computes in float32, we in float64
    assert_close(inv_freq.float(), hf_freq, rtol=1e-6, atol=0)
    assert ours == pytest.approx(hf_factor, rel=1e-12)


@pytest.mark.parametrize("head_dim,factor", [(8, 2.0), (64, 4.0), (16, 3.0)])
def test_ntk_equals_hugging_faces_dynamic_ntk_where_that_is_static(head_dim, factor):
    """Hugging Face has only *dynamic* NTK scaling: at sequence length ``n > L0`` its base
    is ``base * (f n / L0 - (f - 1))^(d/(d-2))``. With its factor ``f = 1`` and
    ``n = s L0`` that is ``base * s^(d/(d-2))``, the static NTK-aware base, exactly; with
    ``f = 2``, ``n = (s + 1) L0 / 2`` gives the same."""
    _, LlamaConfig, rope_utils = _hf()
    L0 = 64
    ours, attention = rope_frequencies(head_dim, 10000.0, {"type": "ntk", "factor": factor})
    assert attention == 1.0
    for f, n in ((1.0, int(factor * L0)), (2.0, int((factor + 1) * L0 / 2))):
        config = _llama_config(
            LlamaConfig, head_dim, 10000.0, {"rope_type": "dynamic", "factor": f}, max_len=L0
        )
        hf_freq, hf_factor = rope_utils._compute_dynamic_ntk_parameters(config, seq_len=n)
        assert_close(ours.float(), hf_freq, rtol=1e-5, atol=0)
        assert hf_factor == 1.0
    # and at the training length the dynamic form does not scale at all: a different rule
    config = _llama_config(
        LlamaConfig, head_dim, 10000.0, {"rope_type": "dynamic", "factor": factor}, max_len=L0
    )
    hf_freq, _ = rope_utils._compute_dynamic_ntk_parameters(config, seq_len=L0)
    assert_close(hf_freq.double(), rope_frequencies(head_dim)[0], rtol=1e-6, atol=0)


@pytest.mark.parametrize(
    "scaling",
    [
        {"type": "linear", "factor": 4.0},
        {"type": "ntk", "factor": 4.0},
        {"type": "yarn", "factor": 4.0, "original_max_len": 64},
        {"type": "yarn", "factor": 8.0, "original_max_len": 32, "beta_fast": 16, "beta_slow": 2},
    ],
)
def test_apply_rope_with_scaling_equals_hugging_faces_rotary_embedding(scaling):
    """Our rotation with ``scaling`` against ``LlamaRotaryEmbedding`` (which multiplies
    cos and sin by the attention factor) and ``apply_rotary_pos_emb``, in float64 inputs
    (Hugging Face's cos and sin are float32 whatever the input)."""
    _, LlamaConfig, _ = _hf()
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

    head_dim, base, H, T = 16, 10000.0, 2, 256
    s = scaling["factor"]
    if scaling["type"] == "ntk":  # as dynamic NTK with factor 1 at n = s L0 (test above)
        params, max_len = {"rope_type": "dynamic", "factor": 1.0}, 64
    else:
        params = {"rope_type": scaling["type"], "factor": s}
        if scaling["type"] == "yarn":
            params["original_max_position_embeddings"] = scaling["original_max_len"]
            for key in ("beta_fast", "beta_slow"):
                if key in scaling:
                    params[key] = scaling[key]
        max_len = 4096
    config = _llama_config(LlamaConfig, head_dim, base, params, max_len=max_len)
    rotary = LlamaRotaryEmbedding(config)
    # (dynamic NTK recomputes its base in forward, at the batch's length T = 4 * 64 = s L0)
    assert scaling["type"] != "ntk" or s * 64 == T
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, H, T, head_dim, generator=g, dtype=torch.float64)
    k = torch.randn(2, H, T, head_dim, generator=g, dtype=torch.float64)
    position_ids = torch.arange(T)[None].expand(2, T)
    cos, sin = rotary(q, position_ids)
    hf_q, hf_k = apply_rotary_pos_emb(q, k, cos, sin)
    # Hugging Face's angles are float32: position * inv_freq off by ~T * 6e-8 radians
    assert_close(apply_rope(q, base=base, scaling=scaling), hf_q, rtol=1e-4, atol=1e-4)
    assert_close(apply_rope(k, base=base, scaling=scaling), hf_k, rtol=1e-4, atol=1e-4)
    if scaling["type"] == "yarn":  # the factor is in there: the norm grows by it
        norm = apply_rope(q, base=base, scaling=scaling).norm(dim=-1) / q.norm(dim=-1)
        assert_close(norm, torch.full_like(norm, 0.1 * math.log(s) + 1))


# ---- apply_rope and the position piece -----------------------------------------------


def test_apply_rope_without_scaling_is_unchanged_bit_for_bit():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 3, 50, 16, generator=g)
    positions = torch.randint(0, 1000, (2, 50), generator=g)
    # the rotation as chapter 14 computes it, written out
    i = torch.arange(8, dtype=torch.float32)
    inv_freq = 10000.0 ** (-2 * i / 16)
    angles = positions.float()[..., None] * inv_freq
    cos, sin = angles.cos()[:, None], angles.sin()[:, None]
    x1, x2 = x[..., :8], x[..., 8:]
    expected = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)
    assert torch.equal(apply_rope(x, positions), expected)
    assert torch.equal(apply_rope(x, positions, scaling=None), expected)
    assert torch.equal(RotaryPositions().rotate(x, x, 5)[0], apply_rope(x, torch.arange(5, 55)))


def test_linear_scaling_at_position_p_is_plain_rope_at_p_over_s():
    x = torch.randn(1, 2, 12, 8, dtype=torch.float64)
    positions = torch.arange(0, 48, 4)
    scaled = apply_rope(x, positions, scaling={"type": "linear", "factor": 4})
    assert_close(scaled, apply_rope(x, positions // 4))


@pytest.mark.parametrize(
    "scaling",
    [
        {"type": "linear", "factor": 2},
        {"type": "ntk", "factor": 3},
        {"type": "yarn", "factor": 4, "original_max_len": 16},
    ],
)
def test_rotary_positions_with_a_dict_rotates_as_apply_rope(scaling):
    q = torch.randn(2, 4, 7, 16, dtype=torch.float64)
    k = torch.randn(2, 2, 7, 16, dtype=torch.float64)
    piece = RotaryPositions(scaling=scaling)
    rq, rk = piece.rotate(q, k, start=10)
    positions = torch.arange(10, 17)
    assert_close(rq, apply_rope(q, positions, scaling=scaling), rtol=0, atol=0)
    assert_close(rk, apply_rope(k, positions, scaling=scaling), rtol=0, atol=0)
    assert "scaling={" in repr(piece)


def test_rotary_positions_keeps_the_callable_form():
    x = torch.randn(1, 1, 6, 8)
    piece = RotaryPositions(scaling=lambda inv_freq: inv_freq / 2)
    as_dict = RotaryPositions(scaling={"type": "linear", "factor": 2})
    assert_close(piece.rotate(x, x)[0], as_dict.rotate(x, x)[0])
    assert piece.attention_factor == 1.0


def test_the_yarn_factor_scales_each_score_by_its_square():
    """cos and sin times ``a`` on both q and k: every score ``q . k`` times ``a^2`` (the
    paper's ``1 / t``), never the scores once by ``a``."""
    scaling = {"type": "yarn", "factor": 8, "original_max_len": 32}
    a = 0.1 * math.log(8) + 1
    q = torch.randn(1, 1, 20, 16, dtype=torch.float64)
    k = torch.randn(1, 1, 20, 16, dtype=torch.float64)
    scores = apply_rope(q, scaling=scaling) @ apply_rope(k, scaling=scaling).mT
    inv_freq, _ = rope_frequencies(16, scaling=scaling)
    plain = RotaryPositions(scaling=lambda f: inv_freq.to(f.dtype))  # same angles, factor 1
    rq, rk = plain.rotate(q, k)
    assert_close(scores, a**2 * (rq @ rk.mT))


# ---- validation ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "scaling,match",
    [
        ("linear", r"scaling: got (str|'linear')"),
        ({"type": "dynamic", "factor": 2}, r"scaling\['type'\]: got 'dynamic'"),
        ({"factor": 2}, r"scaling\['type'\]: got None"),
        ({"type": "linear", "factor": 1}, r"scaling\['factor'\]: got 1"),
        ({"type": "linear", "factor": 0.5}, r"scaling\['factor'\]: got 0.5"),
        ({"type": "ntk"}, r"scaling\['factor'\]: got None"),
        ({"type": "linear", "factor": True}, r"scaling\['factor'\]"),
        ({"type": "yarn", "factor": 4}, r"scaling\['original_max_len'\]: missing"),
        ({"type": "yarn", "factor": 4, "original_max_len": 0}, r"original_max_len'\]: got 0"),
        (
            {"type": "yarn", "factor": 4, "original_max_len": 64, "beta_fast": 1, "beta_slow": 32},
            r"beta_fast",
        ),
        (
            {"type": "linear", "factor": 2, "original_max_len": 64},
            r"unknown key\(s\) \['original_max_len'\]",
        ),
        ({"type": "yarn", "factor": 2, "original_max_len": 64, "mscale": 1}, r"\['mscale'\]"),
    ],
)
def test_bad_scaling_is_refused_naming_it(scaling, match):
    with pytest.raises(ValueError, match=match):
        rope_frequencies(16, scaling=scaling)
    with pytest.raises(ValueError, match=match):
        apply_rope(torch.zeros(3, 16), scaling=scaling)
    with pytest.raises(ValueError, match=match):
        RotaryPositions(scaling=scaling)


@pytest.mark.parametrize("head_dim", [0, 7, 2.0])
def test_bad_head_dim_is_refused(head_dim):
    with pytest.raises(ValueError, match="head_dim"):
        rope_frequencies(head_dim)


def test_ntk_needs_more_than_two_features():
    with pytest.raises(ValueError, match="head_dim"):
        rope_frequencies(2, scaling={"type": "ntk", "factor": 2})


# ---- GPT ------------------------------------------------------------------------------


def _gpt(**kwargs):
    torch.manual_seed(0)
    model = GPT(30, d_model=32, num_heads=2, num_layers=2, max_len=64, pos="rope", **kwargs)
    with torch.no_grad():  # sharper attention than at initialisation: positions matter
        for block in model.blocks:
            block.attn.w_q.weight.mul_(30)
            block.attn.w_k.weight.mul_(30)
    return model


@pytest.mark.parametrize("pos", ["learned", "sinusoidal", "alibi", "none"])
def test_gpt_rope_scaling_needs_rope(pos):
    with pytest.raises(ValueError, match="rope_scaling"):
        GPT(30, d_model=32, num_heads=2, pos=pos, rope_scaling={"type": "linear", "factor": 2})


def test_gpt_rope_scaling_with_rope_fn_is_refused():
    with pytest.raises(ValueError, match="rope_scaling"):
        _gpt(rope_fn=apply_rope, rope_scaling={"type": "linear", "factor": 2})


def test_gpt_bad_rope_scaling_is_refused_naming_it():
    with pytest.raises(ValueError, match=r"scaling\['factor'\]"):
        _gpt(rope_scaling={"type": "linear", "factor": 1})


def test_a_model_saved_without_scaling_is_evaluated_with_it(tmp_path):
    """Trained (here: initialised) without scaling, saved, rebuilt from its config with
    ``rope_scaling`` and the same state dict: every layer rotates with the scaled RoPE,
    the weights are the same, and the config round-trips through a weights-only file."""
    model = _gpt().eval()
    path = tmp_path / "gpt.pt"
    torch.save({"config": model.config(), "state_dict": model.state_dict()}, path)
    data = torch.load(path, weights_only=True)
    assert data["config"]["rope_scaling"] is None
    scaling = {"type": "yarn", "factor": 4.0, "original_max_len": 64}
    scaled = GPT(**{**data["config"], "rope_scaling": scaling})
    scaled.load_state_dict(data["state_dict"])  # no new weights or buffers
    scaled.eval()
    assert scaled.config() == {**model.config(), "rope_scaling": scaling}
    assert GPT(**scaled.config()).config() == scaled.config()
    for block in scaled.blocks:
        assert block.attn.positions.scaling == scaling
    ids = torch.randint(0, 30, (2, 200), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        out = scaled(ids)
        assert not torch.allclose(out, model(ids), atol=1e-3)  # the scaling changes it
        # and it is the same model with every layer's rotation scaled: the piece by hand
        model.attention_positions.scaling = scaling  # on the unscaled copy's shared piece
        assert_close(model(ids), out)
        # a KV cache continues the scaled positions
        cache = scaled.new_cache()
        first = scaled(ids[:, :150], cache=cache)
        rest = scaled(ids[:, 150:], cache=cache)
        assert_close(torch.cat([first, rest], dim=1), out, rtol=1e-5, atol=1e-5)


def test_bad_base_is_refused():
    with pytest.raises(ValueError, match="base"):
        rope_frequencies(16, base=0)
    with pytest.raises(ValueError, match="base"):
        rope_frequencies(16, base=True)


def test_apply_rope_with_scaling_takes_positions_per_sequence():
    scaling = {"type": "yarn", "factor": 4, "original_max_len": 32}
    x = torch.randn(2, 3, 5, 16, dtype=torch.float64)
    positions = torch.tensor([[0, 1, 2, 3, 4], [100, 101, 102, 103, 104]])
    out = apply_rope(x, positions, scaling=scaling)
    for b in range(2):
        assert_close(out[b], apply_rope(x[b], positions[b], scaling=scaling), rtol=0, atol=0)
