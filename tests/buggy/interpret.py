"""Buggy attention rollouts (attention_rollout, chapter 17)."""

import torch


def _layer(w):
    a = w.mean(dim=1) + torch.eye(w.shape[-1], dtype=w.dtype)
    return a / a.sum(dim=-1, keepdim=True)


def rollout_no_identity(attentions):
    """Forgets the residual connection: multiplies the head means without adding I."""
    result = attentions[0].mean(dim=1)
    for w in attentions[1:]:
        result = w.mean(dim=1) @ result
    return result


def rollout_no_renormalisation(attentions):
    """Adds the identity but never divides by the row sums (rows sum to 2**L)."""
    eye = torch.eye(attentions[0].shape[-1], dtype=attentions[0].dtype)
    result = attentions[0].mean(dim=1) + eye
    for w in attentions[1:]:
        result = (w.mean(dim=1) + eye) @ result
    return result


def rollout_wrong_order(attentions):
    """Multiplies first layer last: A_1 @ A_2 @ ... @ A_L."""
    result = _layer(attentions[0])
    for w in attentions[1:]:
        result = result @ _layer(w)
    return result


def rollout_max_over_heads(attentions):
    """Fuses the heads with a max instead of the mean."""
    result = None
    for w in attentions:
        a = w.amax(dim=1) + torch.eye(w.shape[-1], dtype=w.dtype)
        a = a / a.sum(dim=-1, keepdim=True)
        result = a if result is None else a @ result
    return result


def rollout_column_renormalisation(attentions):
    """Renormalises the columns (dim=-2) instead of the rows."""
    result = None
    for w in attentions:
        a = w.mean(dim=1) + torch.eye(w.shape[-1], dtype=w.dtype)
        a = a / a.sum(dim=-2, keepdim=True)
        result = a if result is None else a @ result
    return result


def rollout_last_layer_only(attentions):
    """Overwrites instead of multiplying: returns the last layer's matrix alone."""
    result = None
    for w in attentions:
        result = _layer(w)
    return result


def rollout_float32(attentions):
    """Builds the identity in the default float32 and casts the result: float64 inputs
    come back as float32."""
    result = None
    for w in attentions:
        a = w.float().mean(dim=1) + torch.eye(w.shape[-1])
        a = a / a.sum(dim=-1, keepdim=True)
        result = a if result is None else a @ result
    return result


def rollout_in_place(attentions):
    """Adds the identity in place to the caller's weights (`w += eye`)."""
    result = None
    for w in attentions:
        w += torch.eye(w.shape[-1], dtype=w.dtype) / w.shape[1]
        a = w.mean(dim=1)
        a = a / a.sum(dim=-1, keepdim=True)
        result = a if result is None else a @ result
    return result


def rollout_transposed(attentions):
    """Returns R transposed: columns, not rows, are the distributions over inputs."""
    result = None
    for w in attentions:
        result = _layer(w) if result is None else _layer(w) @ result
    return result.transpose(-2, -1)


def rollout_first_layer_heads(attentions):
    """Divides every layer's head sum by the first layer's number of heads."""
    H = attentions[0].shape[1]
    result = None
    for w in attentions:
        a = w.sum(dim=1) / H + torch.eye(w.shape[-1], dtype=w.dtype)
        a = a / a.sum(dim=-1, keepdim=True)
        result = a if result is None else a @ result
    return result


CATALOGUE = [
    ("attention_rollout", "transposed", rollout_transposed, "your rollout is transposed"),
    (
        "attention_rollout",
        "first layer's head count",
        rollout_first_layer_heads,
        "its own number of heads",
    ),
    ("attention_rollout", "no identity", rollout_no_identity, "forgets the identity"),
    (
        "attention_rollout",
        "no renormalisation",
        rollout_no_renormalisation,
        "rows sum to 2, not 1",
    ),
    ("attention_rollout", "wrong order", rollout_wrong_order, "multiplies in the wrong order"),
    (
        "attention_rollout",
        "max over heads",
        rollout_max_over_heads,
        "takes the max over heads instead of the mean",
    ),
    (
        "attention_rollout",
        "column renormalisation",
        rollout_column_renormalisation,
        "renormalises the columns, not the rows",
    ),
    (
        "attention_rollout",
        "last layer only",
        rollout_last_layer_only,
        "returns only the last layer's matrix",
    ),
    ("attention_rollout", "float32", rollout_float32, "expected dtype torch.float64"),
    ("attention_rollout", "in place", rollout_in_place, "changed attentions[0] in place"),
]


# ---- chapter 17 (H17): induction_scores, find_induction_head, ablation_effect ----


def induction_off_by_one(weights, period):
    """Reads w[i, i - period], the previous occurrence itself (a duplicate-token head)."""
    return torch.diagonal(weights, offset=-period, dim1=-2, dim2=-1).mean(dim=(0, 2))


def induction_keeps_first_query(weights, period):
    """Includes the query i = period - 1, whose token has not occurred before."""
    return torch.diagonal(weights, offset=-(period - 1), dim1=-2, dim2=-1).mean(dim=(0, 2))


def induction_over_all_queries(weights, period):
    """Divides by T: queries without an earlier occurrence count as zeros."""
    d = torch.diagonal(weights, offset=-(period - 1), dim1=-2, dim2=-1)[..., 1:]
    return d.sum(dim=2).mean(dim=0) / weights.shape[-1]


def induction_sum(weights, period):
    """Sums over the query positions instead of averaging."""
    d = torch.diagonal(weights, offset=-(period - 1), dim1=-2, dim2=-1)[..., 1:]
    return d.sum(dim=2).mean(dim=0)


def induction_transposed(weights, period):
    """Reads w[i - period + 1, i]: keys as rows (zero above the diagonal of causal weights)."""
    return torch.diagonal(weights, offset=period - 1, dim1=-2, dim2=-1)[..., :-1].mean(dim=(0, 2))


def _layer_scores(model, ids, offset, skip):
    with torch.no_grad():
        _, weights = model(ids, return_attention=True)
    return torch.stack(
        [
            torch.diagonal(w, offset=-offset, dim1=-2, dim2=-1)[..., skip:].mean(dim=(0, 2))
            for w in weights
        ]
    )


def find_previous_token_head(model, ids, period):
    """Returns the head with the most weight on i - 1 (the partner, not the induction head)."""
    scores = _layer_scores(model, ids, 1, 0)
    return divmod(int(scores.argmax()), scores.shape[1])


def find_off_by_one(model, ids, period):
    """Scores heads on i - period instead of i - period + 1."""
    scores = _layer_scores(model, ids, period, 0)
    return divmod(int(scores.argmax()), scores.shape[1])


def find_one_based(model, ids, period):
    """Counts layers from 1."""
    scores = _layer_scores(model, ids, period - 1, 1)
    layer, head = divmod(int(scores.argmax()), scores.shape[1])
    return layer + 1, head


def find_hard_coded(model, ids, period):
    """The answer read off chapter 17's figure, fixed in advance."""
    return (1, 0)


def find_argmin(model, ids, period):
    """Takes the argmin of the induction scores."""
    scores = _layer_scores(model, ids, period - 1, 1)
    return divmod(int(scores.argmin()), scores.shape[1])


def find_divmod_by_layers(model, ids, period):
    """Unflattens the (L, H) argmax with the number of layers instead of heads."""
    scores = _layer_scores(model, ids, period - 1, 1)
    return divmod(int(scores.argmax()), scores.shape[0])


def _second_half(model, ids, period, start=None):
    logits = model(ids)
    V = logits.shape[-1]
    start = period if start is None else start
    return torch.nn.functional.cross_entropy(
        logits[:, start:-1].reshape(-1, V), ids[:, start + 1 :].reshape(-1)
    ).item()


def _zero_columns(model, layer, head):
    w = model.blocks[layer].attn.w_o.weight
    Dh = model.d_model // model.num_heads
    w.data[:, head * Dh : (head + 1) * Dh] = 0.0


@torch.no_grad()
def ablation_reversed(model, ids, period, layer, head):
    """Returns before - after."""
    before = _second_half(model, ids, period)
    saved = model.blocks[layer].attn.w_o.weight.data.clone()
    _zero_columns(model, layer, head)
    after = _second_half(model, ids, period)
    model.blocks[layer].attn.w_o.weight.data.copy_(saved)
    return before - after


@torch.no_grad()
def ablation_not_restored(model, ids, period, layer, head):
    """Zeroes the head and never puts the weights back."""
    before = _second_half(model, ids, period)
    _zero_columns(model, layer, head)
    return _second_half(model, ids, period) - before


@torch.no_grad()
def ablation_from_period_minus_one(model, ids, period, layer, head):
    """Includes the prediction of token `period`, which nothing can predict."""
    before = _second_half(model, ids, period, start=period - 1)
    saved = model.blocks[layer].attn.w_o.weight.data.clone()
    _zero_columns(model, layer, head)
    after = _second_half(model, ids, period, start=period - 1)
    model.blocks[layer].attn.w_o.weight.data.copy_(saved)
    return after - before


@torch.no_grad()
def ablation_rows(model, ids, period, layer, head):
    """Zeroes rows of w_o (output features) instead of the columns that read the head."""
    before = _second_half(model, ids, period)
    w = model.blocks[layer].attn.w_o.weight
    saved = w.data.clone()
    Dh = model.d_model // model.num_heads
    w.data[head * Dh : (head + 1) * Dh] = 0.0
    after = _second_half(model, ids, period)
    w.data.copy_(saved)
    return after - before


@torch.no_grad()
def ablation_whole_layer(model, ids, period, layer, head):
    """Zeroes every head of the layer."""
    before = _second_half(model, ids, period)
    w = model.blocks[layer].attn.w_o.weight
    saved = w.data.clone()
    w.data.zero_()
    after = _second_half(model, ids, period)
    w.data.copy_(saved)
    return after - before


@torch.no_grad()
def ablation_abs(model, ids, period, layer, head):
    """Returns abs(after - before): right whenever the head helps, wrong when it hurts."""
    before = _second_half(model, ids, period)
    saved = model.blocks[layer].attn.w_o.weight.data.clone()
    _zero_columns(model, layer, head)
    after = _second_half(model, ids, period)
    model.blocks[layer].attn.w_o.weight.data.copy_(saved)
    return abs(after - before)


@torch.no_grad()
def ablation_in_bits(model, ids, period, layer, head):
    """Divides the change by ln 2 (bits, not nats)."""
    import math

    before = _second_half(model, ids, period)
    saved = model.blocks[layer].attn.w_o.weight.data.clone()
    _zero_columns(model, layer, head)
    after = _second_half(model, ids, period)
    model.blocks[layer].attn.w_o.weight.data.copy_(saved)
    return (after - before) / math.log(2)


@torch.no_grad()
def ablation_layer_below(model, ids, period, layer, head):
    """Thinks 1-based: ablates model.blocks[layer - 1]."""
    before = _second_half(model, ids, period)
    saved = model.blocks[layer - 1].attn.w_o.weight.data.clone()
    _zero_columns(model, layer - 1, head)
    after = _second_half(model, ids, period)
    model.blocks[layer - 1].attn.w_o.weight.data.copy_(saved)
    return after - before


def find_fixed_period(model, ids, period):
    """Scores with the notebook's PERIOD = 16 whatever `period` says."""
    scores = _layer_scores(model, ids, 15, 1)
    return divmod(int(scores.argmax()), scores.shape[1])


CATALOGUE += [
    ("ablation_effect", "bits", ablation_in_bits, "your change is in bits"),
    ("ablation_effect", "layer below", ablation_layer_below, "layers are 0-based"),
    ("find_induction_head", "fixed period", find_fixed_period, "the one for period 16"),
    ("induction_scores", "off by one", induction_off_by_one, "not the token after it"),
    (
        "induction_scores",
        "first query",
        induction_keeps_first_query,
        "includes the query i = period - 1",
    ),
    ("induction_scores", "all queries", induction_over_all_queries, "averages over all T query"),
    ("induction_scores", "sum", induction_sum, "sums over the positions"),
    ("induction_scores", "transposed", induction_transposed, "reads the transposed entries"),
    ("find_induction_head", "previous-token head", find_previous_token_head, "previous-token head"),
    ("find_induction_head", "off by one", find_off_by_one, "off by one"),
    ("find_induction_head", "1-based layer", find_one_based, "layers are 0-based"),
    ("find_induction_head", "hard-coded", find_hard_coded, "an answer fixed in advance"),
    ("find_induction_head", "argmin", find_argmin, "the *lowest* induction score"),
    (
        "find_induction_head",
        "divmod by layers",
        find_divmod_by_layers,
        "`divmod(index, num_heads)` gives (layer, head)",
    ),
    ("ablation_effect", "abs of the change", ablation_abs, "no abs()"),
    ("ablation_effect", "reversed sign", ablation_reversed, "the sign is reversed"),
    ("ablation_effect", "not restored", ablation_not_restored, "left the model changed"),
    (
        "ablation_effect",
        "from period - 1",
        ablation_from_period_minus_one,
        "includes the prediction of token `period`",
    ),
    ("ablation_effect", "rows of w_o", ablation_rows, "not its columns"),
    ("ablation_effect", "whole layer", ablation_whole_layer, "you ablated every head of the layer"),
]


def find_last_layer_only(model, ids, period):
    """Scores only the last layer's heads (`weights[-1]`): right whenever the best head is
    in the last layer."""
    with torch.no_grad():
        _, weights = model(ids, return_attention=True)
    scores = torch.diagonal(weights[-1], offset=-(period - 1), dim1=-2, dim2=-1)[..., 1:]
    return len(weights) - 1, int(scores.mean(dim=(0, 2)).argmax())


def find_layer_one_only(model, ids, period):
    """Scores only `weights[1]`, the layer where chapter 17's induction heads are."""
    with torch.no_grad():
        _, weights = model(ids, return_attention=True)
    scores = torch.diagonal(weights[1], offset=-(period - 1), dim1=-2, dim2=-1)[..., 1:]
    return 1, int(scores.mean(dim=(0, 2)).argmax())


CATALOGUE += [
    ("find_induction_head", "last layer only", find_last_layer_only, "you scanned only the last"),
    ("find_induction_head", "layer 1 only", find_layer_one_only, "you scanned only layer 1"),
]


# ---- exercise 17, student report s17: wrong return types, logic errors, generic hints ----


def induction_plus_two(weights, period):
    """Reads w[i, i - period + 2], one position too far (0 on a perfect induction head, as
    the read of i - period is)."""
    d = torch.diagonal(weights, offset=-(period - 2), dim1=-2, dim2=-1)
    return d[..., 2:].mean(dim=(0, 2))


def _find_scores(model, ids, period):
    with torch.no_grad():
        _, weights = model(ids, return_attention=True)
    return torch.stack(
        [
            torch.diagonal(w, offset=-(period - 1), dim1=-2, dim2=-1)[..., 1:].mean(dim=(0, 2))
            for w in weights
        ]
    )


def find_best_mean_layer(model, ids, period):
    """Picks the layer with the best mean induction score, then that layer's best head."""
    scores = _find_scores(model, ids, period)
    layer = int(scores.mean(dim=1).argmax())
    return layer, int(scores[layer].argmax())


def find_four_heads(model, ids, period):
    """Unflattens the argmax with a hard-coded 4 heads per layer."""
    return divmod(int(_find_scores(model, ids, period).argmax()), 4)


def find_fully_one_based(model, ids, period):
    """Counts both layers and heads from 1."""
    layer, head = divmod(int(_find_scores(model, ids, period).argmax()), model.num_heads)
    return layer + 1, head + 1


def find_flat_index_as_head(model, ids, period):
    """Returns the flat index of the (L, H) argmax as the head of layer 0."""
    return 0, int(_find_scores(model, ids, period).argmax())


def find_first_two_layers(model, ids, period):
    """Scans a fixed range(2) of layers (right on the two-layer model)."""
    scores = _find_scores(model, ids, period)[:2]
    return divmod(int(scores.argmax()), scores.shape[1])


def find_bools(model, ids, period):
    """Returns (layer == 1, head == 0): truth values instead of indices."""
    layer, head = divmod(int(_find_scores(model, ids, period).argmax()), model.num_heads)
    return layer == 1, head == 0


def find_first_sequence(model, ids, period):
    """Scores the first sequence of the batch only."""
    return divmod(int(_find_scores(model, ids[:1], period).argmax()), model.num_heads)


@torch.no_grad()
def _effect(model, ids, period, pairs):
    from attention_course.interpret import ablate_heads, second_half_loss

    before = second_half_loss(model, ids, period).item()
    with ablate_heads(model, pairs):
        after = second_half_loss(model, ids, period).item()
    return after - before


def ablation_as_string(model, ids, period, layer, head):
    """Returns the difference as text, str(x)."""
    return str(_effect(model, ids, period, [(layer, head)]))


def ablation_shape_one_tensor(model, ids, period, layer, head):
    """Returns a tensor of shape (1,) instead of a number."""
    return torch.tensor([_effect(model, ids, period, [(layer, head)])])


def ablation_one_element_list(model, ids, period, layer, head):
    """Returns [x]."""
    return [_effect(model, ids, period, [(layer, head)])]


def ablation_next_head(model, ids, period, layer, head):
    """Ablates head + 1 (thinks heads are 1-based in the columns)."""
    return _effect(model, ids, period, [(layer, head + 1)])


def ablation_swapped(model, ids, period, layer, head):
    """Gives ablate_heads (head, layer)."""
    return _effect(model, ids, period, [(head, layer)])


def ablation_single_pair(model, ids, period, layer, head):
    """Gives ablate_heads a single pair, not a list of pairs."""
    return _effect(model, ids, period, (layer, head))


def ablation_last_layer(model, ids, period, layer, head):
    """Always ablates the head in the last layer."""
    return _effect(model, ids, period, [(model.num_layers - 1, head)])


def ablation_first_sequence(model, ids, period, layer, head):
    """Measures on the first sequence only."""
    return _effect(model, ids[:1], period, [(layer, head)])


def ablation_rounded(model, ids, period, layer, head):
    """Rounds the change to 2 decimals."""
    return round(_effect(model, ids, period, [(layer, head)]), 2)


@torch.no_grad()
def ablation_both_inside(model, ids, period, layer, head):
    """Takes both losses inside the `with` block: 0."""
    from attention_course.interpret import ablate_heads, second_half_loss

    with ablate_heads(model, [(layer, head)]):
        before = second_half_loss(model, ids, period).item()
        after = second_half_loss(model, ids, period).item()
    return after - before


def _zeroed(model, ids, period, weight, index):
    from attention_course.interpret import second_half_loss

    with torch.no_grad():
        before = second_half_loss(model, ids, period).item()
        saved = weight.data.clone()
        weight.data[index] = 0.0
        after = second_half_loss(model, ids, period).item()
        weight.data.copy_(saved)
    return after - before


def ablation_dh_by_layers(model, ids, period, layer, head):
    """Takes Dh = d_model // num_layers."""
    Dh = model.d_model // model.num_layers
    w = model.blocks[layer].attn.w_o.weight
    return _zeroed(model, ids, period, w, (slice(None), slice(head * Dh, (head + 1) * Dh)))


def ablation_query_rows(model, ids, period, layer, head):
    """Zeroes the head's rows of w_q (its queries) instead of its output."""
    Dh = model.d_model // model.num_heads
    w = model.blocks[layer].attn.w_q.weight
    return _zeroed(model, ids, period, w, slice(head * Dh, (head + 1) * Dh))


CATALOGUE += [
    ("induction_scores", "i - period + 2", induction_plus_two, "i - period + 2"),
    ("find_induction_head", "best-mean layer", find_best_mean_layer, "the best mean score"),
    ("find_induction_head", "4 heads hard-coded", find_four_heads, "hard-coded 4 heads"),
    ("find_induction_head", "1-based", find_fully_one_based, "layers and heads counted from 1"),
    ("find_induction_head", "flat index", find_flat_index_as_head, "flat index"),
    ("find_induction_head", "range(2)", find_first_two_layers, "scanned only layers 0 .. 1"),
    ("find_induction_head", "bools", find_bools, "truth values"),
    ("find_induction_head", "first sequence", find_first_sequence, "first sequence only"),
    ("ablation_effect", "str", ablation_as_string, "expected one real number"),
    ("ablation_effect", "shape (1,)", ablation_shape_one_tensor, "expected one real number"),
    ("ablation_effect", "[x]", ablation_one_element_list, "expected one real number"),
    ("ablation_effect", "head + 1", ablation_next_head, "heads are 0-based"),
    ("ablation_effect", "(head, layer)", ablation_swapped, "(layer, head)"),
    ("ablation_effect", "single pair", ablation_single_pair, "wrap it, `[(layer, head)]`"),
    ("ablation_effect", "last layer", ablation_last_layer, "of the last layer"),
    ("ablation_effect", "first sequence", ablation_first_sequence, "first sequence only"),
    ("ablation_effect", "rounded", ablation_rounded, "rounded to 2 decimal"),
    ("ablation_effect", "both inside", ablation_both_inside, "your change is 0"),
    ("ablation_effect", "Dh by layers", ablation_dh_by_layers, "d_model // num_layers"),
    ("ablation_effect", "rows of w_q", ablation_query_rows, "rows of w_q"),
]


def induction_half_as_period(weights, period):
    """Assumes T = 2 * period: uses T // 2 as the period."""
    p = weights.shape[-1] // 2
    return torch.diagonal(weights, offset=-(p - 1), dim1=-2, dim2=-1)[..., 1:].mean(dim=(0, 2))


def induction_skips_period_entries(weights, period):
    """Slices the diagonal with [period:] instead of [1:]."""
    d = torch.diagonal(weights, offset=-(period - 1), dim1=-2, dim2=-1)
    return d[..., period:].mean(dim=(0, 2))


def induction_max_over_batch(weights, period):
    """Takes the max over the batch instead of the mean."""
    d = torch.diagonal(weights, offset=-(period - 1), dim1=-2, dim2=-1)[..., 1:]
    return d.mean(dim=2).amax(dim=0)


def induction_first_sequence(weights, period):
    """Scores the first sequence only."""
    d = torch.diagonal(weights[0], offset=-(period - 1), dim1=-2, dim2=-1)[..., 1:]
    return d.mean(dim=-1)


def rollout_elementwise(attentions):
    """Multiplies the layer matrices elementwise."""
    result = None
    for w in attentions:
        a = _layer(w)
        result = a if result is None else a * result
    return result


def rollout_head_zero(attentions):
    """Uses head 0 of every layer only."""
    result = None
    for w in attentions:
        a = _layer(w[:, :1])
        result = a if result is None else a @ result
    return result


def rollout_identity_first_layer_only(attentions):
    """Adds the identity (and renormalises) in the first layer only."""
    result = _layer(attentions[0])
    for w in attentions[1:]:
        result = w.mean(dim=1) @ result
    return result


CATALOGUE += [
    ("induction_scores", "T // 2 as period", induction_half_as_period, "T // 2 as the period"),
    ("induction_scores", "[period:]", induction_skips_period_entries, "skips too many"),
    ("induction_scores", "max over batch", induction_max_over_batch, "max over the batch"),
    ("induction_scores", "first sequence", induction_first_sequence, "first sequence"),
    ("attention_rollout", "elementwise", rollout_elementwise, "elementwise"),
    ("attention_rollout", "head 0", rollout_head_zero, "head 0 only"),
    (
        "attention_rollout",
        "identity in layer 1 only",
        rollout_identity_first_layer_only,
        "in the first layer only",
    ),
]


def induction_mean_over_heads(weights, period):
    """Averages over the heads and positions instead of the batch: shape (B,)."""
    d = torch.diagonal(weights, offset=-(period - 1), dim1=-2, dim2=-1)[..., 1:]
    return d.mean(dim=(1, 2))


CATALOGUE += [
    ("induction_scores", "mean over heads", induction_mean_over_heads, "instead of the batch"),
]
