"""Bad inputs: a ValueError that names the argument and the shapes, and nothing changed.

Each case builds its inputs and modules, and returns ``(call, pattern, watched)``.
The test snapshots everything in ``watched`` (tensors by value; modules by
``state_dict``, which holds BatchNorm's running statistics, and train/eval mode),
checks that ``call()`` raises ``ValueError`` matching ``pattern``, and that the
snapshot is unchanged afterwards.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import nn

from attention_course import (
    AdditiveAttention,
    BatchNorm1d,
    EncoderLayer,
    LayerNorm,
    LearnedPositionalEmbedding,
    MultiHeadAttention,
    PositionalEncoding,
    PositionwiseFeedForward,
    Transformer,
    causal_mask,
    copy_weights_from_torch,
    get_device,
    greedy_decode,
    hard_argmax,
    merge_heads,
    padding_mask,
    scaled_dot_product_attention,
    seed_everything,
    set_attention,
    sinusoidal_positional_encoding,
    soft_argmax,
    split_heads,
    tiled_attention,
    to_torch_mha_mask,
)
from attention_course.data import make_sequence_task

CASES: dict[str, Callable] = {}


def case(name: str):
    def register(build):
        CASES[name] = build
        return build

    return register


def qkv(q=(2, 4, 5), k=(2, 6, 5), v=(2, 6, 7)):
    return torch.randn(q), torch.randn(k), torch.randn(v)


# --- scaled dot-product attention (and tiled attention, which shares its checks) ----------


def sdpa_case(name, pattern, mask=None, tiled=False, **shapes_and_kwargs):
    shapes = {k: shapes_and_kwargs.pop(k) for k in ("q", "k", "v") if k in shapes_and_kwargs}

    @case(("tiled_attention: " if tiled else "sdpa: ") + name)
    def build():
        q, k, v = qkv(**shapes)
        m = mask() if callable(mask) else mask
        fn = tiled_attention if tiled else scaled_dot_product_attention
        watched = [q, k, v] + ([m] if isinstance(m, torch.Tensor) else [])
        return lambda: fn(q, k, v, mask=m, **shapes_and_kwargs), pattern, watched


for tiled in (False, True):
    sdpa_case("query rank", r"query: got shape \(5,\) \(1-D\), expected", q=(5,), tiled=tiled)
    sdpa_case(
        "Dk mismatch",
        r"key: got shape \(2, 6, 4\), expected last dimension 5 to match query \(2, 4, 5\)",
        k=(2, 6, 4),
        tiled=tiled,
    )
    sdpa_case(
        "S mismatch",
        r"value: got shape \(2, 5, 7\), expected S=6 positions .* key \(2, 6, 5\)",
        v=(2, 5, 7),
        tiled=tiled,
    )
    sdpa_case(
        "mask does not broadcast",
        r"mask: got shape \(3, 3\), expected a shape that broadcasts to \(2, 4, 6\)",
        mask=lambda: torch.ones(3, 3, dtype=torch.bool),
        tiled=tiled,
    )
    sdpa_case(
        "mask would enlarge the scores",
        r"mask: got shape \(3, 2, 4, 6\), expected a shape that broadcasts to \(2, 4, 6\)",
        mask=lambda: torch.ones(3, 2, 4, 6, dtype=torch.bool),
        tiled=tiled,
    )
    sdpa_case(
        "integer mask",
        r"mask: got dtype torch.int64, expected torch.bool .*mask.bool\(\)",
        mask=lambda: torch.ones(4, 6, dtype=torch.long),
        tiled=tiled,
    )
    sdpa_case(
        "batch does not broadcast",
        r"query, key, value: leading \(batch\) dimensions do not broadcast: got query "
        r"\(2, 4, 5\), key \(3, 6, 5\), value \(3, 6, 7\)",
        k=(3, 6, 5),
        v=(3, 6, 7),
        tiled=tiled,
    )
sdpa_case("mask is a list", r"mask: got list, expected a torch.Tensor", mask=[[True] * 6] * 4)
sdpa_case("dropout_p", r"dropout_p: got 1.0, expected a probability in \[0, 1\)", dropout_p=1.0)
sdpa_case("scale", r"scale: got 'big', expected a float or None", scale="big")
sdpa_case("block_size", r"block_size: got 0, expected a positive int", tiled=True, block_size=0)


@case("sdpa: integer query")
def _():
    q, k, v = qkv()
    q = q.long()
    return lambda: scaled_dot_product_attention(q, k, v), r"query: got dtype torch.int64", [q]


@case("sdpa: dtypes differ")
def _():
    q, k, v = qkv()
    v = v.double()
    pattern = r"query, key, value: got dtypes torch.float32, torch.float32, torch.float64"
    return lambda: scaled_dot_product_attention(q, k, v), pattern, [q, k, v]


# --- soft/hard argmax and set attention ---------------------------------------------------


@case("soft_argmax: integer scores")
def _():
    s = torch.arange(6).view(2, 3)
    return lambda: soft_argmax(s), r"scores: got dtype torch.int64, expected a floating", [s]


@case("soft_argmax: infinite beta")
def _():
    s = torch.randn(2, 3)
    return lambda: soft_argmax(s, beta=float("inf")), r"beta: got inf, expected a finite", [s]


@case("soft_argmax: dim out of range")
def _():
    s = torch.randn(2, 3)
    pattern = r"dim: got 2, expected an int in \[-2, 1\] for scores of shape \(2, 3\)"
    return lambda: soft_argmax(s, dim=2), pattern, [s]


@case("hard_argmax: dim out of range")
def _():
    s = torch.randn(2, 3)
    return lambda: hard_argmax(s, dim=-3), r"dim: got -3, expected an int in \[-2, 1\]", [s]


@case("set_attention: 1-D X")
def _():
    X = torch.randn(4)
    return lambda: set_attention(X), r"X: got shape \(4,\) \(1-D\), expected \(\.\.\., T, n\)", [X]


# --- additive attention -------------------------------------------------------------------


def additive_case(name, pattern, query=(2, 3), keys=(2, 6, 4), values=(2, 6, 2), mask=None):
    @case("AdditiveAttention: " + name)
    def build():
        module = AdditiveAttention(3, 4, 5)
        q, k, v = torch.randn(query), torch.randn(keys), torch.randn(values)
        m = mask() if mask is not None else None
        watched = [module, q, k, v] + ([m] if m is not None else [])
        return lambda: module(q, k, v, mask=m), pattern, watched


additive_case("query width", r"query: got shape \(2, 5\), expected last .* query_dim=3", (2, 5))
additive_case("query rank", r"query: got shape \(3,\) \(1-D\), expected \(B, Dq\) or", (3,))
additive_case("keys rank", r"keys: got shape \(2, 4\) \(2-D\), expected \(B, S, Dk\)", keys=(2, 4))
additive_case(
    "keys width", r"keys: got shape \(2, 6, 3\), expected \(B, S, key_dim=4\)", keys=(2, 6, 3)
)
additive_case(
    "values length",
    r"values: got shape \(2, 5, 2\), expected \(B, S, Dv\) with \(B, S\) = \(2, 6\)",
    values=(2, 5, 2),
)
additive_case("batch", r"query: got batch size 3, expected 2 to match keys", (3, 3))
additive_case(
    "mask shape",
    r"mask: got shape \(2, 5\), expected a shape that broadcasts to \(2, 6\)",
    mask=lambda: torch.ones(2, 5, dtype=torch.bool),
)
additive_case(
    "mask shape (3-D query)",
    r"mask: got shape \(2, 4, 5\), expected a shape that broadcasts to \(2, 4, 6\)",
    query=(2, 4, 3),
    mask=lambda: torch.ones(2, 4, 5, dtype=torch.bool),
)
additive_case(
    "integer mask", r"mask: got dtype torch.int32", mask=lambda: torch.ones(2, 6, dtype=torch.int32)
)

# --- masks --------------------------------------------------------------------------------


@case("causal_mask: size 0")
def _():
    return lambda: causal_mask(0), r"size: got 0, expected a positive int", []


@case("padding_mask: negative length")
def _():
    lengths = torch.tensor([3, -1])
    pattern = r"lengths: got values in \[-1, 3\], expected every length in \[0, max_len=3\]"
    return lambda: padding_mask(lengths), pattern, [lengths]


@case("padding_mask: length above max_len")
def _():
    lengths = torch.tensor([2, 5])
    pattern = r"lengths: got values in \[2, 5\], expected every length in \[0, max_len=4\]"
    return lambda: padding_mask(lengths, max_len=4), pattern, [lengths]


@case("padding_mask: 2-D lengths")
def _():
    lengths = torch.ones(2, 2, dtype=torch.long)
    return lambda: padding_mask(lengths), r"lengths: got shape \(2, 2\), expected a 1-D", [lengths]


@case("padding_mask: float lengths")
def _():
    lengths = torch.tensor([1.0, 2.0])
    return lambda: padding_mask(lengths), r"lengths: got dtype torch.float32, expected an int", []


@case("padding_mask: negative max_len")
def _():
    return lambda: padding_mask([1, 2], max_len=-1), r"max_len: got -1, expected a non-neg", []


@case("to_torch_mha_mask: integer mask")
def _():
    m = torch.ones(3, 3, dtype=torch.uint8)
    return lambda: to_torch_mha_mask(m), r"mask: got dtype torch.uint8", [m]


# --- multi-head attention -----------------------------------------------------------------


@case("split_heads: d_model % num_heads")
def _():
    x = torch.randn(2, 4, 10)
    pattern = r"num_heads: got 3, expected a divisor of d_model=10"
    return lambda: split_heads(x, 3), pattern, [x]


@case("merge_heads: rank")
def _():
    x = torch.randn(2, 4, 6)
    return (
        lambda: merge_heads(x),
        r"x: got shape \(2, 4, 6\) \(3-D\), expected \(B, H, T, Dh\)",
        [x],
    )


@case("MultiHeadAttention: d_model % num_heads")
def _():
    pattern = r"num_heads: got 3, expected a divisor of d_model=10"
    return lambda: MultiHeadAttention(10, 3), pattern, []


@case("MultiHeadAttention: dropout")
def _():
    return lambda: MultiHeadAttention(12, 3, dropout=1.0), r"dropout: got 1.0, expected a prob", []


def mha_case(name, pattern, query=(2, 4, 12), key=(2, 6, 5), value=(2, 6, 7), mask=None):
    @case("MultiHeadAttention.forward: " + name)
    def build():
        module = MultiHeadAttention(12, 3, kdim=5, vdim=7)
        q, k, v = torch.randn(query), torch.randn(key), torch.randn(value)
        m = mask() if mask is not None else None
        watched = [module, q, k, v] + ([m] if m is not None else [])
        return lambda: module(q, k, v, mask=m), pattern, watched


mha_case("query width", r"query: got shape \(2, 4, 8\), expected \(B, T, 12\)", query=(2, 4, 8))
mha_case("query rank", r"query: got shape \(4, 12\) \(2-D\), expected \(B, T, 12\)", query=(4, 12))
mha_case("key width", r"key: got shape \(2, 6, 12\), expected \(B, S, 5\)", key=(2, 6, 12))
mha_case(
    "batch",
    r"query, key, value: got batch sizes 2, 3, 3, expected one",
    key=(3, 6, 5),
    value=(3, 6, 7),
)
mha_case(
    "S mismatch",
    r"value: got shape \(2, 5, 7\), expected S=6 positions to match key \(2, 6, 5\)",
    value=(2, 5, 7),
)
mha_case(
    "mask does not broadcast",
    r"mask: got shape \(4, 7\), expected a shape that broadcasts to \(2, 3, 4, 6\) \(B, H, T, S\)",
    mask=lambda: torch.ones(4, 7, dtype=torch.bool),
)
mha_case(
    "integer mask",
    r"mask: got dtype torch.int64, expected torch.bool",
    mask=lambda: torch.ones(4, 6, dtype=torch.long),
)

# --- norms --------------------------------------------------------------------------------


@case("LayerNorm: wrong trailing shape")
def _():
    module = LayerNorm((4, 5))
    x = torch.randn(2, 3, 5, 4)
    pattern = r"x: got shape \(2, 3, 5, 4\), expected trailing dimensions \(4, 5\)"
    return lambda: module(x), pattern, [module, x]


@case("LayerNorm: too few dimensions")
def _():
    module = LayerNorm((4, 5))
    x = torch.randn(5)
    return (
        lambda: module(x),
        r"x: got shape \(5,\), expected trailing dimensions \(4, 5\)",
        [module],
    )


@case("LayerNorm: integer input")
def _():
    module = LayerNorm(3)
    x = torch.ones(2, 3, dtype=torch.long)
    return lambda: module(x), r"x: got dtype torch.int64", [module, x]


@case("LayerNorm: empty normalized_shape")
def _():
    return lambda: LayerNorm(()), r"normalized_shape: got \(\), expected at least one", []


@case("LayerNorm: zero size")
def _():
    return lambda: LayerNorm((4, 0)), r"normalized_shape: got 0, expected a positive int", []


def trained_batch_norm():
    """A BatchNorm1d whose running statistics are no longer the defaults."""
    module = BatchNorm1d(4)
    for _ in range(2):
        module(torch.randn(8, 4) * 3 + 1)
    return module


@case("BatchNorm1d: one value per channel (B, C)")
def _():
    module = trained_batch_norm()
    x = torch.randn(1, 4)
    pattern = r"x: got shape \(1, 4\), expected more than 1 value per channel when training"
    return lambda: module(x), pattern, [module, x]


@case("BatchNorm1d: one value per channel (B, C, L)")
def _():
    module = trained_batch_norm()
    x = torch.randn(1, 4, 1)
    pattern = r"x: got shape \(1, 4, 1\), expected more than 1 value per channel"
    return lambda: module(x), pattern, [module, x]


@case("BatchNorm1d: wrong num_features")
def _():
    module = trained_batch_norm()
    x = torch.randn(8, 5)
    pattern = r"x: got shape \(8, 5\), expected \(B, 4\) or \(B, 4, L\) with num_features=4"
    return lambda: module(x), pattern, [module, x]


@case("BatchNorm1d: wrong num_features in eval")
def _():
    module = trained_batch_norm().eval()
    x = torch.randn(8, 5, 3)
    return lambda: module(x), r"x: got shape \(8, 5, 3\), expected \(B, 4\)", [module, x]


@case("BatchNorm1d: 4-D input")
def _():
    module = trained_batch_norm()
    x = torch.randn(2, 4, 3, 3)
    return lambda: module(x), r"x: got shape \(2, 4, 3, 3\), expected \(B, 4\)", [module, x]


@case("BatchNorm1d: momentum")
def _():
    return lambda: BatchNorm1d(4, momentum=2.0), r"momentum: got 2.0, expected a float", []


@case("BatchNorm1d: num_features")
def _():
    return lambda: BatchNorm1d(0), r"num_features: got 0, expected a positive int", []


# --- feed-forward and positions -----------------------------------------------------------


@case("PositionwiseFeedForward: wrong d_model")
def _():
    module = PositionwiseFeedForward(6, 10)
    x = torch.randn(2, 3, 5)
    return (
        lambda: module(x),
        r"x: got shape \(2, 3, 5\), expected \(\.\.\., d_model=6\)",
        [module, x],
    )


@case("PositionwiseFeedForward: activation")
def _():
    pattern = r"activation: got 'tanh', expected one of \('relu', 'gelu'\)"
    return lambda: PositionwiseFeedForward(6, 10, activation="tanh"), pattern, []


@case("sinusoidal_positional_encoding: max_len 0")
def _():
    return lambda: sinusoidal_positional_encoding(0, 4), r"max_len: got 0, expected a positive", []


@case("PositionalEncoding: longer than max_len")
def _():
    module = PositionalEncoding(6, max_len=8)
    x = torch.randn(2, 9, 6)
    pattern = r"x: got a sequence of length 9 starting at position 0, expected at most max_len=8"
    return lambda: module(x), pattern, [module, x]


@case("PositionalEncoding: start + length beyond max_len")
def _():
    module = PositionalEncoding(6, max_len=8)
    x = torch.randn(2, 4, 6)
    pattern = r"length 4 starting at position 5, expected at most max_len=8"
    return lambda: module(x, start=5), pattern, [module, x]


@case("PositionalEncoding: wrong width")
def _():
    module = PositionalEncoding(6, max_len=8)
    x = torch.randn(2, 4, 5)
    return lambda: module(x), r"x: got shape \(2, 4, 5\), expected \(B, T, 6\)", [module, x]


@case("LearnedPositionalEmbedding: longer than max_len")
def _():
    module = LearnedPositionalEmbedding(6, max_len=8)
    x = torch.randn(2, 9, 6)
    return lambda: module(x), r"x: got a sequence of length 9 .* max_len=8", [module, x]


# --- Transformer --------------------------------------------------------------------------


def small_model(**kwargs):
    settings = dict(d_model=8, num_heads=2, num_encoder_layers=1, num_decoder_layers=1, d_ff=16)
    settings.update(max_len=10, pad_id=0, dropout=0.1)
    settings.update(kwargs)
    return Transformer(11, 9, **settings).train()


@case("EncoderLayer: dropout")
def _():
    return lambda: EncoderLayer(8, 2, 16, dropout=1.5), r"dropout: got 1.5, expected a prob", []


@case("EncoderLayer: d_model % num_heads")
def _():
    return lambda: EncoderLayer(8, 3, 16), r"num_heads: got 3, expected a divisor of d_model=8", []


@pytest.mark.parametrize("pad_id", [-1, 9, 11, 1.0, "0"])
def test_transformer_rejects_bad_pad_id(pad_id):
    pattern = rf"pad_id: got {pad_id!r}, expected None or an int in \[0, 9\)".replace("'", ".")
    with pytest.raises(ValueError, match=pattern):
        small_model(pad_id=pad_id)


def transformer_case(name, pattern, src, tgt, method="forward"):
    @case("Transformer: " + name)
    def build():
        model = small_model()
        s, t = src(), tgt()
        if method == "forward":
            return lambda: model(s, t), pattern, [model, s, t]
        memory = torch.randn(s.shape[0], s.shape[1], 8)
        return lambda: model.decode(t, memory, src=s), pattern, [model, s, t, memory]


def ids(*shape, high=9):
    return lambda: torch.randint(1, high, shape)


transformer_case(
    "src id outside the vocabulary",
    r"src: got token ids in \[1, 11\], expected ids in \[0, 10\] \(vocabulary size 11\)",
    lambda: torch.tensor([[1, 2, 11]]),
    ids(1, 3),
)
transformer_case(
    "tgt id outside the vocabulary",
    r"tgt: got token ids in \[1, 9\], expected ids in \[0, 8\] \(vocabulary size 9\)",
    ids(1, 3),
    lambda: torch.tensor([[1, 9]]),
)
transformer_case(
    "negative tgt id",
    r"tgt: got token ids in \[-1, 3\]",
    ids(1, 3),
    lambda: torch.tensor([[-1, 3]]),
)
transformer_case(
    "src longer than max_len",
    r"src: got length 11, expected 1 to max_len=10 tokens",
    ids(2, 11),
    ids(2, 3),
)
transformer_case(
    "tgt longer than max_len",
    r"tgt: got length 12, expected 1 to max_len=10",
    ids(2, 3),
    ids(2, 12),
)
transformer_case("empty src", r"src: got length 0, expected 1 to max_len=10", ids(2, 0), ids(2, 3))
transformer_case(
    "float token ids",
    r"src: got dtype torch.float32, expected integer token ids",
    lambda: torch.ones(2, 3),
    ids(2, 3),
)
transformer_case("src rank", r"src: got shape \(3,\) \(1-D\), expected \(B, L\)", ids(3), ids(1, 3))
transformer_case(
    "batch mismatch", r"tgt: got batch size 3, expected 2 to match src", ids(2, 4), ids(3, 4)
)
transformer_case(
    "decode: tgt id outside the vocabulary",
    r"tgt: got token ids in \[1, 9\]",
    ids(2, 4),
    lambda: torch.tensor([[1, 9], [1, 2]]),
    method="decode",
)


@case("Transformer.decode: memory width")
def _():
    model = small_model()
    tgt, memory = torch.randint(1, 9, (2, 3)), torch.randn(2, 5, 6)
    pattern = r"memory: got shape \(2, 5, 6\), expected \(2, S, 8\) to match tgt \(2, 3\)"
    return lambda: model.decode(tgt, memory), pattern, [model, tgt, memory]


@case("Transformer.decode: src shape differs from memory")
def _():
    model = small_model()
    src, tgt, memory = (
        torch.randint(1, 9, (2, 4)),
        torch.randint(1, 9, (2, 3)),
        torch.randn(2, 5, 8),
    )
    pattern = r"src: got shape \(2, 4\), expected \(2, 5\), the \(B, S\) of memory"
    return lambda: model.decode(tgt, memory, src=src), pattern, [model, src, tgt, memory]


@case("greedy_decode: max_len above the model's")
def _():
    model, src = small_model(), torch.randint(1, 9, (2, 4))
    pattern = r"max_len: got 11, expected at most the model's max_len=10"
    return lambda: greedy_decode(model, src, 11, 1, 2), pattern, [model, src]


@case("greedy_decode: bos_id outside the vocabulary")
def _():
    model, src = small_model(), torch.randint(1, 9, (2, 4))
    pattern = r"bos_id: got 9, expected a token id in \[0, 8\]"
    return lambda: greedy_decode(model, src, 5, 9, 2), pattern, [model, src]


@case("greedy_decode: src id outside the vocabulary")
def _():
    model, src = small_model(), torch.tensor([[3, 12]])
    return (
        lambda: greedy_decode(model, src, 5, 1, 2),
        r"src: got token ids in \[3, 12\]",
        [model, src],
    )


@case("greedy_decode: not a Transformer")
def _():
    model, src = nn.Linear(3, 3), torch.randint(1, 9, (2, 4))
    pattern = r"model: got Linear, expected a Transformer"
    return lambda: greedy_decode(model, src, 5, 1, 2), pattern, [model, src]


# --- interop, devices, seeds, data --------------------------------------------------------


@case("copy_weights_from_torch: unsupported pair")
def _():
    ours, theirs = MultiHeadAttention(8, 2), nn.Linear(8, 8)
    pattern = r"ours, theirs: got MultiHeadAttention and Linear, expected one of the supported"
    return lambda: copy_weights_from_torch(ours, theirs), pattern, [ours]


@case("copy_weights_from_torch: different head count")
def _():
    ours, theirs = MultiHeadAttention(8, 2), nn.MultiheadAttention(8, 4)
    pattern = r"num_heads: got 4 in the PyTorch module, expected 2"
    return lambda: copy_weights_from_torch(ours, theirs), pattern, [ours]


@case("copy_weights_from_torch: kdim mismatch after matching w_q")
def _():
    ours = MultiHeadAttention(8, 2, kdim=5, vdim=8)
    theirs = nn.MultiheadAttention(8, 2, kdim=6, vdim=8)
    pattern = r"w_k.weight: got shape \(8, 6\), expected \(8, 5\)"
    return lambda: copy_weights_from_torch(ours, theirs), pattern, [ours]


@case("copy_weights_from_torch: BatchNorm into LayerNorm")
def _():
    ours, theirs = LayerNorm(4), nn.BatchNorm1d(4)
    return lambda: copy_weights_from_torch(ours, theirs), r"got state_dict keys", [ours]


@case("copy_weights_from_torch: norm_first differs")
def _():
    ours = EncoderLayer(8, 2, 16, norm_first=True)
    theirs = nn.TransformerEncoderLayer(8, 2, 16, batch_first=True)
    pattern = r"norm_first: got False in the PyTorch module, expected True"
    return lambda: copy_weights_from_torch(ours, theirs), pattern, [ours]


@case("get_device: nonsense")
def _():
    return lambda: get_device("nonsense"), r"prefer: got 'nonsense', expected a device name", []


@case("seed_everything: a string")
def _():
    return lambda: seed_everything("0"), r"seed: got '0' \(str\), expected an int", []


@case("make_sequence_task: unknown task")
def _():
    pattern = r"task: got 'shuffle', expected one of \('copy', 'reverse', 'sort'\)"
    return lambda: make_sequence_task("shuffle", 4, 1, 3), pattern, []


@case("make_sequence_task: min_len > max_len")
def _():
    return lambda: make_sequence_task("copy", 4, 5, 3), r"min_len, max_len: got 5, 3", []


# --- the test -----------------------------------------------------------------------------


def snapshot(watched):
    state = []
    for item in watched:
        if isinstance(item, nn.Module):
            params = {k: v.detach().clone() for k, v in item.state_dict().items()}
            modes = [m.training for m in item.modules()]
            state.append((params, modes))
        else:
            state.append(item.detach().clone())
    return state


def assert_same(before, after):
    for old, new in zip(before, after):
        if isinstance(old, tuple):
            assert old[1] == new[1], "a module's train/eval mode changed"
            assert list(old[0]) == list(new[0])
            for name in old[0]:
                assert torch.equal(old[0][name], new[0][name]), f"{name} changed"
        else:
            assert torch.equal(old, new), "an input tensor was modified"


@pytest.mark.parametrize("name", list(CASES))
def test_bad_input_raises_value_error_and_changes_nothing(name):
    call, pattern, watched = CASES[name]()
    before = snapshot(watched)
    with pytest.raises(ValueError, match=pattern):
        call()
    assert_same(before, snapshot(watched))


def test_batch_norm_with_one_sample_is_fine_in_eval():
    module = trained_batch_norm().eval()
    before = snapshot([module])
    module(torch.randn(1, 4))
    assert_same(before, snapshot([module]))  # evaluation never updates the statistics
