"""LayerNorm against nn.LayerNorm and BatchNorm1d against nn.BatchNorm1d."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.testing import assert_close

from attention_course import BatchNorm1d, LayerNorm, copy_weights_from_torch

# --- LayerNorm ----------------------------------------------------------------------------


def layer_norm_pair(randomize, shape, elementwise_affine=True, eps=1e-5):
    theirs = nn.LayerNorm(shape, eps=eps, elementwise_affine=elementwise_affine).double()
    randomize(theirs)
    ours = LayerNorm(shape, eps=eps, elementwise_affine=elementwise_affine).double()
    if elementwise_affine:
        copy_weights_from_torch(ours, theirs)
    return ours, theirs


@pytest.mark.parametrize(
    "shape, x_shape",
    [(6, (2, 3, 6)), ((6,), (5, 6)), ((4, 5), (2, 3, 4, 5)), ((3, 4, 5), (2, 3, 4, 5))],
)
@pytest.mark.parametrize("affine", [True, False])
def test_layer_norm_matches_pytorch(randomize, shape, x_shape, affine):
    ours, theirs = layer_norm_pair(randomize, shape, affine)
    x = 3.0 + 2.0 * torch.randn(x_shape, dtype=torch.float64)
    assert_close(ours(x), theirs(x))
    assert list(ours.state_dict()) == list(theirs.state_dict())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("scale", [1e-6, 1e-3])
def test_layer_norm_tiny_variance_inputs(randomize, dtype, scale):
    """Variance far below eps: eps must sit inside the square root, the variance be biased."""
    ours, theirs = layer_norm_pair(randomize, (4, 5))
    ours, theirs = ours.to(dtype), theirs.to(dtype)
    # An offset of 5 is exact only in float64: float32 would round the tiny deviations away.
    offset = 5.0 if dtype == torch.float64 else 0.0
    x = (offset + scale * torch.randn(3, 4, 5, dtype=torch.float64)).to(dtype)
    assert_close(ours(x), theirs(x))


def test_layer_norm_normalises_every_token_alone():
    ours = LayerNorm((4, 5), elementwise_affine=False).double()
    x = 3.0 + 2.0 * torch.randn(2, 3, 4, 5, dtype=torch.float64)
    y = ours(x)
    assert_close(y.mean(dim=(-2, -1)), torch.zeros(2, 3, dtype=torch.float64))
    var = y.var(dim=(-2, -1), unbiased=False)
    assert_close(var, 1.0 / (1.0 + 1e-5 / x.var(dim=(-2, -1), unbiased=False)))
    assert_close(ours(x[:1, 2:]), y[:1, 2:])  # other samples and tokens do not matter


def test_layer_norm_gradients_match_pytorch(randomize):
    ours, theirs = layer_norm_pair(randomize, (4, 5))
    x = torch.randn(2, 3, 4, 5, dtype=torch.float64, requires_grad=True)
    probe = torch.randn(2, 3, 4, 5, dtype=torch.float64)
    (ours(x) * probe).sum().backward()
    grad_x = x.grad.clone()
    x.grad = None
    (theirs(x) * probe).sum().backward()
    assert_close(grad_x, x.grad)
    assert_close(ours.weight.grad, theirs.weight.grad)
    assert_close(ours.bias.grad, theirs.bias.grad)


def test_layer_norm_state_dict_loads_into_pytorch_and_back(randomize):
    ours, theirs = layer_norm_pair(randomize, (4, 5))
    fresh = nn.LayerNorm((4, 5)).double()
    fresh.load_state_dict(ours.state_dict())
    x = torch.randn(3, 4, 5, dtype=torch.float64)
    assert_close(fresh(x), ours(x))
    assert LayerNorm(6, elementwise_affine=False).state_dict() == {}


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_layer_norm_follows_dtype_and_device(randomize, dtype, device):
    ours, theirs = layer_norm_pair(randomize, 8)
    x = torch.randn(2, 3, 8, dtype=torch.float64)
    expected = theirs(x)
    out = ours.to(device=device, dtype=dtype)(x.to(device=device, dtype=dtype))
    assert out.dtype == dtype and out.device.type == device.type
    tol = {torch.float16: 1e-2, torch.bfloat16: 5e-2}.get(dtype, 1e-7)
    assert_close(out.cpu().double(), expected, atol=tol, rtol=tol)


# --- BatchNorm1d --------------------------------------------------------------------------


def batch_norm_pair(randomize, channels=4, momentum=0.1, eps=1e-5):
    theirs = nn.BatchNorm1d(channels, eps=eps, momentum=momentum).double()
    randomize(theirs)
    ours = BatchNorm1d(channels, eps=eps, momentum=momentum).double()
    copy_weights_from_torch(ours, theirs)
    return ours, theirs


def assert_same_state(ours, theirs):
    assert list(ours.state_dict()) == list(theirs.state_dict())
    for name, value in theirs.state_dict().items():
        assert_close(ours.state_dict()[name], value, msg=lambda m, name=name: f"{name}: {m}")


@pytest.mark.parametrize("x_shape", [(8, 4), (5, 4, 3)], ids=["(B, C)", "(B, C, L)"])
@pytest.mark.parametrize("momentum", [0.1, 0.5, None])
def test_batch_norm_train_then_eval_matches_pytorch(randomize, x_shape, momentum):
    ours, theirs = batch_norm_pair(randomize, momentum=momentum)
    ours.train(), theirs.train()
    shift = torch.randn(1, 4, *x_shape[2:], dtype=torch.float64)
    for _ in range(4):
        x = shift + 2.0 * torch.randn(x_shape, dtype=torch.float64)
        assert_close(ours(x), theirs(x))
        assert_same_state(ours, theirs)
    assert int(ours.num_batches_tracked) == 4
    ours.eval(), theirs.eval()
    x = shift + torch.randn(x_shape, dtype=torch.float64)
    assert_close(ours(x), theirs(x))
    assert_close(ours(x[:1]), ours(x)[:1])  # in eval, a sample ignores the rest of the batch
    assert_same_state(ours, theirs)  # evaluation does not update the running statistics
    assert int(ours.num_batches_tracked) == 4


def test_batch_norm_running_var_is_unbiased_and_normalisation_biased():
    bn = BatchNorm1d(3, momentum=1.0).double()  # momentum 1: running = this batch's estimate
    x = torch.randn(6, 3, dtype=torch.float64)
    y = bn(x)
    assert_close(bn.running_mean, x.mean(0))
    assert_close(bn.running_var, x.var(0, unbiased=True))
    assert_close(y.var(0, unbiased=False), 1.0 / (1.0 + 1e-5 / x.var(0, unbiased=False)))


def test_batch_norm_gradients_match_pytorch(randomize):
    ours, theirs = batch_norm_pair(randomize)
    x = torch.randn(5, 4, 3, dtype=torch.float64, requires_grad=True)
    probe = torch.randn(5, 4, 3, dtype=torch.float64)
    (ours(x) * probe).sum().backward()
    grad_x = x.grad.clone()
    x.grad = None
    (theirs(x) * probe).sum().backward()
    assert_close(grad_x, x.grad)
    assert_close(ours.weight.grad, theirs.weight.grad)
    assert_close(ours.bias.grad, theirs.bias.grad)


def test_batch_norm_state_dict_and_copy_of_running_stats(randomize):
    theirs = nn.BatchNorm1d(4).double()
    for _ in range(3):
        theirs(torch.randn(6, 4, dtype=torch.float64) * 3 + 1)
    ours = copy_weights_from_torch(BatchNorm1d(4).double(), randomize(theirs))
    assert_same_state(ours, theirs)
    x = torch.randn(6, 4, dtype=torch.float64)
    assert_close(ours.eval()(x), theirs.eval()(x))
    fresh = nn.BatchNorm1d(4).double()
    fresh.load_state_dict(ours.state_dict())
    assert_same_state(ours, fresh)


def test_batch_norm_follows_dtype_and_device(device):
    bn = BatchNorm1d(4).to(device=device, dtype=torch.float64)
    x = torch.randn(5, 4, 3, dtype=torch.float64, device=device)
    y = bn(x)
    assert y.dtype == torch.float64 and y.device.type == device.type
    assert bn.running_mean.dtype == torch.float64
