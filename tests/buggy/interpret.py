"""Buggy attention rollouts (attention_rollout, chapter 17)."""

import torch


def _layer(w):
    a = w.mean(dim=1) + torch.eye(w.shape[-1], dtype=w.dtype)
    return a / a.sum(dim=-1, keepdim=True)


def rollout_no_identity(attentions):
    """Forgets the residual connection: multiplies the head means without adding I."""
    result = attentions[0].mean(dim=1)
    for w in attentions[1:]:
        result = w.mean(dim=1) @ result
    return result


def rollout_no_renormalisation(attentions):
    """Adds the identity but never divides by the row sums (rows sum to 2**L)."""
    eye = torch.eye(attentions[0].shape[-1], dtype=attentions[0].dtype)
    result = attentions[0].mean(dim=1) + eye
    for w in attentions[1:]:
        result = (w.mean(dim=1) + eye) @ result
    return result


def rollout_wrong_order(attentions):
    """Multiplies first layer last: A_1 @ A_2 @ ... @ A_L."""
    result = _layer(attentions[0])
    for w in attentions[1:]:
        result = result @ _layer(w)
    return result


def rollout_max_over_heads(attentions):
    """Fuses the heads with a max instead of the mean."""
    result = None
    for w in attentions:
        a = w.amax(dim=1) + torch.eye(w.shape[-1], dtype=w.dtype)
        a = a / a.sum(dim=-1, keepdim=True)
        result = a if result is None else a @ result
    return result


def rollout_column_renormalisation(attentions):
    """Renormalises the columns (dim=-2) instead of the rows."""
    result = None
    for w in attentions:
        a = w.mean(dim=1) + torch.eye(w.shape[-1], dtype=w.dtype)
        a = a / a.sum(dim=-2, keepdim=True)
        result = a if result is None else a @ result
    return result


def rollout_last_layer_only(attentions):
    """Overwrites instead of multiplying: returns the last layer's matrix alone."""
    result = None
    for w in attentions:
        result = _layer(w)
    return result


def rollout_float32(attentions):
    """Builds the identity in the default float32 and casts the result: float64 inputs
    come back as float32."""
    result = None
    for w in attentions:
        a = w.float().mean(dim=1) + torch.eye(w.shape[-1])
        a = a / a.sum(dim=-1, keepdim=True)
        result = a if result is None else a @ result
    return result


def rollout_in_place(attentions):
    """Adds the identity in place to the caller's weights (`w += eye`)."""
    result = None
    for w in attentions:
        w += torch.eye(w.shape[-1], dtype=w.dtype) / w.shape[1]
        a = w.mean(dim=1)
        a = a / a.sum(dim=-1, keepdim=True)
        result = a if result is None else a @ result
    return result


CATALOGUE = [
    ("attention_rollout", "no identity", rollout_no_identity, "forgets the identity"),
    (
        "attention_rollout",
        "no renormalisation",
        rollout_no_renormalisation,
        "does not renormalise the rows",
    ),
    ("attention_rollout", "wrong order", rollout_wrong_order, "multiplies in the wrong order"),
    (
        "attention_rollout",
        "max over heads",
        rollout_max_over_heads,
        "takes the max over heads instead of the mean",
    ),
    (
        "attention_rollout",
        "column renormalisation",
        rollout_column_renormalisation,
        "renormalises the columns, not the rows",
    ),
    (
        "attention_rollout",
        "last layer only",
        rollout_last_layer_only,
        "returns only the last layer's matrix",
    ),
    ("attention_rollout", "float32", rollout_float32, "expected dtype torch.float64"),
    ("attention_rollout", "in place", rollout_in_place, "changed attentions[0] in place"),
]
