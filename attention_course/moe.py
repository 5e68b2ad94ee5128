"""Mixture of experts (混合专家, chapter 21): a sparse feed-forward layer and its balancing loss.

A mixture-of-experts layer replaces a block's one feed-forward network by ``E`` of them
(the *experts*, here :class:`~attention_course.SwiGLU` networks) and a *router* that
sends every token to ``k`` of them. The parameters grow with ``E``; the work per token
grows with ``k`` only. Shazeer et al. (2017, "Outrageously Large Neural Networks: The
Sparsely-Gated Mixture-of-Experts Layer", arXiv:1701.06538) introduced the sparsely
gated layer; Switch Transformers (Fedus, Zoph & Shazeer, 2022, "Switch
Transformers: Scaling to Trillion Parameter Models with Simple and Efficient
Sparsity", JMLR 23(120), arXiv:2101.03961, eqs. 4-6) its load-balancing loss (the
top-k form here is that of Hugging Face's Mixtral port; the Mixtral paper describes no
balancing loss); Mixtral (Jiang et al.,
2024, "Mixtral of Experts", arXiv:2401.04088) the routing used here (softmax, top-2,
weights renormalised); DeepSeekMoE (Dai et al., 2024, arXiv:2401.06066) the shared
experts that every token passes through.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ._validate import LOW_PRECISION, check_positive_int, require_float, require_ndim, shape_str
from .ffn import SwiGLU


def _check_top_k(top_k: object, num_experts: int) -> None:
    check_positive_int("top_k", top_k)
    if top_k > num_experts:
        raise ValueError(
            f"top_k: got {top_k}, expected at most num_experts={num_experts} (a token cannot "
            "pick more experts than there are)"
        )


def _router_probabilities(router_logits: torch.Tensor) -> torch.Tensor:
    """Softmax over the experts, in float32 for half-precision logits (as Hugging Face)."""
    dtype = torch.float32 if router_logits.dtype in LOW_PRECISION else router_logits.dtype
    return torch.softmax(router_logits.to(dtype), dim=-1)  # (N, E), rows sum to 1


class MoE(nn.Module):
    """A sparse mixture-of-experts feed-forward layer with top-k routing (= Mixtral's).

    For each token ``x`` (a row of the ``N = B * T`` tokens):

    1. the router's logits ``r = router(x)``, ``(E,)``; probabilities ``p = softmax(r)``
       over all ``E`` experts (softmax *before* the top-k);
    2. the ``k`` largest probabilities and their experts; their weights renormalised to
       sum to 1, ``g_i = p_i / Σ_{j in top-k} p_j``;
    3. ``out = Σ_{i in top-k} g_i · expert_i(x)``, plus ``shared(x)`` (weight 1) when
       ``num_shared > 0``.

    Routing is per token: two tokens of one sequence may use different experts. The order
    "softmax, then top-k, then renormalise" gives the same weights as a softmax over the
    ``k`` largest logits alone (``e^{r_i} / Σ_{top-k} e^{r_j} = p_i / Σ_{top-k} p_j``);
    the orders differ only without the renormalisation, e.g. Switch Transformers' ``k =
    1``, which scales the expert's output by its unrenormalised ``p_i``.

    Attributes: ``router`` (``nn.Linear(D, E, bias=False)``), ``experts`` (an
    ``nn.ModuleList`` of ``E`` :class:`~attention_course.SwiGLU` ``(D, d_ff)``, bias-free),
    ``shared`` (None, or one ``SwiGLU(D, num_shared * d_ff)``: DeepSeekMoE's
    ``num_shared`` shared experts of width ``d_ff`` fused into one network, the way
    Hugging Face's ``DeepseekV3MoE`` builds its ``shared_experts``), ``num_experts``,
    ``top_k``, ``num_shared``.

    Parameters: total ``3·D·F·(E + num_shared) + D·E``; active per token (used for one
    token) ``3·D·F·(k + num_shared) + D·E`` (:func:`active_parameters`).

    ``router_bias=True`` (keyword-only): DeepSeek-V3's auxiliary-loss-free balancing
    (DeepSeek-AI, 2024, "DeepSeek-V3 Technical Report", arXiv:2412.19437, §2.1.2). A
    buffer ``router_bias (E,)``, zeros at first, is added to the router logits to *choose*
    the top-k experts only; the weights stay the renormalised probabilities of the chosen
    experts without the bias. No gradient trains it: after each optimiser step
    :meth:`update_router_bias` moves it by the sign of each expert's load error, so an
    overloaded expert is chosen less often, without a loss term that pulls on the
    router's gradient. DeepSeek-V3 adds its bias to sigmoid affinities (Hugging Face:
    ``DeepseekV3TopkRouter.e_score_correction_bias``, a buffer the library does not
    update); this layer's router is Mixtral's softmax, so the bias goes on the logits
    (the choice by ``p_e · e^{b_e}``). Without it ``router_bias`` is None and not in the
    state dict.

    Hugging Face: ``MixtralSparseMoeBlock`` (``transformers.models.mixtral``; eval mode,
    no router jitter), which stores the experts' weights fused, as 3-D parameters:
    ``gate.weight`` is ``router.weight``; ``experts.gate_up_proj[e]`` ``(2F, D)`` is
    ``experts[e].w1.weight`` (gate) stacked over ``experts[e].w3.weight`` (up), and
    ``experts.down_proj[e]`` ``(D, F)`` is ``experts[e].w2.weight``. Its block returns
    the output alone; the router logits come from its ``gate``.

    Cost. :meth:`forward` loops over the experts in Python: each expert gathers its
    tokens, runs its three matrix products on them, and adds its weighted output back
    (``index_add_``). The arithmetic is ``k`` experts' worth per token, whatever ``E``
    is; but it comes as ``E`` small matrix products of uneven sizes, each with a gather,
    a scatter and the overhead of a Python call, and on a CPU, with small widths and few
    tokens per expert, a small product keeps the cores less busy than one large product
    would, while the per-call overhead does not shrink with the work (chapter 21 measures
    the throughput against a dense FFN; routing every token costs time too). Hugging
    Face's default ``MixtralExperts`` loops over the experts the same way. Optimised
    implementations avoid the loop with a *grouped* matrix product (grouped GEMM): the
    ``N·k`` (token, expert) pairs are sorted by expert, and each contiguous group is
    multiplied by its own expert's weights, given the groups' offsets (PyTorch's
    ``torch.nn.functional.grouped_mm``, documented for bfloat16 inputs on CUDA GPUs of
    compute capability 8.0 or newer, which Hugging Face's
    ``experts_implementation="grouped_mm"`` calls), with no padding of every expert to a
    fixed capacity (Switch Transformers' capacity factor, which drops the tokens beyond
    it). MegaBlocks (Gale et
    al., 2022, "MegaBlocks: Efficient Sparse Training with Mixture-of-Experts",
    arXiv:2211.15841) reaches the same end with block-sparse matrix products.

    Shapes:
        x: ``(B, T, D)``; returns ``out (B, T, D)`` and ``router_logits (B·T, E)`` (for
        :func:`load_balancing_loss`).

    Raises:
        ValueError: a size not a positive integer, ``num_shared < 0``, ``top_k >
        num_experts``, ``router_bias`` not a bool; ``x`` not a float ``(B, T, D)``.
    """

    def __init__(
        self,
        d_model: int,
        d_ff: int,
        num_experts: int,
        top_k: int = 2,
        num_shared: int = 0,
        *,
        router_bias: bool = False,
    ) -> None:
        super().__init__()
        check_positive_int("d_model", d_model)
        check_positive_int("d_ff", d_ff)
        check_positive_int("num_experts", num_experts)
        _check_top_k(top_k, num_experts)
        if isinstance(num_shared, bool) or not isinstance(num_shared, int) or num_shared < 0:
            raise ValueError(f"num_shared: got {num_shared!r}, expected an integer >= 0")
        if not isinstance(router_bias, bool):
            raise ValueError(f"router_bias: got {router_bias!r}, expected True or False")
        self.d_model = d_model
        self.d_ff = d_ff
        self.num_experts = num_experts
        self.top_k = top_k
        self.num_shared = num_shared
        self.router = nn.Linear(d_model, num_experts, bias=False)
        self.experts = nn.ModuleList(SwiGLU(d_model, d_ff) for _ in range(num_experts))
        self.shared = SwiGLU(d_model, num_shared * d_ff) if num_shared > 0 else None
        # DeepSeek-V3's balancing bias (selection only), a buffer: trained by
        # update_router_bias, not by the gradient. None (and absent from the state dict)
        # without router_bias.
        bias = torch.zeros(num_experts) if router_bias else None
        self.register_buffer("router_bias", bias)

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The router's decision for tokens ``x (N, D)``: ``(router_logits (N, E),
        weights (N, k), experts (N, k))``; ``weights`` are the top-k probabilities
        renormalised to sum to 1 (float32 for half-precision inputs), ``experts`` their
        indices, largest first."""
        router_logits = self.router(x)  # (N, D) -> (N, E)
        probs = _router_probabilities(router_logits)  # softmax over all E, then top-k
        if self.router_bias is None:
            weights, experts = torch.topk(probs, self.top_k, dim=-1)  # (N, k) each
        else:  # DeepSeek-V3: the bias decides which experts, not how much of each
            experts = self._select(router_logits)  # (N, k)
            weights = probs.gather(-1, experts)  # the unbiased probabilities, (N, k)
        weights = weights / weights.sum(dim=-1, keepdim=True)  # the k weights sum to 1
        return router_logits, weights, experts

    def _select(self, router_logits: torch.Tensor) -> torch.Tensor:
        """The top-k experts of each token, ``(N, k)``: by ``router_logits + router_bias``
        when there is a bias (no gradient flows through a choice either way)."""
        scores = router_logits.detach()
        if self.router_bias is not None:  # in the wider dtype of the two (bfloat16: float32)
            dtype = torch.promote_types(scores.dtype, self.router_bias.dtype)
            scores = scores.to(dtype) + self.router_bias.to(dtype)  # (N, E) + (E,)
        return torch.topk(scores, self.top_k, dim=-1).indices

    @torch.no_grad()
    def expert_load(self, router_logits: torch.Tensor) -> torch.Tensor:
        """How many of the tokens each expert received: ``(E,)`` integer counts, summing to
        ``N · k``, for the ``router_logits (N, E)`` this layer returned (the choice
        :meth:`forward` made, the bias included)."""
        chosen = self._select(router_logits)  # (N, k)
        return torch.bincount(chosen.reshape(-1), minlength=self.num_experts)  # (E,)

    @torch.no_grad()
    def update_router_bias(self, router_logits: torch.Tensor, rate: float = 1e-3) -> torch.Tensor:
        """DeepSeek-V3's auxiliary-loss-free balancing step: after a training step, each
        expert's bias moves by ``rate`` towards balance, by the *sign* of its load error,
        ``b_e += rate · sign(mean load - load_e)`` (an overloaded expert's bias goes down,
        an underloaded one's up; DeepSeek-AI, 2024, "DeepSeek-V3 Technical Report",
        arXiv:2412.19437, §2.1.2, where ``rate`` is the "bias update speed" γ). Returns the
        load ``(E,)`` it used (:meth:`expert_load` of ``router_logits``, the step's
        choice). The bias has the layer's dtype: in bfloat16 (8 bits of mantissa) steps much
        smaller than the bias are rounded away (Hugging Face keeps
        ``e_score_correction_bias`` in float32, ``_keep_in_fp32_modules_strict``); train
        with a float32 bias.

        Raises:
            ValueError: the layer was built without ``router_bias=True``; ``rate`` not a
            number >= 0.
        """
        if self.router_bias is None:
            raise ValueError(
                "router_bias: this MoE has none (built with router_bias=False), expected "
                "MoE(..., router_bias=True) to update it"
            )
        if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not rate >= 0:
            raise ValueError(f"rate: got {rate!r}, expected a number >= 0")
        load = self.expert_load(router_logits)  # (E,)
        error = load.float().mean() - load.float()  # > 0: underloaded
        self.router_bias += rate * torch.sign(error)
        return load

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        require_float("x", x)
        require_ndim("x", x, (3,), f"(B, T, d_model={self.d_model})")
        if x.shape[-1] != self.d_model:
            raise ValueError(
                f"x: got shape {shape_str(x.shape)}, expected (B, T, d_model={self.d_model})"
            )
        B, T, D = x.shape
        tokens = x.reshape(B * T, D)  # routing is per token: (N, D)
        router_logits, weights, chosen = self.route(tokens)
        out = torch.zeros_like(tokens)  # (N, D)
        for e, expert in enumerate(self.experts):
            token, slot = torch.where(chosen == e)  # the tokens that picked e, and in which slot
            if token.numel() == 0:
                continue  # no token for this expert: no work
            y = expert(tokens[token])  # (n_e, D)
            y = y * weights[token, slot, None].to(y.dtype)  # its renormalised weight
            out.index_add_(0, token, y)  # (N, D): each token sums its k experts
        if self.shared is not None:  # DeepSeekMoE: every token, weight 1
            out = out + self.shared(tokens)
        return out.reshape(B, T, D), router_logits


def load_balancing_loss(router_logits: torch.Tensor, num_experts: int, top_k: int) -> torch.Tensor:
    """The auxiliary load-balancing loss of Switch Transformers, in the top-k form of HF's Mixtral.

    .. math:: L = E \\sum_{e=1}^{E} f_e \\, P_e

    ``f_e``: the fraction of the ``N`` tokens that picked expert ``e`` in one of their
    ``k`` slots (so ``Σ_e f_e = k``); ``P_e``: the mean over the tokens of the router's
    probability for ``e`` (softmax over all ``E`` logits). ``f`` counts hard choices and
    carries no gradient; the gradient reaches the router through ``P``. Perfectly even
    routing (every ``f_e = k/E``, every ``P_e = 1/E``) gives ``L = k``; all tokens on the
    same ``k`` experts with probability near 1 gives up to ``E``. It is *not* a measure of
    balance: since ``Σ_e f_e = k``, it is exactly ``k`` whenever every ``P_e = 1/E``,
    whatever the choices, and it can fall below ``k``. Fedus et al. (2022, JMLR 23(120),
    arXiv:2101.03961, §2.2, eqs. 4-6) define it for ``k = 1``, for each Switch layer (and
    multiply it by a small coefficient ``α`` when adding it to the loss; so does Hugging
    Face's ``MixtralConfig.router_aux_loss_coef``). The top-k form is Hugging Face's, from
    its Mixtral port (its docstring: "as in Switch Transformer"); the Mixtral paper (Jiang
    et al., 2024, arXiv:2401.04088) describes no balancing loss.

    Hugging Face: ``load_balancing_loss_func`` (``transformers.models.mixtral``) without
    ``attention_mask``, given one layer's logits (a tuple of layers there pools their
    tokens into one ``f`` and one ``P``; here, ``torch.cat`` them for the same value, or
    call this once per layer for Switch Transformers' per-layer loss; Hugging Face issue
    #28255 discusses the difference).

    Shapes:
        router_logits: ``(N, E)`` (:class:`MoE`'s second output); returns a scalar.

    Raises:
        ValueError: ``router_logits`` not a float ``(N, E)`` with ``E = num_experts`` and
        ``N >= 1``; ``top_k`` not in ``1 .. num_experts``.
    """
    check_positive_int("num_experts", num_experts)
    _check_top_k(top_k, num_experts)
    require_float("router_logits", router_logits)
    require_ndim("router_logits", router_logits, (2,), f"(N, num_experts={num_experts})")
    N, E = router_logits.shape
    if E != num_experts or N == 0:
        raise ValueError(
            f"router_logits: got shape {shape_str(router_logits.shape)}, expected (N, "
            f"num_experts={num_experts}) with N >= 1"
        )
    probs = _router_probabilities(router_logits)  # (N, E)
    chosen = torch.topk(probs, top_k, dim=-1).indices  # (N, k)
    picked = F.one_hot(chosen, num_experts).sum(dim=1)  # (N, E): 1 where e is in the top-k
    f = picked.to(probs.dtype).mean(dim=0)  # (E,) fraction of tokens that picked e
    P = probs.mean(dim=0)  # (E,) mean router probability
    return num_experts * (f * P).sum()


def active_parameters(model: nn.Module) -> int:
    """The parameters one token uses: all of ``model``'s, less ``E - k`` experts in every
    :class:`MoE` inside it (a token passes through ``k`` of the ``E`` experts; the router
    and the shared experts count in full). A model without an :class:`MoE` gives its
    parameter count (parameters shared between modules, e.g. tied embeddings, count once).
    """
    total = sum(p.numel() for p in model.parameters())
    for module in model.modules():
        if isinstance(module, MoE):
            per_expert = sum(p.numel() for p in module.experts[0].parameters())
            total -= (module.num_experts - module.top_k) * per_expert
    return total
