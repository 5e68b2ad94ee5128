"""A catalogue of realistic buggy implementations, one small piece of code per mistake.

Each entry is ``(target, name, implementation, expected)``: the checker
``check_<target>`` must reject ``implementation``; ``expected`` is the mistake its report
must name: an id of ``attention_course.checks._mistakes.MISTAKES`` (the report's
``mistakes``), or, for a checker not yet on that table, a phrase of its text; None where
the report names nothing in particular. Every implementation's docstring says what is
wrong with it.
"""

import attention_course as ac
from attention_course.checks._mistakes import MISTAKES

from . import (
    alibi,
    attention,
    ffn_positional,
    generation,
    gpt,
    interpret,
    kv,
    latent,
    linear,
    logit_range,
    long_context,
    masking,
    modern,
    moe,
    multihead,
    norms,
    relative_positions,
    ring,
    rolling_cache,
    sampling,
    tiled,
    transformer,
)

# The reference implementation of every checker's target: the checker must accept it.
REFERENCES = {
    "soft_argmax": ac.soft_argmax,
    "set_attention": ac.set_attention,
    "scaled_dot_product_attention": ac.scaled_dot_product_attention,
    "additive_attention": ac.AdditiveAttention,
    "causal_mask": ac.causal_mask,
    "padding_mask": ac.padding_mask,
    "split_heads": ac.split_heads,
    "merge_heads": ac.merge_heads,
    "multi_head_attention": ac.MultiHeadAttention,
    "layer_norm": ac.LayerNorm,
    "batch_norm": ac.BatchNorm1d,
    "positionwise_feed_forward": ac.PositionwiseFeedForward,
    "sinusoidal_positional_encoding": ac.sinusoidal_positional_encoding,
    "encoder_layer": ac.EncoderLayer,
    "decoder_layer": ac.DecoderLayer,
    # chapter 12
    "online_softmax_update": ac.tiled.online_softmax_update,
    "tiled_attention_loop": ac.tiled.tiled_attention_loop,
    # Part V
    "filter_logits": ac.filter_logits,
    "causal_self_attention": ac.CausalSelfAttention,
    "attention_rollout": ac.attention_rollout,
    # chapter 15
    "repeat_kv": ac.repeat_kv,
    "sliding_window_mask": ac.sliding_window_mask,
    # chapter 16
    "rms_norm": ac.RMSNorm,
    "swiglu": ac.SwiGLU,
    # chapter 14
    "apply_rope": ac.apply_rope,
    "alibi_slopes": ac.alibi_slopes,
    # chapter 17 (H17)
    "induction_scores": ac.induction_scores,
    "find_induction_head": ac.interpret.find_induction_head,
    "ablation_effect": ac.interpret.ablation_effect,
    # exercises 13, 14, 15: targets whose statement asks for a function the package has in
    # another form (a StepDecoder loop, a bias with slopes given, one rolling-buffer write)
    "generate": generation.reference_generate,
    "alibi_bias": alibi.reference_alibi_bias,
    "rolling_update": rolling_cache.reference_rolling_update,
    # exercise 18: the absorbed attention step and the cache of a configuration (the package
    # has them inside MultiHeadLatentAttention and as cache_per_token)
    "mla_absorbed_attention": latent.reference_mla_absorbed_attention,
    "kv_cache_bytes": latent.reference_kv_cache_bytes,
    # the contract's module (no exercise asks for it yet)
    "multi_head_latent_attention": ac.MultiHeadLatentAttention,
    # exercise 19
    "rope_frequencies": ac.rope_frequencies,
    "scaled_rope_scores": long_context.reference_scaled_rope_scores,
    "streaming_mask": ac.streaming_mask,
    "sink_attention": ac.sink_attention,
    # exercise 20: attention steps the package has inside CausalSelfAttention
    "qk_norm_attention": logit_range.qk_norm_reference,
    "softcap_attention": logit_range.softcap_reference,
    # exercise 21
    "moe": ac.MoE,
    "load_balancing_loss": ac.load_balancing_loss,
    # exercise 22
    "linear_attention": ac.linear_attention,
    "gated_delta_rule": ac.gated_delta_rule,
    # exercise 23: the ring simulated on one process (the package's ring runs on processes)
    "merge_partials": ring.reference_merge,
    "simulated_ring_attention": ring.reference_ring,
}

CATALOGUE = [
    *attention.CATALOGUE,
    *masking.CATALOGUE,
    *multihead.CATALOGUE,
    *norms.CATALOGUE,
    *ffn_positional.CATALOGUE,
    *transformer.CATALOGUE,
    *sampling.CATALOGUE,
    *gpt.CATALOGUE,
    *interpret.CATALOGUE,
    *tiled.CATALOGUE,  # chapter 12
    *kv.CATALOGUE,  # chapter 15
    *modern.CATALOGUE,  # chapter 16
    *relative_positions.CATALOGUE,  # chapter 14
    *generation.CATALOGUE,  # exercise 13
    *alibi.CATALOGUE,  # exercise 14
    *rolling_cache.CATALOGUE,  # exercise 15
    *latent.CATALOGUE,  # exercise 18
    *long_context.CATALOGUE,  # exercise 19
    *logit_range.CATALOGUE,  # exercise 20
    *moe.CATALOGUE,  # exercise 21
    *linear.CATALOGUE,  # exercise 22
    *ring.CATALOGUE,  # exercise 23
]


def names(report, expected) -> bool:
    """Whether ``report`` names the ``expected`` mistake of a catalogue entry: its id among
    the report's mistake ids, or (a checker not yet on the mistake table) its phrase in
    the report's text; True for None."""
    if expected is None:
        return True
    if expected in MISTAKES:
        return expected in report.mistakes
    return expected in str(report)
