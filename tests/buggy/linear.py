"""Buggy linear attention and gated delta rules (exercise 22), each written as a student
writes them, token by token with a running state: ``linear_attention(query, key, value,
causal=True)`` and ``gated_delta_rule(query, key, value, g, beta, initial_state=None)``."""

import math

import torch
import torch.nn.functional as F


def _recurrent_linear(
    q,
    k,
    v,
    causal=True,
    *,
    phi=lambda x: F.elu(x) + 1,
    phi_k=None,
    normalise=True,
    read_first=False,
    phi_v=False,
    scale_q=False,
    z_all=False,
    ignore_causal=False,
    ignore_flag=False,
    scale_qk=False,
    scale_out=False,
    longer_only=False,
):
    """Linear attention as a loop over the positions (the right one with no option set)."""
    T, S = q.shape[-2], k.shape[-2]
    if causal and (S > T if longer_only else S != T):
        raise ValueError(f"causal=True needs S = T, got S={S}, T={T}")
    if scale_q or scale_qk:
        q = q / math.sqrt(q.shape[-1])
    if scale_qk:
        k = k / math.sqrt(k.shape[-1])
    fq, fk = phi(q), (phi_k or phi)(k)
    fv = phi(v) if phi_v else v
    if ignore_flag:
        causal = True
    if not causal or ignore_causal:
        state = fk.transpose(-2, -1) @ fv
        z = fk.sum(dim=-2)
        out = fq @ state
        if normalise:
            out = out / (fq * z[..., None, :]).sum(-1, keepdim=True)
        return out / math.sqrt(q.shape[-1]) if scale_out else out
    state = torch.zeros(*q.shape[:-2], q.shape[-1], v.shape[-1], dtype=q.dtype)
    z = torch.zeros(*q.shape[:-1][:-1], q.shape[-1], dtype=q.dtype)
    z_total = fk.sum(dim=-2)
    outs = []
    for i in range(T):
        if read_first:
            num = (fq[..., i, :, None] * state).sum(-2)
            den = (fq[..., i, :] * z).sum(-1, keepdim=True)
        state = state + fk[..., i, :, None] * fv[..., i, None, :]
        z = z + fk[..., i, :]
        if not read_first:
            num = (fq[..., i, :, None] * state).sum(-2)
            den = (fq[..., i, :] * (z_total if z_all else z)).sum(-1, keepdim=True)
        outs.append(num / den if normalise else num)
    out = torch.stack(outs, dim=-2)
    return out / math.sqrt(q.shape[-1]) if scale_out else out


def linear_right(query, key, value, causal=True):
    """Not a mistake: the recurrent form, right (passes)."""
    return _recurrent_linear(query, key, value, causal)


def linear_no_normaliser(query, key, value, causal=True):
    """The normaliser forgotten: phi(q)^T S only."""
    return _recurrent_linear(query, key, value, causal, normalise=False)


def linear_read_before_update(query, key, value, causal=True):
    """The output read before the state update: token i sees only j < i."""
    return _recurrent_linear(query, key, value, causal, read_first=True)


def linear_not_causal(query, key, value, causal=True):
    """causal=True computed with the sums over every key."""
    return _recurrent_linear(query, key, value, causal, ignore_causal=True)


def linear_elu_only(query, key, value, causal=True):
    """phi = elu without the +1."""
    return _recurrent_linear(query, key, value, causal, phi=F.elu)


def linear_phi_on_values(query, key, value, causal=True):
    """phi applied to the values as well."""
    return _recurrent_linear(query, key, value, causal, phi_v=True)


def linear_z_not_causal(query, key, value, causal=True):
    """The normaliser summed over every key while the numerator is causal."""
    return _recurrent_linear(query, key, value, causal, z_all=True)


def linear_always_causal(query, key, value, causal=True):
    """causal=False ignored: the causal recurrence every time."""
    return _recurrent_linear(query, key, value, causal, ignore_flag=True)


def linear_scaled(query, key, value, causal=True):
    """The queries scaled by 1/sqrt(Dk) before phi (softmax attention's habit)."""
    return _recurrent_linear(query, key, value, causal, scale_q=True)


def linear_no_feature_map(query, key, value, causal=True):
    """No feature map at all: raw q . k weights."""
    return _recurrent_linear(query, key, value, causal, phi=lambda x: x)


def linear_no_value_error(query, key, value, causal=True):
    """causal=True with S != T does not raise (the loop runs over min(T, S))."""
    if causal and key.shape[-2] != query.shape[-2]:
        return torch.zeros(*query.shape[:-1], value.shape[-1], dtype=query.dtype)
    return _recurrent_linear(query, key, value, causal)


def linear_default_not_causal(query, key, value, causal=False):
    """The default changed to causal=False (the causal branch itself is right)."""
    return _recurrent_linear(query, key, value, causal)


def linear_raises_only_for_longer_keys(query, key, value, causal=True):
    """causal=True raises only for S > T; S < T runs (and here returns the first S rows'
    recurrence padded with zeros instead of raising)."""
    T, S = query.shape[-2], key.shape[-2]
    if causal and S < T:
        out = _recurrent_linear(query[..., :S, :], key, value, causal)
        pad = out.new_zeros(*out.shape[:-2], T - S, out.shape[-1])
        return torch.cat([out, pad], dim=-2)
    return _recurrent_linear(query, key, value, causal, longer_only=True)


def _relu(x):
    return F.relu(x)


def linear_relu(query, key, value, causal=True):
    """phi = relu (can give 0/0 where a query or every key so far is negative)."""
    return _recurrent_linear(query, key, value, causal, phi=_relu)


def linear_exp(query, key, value, causal=True):
    """phi = exp."""
    return _recurrent_linear(query, key, value, causal, phi=torch.exp)


def linear_softplus(query, key, value, causal=True):
    """phi = softplus."""
    return _recurrent_linear(query, key, value, causal, phi=F.softplus)


def linear_elu_plus_two(query, key, value, causal=True):
    """phi = elu + 2."""
    return _recurrent_linear(query, key, value, causal, phi=lambda x: F.elu(x) + 2)


def linear_relu_plus_one(query, key, value, causal=True):
    """phi = relu + 1."""
    return _recurrent_linear(query, key, value, causal, phi=lambda x: F.relu(x) + 1)


def linear_relu_plus_one_on_keys(query, key, value, causal=True):
    """phi = elu + 1 on the queries, relu + 1 on the keys."""
    return _recurrent_linear(query, key, value, causal, phi_k=lambda x: F.relu(x) + 1)


def linear_phi_on_queries_only(query, key, value, causal=True):
    """phi on the queries, the keys raw."""
    return _recurrent_linear(query, key, value, causal, phi_k=lambda x: x)


def linear_phi_on_keys_only(query, key, value, causal=True):
    """phi on the keys, the queries raw."""
    return _recurrent_linear(
        query, key, value, causal, phi=lambda x: x, phi_k=lambda x: F.elu(x) + 1
    )


def linear_scaled_inside_phi(query, key, value, causal=True):
    """q and k both scaled by 1/sqrt(Dk) inside phi."""
    return _recurrent_linear(query, key, value, causal, scale_qk=True)


def linear_scaled_output(query, key, value, causal=True):
    """The output divided by sqrt(Dk)."""
    return _recurrent_linear(query, key, value, causal, scale_out=True)


# ---------------------------------------------------------------- the gated delta rule


def _delta(
    q,
    k,
    v,
    g,
    beta,
    initial_state=None,
    *,
    order="right",
    read_first=False,
    scale=True,
    use_initial=True,
    transpose_state=False,
    g_direct=False,
    time_axis=1,
    normalise=False,
    g_sign=1.0,
    one_minus_beta=False,
):
    if one_minus_beta:
        beta = 1 - beta
    g = g_sign * g
    if normalise:
        q, k = q / q.norm(dim=-1, keepdim=True), k / k.norm(dim=-1, keepdim=True)
    if time_axis == 2:  # treats (B, T, H, D) as (B, H, T, D)
        q, k, v = (x.transpose(1, 2) for x in (q, k, v))
        g, beta = g.transpose(1, 2), beta.transpose(1, 2)
        initial_state = None
    B, T, H, Dk = k.shape
    S = torch.zeros(B, H, Dk, v.shape[-1], dtype=q.dtype)
    if initial_state is not None and use_initial:
        S = initial_state
    outs = []
    for t in range(T):
        a = g[:, t] if g_direct else g[:, t].exp()  # (B, H)
        a, b = a[..., None, None], beta[:, t, :, None, None]
        kt = k[:, t, :, :, None]  # (B, H, Dk, 1)
        vt = v[:, t, :, None, :]  # (B, H, 1, Dv)
        qt = q[:, t, :, :, None]
        if read_first:
            outs.append((S * qt).sum(-2))
        if order == "decay after":
            S = a * (S + b * kt * (vt - (S * kt).sum(-2, keepdim=True)))
        elif order == "undecayed read":
            S = a * S + b * kt * (vt - (S * kt).sum(-2, keepdim=True))
        elif order == "beta on value":
            S = a * S + kt * (b * vt - (a * S * kt).sum(-2, keepdim=True))
        elif order == "beta on whole":
            S = b * (a * S + kt * (vt - (a * S * kt).sum(-2, keepdim=True)))
        elif order == "beta on read":
            S = a * S
            S = S + kt * (vt - b * (S * kt).sum(-2, keepdim=True))
        elif order == "no read":  # gated linear attention
            S = a * S + b * kt * vt
        else:
            S = a * S
            S = S + b * kt * (vt - (S * kt).sum(-2, keepdim=True))
        if not read_first:
            outs.append((S * qt).sum(-2))
    out = torch.stack(outs, dim=1)  # (B, T, H, Dv)
    if scale:
        out = out / math.sqrt(Dk)
    if time_axis == 2:
        out = out.transpose(1, 2)
    return out, (S.transpose(-2, -1) if transpose_state else S)


def delta_right(query, key, value, g, beta, initial_state=None):
    """Not a mistake: the recurrence, right (passes)."""
    return _delta(query, key, value, g, beta, initial_state)


def delta_decay_after(query, key, value, g, beta, initial_state=None):
    """The decay applied after the update: S = a (S + beta k (v - S^T k)^T)."""
    return _delta(query, key, value, g, beta, initial_state, order="decay after")


def delta_undecayed_read(query, key, value, g, beta, initial_state=None):
    """The correction read against the undecayed state: v - S_{t-1}^T k."""
    return _delta(query, key, value, g, beta, initial_state, order="undecayed read")


def delta_beta_on_value(query, key, value, g, beta, initial_state=None):
    """beta on the value only: k (beta v - (a S)^T k)^T."""
    return _delta(query, key, value, g, beta, initial_state, order="beta on value")


def delta_beta_on_whole(query, key, value, g, beta, initial_state=None):
    """beta on the whole update, the decayed state included."""
    return _delta(query, key, value, g, beta, initial_state, order="beta on whole")


def delta_no_scale(query, key, value, g, beta, initial_state=None):
    """The 1/sqrt(Dk) scale of the output forgotten."""
    return _delta(query, key, value, g, beta, initial_state, scale=False)


def delta_read_first(query, key, value, g, beta, initial_state=None):
    """The output read before the update (S_{t-1}^T q_t)."""
    return _delta(query, key, value, g, beta, initial_state, read_first=True)


def delta_initial_ignored(query, key, value, g, beta, initial_state=None):
    """initial_state ignored: always zeros."""
    return _delta(query, key, value, g, beta, initial_state, use_initial=False)


def delta_state_transposed(query, key, value, g, beta, initial_state=None):
    """The state returned as (B, H, Dv, Dk)."""
    return _delta(query, key, value, g, beta, initial_state, transpose_state=True)


def delta_g_as_decay(query, key, value, g, beta, initial_state=None):
    """g used as the decay a itself, not exp(g)."""
    return _delta(query, key, value, g, beta, initial_state, g_direct=True)


def delta_time_axis(query, key, value, g, beta, initial_state=None):
    """The recurrence over axis 2 (the heads): the layout read as (B, H, T, D)."""
    return _delta(query, key, value, g, beta, initial_state, time_axis=2)


def delta_beta_ignored(query, key, value, g, beta, initial_state=None):
    """beta not used: the whole correction written every time."""
    return _delta(query, key, value, g, torch.ones_like(beta), initial_state)


def delta_decay_ignored(query, key, value, g, beta, initial_state=None):
    """The decay not applied (the plain delta rule)."""
    return _delta(query, key, value, torch.zeros_like(g), beta, initial_state)


def delta_normalised(query, key, value, g, beta, initial_state=None):
    """q and k l2-normalised inside (HF's use_qk_l2norm_in_kernel=True)."""
    return _delta(query, key, value, g, beta, initial_state, normalise=True)


def delta_beta_on_read(query, key, value, g, beta, initial_state=None):
    """beta on the read-back only: k (v - beta (a S)^T k)^T."""
    return _delta(query, key, value, g, beta, initial_state, order="beta on read")


def delta_no_read(query, key, value, g, beta, initial_state=None):
    """No read-back: gated linear attention, S = a S + beta k v^T."""
    return _delta(query, key, value, g, beta, initial_state, order="no read")


def delta_decay_sign(query, key, value, g, beta, initial_state=None):
    """exp(-g) as the decay."""
    return _delta(query, key, value, g, beta, initial_state, g_sign=-1.0)


def delta_one_minus_beta(query, key, value, g, beta, initial_state=None):
    """(1 - beta) in place of beta."""
    return _delta(query, key, value, g, beta, initial_state, one_minus_beta=True)


CATALOGUE = [
    ("linear_attention", "normaliser forgotten", linear_no_normaliser, "linear-normaliser-missing"),
    (
        "linear_attention",
        "state updated after the read",
        linear_read_before_update,
        "linear-state-updated-after-read",
    ),
    ("linear_attention", "not causal", linear_not_causal, "linear-not-causal"),
    ("linear_attention", "elu without +1", linear_elu_only, "linear-feature-map-elu-without-one"),
    ("linear_attention", "phi on the values", linear_phi_on_values, "linear-feature-map-on-values"),
    (
        "linear_attention",
        "normaliser not causal",
        linear_z_not_causal,
        "linear-normaliser-not-causal",
    ),
    (
        "linear_attention",
        "causal=False ignored",
        linear_always_causal,
        "linear-causal-flag-ignored",
    ),
    ("linear_attention", "queries scaled", linear_scaled, "linear-scaled"),
    ("linear_attention", "no feature map", linear_no_feature_map, "linear-feature-map-missing"),
    ("linear_attention", "no ValueError for S != T", linear_no_value_error, None),
    ("gated_delta_rule", "decay after the update", delta_decay_after, "delta-decay-after-update"),
    ("gated_delta_rule", "undecayed read-back", delta_undecayed_read, "delta-read-undecayed"),
    ("gated_delta_rule", "beta on the value", delta_beta_on_value, "delta-beta-on-value-only"),
    ("gated_delta_rule", "beta on the whole", delta_beta_on_whole, "delta-beta-on-whole-update"),
    ("gated_delta_rule", "no 1/sqrt(Dk)", delta_no_scale, "delta-scale-missing"),
    ("gated_delta_rule", "output before update", delta_read_first, "delta-output-before-update"),
    (
        "gated_delta_rule",
        "initial state ignored",
        delta_initial_ignored,
        "delta-initial-state-ignored",
    ),
    ("gated_delta_rule", "state transposed", delta_state_transposed, "delta-state-transposed"),
    ("gated_delta_rule", "g as the decay", delta_g_as_decay, "delta-g-used-as-decay"),
    ("gated_delta_rule", "time over the heads", delta_time_axis, "delta-time-axis-wrong"),
    ("gated_delta_rule", "q and k normalised inside", delta_normalised, "delta-qk-normalised"),
    ("gated_delta_rule", "beta ignored", delta_beta_ignored, "delta-beta-ignored"),
    ("gated_delta_rule", "decay ignored", delta_decay_ignored, "delta-decay-ignored"),
    (
        "linear_attention",
        "default causal=False",
        linear_default_not_causal,
        "linear-default-not-causal",
    ),
    ("linear_attention", "ValueError only for S > T", linear_raises_only_for_longer_keys, None),
    ("linear_attention", "phi = relu", linear_relu, "linear-feature-map-other"),
    ("linear_attention", "phi = exp", linear_exp, "linear-feature-map-other"),
    ("linear_attention", "phi = softplus", linear_softplus, "linear-feature-map-other"),
    ("linear_attention", "phi = elu + 2", linear_elu_plus_two, "linear-feature-map-other"),
    ("linear_attention", "phi = relu + 1", linear_relu_plus_one, "linear-feature-map-other"),
    (
        "linear_attention",
        "phi = relu + 1 on the keys",
        linear_relu_plus_one_on_keys,
        "linear-feature-map-other",
    ),
    (
        "linear_attention",
        "phi on the queries only",
        linear_phi_on_queries_only,
        "linear-feature-map-queries-only",
    ),
    (
        "linear_attention",
        "phi on the keys only",
        linear_phi_on_keys_only,
        "linear-feature-map-keys-only",
    ),
    (
        "linear_attention",
        "q and k scaled inside phi",
        linear_scaled_inside_phi,
        "linear-scaled-inside-phi",
    ),
    ("linear_attention", "output scaled", linear_scaled_output, "linear-scaled-output"),
    ("gated_delta_rule", "beta on the read-back", delta_beta_on_read, "delta-beta-on-read-only"),
    ("gated_delta_rule", "no read-back (GLA)", delta_no_read, "delta-read-term-missing"),
    ("gated_delta_rule", "exp(-g)", delta_decay_sign, "delta-decay-sign"),
    ("gated_delta_rule", "1 - beta", delta_one_minus_beta, "delta-one-minus-beta"),
]
