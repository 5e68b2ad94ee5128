"""Exercise checkers: compare a student's implementation with the reference.

Each ``check_<target>(candidate, *, timeout=10.0)`` runs the candidate (a
function, or a class that is built with the contract's arguments and given the
reference's weights) on a fixed grid of random inputs and edge cases, compares
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

**Scoring.** ``report.passed`` is True only when every case passes.
``report.score`` (between 0 and 1) is the *weighted* fraction of cases passed:
an ordinary case weighs 1, a trivial case weighs 0.25 (``TRIVIAL`` in
``_runner.py``). Trivial cases are those that many broken implementations pass
by accident: one head (H = 1), one position (T = 1, S = 1, size 1), a round
trip such as ``merge_heads(split_heads(x))``, a size-1 table, a check of
attribute names. So a ``merge_heads`` that crashes on every multi-head case
scores 0.2, not 0.5. Each result carries its ``weight`` in ``to_dict()``.

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

from ._report import CaseResult, Report
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

CHECKERS = {
    "soft_argmax": check_soft_argmax,
    "set_attention": check_set_attention,
    "scaled_dot_product_attention": check_scaled_dot_product_attention,
    "additive_attention": check_additive_attention,
    "causal_mask": check_causal_mask,
    "padding_mask": check_padding_mask,
    "split_heads": check_split_heads,
    "merge_heads": check_merge_heads,
    "multi_head_attention": check_multi_head_attention,
    "layer_norm": check_layer_norm,
    "batch_norm": check_batch_norm,
    "positionwise_feed_forward": check_positionwise_feed_forward,
    "sinusoidal_positional_encoding": check_sinusoidal_positional_encoding,
    "encoder_layer": check_encoder_layer,
    "decoder_layer": check_decoder_layer,
    # Part V
    "filter_logits": check_filter_logits,
}
"""Every checker by target name, e.g. ``CHECKERS["soft_argmax"]``."""

__all__ = [
    "CHECKERS",
    "CaseResult",
    "Report",
    *(f"check_{name}" for name in CHECKERS),
]
