"""The mistake table: every known mistake a checker can name, by a stable id.

A checker names a mistake with ``says(id)`` (its message) wherever it lists the mistakes
it recognises (``(says(id), compute)`` pairs for `_compare.expect_close`), or raises
``CaseFailed(message, mistake=id)`` for one it finds by a property. The runner records
the id of the mistake a failing case named in ``CaseResult.mistake`` (read from the
``Likely mistake: ...`` line, see `mistake_in`), so that tests pin ids, not prose, and a
message can be reworded in one place. One mistake has one id and one message, whichever
checker names it.

Ids are lower-case words joined by hyphens, naming the mistake, not the checker. Messages
end without a full stop (the report adds it). Checkers not yet moved to this table keep
their messages in their own modules; to move one, add its messages here and replace each
literal with ``says(id)``.
"""

from __future__ import annotations

import re

_BOTH_WAYS = " (and merged back the same way)"

_SPLIT_WITHOUT_TRANSPOSE = (
    "heads split without the transpose: reshaping (B, T, D) straight to (B, H, T, Dh) "
    "mixes the features of different tokens into one head; view as (B, T, H, Dh), then "
    "`.transpose(1, 2)`"
)
_SPLIT_INTERLEAVED = (
    "heads split interleaved: `view(B, T, Dh, H)` gives head h the features h, h + H, "
    "h + 2H, ...; head h must get the contiguous slice x[..., h*Dh:(h+1)*Dh]: view as "
    "(B, T, H, Dh), then `.transpose(1, 2)`"
)

MISTAKES: dict[str, str] = {
    # ---- splitting and merging heads (split_heads, merge_heads, the attention modules)
    "heads-split-without-transpose": _SPLIT_WITHOUT_TRANSPOSE,
    "heads-split-and-merged-without-transpose": _SPLIT_WITHOUT_TRANSPOSE + _BOTH_WAYS,
    "heads-split-interleaved": _SPLIT_INTERLEAVED,
    "heads-split-and-merged-interleaved": _SPLIT_INTERLEAVED + _BOTH_WAYS,
    "heads-split-transpose-missing": (
        "the transpose is missing: after the view (B, T, H, Dh), bring the heads forward "
        "with `.transpose(1, 2)` to get (B, H, T, Dh)"
    ),
    "heads-merged-without-transpose": (
        "heads merged without the transpose: reshaping (B, H, T, Dh) straight to (B, T, D) "
        "mixes tokens; `.transpose(1, 2)` to (B, T, H, Dh) first, then reshape"
    ),
    "heads-merged-interleaved": (
        "the heads' features are interleaved: transpose to (B, T, H, Dh) (not (B, T, Dh, H)) "
        "before reshaping, so the output is [head 1 | head 2 | ...]"
    ),
    "heads-merge-reshape-missing": (
        "the reshape is missing: after the transpose (B, T, H, Dh), reshape to (B, T, D)"
    ),
    # ---- scaling the scores
    "scale-by-d-model": (
        "the scores are scaled by 1/sqrt(d_model): each head has width d_head = d_model / "
        "num_heads, so scale by 1/sqrt(d_head)"
    ),
    "head-scale-missing": "the 1/sqrt(d_head) scaling of the scores is missing",
    "scale-missing": "the 1/sqrt(d_k) factor is missing: scale the scores by 1/sqrt(d_k)",
    "scale-by-d-k": "your scores are scaled by 1/d_k: the factor is 1/sqrt(d_k)",
    "scale-multiplied": "you multiplied the scores by sqrt(d_k): divide by it",
    "scale-by-d-v": "you scaled by 1/sqrt(d_v): the factor uses the key size, 1/sqrt(d_k)",
    "scale-by-model-width": (
        "you scaled by 1/sqrt(H * d_k), the model's width: each head's scores use its own "
        "size, 1/sqrt(d_k) with d_k = query.shape[-1]"
    ),
    "scale-by-length": (
        "you scaled by the square root of a sequence length: the factor is 1/sqrt(d_k), "
        "with d_k = query.shape[-1], the size of each query and key vector"
    ),
    "scale-argument-ignored": (
        "the `scale` argument is ignored: when given, it replaces 1/sqrt(d_k)"
    ),
    "scale-zero-ignored": (
        "scale=0.0 is treated as if no scale were given: test `scale is None`, not "
        "`scale or ...` (0.0 is falsy); with scale=0 every score is 0 and the weights "
        "are uniform"
    ),
    # ---- the softmax and the weighted sum
    "softmax-over-queries": (
        "your softmax runs over the query axis (dim=-2): the weights must sum to 1 over the keys"
    ),
    "softmax-over-batch": (
        "your softmax runs over the batch axis (dim=0): the weights must sum to 1 over the "
        "keys (dim=-1)"
    ),
    "keys-averaged": "you averaged the keys instead of the values: the output is weights @ value",
    "weights-averaged-over-heads": (
        "the weights are averaged over the heads: return one map per head, (B, H, T, S)"
    ),
    "no-output-projection": (
        "the output projection w_o is not applied: mix the concatenated heads with self.w_o"
    ),
    # ---- a mask given to the attention
    "mask-inverted": (
        "the mask is inverted: True means 'may attend', so fill the scores where the mask is False"
    ),
    "mask-after-softmax": (
        "the mask is applied after the softmax: zeroing the masked weights after the "
        "softmax leaves rows that no longer sum to 1 (and the masked keys still shaped the "
        "normaliser); fill the *scores* with -inf before the softmax"
    ),
    "mask-ignored": (
        "the mask is ignored: fill the scores of masked keys with -inf before the softmax"
    ),
    "mask-not-passed-on": "the mask is ignored: pass it on to the attention",
    "fully-masked-row-nan": (
        "a fully masked row gives NaN (softmax of a row of -inf is 0/0): give such rows "
        "zero weights and a zero output"
    ),
    "fully-masked-row-uniform": (
        "a fully masked row gets uniform weights (a large negative fill makes the row "
        "constant): such rows must have zero weights and a zero output"
    ),
    "bool-mask-multiplies": (
        "the bool mask multiplies the scores: that sets the masked scores to 0, not to "
        "-inf, so masked keys still get weight; use `scores.masked_fill(~mask, "
        "torch.finfo(scores.dtype).min)` (or -inf) before the softmax"
    ),
    "float-mask-ignored": "the float mask is ignored: add it to the scores before the softmax",
    "float-mask-multiplies": (
        "the float mask multiplies the scores: a float mask is added to them"
    ),
    "float-mask-as-bool": (
        "a float mask is added to the scores, not converted to bool: `mask == 0` (or "
        "`mask.bool()`) is right only for a 0 / -inf mask, but a float mask may hold any "
        "bias (e.g. ALiBi's distance penalty); use `scores = scores + mask` (a module "
        "passes the mask on unchanged)"
    ),
    "float-mask-nonzero-as-bool": (
        "a float mask is added to the scores, not converted to bool: `mask.bool()` marks "
        "every nonzero bias; use `scores = scores + mask`"
    ),
    # ---- the causal mask a decoder builds itself
    "no-causal-mask": (
        "no causal mask: token t attends to the later tokens t+1, t+2, ... too; fill the "
        "scores above the diagonal with -inf before the softmax "
        "(`scores.masked_fill(~torch.tril(torch.ones(T, T, dtype=torch.bool)), "
        "float('-inf'))`)"
    ),
    "causal-mask-hides-diagonal": (
        "the causal mask is off by one: it hides the diagonal, so a token cannot see itself "
        "(and the first token sees nothing); token t must attend to tokens 0 .. t, itself "
        "included: `torch.tril(ones)` keeps the diagonal, `torch.triu(ones, diagonal=1)` is "
        "what to hide"
    ),
    "causal-mask-sees-next": (
        "the causal mask is off by one: token t also sees token t+1 (the one it must "
        "predict); hide every key j > t, i.e. `torch.triu(ones, diagonal=1)`, not diagonal=2"
    ),
    "causal-mask-inverted": (
        "the causal mask is inverted: token t attends to the tokens after it instead of the "
        "ones before it; hide j > t (above the diagonal), keep j <= t"
    ),
    "causal-mask-one-mode": (
        "the causal mask (or another step) is applied in {mode} mode only, behind `if "
        "self.training`: the mask applies in both modes, only dropout depends on self.training"
    ),
    # ---- projections
    "kv-from-query": (
        "the keys and values are computed from the query input: use w_k(key) and "
        "w_v(value), so that cross-attention reads the other sequence"
    ),
    "values-from-key": "the values are computed from the key input: use w_v(value)",
    "keys-from-value": "the keys are computed from the value input: use w_k(key)",
    "values-from-w-k": "the values are projected with w_k: v = self.w_v(x)",
    "bias-unused": (
        "the biases are not used: with bias=True call the nn.Linear layers themselves "
        "(self.w_q(x)), which add their bias, not x @ self.w_q.weight.T"
    ),
    "bias-not-built": (
        "with bias=True your layers have no bias: build `nn.Linear(d_model, d_model, "
        "bias=bias)`, passing the constructor's bias on"
    ),
    # ---- additive attention
    "additive-tanh-missing": "the tanh is missing: score = v^T tanh(W q + U k)",
    "additive-relu": "you used relu instead of tanh: score = v^T tanh(W q + U k)",
    "additive-scaled": (
        "your scores are scaled by 1/sqrt(hidden_dim): additive attention does not scale"
    ),
    "single-query-axis-kept": (
        "you kept the query axis: for a single query (B, Dq) return context (B, Dv) and "
        "weights (B, S)"
    ),
    "single-query-mask-broadcast": (
        "with a single query (B, Dq) the mask (B, S) needs the query axis too, "
        "`mask[:, None, :]` -> (B, 1, S): otherwise it broadcasts against the (B, 1, S) "
        "scores to (B, B, S) and every sequence is masked like the first one"
    ),
    # ---- dropout on the attention weights
    "dropout-never-applied": (
        "dropout is never applied: in training mode (module.train()) with dropout={p:g} {what}"
    ),
    "dropout-in-eval": (
        "in eval mode (module.eval(), self.training is False) dropout must be off, {detail}"
    ),
    "dropout-on-output": (
        "{share} of your output entries are exactly 0: dropout is applied to the output; it "
        "belongs on the attention weights, after the softmax and before the weighted sum of "
        "the values"
    ),
    "dropout-elsewhere": (
        "dropout is applied somewhere other than the attention weights (on V, on the merged "
        "heads?): it belongs after the softmax, on the (B, H, T, T) weights"
    ),
    "dropout-unscaled": (
        "some {entries} are dropped but the kept ones are not scaled by "
        "1 / (1 - p) = {scale:.4g}: use `F.dropout` or `nn.Dropout` (inverted dropout), "
        "which rescale the survivors so that the expected value is unchanged"
    ),
    "dropout-keep-probability": (
        "the kept {entries} are scaled by 1 / p instead of 1 / (1 - p): you passed "
        "1 - p as the dropout probability; p = {p:g} is the probability of *dropping* "
        "{one}, {call}"
    ),
    "dropout-before-softmax": (
        "the first token's output is never dropped out: token 0 attends only to itself, "
        "with weight 1, which dropout on the attention weights zeroes with probability "
        "p = {p:g}; dropout belongs on the weights after the softmax (dropout on the "
        "scores, before the softmax, leaves that weight at 1)"
    ),
    "dropout-on-masked-scores": (
        "dropout is applied to the scores after the mask: a dropped -inf score becomes "
        "-inf * 0 = NaN, and a row with a NaN gives NaN weights; dropout belongs on the "
        "weights, after the softmax: `F.dropout(weights, p=self.dropout, "
        "training=self.training)`"
    ),
    "dropout-renormalised": (
        "the weights are renormalised after dropout (`w / w.sum(-1, keepdim=True)`): a row "
        "whose kept weights were all dropped (token 0 has only one) becomes 0 / 0 = NaN, and "
        "renormalising undoes inverted dropout's 1 / (1 - p) scaling; apply "
        "`F.dropout(weights, p=self.dropout, training=self.training)` after the softmax and "
        "use those weights as they are"
    ),
    "dropout-weights-before-dropout": (
        "the output uses the weights before dropout: the heads must be averaged with the "
        "dropped-out weights"
    ),
    # ---- multi-head latent attention, absorbed (exercise 18)
    "mla-rope-on-whole-query": (
        "RoPE was applied to the whole query (or the whole key): only the last d_rope "
        "features of each head, q_rope, rotate; q_nope (the first d_nope) and the latent "
        "part of the key carry no position, which is what lets W_UK be absorbed"
    ),
    "mla-k-rope-rotated-again": (
        "the shared rotary key was rotated again: k_rope comes from the cache already "
        "rotated (at its own position); rotate only the new queries' q_rope"
    ),
    "mla-k-rope-not-broadcast": (
        "the shared rotary key was not broadcast over the heads: k_rope (B, S, d_rope) has no "
        "head axis, so `q_rope @ k_rope.transpose(-1, -2)` pairs head h with batch element "
        "h; add the head axis, `k_rope[:, None]` -> (B, 1, S, d_rope)"
    ),
    "mla-scale-from-d-nope": (
        "the scores are scaled by 1/sqrt(d_nope): each head's query is [q_nope | q_rope], "
        "d_nope + d_rope features, so scale by 1/sqrt(d_nope + d_rope)"
    ),
    "mla-scale-from-latent": (
        "the scores are scaled by 1/sqrt(kv_rank + d_rope), the width of the absorbed dot "
        "product: absorption changes how the score is computed, not its value; scale by "
        "1/sqrt(d_nope + d_rope) as the naive form does"
    ),
    "mla-uk-transposed": (
        "absorption with the wrong transpose: per head W_UK_h = w_ukv.view(H, d_nope + d_v, "
        "kv_rank)[h, :d_nope] is (d_nope, kv_rank) and k_nope = latent @ W_UK_h.T, so "
        "q_nope . k_nope = (q_nope @ W_UK_h) . latent: the absorbed query is q_nope @ W_UK_h, "
        "not q_nope @ W_UK_h.T"
    ),
    "mla-uv-transposed": (
        "W_UV applied with the wrong transpose: per head W_UV_h = w_ukv.view(H, d_nope + d_v, "
        "kv_rank)[h, d_nope:] is (d_v, kv_rank), so the output is (weights @ latent) @ "
        "W_UV_h.T"
    ),
    "mla-ukv-read-as-in-out": (
        "w_ukv was read as (kv_rank, out): an nn.Linear weight is (out_features, in_features), "
        "here (H * (d_nope + d_v), kv_rank); view it as (H, d_nope + d_v, kv_rank), each "
        "head's rows [k_nope | v]"
    ),
    "mla-ukv-split-wrong": (
        "w_ukv was split as [all k_nope | all v] over the heads: its rows are per head, "
        "[k_nope_h | v_h] for h = 0 .. H - 1; view as (H, d_nope + d_v, kv_rank) first, then "
        "split the second axis"
    ),
    "mla-causal-no-offset": (
        "the causal mask ignores the cached tokens: the T new queries are the last T of the S "
        "positions (S - T .. S - 1), so query t sees keys j <= S - T + t "
        "(`torch.ones(T, S).tril(diagonal=S - T)`)"
    ),
    "mla-queries-at-zero": (
        "the queries were rotated at positions 0 .. T - 1: they are the last T of the S "
        "positions, S - T .. S - 1 (the S - T positions before them are earlier tokens)"
    ),
    "mla-k-rope-head-zero-only": (
        "the shared rotary key's term reached one head only: every head's score has the "
        "term q_rope_h . k_rope_j, with the same k_rope for all heads; broadcast it over "
        "the head axis, `q_rope @ k_rope[:, None].transpose(-1, -2)`"
    ),
    "mla-q-absorbed-scaled": (
        "q_absorbed was returned already scaled by 1/sqrt(d_nope + d_rope): return the "
        "absorbed query itself, q_nope @ W_UK_h per head; the scale belongs to the scores"
    ),
    # ---- the KV cache of a configuration (exercise 18)
    "cache-mla-per-head": (
        "MLA's cache was counted once per head: the latent and the rotary key are shared by "
        "all heads, kv_rank + d_rope numbers per token per layer (the heads' keys and values "
        "are rebuilt from them)"
    ),
    "cache-counted-in-bits": (
        "the count is in bits, not bytes: bytes_per_number is already in bytes (2 for "
        "bfloat16), so do not multiply by 8"
    ),
    "cache-integer-overflow": (
        "the count overflowed a 32-bit integer: the true number of bytes is more than "
        "2^31, and the result wrapped around (it differs from the right one by a multiple "
        "of 2^32); compute with Python ints (`int(...)`, plain `*`), not numpy's int32 "
        "(`np.prod(..., dtype=np.int32)`, or numpy < 2's default integer on Windows) or "
        "torch.int32"
    ),
    "cache-mla-keys-and-values": (
        "MLA's latent was counted twice (once for keys, once for values): keys and values "
        "are both up-projected from the same cached latent, so a token stores kv_rank + "
        "d_rope numbers per layer"
    ),
    "cache-mla-no-rope-key": (
        "MLA's shared rotary key is missing: besides the kv_rank latent a token caches its "
        "d_rope-wide rotated key, kv_rank + d_rope numbers per layer"
    ),
    "cache-mla-rope-per-head": (
        "MLA's rotary key was counted per head: one k_rope of d_rope numbers is shared by all "
        "heads, kv_rank + d_rope per token per layer"
    ),
    "cache-mla-decompressed": (
        "MLA was counted as the keys and values it decompresses to (2 H Dh per token): the "
        "cache holds only the latent and the shared rotary key, kv_rank + d_rope"
    ),
    "cache-keys-only": (
        "only the keys were counted: the cache holds keys and values, 2 numbers per head "
        "feature (MHA 2 H Dh, GQA 2 Hkv Dh, MQA 2 Dh per token per layer)"
    ),
    "cache-kv-heads-ignored": (
        "grouped or multi-query attention counted with all H query heads: only the key/value "
        "heads are cached, 2 Hkv Dh per token per layer (Hkv = 1 for MQA)"
    ),
    "cache-layers-ignored": "the layers are missing: every layer keeps its own cache",
    "cache-bytes-ignored": ("the count is in numbers, not bytes: multiply by bytes_per_number"),
    "cache-batch-ignored": "the batch is missing: each sequence of the batch has its own cache",
    # ---- YaRN and the other RoPE scalings (exercise 19)
    "yarn-ramp-reversed": (
        "the ramp runs the wrong way: YaRN keeps the high-frequency pairs (small i, many turns "
        "over the original length) as they are and interpolates the low-frequency ones "
        "(divides by s); the extrapolation weight is 1 - ramp(i), 1 below `low`, 0 above `high`"
    ),
    "yarn-no-rounding": (
        "the correction range is not rounded: HF's `_compute_yarn_parameters` (truncate=True) "
        "takes floor(low) and ceil(high) before the ramp"
    ),
    "yarn-rounding-swapped": (
        "the correction range is rounded the wrong way: floor(low) and ceil(high) (the range "
        "widens), not ceil(low) and floor(high)"
    ),
    "yarn-interpolates-high-frequencies": (
        "every frequency was divided by the factor (position interpolation): YaRN leaves the "
        "high frequencies (pairs below `low`) unchanged and interpolates only the low ones"
    ),
    "yarn-no-interpolation": (
        "no frequency was interpolated: the pairs above `high` turn at base^(-2i/d) / s"
    ),
    "yarn-betas-swapped": (
        "beta_fast and beta_slow are swapped: low comes from beta_fast (32 rotations, the "
        "high frequencies), high from beta_slow (1 rotation)"
    ),
    "yarn-ramp-over-features": (
        "the ramp was indexed by the feature 2i instead of the pair i: the correction range "
        "counts pairs, ramp(i) = clamp((i - low) / (high - low), 0, 1) for i = 0 .. d/2 - 1"
    ),
    "yarn-high-clipped-at-half": (
        "`high` was clipped at d/2 - 1 (the last pair): HF's `find_correction_range` clips "
        "it at d - 1, so with a long original length (here ceil(i(beta_slow)) > d/2 - 1) "
        "the ramp is still below 1 at the last pair; clip with `min(high, d - 1)`"
    ),
    "yarn-ramp-off-by-one": (
        "the ramp is off by one pair: pair i's share is (i - low) / (high - low), with i "
        "counted from 0 (`torch.arange(d // 2)`), not (i + 1 - low) / (high - low)"
    ),
    "yarn-ramp-not-clamped": (
        "the ramp is not clamped: (i - low) / (high - low) is below 0 for the pairs before "
        "`low` and above 1 after `high`; clamp it to [0, 1] (`.clamp(0, 1)`)"
    ),
    "yarn-attention-factor": (
        "the attention factor is wrong: YaRN's is 0.1 ln(s) + 1 (HF's get_mscale)"
    ),
    "scaling-attention-factor-not-one": (
        "linear and NTK scaling change no attention factor: return 1.0"
    ),
    "linear-scaling-multiplied": (
        "linear scaling multiplies the frequencies by s: position interpolation slows every "
        "pair down, base^(-2i/d) / s"
    ),
    "linear-scaling-last-pair": (
        "linear scaling left the last pair unscaled: position interpolation divides every "
        "pair's frequency by s, the last one (i = d/2 - 1) too"
    ),
    "ntk-exponent-d-minus-1": (
        "NTK-aware scaling used the exponent d / (d - 1): the new base is base * s^(d / "
        "(d - 2)), because the lowest frequency is base^(-(d - 2)/d) (pair i = d/2 - 1, "
        "exponent -2i/d), and this base divides exactly it by s"
    ),
    "ntk-base-times-factor": (
        "NTK-aware scaling multiplied the base by s: the new base is base * s^(d / (d - 2)), "
        "so that the lowest frequency is divided by exactly s"
    ),
    "scaling-ignored": "the scaling is ignored: the frequencies are the unscaled base^(-2i/d)",
    "rope-base-ignored": (
        "the `base` argument is ignored: the frequencies were computed with base 10000; "
        "pass `base` on to rope_frequencies(Dh, base, scaling)"
    ),
    "rope-interleaved-layout": (
        "the pairs are interleaved (GPT-J's layout: features 2i and 2i + 1): chapter 14's "
        "half-split layout pairs feature i with feature i + Dh/2, `x1, x2 = x[..., :Dh//2], "
        "x[..., Dh//2:]`"
    ),
    "yarn-factor-applied-once": (
        "the attention factor was applied once: HF multiplies cos and sin by it, so it "
        "scales the rotated queries *and* the rotated keys, and the scores by its square"
    ),
    "yarn-factor-not-applied": (
        "the attention factor is not applied: multiply cos and sin (the rotated queries and "
        "keys) by it"
    ),
    # ---- StreamingLLM's mask (exercise 19)
    "streaming-sinks-see-future": (
        "the sink columns are True in every row: a query i < num_sink would see a later "
        "sink; the mask stays causal, j <= i and (j < num_sink or i - j < window)"
    ),
    "streaming-sinks-ignored": (
        "the sink tokens are missing: besides the window every query keeps the first "
        "num_sink tokens, j < num_sink"
    ),
    "streaming-sinks-one-too-many": (
        "one sink too many: the sinks are the first num_sink tokens, j < num_sink (j counts "
        "from 0), not j <= num_sink"
    ),
    "streaming-not-causal": (
        "the mask is not causal: a query sees later sinks and later tokens of its window; "
        "keep j <= i as well, (j <= i) & ((j < num_sink) | (i - j < window))"
    ),
    "streaming-mask-transposed": (
        "the mask is transposed: row i is query i, column j key j, so the True entries lie "
        "on and below the diagonal, `mask[i, j]` for j <= i"
    ),
    "streaming-window-one-wide": (
        "the window keeps one token too many: i - j < window (the token itself and the "
        "window - 1 before it), not i - j <= window"
    ),
    "streaming-window-one-narrow": (
        "the window keeps one token too few: i - j < window keeps the token itself and the "
        "window - 1 before it"
    ),
    "streaming-sinks-in-window": (
        "the sinks were counted inside the window (the window shrunk by num_sink): the "
        "window is `window` tokens besides the sinks, i - j < window"
    ),
    # ---- gpt-oss's learned sinks (exercise 19)
    "sink-one-for-all-heads": (
        "every head got the same sink (sinks[0]): sinks (H,) holds one logit per head; "
        "reshape it to (1, H, 1, 1) so that head h's rows get sinks[h]"
    ),
    "sink-scale-ignored": (
        "the `scale` argument is ignored: when it is given, the scores are q . k * scale; "
        "1/sqrt(Dk) is only its default (`if scale is None`)"
    ),
    "sink-mask-after-softmax": (
        "the mask was applied after the softmax: masked keys still took a share of the row "
        "(and of the sink's); fill the masked *scores* with -inf (or add a float mask) "
        "before the softmax over [scores | sink]"
    ),
    "sink-share-kept": (
        "the sink's share is kept in the weights: after the softmax over [scores | sink] drop "
        "the sink's column and do not renormalise, so each row sums to 1 - p_sink"
    ),
    "sink-ignored": (
        "the sink logit is ignored: the weights are a plain softmax over the scores (what "
        "dropping the sink's column and renormalising also gives); the softmax runs over "
        "the scores *and* the head's sink logit, and the rows then sum to less than 1"
    ),
    "sink-added-after-softmax": (
        "the sink entered after the softmax: the sink logit is one more entry of the softmax "
        "row (its exp joins the normaliser), not something added to or divided out of the "
        "probabilities"
    ),
    "sink-no-max-subtraction": (
        "exp overflowed: with large scores exp(score) is inf; subtract each row's maximum "
        "over the scores and the sink logit before exp (or use torch.softmax on the row "
        "with the sink appended)"
    ),
    "sink-wrong-head": (
        "the sinks were broadcast over the wrong axis: sinks (H,) holds one logit per head; "
        "reshape it to (1, H, 1, 1) (`sinks.view(1, -1, 1, 1)`), so that every query row of "
        "head h gets sinks[h]"
    ),
    # ---- QK-norm (exercise 20)
    "qk-norm-after-rope": (
        "the norms are applied after RoPE: normalise each head's queries and keys first, "
        "then rotate them (Qwen3: q_norm and k_norm sit between the projection and "
        "apply_rope); with a gain that is not all ones the two orders differ"
    ),
    "qk-norm-over-whole-projection": (
        "the root mean square is taken over the whole projection (every head's Dh numbers "
        "together, as OLMo 2 does): Qwen3's QK-norm, the one asked for, normalises each head "
        "over its own Dh numbers, `x.pow(2).mean(-1, keepdim=True)` on (B, H, T, Dh)"
    ),
    "qk-norm-one-norm-for-q-and-k": (
        "the queries and the keys are normalised with the same gain: q uses q_weight and k "
        "uses k_weight (two RMSNorms, q_norm and k_norm)"
    ),
    "qk-norm-on-values": (
        "the values are normalised too: QK-norm normalises the queries and keys only (the "
        "scores are what must stay in range); v goes in unchanged"
    ),
    "qk-norm-missing": (
        "no normalisation: q and k go through RMSNorm over Dh (with gains q_weight and "
        "k_weight) before RoPE"
    ),
    "qk-norm-queries-only": (
        "only the queries are normalised: normalise the keys too, with k_weight"
    ),
    "qk-norm-keys-only": "only the keys are normalised: normalise the queries too, with q_weight",
    "qk-norm-over-tokens": (
        "the mean square runs over the positions (dim=-2): RMSNorm normalises each vector "
        "over its Dh features, dim=-1"
    ),
    "qk-norm-mean-subtracted": (
        "the mean is subtracted (LayerNorm): RMSNorm divides by the root mean square without "
        "centring"
    ),
    "qk-norm-eps-outside-root": (
        "eps is outside the square root: x / sqrt(mean(x²) + eps), not x / (sqrt(mean(x²)) + eps)"
    ),
    "qk-norm-eps-ignored": (
        "the `eps` argument is ignored (the case gives eps=0.1): use the eps passed in, "
        "inside the square root"
    ),
    "qk-norm-scale-dropped": (
        "the 1/sqrt(Dh) scale is dropped: QK-norm bounds the size of q and k, but the scores "
        "are still divided by sqrt(Dh) (Qwen3 keeps `scaling = head_dim ** -0.5`)"
    ),
    "qk-norm-scale-one-over-dh": (
        "the scores are divided by Dh, not by sqrt(Dh): the scale is Dh^-1/2 "
        "(`/ math.sqrt(Dh)`), with or without QK-norm (Qwen3: `scaling = head_dim ** -0.5`)"
    ),
    "rope-missing": "RoPE is not applied: rotate the normalised q and k with apply_rope",
    "rope-on-values": "RoPE is applied to the values as well: rotate q and k only",
    # ---- soft-capping the attention scores (exercise 20)
    "softcap-after-mask": (
        "the cap is applied after the mask: cap * tanh(-inf / cap) = -cap, so the masked "
        "keys get back a weight of about e^-cap relative to the others; cap the scores "
        "first, then fill the masked ones with -inf (Gemma 2 caps before adding the mask)"
    ),
    "softcap-on-probabilities": (
        "the cap is applied to the probabilities after the softmax: soft-capping acts on "
        "the scores (logits), cap * tanh(scores / cap), before the mask and the softmax"
    ),
    "softcap-before-scale": (
        "the cap is applied before the 1/sqrt(Dh) scale: scale the scores first, "
        "q @ k^T / sqrt(Dh), then cap them (Gemma 2 scales the queries, then caps)"
    ),
    "softcap-factor-missing": (
        "the cap does not multiply the tanh: softcap(s) = cap * tanh(s / cap), which keeps "
        "small scores unchanged and bounds the rest in (-cap, cap); tanh(s / cap) alone "
        "squeezes every score into (-1, 1)"
    ),
    "softcap-divide-missing": (
        "the scores are not divided by the cap inside the tanh: cap * tanh(s / cap), not "
        "cap * tanh(s)"
    ),
    "softcap-clamped": (
        "the scores are clipped (clamp to [-cap, cap]): soft-capping is smooth, "
        "cap * tanh(s / cap), and keeps a gradient for large scores"
    ),
    "softcap-ignored": "the cap is not applied: the scores go through cap * tanh(s / cap)",
    "softcap-on-output": (
        "the cap is applied to the output: it belongs on the scores, before the mask and "
        "the softmax"
    ),
    # ---- mixture of experts (exercise 21)
    "moe-weights-not-renormalised": (
        "the top-k weights are not renormalised: divide the k probabilities by their sum, "
        "so that each token's k weights add up to 1 (Mixtral)"
    ),
    "moe-no-router-softmax": (
        "the router logits themselves weight the experts: take the softmax over the E "
        "logits, then the top-k probabilities, renormalised"
    ),
    "moe-softmax-over-tokens": (
        "the softmax runs over the tokens (dim=0): each token's probabilities are over the "
        "E experts, softmax(router_logits, dim=-1)"
    ),
    "moe-top-k-over-tokens": (
        "the top-k runs over the tokens (dim=0): each expert picked its k tokens (that is "
        "expert-choice routing); the contract lets each token pick its k experts, "
        "topk(probs, k, dim=-1)"
    ),
    "moe-routing-per-sequence": (
        "the experts are chosen once per sequence: routing is per token, every token of "
        "every sequence picks its own k experts from its own router logits (flatten to "
        "(B*T, D) first)"
    ),
    "moe-uniform-expert-weights": (
        "the k experts are averaged with equal weights 1/k: weight each by its renormalised "
        "router probability"
    ),
    "moe-expert-outputs-unweighted": (
        "the k experts' outputs are summed without their weights: multiply each by its "
        "renormalised router probability"
    ),
    "moe-shared-forgotten": (
        "the shared experts are not added: with num_shared > 0, every token also goes "
        "through self.shared, added with weight 1"
    ),
    "moe-shared-averaged": (
        "the shared and the routed outputs are averaged: add them, routed + shared(x), the "
        "shared part with weight 1"
    ),
    "moe-shared-weighted": (
        "the shared output is multiplied by a router weight: the shared experts take every "
        "token with weight 1, outside the routing"
    ),
    "moe-router-probabilities-returned": (
        "the second output holds probabilities: return the raw router logits, "
        "self.router(x) flattened to (B*T, E) (the balancing loss takes logits)"
    ),
    "moe-router-logits-not-flattened": (
        "router_logits has shape (B, T, E): return it flattened to (B*T, E), one row per "
        "token, as Mixtral does"
    ),
    "moe-router-gets-no-gradient": (
        "the router gets no gradient: the routing weights must stay in the graph (no "
        "`.detach()`, `.item()`, `torch.no_grad()`), so that the router learns from the loss"
    ),
    # ---- the load-balancing loss (exercise 21)
    "balance-factor-e-missing": (
        "the factor E (num_experts) is missing: L = E * sum_e f_e * P_e, so that even "
        "routing gives k whatever E is"
    ),
    "balance-first-slot-only": (
        "f counts only each token's first choice (slot 0): f_e is the fraction of tokens "
        "that picked e in any of their k slots (sum_e f_e = k)"
    ),
    "balance-p-from-top-k": (
        "P keeps only the top-k probabilities: P_e is the mean over the tokens of the full "
        "softmax over all E experts"
    ),
    "balance-f-divided-by-k": (
        "f is divided by k (a fraction of the N*k assignments): f_e is the fraction of the "
        "N tokens that picked e, so sum_e f_e = k"
    ),
    "balance-sum-over-tokens": (
        "f or P is summed over the tokens: both are means over the N tokens (fractions and "
        "mean probabilities)"
    ),
    "balance-sums-for-means": (
        "f and P are both summed over the tokens, not averaged: the loss comes out N^2 times "
        "too large (N tokens); f_e is a fraction and P_e a mean, `.mean(dim=0)` for both"
    ),
    "balance-p-from-renormalised-top-k": (
        "P uses only the k chosen probabilities of each token, renormalised to sum 1 (the "
        "MoE layer's expert weights): P_e is the mean over the tokens of the full softmax "
        "over all E experts, nothing dropped, nothing renormalised"
    ),
    "balance-mean-over-experts": (
        "f and P are averaged over the experts (dim=-1): they are per-expert means over the "
        "tokens, dim=0, each of shape (E,)"
    ),
    "balance-logits-not-probabilities": (
        "P averages the raw logits: P_e is the mean router probability, softmax over the E "
        "logits first"
    ),
    "balance-p-for-f": (
        "f is replaced by P (E * sum_e P_e^2): f_e counts the tokens that picked e in their "
        "top-k, hard choices, while P_e is the mean probability"
    ),
    "balance-f-for-p": (
        "P is replaced by f (E * sum_e f_e^2): P_e is the mean router probability, which "
        "carries the gradient to the router"
    ),
    "balance-gets-no-gradient": (
        "no gradient reaches router_logits: P must stay in the graph (no `.detach()`, "
        "`.item()` or numpy); only f, the hard counts, carries none"
    ),
    # ---- linear attention (exercise 22)
    "linear-normaliser-missing": (
        "the normaliser is missing: phi(q_i)^T S_i is a weighted sum of the values that grows "
        "with the tokens seen; divide it by phi(q_i)^T z_i, z_i = sum_j phi(k_j)"
    ),
    "linear-state-updated-after-read": (
        "the output is read before the state is updated: token i must see itself (j <= i); "
        "add phi(k_i) v_i^T to S and phi(k_i) to z first, then read with phi(q_i) (reading "
        "first gives token 0 the ratio 0/0)"
    ),
    "linear-not-causal": (
        "with causal=True each position summed over every key, the future included: the "
        "running sums must hold only the keys j <= i when position i is read"
    ),
    "linear-normaliser-not-causal": (
        "the numerator is causal but the normaliser sums phi(k_j) over every key: z_i = "
        "sum_{j <= i} phi(k_j) grows with the state, step by step"
    ),
    "linear-feature-map-elu-without-one": (
        "phi is elu(x) without the +1: elu can be negative (down to -1), so the normaliser "
        "can be 0 or negative; phi(x) = elu(x) + 1 > 0"
    ),
    "linear-feature-map-missing": (
        "no feature map: q and k enter as they are; apply phi(x) = elu(x) + 1 to both (it "
        "keeps every weight phi(q).phi(k) positive)"
    ),
    "linear-feature-map-on-values": (
        "phi is applied to the values too: only the queries and keys go through "
        "phi(x) = elu(x) + 1; the values are summed as they are"
    ),
    "linear-scaled": (
        "the queries are scaled by 1/sqrt(Dk) before phi: linear attention (Katharopoulos "
        "et al., 2020) has no scale, phi(q) . phi(k) with phi = elu + 1 on the raw vectors"
    ),
    "linear-causal-flag-ignored": (
        "causal=False still gives causal sums: without the mask every position sees every "
        "key, S = sum over all j of phi(k_j) v_j^T (and z likewise), summed once"
    ),
    "linear-feature-map-other": (
        "the feature map is {name}, not phi(x) = elu(x) + 1: linear attention (Katharopoulos "
        "et al., 2020) uses elu(x) + 1 on the queries and the keys, and the check compares "
        "with that map"
    ),
    "linear-feature-map-queries-only": (
        "phi is applied to the queries only, the keys enter raw: the weight is "
        "phi(q_i) . phi(k_j), so apply phi(x) = elu(x) + 1 to the keys too (S and z sum "
        "phi(k_j))"
    ),
    "linear-feature-map-keys-only": (
        "phi is applied to the keys only, the queries enter raw: the weight is "
        "phi(q_i) . phi(k_j), so apply phi(x) = elu(x) + 1 to the queries too, in the "
        "numerator and the normaliser"
    ),
    "linear-scaled-output": (
        "the output is divided by sqrt(Dk): linear attention has no scale, the normaliser "
        "phi(q_i)^T z_i already makes the weights sum to 1"
    ),
    "linear-scaled-inside-phi": (
        "q and k are scaled by 1/sqrt(Dk) inside phi, phi(q / sqrt(Dk)): linear attention "
        "(Katharopoulos et al., 2020) has no scale; phi(x) = elu(x) + 1 on the raw vectors"
    ),
    "linear-default-not-causal": (
        "the default of `causal` must be True: called with causal=True your function gives "
        "the right values, left at its default it does not; keep the stub's signature, "
        "`def linear_attention(query, key, value, causal=True)`"
    ),
    # ---- the gated delta rule (exercise 22)
    "delta-decay-after-update": (
        "the decay is applied after the update, S_t = a_t (S_{t-1} + beta_t k_t (v_t - "
        "S_{t-1}^T k_t)^T): decay the old state first, S' = a_t S_{t-1}, then read S'^T k_t "
        "and write beta_t k_t (v_t - S'^T k_t)^T (the new value must not be decayed)"
    ),
    "delta-read-undecayed": (
        "the correction is read from the undecayed state, v_t - S_{t-1}^T k_t: read the "
        "decayed one, v_t - (a_t S_{t-1})^T k_t, the memory as it is when the write happens"
    ),
    "delta-beta-on-value-only": (
        "beta multiplies the new value only, k_t (beta_t v_t - (a_t S_{t-1})^T k_t)^T: beta_t "
        "scales the whole correction, beta_t k_t (v_t - (a_t S_{t-1})^T k_t)^T"
    ),
    "delta-beta-on-whole-update": (
        "beta multiplies the decayed state too, beta_t (a_t S_{t-1} + k_t (v_t - ...)^T): "
        "beta_t scales only the correction written, S_t = a_t S_{t-1} + beta_t k_t (v_t - "
        "(a_t S_{t-1})^T k_t)^T"
    ),
    "delta-beta-on-read-only": (
        "beta multiplies the read-back only, k_t (v_t - beta_t (a_t S_{t-1})^T k_t)^T: "
        "beta_t scales the whole correction, new value and read-back alike, "
        "beta_t k_t (v_t - (a_t S_{t-1})^T k_t)^T"
    ),
    "delta-read-term-missing": (
        "the read-back is missing, S_t = a_t S_{t-1} + beta_t k_t v_t^T (gated linear "
        "attention, not the delta rule): write the correction, beta_t k_t (v_t - "
        "(a_t S_{t-1})^T k_t)^T, what the memory lacks under k_t"
    ),
    "delta-decay-sign": (
        "the decay is exp(-g_t): g holds log-decays (g <= 0), so a_t = exp(g_t) is in "
        "(0, 1]; exp(-g_t) is above 1 and grows the state"
    ),
    "delta-one-minus-beta": (
        "(1 - beta_t) is used in place of beta_t: beta_t is the strength of the write "
        "itself, S_t = a_t S_{t-1} + beta_t k_t (v_t - (a_t S_{t-1})^T k_t)^T"
    ),
    "delta-beta-ignored": (
        "beta is not used: the correction written is beta_t k_t (v_t - (a_t S_{t-1})^T k_t)^T"
    ),
    "delta-decay-ignored": (
        "the decay is not applied: multiply the state by a_t = exp(g_t) at every step"
    ),
    "delta-g-used-as-decay": (
        "g is used as the decay itself: g holds log-decays (g <= 0), the state is "
        "multiplied by a_t = exp(g_t)"
    ),
    "delta-scale-missing": (
        "the 1/sqrt(Dk) scale of the output is missing: o_t = S_t^T q_t / sqrt(Dk)"
    ),
    "delta-output-before-update": (
        "the output is read before the update: o_t = S_t^T q_t / sqrt(Dk) reads the state "
        "after token t was written"
    ),
    "delta-initial-state-ignored": (
        "initial_state is ignored: when given, it is the state before the first token "
        "(zeros only when it is None)"
    ),
    "delta-state-transposed": (
        "the returned state is transposed, (B, H, Dv, Dk): return it as (B, H, Dk, Dv), the "
        "layout of initial_state (S^T k reads the value stored under k)"
    ),
    "delta-time-axis-wrong": (
        "the recurrence runs over the wrong axis: the inputs are (B, T, H, D), time is "
        "axis 1 (transpose to (B, H, T, D) first if you loop over axis 2)"
    ),
    "delta-qk-normalised": (
        "q and k are normalised inside the rule: the caller normalises them (Qwen3-Next's "
        "layer l2-normalises before calling it); use them as they are given"
    ),
    # ---- ring attention simulated on one process (exercise 23): the merge, then the ring
    "ring-merge-held-not-rescaled": (
        "the sums already held are not rescaled (the new maximum only): l_a and acc_a were "
        "measured against m_a, so multiply them by e^{m_a - m} as well as l_b, acc_b by "
        "e^{m_b - m}, m = max(m_a, m_b); without it the answer is wrong in every row whose "
        "maximum the other block raised"
    ),
    "ring-merge-incoming-not-rescaled": (
        "the incoming block's sums are not rescaled: l_b and acc_b were measured against "
        "m_b, so multiply them by e^{m_b - m}, m = max(m_a, m_b), as you do l_a and acc_a"
    ),
    "ring-merge-not-rescaled": (
        "the sums are not rescaled at all (l_a + l_b, acc_a + acc_b): each was measured "
        "against its own maximum, numbers in different units; multiply each by "
        "e^{m_own - m}, m = max(m_a, m_b), before adding"
    ),
    "ring-merge-sum-not-rescaled": (
        "l is not rescaled: you rescale acc_a and acc_b but add l_a + l_b as they are; "
        "l = e^{m_a - m} l_a + e^{m_b - m} l_b"
    ),
    "ring-merge-acc-not-rescaled": (
        "acc is not rescaled: you rescale l_a and l_b but add acc_a + acc_b as they are; "
        "acc = e^{m_a - m} acc_a + e^{m_b - m} acc_b (both sums, or acc / l is wrong)"
    ),
    "ring-merge-rescale-inverted": (
        "the rescaling factors are inverted: e^{m - m_a} instead of e^{m_a - m} (each "
        "factor is at most 1, since m is the larger maximum)"
    ),
    "ring-merge-divided": (
        "acc comes back divided by l: the merge returns the unnormalised sum acc, and the "
        "ring divides acc / l once, after the last block (dividing inside the merge "
        "divides twice)"
    ),
    "ring-merge-lse-for-max": (
        "m comes back as the row's log-sum-exp, log(e^{m_a} l_a + e^{m_b} l_b), with l = 1 "
        "and acc the normalised output: that is the (output, log-sum-exp) form of other "
        "ring codes; the chapter's state keeps m = max(m_a, m_b) and the unnormalised sums "
        "l and acc measured against it"
    ),
    "ring-merge-logsumexp-of-maxima": (
        "m is log(e^{m_a} + e^{m_b}), the log-sum-exp of the two maxima: the merged m is "
        "their maximum, max(m_a, m_b), and the sums are measured against it"
    ),
    "ring-merge-max-of-incoming": (
        "m is the incoming block's maximum m_b: the merged m is the larger of the two, "
        "max(m_a, m_b) (with m_b smaller, e^{m_a - m_b} overflows for scores far apart)"
    ),
    "ring-merge-empty-nan": (
        "a row empty in both states gives NaN: its m is -inf in both, and e^{-inf - (-inf)} "
        "is NaN; measure the exponents from 0 where m is -inf "
        "(`torch.where(torch.isneginf(m), 0, m)`), so that the row stays m = -inf, l = 0, "
        "acc = 0 (in a causal ring, a block wholly in a row's future is such a row)"
    ),
    "ring-merge-empty-max-zero": (
        "a row empty in both states comes back with m = 0: read -inf as 0 only for the "
        "exponents, and return m = max(m_a, m_b) = -inf (or the dtype's most negative "
        "number) with l = 0 and acc = 0"
    ),
    "ring-merge-normalised": (
        "the merged state comes back normalised, l = 1 and acc the output acc / l: the merge "
        "returns the unnormalised sums l and acc, measured against m = max(m_a, m_b), and "
        "the ring divides acc / l once, after the last block"
    ),
    "ring-merge-min-of-maxima": (
        "m is the smaller of the two maxima: the merged m is the larger, max(m_a, m_b), so "
        "that every factor e^{m_own - m} is at most 1 (with the smaller one they exceed 1 "
        "and overflow for scores far apart)"
    ),
    "ring-merge-held-maximum": (
        "m stays the held state's m_a: the merged m is max(m_a, m_b), so where the incoming "
        "block holds the larger score m must rise to m_b"
    ),
    "ring-merge-exponents-from-zero": (
        "the exponents are not measured from the maxima: the factors are e^{m_a - m} and "
        "e^{m_b - m}, not e^{m_a} and e^{m_b} (reading m as 0 is only for a row whose m "
        "is -inf; for scores near 1,000, e^{m_a} overflows)"
    ),
    "ring-merge-measured-from-held": (
        "l and acc are measured against m_a, not against the m you return: with "
        "m = max(m_a, m_b) the factors are e^{m_a - m} and e^{m_b - m}, both at most 1"
    ),
    "ring-own-block-skipped": (
        "each rank's own key/value block is skipped: at step t = 0 a rank holds its own "
        "block (positions rn .. rn + n - 1) and must score it first; over the W steps it "
        "sees the W blocks, each once"
    ),
    "ring-own-block-twice": (
        "each rank's own block is counted twice (merged at the start and again in the "
        "loop, or W + 1 steps): W steps, t = 0 .. W - 1, each block once"
    ),
    "ring-last-block-missing": (
        "the last block is never merged: the blocks are *passed* W - 1 times, but a rank "
        "scores W blocks (its own, then the W - 1 it receives); loop t = 0 .. W - 1"
    ),
    "ring-causal-ignored": (
        "causal=True is ignored: with the mask, rank r skips the blocks of later ranks "
        "(wholly in its queries' future) and masks its own block to a triangle, j <= i"
    ),
    "ring-block-source-reversed": (
        "the block a rank holds at step t is labelled (r + t) mod W, but blocks travel from "
        "rank r - 1 to rank r: at step t rank r holds the block of rank (r - t) mod W, and "
        "the mask's offsets must come from that rank (at W = 2 the two agree, from W = 3 "
        "they do not)"
    ),
    "ring-mask-local-positions": (
        "the causal mask compares positions inside the block (i and j) instead of the "
        "sequence positions (rn + i against sn + j, s the rank whose block it is): every "
        "block gets a triangle, but a block from an earlier rank is wholly in the past and "
        "is seen whole"
    ),
    "ring-future-blocks-unmasked": (
        "the blocks of later ranks are scored without a mask: they lie wholly in the "
        "queries' future, so skip them (or mask them fully, which merges an empty block "
        "and costs the same work for nothing)"
    ),
    "ring-diagonal-unmasked": (
        "the rank's own block is not masked: in it query i sees key j only when j <= i "
        "(the same positions), a triangle with its diagonal"
    ),
    "ring-diagonal-plus-one": (
        "the rank's own block is masked with one diagonal too many (`tril(1)`, or j <= i + 1): "
        "query i sees key i + 1, one position of its future; the triangle is j <= i, "
        "`tril()` with its diagonal"
    ),
    "ring-earlier-blocks-skipped": (
        "the blocks of earlier ranks are skipped and the later ones kept: the blocks of "
        "ranks s < r lie wholly in the queries' past and are seen whole; those of later "
        "ranks, s > r, lie in the future and are skipped"
    ),
    "ring-mask-from-step": (
        "the causal mask's key positions come from the step t (tn + j) instead of the rank "
        "whose block it is, s = (r - t) mod W (sn + j): the block a rank holds at step t "
        "is rank s's"
    ),
    "ring-causal-always": (
        "the output is causal although causal=False: without the flag every query sees all "
        "T keys, every block whole and none skipped"
    ),
    "ring-scale-dv": (
        "the scores are scaled by 1/sqrt(Dv), the value width: the scale is 1/sqrt(Dk), the "
        "width of the queries and keys (`q.shape[-1]`)"
    ),
    "ring-outputs-reversed": (
        "the output shards come back in the wrong order: return [rank 0's, rank 1's, ...], "
        "each rank's output for its own queries, in the order of the query shards"
    ),
    "ring-blocks-normalised": (
        "each block's acc is divided by its l before the merge: a block's partial result "
        "is the unnormalised (m, l, acc), and the ring divides acc / l once, after the last "
        "block (the merge weighs the blocks by their sums l)"
    ),
    "ring-holds-more-than-a-tile": (
        "your code creates a tensor of {elements} elements ({shape}, made by {op}), more "
        "than the {limit} of the whole inputs or one rank's n x n tile of scores (times the "
        "head width): a simulated rank scores one block at a time and merges it, never its "
        "row of T scores, the T x T scores or all ranks at once"
    ),
}
"""Every mistake by id: its message, a ``str.format`` template where it has ``{fields}``."""


def says(mistake: str, **fields) -> str:
    """The message of ``mistake`` (an id of `MISTAKES`), its ``{fields}`` filled in."""
    text = MISTAKES[mistake]
    return text.format(**fields) if fields else text


def _pattern(template: str) -> re.Pattern:
    parts = re.split(r"\{[^{}]*\}", template)
    return re.compile(".+?".join(re.escape(part) for part in parts) + r"\Z", re.DOTALL)


_BY_MESSAGE = {text: key for key, text in MISTAKES.items() if "{" not in text}
_TEMPLATES = [(key, _pattern(text)) for key, text in MISTAKES.items() if "{" in text]
_NAMED = re.compile(r"^Likely mistake(?: \(.*?\))?: (.+)\.$", re.MULTILINE)


def mistake_id(message: str) -> str | None:
    """The id whose message (or filled-in template) is exactly ``message``; None if none."""
    if message in _BY_MESSAGE:
        return _BY_MESSAGE[message]
    for key, pattern in _TEMPLATES:
        if pattern.match(message):
            return key
    return None


def mistake_in(report_message: str) -> str | None:
    """The id of the mistake a case's message names on its ``Likely mistake: ...`` line,
    or None when it names none or one that is not in the table."""
    for named in _NAMED.findall(report_message):
        found = mistake_id(named)
        if found is not None:
            return found
    return None
