"""The coverage rule: every argument and mode of a target's contract is exercised by at
least one case of its checker.

Each `Case` of a checker names, in ``covers``, the arguments and modes it sets away from
their defaults; a report collects them in ``report.covered``. The required items of a
target are derived from the reference's signature (every parameter with a default, of
the function, or of the class's ``__init__`` and ``forward``) plus the modes listed in
`REQUIRED_MODES` below (training vs eval, dropout > 0 in training, every mask kind the
statement allows, odd and even sizes, options crossed with ``norm_first``, list inputs,
the meta device, gradient flow). What a checker deliberately does not test is listed in
`EXEMPT` with the reason, and the exercise statement says so.

An exempt item is one the checker does not exercise: a checker that comes to exercise it
makes its exemption stale, and the test says so. ``python tests/test_checker_coverage.py``
prints the table of what each checker exercises and what it is exempt from.
"""

from __future__ import annotations

import inspect
import os
import sys

import pytest
import torch

from attention_course.checks import CHECKERS

sys.path.insert(0, os.path.dirname(__file__))
from buggy import REFERENCES  # noqa: E402

_GRAD = {"grad"}
_TRAIN_EVAL_DROPOUT = {"mode=train", "mode=eval", "dropout>0 in training"}


def _crossed_with_norm_first(*options: str) -> set[str]:
    """Each option exercised with both values of norm_first (a mistake often lives in one
    branch)."""
    return {f"norm_first={value} x {option}" for value in (True, False) for option in options}


REQUIRED_MODES: dict[str, set[str]] = {
    "soft_argmax": _GRAD,
    "set_attention": _GRAD,
    "scaled_dot_product_attention": _GRAD
    | {"mask=bool", "mask=float", "mask=float-bias", "mask=fully-masked-row", "scale=0"},
    "additive_attention": _GRAD
    | {"mask=(B, S)", "mask=(B, 1, S)", "mask=(B, T, S)", "mask=fully-masked-row"},
    "causal_mask": {"device=meta"},
    "padding_mask": {"lengths=list", "device=meta"},
    "split_heads": _GRAD,
    "merge_heads": _GRAD,
    "multi_head_attention": _GRAD
    | _TRAIN_EVAL_DROPOUT
    | {"mask=bool", "mask=float", "mask=float-bias", "mask=fully-masked-row"},
    "layer_norm": _GRAD | {"normalized_shape=tuple", "normalized_shape=list"},
    "batch_norm": _GRAD | {"mode=train", "mode=eval", "input=(B, C, L)"},
    "positionwise_feed_forward": _GRAD | _TRAIN_EVAL_DROPOUT,
    "sinusoidal_positional_encoding": {"odd", "even"},
    "encoder_layer": _GRAD
    | _TRAIN_EVAL_DROPOUT
    | _crossed_with_norm_first("mask", "dropout", "return_attention", "grad"),
    "decoder_layer": _GRAD
    | _TRAIN_EVAL_DROPOUT
    | _crossed_with_norm_first("tgt_mask", "memory_mask", "dropout", "return_attention", "grad"),
    # chapter 12
    "online_softmax_update": {
        "maximum grows",
        "maximum stays",
        "fully masked block",
        "large scores",
        "batch",
        "dtype=float32",
        "Sb=1",
        "chained",
    },
    "tiled_attention_loop": {
        "odd blocks",
        "T!=S",
        "one tile",
        "block=1",
        "causal T!=S",
        "very negative scores",
        "large scores",
        "dtype=float32",
        "never T x S",
    },
    # Part V
    "filter_logits": {
        "top_k+top_p",
        "ties at the k-th value",
        "top_p crossing",
        "top_p reached exactly",
        "top_k>=V",
        "top_p=1",
        "shape=(B, T, V)",
        "dtype=float32",
        "dtype=float64",
        "bad top_k",
        "bad top_p",
    },
    "causal_self_attention": _GRAD
    | _TRAIN_EVAL_DROPOUT
    | {"causality", "T=1", "odd T", "H=1", "B>1"},
    # No "grad": rollout is a measurement read off the weights (chapter 17 computes it
    # under no_grad), and exercise 17 allows no_grad or numpy inside.
    "attention_rollout": {
        "L=1",
        "L>1",
        "H differs between layers",
        "causal",
        "B>1",
        "T=1",
        "dtype=float32",
    },
    # chapter 15
    "repeat_kv": _GRAD
    | {"Hkv=1", "Hkv>1", "n_rep=1", "n_rep=1 x grad", "S=1", "B>1", "dtype=float32"},
    "sliding_window_mask": {"device=meta", "window=1", "window>=size", "bad window"},
    # chapter 16
    "rms_norm": _GRAD
    | {
        "normalized_shape=tuple",
        "normalized_shape=list",
        "eps=None",
        "eps=0",
        "odd D",
        "tiny input",
        "dtype=float32",
        "dtype=float64",
    },
    "swiglu": _GRAD | {"odd sizes"},
    # chapter 14
    "apply_rope": _GRAD
    | {"positions=(B, T)", "odd Dh", "Dh=2", "T=1", "dtype=float32", "dtype=float64"},
    "alibi_slopes": {"power of 2", "not a power of 2", "H=1"},
    "alibi_bias": {"S>T", "H=T", "T=1", "H=1", "dtype=float32"},
    # exercise 13: greedy and seeded sampling, a batch, a one-token prompt
    "generate": {"sampling", "B>1", "T0=1"},
    # exercise 15: the rolling buffer's write
    "rolling_update": {
        "wrap",
        "one token",
        "chunk > W",
        "chunk crosses the wrap",
        "W=1",
        "B>1",
        "dtype=float32",
    },
    # chapter 17 (H17)
    "induction_scores": {
        "perfect",
        "uniform",
        "random",
        "B>1",
        "odd T",
        "dtype=float32",
        "period=1",
    },
    "find_induction_head": {
        "trained",
        "permuted",
        "period",
        "best head not in the last layer",
        "best head not in the best-mean layer",
        "H != 4",
    },
    "ablation_effect": {"induction head", "previous-token head", "permuted", "negative change"},
    # exercise 18: the absorbed attention step, the cache of a configuration
    "mla_absorbed_attention": {
        "S=T",
        "S!=T",
        "T=1",
        "H=1",
        "B>1",
        "B=H",
        "d_v!=d_nope",
        "kv_rank=d_nope=d_v",
        "dtype=float32",
    },
    "kv_cache_bytes": {"tokens=1"},
    "multi_head_latent_attention": _GRAD | {"H=1", "T=1", "dtype=float32", "odd d_rope"},
    # exercise 19: RoPE scaling and attention sinks
    "rope_frequencies": {
        "scaling=linear",
        "scaling=ntk",
        "scaling=yarn",
        "betas",
        "factor close to 1",
    },
    "scaled_rope_scores": {
        "scaling=None",
        "scaling=linear",
        "scaling=ntk",
        "scaling=yarn",
        "S!=T",
        "T=1",
        "B>1",
        "dtype=float32",
    },
    "streaming_mask": {"num_sink=0", "num_sink>window", "window>=size", "size=1", "device=meta"},
    "sink_attention": _GRAD
    | {
        "mask=bool",
        "mask=float",
        "mask=fully-masked-row",
        "large scores",
        "T=H",
        "H=1",
        "T=1",
        "B>1",
        "S!=T",
        "Dk!=Dv",
        "dtype=float32",
    },
    # exercise 20
    "qk_norm_attention": _GRAD | {"H=1", "H>1", "B=1", "B>1", "T=1", "dtype=float32"},
    "softcap_attention": _GRAD
    | {"H=1", "H>1", "B=1", "B>1", "T=1", "dtype=float32", "large scores"},
    # exercise 21
    "moe": _GRAD
    | {"mode=train", "mode=eval", "top_k=1", "top_k=E", "T=1", "B=1", "B=T=1", "dtype=float32"},
    "load_balancing_loss": _GRAD | {"top_k=1", "top_k=E", "N=1", "skewed", "dtype=float32"},
    # exercise 22
    "linear_attention": _GRAD
    | {
        "S!=T",
        "Dk!=Dv",
        "T=1",
        "leading dims",
        "no leading dims",
        "dtype=float32",
        "causal S!=T raises",
    },
    "gated_delta_rule": _GRAD
    | {"B=1", "B>1", "H=1", "H>1", "T=1", "Dk!=Dv", "g!=0", "beta!=1", "g=0", "beta=1"}
    | {"dtype=float32"},
    # exercise 23
    "merge_partials": _GRAD
    | {"empty rows", "large scores", "no batch axes", "start state", "dtype=float32"},
    "simulated_ring_attention": _GRAD
    | {
        "causal",
        "W=1",
        "W=2",
        "W=3",
        "W=4",
        "Dk!=Dv",
        "one tile",
        "dtype=float32",
        "no batch axes",
        "one batch axis",
    },
}

EXEMPT: dict[tuple[str, str], str] = {
    ("sliding_window_mask", "S"): (
        "a keyword-only extra of the reference (queries that are the last of S keys, as "
        "with a rolling KV cache); exercise 15 asks for sliding_window_mask(size, window, "
        "device=None) only"
    ),
    ("sinusoidal_positional_encoding", "device"): (
        "a keyword-only extra of the reference; exercise 09 asks for "
        "sinusoidal_positional_encoding(max_len, d_model) only"
    ),
    ("sinusoidal_positional_encoding", "dtype"): (
        "a keyword-only extra of the reference; exercise 09 asks for torch's default dtype"
    ),
    ("causal_mask", "S"): (
        "a keyword-only extra of the reference (queries that are the last of S keys, as "
        "with a KV cache); exercise 05 asks for causal_mask(size, device=None) only"
    ),
    ("multi_head_attention", "cache"): (
        "the key/value cache of incremental decoding (chapter 12) is not part of exercise "
        "06's signature"
    ),
    ("decoder_layer", "cache"): (
        "the key/value cache of incremental decoding (chapter 12) is not part of exercise "
        "10's signature"
    ),
    ("causal_self_attention", "num_kv_heads"): (
        "grouped keys and values are chapter 15's (tested in tests/test_kv.py); "
        "exercise 13 asks for (d_model, num_heads, bias, dropout) only"
    ),
    ("causal_self_attention", "pos"): (
        "rotary / ALiBi positions are chapter 14's (tested in tests/test_positions.py); "
        "exercise 13 asks for (d_model, num_heads, bias, dropout) only"
    ),
    ("causal_self_attention", "window"): (
        "sliding-window attention is chapter 15's (tested in tests/test_kv.py); "
        "exercise 13 asks for (d_model, num_heads, bias, dropout) only"
    ),
    ("causal_self_attention", "rope_fn"): (
        "the rotation RoPE applies (chapter 14 passes the interleaved layout; tested in "
        "tests/test_rope_fn.py); exercise 13 asks for (d_model, num_heads, bias, dropout) only"
    ),
    ("causal_self_attention", "positions"): (
        "the position piece the package's module is given (chapter 14's RoPE or ALiBi; tested "
        "in tests/test_cache_structure.py); exercise 13 asks for (d_model, num_heads, bias, "
        "dropout) only"
    ),
    ("causal_self_attention", "layout"): (
        "the key/value layout piece (chapter 15's grouped heads and windows; tested in "
        "tests/test_cache_structure.py); exercise 13 asks for (d_model, num_heads, bias, "
        "dropout) only"
    ),
    ("causal_self_attention", "qk_norm"): (
        "QK-norm is chapter 20's (tested against Qwen3Attention in "
        "tests/test_qknorm_softcap.py); exercise 13 asks for (d_model, num_heads, bias, "
        "dropout) only"
    ),
    ("causal_self_attention", "softcap"): (
        "soft-capped scores are chapter 20's (tested against Gemma 2 in "
        "tests/test_qknorm_softcap.py); exercise 13 asks for (d_model, num_heads, bias, "
        "dropout) only"
    ),
    ("causal_self_attention", "max_len"): (
        "a bound for the positions of chapter 14; unused by exercise 13's module"
    ),
    ("causal_self_attention", "need_weights"): (
        "exercise 13's forward is forward(x) -> (B, T, D); returning the weights is the package's"
        " extra for the heatmaps"
    ),
    ("causal_self_attention", "cache"): (
        "the key/value cache of incremental decoding (chapter 12) is not part of exercise 13's "
        "signature"
    ),
    ("causal_self_attention", "mask"): (
        "a prebuilt mask shared by the layers of a GPT is the package's extra; exercise 13's "
        "module builds its own causal mask"
    ),
    ("apply_rope", "scaling"): (
        "RoPE scaling is chapter 19's (tested in tests/test_rope_scaling.py; exercise 19's "
        "rope_frequencies and scaled_rope_scores grade it); exercise 14 asks for "
        "apply_rope(x, positions=None, base=10000.0) only"
    ),
    ("moe", "router_bias"): (
        "DeepSeek-V3's selection-only balancing bias is chapter 21's option (tested in "
        "tests/test_moe_gpt.py); exercise 21 asks for the contract's MoE(d_model, d_ff, "
        "num_experts, top_k, num_shared) only"
    ),
    ("causal_self_attention", "sinks"): (
        "learned sink logits are chapter 19's (tested in tests/test_sinks.py; exercise 19's "
        "sink_attention grades them); exercise 13 asks for (d_model, num_heads, bias, "
        "dropout) only"
    ),
    ("gated_delta_rule", "chunk_size"): (
        "the chunked (parallel) form is chapter 22's (tested against the recurrence and "
        "Qwen3-Next's torch_chunk_gated_delta_rule in tests/test_linear.py); exercise 22 asks "
        "for the recurrent form, and its statement says the check never passes chunk_size"
    ),
    ("batch_norm", "momentum=None"): (
        "nn.BatchNorm1d's cumulative average; exercise 07 says it is not part of the task"
    ),
}


def _parameters_with_defaults(reference) -> list[str]:
    """The parameters of the contract that have a default (and so can be left out)."""
    if isinstance(reference, type):
        signatures = [inspect.signature(reference.__init__), inspect.signature(reference.forward)]
    else:
        signatures = [inspect.signature(reference)]
    names = []
    for signature in signatures:
        for name, param in signature.parameters.items():
            if name != "self" and param.default is not inspect.Parameter.empty:
                names.append(name)
    return names


def required_items(target: str) -> set[str]:
    items = set(_parameters_with_defaults(REFERENCES[target])) | REQUIRED_MODES[target]
    if target == "batch_norm":
        items.add("momentum=None")
    return {item for item in items if (target, item) not in EXEMPT}


def _covered(target: str) -> frozenset[str]:
    torch.ones(2, 2, dtype=torch.bool, device="meta").tril()  # load the meta kernels once
    report = CHECKERS[target](REFERENCES[target])
    assert report.passed, str(report)
    return report.covered


def test_every_checker_has_a_reference():
    assert set(CHECKERS) == set(REFERENCES) == set(REQUIRED_MODES)


def _exempt(target: str) -> set[str]:
    return {item for (t, item) in EXEMPT if t == target}


@pytest.mark.parametrize("target", list(REFERENCES))
def test_checker_covers_the_contract(target):
    covered = _covered(target)
    missing = required_items(target) - covered
    assert not missing, (
        f"check_{target} has no case exercising {sorted(missing)}: add a case (with "
        "`covers=`) or list the item in EXEMPT with the reason"
    )
    stale = _exempt(target) & covered
    assert not stale, (
        f"check_{target} exercises {sorted(stale)}, which EXEMPT lists as not tested: "
        "remove the exemption"
    )


def test_exemptions_name_real_parameters_or_modes():
    for (target, item), reason in EXEMPT.items():
        assert target in REFERENCES and reason
        known = set(_parameters_with_defaults(REFERENCES[target])) | {"momentum=None"}
        assert item in known, (target, item)


if __name__ == "__main__":  # the table; the tests above assert what it shows
    for target in REFERENCES:
        exempt = sorted(_exempt(target))
        print(
            f"{target}: "
            + ", ".join(sorted(_covered(target)))
            + (f"  [exempt: {', '.join(exempt)}]" if exempt else "")
        )
