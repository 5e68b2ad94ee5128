"""The modern block (chapter 16): RMSNorm, SwiGLU and GPT(norm="rms", ffn="swiglu")."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.testing import assert_close

from attention_course import GPT, RMSNorm, SwiGLU, count_parameters, generate
from attention_course.ffn import swiglu_hidden_size
from attention_course.train import train_language_model

V = 11

# --- RMSNorm against torch.nn.RMSNorm ----------------------------------------------------

SHAPES = [(8,), (3, 5), (2, 3, 4)]  # one, two and three normalised axes


def _inputs(normalized_shape, dtype, scale=3.0):
    g = torch.Generator().manual_seed(sum(normalized_shape))
    x = scale * torch.randn(4, 6, *normalized_shape, generator=g, dtype=dtype) + 0.5
    return x


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("eps", [None, 1e-6, 0.1])
@pytest.mark.parametrize("shape", SHAPES)
def test_rms_norm_equals_torch_rms_norm_with_copied_weights(shape, eps, dtype):
    ours, theirs = RMSNorm(shape, eps=eps), nn.RMSNorm(shape, eps=eps)
    assert list(ours.state_dict()) == list(theirs.state_dict()) == ["weight"]
    with torch.no_grad():
        theirs.weight.copy_(torch.rand(shape) + 0.5)
    ours.load_state_dict(theirs.state_dict())  # theirs -> ours
    ours, theirs = ours.to(dtype), theirs.to(dtype)
    x = _inputs(shape, dtype)
    assert_close(ours(x), theirs(x))
    # ours -> theirs
    with torch.no_grad():
        ours.weight.mul_(-1.5)
    theirs.load_state_dict(ours.state_dict())
    assert_close(ours(x), theirs(x))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("shape", SHAPES)
def test_rms_norm_without_affine_equals_torch(shape, dtype):
    ours, theirs = (
        RMSNorm(shape, elementwise_affine=False),
        nn.RMSNorm(shape, elementwise_affine=False),
    )
    assert ours.weight is None and theirs.weight is None
    assert list(ours.state_dict()) == list(theirs.state_dict()) == []
    x = _inputs(shape, dtype)
    assert_close(ours(x), theirs(x))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_default_eps_is_the_computation_dtypes_machine_epsilon(dtype):
    # With a tiny input the eps dominates the mean square: a wrong default shows.
    x = torch.full((2, 4), 1e-5, dtype=dtype)
    ours, theirs = RMSNorm(4, elementwise_affine=False), nn.RMSNorm(4, elementwise_affine=False)
    eps = torch.finfo(dtype).eps
    expected = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    assert_close(ours(x), expected)
    assert_close(theirs(x), expected)  # what PyTorch documents, checked on the installed torch
    assert ours.eps is None and theirs.eps is None


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_low_precision_input_is_computed_in_float32_like_torch(dtype):
    # nn.RMSNorm upcasts half precision and uses float32's eps (not float16's 1e-3).
    x = torch.full((3, 8), 1e-3).to(dtype)
    ours, theirs = RMSNorm(8).to(dtype), nn.RMSNorm(8).to(dtype)
    out = ours(x)
    assert out.dtype == dtype
    assert_close(out, theirs(x))


@pytest.mark.parametrize("shape", SHAPES)
def test_rms_norm_gradients_match_torch(shape):
    ours, theirs = RMSNorm(shape, eps=1e-5).double(), nn.RMSNorm(shape, eps=1e-5).double()
    with torch.no_grad():
        theirs.weight.copy_(torch.rand(shape, dtype=torch.float64) + 0.5)
    ours.load_state_dict(theirs.state_dict())
    x = _inputs(shape, torch.float64)
    x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
    upstream = torch.randn_like(x)
    (ours(x1) * upstream).sum().backward()
    (theirs(x2) * upstream).sum().backward()
    assert_close(x1.grad, x2.grad)
    assert_close(ours.weight.grad, theirs.weight.grad)


def test_rms_norm_gradcheck():
    norm = RMSNorm((3, 4), eps=1e-3).double()
    x = torch.randn(2, 3, 4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(norm, (x,))


def test_rms_norm_output_has_unit_root_mean_square_and_keeps_the_mean():
    x = _inputs((16,), torch.float64)
    y = RMSNorm(16, eps=0.0).double()(x)
    assert_close(y.pow(2).mean(-1), torch.ones(4, 6, dtype=torch.float64))
    assert y.mean(-1).abs().min() > 1e-3  # no centring, unlike LayerNorm


def test_rms_norm_repr_and_bad_arguments():
    assert repr(RMSNorm((2, 3))) == repr(nn.RMSNorm((2, 3)))
    with pytest.raises(ValueError, match="normalized_shape"):
        RMSNorm(())
    with pytest.raises(ValueError, match="normalized_shape"):
        RMSNorm((3, 0))
    with pytest.raises(ValueError, match="eps"):
        RMSNorm(4, eps=-1.0)
    with pytest.raises(ValueError, match="x"):
        RMSNorm((3, 4))(torch.randn(2, 4, 3))
    with pytest.raises(ValueError, match="x"):
        RMSNorm(4)(torch.ones(2, 4, dtype=torch.long))


# --- SwiGLU ---------------------------------------------------------------------------------


class LlamaMLP(nn.Module):
    """Hugging Face's ``transformers.models.llama.modeling_llama.LlamaMLP``, written out
    (config.mlp_bias=False, config.hidden_act="silu")."""

    def __init__(self, hidden_size: int, intermediate_size: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)
        self.act_fn = nn.SiLU()

    def forward(self, x):
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


def test_swiglu_equals_the_formula_from_scratch():
    torch.manual_seed(0)
    ffn = SwiGLU(12, 20).double()
    x = torch.randn(3, 5, 12, dtype=torch.float64)
    W1, W3, W2 = ffn.w1.weight, ffn.w3.weight, ffn.w2.weight  # (F, D), (F, D), (D, F)
    a = x @ W1.T
    silu = a * (1.0 / (1.0 + torch.exp(-a)))  # SiLU(a) = a * sigmoid(a)
    expected = (silu * (x @ W3.T)) @ W2.T
    assert_close(ffn(x), expected)


def test_swiglu_with_bias_equals_the_formula_from_scratch():
    torch.manual_seed(1)
    ffn = SwiGLU(6, 10, bias=True).double()
    x = torch.randn(4, 6, dtype=torch.float64)
    gate = F.silu(x @ ffn.w1.weight.T + ffn.w1.bias)
    up = x @ ffn.w3.weight.T + ffn.w3.bias
    assert_close(ffn(x), (gate * up) @ ffn.w2.weight.T + ffn.w2.bias)


def test_swiglu_equals_hugging_face_llama_mlp_with_copied_weights():
    torch.manual_seed(2)
    ours, theirs = SwiGLU(16, 40), LlamaMLP(16, 40)
    with torch.no_grad():
        theirs.gate_proj.weight.copy_(ours.w1.weight)
        theirs.up_proj.weight.copy_(ours.w3.weight)
        theirs.down_proj.weight.copy_(ours.w2.weight)
    x = torch.randn(2, 7, 16)
    assert_close(ours(x), theirs(x))
    # gradients too
    x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
    ours(x1).square().sum().backward()
    theirs(x2).square().sum().backward()
    assert_close(x1.grad, x2.grad)
    assert_close(ours.w1.weight.grad, theirs.gate_proj.weight.grad)
    assert_close(ours.w3.weight.grad, theirs.up_proj.weight.grad)
    assert_close(ours.w2.weight.grad, theirs.down_proj.weight.grad)


def test_swiglu_attributes_and_parameter_count():
    d, f = 24, 64
    ffn = SwiGLU(d, f)
    for name, (out_f, in_f) in {"w1": (f, d), "w3": (f, d), "w2": (d, f)}.items():
        layer = getattr(ffn, name)
        assert isinstance(layer, nn.Linear) and layer.bias is None
        assert layer.weight.shape == (out_f, in_f)
    assert count_parameters(ffn) == 3 * d * f
    assert count_parameters(SwiGLU(d, f, bias=True)) == 3 * d * f + 2 * f + d


def test_swiglu_hidden_size_follows_llama_and_keeps_the_parameter_count():
    assert swiglu_hidden_size(128) == 344  # int(8 * 128 / 3) = 341, rounded up to 344
    assert swiglu_hidden_size(64) == 176  # 170 -> 176
    assert swiglu_hidden_size(96) == 256  # 256 exactly
    for d in (64, 96, 128, 256):
        f = swiglu_hidden_size(d)
        assert f % 8 == 0
        # within 8 columns of 8d/3: three D x F matrices ~ two D x 4D ones
        assert abs(3 * d * f - 8 * d * d) <= 3 * d * 8


def test_swiglu_bad_arguments():
    with pytest.raises(ValueError, match="d_model"):
        SwiGLU(0, 4)
    with pytest.raises(ValueError, match="d_ff"):
        SwiGLU(4, -1)
    with pytest.raises(ValueError, match="x"):
        SwiGLU(4, 8)(torch.randn(2, 5))
    with pytest.raises(ValueError, match="x"):
        SwiGLU(4, 8)(torch.ones(2, 4, dtype=torch.long))


# --- GPT(norm="rms", ffn="swiglu") ------------------------------------------------------------


def test_gpt_modern_block_structure():
    model = GPT(V, d_model=32, num_heads=4, num_layers=2, norm="rms", ffn="swiglu")
    assert model.d_ff == swiglu_hidden_size(32) == 88
    for block in model.blocks:
        assert isinstance(block.norm1, RMSNorm) and isinstance(block.norm2, RMSNorm)
        assert isinstance(block.ffn, SwiGLU)
        assert count_parameters(block.ffn) == 3 * 32 * 88
        assert torch.equal(block.norm1.weight, torch.ones(32))
    assert isinstance(model.norm, RMSNorm)
    assert GPT(**model.config()).config() == model.config()
    # each option alone, and an explicit d_ff
    assert isinstance(GPT(V, d_model=16, num_heads=2, norm="rms").blocks[0].norm1, RMSNorm)
    only_ffn = GPT(V, d_model=16, num_heads=2, ffn="swiglu", d_ff=24)
    assert isinstance(only_ffn.blocks[0].norm1, nn.LayerNorm)
    assert only_ffn.blocks[0].ffn.w1.out_features == 24


def test_gpt_modern_block_residual_initialisation():
    torch.manual_seed(0)
    model = GPT(V, d_model=64, num_heads=4, num_layers=8, norm="rms", ffn="swiglu")
    residual_std = 0.02 / (2 * 8) ** 0.5
    down = torch.cat([b.ffn.w2.weight.flatten() for b in model.blocks])
    gate = torch.cat([b.ffn.w1.weight.flatten() for b in model.blocks])
    assert down.std().item() == pytest.approx(residual_std, rel=0.05)
    assert gate.std().item() == pytest.approx(0.02, rel=0.05)


def test_gpt_modern_block_cache_gives_the_full_pass_logits():
    model = GPT(V, d_model=16, num_heads=2, num_layers=2, max_len=16, norm="rms", ffn="swiglu")
    model = model.double().eval()
    ids = torch.randint(0, V, (3, 10))
    cache = model.new_cache()
    parts = [model(ids[:, :4], cache=cache)] + [
        model(ids[:, t : t + 1], cache=cache) for t in range(4, 10)
    ]
    assert_close(torch.cat(parts, dim=1), model(ids))


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_gpt_modern_block_same_tokens_with_and_without_the_cache(temperature):
    torch.manual_seed(3)
    model = GPT(V, d_model=16, num_heads=2, num_layers=2, max_len=32, norm="rms", ffn="swiglu")
    model = model.double()
    prompt = torch.randint(0, V, (4, 3))
    runs = []
    for use_cache in (True, False):
        gen = torch.Generator().manual_seed(123)
        runs.append(
            generate(model, prompt, 20, temperature=temperature, use_cache=use_cache, generator=gen)
        )
    assert torch.equal(runs[0], runs[1])


def test_gpt_modern_block_trains():
    torch.manual_seed(0)
    text = torch.tensor([0, 1, 2, 3, 4, 5, 6, 7, 8, 9] * 40)
    model = GPT(10, d_model=32, num_heads=2, num_layers=1, max_len=32, norm="rms", ffn="swiglu")
    history = train_language_model(
        model, text, text, steps=60, batch_size=16, context=16, lr=1e-2, progress=False
    )
    first, final = history["train_loss"][0], history["train_loss"][-1]
    assert first == pytest.approx(torch.log(torch.tensor(10.0)).item(), abs=0.3)
    assert final < 0.1, f"loss {first:.3f} -> {final:.4f}"
    for p in model.parameters():
        assert torch.isfinite(p).all()


def test_gpt_modern_block_gradients_reach_every_parameter():
    model = GPT(V, d_model=16, num_heads=2, num_layers=2, norm="rms", ffn="swiglu")
    ids = torch.randint(0, V, (2, 8))
    F.cross_entropy(model(ids).flatten(0, 1), ids.roll(-1, 1).flatten()).backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name
