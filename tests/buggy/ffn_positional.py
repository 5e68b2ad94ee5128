"""Buggy position-wise feed-forward networks and sinusoidal positional encodings."""

import math

import torch
import torch.nn.functional as F
from torch import nn


class _FFNBase(nn.Module):
    def __init__(self, d_model, d_ff, dropout=0.0, activation="relu"):
        super().__init__()
        self.activation = activation
        self.linear1 = nn.Linear(d_model, d_ff)
        self.dropout = nn.Dropout(dropout)
        self.linear2 = nn.Linear(d_ff, d_model)

    def act(self, h):
        return F.relu(h) if self.activation == "relu" else F.gelu(h)

    def forward(self, x):
        return self.linear2(self.dropout(self.act(self.linear1(x))))


class FFNNoActivation(_FFNBase):
    """Forgets the nonlinearity: two linear maps collapse into one."""

    def act(self, h):
        return h


class FFNWithResidual(_FFNBase):
    """Adds the residual inside the FFN (it belongs to the encoder layer)."""

    def forward(self, x):
        return x + super().forward(x)


class FFNAlwaysRelu(_FFNBase):
    """Ignores the `activation` argument."""

    def act(self, h):
        return F.relu(h)


class FFNTanhGelu(_FFNBase):
    """Uses the tanh approximation of GELU."""

    def act(self, h):
        return F.relu(h) if self.activation == "relu" else F.gelu(h, approximate="tanh")


class FFNSequential(nn.Module):
    """Wraps the layers in an nn.Sequential: the keys become net.0.weight, net.3.weight..."""

    def __init__(self, d_model, d_ff, dropout=0.0, activation="relu"):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(d_model, d_ff), nn.ReLU(), nn.Dropout(dropout), nn.Linear(d_ff, d_model)
        )

    def forward(self, x):
        return self.net(x)


class FFNDropoutAfterLinear2(_FFNBase):
    """Puts dropout after linear2 (on the output) instead of on the hidden activations."""

    def forward(self, x):
        return self.dropout(self.linear2(self.act(self.linear1(x))))


class FFNIgnoresDropout(_FFNBase):
    """Ignores the dropout argument: nn.Dropout(0.0) never drops anything."""

    def __init__(self, d_model, d_ff, dropout=0.0, activation="relu"):
        super().__init__(d_model, d_ff, 0.0, activation)


class FFNDropoutAlwaysOn(_FFNBase):
    """Calls F.dropout(..., training=True): dropout stays on in eval mode."""

    def forward(self, x):
        h = F.dropout(self.act(self.linear1(x)), self.dropout.p, training=True)
        return self.linear2(h)


def pe_sin_cos_swapped(max_len, d_model):
    """Puts cos in the even columns and sin in the odd ones."""
    pe = torch.zeros(max_len, d_model)
    position = torch.arange(max_len).float()[:, None]
    div = 10000 ** (torch.arange(0, d_model, 2).float() / d_model)
    pe[:, 0::2] = torch.cos(position / div)
    pe[:, 1::2] = torch.sin(position / div)
    return pe


def pe_column_exponent(max_len, d_model):
    """Uses the column index j in the exponent, so odd columns get (2i+1)/d."""
    pe = torch.zeros(max_len, d_model)
    for pos in range(max_len):
        for j in range(d_model):
            angle = pos / 10000 ** (j / d_model)
            pe[pos, j] = math.sin(angle) if j % 2 == 0 else math.cos(angle)
    return pe


def pe_pair_index_exponent(max_len, d_model):
    """Writes i/d instead of 2i/d in the exponent."""
    pe = torch.zeros(max_len, d_model)
    position = torch.arange(max_len).float()[:, None]
    i = torch.arange(0, d_model // 2).float()
    angle = position / 10000 ** (i / d_model)
    pe[:, 0::2] = torch.sin(angle)
    pe[:, 1::2] = torch.cos(angle)
    return pe


def pe_odd_next_pair(max_len, d_model):
    """Gives column 2i+1 the angle of the next pair, p / 10000^(2(i+1)/d)."""
    pe = torch.zeros(max_len, d_model)
    position = torch.arange(max_len).float()[:, None]
    two_i = torch.arange(0, d_model, 2).float()
    pe[:, 0::2] = torch.sin(position / 10000 ** (two_i / d_model))
    pe[:, 1::2] = torch.cos(position / 10000 ** ((two_i + 2) / d_model))
    return pe


def pe_concatenated(max_len, d_model):
    """Concatenates all sines then all cosines instead of interleaving them."""
    position = torch.arange(max_len).float()[:, None]
    angle = position / 10000 ** (torch.arange(0, d_model, 2).float() / d_model)
    return torch.cat([torch.sin(angle), torch.cos(angle)], dim=-1)


def pe_float64(max_len, d_model):
    """Right values computed with numpy-style float64 and returned as float64."""
    position = torch.arange(max_len, dtype=torch.float64)[:, None]
    angle = position / 10000 ** (torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)
    pe = torch.zeros(max_len, d_model, dtype=torch.float64)
    pe[:, 0::2] = torch.sin(angle)
    pe[:, 1::2] = torch.cos(angle)
    return pe


def pe_literal_hint(max_len, d_model):
    """Follows the hint literally: pe[:, 1::2] = cos(angle) with ceil(d/2) angles crashes on
    an odd d_model."""
    position = torch.arange(max_len).float()[:, None]
    angle = position / 10000 ** (torch.arange(0, d_model, 2).float() / d_model)
    pe = torch.zeros(max_len, d_model)
    pe[:, 0::2] = torch.sin(angle)
    pe[:, 1::2] = torch.cos(angle)
    return pe


def pe_odd_width_plus_one(max_len, d_model):
    """For an odd d_model builds the table for d_model + 1 and cuts the last column."""
    width = d_model + d_model % 2
    position = torch.arange(max_len).float()[:, None]
    angle = position / 10000 ** (torch.arange(0, width, 2).float() / width)
    pe = torch.zeros(max_len, width)
    pe[:, 0::2] = torch.sin(angle)
    pe[:, 1::2] = torch.cos(angle)
    return pe[:, :d_model]


CATALOGUE = [
    (
        "positionwise_feed_forward",
        "dropout on in eval mode",
        FFNDropoutAlwaysOn,
        "dropout is active in eval mode",
    ),
    ("positionwise_feed_forward", "no activation", FFNNoActivation, "activation is missing"),
    ("positionwise_feed_forward", "residual inside", FFNWithResidual, "you added a residual"),
    ("positionwise_feed_forward", "always relu", FFNAlwaysRelu, "`activation` argument is ignored"),
    ("positionwise_feed_forward", "tanh gelu", FFNTanhGelu, "tanh approximation"),
    ("positionwise_feed_forward", "nn.Sequential", FFNSequential, "missing: linear1.weight"),
    (
        "positionwise_feed_forward",
        "dropout after linear2",
        FFNDropoutAfterLinear2,
        "dropout is applied after linear2",
    ),
    (
        "positionwise_feed_forward",
        "ignores dropout",
        FFNIgnoresDropout,
        "the `dropout` argument is ignored",
    ),
    (
        "sinusoidal_positional_encoding",
        "sin/cos swapped",
        pe_sin_cos_swapped,
        "sin and cos are swapped",
    ),
    ("sinusoidal_positional_encoding", "column exponent", pe_column_exponent, "column index j"),
    (
        "sinusoidal_positional_encoding",
        "i/d exponent",
        pe_pair_index_exponent,
        "i/d instead of 2i/d",
    ),
    ("sinusoidal_positional_encoding", "odd column exponent", pe_odd_next_pair, "2(i+1)/d"),
    (
        "sinusoidal_positional_encoding",
        "concatenated",
        pe_concatenated,
        "[all sines | all cosines]",
    ),
    ("sinusoidal_positional_encoding", "float64", pe_float64, "expected dtype torch.float32"),
    (
        "sinusoidal_positional_encoding",
        "crashes on odd d_model",
        pe_literal_hint,
        "only floor(d/2) cosine columns",
    ),
    (
        "sinusoidal_positional_encoding",
        "odd d_model as d_model + 1",
        pe_odd_width_plus_one,
        "built the table for d_model + 1",
    ),
]
