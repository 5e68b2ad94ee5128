"""Hints in three tiers for a failing check: the concept, the chapter, what to change.

``report.hint(1)`` gives the concept behind the target (written here per checker),
``report.hint(2)`` the chapter that teaches it (``book/NN_name.ipynb``, and its page
``book/NN_name.html`` in the built book), ``report.hint(3)`` what to change: the
mistake the checker named ("Likely mistake: ...", "Hint: ...") or, for a mistake with
hand-written tiers in `EXPLICIT`, the text written for it.
"""

from __future__ import annotations

import re

from ._registry import REGISTRY

# Tier 1 per checker target: the idea the task is about, in one or two sentences.
CONCEPTS: dict[str, str] = {
    "soft_argmax": "Soft-argmax is a softmax of beta * scores: exponentiate (after subtracting "
    "the maximum, for stability) and divide by the sum along `dim`, so the result is "
    "positive and sums to 1 there.",
    "set_attention": "Attention over a set: each query's weights are the soft-argmax of its "
    "scores against every element, and the output is the weighted average of the values.",
    "additive_attention": "Additive (Bahdanau) attention scores a query and a key with a small "
    "network, v^T tanh(W_q q + W_k k), then takes a masked softmax over the keys.",
    "scaled_dot_product_attention": "Attention weights are softmax(Q K^T / sqrt(d_k)) over the "
    "keys (the last axis), with masked positions excluded before the softmax; the output is "
    "weights @ V.",
    "causal_mask": "A causal mask lets position t attend to positions 0..t only: True on and "
    "below the diagonal, with True meaning 'may attend'.",
    "padding_mask": "A padding mask marks the real tokens of each sequence, True for "
    "positions before its length, so attention ignores the padding.",
    "split_heads": "Splitting heads reshapes (B, T, D) to (B, T, H, Dh) and moves the head "
    "axis forward to (B, H, T, Dh), so each head attends independently.",
    "merge_heads": "Merging heads undoes the split: (B, H, T, Dh) back to (B, T, H, Dh), then "
    "concatenate the heads into (B, T, D).",
    "multi_head_attention": "Multi-head attention projects queries, keys and values, splits "
    "them into heads, runs scaled dot-product attention per head, merges the heads and "
    "applies the output projection w_o.",
    "layer_norm": "LayerNorm normalises each position over its features (the trailing "
    "normalized_shape axes) with the biased variance and eps inside the square root, then "
    "scales and shifts.",
    "batch_norm": "BatchNorm normalises each feature over the batch: batch statistics in "
    "training (updating the running averages with the unbiased variance), running statistics "
    "in eval mode.",
    "positionwise_feed_forward": "The position-wise feed-forward network applies the same "
    "two-layer MLP, Linear -> activation -> dropout -> Linear, to every position.",
    "sinusoidal_positional_encoding": "Sinusoidal encodings use sin on even and cos on odd "
    "features, at frequencies 1 / 10000^(2i / d_model).",
    "encoder_layer": "An encoder layer is self-attention then feed-forward, each wrapped in a "
    "residual connection and a LayerNorm (after the sum, or before the sublayer with "
    "norm_first).",
    "decoder_layer": "A decoder layer is masked self-attention, cross-attention to the "
    "encoder's memory, then feed-forward, each with a residual connection and a LayerNorm.",
    "filter_logits": "Top-k keeps the k largest logits; top-p keeps the smallest set of most "
    "likely tokens whose probability reaches p; the rest become -inf.",
    "causal_self_attention": "Causal self-attention is multi-head attention of a sequence on "
    "itself where token t sees tokens 0..t only.",
    "attention_rollout": "Attention rollout multiplies, layer by layer, the attention matrices "
    "with the identity added for the residual path and rows renormalised.",
    "apply_rope": "RoPE rotates each feature pair (i, i + Dh/2) of a query or key at position "
    "p by the angle p * base^(-2i/Dh), so that a query-key score depends only on the offset.",
    "alibi_slopes": "ALiBi gives head h the slope 2^(-8(h+1)/H) for H a power of 2; otherwise "
    "the slopes of the nearest smaller power of 2, then every other slope of the next one.",
    "online_softmax_update": "The online softmax keeps, per query, a running maximum m and "
    "running sums l of e^{s - m} and acc of e^{s - m} v; a block that raises the maximum to m' "
    "rescales both old sums by e^{m - m'} before its own terms, e^{s - m'}, are added.",
    "tiled_attention_loop": "Tiled attention loops over blocks of queries and, inside, blocks "
    "of keys, folding each block_q x block_k tile of scores into the online softmax's state; "
    "the output acc / l is divided once, after the last block, and no T x S matrix exists.",
    "repeat_kv": "Grouped-query attention shares each key/value head among n_rep neighbouring "
    "query heads: output head h is input head h // n_rep (repeat_interleave along the heads).",
    "sliding_window_mask": "A sliding window lets token i see itself and the window - 1 tokens "
    "before it: True where 0 <= i - j < window.",
    "alibi_bias": "ALiBi adds to each score minus the head's slope times how far back the key "
    "lies from the query (the queries are the last T of S positions); keys after the query "
    "get -inf.",
    "rolling_update": "A rolling buffer of W slots stores position p in slot p % W, "
    "overwriting the position W older, and records which position each slot holds; read "
    "back, the kept positions come oldest first.",
    "generate": "Generation with a KV cache reads the prompt once, then feeds only each new "
    "token, at the next absolute position; the temperature divides the logits before the "
    "softmax.",
    "rms_norm": "RMSNorm divides each vector by the root of its mean square over the trailing "
    "normalized_shape axes, with eps inside the root, and multiplies by a gain; no mean is "
    "subtracted and there is no bias.",
    "swiglu": "SwiGLU multiplies a SiLU-gated projection w1(x) with a linear one w3(x) and "
    "projects back with w2: w2(silu(w1(x)) * w3(x)).",
    "induction_scores": "On a sequence that repeats with a period, an induction head at "
    "position i attends to i - period + 1, the token after the previous occurrence of the "
    "current one; the score is the mean weight there over i >= period and the batch.",
    "find_induction_head": "Compute every head's induction score on the model's own "
    "attention weights for a repeated sequence, and return the (layer, head) with the "
    "highest score, both counted from 0.",
    "ablation_effect": "Ablating a head means zeroing its output (its columns of w_o) and "
    "measuring the second-half loss again; the effect is the loss after minus the loss "
    "before, with its sign, and the weights restored afterwards.",
    "mla_absorbed_attention": "Absorbed MLA folds each head's W_UK into its query "
    "(q_nope @ W_UK_h, kv_rank numbers), scores it against the cached latent plus the rotated "
    "q_rope against the shared k_rope, scales by (d_nope + d_rope)^-1/2, and applies W_UV "
    "after the weighted sum of latents.",
    "multi_head_latent_attention": "MLA caches a normalised low-rank latent and one shared "
    "rotary key per token; each head's keys and values are up-projected from the latent "
    "(naive) or W_UK is folded into the queries and W_UV applied after the weighted sum "
    "(absorbed), with RoPE only on the d_rope parts and the scale (d_nope + d_rope)^-1/2.",
    "kv_cache_bytes": "Per token and layer the cache holds 2 Hkv Dh numbers for MHA, GQA and "
    "MQA (Hkv = H, the key/value heads, 1), and kv_rank + d_rope for MLA; times layers, "
    "tokens, batch and bytes per number.",
    "rope_frequencies": "Linear scaling divides every RoPE frequency by s, NTK-aware scaling "
    "raises the base to base * s^(d/(d-2)), YaRN keeps the high frequencies, divides the low "
    "ones by s and ramps linearly between floor(low) and ceil(high), with factor 0.1 ln s + 1.",
    "scaled_rope_scores": "Scaled RoPE multiplies cos and sin by the attention factor, for "
    "queries and keys alike, so the scores carry the factor squared; the queries sit at the "
    "last T of the S positions.",
    "streaming_mask": "StreamingLLM keeps the first num_sink tokens and a window: query i "
    "sees key j when j <= i and (j < num_sink or i - j < window).",
    "sink_attention": "A learned sink is one more logit in each row's softmax (one per head); "
    "after the softmax its column is dropped, so the weights sum to less than 1.",
    "qk_norm_attention": "QK-norm (Qwen3) divides each head's query and key by their root "
    "mean square over Dh, times their own gains, before RoPE rotates them; the scores keep "
    "their 1/sqrt(Dh) scale and the causal mask.",
    "softcap_attention": "Soft-capping (Gemma 2) maps each scaled score s to cap * tanh(s / "
    "cap) before the mask and the softmax: small scores pass almost unchanged, large ones "
    "stay inside (-cap, cap).",
    "moe": "A mixture of experts takes, for each token, the softmax over the E router logits, "
    "keeps the k largest probabilities, renormalises them to sum 1, and adds the k experts' "
    "outputs with those weights (plus the shared experts with weight 1).",
    "load_balancing_loss": "The balancing loss is E * sum_e f_e P_e: f_e the fraction of "
    "tokens with e among their top-k choices, P_e the mean router probability of e over the "
    "tokens.",
    "linear_attention": "Linear attention replaces exp(q . k) by phi(q) . phi(k), phi = elu + 1: "
    "with the running state S_i = sum_{j<=i} phi(k_j) v_j^T and normaliser z_i = sum_{j<=i} "
    "phi(k_j), out_i = phi(q_i)^T S_i / phi(q_i)^T z_i, token i included; not causal, the sums "
    "run over every key.",
    "gated_delta_rule": "The gated delta rule decays the state, then writes only the correction: "
    "S_t = a_t S_{t-1} + beta_t k_t (v_t - a_t S_{t-1}^T k_t)^T with a_t = e^{g_t}, and reads "
    "o_t = S_t^T q_t / sqrt(Dk) after the update.",
    "merge_partials": "Two partial states (m, l, acc), each measured against its own maximum, "
    "merge against the larger one, m = max(m_a, m_b): l = e^{m_a - m} l_a + e^{m_b - m} l_b, "
    "acc the same way; the output is acc / l.",
    "simulated_ring_attention": "In ring attention each rank keeps its query shard while the "
    "key/value shards travel around the ring: at each of the W steps a rank scores one block "
    "(masked by global positions when causal, later blocks skipped) and merges it into its "
    "running (m, l, acc) state; at the end it divides acc by l.",
}

# Mistakes with hand-written tiers: (a regular expression on the named mistake, the
# targets it is written for (None: any), concept, what to change). Tier 2 is always the
# chapter. A pattern applies only to its targets: "swapped" names sin and cos in the
# sinusoidal encoding, but also weight and bias in LayerNorm, norm1 and norm2, (layer,
# head); "unbiased" is LayerNorm's mistake, and BatchNorm's running_var *should* use the
# unbiased variance; "dim=-2" is a softmax over the queries in attention and the token
# axis in LayerNorm (a simulated student's feedback gave those the sines hint and the
# "divide by the biased variance" hint).
_NORMS = frozenset({"layer_norm", "batch_norm", "rms_norm"})
_ATTENTION = frozenset(
    {
        "soft_argmax",
        "set_attention",
        "scaled_dot_product_attention",
        "additive_attention",
        "multi_head_attention",
        "causal_self_attention",
        "encoder_layer",
        "decoder_layer",
        "online_softmax_update",
        "tiled_attention_loop",
    }
)
EXPLICIT: list[tuple[str, frozenset[str] | None, str, str]] = [
    (
        r"sqrt\(d_k\)|√d_k",
        _ATTENTION,
        "Without the 1/sqrt(d_k) scale, the dot products grow with d_k and the softmax "
        "saturates: nearly one-hot weights and vanishing gradients.",
        "Multiply the scores Q K^T by `scale`, which defaults to 1 / sqrt(d_k) with "
        "d_k = query.size(-1).",
    ),
    (
        r"softmax over the (wrong|query|first)|dim=-2|over the queries",
        _ATTENTION,
        "Each query distributes its attention over the keys, so the weights of one query "
        "(one row) must sum to 1.",
        "Take the softmax along the last axis, the keys: `scores.softmax(dim=-1)`.",
    ),
    (
        r"unbiased",
        frozenset({"layer_norm"}),
        "Normalisation layers divide by the biased variance (mean of squared deviations, "
        "divide by N), as the papers and PyTorch do.",
        "Use `((x - mean) ** 2).mean(...)` or `x.var(..., unbiased=False)`.",
    ),
    (
        r"normalised with the unbiased variance",
        frozenset({"batch_norm"}),
        "In training, BatchNorm normalises with the biased batch variance (divide by N); "
        "only the running_var it keeps for eval mode uses the unbiased one (N - 1).",
        "Normalise with `((x - mean) ** 2).mean(dims)`; update running_var with that "
        "variance times N / (N - 1).",
    ),
    (
        r"sin and cos|cos and sin|swapped",
        frozenset({"sinusoidal_positional_encoding"}),
        "The even features carry sines and the odd features cosines of the same frequency.",
        "Write `pe[:, 0::2] = torch.sin(angles)` and `pe[:, 1::2] = torch.cos(angles)`.",
    ),
    (
        r"eps is missing",
        _NORMS,
        "eps keeps the division finite when a variance is zero; it goes inside the square root.",
        "Divide by `torch.sqrt(var + eps)`, not `torch.sqrt(var) + eps` or `torch.sqrt(var)`.",
    ),
]


def _explicit(target: str, named: str):
    """The hand-written tiers for the mistake ``named`` of ``target``, or None."""
    for pattern, targets, concept, change in EXPLICIT:
        if (
            named
            and (targets is None or target in targets)
            and re.search(pattern, named, re.IGNORECASE)
        ):
            return concept, change
    return None


def _named(message: str) -> str:
    """The mistake or hint lines of a case message (tier 3's material)."""
    lines = [
        line.strip()
        for line in message.splitlines()
        if line.strip().startswith(("Likely mistake:", "Hint:"))
    ]
    return "\n".join(lines)


def chapter_of(target: str) -> str | None:
    """``"04_scaled_dot_product"`` for ``"scaled_dot_product_attention"``: the chapter that
    teaches the target (the chapters and exercises share their names), from the registry."""
    for checker in REGISTRY:
        if checker.target == target:
            return getattr(checker.check, "chapter", None) or checker.exercise
    return None


def hint(target: str, message: str, tier: int) -> str:
    """The ``tier`` (1, 2 or 3) hint for a failing case of ``check_<target>`` whose message
    is ``message``."""
    if tier not in (1, 2, 3):
        raise ValueError(f"tier: got {tier!r}, expected 1, 2 or 3")
    named = _named(message)
    explicit = _explicit(target, named)
    if tier == 1:
        if explicit:
            return explicit[0]
        return CONCEPTS.get(target, f"Re-read what `{target}` computes in its chapter.")
    if tier == 2:
        chapter = chapter_of(target)
        if chapter is None:
            return f"The chapter that introduces `{target}` (see the book's contents)."
        return (
            f"Chapter {chapter.replace('_', ' ', 1)}: book/{chapter}.ipynb "
            f"(in the built book: book/{chapter}.html)"
        )
    if explicit:
        return explicit[1] + (f"\n{named}" if named else "")
    if named:
        return named
    first = message.strip().splitlines()
    return first[0] if first else "Compare your code with the formula in the chapter."
