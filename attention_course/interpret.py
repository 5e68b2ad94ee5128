"""Reading attention weights: attention rollout and induction scores (chapter 17).

:func:`attention_rollout` follows Abnar & Zuidema (2020), "Quantifying Attention
Flow in Transformers"; :func:`induction_scores` measures the induction-head
pattern of Olsson et al. (2022), "In-context Learning and Induction Heads".
Both take attention *weights* (rows that sum to 1, as returned with
``need_weights=True``), batch first: ``(B, H, T, T)``.

Attention weights are not explanations by themselves (Jain & Wallace, 2019,
"Attention is not Explanation"; Wiegreffe & Pinter, 2019, "Attention is not
not Explanation"): these are descriptive summaries of where weight goes.
"""

from __future__ import annotations

from collections.abc import Sequence
from numbers import Integral

import torch

from ._validate import require_float, shape_str


def _check_weights(name: str, w: object) -> torch.Tensor:
    w = require_float(name, w)
    if w.dim() != 4:
        raise ValueError(
            f"{name}: got shape {shape_str(w.shape)} ({w.dim()}-D), expected (B, H, T, T)"
        )
    if w.shape[-1] != w.shape[-2]:
        raise ValueError(
            f"{name}: got shape {shape_str(w.shape)}, expected square self-attention "
            "weights (B, H, T, T)"
        )
    return w


def attention_rollout(attentions: Sequence[torch.Tensor]) -> torch.Tensor:
    """Attention rollout (Abnar & Zuidema, 2020): how much each output position
    draws on each input token, through every layer and its residual connection.

    For layers ``l = 1 .. L`` (``attentions[0]`` is layer 1, the one nearest the
    input) with weights ``W_l`` of shape ``(B, H, T, T)``:

    1. average over heads: ``Wbar_l = mean_h W_l[:, h]``;
    2. add the identity for the residual connection and renormalise the rows:
       ``A_l = (Wbar_l + I) / rowsum(Wbar_l + I)``. When the rows of ``W_l``
       sum to 1 this is the paper's ``A_l = 0.5 Wbar_l + 0.5 I``;
    3. multiply from the last layer down to the first:
       ``R = A_L @ A_{L-1} @ ... @ A_1`` (the paper's recursion
       ``R_l = A_l @ R_{l-1}``, ``R_1 = A_1``).

    ``R[b, i, j]`` is the share of position ``i``'s representation after the
    last layer attributed to input token ``j``; each row sums to 1. With a
    single layer, ``R = A_1``.

    No PyTorch or Hugging Face built-in computes this. It is the computation
    of ``compute_joint_attention`` in the authors' code
    (github.com/samiraabnar/attention_flow): ``att + I``, divided by its row
    sums, then ``joint[i] = aug[i] @ joint[i - 1]``. Some later code (e.g.
    ``vit-explain``, for vision Transformers) also offers a max or min over
    heads; here, as in the paper, heads are averaged.

    Shapes:
        attentions: a non-empty list of ``L`` tensors ``(B, H, T, T)`` (H may
        differ between layers; B and T may not); returns ``(B, T, T)`` in
        their dtype.

    Raises:
        ValueError: an empty list, a tensor that is not 4-D float square
            weights, or layers whose B or T differ.
    """
    if isinstance(attentions, torch.Tensor) or not isinstance(attentions, Sequence):
        raise ValueError(
            f"attentions: got {type(attentions).__name__}, expected a list of "
            "(B, H, T, T) tensors, one per layer"
        )
    if len(attentions) == 0:
        raise ValueError("attentions: got an empty list, expected one (B, H, T, T) per layer")
    layers = [_check_weights(f"attentions[{i}]", w) for i, w in enumerate(attentions)]
    B, _, T, _ = layers[0].shape
    for i, w in enumerate(layers[1:], start=1):
        if w.shape[0] != B or w.shape[-1] != T:
            raise ValueError(
                f"attentions[{i}]: got shape {shape_str(w.shape)}, expected (B={B}, H, "
                f"T={T}, T={T}) like attentions[0] {shape_str(layers[0].shape)}"
            )
    eye = torch.eye(T, device=layers[0].device, dtype=layers[0].dtype)
    rollout = None
    for w in layers:  # layer 1 first: each later layer multiplies on the left
        a = w.mean(dim=1) + eye  # (B, H, T, T) -> (B, T, T); + I for the residual
        a = a / a.sum(dim=-1, keepdim=True)  # rows renormalised to sum to 1
        rollout = a if rollout is None else a @ rollout  # R_l = A_l @ R_{l-1}
    return rollout


def induction_scores(weights: torch.Tensor, period: int) -> torch.Tensor:
    """Each head's induction score on a sequence that repeats with ``period``.

    An induction head at position ``i`` looks back to the previous occurrence
    of the current token, at ``i - period``, and attends to the token *after*
    it, at ``i - period + 1``, the token it predicts next (Olsson et al.,
    2022). The score of head ``h`` is the mean of
    ``weights[b, h, i, i - period + 1]`` over ``i = period .. T - 1`` (the
    positions whose token has occurred before) and over the batch. It lies in
    [0, 1] for weights whose rows are distributions: 1 for a perfect induction
    head; for uniform causal weights it is the mean of ``1 / (i + 1)``.

    No PyTorch or Hugging Face built-in computes this; TransformerLens's
    induction-head demo computes a similar mean over the same diagonal (with a
    beginning-of-sequence token prepended, so its indices shift by one).

    Shapes:
        weights: ``(B, H, T, T)``; returns ``(H,)`` in its dtype.

    Raises:
        ValueError: weights not 4-D float square, or ``period`` not an int
            with ``1 <= period < T``.
    """
    w = _check_weights("weights", weights)
    T = w.shape[-1]
    if not isinstance(period, Integral) or isinstance(period, bool) or not 1 <= period < T:
        raise ValueError(f"period: got {period!r}, expected an int with 1 <= period < T={T}")
    # The diagonal at offset -(period - 1) holds w[..., i, i - period + 1] for
    # i = period - 1 .. T - 1; drop its first entry (i = period - 1, whose token
    # has not occurred before).
    diag = torch.diagonal(w, offset=-(period - 1), dim1=-2, dim2=-1)  # (B, H, T - period + 1)
    return diag[..., 1:].mean(dim=(0, 2))  # (B, H, T - period) -> (H,)
