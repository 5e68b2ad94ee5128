"""Buggy encoder and decoder layers, built from the reference sublayers the way an
exercise notebook would provide them."""

from torch import nn

from attention_course import LayerNorm, MultiHeadAttention, PositionwiseFeedForward


class _EncoderBase(nn.Module):
    def __init__(self, d_model, num_heads, d_ff, dropout=0.1, norm_first=False):
        super().__init__()
        self.norm_first = norm_first
        self.self_attn = MultiHeadAttention(d_model, num_heads, dropout=dropout)
        self.ffn = PositionwiseFeedForward(d_model, d_ff, dropout=dropout)
        self.norm1 = LayerNorm(d_model)
        self.norm2 = LayerNorm(d_model)
        self.dropout1 = nn.Dropout(dropout)
        self.dropout2 = nn.Dropout(dropout)

    def sa(self, x, mask):
        return self.dropout1(self.self_attn(x, x, x, mask=mask)[0])

    def ff(self, x):
        return self.dropout2(self.ffn(x))

    def forward(self, x, mask=None):
        if self.norm_first:
            x = x + self.sa(self.norm1(x), mask)
            return x + self.ff(self.norm2(x))
        x = self.norm1(x + self.sa(x, mask))
        return self.norm2(x + self.ff(x))


class EncoderAlwaysPostNorm(_EncoderBase):
    """Ignores norm_first: always post-norm."""

    def forward(self, x, mask=None):
        x = self.norm1(x + self.sa(x, mask))
        return self.norm2(x + self.ff(x))


class EncoderNoAttentionResidual(_EncoderBase):
    """Drops the residual around self-attention."""

    def forward(self, x, mask=None):
        if self.norm_first:
            x = self.sa(self.norm1(x), mask)
            return x + self.ff(self.norm2(x))
        x = self.norm1(self.sa(x, mask))
        return self.norm2(x + self.ff(x))


class EncoderNormsSwapped(_EncoderBase):
    """Uses norm2 after attention and norm1 after the FFN."""

    def forward(self, x, mask=None):
        if self.norm_first:
            x = x + self.sa(self.norm2(x), mask)
            return x + self.ff(self.norm1(x))
        x = self.norm2(x + self.sa(x, mask))
        return self.norm1(x + self.ff(x))


class EncoderResidualFromNormed(_EncoderBase):
    """Pre-norm that overwrites x with norm(x) before adding the residual."""

    def forward(self, x, mask=None):
        if self.norm_first:
            x = self.norm1(x)
            x = x + self.sa(x, mask)
            x = self.norm2(x)
            return x + self.ff(x)
        return super().forward(x, mask)


class EncoderIgnoresMask(_EncoderBase):
    """Never passes the mask on to self-attention."""

    def sa(self, x, mask):
        return self.dropout1(self.self_attn(x, x, x)[0])


class _DecoderBase(nn.Module):
    def __init__(self, d_model, num_heads, d_ff, dropout=0.1, norm_first=False):
        super().__init__()
        self.norm_first = norm_first
        self.self_attn = MultiHeadAttention(d_model, num_heads, dropout=dropout)
        self.cross_attn = MultiHeadAttention(d_model, num_heads, dropout=dropout)
        self.ffn = PositionwiseFeedForward(d_model, d_ff, dropout=dropout)
        self.norm1 = LayerNorm(d_model)
        self.norm2 = LayerNorm(d_model)
        self.norm3 = LayerNorm(d_model)
        self.dropout1 = nn.Dropout(dropout)
        self.dropout2 = nn.Dropout(dropout)
        self.dropout3 = nn.Dropout(dropout)

    def sa(self, x, mask):
        return self.dropout1(self.self_attn(x, x, x, mask=mask)[0])

    def ca(self, x, memory, mask):
        return self.dropout2(self.cross_attn(x, memory, memory, mask=mask)[0])

    def forward(self, x, memory, tgt_mask=None, memory_mask=None):
        if self.norm_first:
            x = x + self.sa(self.norm1(x), tgt_mask)
            x = x + self.ca(self.norm2(x), memory, memory_mask)
            return x + self.dropout3(self.ffn(self.norm3(x)))
        x = self.norm1(x + self.sa(x, tgt_mask))
        x = self.norm2(x + self.ca(x, memory, memory_mask))
        return self.norm3(x + self.dropout3(self.ffn(x)))


class DecoderQueriesFromMemory(_DecoderBase):
    """Cross-attention with queries from the encoder memory, keys/values from x."""

    def ca(self, x, memory, mask):
        return self.dropout2(self.cross_attn(memory, x, x)[0])


class DecoderSelfAttendsTwice(_DecoderBase):
    """Cross-attention attends to x itself: the encoder output is never used."""

    def ca(self, x, memory, mask):
        return self.dropout2(self.cross_attn(x, x, x)[0])


class DecoderIgnoresTgtMask(_DecoderBase):
    """Forgets the causal mask in self-attention: the decoder sees the future."""

    def sa(self, x, mask):
        return self.dropout1(self.self_attn(x, x, x)[0])


class DecoderNoCrossResidual(_DecoderBase):
    """Replaces x by the cross-attention output instead of adding it."""

    def forward(self, x, memory, tgt_mask=None, memory_mask=None):
        if self.norm_first:
            x = x + self.sa(self.norm1(x), tgt_mask)
            x = self.ca(self.norm2(x), memory, memory_mask)
            return x + self.dropout3(self.ffn(self.norm3(x)))
        x = self.norm1(x + self.sa(x, tgt_mask))
        x = self.norm2(self.ca(x, memory, memory_mask))
        return self.norm3(x + self.dropout3(self.ffn(x)))


class DecoderAlwaysPreNorm(_DecoderBase):
    """Ignores norm_first: always pre-norm."""

    def forward(self, x, memory, tgt_mask=None, memory_mask=None):
        x = x + self.sa(self.norm1(x), tgt_mask)
        x = x + self.ca(self.norm2(x), memory, memory_mask)
        return x + self.dropout3(self.ffn(self.norm3(x)))


CATALOGUE = [
    (
        "encoder_layer",
        "always post-norm",
        EncoderAlwaysPostNorm,
        "norm_first=True asks for pre-norm",
    ),
    (
        "encoder_layer",
        "no attention residual",
        EncoderNoAttentionResidual,
        "residual connection around self-attention is missing",
    ),
    ("encoder_layer", "norms swapped", EncoderNormsSwapped, "norm1 and norm2 are swapped"),
    (
        "encoder_layer",
        "residual from normed x",
        EncoderResidualFromNormed,
        "residual starts from the normalised x",
    ),
    ("encoder_layer", "ignores mask", EncoderIgnoresMask, "mask is not passed"),
    (
        "decoder_layer",
        "queries from memory",
        DecoderQueriesFromMemory,
        "queries from the encoder memory",
    ),
    ("decoder_layer", "self-attends twice", DecoderSelfAttendsTwice, "never looks at the encoder"),
    ("decoder_layer", "ignores tgt_mask", DecoderIgnoresTgtMask, "tgt_mask is not passed"),
    (
        "decoder_layer",
        "no cross residual",
        DecoderNoCrossResidual,
        "around cross-attention is missing",
    ),
    (
        "decoder_layer",
        "always pre-norm",
        DecoderAlwaysPreNorm,
        "norm_first=False asks for post-norm",
    ),
]
