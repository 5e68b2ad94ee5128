"""linear_attention and gated_delta_rule (chapter 22): against the explicit quadratic form,
the recurrence written out token by token, and Hugging Face's Qwen3-Next functions."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from attention_course import causal_mask, gated_delta_rule, linear_attention
from attention_course import linear as linear_module


def _quadratic_linear_attention(q, k, v, causal):
    """The explicit T x S form: A = phi(Q) phi(K)^T, masked, rows divided by their sums."""
    phi_q, phi_k = F.elu(q) + 1, F.elu(k) + 1
    scores = phi_q @ phi_k.transpose(-2, -1)  # (..., T, S)
    if causal:
        scores = scores.masked_fill(~causal_mask(q.shape[-2]), 0.0)
    return (scores / scores.sum(dim=-1, keepdim=True)) @ v


def _qkv(*batch, T=10, S=None, Dk=5, Dv=3, dtype=torch.float64):
    S = T if S is None else S
    q = torch.randn(*batch, T, Dk, dtype=dtype)
    k = torch.randn(*batch, S, Dk, dtype=dtype)
    v = torch.randn(*batch, S, Dv, dtype=dtype)
    return q, k, v


# T = 150 crosses two block boundaries of the causal form (blocks of 64) and ends mid-block.
@pytest.mark.parametrize("T", [1, 7, 64, 150])
@pytest.mark.parametrize("causal", [True, False])
def test_linear_attention_equals_quadratic_form(T, causal):
    q, k, v = _qkv(2, 3, T=T)
    torch.testing.assert_close(
        linear_attention(q, k, v, causal=causal),
        _quadratic_linear_attention(q, k, v, causal),
        rtol=1e-10,
        atol=1e-10,
    )


def test_linear_attention_noncausal_other_lengths_and_broadcast():
    q, _, _ = _qkv(2, 1, T=6)
    _, k, v = _qkv(2, 4, T=6, S=9)  # S != T; query's head axis broadcasts over 4
    out = linear_attention(q, k, v, causal=False)
    assert out.shape == (2, 4, 6, 3)
    torch.testing.assert_close(out, _quadratic_linear_attention(q, k, v, False))


def test_linear_attention_recurrent_state_one_token_at_a_time():
    """The chunked causal form equals the recurrence S_i = S_{i-1} + phi(k_i) v_i^T,
    z_i = z_{i-1} + phi(k_i), written out token by token."""
    q, k, v = _qkv(2, T=70)
    phi_q, phi_k = F.elu(q) + 1, F.elu(k) + 1
    state = torch.zeros(2, 5, 3, dtype=q.dtype)
    z = torch.zeros(2, 5, dtype=q.dtype)
    expected = []
    for i in range(70):
        state = state + phi_k[:, i, :, None] * v[:, i, None, :]
        z = z + phi_k[:, i]
        numerator = (phi_q[:, i, :, None] * state).sum(dim=1)  # (2, Dv)
        expected.append(numerator / (phi_q[:, i] * z).sum(dim=1, keepdim=True))
    torch.testing.assert_close(linear_attention(q, k, v), torch.stack(expected, dim=1))


def test_linear_attention_is_causal_and_has_no_scale():
    q, k, v = _qkv(1, T=20)
    out = linear_attention(q, k, v)
    k2, v2 = k.clone(), v.clone()
    k2[:, 12:] += 5.0
    v2[:, 12:] -= 3.0
    changed = linear_attention(q, k2, v2)
    torch.testing.assert_close(changed[:, :12], out[:, :12], rtol=0, atol=0)
    assert not torch.allclose(changed[:, 12:], out[:, 12:])
    # No 1/sqrt(Dk) inside phi: scaling q changes the output (phi is not homogeneous).
    assert not torch.allclose(linear_attention(q / 2, k, v), out)


def test_linear_attention_never_builds_a_T_by_S_matrix(monkeypatch):
    """No product is T x S: record the shapes of the products computed for T = S = 300
    (Dk = Dv = 4). Each is at most a 64 x 64 tile or has a side of 4 (a state, a block of
    outputs); the quadratic form, through the same spy, is caught."""
    shapes = []
    original = torch.Tensor.__matmul__

    def spy(a, b):
        result = original(a, b)
        shapes.append(tuple(result.shape))
        return result

    monkeypatch.setattr(torch.Tensor, "__matmul__", spy)
    q, k, v = _qkv(1, T=300, Dk=4, Dv=4)
    linear_attention(q, k, v)
    linear_attention(q, k, v, causal=False)
    assert shapes, "the spy saw no product"

    def square_and_large(shape):
        return min(shape[-2:]) > 64

    assert not any(square_and_large(s) for s in shapes), shapes
    shapes.clear()
    _quadratic_linear_attention(q, k, v, True)
    assert any(square_and_large(s) for s in shapes)  # the spy sees a (300, 300) matrix
    assert linear_module._LINEAR_CHUNK == 64


def test_linear_attention_half_precision_and_gradient():
    q, k, v = _qkv(2, T=80, dtype=torch.float64)
    out = linear_attention(q.bfloat16(), k.bfloat16(), v.bfloat16())
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(
        out.double(), _quadratic_linear_attention(q, k, v, True), atol=3e-2, rtol=3e-2
    )
    q, k, v = (x.requires_grad_() for x in _qkv(1, T=70, Dk=3, Dv=2))
    assert torch.autograd.gradcheck(lambda a, b, c: linear_attention(a, b, c), (q, k, v))


def test_linear_attention_bad_inputs():
    q, k, v = _qkv(2, T=6, S=8)
    with pytest.raises(ValueError, match="causal linear attention needs S = T"):
        linear_attention(q, k, v)
    with pytest.raises(ValueError, match="causal: got 1"):
        linear_attention(q, k, v, causal=1)
    with pytest.raises(ValueError, match="^key: .*Dk"):
        linear_attention(q, k[..., :4], v, causal=False)


# ----------------------------------------------------------------------------------------
# The gated delta rule


def _delta_inputs(B=2, T=11, H=3, Dk=4, Dv=5, dtype=torch.float64, normalise=True):
    gen = torch.Generator().manual_seed(7)

    def randn(*shape):
        return torch.randn(*shape, generator=gen, dtype=dtype)

    q, k, v = randn(B, T, H, Dk), randn(B, T, H, Dk), randn(B, T, H, Dv)
    if normalise:  # the caller's job (Qwen3-Next l2-normalises q and k)
        q, k = F.normalize(q, dim=-1), F.normalize(k, dim=-1)
    g = -F.softplus(randn(B, T, H))  # log-decays <= 0
    beta = torch.sigmoid(randn(B, T, H))
    state = randn(B, H, Dk, Dv)
    return q, k, v, g, beta, state


def _delta_by_the_formula(q, k, v, g, beta, state):
    """S_t = a_t S_{t-1} + beta_t k_t (v_t - a_t S_{t-1}^T k_t)^T, o_t = S_t^T q_t / sqrt(Dk),
    one batch element, head and token at a time, with explicit matrices."""
    B, T, H, Dk = q.shape
    out = torch.zeros(B, T, H, v.shape[-1], dtype=q.dtype)
    final = state.clone()
    for b in range(B):
        for h in range(H):
            S = state[b, h].clone()  # (Dk, Dv)
            for t in range(T):
                a = torch.exp(g[b, t, h])
                kt, vt = k[b, t, h], v[b, t, h]
                S = a * S + beta[b, t, h] * torch.outer(kt, vt - a * S.T @ kt)
                out[b, t, h] = S.T @ q[b, t, h] / Dk**0.5
            final[b, h] = S
    return out, final


@pytest.mark.parametrize("with_state", [False, True])
def test_gated_delta_rule_recurrent_equals_formula(with_state):
    q, k, v, g, beta, state = _delta_inputs()
    initial = state if with_state else None
    out, final = gated_delta_rule(q, k, v, g, beta, initial_state=initial)
    expected_out, expected_final = _delta_by_the_formula(
        q, k, v, g, beta, state if with_state else torch.zeros_like(state)
    )
    torch.testing.assert_close(out, expected_out)
    torch.testing.assert_close(final, expected_final)
    assert out.shape == (2, 11, 3, 5) and final.shape == (2, 3, 4, 5)


# T = 11 with chunks of 4 ends with a chunk of 3; 1 is every token its own chunk; 16 is
# one chunk longer than the sequence; 20 crosses chunks of 8 in float32 with Dk != Dv.
@pytest.mark.parametrize("chunk_size", [1, 4, 11, 16])
@pytest.mark.parametrize("with_state", [False, True])
def test_gated_delta_rule_chunked_equals_recurrent(chunk_size, with_state):
    q, k, v, g, beta, state = _delta_inputs()
    initial = state if with_state else None
    recurrent = gated_delta_rule(q, k, v, g, beta, initial_state=initial)
    chunked = gated_delta_rule(q, k, v, g, beta, initial_state=initial, chunk_size=chunk_size)
    for a, b in zip(chunked, recurrent):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


def test_gated_delta_rule_chunked_float32_strong_decay_unnormalised():
    """Large decays (e^{G} tiny inside a chunk), beta at 0 and 1, keys not normalised:
    chunked still equals recurrent to 1e-5 in float32."""
    q, k, v, g, beta, state = _delta_inputs(T=37, Dk=6, Dv=2, dtype=torch.float32)
    g = g * 8.0
    beta[:, ::5] = 0.0
    beta[:, 1::5] = 1.0
    recurrent = gated_delta_rule(q, k, v, g, beta, initial_state=state)
    chunked = gated_delta_rule(q, k, v, g, beta, initial_state=state, chunk_size=8)
    for a, b in zip(chunked, recurrent):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_gated_delta_rule_state_carries_over():
    """Running the first half, then the second from the returned state, equals one run."""
    q, k, v, g, beta, _ = _delta_inputs(T=12)
    whole, final = gated_delta_rule(q, k, v, g, beta, chunk_size=5)
    first, middle = gated_delta_rule(q[:, :7], k[:, :7], v[:, :7], g[:, :7], beta[:, :7])
    second, final2 = gated_delta_rule(
        q[:, 7:], k[:, 7:], v[:, 7:], g[:, 7:], beta[:, 7:], initial_state=middle, chunk_size=3
    )
    torch.testing.assert_close(torch.cat([first, second], dim=1), whole)
    torch.testing.assert_close(final2, final)


def test_gated_delta_rule_special_cases():
    """beta = 0 writes nothing (the state only decays); g = 0, beta = 1 and a unit key
    replace the value stored under that key."""
    q, k, v, g, beta, state = _delta_inputs(B=1, T=3, H=1)
    out, final = gated_delta_rule(q, k, v, g, torch.zeros_like(beta), initial_state=state)
    torch.testing.assert_close(final, state * g.sum(dim=1).exp()[..., None, None])
    _, final = gated_delta_rule(
        q[:, :1], k[:, :1], v[:, :1], torch.zeros_like(g[:, :1]), torch.ones_like(beta[:, :1]),
        initial_state=state,
    )  # fmt: skip
    read = final[0, 0].T @ k[0, 0, 0]  # what the memory now returns for k_1
    torch.testing.assert_close(read, v[0, 0, 0])


def test_gated_delta_rule_half_precision_and_gradient():
    q, k, v, g, beta, state = _delta_inputs(T=9)
    out, final = gated_delta_rule(*(x.bfloat16() for x in (q, k, v, g, beta)), chunk_size=4)
    assert out.dtype == final.dtype == torch.bfloat16
    expected, _ = gated_delta_rule(q, k, v, g, beta)
    torch.testing.assert_close(out.double(), expected, atol=3e-2, rtol=3e-2)
    inputs = [x[:1, :6, :2].clone().requires_grad_() for x in (q, k, v, g, beta)]

    def chunked(*args):
        return gated_delta_rule(*args, chunk_size=4)[0]

    assert torch.autograd.gradcheck(chunked, inputs)


def test_gated_delta_rule_bad_inputs():
    q, k, v, g, beta, state = _delta_inputs()
    with pytest.raises(ValueError, match="^g: .*<= 0"):
        gated_delta_rule(q, k, v, -g, beta)
    with pytest.raises(ValueError, match=r"^beta: .*\[0, 1\]"):
        gated_delta_rule(q, k, v, g, beta + 1.0)
    with pytest.raises(ValueError, match="^key: "):
        gated_delta_rule(q, k[..., :3], v, g, beta)
    with pytest.raises(ValueError, match="^value: "):
        gated_delta_rule(q, k, v[:, :5], g, beta)
    with pytest.raises(ValueError, match="^g: .*one number per token"):
        gated_delta_rule(q, k, v, g[..., None], beta)
    with pytest.raises(ValueError, match="^query: .*4-D"):
        gated_delta_rule(q[0], k, v, g, beta)
    with pytest.raises(ValueError, match="^initial_state: .*(B, H, Dk, Dv)"):
        gated_delta_rule(q, k, v, g, beta, initial_state=state.transpose(-2, -1))
    with pytest.raises(ValueError, match="^chunk_size: "):
        gated_delta_rule(q, k, v, g, beta, chunk_size=0)


def test_both_follow_the_input_device(device):
    """On every device this machine has (CUDA too when present), float32 on the device
    equals the float64 computation on the CPU; outputs stay on the input's device."""
    q, k, v = _qkv(2, 3, T=100)
    for causal in (True, False):
        out = linear_attention(*(x.float().to(device) for x in (q, k, v)), causal=causal)
        assert out.device.type == device.type
        expected = linear_attention(q, k, v, causal=causal)
        torch.testing.assert_close(out.cpu().double(), expected, rtol=1e-4, atol=1e-5)
    inputs = _delta_inputs(T=70)
    expected = gated_delta_rule(*inputs[:5], initial_state=inputs[5])
    on_device = [x.float().to(device) for x in inputs]
    for chunk_size in (None, 16):
        out, final = gated_delta_rule(*on_device[:5], on_device[5], chunk_size=chunk_size)
        assert out.device.type == final.device.type == device.type
        torch.testing.assert_close(out.cpu().double(), expected[0], rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(final.cpu().double(), expected[1], rtol=1e-4, atol=1e-5)


# ----------------------------------------------------------------------------------------
# Hugging Face's Qwen3-Next (the same definitions with use_qk_l2norm_in_kernel=False, since
# gated_delta_rule leaves the normalisation of q and k to its caller, and
# output_final_state=True; both take (B, T, H, D) and return the state as (B, H, Dk, Dv)).


@pytest.fixture(scope="module")
def qwen3_next():
    pytest.importorskip("transformers")
    from transformers.models.qwen3_next import modeling_qwen3_next

    return modeling_qwen3_next


@pytest.mark.parametrize("with_state", [False, True])
def test_gated_delta_rule_equals_qwen3_next_recurrent(qwen3_next, with_state):
    q, k, v, g, beta, state = _delta_inputs(T=13, dtype=torch.float32)
    initial = state if with_state else None
    hf_out, hf_state = qwen3_next.torch_recurrent_gated_delta_rule(
        q, k, v, g, beta, initial_state=initial, output_final_state=True,
        use_qk_l2norm_in_kernel=False,
    )  # fmt: skip
    out, final = gated_delta_rule(q, k, v, g, beta, initial_state=initial)
    torch.testing.assert_close(out, hf_out, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(final, hf_state, rtol=1e-5, atol=1e-5)


# T = 13 is not a multiple of either chunk size: HF pads the last chunk with zeros, we
# process a shorter one.
@pytest.mark.parametrize("chunk_size", [4, 8])
@pytest.mark.parametrize("with_state", [False, True])
def test_gated_delta_rule_equals_qwen3_next_chunked(qwen3_next, chunk_size, with_state):
    q, k, v, g, beta, state = _delta_inputs(T=13, dtype=torch.float32)
    initial = state if with_state else None
    hf_out, hf_state = qwen3_next.torch_chunk_gated_delta_rule(
        q, k, v, g, beta, chunk_size=chunk_size, initial_state=initial,
        output_final_state=True, use_qk_l2norm_in_kernel=False,
    )  # fmt: skip
    out, final = gated_delta_rule(q, k, v, g, beta, initial_state=initial, chunk_size=chunk_size)
    torch.testing.assert_close(out, hf_out, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(final, hf_state, rtol=1e-5, atol=1e-5)


def test_qwen3_next_l2norm_option_is_normalising_before_the_call(qwen3_next):
    """HF's use_qk_l2norm_in_kernel=True is the same as normalising q and k ourselves
    (HF's l2norm has eps=1e-6 inside the square root) and passing them in."""
    q, k, v, g, beta, _ = _delta_inputs(T=9, dtype=torch.float32, normalise=False)
    hf_out, hf_state = qwen3_next.torch_chunk_gated_delta_rule(
        q, k, v, g, beta, chunk_size=4, output_final_state=True, use_qk_l2norm_in_kernel=True
    )
    out, final = gated_delta_rule(
        qwen3_next.l2norm(q), qwen3_next.l2norm(k), v, g, beta, chunk_size=4
    )
    torch.testing.assert_close(out, hf_out, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(final, hf_state, rtol=1e-5, atol=1e-5)
