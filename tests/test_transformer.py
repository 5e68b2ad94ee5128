"""Encoder/decoder layers and stacks against nn.TransformerEncoder/DecoderLayer, and
properties of the full Transformer (causality, padding, permutation-equivariance)."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.testing import assert_close

from attention_course import (
    Decoder,
    DecoderLayer,
    Encoder,
    EncoderLayer,
    Transformer,
    causal_mask,
    copy_weights_from_torch,
    padding_mask,
    sinusoidal_positional_encoding,
)

B, T, S, D, H, FF = 2, 5, 7, 12, 3, 20
NORM_FIRST = pytest.mark.parametrize("norm_first", [False, True], ids=["post-norm", "pre-norm"])


def torch_encoder_layer(norm_first):
    return nn.TransformerEncoderLayer(
        D, H, FF, dropout=0.0, batch_first=True, norm_first=norm_first
    ).double()


def torch_decoder_layer(norm_first):
    return nn.TransformerDecoderLayer(
        D, H, FF, dropout=0.0, batch_first=True, norm_first=norm_first
    ).double()


def masks():
    """Causal and padding masks in both conventions: ours (True = attend) and PyTorch's."""
    tgt_lengths, src_lengths = torch.tensor([T, T - 2]), torch.tensor([S - 3, S])
    tgt_pad, src_pad = padding_mask(tgt_lengths, T), padding_mask(src_lengths, S)  # (B, T), (B, S)
    causal = causal_mask(T)
    ours = {
        "self": causal & tgt_pad[:, None, None, :],  # (T, T) & (B, 1, 1, T) -> (B, 1, T, T)
        "memory": src_pad[:, None, None, :],  # (B, 1, 1, S)
    }
    theirs = {"causal": ~causal, "tgt_pad": ~tgt_pad, "src_pad": ~src_pad}
    return ours, theirs


# --- single layers ------------------------------------------------------------------------


@NORM_FIRST
@pytest.mark.parametrize("masked", [False, True], ids=["no-mask", "causal+padding"])
def test_encoder_layer_matches_pytorch(randomize, norm_first, masked):
    theirs = randomize(torch_encoder_layer(norm_first)).eval()
    ours = copy_weights_from_torch(EncoderLayer(D, H, FF, 0.0, norm_first).double(), theirs)
    x = torch.randn(B, T, D, dtype=torch.float64)
    if masked:
        ours_m, theirs_m = masks()
        out = ours(x, mask=ours_m["self"])
        expected = theirs(x, src_mask=theirs_m["causal"], src_key_padding_mask=theirs_m["tgt_pad"])
    else:
        out, expected = ours(x), theirs(x)
    assert_close(out, expected)


@NORM_FIRST
@pytest.mark.parametrize("memory_case", ["none", "padding", "attn (T, S)"])
def test_decoder_layer_matches_pytorch(randomize, norm_first, memory_case):
    theirs = randomize(torch_decoder_layer(norm_first)).eval()
    ours = copy_weights_from_torch(DecoderLayer(D, H, FF, 0.0, norm_first).double(), theirs)
    x = torch.randn(B, T, D, dtype=torch.float64)
    memory = torch.randn(B, S, D, dtype=torch.float64)  # S != T: the memory has its own length
    ours_m, theirs_m = masks()
    kwargs = {"tgt_mask": theirs_m["causal"], "tgt_key_padding_mask": theirs_m["tgt_pad"]}
    memory_mask = None
    if memory_case == "padding":
        memory_mask = ours_m["memory"]
        kwargs["memory_key_padding_mask"] = theirs_m["src_pad"]
    elif memory_case == "attn (T, S)":
        memory_mask = torch.rand(T, S) < 0.5
        memory_mask[:, 0] = True
        kwargs["memory_mask"] = ~memory_mask
    out = ours(x, memory, tgt_mask=ours_m["self"], memory_mask=memory_mask)
    assert out.shape == (B, T, D)
    assert_close(out, theirs(x, memory, **kwargs))


@NORM_FIRST
def test_layer_gradients_match_pytorch(randomize, norm_first):
    theirs = randomize(torch_decoder_layer(norm_first)).eval()
    ours = copy_weights_from_torch(DecoderLayer(D, H, FF, 0.0, norm_first).double(), theirs)
    x = torch.randn(B, T, D, dtype=torch.float64, requires_grad=True)
    memory = torch.randn(B, S, D, dtype=torch.float64, requires_grad=True)
    ours(x, memory, tgt_mask=causal_mask(T)).square().sum().backward()
    grads = (x.grad.clone(), memory.grad.clone())
    x.grad = memory.grad = None
    theirs(x, memory, tgt_mask=~causal_mask(T)).square().sum().backward()
    assert_close(grads[0], x.grad)
    assert_close(grads[1], memory.grad)
    assert_close(ours.cross_attn.w_q.weight.grad, theirs.multihead_attn.in_proj_weight.grad[:D])
    assert_close(ours.norm3.weight.grad, theirs.norm3.weight.grad)


# --- stacks -------------------------------------------------------------------------------


@NORM_FIRST
def test_encoder_stack_matches_pytorch(randomize, norm_first):
    final = nn.LayerNorm(D) if norm_first else None
    theirs = nn.TransformerEncoder(
        torch_encoder_layer(norm_first), 2, norm=final, enable_nested_tensor=False
    )
    randomize(theirs.double()).eval()  # every layer and the final norm get their own values
    ours = Encoder(2, D, H, FF, 0.0, norm_first).double()
    for mine, their in zip(ours.layers, theirs.layers):
        copy_weights_from_torch(mine, their)
    assert (ours.norm is None) == (not norm_first)
    if norm_first:
        copy_weights_from_torch(ours.norm, theirs.norm)
    x = torch.randn(B, T, D, dtype=torch.float64)
    ours_m, theirs_m = masks()
    pad = padding_mask(torch.tensor([T, T - 2]), T)
    assert_close(ours(x, mask=pad[:, None, None, :]), theirs(x, src_key_padding_mask=~pad))
    expected = theirs(x, mask=theirs_m["causal"], src_key_padding_mask=theirs_m["tgt_pad"])
    assert_close(ours(x, mask=ours_m["self"]), expected)


@NORM_FIRST
def test_decoder_stack_matches_pytorch(randomize, norm_first):
    final = nn.LayerNorm(D) if norm_first else None
    theirs = nn.TransformerDecoder(torch_decoder_layer(norm_first), 2, norm=final)
    randomize(theirs.double()).eval()
    ours = Decoder(2, D, H, FF, 0.0, norm_first).double()
    for mine, their in zip(ours.layers, theirs.layers):
        copy_weights_from_torch(mine, their)
    if norm_first:
        copy_weights_from_torch(ours.norm, theirs.norm)
    x = torch.randn(B, T, D, dtype=torch.float64)
    memory = torch.randn(B, S, D, dtype=torch.float64)
    ours_m, theirs_m = masks()
    out = ours(x, memory, tgt_mask=ours_m["self"], memory_mask=ours_m["memory"])
    expected = theirs(
        x,
        memory,
        tgt_mask=theirs_m["causal"],
        tgt_key_padding_mask=theirs_m["tgt_pad"],
        memory_key_padding_mask=theirs_m["src_pad"],
    )
    assert_close(out, expected)


def test_weight_matrices_are_12_and_16_d_squared_per_layer():
    d = 16

    def matrices(module):
        return sum(p.numel() for p in module.parameters() if p.dim() > 1)

    assert matrices(EncoderLayer(d, 4, 4 * d)) == 12 * d * d
    assert matrices(DecoderLayer(d, 4, 4 * d)) == 16 * d * d
    assert matrices(Encoder(3, d, 4, 4 * d)) == 3 * 12 * d * d
    assert matrices(Decoder(2, d, 4, 4 * d)) == 2 * 16 * d * d
    for norm_first in (False, True):  # same count as PyTorch's layers
        for ours, theirs in (
            (
                EncoderLayer(d, 4, 4 * d, norm_first=norm_first),
                nn.TransformerEncoderLayer(d, 4, 64),
            ),
            (
                DecoderLayer(d, 4, 4 * d, norm_first=norm_first),
                nn.TransformerDecoderLayer(d, 4, 64),
            ),
        ):
            assert sum(p.numel() for p in ours.parameters()) == sum(
                p.numel() for p in theirs.parameters()
            )


# --- attention maps returned --------------------------------------------------------------


@NORM_FIRST
def test_layers_return_their_attention_weights(randomize, norm_first):
    enc = randomize(EncoderLayer(D, H, FF, 0.0, norm_first).double())
    dec = randomize(DecoderLayer(D, H, FF, 0.0, norm_first).double())
    x = torch.randn(B, T, D, dtype=torch.float64)
    memory = torch.randn(B, S, D, dtype=torch.float64)
    out, weights = enc(x, return_attention=True)
    assert_close(out, enc(x))
    attn_input = enc.norm1(x) if norm_first else x
    assert_close(weights, enc.self_attn(attn_input, attn_input, attn_input)[1])
    out, weights = dec(x, memory, tgt_mask=causal_mask(T), return_attention=True)
    assert_close(out, dec(x, memory, tgt_mask=causal_mask(T)))
    assert weights["self"].shape == (B, H, T, T)
    assert weights["cross"].shape == (B, H, T, S)  # queries from the decoder, keys from memory
    assert bool((weights["self"][..., ~causal_mask(T)] == 0).all())
    assert_close(weights["cross"].sum(-1), torch.ones(B, H, T, dtype=torch.float64))


# --- properties ---------------------------------------------------------------------------


@NORM_FIRST
def test_encoder_layer_without_positions_is_permutation_equivariant(randomize, norm_first):
    layer = randomize(EncoderLayer(D, H, FF, 0.0, norm_first).double())
    x = torch.randn(B, T, D, dtype=torch.float64)
    perm = torch.randperm(T)
    assert_close(layer(x[:, perm]), layer(x)[:, perm])


@NORM_FIRST
def test_decoder_layer_causal_mask_hides_the_future(randomize, norm_first):
    layer = randomize(DecoderLayer(D, H, FF, 0.0, norm_first).double())
    x = torch.randn(B, T, D, dtype=torch.float64)
    memory = torch.randn(B, S, D, dtype=torch.float64)
    out = layer(x, memory, tgt_mask=causal_mask(T))
    for t in range(T - 1):
        changed = x.clone()
        changed[:, t + 1 :] = torch.randn(B, T - t - 1, D, dtype=torch.float64)
        out2 = layer(changed, memory, tgt_mask=causal_mask(T))
        assert_close(out2[:, : t + 1], out[:, : t + 1])
        assert not torch.allclose(out2[:, t + 1 :], out[:, t + 1 :])
    changed_memory = layer(x, memory + 1.0, tgt_mask=causal_mask(T))
    assert not torch.allclose(changed_memory[:, 0], out[:, 0])  # memory is seen everywhere


@NORM_FIRST
def test_encoder_padding_does_not_change_real_positions(randomize, norm_first):
    encoder = randomize(Encoder(2, D, H, FF, 0.0, norm_first).double())
    x = torch.randn(B, T, D, dtype=torch.float64)
    lengths = torch.tensor([T, T - 2])
    padded = torch.cat([x, 100 * torch.randn(B, 3, D, dtype=torch.float64)], dim=1)
    short = encoder(x, mask=padding_mask(lengths, T)[:, None, None, :])
    long = encoder(padded, mask=padding_mask(lengths, T + 3)[:, None, None, :])
    for b, n in enumerate(lengths.tolist()):
        alone = encoder(x[b : b + 1, :n])  # no padding at all
        assert_close(short[b, :n], alone[0])
        assert_close(long[b, :n], alone[0])


# --- the full Transformer -----------------------------------------------------------------

PAD = 0
VOCAB_SRC, VOCAB_TGT = 11, 9


def small_transformer(norm_first=False, pad_id=PAD):
    model = Transformer(
        VOCAB_SRC,
        VOCAB_TGT,
        d_model=D,
        num_heads=H,
        num_encoder_layers=2,
        num_decoder_layers=2,
        d_ff=FF,
        dropout=0.0,
        max_len=32,
        norm_first=norm_first,
        pad_id=pad_id,
    )
    return model.double().eval()


def tokens(vocab, b, length):
    return torch.randint(1, vocab, (b, length))  # never PAD


@NORM_FIRST
def test_transformer_logits_do_not_see_future_targets(randomize, norm_first):
    model = randomize(small_transformer(norm_first))
    src, tgt = tokens(VOCAB_SRC, B, S), tokens(VOCAB_TGT, B, T)
    logits = model(src, tgt)
    assert logits.shape == (B, T, VOCAB_TGT) and logits.dtype == torch.float64
    for t in range(T - 1):
        changed = tgt.clone()
        changed[:, t + 1 :] = (tgt[:, t + 1 :] % (VOCAB_TGT - 1)) + 1  # other non-PAD tokens
        logits2 = model(src, changed)
        assert_close(logits2[:, : t + 1], logits[:, : t + 1])
        assert not torch.allclose(logits2[:, t + 1 :], logits[:, t + 1 :])


@NORM_FIRST
def test_transformer_padding_does_not_change_real_positions(randomize, norm_first):
    model = randomize(small_transformer(norm_first))
    src_lengths, tgt_lengths = [S, 3], [2, T]
    src = torch.full((B, S + 2), PAD)
    tgt = torch.full((B, T + 3), PAD)
    for b in range(B):
        src[b, : src_lengths[b]] = tokens(VOCAB_SRC, 1, src_lengths[b])
        tgt[b, : tgt_lengths[b]] = tokens(VOCAB_TGT, 1, tgt_lengths[b])
    logits = model(src, tgt)
    assert_close(model(src[:, :S], tgt[:, :T]), logits[:, :T])  # less padding, same logits
    for b in range(B):
        s_b, t_b = src[b : b + 1, : src_lengths[b]], tgt[b : b + 1, : tgt_lengths[b]]
        alone = model(s_b, t_b)  # this sequence with no padding at all
        assert_close(logits[b : b + 1, : tgt_lengths[b]], alone)


def test_transformer_without_pad_id_attends_to_pad_tokens(randomize):
    model = randomize(small_transformer(pad_id=None))
    src, tgt = tokens(VOCAB_SRC, 1, 4), tokens(VOCAB_TGT, 1, 3)
    padded = torch.cat([src, torch.zeros(1, 2, dtype=torch.long)], dim=1)
    assert not torch.allclose(model(padded, tgt), model(src, tgt))


@pytest.mark.parametrize("pad_id", [PAD, None], ids=["pad", "no-pad"])
def test_transformer_masks_hide_future_and_padded_keys(randomize, pad_id):
    """What the masks do, read from the attention weights: no query sees a later target
    position; with pad_id, none sees a padded key; without it, padding is a token like any."""
    model = randomize(small_transformer(pad_id=pad_id))
    src = torch.tensor([[5, 3, PAD], [4, PAD, 2]])
    tgt = torch.tensor([[1, 2, 3, PAD], [1, PAD, 4, 5]])
    _, weights = model.decode(tgt, model.encode(src), src=src, return_attention=True)
    future = ~causal_mask(4)  # (T, T): True where the key comes after the query
    src_pad, tgt_pad = (src == PAD)[:, None, None, :], (tgt == PAD)[:, None, None, :]
    for layer in weights:
        self_w, cross_w = layer["self"], layer["cross"]  # (B, H, T, T), (B, H, T, S)
        assert bool((self_w.masked_select(future) == 0).all())
        assert_close(self_w.sum(-1), torch.ones_like(self_w[..., 0]))
        if pad_id is None:
            assert bool((cross_w.masked_select(src_pad.expand_as(cross_w)) > 0).all())
        else:
            assert bool((cross_w.masked_select(src_pad.expand_as(cross_w)) == 0).all())
            seen_pad = tgt_pad.expand_as(self_w) & ~future  # padded keys a query could see
            assert bool((self_w.masked_select(seen_pad) == 0).all())
    assert (model.source_mask(src) is None) == (pad_id is None)


def test_transformer_scales_embeddings_and_adds_positions(randomize):
    model = randomize(small_transformer())
    src = tokens(VOCAB_SRC, B, S)
    x = model.src_embedding(src) * D**0.5  # scaled so that the positions do not drown it
    x = x + sinusoidal_positional_encoding(32, D, dtype=torch.float64)[:S]
    assert_close(model.encode(src), model.encoder(x, model.source_mask(src)))


def test_transformer_forward_is_encode_then_decode(randomize):
    model = randomize(small_transformer())
    src, tgt = tokens(VOCAB_SRC, B, S), tokens(VOCAB_TGT, B, T)
    memory = model.encode(src)
    assert memory.shape == (B, S, D)
    assert_close(model(src, tgt), model.decode(tgt, memory, src=src))
    logits, weights = model.decode(tgt, memory, src=src, return_attention=True)
    assert len(weights) == 2 and weights[0]["cross"].shape == (B, H, T, S)


def test_transformer_follows_dtype_and_device(randomize, device):
    model = randomize(small_transformer())
    src, tgt = tokens(VOCAB_SRC, B, S), tokens(VOCAB_TGT, B, T)
    reference = model(src, tgt)
    for dtype in (torch.float32, torch.float64):
        model = model.to(device=device, dtype=dtype)
        logits = model(src.to(device), tgt.to(device))
        assert logits.dtype == dtype and logits.device.type == device.type
        assert_close(logits.cpu().double(), reference, atol=1e-4, rtol=1e-4)


def test_transformer_dropout_only_in_training(randomize):
    model = Transformer(VOCAB_SRC, VOCAB_TGT, D, H, 1, 1, FF, dropout=0.3, max_len=32)
    src, tgt = tokens(VOCAB_SRC, B, S), tokens(VOCAB_TGT, B, T)
    model.eval()
    assert_close(model(src, tgt), model(src, tgt))
    model.train()
    assert not torch.allclose(model(src, tgt), model(src, tgt))
