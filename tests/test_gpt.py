"""CausalSelfAttention and GPT (chapter 13) against PyTorch's own modules."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.testing import assert_close

from attention_course import GPT, CausalSelfAttention, MultiHeadAttention, causal_mask
from attention_course.train import evaluate_lm, train_language_model

B, T, D, H, V = 2, 7, 12, 3, 11


def _copy_from_torch_mha(ours: CausalSelfAttention, theirs: nn.MultiheadAttention) -> None:
    with torch.no_grad():
        wq, wk, wv = theirs.in_proj_weight.chunk(3)
        ours.w_q.weight.copy_(wq)
        ours.w_k.weight.copy_(wk)
        ours.w_v.weight.copy_(wv)
        ours.w_o.weight.copy_(theirs.out_proj.weight)
        if ours.w_q.bias is not None:
            bq, bk, bv = theirs.in_proj_bias.chunk(3)
            ours.w_q.bias.copy_(bq)
            ours.w_k.bias.copy_(bk)
            ours.w_v.bias.copy_(bv)
            ours.w_o.bias.copy_(theirs.out_proj.bias)


@pytest.mark.parametrize("bias", [True, False])
def test_causal_self_attention_equals_torch_mha_with_causal_mask(bias, randomize):
    theirs = randomize(nn.MultiheadAttention(D, H, bias=bias, batch_first=True)).double()
    ours = CausalSelfAttention(D, H, bias=bias).double()
    _copy_from_torch_mha(ours, theirs)
    x = torch.randn(B, T, D, dtype=torch.float64)
    blocked = ~causal_mask(T)  # PyTorch: True = may NOT attend
    expected, expected_w = theirs(x, x, x, attn_mask=blocked, average_attn_weights=False)
    assert_close(ours(x), expected)
    out, weights = ours(x, need_weights=True)
    assert_close(out, expected)
    assert_close(weights, expected_w)
    assert weights.shape == (B, H, T, T)
    assert bool((weights.triu(1) == 0).all())


def test_causal_self_attention_is_a_multi_head_attention_with_the_contract_attributes():
    attn = CausalSelfAttention(16, 4)
    assert isinstance(attn, MultiHeadAttention)  # one attention path: the same attend()
    assert (attn.num_heads, attn.num_kv_heads) == (4, 4)
    assert attn.w_q.weight.shape == (16, 16) and attn.w_k.weight.shape == (16, 16)
    assert attn.w_q.bias is None  # bias=False by default


def test_causal_self_attention_with_cache_matches_full_pass():
    attn = CausalSelfAttention(D, H).double().eval()
    x = torch.randn(B, T, D, dtype=torch.float64)
    full = attn(x)
    from attention_course.kv_cache import AttentionCache

    cache = AttentionCache()
    parts = [attn(x[:, :3], cache=cache)] + [
        attn(x[:, t : t + 1], cache=cache) for t in range(3, T)
    ]
    assert_close(torch.cat(parts, dim=1), full)


def test_causal_self_attention_rejects_bad_arguments():
    with pytest.raises(ValueError, match="num_kv_heads"):
        CausalSelfAttention(16, 4, num_kv_heads=3)
    with pytest.raises(ValueError, match="num_heads"):
        CausalSelfAttention(16, 5)
    with pytest.raises(ValueError, match="pos"):
        CausalSelfAttention(16, 4, pos="learned")
    with pytest.raises(ValueError, match="x"):
        CausalSelfAttention(16, 4)(torch.randn(2, 3, 8))
    with pytest.raises(ValueError, match="x"):
        CausalSelfAttention(16, 4)(torch.ones(2, 3, 16, dtype=torch.long))


class TorchGPT(nn.Module):
    """The same model from PyTorch's modules: nn.TransformerEncoderLayer(norm_first=True)."""

    def __init__(self, ours: GPT) -> None:
        super().__init__()
        d, h, f = ours.d_model, ours.num_heads, ours.d_ff
        self.tok_emb = nn.Embedding(ours.vocab_size, d)
        self.pos_emb = nn.Embedding(ours.max_len, d)
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(
                d, h, f, dropout=0.0, activation="gelu", batch_first=True, norm_first=True
            )
            for _ in range(ours.num_layers)
        )
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, ours.vocab_size, bias=False)
        self.head.weight = self.tok_emb.weight
        self.to(ours.tok_emb.weight.dtype)  # before copying: no rounding to float32
        with torch.no_grad():
            self.tok_emb.weight.copy_(ours.tok_emb.weight)
            self.pos_emb.weight.copy_(ours.pos_emb.weight)
            self.norm.load_state_dict(ours.norm.state_dict())
            for mine, block in zip(self.layers, ours.blocks):
                a = block.attn
                mine.self_attn.in_proj_weight.copy_(
                    torch.cat([a.w_q.weight, a.w_k.weight, a.w_v.weight])
                )
                mine.self_attn.in_proj_bias.zero_()  # ours has no attention biases
                mine.self_attn.out_proj.weight.copy_(a.w_o.weight)
                mine.self_attn.out_proj.bias.zero_()
                mine.linear1.load_state_dict(block.ffn.linear1.state_dict())
                mine.linear2.load_state_dict(block.ffn.linear2.state_dict())
                mine.norm1.load_state_dict(block.norm1.state_dict())
                mine.norm2.load_state_dict(block.norm2.state_dict())

    def forward(self, ids):
        T = ids.shape[1]
        x = self.tok_emb(ids) + self.pos_emb(torch.arange(T))
        mask = nn.Transformer.generate_square_subsequent_mask(T, dtype=x.dtype)
        for layer in self.layers:
            x = layer(x, src_mask=mask, is_causal=True)
        return self.head(self.norm(x))


def test_gpt_equals_the_model_built_from_torch_encoder_layers(randomize):
    ours = GPT(V, d_model=D, num_heads=H, num_layers=2, d_ff=20, max_len=16).double()
    randomize(ours)
    theirs = TorchGPT(ours).eval()
    ours.eval()
    ids = torch.randint(0, V, (B, 9))
    assert_close(ours(ids), theirs(ids))
    with torch.no_grad():  # the fast path of nn.TransformerEncoderLayer too
        assert_close(ours(ids), theirs(ids))


@pytest.mark.parametrize("pos", ["learned", "sinusoidal", "none"])
def test_prefix_outputs_do_not_change_when_later_tokens_change(pos):
    model = GPT(V, d_model=16, num_heads=2, num_layers=2, max_len=16, pos=pos).double()
    ids = torch.randint(0, V, (B, 10))
    changed = ids.clone()
    changed[:, 6:] = (changed[:, 6:] + 1) % V
    a, b = model(ids), model(changed)
    assert_close(a[:, :6], b[:, :6])
    assert not torch.allclose(a[:, 6:], b[:, 6:])


def test_gpt_cache_gives_the_full_pass_logits():
    model = GPT(V, d_model=16, num_heads=2, num_layers=2, max_len=16).double().eval()
    ids = torch.randint(0, V, (B, 10))
    cache = model.new_cache()
    parts = [model(ids[:, :4], cache=cache)] + [
        model(ids[:, t : t + 1], cache=cache) for t in range(4, 10)
    ]
    assert_close(torch.cat(parts, dim=1), model(ids))


def test_gpt_returns_each_layers_attention_weights():
    model = GPT(V, d_model=16, num_heads=2, num_layers=3, max_len=16)
    ids = torch.randint(0, V, (B, 5))
    logits, weights = model(ids, return_attention=True)
    assert_close(logits, model(ids))
    assert len(weights) == 3 and all(w.shape == (B, 2, 5, 5) for w in weights)
    assert_close(weights[0].sum(-1), torch.ones(B, 2, 5))


def test_tie_weights_shares_the_parameter_and_saves_v_times_d():
    tied = GPT(V, d_model=16, num_heads=2, num_layers=1, tie_weights=True)
    untied = GPT(V, d_model=16, num_heads=2, num_layers=1, tie_weights=False)
    assert tied.head.weight is tied.tok_emb.weight
    assert untied.head.weight is not untied.tok_emb.weight
    count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    assert count(untied) - count(tied) == V * 16
    assert tied.head.bias is None
    loss = tied(torch.randint(0, V, (1, 4))).sum()
    loss.backward()
    assert tied.tok_emb.weight.grad is not None


def test_gpt_structure_follows_the_contract():
    model = GPT(V, d_model=16, num_heads=2, num_layers=2)
    assert model.d_ff == 64  # 4 * d_model
    assert isinstance(model.tok_emb, nn.Embedding) and isinstance(model.pos_emb, nn.Embedding)
    for block in model.blocks:
        assert isinstance(block.attn, CausalSelfAttention)
        for name in ("norm1", "norm2", "ffn"):
            assert hasattr(block, name)
    assert not hasattr(GPT(V, 16, 2, 1, pos="sinusoidal"), "pos_emb")
    assert not hasattr(GPT(V, 16, 2, 1, pos="none"), "pos_emb")
    assert GPT(V, 16, 2, 1, ffn="relu").blocks[0].ffn.activation == "relu"
    again = GPT(**model.config())
    assert again.config() == model.config()


def test_gpt_rejects_bad_arguments_and_inputs():
    for kwargs, name in (
        ({"pos": "rotary"}, "pos"),
        ({"norm": "batch"}, "norm"),
        ({"ffn": "tanh"}, "ffn"),
        ({"num_kv_heads": 3}, "num_kv_heads"),
        ({"d_model": 0}, "d_model"),
        ({"dropout": 1.5}, "dropout"),
        ({"num_heads": 3}, "num_heads"),
    ):
        with pytest.raises(ValueError, match=name):
            GPT(V, **{"d_model": 16, "num_heads": 4, **kwargs})
    model = GPT(V, d_model=16, num_heads=4, max_len=8)
    with pytest.raises(ValueError, match="ids"):
        model(torch.zeros(1, 9, dtype=torch.long))  # T > max_len
    with pytest.raises(ValueError, match="ids"):
        model(torch.full((1, 3), V))  # out of the vocabulary
    with pytest.raises(ValueError, match="ids"):
        model(torch.zeros(1, 3))  # float
    with pytest.raises(ValueError, match="ids"):
        model(torch.zeros(3, dtype=torch.long))  # 1-D
    GPT(V, d_model=16, num_heads=4, max_len=8, pos="none")(torch.zeros(1, 20, dtype=torch.long))


def test_initial_loss_is_close_to_log_v():
    vocab = 100
    model = GPT(vocab, d_model=64, num_heads=4, num_layers=4)
    ids = torch.randint(0, vocab, (8, 65))
    logits = model(ids[:, :-1])
    loss = F.cross_entropy(logits.reshape(-1, vocab), ids[:, 1:].reshape(-1)).item()
    print(f"initial loss {loss:.4f}, log V = {math.log(vocab):.4f}")
    assert abs(loss - math.log(vocab)) < 0.05, f"initial loss {loss:.4f} vs log V"


def test_gradients_reach_every_parameter():
    model = GPT(V, d_model=16, num_heads=2, num_layers=2, dropout=0.1)
    logits = model(torch.randint(0, V, (B, 6)))
    logits.logsumexp(-1).sum().backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and bool(p.grad.abs().sum() > 0), name


def test_a_tiny_model_overfits_a_tiny_text_quickly():
    text = torch.tensor([ord(c) - 97 for c in "abcdefghij" * 30])
    model = GPT(10, d_model=32, num_heads=2, num_layers=1, max_len=32)
    history = train_language_model(
        model, text, text, steps=60, batch_size=16, context=16, lr=1e-2, progress=False
    )
    final = history["train_loss"][-1]
    bound = 0.1
    print(f"tiny text: loss {history['train_loss'][0]:.3f} -> {final:.4f} in 60 steps")
    assert final < bound, f"loss {final:.4f} >= {bound}"
    assert history["val_loss"][-1] == pytest.approx(evaluate_lm(model, text, 16))
    assert len(history["train_loss"]) == history["steps"] == 60


def test_evaluate_lm_counts_every_token_once_and_is_deterministic():
    class Uniform(nn.Module):
        def __init__(self):
            super().__init__()
            self.p = nn.Parameter(torch.zeros(1))

        def forward(self, ids):
            return torch.zeros(*ids.shape, 7) + self.p

    ids = torch.randint(0, 7, (101,))
    assert evaluate_lm(Uniform(), ids, context=8) == pytest.approx(math.log(7))
    model = GPT(7, d_model=16, num_heads=2, num_layers=1)
    assert evaluate_lm(model, ids, 8) == evaluate_lm(model, ids, 8)
    with pytest.raises(ValueError, match="ids"):
        evaluate_lm(model, ids[None], 8)
    with pytest.raises(ValueError, match="context"):
        evaluate_lm(model, ids, 0)


def test_train_language_model_is_seeded():
    ids = torch.randint(0, V, (500,))
    runs = []
    for _ in range(2):
        torch.manual_seed(0)
        model = GPT(V, d_model=16, num_heads=2, num_layers=1)
        runs.append(train_language_model(model, ids, steps=5, context=8, progress=False))
    assert runs[0]["train_loss"] == runs[1]["train_loss"]
    with pytest.raises(ValueError, match="train_ids"):
        train_language_model(model, ids[:5], steps=1, context=8, progress=False)
