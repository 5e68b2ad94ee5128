"""The one list of checkers: what ``checks.CHECKERS``, the grader and the tests read."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .alibi import check_alibi_bias  # exercise 14
from .attention import (
    check_additive_attention,
    check_scaled_dot_product_attention,
    check_set_attention,
    check_soft_argmax,
)
from .ffn import check_positionwise_feed_forward
from .generation import check_generate  # exercise 13
from .gpt import check_causal_self_attention
from .interpret import (
    check_ablation_effect,
    check_attention_rollout,
    check_find_induction_head,
    check_induction_scores,
)
from .kv import check_repeat_kv, check_sliding_window_mask
from .latent import (  # exercise 18 (and the contract's module, graded by no exercise yet)
    check_kv_cache_bytes,
    check_mla_absorbed_attention,
    check_multi_head_latent_attention,
)
from .linear import check_gated_delta_rule, check_linear_attention  # exercise 22
from .logit_range import check_qk_norm_attention, check_softcap_attention  # exercise 20
from .long_context import (  # exercise 19
    check_rope_frequencies,
    check_scaled_rope_scores,
    check_sink_attention,
    check_streaming_mask,
)
from .masking import check_causal_mask, check_padding_mask
from .modern import check_rms_norm, check_swiglu  # chapter 16
from .moe import check_load_balancing_loss, check_moe  # exercise 21
from .multihead import check_merge_heads, check_multi_head_attention, check_split_heads
from .norms import check_batch_norm, check_layer_norm
from .positional import check_sinusoidal_positional_encoding
from .relative_positions import check_alibi_slopes, check_apply_rope  # chapter 14
from .ring import check_merge_partials, check_simulated_ring_attention  # exercise 23
from .rolling_cache import check_rolling_update  # exercise 15
from .sampling import check_filter_logits
from .tiled import check_online_softmax_update, check_tiled_attention_loop  # chapter 12
from .transformer import check_decoder_layer, check_encoder_layer


@dataclass(frozen=True)
class Checker:
    """One checker: its target key, the function, and the exercise notebook that uses it."""

    target: str  # the key of ``CHECKERS``, e.g. "additive_attention"
    check: Callable  # ``check_<target>(candidate, *, timeout=...)``
    exercise: str | None  # the exercise notebook that grades it, None where none does yet


# The checkers by the exercise notebook (exercises/NN_name.ipynb) whose tasks use them.
_BY_EXERCISE: dict[str | None, tuple[Callable, ...]] = {
    "01_attention_over_sets": (check_soft_argmax, check_set_attention),
    "03_additive_attention": (check_additive_attention,),
    "04_scaled_dot_product": (check_scaled_dot_product_attention,),
    "05_masking": (check_causal_mask, check_padding_mask),
    "06_multi_head_attention": (check_split_heads, check_merge_heads, check_multi_head_attention),
    "07_layernorm_batchnorm": (check_layer_norm, check_batch_norm),
    "08_feed_forward": (check_positionwise_feed_forward,),
    "09_positional_encoding": (check_sinusoidal_positional_encoding,),
    "10_transformer": (check_encoder_layer, check_decoder_layer),
    "12_efficient_attention": (check_online_softmax_update, check_tiled_attention_loop),
    "13_decoder_only": (check_filter_logits, check_causal_self_attention, check_generate),
    "14_positions_that_generalise": (check_apply_rope, check_alibi_slopes, check_alibi_bias),
    "15_sharing_keys_values": (check_repeat_kv, check_sliding_window_mask, check_rolling_update),
    "16_the_modern_block": (check_rms_norm, check_swiglu),  # chapter 16
    "17_induction_heads": (
        check_attention_rollout,
        check_induction_scores,
        check_find_induction_head,
        check_ablation_effect,
    ),
    "18_latent_attention": (check_mla_absorbed_attention, check_kv_cache_bytes),
    # the contract's MultiHeadLatentAttention class: no exercise asks for the whole module
    None: (check_multi_head_latent_attention,),
    "19_longer_than_trained": (
        check_rope_frequencies,
        check_scaled_rope_scores,
        check_streaming_mask,
        check_sink_attention,
    ),
    "20_logits_in_range": (check_qk_norm_attention, check_softcap_attention),
    "21_mixture_of_experts": (check_moe, check_load_balancing_loss),
    "22_linear_attention": (check_linear_attention, check_gated_delta_rule),
    "23_ring_attention": (check_merge_partials, check_simulated_ring_attention),
}

REGISTRY: tuple[Checker, ...] = tuple(
    Checker(check.__name__.removeprefix("check_"), check, exercise)
    for exercise, checks in _BY_EXERCISE.items()
    for check in checks
)

CHECKERS: dict[str, Callable] = {c.target: c.check for c in REGISTRY}
"""Every checker by target name, e.g. ``CHECKERS["soft_argmax"]``."""
