"""Keeping logits in range (chapter 20): soft-capping.

:func:`softcap` squashes a logit smoothly into ``(-cap, cap)``. Gemma 2 (Gemma Team,
2024, "Gemma 2: Improving Open Language Models at a Practical Size", arXiv:2408.00118)
caps the attention scores of every layer and the final output logits with it. The other
remedy chapter 20 measures, QK-norm (an :class:`~attention_course.RMSNorm` on each
head's queries and keys before the dot product), is an option of
:class:`~attention_course.CausalSelfAttention` and :class:`~attention_course.GPT`
(``qk_norm=True``), as is soft-capping the scores (``softcap=``) and the model's logits
(``GPT(final_softcap=)``).
"""

from __future__ import annotations

import math

import torch

from ._validate import require_float


def check_cap(name: str, cap: object) -> float:
    """``cap`` must be a finite number > 0 (a float for the tanh); returns it as a float."""
    if isinstance(cap, bool) or not isinstance(cap, (int, float)):
        raise ValueError(f"{name}: got {cap!r}, expected a number > 0")
    if not (math.isfinite(cap) and cap > 0):
        raise ValueError(f"{name}: got {cap!r}, expected a finite number > 0")
    return float(cap)


def softcap(x: torch.Tensor, cap: float) -> torch.Tensor:
    """Soft-capping: ``cap * tanh(x / cap)``, a smooth squash of ``x`` into ``(-cap, cap)``.

    For ``|x|`` much smaller than ``cap`` it is close to the identity (``tanh(u) ≈ u -
    u³/3``, so ``|softcap(x) - x| <= |x|³ / (3 cap²)``: ``x = cap / 10`` loses about 0.33 %
    of itself), and its size stays below ``cap``: a logit cannot grow without bound,
    however large the product of the query and key (or of the last hidden state and the
    output embedding) becomes. (In floating point ``tanh`` rounds to exactly ±1 once
    ``|x| / cap`` passes about 9 in float32, 19 in float64; there the bound is
    ``|softcap(x)| = cap``.) The gradient, ``1 - tanh²(x / cap)``, is 1 at 0 and vanishes
    for ``|x| >> cap``: a capped logit no longer learns to grow.

    Hugging Face: ``attn_logit_softcapping`` and ``final_logit_softcapping`` in
    ``transformers.models.gemma2`` (``x / cap``, ``tanh``, ``* cap``, as here; its
    ``Gemma2Config`` defaults them to 50.0 and 30.0); on attention it is applied to the
    scaled scores, before the mask (:class:`~attention_course.CausalSelfAttention`).

    Shapes:
        x: any shape, floating point; returns the same shape and dtype.

    Raises:
        ValueError: ``cap <= 0`` (or not a finite number), or ``x`` not a float tensor.
    """
    require_float("x", x)
    cap = check_cap("cap", cap)
    return cap * torch.tanh(x / cap)
