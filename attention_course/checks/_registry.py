"""The one list of checkers: what ``checks.CHECKERS``, the grader and the tests read."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .attention import (
    check_additive_attention,
    check_scaled_dot_product_attention,
    check_set_attention,
    check_soft_argmax,
)
from .ffn import check_positionwise_feed_forward
from .masking import check_causal_mask, check_padding_mask
from .multihead import check_merge_heads, check_multi_head_attention, check_split_heads
from .norms import check_batch_norm, check_layer_norm
from .positional import check_sinusoidal_positional_encoding
from .sampling import check_filter_logits
from .transformer import check_decoder_layer, check_encoder_layer


@dataclass(frozen=True)
class Checker:
    """One checker: its target key, the function, and what the student defines."""

    target: str  # the key of ``CHECKERS``, e.g. "additive_attention"
    check: Callable  # ``check_<target>(candidate, *, timeout=...)``
    name: str  # the contract name a student's notebook defines, e.g. "AdditiveAttention"
    exercise: str | None  # the exercise notebook that grades it, None where none does yet


REGISTRY: tuple[Checker, ...] = (
    Checker("soft_argmax", check_soft_argmax, "soft_argmax", "01_attention_over_sets"),
    Checker("set_attention", check_set_attention, "set_attention", "01_attention_over_sets"),
    Checker(
        "scaled_dot_product_attention",
        check_scaled_dot_product_attention,
        "scaled_dot_product_attention",
        "04_scaled_dot_product",
    ),
    Checker(
        "additive_attention", check_additive_attention, "AdditiveAttention", "03_additive_attention"
    ),
    Checker("causal_mask", check_causal_mask, "causal_mask", "05_masking"),
    Checker("padding_mask", check_padding_mask, "padding_mask", "05_masking"),
    Checker("split_heads", check_split_heads, "split_heads", "06_multi_head_attention"),
    Checker("merge_heads", check_merge_heads, "merge_heads", "06_multi_head_attention"),
    Checker(
        "multi_head_attention",
        check_multi_head_attention,
        "MultiHeadAttention",
        "06_multi_head_attention",
    ),
    Checker("layer_norm", check_layer_norm, "LayerNorm", "07_layernorm_batchnorm"),
    Checker("batch_norm", check_batch_norm, "BatchNorm1d", "07_layernorm_batchnorm"),
    Checker(
        "positionwise_feed_forward",
        check_positionwise_feed_forward,
        "PositionwiseFeedForward",
        "08_feed_forward",
    ),
    Checker(
        "sinusoidal_positional_encoding",
        check_sinusoidal_positional_encoding,
        "sinusoidal_positional_encoding",
        "09_positional_encoding",
    ),
    Checker("encoder_layer", check_encoder_layer, "EncoderLayer", "10_transformer"),
    Checker("decoder_layer", check_decoder_layer, "DecoderLayer", "10_transformer"),
    # Part V
    Checker("filter_logits", check_filter_logits, "filter_logits", None),
)

CHECKERS: dict[str, Callable] = {c.target: c.check for c in REGISTRY}
"""Every checker by target name, e.g. ``CHECKERS["soft_argmax"]``."""
