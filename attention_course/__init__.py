"""Attention, from alignment to Transformers: graded reference implementations.

Shape names used in every docstring and shape comment:

- ``B``  batch size
- ``T``  query (target) length
- ``S``  key/value (source) length
- ``D``  model width, ``d_model``
- ``H``  number of heads, ``num_heads``
- ``Dh`` width of one head, ``D / H``
- ``F``  hidden width of the feed-forward network, ``d_ff``
- ``V``  vocabulary size (the language models of Part V)

Masks are boolean with **True = may attend**, broadcastable to ``(B, H, T, S)``
(the convention of ``F.scaled_dot_product_attention``); float masks are
additive. Nothing here chooses a device: modules follow their inputs.

Attention weights: the attention modules and the GPT's block (``MultiHeadAttention``,
``CausalSelfAttention``, ``GPTBlock``) take ``need_weights``, the name
``nn.MultiheadAttention`` uses; the encoder-decoder's layers and every stack or model
(``EncoderLayer``, ``DecoderLayer``, ``Encoder``, ``Decoder``, ``Transformer.encode``/``decode``,
``TransformerClassifier.encode``, ``GPT``) take ``return_attention`` and return the
weights beside their output (a layer its sub-layers', a stack a list by layer). The
names are kept as Parts I-V use them. ``MultiHeadAttention`` keeps
``nn.MultiheadAttention``'s ``need_weights=True`` and always returns ``(out, weights or
None)``, with the weights per head, ``(B, H, T, S)``, as PyTorch gives them with
``average_attn_weights=False`` (PyTorch averages over the heads by default).
``CausalSelfAttention`` and ``GPTBlock``, built for speed inside a GPT, default to
``need_weights=False`` and then return the output alone, so that PyTorch's fused kernel
runs unless weights are asked for (or the scores are soft-capped, chapter 20, or a learned
sink logit joins them, chapter 19: the kernel has no step for either).

Where each idea lives (module: chapter): ``attention`` 1-4, ``alignment`` 3, ``masking`` 5,
``multihead`` 6, ``norms`` 7 and 16 (RMSNorm), ``ffn`` 8 and 16 (SwiGLU), ``positional`` 9
(absolute positions), ``transformer`` and ``diagram`` 10, ``classifier`` 11, ``fused``
(PyTorch's kernel, the one mask per forward), ``kv_cache`` and ``tiled`` 12, ``gpt``,
``sampling``, ``tokenizer`` and ``ngram`` 13, ``train`` 3, 10, 11 and 13,
``relative_positions`` 14 (RoPE, ALiBi, the position pieces attention is given) and 19
(RoPE scaling: ``rope_frequencies``), ``kv``
15 (and the key/value layout piece), ``interpret`` 17, ``latent`` 18 (multi-head latent
attention, the cache per token), ``sinks`` 19 (attention sinks:
StreamingLLM's kept first tokens, gpt-oss's learned sink logit), ``stability`` 20
(soft-capping; QK-norm and the caps are options of ``gpt``'s attention and model), ``moe``
21 (mixture of experts, the load-balancing loss, DeepSeek-V3's balancing bias, the
active parameters; a GPT with ``ffn="moe"``), ``linear`` 22 (linear attention, the gated
delta rule), ``ring`` 23 (ring attention across processes, its striped layout, the launcher
``run_ring``), ``data_parallel`` 23 (a GPT under DistributedDataParallel);
``checks`` and ``quiz`` for the exercises, ``grading`` for instructors. The README has this
map as a table, with the data modules and the helpers every chapter uses.
"""

from .attention import (
    AdditiveAttention,
    hard_argmax,
    masked_softmax,
    scaled_dot_product_attention,
    set_attention,
    soft_argmax,
)
from .classifier import TransformerClassifier, masked_max_pool, masked_mean_pool
from .device import get_device, seed_everything
from .ffn import PositionwiseFeedForward
from .interop import copy_weights_from_torch
from .kv_cache import KVCache
from .masking import causal_mask, padding_mask, to_additive_mask, to_torch_mha_mask
from .multihead import MultiHeadAttention, merge_heads, split_heads
from .norms import BatchNorm1d, LayerNorm
from .parameters import count_parameters
from .positional import (
    LearnedPositionalEmbedding,
    PositionalEncoding,
    sinusoidal_positional_encoding,
)
from .tiled import tiled_attention
from .transformer import (
    Decoder,
    DecoderLayer,
    Encoder,
    EncoderLayer,
    Transformer,
    greedy_decode,
)

# isort: split
# Part V (chapters 13-17): decoder-only language models.
from .gpt import GPT, CausalSelfAttention, load_gpt_checkpoint
from .interpret import attention_rollout, induction_scores
from .kv import repeat_kv, sliding_window_mask
from .ngram import NGramModel
from .relative_positions import alibi_bias, alibi_slopes, apply_rope
from .sampling import filter_logits, generate
from .tokenizer import CharTokenizer
from .train import evaluate_lm, train_language_model

# isort: split
# Part V, chapter 16: the modern block.
from .ffn import SwiGLU
from .norms import RMSNorm

# isort: split
# Part VI: latent attention (18), attention sinks (19), logits kept in range (20), mixture of
# experts (21), a fixed-size state instead of T^2 (22), attention across processes (23).
from .data_parallel import ddp_gradients_worker, next_token_loss, single_process_gradients
from .latent import MultiHeadLatentAttention, cache_per_token
from .linear import gated_delta_rule, linear_attention
from .moe import MoE, active_parameters, load_balancing_loss
from .relative_positions import rope_frequencies
from .ring import (
    gather_sequence,
    ring_attention,
    ring_attention_worker,
    ring_work,
    run_calls,
    run_ring,
    shard_sequence,
)
from .sinks import StreamingAttentionCache, sink_attention, streaming_mask
from .stability import softcap

__version__ = "0.1.0"

__all__ = [
    "AdditiveAttention",
    "BatchNorm1d",
    "Decoder",
    "DecoderLayer",
    "Encoder",
    "EncoderLayer",
    "KVCache",
    "LayerNorm",
    "LearnedPositionalEmbedding",
    "MultiHeadAttention",
    "PositionalEncoding",
    "PositionwiseFeedForward",
    "Transformer",
    "TransformerClassifier",
    "causal_mask",
    "copy_weights_from_torch",
    "count_parameters",
    "get_device",
    "greedy_decode",
    "hard_argmax",
    "masked_max_pool",
    "masked_mean_pool",
    "masked_softmax",
    "merge_heads",
    "padding_mask",
    "scaled_dot_product_attention",
    "seed_everything",
    "set_attention",
    "sinusoidal_positional_encoding",
    "soft_argmax",
    "split_heads",
    "tiled_attention",
    "to_additive_mask",
    "to_torch_mha_mask",
    # Part V
    "CausalSelfAttention",
    "CharTokenizer",
    "GPT",
    "NGramModel",
    "evaluate_lm",
    "filter_logits",
    "generate",
    "load_gpt_checkpoint",
    "train_language_model",
    "attention_rollout",
    "induction_scores",
    "RMSNorm",
    "SwiGLU",
    "alibi_bias",
    "alibi_slopes",
    "apply_rope",
    "repeat_kv",
    "sliding_window_mask",
    # Part VI
    "MultiHeadLatentAttention",
    "cache_per_token",
    "StreamingAttentionCache",
    "sink_attention",
    "streaming_mask",
    "MoE",
    "active_parameters",
    "load_balancing_loss",
    "softcap",
    "gated_delta_rule",
    "linear_attention",
    "ring_attention",
    "ring_attention_worker",
    "ring_work",
    "run_calls",
    "run_ring",
    "gather_sequence",
    "shard_sequence",
    "ddp_gradients_worker",
    "next_token_loss",
    "single_process_gradients",
    "rope_frequencies",
]
