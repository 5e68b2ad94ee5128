"""Copy weights from PyTorch's built-in modules into the course's modules.

Used by the tests and the chapters to prove "same weights in, same numbers
out". Note the mask conventions differ: convert with
:func:`attention_course.masking.to_torch_mha_mask` when calling PyTorch.
"""

from __future__ import annotations

import torch
from torch import nn

from .multihead import MultiHeadAttention
from .norms import LayerNorm
from .transformer import DecoderLayer, EncoderLayer


def _copy(dst: torch.Tensor | None, src: torch.Tensor | None, what: str) -> None:
    if (dst is None) != (src is None):
        raise ValueError(f"{what}: one module has a bias/weight and the other does not")
    if dst is None:
        return
    if dst.shape != src.shape:
        raise ValueError(f"{what}: got shape {tuple(src.shape)}, expected {tuple(dst.shape)}")
    with torch.no_grad():
        dst.copy_(src)


def _copy_mha(ours: MultiHeadAttention, theirs: nn.MultiheadAttention) -> None:
    D = ours.d_model
    if theirs._qkv_same_embed_dim:
        # PyTorch packs [W_q; W_k; W_v] into one (3D, D) matrix.
        w_q, w_k, w_v = theirs.in_proj_weight.chunk(3, dim=0)
    else:
        w_q, w_k, w_v = theirs.q_proj_weight, theirs.k_proj_weight, theirs.v_proj_weight
    _copy(ours.w_q.weight, w_q, "w_q.weight")
    _copy(ours.w_k.weight, w_k, "w_k.weight")
    _copy(ours.w_v.weight, w_v, "w_v.weight")
    if theirs.in_proj_bias is not None:
        b_q, b_k, b_v = theirs.in_proj_bias.split(D)
    else:
        b_q = b_k = b_v = None
    _copy(ours.w_q.bias, b_q, "w_q.bias")
    _copy(ours.w_k.bias, b_k, "w_k.bias")
    _copy(ours.w_v.bias, b_v, "w_v.bias")
    _copy(ours.w_o.weight, theirs.out_proj.weight, "w_o.weight")
    _copy(ours.w_o.bias, theirs.out_proj.bias, "w_o.bias")


def _copy_norm(ours: LayerNorm, theirs: nn.LayerNorm, what: str) -> None:
    _copy(ours.weight, theirs.weight, f"{what}.weight")
    _copy(ours.bias, theirs.bias, f"{what}.bias")


def _copy_ffn(ours, theirs) -> None:
    _copy(ours.ffn.linear1.weight, theirs.linear1.weight, "ffn.linear1.weight")
    _copy(ours.ffn.linear1.bias, theirs.linear1.bias, "ffn.linear1.bias")
    _copy(ours.ffn.linear2.weight, theirs.linear2.weight, "ffn.linear2.weight")
    _copy(ours.ffn.linear2.bias, theirs.linear2.bias, "ffn.linear2.bias")


def copy_weights_from_torch(ours: nn.Module, theirs: nn.Module) -> nn.Module:
    """Copy the weights of a PyTorch built-in into the matching course module.

    Supported pairs: ``MultiHeadAttention`` <- ``nn.MultiheadAttention``;
    ``LayerNorm`` <- ``nn.LayerNorm``; ``BatchNorm1d`` <- ``nn.BatchNorm1d``
    (parameters and running statistics); ``EncoderLayer`` <-
    ``nn.TransformerEncoderLayer``; ``DecoderLayer`` <- ``nn.TransformerDecoderLayer``.
    Returns ``ours``.
    """
    if isinstance(ours, MultiHeadAttention) and isinstance(theirs, nn.MultiheadAttention):
        _copy_mha(ours, theirs)
    elif isinstance(ours, EncoderLayer) and isinstance(theirs, nn.TransformerEncoderLayer):
        _copy_mha(ours.self_attn, theirs.self_attn)
        _copy_ffn(ours, theirs)
        _copy_norm(ours.norm1, theirs.norm1, "norm1")
        _copy_norm(ours.norm2, theirs.norm2, "norm2")
    elif isinstance(ours, DecoderLayer) and isinstance(theirs, nn.TransformerDecoderLayer):
        _copy_mha(ours.self_attn, theirs.self_attn)
        _copy_mha(ours.cross_attn, theirs.multihead_attn)
        _copy_ffn(ours, theirs)
        _copy_norm(ours.norm1, theirs.norm1, "norm1")
        _copy_norm(ours.norm2, theirs.norm2, "norm2")
        _copy_norm(ours.norm3, theirs.norm3, "norm3")
    elif isinstance(ours, (LayerNorm, nn.Module)) and isinstance(
        theirs, (nn.LayerNorm, nn.BatchNorm1d)
    ):
        # Same parameter and buffer names: a state_dict round trip is exact.
        ours.load_state_dict(theirs.state_dict())
    else:
        raise ValueError(
            f"ours, theirs: got {type(ours).__name__} and {type(theirs).__name__}, expected one "
            f"of the supported pairs (see the docstring)"
        )
    return ours
