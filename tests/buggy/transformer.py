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


class _EncoderWithWeights(_EncoderBase):
    """The correct layer, `return_attention` included; subclasses change one thing."""

    def attend(self, h, mask):
        out, weights = self.self_attn(h, h, h, mask=mask)
        return self.dropout1(out), weights

    def forward(self, x, mask=None, return_attention=False):
        if self.norm_first:
            h, weights = self.attend(self.norm1(x), mask)
            x = x + h
            x = x + self.ff(self.norm2(x))
        else:
            h, weights = self.attend(x, mask)
            x = self.norm1(x + h)
            x = self.norm2(x + self.ff(x))
        return self.result(x, weights) if return_attention else x

    def result(self, x, weights):
        return x, weights


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


class EncoderDropsSublayerInput(_EncoderBase):
    """Pre-norm with an extra dropout between each norm and its sublayer."""

    def forward(self, x, mask=None):
        if self.norm_first:
            x = x + self.sa(self.dropout1(self.norm1(x)), mask)
            return x + self.ff(self.dropout2(self.norm2(x)))
        return super().forward(x, mask)


class EncoderDropsKeysValues(_EncoderBase):
    """A dropout on the self-attention's keys and values only (the query is right)."""

    def sa(self, x, mask):
        kv = self.dropout1(x)
        return self.dropout1(self.self_attn(x, kv, kv, mask=mask)[0])


class EncoderIgnoresMask(_EncoderBase):
    """Never passes the mask on to self-attention."""

    def sa(self, x, mask):
        return self.dropout1(self.self_attn(x, x, x)[0])


class EncoderNoResidualDropout(_EncoderWithWeights):
    """Builds dropout1/dropout2 but never applies them to the sublayer outputs."""

    def attend(self, h, mask):
        return self.self_attn(h, h, h, mask=mask)

    def ff(self, x):
        return self.ffn(x)


class EncoderIgnoresDropout(_EncoderWithWeights):
    """Ignores the dropout argument: every sublayer and dropout is built with 0.0."""

    def __init__(self, d_model, num_heads, d_ff, dropout=0.1, norm_first=False):
        super().__init__(d_model, num_heads, d_ff, 0.0, norm_first)


class EncoderAlwaysReturnsX(_EncoderWithWeights):
    """Accepts return_attention but always returns x alone."""

    def result(self, x, weights):
        return x


class EncoderAveragedWeights(_EncoderWithWeights):
    """Returns the head-averaged weights (B, T, T) instead of one map per head."""

    def result(self, x, weights):
        return x, weights.mean(dim=1)


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


class DecoderResidualFromNormed(_DecoderBase):
    """Pre-norm that overwrites x with norm(x) before each residual addition."""

    def forward(self, x, memory, tgt_mask=None, memory_mask=None):
        if self.norm_first:
            x = self.norm1(x)
            x = x + self.sa(x, tgt_mask)
            x = self.norm2(x)
            x = x + self.ca(x, memory, memory_mask)
            x = self.norm3(x)
            return x + self.dropout3(self.ffn(x))
        return super().forward(x, memory, tgt_mask, memory_mask)


class DecoderDropsSublayerInput(_DecoderBase):
    """Pre-norm with an extra dropout between each norm and its sublayer (the branch
    dropout is there too): in training the sublayers get a dropped-out input."""

    def forward(self, x, memory, tgt_mask=None, memory_mask=None):
        if self.norm_first:
            x = x + self.sa(self.dropout1(self.norm1(x)), tgt_mask)
            x = x + self.ca(self.dropout2(self.norm2(x)), memory, memory_mask)
            return x + self.dropout3(self.ffn(self.dropout3(self.norm3(x))))
        return super().forward(x, memory, tgt_mask, memory_mask)


class DecoderDropsMemory(_DecoderBase):
    """A dropout on the encoder memory before the cross-attention."""

    def forward(self, x, memory, tgt_mask=None, memory_mask=None):
        return super().forward(x, self.dropout2(memory), tgt_mask, memory_mask)


class _DecoderWithWeights(_DecoderBase):
    """The correct decoder layer, `return_attention` included; subclasses change one thing."""

    def self_block(self, h, mask):
        out, weights = self.self_attn(h, h, h, mask=mask)
        return self.dropout1(out), weights

    def cross_block(self, h, memory, mask):
        out, weights = self.cross_attn(h, memory, memory, mask=mask)
        return self.dropout2(out), weights

    def forward(self, x, memory, tgt_mask=None, memory_mask=None, return_attention=False):
        if self.norm_first:
            h, self_w = self.self_block(self.norm1(x), tgt_mask)
            x = x + h
            h, cross_w = self.cross_block(self.norm2(x), memory, self.pre_memory_mask(memory_mask))
            x = x + h
            x = x + self.ffn_residual(self.ffn(self.norm3(x)))
        else:
            h, self_w = self.self_block(x, tgt_mask)
            x = self.norm1(x + h)
            h, cross_w = self.cross_block(x, memory, memory_mask)
            x = self.norm2(x + h)
            x = self.norm3(x + self.dropout3(self.ffn(x)))
        if return_attention:
            return x, self.weights(self_w, cross_w)
        return x

    def pre_memory_mask(self, memory_mask):
        return memory_mask

    def ffn_residual(self, h):
        return self.dropout3(h)

    def weights(self, self_w, cross_w):
        return {"self": self_w, "cross": cross_w}


class DecoderSwappedWeights(_DecoderWithWeights):
    """Returns the self- and cross-attention weights under each other's names."""

    def weights(self, self_w, cross_w):
        return {"self": cross_w, "cross": self_w}


class DecoderAveragedWeights(_DecoderWithWeights):
    """Returns head-averaged weights (B, T, S) for the cross-attention."""

    def weights(self, self_w, cross_w):
        return {"self": self_w, "cross": cross_w.mean(dim=1)}


class DecoderPreNormIgnoresMemoryMask(_DecoderWithWeights):
    """Forgets memory_mask in the pre-norm branch only (post-norm passes it on)."""

    def pre_memory_mask(self, memory_mask):
        return None


class DecoderFFNWithoutDropout(_DecoderWithWeights):
    """Builds its feed-forward network without the dropout argument."""

    def __init__(self, d_model, num_heads, d_ff, dropout=0.1, norm_first=False):
        super().__init__(d_model, num_heads, d_ff, dropout, norm_first)
        self.ffn = PositionwiseFeedForward(d_model, d_ff)


class DecoderPreNormNoFFNDropout(_DecoderWithWeights):
    """Forgets dropout3 on the feed-forward branch, in the pre-norm branch only."""

    def ffn_residual(self, h):
        return h


class DecoderMemoryNormedPreNorm(_DecoderWithWeights):
    """Pre-norm that normalises the encoder memory with norm2 as well as the stream."""

    def cross_block(self, h, memory, mask):
        if self.norm_first:
            memory = self.norm2(memory)
        return super().cross_block(h, memory, mask)


class DecoderMasksSwapped(_DecoderWithWeights):
    """Passes memory_mask to the self-attention and tgt_mask to the cross-attention."""

    def forward(self, x, memory, tgt_mask=None, memory_mask=None, return_attention=False):
        return super().forward(x, memory, memory_mask, tgt_mask, return_attention)


CATALOGUE = [
    (
        "decoder_layer",
        "pre-norm normalises memory",
        DecoderMemoryNormedPreNorm,
        "the memory is normalised too",
    ),
    ("decoder_layer", "masks swapped", DecoderMasksSwapped, "goes to the self-attention"),
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
        "encoder_layer",
        "no residual dropout",
        EncoderNoResidualDropout,
        "after the self-attention is not dropped out (no dropout there",
    ),
    (
        "encoder_layer",
        "ignores dropout",
        EncoderIgnoresDropout,
        "the `dropout` argument is ignored",
    ),
    (
        "encoder_layer",
        "always returns x",
        EncoderAlwaysReturnsX,
        "with return_attention=True return the pair (x, weights)",
    ),
    (
        "encoder_layer",
        "head-averaged weights",
        EncoderAveragedWeights,
        "the weights are averaged over the heads",
    ),
    (
        "decoder_layer",
        "self/cross swapped",
        DecoderSwappedWeights,
        'the "self" and "cross" weights are swapped',
    ),
    (
        "decoder_layer",
        "head-averaged cross weights",
        DecoderAveragedWeights,
        "the weights are averaged over the heads",
    ),
    (
        "decoder_layer",
        "memory_mask ignored in pre-norm",
        DecoderPreNormIgnoresMemoryMask,
        "memory_mask is not passed to the cross-attention",
    ),
    (
        "decoder_layer",
        "no FFN dropout in pre-norm",
        DecoderPreNormNoFFNDropout,
        "after the feed-forward network is not dropped out (no dropout there",
    ),
    (
        "decoder_layer",
        "FFN built without dropout",
        DecoderFFNWithoutDropout,
        "the `dropout` argument does not reach self.ffn",
    ),
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
    (
        "decoder_layer",
        "residual from normed x",
        DecoderResidualFromNormed,
        "residual starts from the normalised x",
    ),
    (
        "decoder_layer",
        "dropout on the sublayer's input",
        DecoderDropsSublayerInput,
        "the self-attention does not receive norm1(x)",
    ),
    (
        "encoder_layer",
        "dropout on the sublayer's input",
        EncoderDropsSublayerInput,
        "the self-attention does not receive norm1(x)",
    ),
    (
        "encoder_layer",
        "dropout on the keys and values",
        EncoderDropsKeysValues,
        "the self-attention's keys are not its queries",
    ),
    (
        "decoder_layer",
        "dropout on the memory",
        DecoderDropsMemory,
        "the cross-attention's keys are not the memory",
    ),
]
