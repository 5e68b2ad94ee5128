"""Sampling from a language model's next-token distribution (chapter 13).

:func:`filter_logits` implements the two standard truncations: top-k (Fan,
Lewis & Dauphin, 2018, "Hierarchical Neural Story Generation") and top-p, or
nucleus, sampling (Holtzman et al., 2020, "The Curious Case of Neural Text
Degeneration"). Both set the logits of the tokens they drop to ``-inf``, so a
softmax afterwards gives those tokens probability exactly 0 and renormalises
the rest.
"""

from __future__ import annotations

from numbers import Integral, Real

import torch
import torch.nn.functional as F

from ._validate import require_float


def _check_arguments(logits: torch.Tensor, top_k, top_p) -> None:
    require_float("logits", logits)
    if logits.dim() < 1 or logits.shape[-1] < 1:
        raise ValueError(
            f"logits: got shape {tuple(logits.shape)}, expected (..., V) with V >= 1 tokens"
        )
    if top_k is not None and (
        not isinstance(top_k, Integral) or isinstance(top_k, bool) or top_k < 1
    ):
        raise ValueError(f"top_k: got {top_k!r}, expected None or an int >= 1")
    if top_p is not None and (
        not isinstance(top_p, Real) or isinstance(top_p, bool) or not 0.0 < top_p <= 1.0
    ):
        raise ValueError(f"top_p: got {top_p!r}, expected None or a number in (0, 1]")


def filter_logits(
    logits: torch.Tensor, top_k: int | None = None, top_p: float | None = None
) -> torch.Tensor:
    """Keep the top-k and/or top-p (nucleus) tokens; set every other logit to ``-inf``.

    - **top-k** keeps the ``k`` largest logits of each row. Ties at the k-th
      value are all kept, so a row may keep more than ``k`` tokens; ``k >= V``
      keeps every token.
    - **top-p** keeps the smallest set of largest-probability tokens whose
      total probability reaches ``top_p``: going down the sorted
      probabilities, a token is kept while the mass *before* it is still below
      ``top_p``, so the token that crosses ``top_p`` is kept, and one that
      brings the mass exactly to ``top_p`` ends the set. Tokens tied in
      probability with the last one kept are kept too (as for top-k), so the
      result never depends on how a sort orders equal values. ``top_p = 1``
      keeps every token.
    - **both**: top-k first, then top-p on the probabilities renormalised
      over the tokens top-k kept (the order Hugging Face applies them in).

    The input is not modified; the result has its shape and dtype. For
    half-precision logits the probabilities are computed in float32.

    Hugging Face counterparts: ``TopKLogitsWarper`` and ``TopPLogitsWarper``
    (``transformers.generation``). Differences: their ``min_tokens_to_keep``
    (here always 1: the most probable token is never dropped) and
    ``filter_value`` (here always ``-inf``); ``TopPLogitsWarper`` accepts
    ``top_p = 0`` (keeping ``min_tokens_to_keep`` tokens), which is a
    ``ValueError`` here. ``TopPLogitsWarper`` removes the tokens whose ascending
    cumulative probability is ``<= 1 - top_p``: the same rule in exact
    arithmetic, but ``1 - top_p`` and a cumulative sum from the other end round
    differently, so the two can disagree on a token whose cumulative
    probability lies within rounding error of ``top_p``; and it breaks ties
    at the boundary by sort order, keeping only some of the tied tokens.
    ``TopKLogitsWarper`` keeps ties like this function.

    Shapes:
        logits: ``(..., V)``, any floating dtype; returns ``(..., V)``, same dtype.

    Raises:
        ValueError: ``top_k < 1``, ``top_p`` outside (0, 1], or logits that are
            not a floating tensor of shape ``(..., V)``.
    """
    _check_arguments(logits, top_k, top_p)
    neg_inf = float("-inf")
    filtered = logits
    if top_k is not None and top_k < logits.shape[-1]:
        kth_largest = logits.topk(int(top_k), dim=-1).values[..., -1:]  # (..., 1)
        filtered = logits.masked_fill(logits < kth_largest, neg_inf)  # ties at the k-th stay
    if top_p is not None and top_p < 1.0:
        # Probabilities over the tokens still kept: a -inf logit gets probability 0.
        work_dtype = torch.promote_types(logits.dtype, torch.float32)
        probs = filtered.to(work_dtype).softmax(dim=-1)  # (..., V)
        sorted_probs = probs.sort(dim=-1, descending=True).values  # (..., V)
        # The mass of the tokens before each one: the cumulative sum shifted right by one.
        mass_before = F.pad(sorted_probs.cumsum(dim=-1)[..., :-1], (1, 0))  # (..., V)
        keep_sorted = (mass_before < top_p) & (sorted_probs > 0)
        num_kept = keep_sorted.sum(dim=-1, keepdim=True).clamp(min=1)  # (..., 1)
        # The smallest probability kept: every token at least as probable stays (ties too).
        threshold = sorted_probs.gather(-1, num_kept - 1)  # (..., 1)
        filtered = filtered.masked_fill(probs < threshold, neg_inf)
    # A new tensor even when nothing was dropped: the caller may change it in place.
    return filtered.clone() if filtered is logits else filtered


def _check_generate_arguments(model, prompt, max_new_tokens, temperature, generator) -> None:
    if not isinstance(prompt, torch.Tensor):
        raise ValueError(f"prompt: got {type(prompt).__name__}, expected a LongTensor (B, T0)")
    if prompt.dim() != 2 or prompt.shape[1] < 1:
        raise ValueError(
            f"prompt: got shape {tuple(prompt.shape)}, expected (B, T0) with T0 >= 1 tokens"
        )
    if (
        not isinstance(max_new_tokens, Integral)
        or isinstance(max_new_tokens, bool)
        or max_new_tokens < 0
    ):
        raise ValueError(f"max_new_tokens: got {max_new_tokens!r}, expected an int >= 0")
    if not isinstance(temperature, Real) or isinstance(temperature, bool) or temperature < 0:
        raise ValueError(f"temperature: got {temperature!r}, expected a number >= 0")
    if generator is not None and not isinstance(generator, torch.Generator):
        raise ValueError(
            f"generator: got {type(generator).__name__}, expected None or a torch.Generator"
        )


def generate(
    model: torch.nn.Module,
    prompt: torch.Tensor,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    use_cache: bool = True,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Continue ``prompt`` by ``max_new_tokens`` tokens sampled one at a time.

    At each step the last position's logits are divided by ``temperature``,
    filtered by :func:`filter_logits` (``top_k``, ``top_p``), turned into
    probabilities and sampled with ``torch.multinomial(..., generator=generator)``;
    ``temperature=0`` is greedy decoding (the argmax; ``top_k``/``top_p`` change
    nothing then). A seeded ``generator`` makes samples reproducible.

    ``model`` is a :class:`~attention_course.GPT` (anything with its
    ``forward(ids, cache=...)``, ``new_cache()``, ``pos`` and ``max_len``). With
    ``use_cache`` (the default) the prompt is read once and every later step feeds
    only the newest token, whose keys and values join chapter 12's KV cache;
    without it, every step re-reads the whole sequence. Both give the same tokens for
    the same generator state (up to floating-point ties between two logits).

    Context length, for absolute (learned or sinusoidal) positions: without the cache,
    the model reads only the last ``max_len`` tokens at each step (a sliding window);
    with the cache the positions cannot go past ``max_len``, so
    ``T0 + max_new_tokens - 1 > max_len`` raises ``ValueError`` (use
    ``use_cache=False`` for longer continuations). Positions "none" have no limit.

    The model runs in evaluation mode under ``torch.inference_mode``; its training
    flag is restored afterwards. Hugging Face counterpart: ``model.generate(input_ids,
    do_sample=True, temperature=..., top_k=..., top_p=..., use_cache=...)``.

    Shapes:
        prompt: ``(B, T0)`` token ids; returns ``(B, T0 + max_new_tokens)`` (the prompt first).

    Raises:
        ValueError: ``temperature < 0``, bad ``top_k``/``top_p``, ``max_new_tokens < 0``,
            a prompt that is not ``(B, T0)`` ids in the vocabulary, or (with the cache)
            a continuation past ``max_len`` for absolute positions.
    """
    _check_generate_arguments(model, prompt, max_new_tokens, temperature, generator)
    if top_k is not None or top_p is not None:  # validate even when greedy
        _check_arguments(torch.zeros(1), top_k, top_p)
    absolute = getattr(model, "pos", None) in ("learned", "sinusoidal")
    max_len = getattr(model, "max_len", None)
    T0 = prompt.shape[1]
    if use_cache and absolute and max_new_tokens > 0 and T0 + max_new_tokens - 1 > max_len:
        raise ValueError(
            f"max_new_tokens: got {max_new_tokens} after a prompt of {T0} tokens; with "
            f"use_cache=True and {model.pos} positions the model reads at most "
            f"max_len={max_len} positions, so T0 + max_new_tokens - 1 must be <= {max_len} "
            "(or pass use_cache=False, which slides a window of max_len tokens)"
        )
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            out = _generate(
                model, prompt, max_new_tokens, temperature, top_k, top_p, use_cache, generator,
                max_len if absolute else None,
            )  # fmt: skip
    finally:
        model.train(was_training)
    # A normal tensor, not an inference tensor: it may be fed to the model with autograd on.
    return out.clone()


def _generate(model, prompt, max_new_tokens, temperature, top_k, top_p, use_cache, gen, window):
    out = prompt
    cache = model.new_cache() if use_cache else None
    step_input = prompt
    for _ in range(max_new_tokens):
        if not use_cache and window is not None:
            step_input = out[:, -window:]  # crop to the positions the model has
        logits = model(step_input, cache=cache)[:, -1, :]  # (B, T, V) -> (B, V)
        if temperature == 0:
            nxt = logits.argmax(dim=-1, keepdim=True)  # (B, 1)
        else:
            logits = filter_logits(logits.float() / temperature, top_k, top_p)
            probs = logits.softmax(dim=-1)  # (B, V)
            nxt = torch.multinomial(probs, 1, generator=gen)  # (B, 1)
        out = torch.cat([out, nxt], dim=1)
        step_input = nxt if use_cache else out
    return out
