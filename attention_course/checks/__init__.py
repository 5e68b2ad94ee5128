"""Exercise checkers: compare a student's implementation with the reference.

Each ``check_<target>(candidate, *, timeout=10.0, seed=0)`` runs the candidate (a
function, or a class that is built with the contract's arguments and given the
reference's weights) on a grid of random inputs and edge cases, compares
it with the reference in :mod:`attention_course`, and returns a
:class:`Report`: ``print(report)`` shows a ✓/✗ list, Jupyter shows a table,
``report.passed`` / ``report.score`` / ``report.to_dict()`` serve a grader.

A checker never raises because of the candidate: exceptions, wrong types,
wrong shapes or dtypes, NaN, in-place changes of the inputs and time-outs all
become failed cases whose messages say what was expected, what came back and,
where the output matches a known mistake, which mistake it is::

    from attention_course.checks import check_soft_argmax
    report = check_soft_argmax(my_soft_argmax)
    report            # the table in Jupyter
    report.assert_passed()

**Inputs.** The random inputs are drawn from the run seed ``seed``
(:mod:`attention_course.checks._data`): 0, the check cells' default, gives the same
inputs on every run; the grader draws a fresh seed for each grading run and records it
with each result, so outputs recorded for the check cell's inputs do not pass there.
Inputs written out by hand are the same for every seed, and so is every verdict.

**Scoring.** ``report.passed`` is True only when every case passes.
``report.score`` (between 0 and 1) is the *weighted* fraction of cases passed:
an ordinary case weighs 1, a trivial case weighs 0.25 (``TRIVIAL`` in
``_runner.py``). Trivial cases are those that many broken implementations pass
by accident: one head (H = 1), one position (T = 1, S = 1, size 1), a round
trip such as ``merge_heads(split_heads(x))``, a size-1 table, a check of
attribute names. So a ``merge_heads`` that crashes on every multi-head case
scores 0.2, not 0.5. Each result carries its ``weight`` in ``to_dict()``.
A *support* case (``Case(..., support=True)``), one that an answer doing no real work
passes (a constant, the input unchanged, the answer transposed, a mask off by one, a
device, an argument check), counts only when some other case passed: otherwise its
weight is 0 and so is the score.

**Coverage.** Every argument and mode of a target's contract is exercised by
at least one case: each parameter with a default, training and eval mode,
dropout > 0 in training (checked by its properties: dropped entries are
exactly 0, kept ones scaled by 1 / (1 - p), about a fraction p dropped), each
option value (``activation``, ``norm_first``, ...) and, for the Transformer
layers, masks, dropout and ``return_attention`` crossed with both values of
``norm_first``; odd and even widths; lists where a statement allows them;
``device`` on the ``meta`` device; gradient flow. Each case declares what it
covers (``Case.covers``; ``report.covered`` collects them) and
``tests/test_checker_coverage.py`` fails when an item is not covered and not
listed there as a deliberate exemption with its reason.
"""

from ._registry import (
    CHECKERS,
    REGISTRY,
    Checker,
    check_ablation_effect,
    check_additive_attention,
    check_alibi_bias,
    check_alibi_slopes,
    check_apply_rope,
    check_attention_rollout,
    check_batch_norm,
    check_causal_mask,
    check_causal_self_attention,
    check_decoder_layer,
    check_encoder_layer,
    check_filter_logits,
    check_find_induction_head,
    check_gated_delta_rule,
    check_generate,
    check_induction_scores,
    check_kv_cache_bytes,
    check_layer_norm,
    check_linear_attention,
    check_load_balancing_loss,
    check_merge_heads,
    check_merge_partials,
    check_mla_absorbed_attention,
    check_moe,
    check_multi_head_attention,
    check_multi_head_latent_attention,
    check_online_softmax_update,
    check_padding_mask,
    check_positionwise_feed_forward,
    check_qk_norm_attention,
    check_repeat_kv,
    check_rms_norm,
    check_rolling_update,
    check_rope_frequencies,
    check_scaled_dot_product_attention,
    check_scaled_rope_scores,
    check_set_attention,
    check_simulated_ring_attention,
    check_sink_attention,
    check_sinusoidal_positional_encoding,
    check_sliding_window_mask,
    check_soft_argmax,
    check_softcap_attention,
    check_split_heads,
    check_streaming_mask,
    check_swiglu,
    check_tiled_attention_loop,
)
from ._report import CaseResult, Report

# ``tests/test_mistakes.py`` checks that these names are exactly the registry's checkers.
__all__ = [
    "CHECKERS",
    "REGISTRY",
    "CaseResult",
    "Checker",
    "Report",
    "check_ablation_effect",
    "check_additive_attention",
    "check_alibi_bias",
    "check_alibi_slopes",
    "check_apply_rope",
    "check_attention_rollout",
    "check_batch_norm",
    "check_causal_mask",
    "check_causal_self_attention",
    "check_decoder_layer",
    "check_encoder_layer",
    "check_filter_logits",
    "check_find_induction_head",
    "check_gated_delta_rule",
    "check_generate",
    "check_induction_scores",
    "check_kv_cache_bytes",
    "check_layer_norm",
    "check_linear_attention",
    "check_load_balancing_loss",
    "check_merge_heads",
    "check_merge_partials",
    "check_mla_absorbed_attention",
    "check_moe",
    "check_multi_head_attention",
    "check_multi_head_latent_attention",
    "check_online_softmax_update",
    "check_padding_mask",
    "check_positionwise_feed_forward",
    "check_qk_norm_attention",
    "check_repeat_kv",
    "check_rms_norm",
    "check_rolling_update",
    "check_rope_frequencies",
    "check_scaled_dot_product_attention",
    "check_scaled_rope_scores",
    "check_set_attention",
    "check_simulated_ring_attention",
    "check_sink_attention",
    "check_sinusoidal_positional_encoding",
    "check_sliding_window_mask",
    "check_soft_argmax",
    "check_softcap_attention",
    "check_split_heads",
    "check_streaming_mask",
    "check_swiglu",
    "check_tiled_attention_loop",
]
