"""Buggy rotary embeddings and ALiBi slopes (apply_rope, alibi_slopes; chapter 14)."""

import math

import torch


def _rope(
    x,
    positions=None,
    base=10000.0,
    *,
    exponent=2.0,
    sign=1.0,
    start=0,
    ignore_base=False,
    interleaved=False,
    swap=False,
    halves="right",
    head_axis="any",
    angle_dtype=torch.float64,
):
    T, Dh = x.shape[-2], x.shape[-1]
    if Dh % 2:
        raise ValueError(f"x: Dh={Dh} is odd")
    if positions is None:
        positions = torch.arange(T)
    if ignore_base:
        base = 10000.0
    half = Dh // 2
    if exponent == "integer":  # 2 * i // Dh: every exponent is 0
        i = torch.arange(half)
        inv_freq = base ** (-(2 * i // Dh)).to(angle_dtype)
    elif exponent == "linspace":
        inv_freq = base ** -torch.linspace(0, 1, half, dtype=angle_dtype)
    else:
        i = torch.arange(half, dtype=angle_dtype)
        inv_freq = base ** (-exponent * i / Dh)
    angles = sign * (positions.to(angle_dtype) + start)[..., None] * inv_freq
    if positions.dim() == 2:
        if head_axis == "fixed":  # as if x were always (B, H, T, Dh)
            angles = angles.unsqueeze(1)
        elif head_axis == "row 0":  # every sequence rotated with the first row
            angles = angles[0]
        elif head_axis == "flipped":  # sequence b rotated with another row
            angles = angles.flip(0).view(angles.shape[0], *([1] * (x.dim() - 3)), T, half)
        else:
            angles = angles.view(angles.shape[0], *([1] * (x.dim() - 3)), T, half)
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    if swap:
        cos, sin = sin, cos
    if interleaved:
        x1, x2 = x[..., 0::2], x[..., 1::2]
        return torch.stack([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).flatten(-2)
    x1, x2 = x[..., :half], x[..., half:]
    first, second = x1 * cos - x2 * sin, x2 * cos + x1 * sin
    if halves == "swapped":
        first, second = second, first
    elif halves == "second sign":
        second = x2 * cos - x1 * sin
    return torch.cat([first, second], dim=-1)


def rope_interleaved(x, positions=None, base=10000.0):
    """Pairs adjacent features (2i, 2i + 1), the RoFormer / GPT-J layout."""
    return _rope(x, positions, base, interleaved=True)


def rope_exponent_i(x, positions=None, base=10000.0):
    """Frequencies base^(-i/Dh) instead of base^(-2i/Dh)."""
    return _rope(x, positions, base, exponent=1.0)


def rope_positions_from_one(x, positions=None, base=10000.0):
    """Counts positions from 1: the first token is already rotated."""
    return _rope(x, positions, base, start=1)


def rope_sign_flipped(x, positions=None, base=10000.0):
    """Rotates by -theta: out[i] = x[i] cos + x[i + Dh/2] sin, and so on."""
    return _rope(x, positions, base, sign=-1.0)


def rope_base_ignored(x, positions=None, base=10000.0):
    """Hard-codes 10000 and ignores the base argument."""
    return _rope(x, positions, base, ignore_base=True)


def rope_cos_sin_swapped(x, positions=None, base=10000.0):
    """Uses sin where cos belongs and the other way round."""
    return _rope(x, positions, base, swap=True)


def rope_positions_ignored(x, positions=None, base=10000.0):
    """Always rotates at arange(T), whatever positions it is given."""
    return _rope(x, None, base)


def rope_no_odd_check(x, positions=None, base=10000.0):
    """Right for even Dh, but silently drops the last feature of an odd Dh."""
    if x.shape[-1] % 2:
        x = x[..., :-1]
    return _rope(x, positions, base)


def rope_detached(x, positions=None, base=10000.0):
    """Builds the output from the values (no gradient reaches x)."""
    return _rope(x.detach(), positions, base)


def rope_bt_fixed_head_axis(x, positions=None, base=10000.0):
    """Broadcasts (B, T) positions with ``unsqueeze(1)``, as if x were always (B, H, T, Dh):
    a 3-D x gets a wrong shape, a 5-D x raises."""
    return _rope(x, positions, base, head_axis="fixed")


def rope_bt_first_row(x, positions=None, base=10000.0):
    """Rotates every sequence with row 0 of (B, T) positions."""
    return _rope(x, positions, base, head_axis="row 0")


def rope_bt_rows_flipped(x, positions=None, base=10000.0):
    """Rotates sequence b with row B - 1 - b of (B, T) positions."""
    return _rope(x, positions, base, head_axis="flipped")


def rope_float32_angles(x, positions=None, base=10000.0):
    """Computes the angles in float32: wrong by about 1e-5 at position 1000."""
    return _rope(x, positions, base, angle_dtype=torch.float32)


def rope_halves_swapped(x, positions=None, base=10000.0):
    """Concatenates the two rotated halves in the wrong order."""
    return _rope(x, positions, base, halves="swapped")


def rope_second_half_sign(x, positions=None, base=10000.0):
    """Second half x2 cos - x1 sin: a reflection, not a rotation."""
    return _rope(x, positions, base, halves="second sign")


def rope_integer_division(x, positions=None, base=10000.0):
    """Exponent ``2 * i // Dh`` (integer division): every pair turns at frequency 1."""
    return _rope(x, positions, base, exponent="integer")


def rope_linspace(x, positions=None, base=10000.0):
    """Exponents ``-linspace(0, 1, Dh/2)``: the last frequency is 1/base."""
    return _rope(x, positions, base, exponent="linspace")


def _power_of_two(n):
    return [2.0 ** (-8.0 * (h + 1) / n) for h in range(n)]


def slopes_from_zero(num_heads):
    """slope_h = 2^(-8h/H): the first head's slope is 1."""
    return torch.tensor([2.0 ** (-8.0 * h / num_heads) for h in range(num_heads)])


def slopes_reversed(num_heads):
    """The right slopes, smallest first."""
    n = 2 ** int(math.floor(math.log2(num_heads)))
    slopes = _power_of_two(n) + _power_of_two(2 * n)[0::2][: num_heads - n]
    return torch.tensor(slopes[::-1])


def slopes_ignore_h(num_heads):
    """2^-(h+1) for every H (the 8-head slopes)."""
    return torch.tensor([2.0 ** -(h + 1) for h in range(num_heads)])


def slopes_power_rule_everywhere(num_heads):
    """Uses 2^(-8(h+1)/H) for every H, powers of 2 or not."""
    return torch.tensor(_power_of_two(num_heads))


def slopes_odd_indices(num_heads):
    """Takes the extra slopes of the 2n-head list at odd indices."""
    n = 2 ** int(math.floor(math.log2(num_heads)))
    return torch.tensor(_power_of_two(n) + _power_of_two(2 * n)[1::2][: num_heads - n])


def slopes_next_power(num_heads):
    """The first H slopes of the next power of 2."""
    big = 2 ** math.ceil(math.log2(num_heads))
    return torch.tensor(_power_of_two(big)[:num_heads])


def _right(num_heads):
    n = 2 ** int(math.floor(math.log2(num_heads)))
    return _power_of_two(n) + _power_of_two(2 * n)[0::2][: num_heads - n]


def slopes_h1_special(num_heads):
    """Right, except a special case that returns slope 1 for a single head (it is 2^-8)."""
    if num_heads == 1:
        return torch.tensor([1.0])
    return torch.tensor(_right(num_heads))


def slopes_extras_first(num_heads):
    """Puts the extra 2n-head slopes before the n-head ones."""
    n = 2 ** int(math.floor(math.log2(num_heads)))
    return torch.tensor(_power_of_two(2 * n)[0::2][: num_heads - n] + _power_of_two(n))


def slopes_sorted(num_heads):
    """Sorts the slopes, largest first (the paper's order is not sorted for H = 6)."""
    return torch.tensor(sorted(_right(num_heads), reverse=True))


def slopes_negative(num_heads):
    """Returns -s_h: the minus sign belongs to the bias, not the slope."""
    return -torch.tensor(_right(num_heads))


def slopes_float64(num_heads):
    """Right values, float64 instead of float32."""
    n = 2 ** int(math.floor(math.log2(num_heads)))
    slopes = _power_of_two(n) + _power_of_two(2 * n)[0::2][: num_heads - n]
    return torch.tensor(slopes, dtype=torch.float64)


CATALOGUE = [
    ("apply_rope", "interleaved", rope_interleaved, "interleaved pairs"),
    ("apply_rope", "exponent i/Dh", rope_exponent_i, "the exponent is i/Dh instead of 2i/Dh"),
    ("apply_rope", "positions from 1", rope_positions_from_one, "positions start at 1"),
    ("apply_rope", "sign flipped", rope_sign_flipped, "the rotation's sign is flipped"),
    ("apply_rope", "base ignored", rope_base_ignored, "the base is ignored"),
    ("apply_rope", "cos/sin swapped", rope_cos_sin_swapped, "cos and sin are swapped"),
    (
        "apply_rope",
        "positions ignored",
        rope_positions_ignored,
        "the positions argument is ignored",
    ),
    ("apply_rope", "no odd check", rope_no_odd_check, "returned without raising"),
    ("apply_rope", "(B, T) fixed head axis", rope_bt_fixed_head_axis, "with a fixed head axis"),
    ("apply_rope", "(B, T) row 0 only", rope_bt_first_row, "the positions of row 0"),
    ("apply_rope", "(B, T) rows flipped", rope_bt_rows_flipped, "another row of `positions`"),
    ("apply_rope", "float32 angles", rope_float32_angles, "the angles were computed in float32"),
    ("apply_rope", "halves swapped", rope_halves_swapped, "halves are concatenated in the wrong"),
    ("apply_rope", "second half sign", rope_second_half_sign, "the second half's sign"),
    ("apply_rope", "integer division", rope_integer_division, "`2 * i // Dh` is integer"),
    ("apply_rope", "linspace", rope_linspace, "`torch.linspace(0, 1, Dh // 2)` is not"),
    ("apply_rope", "detached", rope_detached, "does not require grad"),
    ("alibi_slopes", "from zero", slopes_from_zero, "the exponent starts at h = 0"),
    ("alibi_slopes", "reversed", slopes_reversed, "the slopes are in reverse order"),
    ("alibi_slopes", "ignores H", slopes_ignore_h, "the slopes ignore H"),
    (
        "alibi_slopes",
        "power rule everywhere",
        slopes_power_rule_everywhere,
        "you used the power-of-2 formula",
    ),
    ("alibi_slopes", "odd indices", slopes_odd_indices, "taken at odd indices"),
    ("alibi_slopes", "next power of 2", slopes_next_power, "the next power of 2"),
    ("alibi_slopes", "float64", slopes_float64, "expected dtype torch.float32"),
    ("alibi_slopes", "H = 1 special case", slopes_h1_special, "for H = 1 the slope is 2^-8"),
    ("alibi_slopes", "extras first", slopes_extras_first, "the extra slopes come first"),
    ("alibi_slopes", "sorted", slopes_sorted, "the slopes are sorted"),
    ("alibi_slopes", "negative", slopes_negative, "the slopes are negative"),
]


# ---------------------------------------------------------------- issue 24, round 3 (verdicts)
# Kept apart from CATALOGUE above; tests/test_verdicts_round3.py runs ROUND3.


def rope_computed_in_float32(x, positions=None, base=10000.0):
    """Computes everything in float32 inside, `x.float()` ... `.to(x.dtype)`: a float64
    input comes back right to about 1e-7 only (the statement asks for the input's dtype)."""
    return _rope(x.float(), positions, base, angle_dtype=torch.float32).to(x.dtype)


ROUND3 = [
    ("apply_rope", "computed in float32 inside", rope_computed_in_float32, "float32 inside"),
]
