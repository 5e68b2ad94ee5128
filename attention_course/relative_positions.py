"""Relative positions inside attention (chapter 14): rotary embeddings and ALiBi; RoPE
scaled to contexts longer than training (chapter 19: :func:`rope_frequencies`).

Chapter 9's positions are *added to the embeddings*; these act inside attention,
on the queries and keys (RoPE) or on the scores (ALiBi), so that a score depends on
how far apart two tokens are rather than where they are.

- RoPE (rotary position embedding, 旋转位置编码; Su et al., 2021, "RoFormer: Enhanced
  Transformer with Rotary Position Embedding"): rotate each pair of query/key
  features by an angle proportional to the position. Rotations compose, so
  ``rope(q, m) . rope(k, n)`` depends on ``m - n`` only.
- ALiBi (Press et al., 2022, "Train Short, Test Long: Attention with Linear Biases
  Enables Input Length Extrapolation"): add ``-slope_h * (i - j)`` to the score of
  query ``i`` and key ``j``, one fixed slope per head.
- RoPE scaling (chapter 19): :func:`rope_frequencies` with ``scaling={"type": ...}``
  changes the frequencies (and, for YaRN, the size of cos and sin) so that a model
  trained at length ``L0`` can read ``s * L0``: linear position interpolation (Chen et
  al., 2023), "NTK-aware" scaling (bloc97, 2023) and YaRN (Peng et al., 2023).

An attention module is *given* its relative positions as a small object
(:func:`attention_positions` makes one from a name): :class:`RotaryPositions` rotates
the queries and keys, :class:`ALiBiPositions` adds its bias to the scores. Both have the
same two methods, ``rotate(q, k, start)`` and ``score_mask(T, S, visible, device, dtype)``
(and ``on_scores``: whether ``score_mask`` changes the mask); a
variant (another RoPE layout through ``rotate=``, a scaled RoPE through ``scaling=``)
is another such object, never a change to a package attribute.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from ._validate import check_positive_int, require_float, shape_str
from .fused import prepare_fused_mask
from .masking import causal_mask


def _check_positions(positions: torch.Tensor, x: torch.Tensor) -> None:
    if not isinstance(positions, torch.Tensor):
        raise ValueError(
            f"positions: got {type(positions).__name__}, expected an integer tensor (T,) or (B, T)"
        )
    if positions.dtype == torch.bool or positions.is_floating_point() or positions.is_complex():
        raise ValueError(f"positions: got dtype {positions.dtype}, expected an integer dtype")
    T = x.shape[-2]
    if positions.dim() == 1 and positions.shape[0] == T:
        return
    if positions.dim() == 2 and x.dim() >= 3 and positions.shape == (x.shape[0], T):
        return
    expected = f"({T},) or (B={x.shape[0]}, {T})" if x.dim() >= 3 else f"({T},)"
    raise ValueError(f"positions: got shape {shape_str(positions.shape)}, expected {expected}")


def apply_rope(
    x: torch.Tensor,
    positions: torch.Tensor | None = None,
    base: float = 10000.0,
    scaling: dict | None = None,
) -> torch.Tensor:
    """Rotary position embedding (RoPE) of queries or keys, in the half-split layout.

    Feature ``i`` is paired with feature ``i + Dh/2`` (the GPT-NeoX / Hugging Face
    LLaMA layout), and the pair is rotated by ``theta_i = p * base^(-2i/Dh)`` at
    position ``p``:

    .. math::
        \\mathrm{out}_i = x_i \\cos\\theta_i - x_{i + D_h/2} \\sin\\theta_i, \\quad
        \\mathrm{out}_{i + D_h/2} = x_{i + D_h/2} \\cos\\theta_i + x_i \\sin\\theta_i

    RoFormer and GPT-J pair *adjacent* features ``(2i, 2i + 1)`` instead
    (interleaved): the same rotation up to a fixed permutation of the features,
    but weights trained with one layout are wrong under the other.

    Hugging Face counterpart: ``apply_rotary_pos_emb(q, k, cos, sin)`` of
    ``transformers.models.llama.modeling_llama`` (its ``rotate_half`` is the
    ``(-x2, x1)`` below). PyTorch has no built-in.

    ``scaling`` (chapter 19): None, or a dict as :func:`rope_frequencies` takes
    (``{"type": "linear" | "ntk" | "yarn", "factor": s, ...}``): the rotation then uses
    ``rope_frequencies(Dh, base, scaling)``'s frequencies, and cos and sin are both
    multiplied by its attention factor (YaRN's ``0.1 ln s + 1``; 1 otherwise), as
    Hugging Face's rotary embeddings do with ``rope_parameters`` (e.g.
    ``LlamaRotaryEmbedding``: ``cos = emb.cos() * attention_scaling``). Applied to both
    the queries and the keys, that multiplies every score by the factor squared. None
    leaves the rotation exactly as before (bit for bit).

    Shapes:
        x: ``(..., T, Dh)`` with ``Dh`` even; positions: ints ``(T,)`` or ``(B, T)``
        (``B = x.shape[0]``; one row of positions per sequence), default
        ``arange(T)``; returns the shape of ``x``.
    """
    require_float("x", x)
    if x.dim() < 2:
        raise ValueError(f"x: got shape {shape_str(x.shape)}, expected (..., T, Dh)")
    T, Dh = x.shape[-2], x.shape[-1]
    if Dh % 2 != 0:
        raise ValueError(f"x: got Dh={Dh} features, expected an even number (features pair up)")
    if not isinstance(base, (int, float)) or isinstance(base, bool) or not base > 0:
        raise ValueError(f"base: got {base!r}, expected a positive number")
    if scaling is not None:
        _check_scaling(scaling)
    if positions is None:
        positions = torch.arange(T, device=x.device)  # (T,)
    _check_positions(positions, x)
    if scaling is None:
        return _rotate(x, positions, _rope_frequencies(Dh, base, x))
    inv_freq, factor = rope_frequencies(Dh, base, scaling)  # float64 (Dh/2,), float
    return _rotate(x, positions, inv_freq.to(x.device, _work_dtype(x)), factor)


def _work_dtype(x: torch.Tensor) -> torch.dtype:
    # Angles in float32 at least (as Hugging Face does): positions * frequencies lose
    # precision in half precision long before the sequence ends.
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def _rope_frequencies(Dh: int, base: float, x: torch.Tensor) -> torch.Tensor:
    """RoPE's ``Dh / 2`` frequencies ``base^(-2i/Dh)``, in the angle dtype for ``x``."""
    i = torch.arange(Dh // 2, device=x.device, dtype=_work_dtype(x))  # (Dh/2,)
    return base ** (-2 * i / Dh)  # (Dh/2,): base^(-2i/Dh)


def _rotate(
    x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor, factor: float = 1.0
) -> torch.Tensor:
    """:func:`apply_rope`'s rotation (half-split) with given frequencies, without checks;
    cos and sin multiplied by ``factor`` (YaRN's attention factor) unless it is 1."""
    T, half = x.shape[-2], x.shape[-1] // 2
    angles = positions.to(inv_freq.dtype)[..., None] * inv_freq  # (T, Dh/2) or (B, T, Dh/2)
    if positions.dim() == 2:  # (B, T, Dh/2) -> (B, 1, .., 1, T, Dh/2), one 1 per middle axis
        angles = angles.view(angles.shape[0], *([1] * (x.dim() - 3)), T, half)
    cos, sin = angles.cos(), angles.sin()
    if factor != 1.0:  # in the angle dtype, then cast, as Hugging Face does
        cos, sin = cos * factor, sin * factor
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    x1, x2 = x[..., :half], x[..., half:]  # (..., T, Dh/2) each: the two halves of each pair
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)  # (..., T, Dh)


SCALING_TYPES = ("linear", "ntk", "yarn")
_SCALING_KEYS = {
    "linear": {"type", "factor"},
    "ntk": {"type", "factor"},
    "yarn": {"type", "factor", "original_max_len", "beta_fast", "beta_slow"},
}


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _check_scaling(scaling: object) -> None:
    """A RoPE scaling dict as :func:`rope_frequencies` takes it, or ValueError naming the
    key at fault."""
    if not isinstance(scaling, dict):
        raise ValueError(
            f"scaling: got {type(scaling).__name__}, expected None or a dict "
            "{'type': 'linear' | 'ntk' | 'yarn', 'factor': s, ...}"
        )
    kind = scaling.get("type")
    if kind not in SCALING_TYPES:
        raise ValueError(f"scaling['type']: got {kind!r}, expected one of {SCALING_TYPES}")
    unknown = sorted(set(scaling) - _SCALING_KEYS[kind], key=str)
    if unknown:
        raise ValueError(
            f"scaling: got unknown key(s) {unknown} for type {kind!r}, expected only "
            f"{sorted(_SCALING_KEYS[kind])}"
        )
    factor = scaling.get("factor")
    if not _is_number(factor) or not factor > 1:
        raise ValueError(
            f"scaling['factor']: got {factor!r}, expected a number > 1 (the context is "
            "stretched s times; s = 1 is no scaling: pass scaling=None)"
        )
    if kind == "yarn":
        if "original_max_len" not in scaling:
            raise ValueError(
                "scaling['original_max_len']: missing, expected the training length L0 "
                "(YaRN's ramp is measured in rotations over L0)"
            )
        L0 = scaling["original_max_len"]
        if not _is_number(L0) or not L0 > 0:
            raise ValueError(f"scaling['original_max_len']: got {L0!r}, expected a number > 0")
        beta_fast, beta_slow = scaling.get("beta_fast", 32), scaling.get("beta_slow", 1)
        for name, value in (("beta_fast", beta_fast), ("beta_slow", beta_slow)):
            if not _is_number(value) or not value > 0:
                raise ValueError(f"scaling[{name!r}]: got {value!r}, expected a number > 0")
        if not beta_fast > beta_slow:
            raise ValueError(
                f"scaling['beta_fast']: got {beta_fast!r} with beta_slow={beta_slow!r}, "
                "expected beta_fast > beta_slow (more rotations over L0 = a higher frequency)"
            )


def yarn_correction_range(
    head_dim: int, base: float, original_max_len: float, beta_fast: float, beta_slow: float
) -> tuple[int, int]:
    """YaRN's ramp ends ``(low, high)``: pair indices between which a frequency goes from
    kept (``i <= low``) to interpolated (``i >= high``).

    Pair ``i`` turns ``L0 * base^(-2i/d) / (2 pi)`` times over the training length ``L0``;
    solving "``r`` turns" for ``i`` gives ``d ln(L0 / (2 pi r)) / (2 ln base)``. ``low``
    is that for ``r = beta_fast`` rounded down, ``high`` for ``r = beta_slow`` rounded
    up, clamped to ``[0, d - 1]`` (Hugging Face's ``find_correction_range`` with
    ``truncate=True``; Peng et al., 2023, §3.2, "NTK-by-parts").
    """

    def index(turns: float) -> float:
        return head_dim * math.log(original_max_len / (turns * 2 * math.pi)) / (2 * math.log(base))

    low = math.floor(index(beta_fast))
    high = math.ceil(index(beta_slow))
    return max(low, 0), min(high, head_dim - 1)


def rope_frequencies(
    head_dim: int, base: float = 10000.0, scaling: dict | None = None
) -> tuple[torch.Tensor, float]:
    """RoPE's frequencies, scaled to read contexts longer than training (chapter 19).

    Unscaled, pair ``i`` of a ``head_dim = d`` head turns at ``theta_i = base^(-2i/d)``
    radians per position (:func:`apply_rope`). ``scaling`` is None or a dict with
    ``"type"`` and ``"factor"`` ``s > 1`` (the new context is ``s`` times the training
    length ``L0``):

    - ``"linear"``: position interpolation (Chen et al., 2023, "Extending Context
      Window of Large Language Models via Positional Interpolation", arXiv:2306.15595):
      ``theta_i / s`` for every ``i``, i.e. position ``p`` rotates as ``p / s`` did.
      Attention factor 1. (= Hugging Face's ``_compute_linear_scaling_rope_parameters``.)
    - ``"ntk"``: "NTK-aware" scaling (bloc97, 2023, a Reddit post in r/LocalLLaMA): a
      larger base ``base * s^(d/(d-2))``, so the highest frequency (``i = 0``) is kept
      and the lowest (``i = d/2 - 1``) is divided by exactly ``s``; the ones between by
      ``s^(2i/(d-2))``. Attention factor 1. (Hugging Face has only the *dynamic* form,
      ``_compute_dynamic_ntk_parameters``, whose base at sequence length ``n`` is
      ``base * (f n / L0 - (f - 1))^(d/(d-2))``: with ``f = 1`` and ``n = s L0`` that
      is this static one exactly.)
    - ``"yarn"``: YaRN (Peng et al., 2023, "YaRN: Efficient Context Window Extension of
      Large Language Models", arXiv:2309.00071, §3.2-3.4): needs ``"original_max_len"``
      (``L0``); optional ``"beta_fast"`` (32) and ``"beta_slow"`` (1). A frequency that
      turns more than ``beta_fast`` times over ``L0`` is kept, one that turns fewer than
      ``beta_slow`` times is interpolated (``/ s``), and a linear ramp over the pair
      index blends the two between them (:func:`yarn_correction_range`: ``low`` rounded
      down, ``high`` up): ``theta_i ((1 - r_i) + r_i / s)`` with
      ``r_i = clamp((i - low) / (high - low), 0, 1)``. Attention factor
      ``0.1 ln s + 1``, which :func:`apply_rope` multiplies into cos and sin (the
      paper's "temperature": every score times its square). (= Hugging Face's
      ``_compute_yarn_parameters`` with ``truncate=True`` and no ``mscale``.)

    An unknown ``"type"`` or key, a ``"factor"`` that is not > 1, a yarn dict without
    ``"original_max_len"``: ValueError naming it.

    Shapes: returns ``inv_freq`` float64 ``(head_dim / 2,)`` (radians per position) and
    the attention factor (a Python float).
    """
    check_positive_int("head_dim", head_dim)
    if head_dim % 2 != 0:
        raise ValueError(f"head_dim: got {head_dim}, expected an even number (features pair up)")
    _check_base(base)
    if scaling is not None:
        _check_scaling(scaling)
    i = torch.arange(head_dim // 2, dtype=torch.float64)  # (d/2,)
    if scaling is None:
        return base ** (-2 * i / head_dim), 1.0
    s = float(scaling["factor"])
    kind = scaling["type"]
    if kind == "linear":
        return base ** (-2 * i / head_dim) / s, 1.0
    if kind == "ntk":
        if head_dim <= 2:
            raise ValueError(f"head_dim: got {head_dim}, expected > 2 for 'ntk' (d / (d - 2))")
        new_base = base * s ** (head_dim / (head_dim - 2))
        return new_base ** (-2 * i / head_dim), 1.0
    inv_freq = base ** (-2 * i / head_dim)  # (d/2,): the trained frequencies
    low, high = yarn_correction_range(
        head_dim,
        base,
        scaling["original_max_len"],
        scaling.get("beta_fast", 32),
        scaling.get("beta_slow", 1),
    )
    if low == high:
        high += 0.001  # as Hugging Face: no division by zero
    ramp = ((i - low) / (high - low)).clamp(0, 1)  # (d/2,): 0 = keep, 1 = interpolate
    scaled = inv_freq * (1 - ramp) + (inv_freq / s) * ramp
    return scaled, _attention_factor(scaling)


def _attention_factor(scaling: dict) -> float:
    """YaRN's ``0.1 ln s + 1`` (Peng et al., 2023, §3.4: ``sqrt(1/t)``); 1 for the others."""
    return 0.1 * math.log(float(scaling["factor"])) + 1.0 if scaling["type"] == "yarn" else 1.0


def _power_of_two_slopes(n: int) -> list[float]:
    return [2.0 ** (-8.0 * (h + 1) / n) for h in range(n)]


def alibi_slopes(num_heads: int) -> torch.Tensor:
    """ALiBi's per-head slopes: a geometric sequence ``2^(-8/H), 2^(-16/H), .., 2^(-8)``.

    For ``H`` a power of 2, ``slope_h = 2^(-8 (h + 1) / H)`` (8 heads: 1/2, 1/4, ..,
    1/256). Otherwise the paper's rule (Press et al., 2022, and their code): with
    ``n = 2^floor(log2 H)``, the ``n`` slopes for ``n`` heads, then the first
    ``H - n`` of the slopes for ``2n`` heads taken at even indices (0, 2, 4, ..):
    ``2^(-4/n), 2^(-12/n), ..``, appended after the first ``n``. The result is not sorted:
    for ``H = 6`` head 4 gets 0.5, larger than head 0's 0.25.

    Hugging Face counterpart: ``build_alibi_tensor``'s slopes in
    ``transformers.models.bloom.modeling_bloom``.

    Shapes: returns float32 ``(H,)``.
    """
    check_positive_int("num_heads", num_heads)
    n = 2 ** int(math.floor(math.log2(num_heads)))
    slopes = _power_of_two_slopes(n)
    if n < num_heads:
        slopes += _power_of_two_slopes(2 * n)[0::2][: num_heads - n]
    return torch.tensor(slopes, dtype=torch.float32)


def alibi_bias(
    num_heads: int, T: int, S: int | None = None, device=None, dtype=torch.float32
) -> torch.Tensor:
    """ALiBi's additive score bias: ``-slope_h * (distance from query to key)``.

    The ``T`` queries are the *last* ``T`` of ``S`` positions (with a KV cache, the
    new tokens after ``S - T`` cached ones): query ``i`` sits at absolute position
    ``i + S - T``, and ``bias[h, i, j] = -slope_h * ((i + S - T) - j)`` for every key
    ``j <= i + S - T``. Entries above that diagonal are 0 here; the causal mask
    removes them.

    Hugging Face counterpart: ``build_alibi_tensor`` (BLOOM) adds ``slope_h * j``
    instead, which differs per row by a constant and so gives the same softmax.

    Shapes: returns ``(H, T, S)`` in ``dtype``; ``S`` defaults to ``T``.
    """
    S = T if S is None else S
    check_positive_int("num_heads", num_heads)
    check_positive_int("T", T)
    check_positive_int("S", S)
    if S < T:
        raise ValueError(f"S: got {S}, expected at least T={T} (the queries are among the keys)")
    slopes = alibi_slopes(num_heads).to(device=device, dtype=dtype)  # (H,)
    query_pos = torch.arange(S - T, S, device=device)  # (T,): absolute positions
    key_pos = torch.arange(S, device=device)  # (S,)
    # j - i <= 0 for keys at or before the query; clamped to 0 after it (future keys)
    offset = (key_pos[None, :] - query_pos[:, None]).clamp(max=0)  # (1, S) - (T, 1) -> (T, S)
    return slopes[:, None, None] * offset.to(dtype)  # (H, 1, 1) * (T, S) -> (H, T, S)


def alibi_causal_mask(num_heads: int, T: int, S: int, device, dtype, need_weights: bool, keep=None):
    """ALiBi's bias with the causal mask in it, as one additive float mask ``(H, T, S)``
    (``-inf`` above the diagonal, or wherever ``keep`` (a bool ``(T, S)`` mask, e.g. a
    sliding window) is False): a float tensor for the weights path, a
    :class:`~attention_course.fused.FusedMask` for the fused kernel."""
    bias = alibi_bias(num_heads, T, S, device=device, dtype=dtype)  # (H, T, S)
    if keep is None:
        keep = causal_mask(T, device, S=S)  # (T, S) bool, True = may attend
    mask = bias.masked_fill(~keep, float("-inf"))  # (H, T, S)
    return mask if need_weights else prepare_fused_mask(mask, dtype)


def _check_base(base: object) -> None:
    if not isinstance(base, (int, float)) or isinstance(base, bool) or not base > 0:
        raise ValueError(f"base: got {base!r}, expected a positive number")


class RotaryPositions:
    """RoPE as the piece an attention module is given: it rotates the queries and keys.

    ``rotate(q, k, start)`` rotates ``q (B, H, T, Dh)`` and ``k (B, Hkv, T, Dh)`` at the
    absolute positions ``start .. start + T - 1`` (after ``start`` cached positions, whose
    keys were stored already rotated). By default that is :func:`apply_rope`'s half-split
    rotation with ``base``; two ways to vary it, each an argument:

    - ``rotate``: a function ``(x, positions) -> x`` used instead of the half-split
      rotation on the queries and on the keys, e.g. the interleaved layout (RoFormer,
      GPT-J) or a deliberately wrong rotation (chapter 14).
    - ``scaling``: a RoPE scaling dict as :func:`rope_frequencies` takes it (chapter 19:
      ``{"type": "linear" | "ntk" | "yarn", "factor": s, ...}``): the frequencies are
      ``rope_frequencies(Dh, base, scaling)``'s and cos and sin are multiplied by its
      attention factor, as :func:`apply_rope` with ``scaling``. Or a function of the
      frequencies, ``inv_freq (Dh/2,) -> (Dh/2,)``, applied before the angles are taken;
      e.g. ``lambda f: f / 4`` is linear position interpolation (Chen et al., 2023,
      "Extending Context Window of Large Language Models via Positional
      Interpolation"): position ``p`` rotates as ``p / 4`` did.

    ``score_mask`` returns ``visible`` as it is: RoPE adds nothing to the scores
    (``on_scores`` False).
    """

    name = "rope"
    on_scores = False

    def __init__(
        self,
        base: float = 10000.0,
        rotate: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
        scaling: dict | Callable[[torch.Tensor], torch.Tensor] | None = None,
    ) -> None:
        _check_base(base)
        if rotate is not None and not callable(rotate):
            raise ValueError(f"rotate: got {rotate!r}, expected a function or None")
        if isinstance(scaling, dict):
            _check_scaling(scaling)
            scaling = dict(scaling)  # a copy: the caller's dict may change later
        elif scaling is not None and not callable(scaling):
            raise ValueError(
                f"scaling: got {scaling!r}, expected None, a scaling dict (see "
                "rope_frequencies) or a function of the frequencies"
            )
        if rotate is not None and scaling is not None:
            raise ValueError(
                "scaling: given with rotate, expected one of them (scaling changes the "
                "frequencies of the built-in rotation; a custom rotate has its own)"
            )
        self.base = base
        self.rotate_fn = rotate
        self.scaling = scaling

    @property
    def attention_factor(self) -> float:
        """What cos and sin are multiplied by: YaRN's ``0.1 ln s + 1``, else 1."""
        return _attention_factor(self.scaling) if isinstance(self.scaling, dict) else 1.0

    def frequencies(self, Dh: int, like: torch.Tensor) -> torch.Tensor:
        """The ``Dh / 2`` rotation frequencies ``base^(-2i/Dh)`` (then ``scaling``), in
        float32 (float64 for a float64 ``like``) on ``like``'s device."""
        if isinstance(self.scaling, dict):
            inv_freq, _ = rope_frequencies(Dh, self.base, self.scaling)
            return inv_freq.to(like.device, _work_dtype(like))
        inv_freq = _rope_frequencies(Dh, self.base, like)
        return inv_freq if self.scaling is None else self.scaling(inv_freq)

    def rotate(self, q: torch.Tensor, k: torch.Tensor, start: int = 0):
        """``q`` and ``k`` rotated at positions ``start .. start + T - 1``: same shapes."""
        T = q.shape[-2]
        positions = torch.arange(start, start + T, device=q.device)  # (T,)
        if self.rotate_fn is not None:
            return self.rotate_fn(q, positions), self.rotate_fn(k, positions)
        inv_freq = self.frequencies(q.shape[-1], q)
        factor = self.attention_factor
        return _rotate(q, positions, inv_freq, factor), _rotate(k, positions, inv_freq, factor)

    def score_mask(self, T: int, S: int, visible, device=None, dtype=torch.float32):
        return visible

    def __repr__(self) -> str:
        parts = [f"base={self.base}"]
        if self.rotate_fn is not None:
            parts.append(f"rotate={getattr(self.rotate_fn, '__qualname__', self.rotate_fn)}")
        if isinstance(self.scaling, dict):
            parts.append(f"scaling={self.scaling!r}")
        elif self.scaling is not None:
            parts.append(f"scaling={getattr(self.scaling, '__qualname__', self.scaling)}")
        return f"RotaryPositions({', '.join(parts)})"


class ALiBiPositions:
    """ALiBi as the piece an attention module is given: a bias on the scores.

    ``rotate`` leaves the queries and keys as they are; ``score_mask(T, S, visible)`` is
    the model's one mask with the bias in it: :func:`alibi_causal_mask` for ``num_heads``
    heads, ``(H, T, S)`` (:func:`alibi_bias`, ``-inf`` where ``visible`` hides a key).
    """

    name = "alibi"
    on_scores = True

    def __init__(self, num_heads: int) -> None:
        check_positive_int("num_heads", num_heads)
        self.num_heads = num_heads

    def rotate(self, q: torch.Tensor, k: torch.Tensor, start: int = 0):
        return q, k

    def score_mask(self, T: int, S: int, visible, device=None, dtype=torch.float32):
        # (H, T, S): the bias, -inf where a key is not visible
        return alibi_causal_mask(self.num_heads, T, S, device, dtype, True, keep=visible)

    def __repr__(self) -> str:
        return f"ALiBiPositions(num_heads={self.num_heads})"


def attention_positions(
    pos: str | None,
    num_heads: int,
    rope_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
    rope_scaling: dict | None = None,
):
    """The position piece for an attention module from its name: ``"rope"`` (with
    ``rope_fn`` as its rotation, None for :func:`apply_rope`; ``rope_scaling`` a scaling
    dict, see :func:`rope_frequencies`) -> :class:`RotaryPositions`, ``"alibi"`` ->
    :class:`ALiBiPositions`, None (positions outside attention, or none) -> None."""
    if rope_scaling is not None and pos != "rope":
        raise ValueError(
            f"rope_scaling: given with pos={pos!r}, expected pos='rope' (it scales RoPE)"
        )
    if pos == "rope":
        return RotaryPositions(rotate=rope_fn, scaling=rope_scaling)
    if pos == "alibi":
        return ALiBiPositions(num_heads)
    if pos is None:
        return None
    raise ValueError(f"pos: got {pos!r}, expected 'rope', 'alibi' or None")
