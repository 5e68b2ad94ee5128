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


# ---------------------------------------------------------------- chapter 17: find the head


def second_half_loss(model, ids: torch.Tensor, period: int) -> torch.Tensor:
    """The cross-entropy of ``model`` on the predictable half of repeated sequences.

    ``ids (B, 2 * period)`` repeat with ``period`` (:func:`~attention_course.data.repeated_tokens`).
    The logits at positions ``period .. 2 * period - 2`` predict tokens
    ``period + 1 .. 2 * period - 1``, each of which occurred ``period`` positions earlier,
    after the same token: an induction head can copy them. (The prediction of token
    ``period``, the first repeated one, is left out: nothing says the sequence restarts.)
    Returns a scalar tensor (mean over the batch and those positions).
    """
    import torch.nn.functional as F

    logits = model(ids)  # (B, T, V)
    V = logits.shape[-1]
    return F.cross_entropy(logits[:, period:-1].reshape(-1, V), ids[:, period + 1 :].reshape(-1))


def _layer_head_pairs(heads, num_layers: int, num_heads: int) -> list[tuple[int, int]]:
    """``heads`` checked: a list of ``(layer, head)`` pairs of ints within the model."""

    def is_int(v) -> bool:
        return (
            isinstance(v, Integral)
            and not isinstance(v, bool)
            or (isinstance(v, torch.Tensor) and v.dim() == 0 and not v.dtype.is_floating_point)
        )

    try:
        items = list(heads)
    except TypeError:
        items = None
    if items is not None and len(items) == 2 and all(is_int(v) for v in items):
        raise TypeError(
            f"ablate_heads(model, heads): got the single pair {tuple(int(v) for v in items)}; "
            "heads is a list of (layer, head) pairs: wrap it, `[(layer, head)]`"
        )
    pairs = []
    for item in items if items is not None else [heads]:
        try:
            layer, head = item
        except (TypeError, ValueError):
            raise TypeError(
                f"ablate_heads(model, heads): got {heads!r}; heads is a list of (layer, head) "
                "pairs of ints, e.g. `[(1, 0)]`"
            ) from None
        if not (is_int(layer) and is_int(head)):
            raise TypeError(
                f"ablate_heads(model, heads): the pair {item!r} is not two ints (layer, head)"
            )
        layer, head = int(layer), int(head)
        if not (0 <= layer < num_layers and 0 <= head < num_heads):
            raise ValueError(
                f"ablate_heads(model, heads): no head (layer={layer}, head={head}); the model "
                f"has {num_layers} layers of {num_heads} heads, both 0-based, and a pair is "
                "(layer, head) in that order"
            )
        pairs.append((layer, head))
    return pairs


class ablate_heads:  # noqa: N801 - used as a context manager, like torch.no_grad
    """Zero the outputs of the heads ``[(layer, head), ...]`` of a :class:`GPT` inside a
    ``with`` block, and restore the weights on leaving it.

    Head ``h``'s output is read by columns ``h * Dh .. (h + 1) * Dh`` of its layer's
    ``attn.w_o.weight`` (the heads are concatenated before ``w_o``): zeroing those
    columns removes the head's contribution to the residual stream and nothing else.
    Layers and heads are 0-based (``model.blocks[layer]``).
    """

    def __init__(self, model, heads) -> None:
        d_head = model.d_model // model.num_heads
        pairs = _layer_head_pairs(heads, model.num_layers, model.num_heads)
        self.parts = [
            (model.blocks[layer].attn.w_o.weight, slice(head * d_head, (head + 1) * d_head))
            for layer, head in pairs
        ]

    def __enter__(self):
        self.saved = [w.data[:, cols].clone() for w, cols in self.parts]
        for w, cols in self.parts:
            w.data[:, cols] = 0.0
        return self

    def __exit__(self, *exc) -> None:
        for (w, cols), saved in zip(self.parts, self.saved):
            w.data[:, cols] = saved


@torch.no_grad()
def find_induction_head(model, ids: torch.Tensor, period: int) -> tuple[int, int]:
    """``(layer, head)``, 0-based, of the head of ``model`` with the highest
    :func:`induction_scores` on the repeated sequences ``ids`` (period ``period``)."""
    _, weights = model(ids, return_attention=True)
    scores = torch.stack([induction_scores(w, period) for w in weights])  # (L, H)
    layer, head = divmod(int(scores.argmax()), scores.shape[1])
    return layer, head


@torch.no_grad()
def ablation_effect(model, ids: torch.Tensor, period: int, layer: int, head: int) -> float:
    """How much zeroing head ``(layer, head)`` raises :func:`second_half_loss`: the loss
    with the head ablated minus the loss of the intact model, in nats (the model is left
    unchanged)."""
    before = second_half_loss(model, ids, period).item()
    with ablate_heads(model, [(layer, head)]):
        after = second_half_loss(model, ids, period).item()
    return after - before


_INDUCTION_STATES: dict = {}

# Chapter 17's attention-only model and its training (train_induction_model's defaults,
# scripts/train_induction.py's file).
INDUCTION_CONFIG = {
    "vocab_size": 32,
    "d_model": 64,
    "num_heads": 4,
    "num_layers": 2,
    "max_len": 64,
    "pos": "rope",
    "ffn": "none",
    "tie_weights": False,
}
INDUCTION_TRAINING = {"seed": 0, "num_steps": 300}


def train_induction_model(seed: int = 0, num_steps: int = 300, progress: bool = False):
    """Chapter 17's two-layer attention-only :class:`GPT`, trained on repeated tokens.

    Vocabulary 32, ``d_model=64``, 2 layers of 4 heads, rotary positions, no FFN, untied
    head (:data:`INDUCTION_CONFIG`); AdamW (lr ``5e-3``) on batches of 64
    :func:`~attention_course.data.repeated_tokens` sequences whose period is drawn from
    10 .. 20 per batch, loss :func:`second_half_loss`. With ``seed=0`` and 300 steps an
    induction head forms around step 160 (chapter 17). The trained weights are kept for
    the process: a second call with the same arguments returns a fresh copy of the same
    model at once. Returns the model in eval mode.

    The result depends on the machine in its last digits (300 optimiser steps amplify
    rounding differences between CPUs, BLAS libraries and thread counts). Whatever must
    be the same everywhere, exercise 17 and its checkers, uses the copy trained once and
    shipped with the package, :func:`load_induction_model`.
    """
    from tqdm import tqdm

    from .data.repeated import repeated_tokens
    from .device import seed_everything
    from .gpt import GPT

    key = (seed, num_steps)
    if key not in _INDUCTION_STATES:
        seed_everything(seed)
        model = GPT(**INDUCTION_CONFIG)
        optimizer = torch.optim.AdamW(model.parameters(), lr=5e-3, weight_decay=0.0)
        gen = torch.Generator().manual_seed(seed)
        for _ in tqdm(range(num_steps), desc="training", disable=not progress, leave=False):
            period = int(torch.randint(10, 21, (1,), generator=gen))
            ids = repeated_tokens(64, period, 32, gen)
            loss = second_half_loss(model, ids, period)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        _INDUCTION_STATES[key] = {k: v.detach().clone() for k, v in model.state_dict().items()}
    model = GPT(**INDUCTION_CONFIG)
    model.load_state_dict(_INDUCTION_STATES[key])
    return model.eval()


_INDUCTION_FILE: dict = {}


def load_induction_model(path=None):
    """Chapter 17's trained attention-only model, as shipped with the package.

    ``path=None`` reads ``attention_course/assets/induction17.pt``, written by
    ``scripts/train_induction.py``: :func:`train_induction_model` (seed 0, 300 steps, one
    thread) run once, its float32 weights saved. The same bytes on every machine, so the
    same model: exercise 17 and its checkers use it. The file is read once per process;
    each call returns a fresh copy in eval mode (changing one leaves the next untouched).
    The file holds ``config`` (the :class:`GPT` constructor's arguments), ``state_dict``
    and ``info`` (the training settings); the model has ``info`` as an attribute.
    """
    from pathlib import Path

    from .gpt import GPT

    path = Path(__file__).parent / "assets" / "induction17.pt" if path is None else Path(path)
    key = str(path.resolve())
    if key not in _INDUCTION_FILE:
        _INDUCTION_FILE[key] = torch.load(path, map_location="cpu", weights_only=True)
    data = _INDUCTION_FILE[key]
    model = GPT(**data["config"])
    model.load_state_dict(data["state_dict"])  # copies: the cached tensors stay untouched
    model.info = dict(data.get("info", {}))
    return model.eval()
