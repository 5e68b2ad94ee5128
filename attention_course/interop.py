"""Copy weights from PyTorch's built-in modules into the course's modules.

Used by the tests and the chapters to prove "same weights in, same numbers
out". Note the mask conventions differ: convert with
:func:`attention_course.masking.to_torch_mha_mask` when calling PyTorch.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .multihead import MultiHeadAttention
from .norms import LayerNorm
from .transformer import DecoderLayer, EncoderLayer

_Pair = tuple[torch.Tensor | None, torch.Tensor | None, str]  # (ours, theirs, name)


def _check_pair(dst: torch.Tensor | None, src: torch.Tensor | None, what: str) -> None:
    if (dst is None) != (src is None):
        raise ValueError(f"{what}: one module has a bias/weight and the other does not")
    if dst is not None and dst.shape != src.shape:
        raise ValueError(f"{what}: got shape {tuple(src.shape)}, expected {tuple(dst.shape)}")


def _check_same(what: str, theirs: object, ours: object) -> None:
    if theirs != ours:
        raise ValueError(f"{what}: got {theirs!r} in the PyTorch module, expected {ours!r}")


def _mha_pairs(ours: MultiHeadAttention, theirs: nn.MultiheadAttention, prefix: str) -> list[_Pair]:
    # Same shapes with a different head count would copy fine and compute something else.
    _check_same(f"{prefix}num_heads", theirs.num_heads, ours.num_heads)
    if theirs.bias_k is not None or theirs.add_zero_attn:
        raise ValueError(f"{prefix}: add_bias_kv / add_zero_attn have no counterpart here")
    D = ours.d_model
    if theirs._qkv_same_embed_dim:
        # PyTorch packs [W_q; W_k; W_v] into one (3D, D) matrix.
        w_q, w_k, w_v = theirs.in_proj_weight.chunk(3, dim=0)
    else:
        w_q, w_k, w_v = theirs.q_proj_weight, theirs.k_proj_weight, theirs.v_proj_weight
    if theirs.in_proj_bias is not None:
        b_q, b_k, b_v = theirs.in_proj_bias.split(D)
    else:
        b_q = b_k = b_v = None
    return [
        (ours.w_q.weight, w_q, f"{prefix}w_q.weight"),
        (ours.w_k.weight, w_k, f"{prefix}w_k.weight"),
        (ours.w_v.weight, w_v, f"{prefix}w_v.weight"),
        (ours.w_q.bias, b_q, f"{prefix}w_q.bias"),
        (ours.w_k.bias, b_k, f"{prefix}w_k.bias"),
        (ours.w_v.bias, b_v, f"{prefix}w_v.bias"),
        (ours.w_o.weight, theirs.out_proj.weight, f"{prefix}w_o.weight"),
        (ours.w_o.bias, theirs.out_proj.bias, f"{prefix}w_o.bias"),
    ]


def _norm_pairs(ours: LayerNorm, theirs: nn.LayerNorm, what: str) -> list[_Pair]:
    _check_same(f"{what}.eps", theirs.eps, ours.eps)
    return [
        (ours.weight, theirs.weight, f"{what}.weight"),
        (ours.bias, theirs.bias, f"{what}.bias"),
    ]


def _activation_name(activation: object) -> object:
    """PyTorch stores a layer's activation as a function or a module; name the two we have."""
    if activation is F.relu or isinstance(activation, nn.ReLU):
        return "relu"
    exact_gelu = isinstance(activation, nn.GELU) and activation.approximate == "none"
    if activation is F.gelu or exact_gelu:
        return "gelu"
    return activation


def _layer_pairs(ours, theirs) -> list[_Pair]:
    """Encoder/decoder layer: the settings that change the maths must agree, then the weights."""
    _check_same("norm_first", theirs.norm_first, ours.norm_first)
    _check_same("activation", _activation_name(theirs.activation), ours.ffn.activation)
    return [
        (ours.ffn.linear1.weight, theirs.linear1.weight, "ffn.linear1.weight"),
        (ours.ffn.linear1.bias, theirs.linear1.bias, "ffn.linear1.bias"),
        (ours.ffn.linear2.weight, theirs.linear2.weight, "ffn.linear2.weight"),
        (ours.ffn.linear2.bias, theirs.linear2.bias, "ffn.linear2.bias"),
    ]


def _state_pairs(ours: nn.Module, theirs: nn.Module) -> list[_Pair]:
    """Modules with the same parameter and buffer names (the norms): copy the state_dict."""
    mine, their = ours.state_dict(), theirs.state_dict()
    if set(mine) != set(their):
        raise ValueError(
            f"ours, theirs: got state_dict keys {list(their)} from {type(theirs).__name__}, "
            f"expected {list(mine)} for {type(ours).__name__}"
        )
    for setting in ("normalized_shape", "eps", "momentum"):  # settings that change the maths
        if hasattr(ours, setting) and hasattr(theirs, setting):
            _check_same(setting, getattr(theirs, setting), getattr(ours, setting))
    return [(mine[name], their[name], name) for name in mine]


def copy_weights_from_torch(ours: nn.Module, theirs: nn.Module) -> nn.Module:
    """Copy the weights of a PyTorch built-in into the matching course module.

    Supported pairs: ``MultiHeadAttention`` <- ``nn.MultiheadAttention``;
    ``LayerNorm`` <- ``nn.LayerNorm``; ``BatchNorm1d`` <- ``nn.BatchNorm1d``
    (parameters and running statistics); ``EncoderLayer`` <-
    ``nn.TransformerEncoderLayer``; ``DecoderLayer`` <- ``nn.TransformerDecoderLayer``.
    Every shape and setting that changes the result (head count, ``norm_first``,
    activation, ``eps``) is checked *before* anything is copied, so a mismatch
    raises ``ValueError`` and leaves ``ours`` untouched. Returns ``ours``.
    """
    if isinstance(ours, MultiHeadAttention) and isinstance(theirs, nn.MultiheadAttention):
        pairs = _mha_pairs(ours, theirs, "")
    elif isinstance(ours, EncoderLayer) and isinstance(theirs, nn.TransformerEncoderLayer):
        pairs = _layer_pairs(ours, theirs)
        pairs += _mha_pairs(ours.self_attn, theirs.self_attn, "self_attn.")
        pairs += _norm_pairs(ours.norm1, theirs.norm1, "norm1")
        pairs += _norm_pairs(ours.norm2, theirs.norm2, "norm2")
    elif isinstance(ours, DecoderLayer) and isinstance(theirs, nn.TransformerDecoderLayer):
        pairs = _layer_pairs(ours, theirs)
        pairs += _mha_pairs(ours.self_attn, theirs.self_attn, "self_attn.")
        pairs += _mha_pairs(ours.cross_attn, theirs.multihead_attn, "cross_attn.")
        pairs += _norm_pairs(ours.norm1, theirs.norm1, "norm1")
        pairs += _norm_pairs(ours.norm2, theirs.norm2, "norm2")
        pairs += _norm_pairs(ours.norm3, theirs.norm3, "norm3")
    elif isinstance(theirs, (nn.LayerNorm, nn.BatchNorm1d)):
        # Same parameter and buffer names (also for a student's own norm class).
        pairs = _state_pairs(ours, theirs)
    else:
        raise ValueError(
            f"ours, theirs: got {type(ours).__name__} and {type(theirs).__name__}, expected one "
            f"of the supported pairs (see the docstring)"
        )
    for dst, src, what in pairs:  # check everything first: a failed call copies nothing
        _check_pair(dst, src, what)
    with torch.no_grad():
        for dst, src, _ in pairs:
            if dst is not None:
                dst.copy_(src)
    return ours
