"""End to end: toy data, the training loop, greedy decoding, and a small Transformer
that learns to copy."""

from __future__ import annotations

import copy
import time

import pytest
import torch
import torch.nn.functional as F

from attention_course import Transformer, greedy_decode, seed_everything
from attention_course.data import BOS, EOS, FIRST_SYMBOL, PAD, make_sequence_task
from attention_course.train import exact_match, train_seq2seq

# --- toy data -----------------------------------------------------------------------------


@pytest.mark.parametrize("task", ["copy", "reverse", "sort"])
def test_sequence_tasks_hold_the_right_answers(task):
    data = make_sequence_task(task, 50, 2, 7, num_symbols=5, seed=3)
    assert len(data) == 50 and data.vocab_size == FIRST_SYMBOL + 5
    assert data.src.shape == (50, 7) and data.tgt.shape == (50, 9)
    for src, tgt, n in zip(data.src.tolist(), data.tgt.tolist(), data.lengths.tolist()):
        assert 2 <= n <= 7
        seq = src[:n]
        assert all(FIRST_SYMBOL <= s < FIRST_SYMBOL + 5 for s in seq)
        assert src[n:] == [PAD] * (7 - n)
        answer = {"copy": seq, "reverse": seq[::-1], "sort": sorted(seq)}[task]
        assert tgt == [BOS, *answer, EOS] + [PAD] * (7 - n)


def test_sequence_tasks_repeat_with_a_seed_and_leave_the_global_rng_alone():
    torch.manual_seed(5)
    expected = torch.rand(3)
    torch.manual_seed(5)
    a = make_sequence_task("sort", 20, 1, 5, seed=1)
    assert torch.equal(torch.rand(3), expected)  # the global generator was not used
    b = make_sequence_task("sort", 20, 1, 5, seed=1)
    c = make_sequence_task("sort", 20, 1, 5, seed=2)
    assert torch.equal(a.src, b.src) and torch.equal(a.tgt, b.tgt)
    assert not torch.equal(a.src, c.src)


# --- greedy decoding, with scripted logits ------------------------------------------------


def tiny_model(pad_id=PAD, vocab=7, max_len=8):
    return Transformer(vocab, vocab, 8, 2, 1, 1, 16, dropout=0.1, max_len=max_len, pad_id=pad_id)


def script_decoder(model, monkeypatch, next_tokens):
    """Make the decoder predict ``next_tokens[b][t]`` after ``t + 1`` tokens of sequence b.

    ``greedy_decode`` checks its inputs once and then calls ``model._decode`` (``decode``
    without the checks) at every step; the script replaces that. It reads the whole
    prefix, so decode with ``use_cache=False`` (with the KV cache, the decoder would see
    only the newest token).
    """
    vocab = model.tgt_vocab_size

    def decode(tgt, memory, memory_mask, return_attention=False, cache=None):
        assert cache is None
        B, t = tgt.shape
        logits = torch.zeros(B, t, vocab)
        for b in range(B):
            logits[b, -1, next_tokens[b][t - 1]] = 1.0
        return logits

    monkeypatch.setattr(model, "_decode", decode)


@pytest.mark.parametrize("pad_id", [PAD, None])
def test_greedy_decode_stops_at_eos_and_pads_after_it(monkeypatch, pad_id):
    model = tiny_model(pad_id=pad_id)
    # sequence 0 ends at once, then "wants" symbol 5 (ignored); sequence 1 ends after 2 symbols
    script_decoder(model, monkeypatch, [[EOS, 5, 5, 5], [4, 6, EOS, 5]])
    out = greedy_decode(
        model, torch.randint(3, 7, (2, 5)), max_len=8, bos_id=BOS, eos_id=EOS, use_cache=False
    )
    pad = EOS if pad_id is None else pad_id
    assert out.dtype == torch.long
    assert out.tolist() == [[BOS, EOS, pad, pad], [BOS, 4, 6, EOS]]  # stops once all ended


def test_greedy_decode_never_exceeds_max_len(monkeypatch):
    model = tiny_model()
    script_decoder(model, monkeypatch, [[5] * 10, [4, EOS] + [5] * 8])
    out = greedy_decode(
        model, torch.randint(3, 7, (2, 3)), max_len=6, bos_id=BOS, eos_id=EOS, use_cache=False
    )
    assert out.tolist() == [[BOS, 5, 5, 5, 5, 5], [BOS, 4, EOS, PAD, PAD, PAD]]
    one = greedy_decode(
        model, torch.randint(3, 7, (2, 3)), max_len=1, bos_id=BOS, eos_id=EOS, use_cache=False
    )
    assert one.tolist() == [[BOS], [BOS]]


@pytest.mark.parametrize("training", [True, False])
def test_greedy_decode_restores_the_mode_and_runs_without_dropout(training):
    model = tiny_model()
    model.train(training)
    src = torch.randint(3, 7, (4, 5))
    first = greedy_decode(model, src, max_len=8, bos_id=BOS, eos_id=EOS)
    assert model.training == training
    assert all(m.training == training for m in model.modules())
    second = greedy_decode(model, src, max_len=8, bos_id=BOS, eos_id=EOS)
    assert torch.equal(first, second)  # dropout was off while decoding
    assert bool((first[:, 0] == BOS).all()) and first.shape[1] <= 8


def test_greedy_decode_follows_argmax_of_the_real_model():
    model = tiny_model().eval()
    src = torch.randint(3, 7, (3, 5))
    out = greedy_decode(model, src, max_len=6, bos_id=BOS, eos_id=EOS)
    for t in range(1, out.shape[1]):
        logits = model(src, out[:, :t])[:, -1]  # the next-token prediction after t tokens
        ended = (out[:, 1:t] == EOS).any(dim=1)
        assert torch.equal(out[~ended, t], logits.argmax(-1)[~ended])
        assert bool((out[ended, t] == PAD).all())


# --- the training loop --------------------------------------------------------------------


def test_train_seq2seq_repeats_with_a_seed_and_lowers_the_loss():
    data = make_sequence_task("copy", 64, 1, 4, num_symbols=4, seed=0)
    model = Transformer(data.vocab_size, data.vocab_size, 16, 2, 1, 1, 32, 0.0, 8, pad_id=PAD)
    twin = copy.deepcopy(model)
    kwargs = dict(num_steps=30, batch_size=16, lr=3e-3, seed=4, progress=False)
    losses = train_seq2seq(model, data.src, data.tgt, **kwargs)
    assert len(losses) == 30 and all(isinstance(x, float) for x in losses)
    assert train_seq2seq(twin, data.src, data.tgt, **kwargs) == losses
    assert sum(losses[-5:]) < 0.7 * sum(losses[:5])
    assert model.training


def test_train_seq2seq_loss_is_next_token_cross_entropy_without_padding():
    src = torch.tensor([[3, 4, PAD, PAD]])
    tgt = torch.tensor([[BOS, 3, 4, EOS, PAD, PAD]])
    model = Transformer(7, 7, 16, 2, 1, 1, 32, dropout=0.0, max_len=8, pad_id=PAD)
    before = copy.deepcopy(model)
    losses = train_seq2seq(model, src, tgt, num_steps=1, batch_size=4, progress=False)
    logits = before(src, tgt[:, :-1])  # teacher forcing: BOS 3 4 EOS PAD -> 3 4 EOS PAD PAD
    expected = F.cross_entropy(logits[0, :3], tgt[0, 1:4])  # the PAD labels do not count
    assert losses[0] == pytest.approx(expected.item(), rel=1e-5)


# --- a small Transformer learns to copy ---------------------------------------------------


@pytest.fixture(scope="module")
def copy_model():
    """Train once for the tests below (about 5-15 s on one CPU thread)."""
    seed_everything(0)
    train = make_sequence_task("copy", 4000, 1, 6, num_symbols=8, seed=0)
    held_out = make_sequence_task("copy", 1000, 1, 6, num_symbols=8, seed=100)
    model = Transformer(
        train.vocab_size,
        train.vocab_size,
        d_model=32,
        num_heads=2,
        num_encoder_layers=1,
        num_decoder_layers=1,
        d_ff=64,
        dropout=0.0,
        max_len=8,
        pad_id=PAD,
    )
    start = time.perf_counter()
    kwargs = dict(batch_size=128, progress=False)
    losses = train_seq2seq(model, train.src, train.tgt, num_steps=300, lr=3e-3, seed=0, **kwargs)
    # a second, gentler phase (lr / 4) settles the last few mistakes
    losses += train_seq2seq(model, train.src, train.tgt, num_steps=100, lr=7.5e-4, seed=1, **kwargs)
    seconds = time.perf_counter() - start
    return model, train, held_out, losses, seconds


def test_transformer_learns_the_copy_task(copy_model):
    model, train, held_out, losses, seconds = copy_model
    assert losses[-1] < 0.05 < losses[0]
    seen = {tuple(s) for s in train.src.tolist()}
    unseen = [i for i, s in enumerate(held_out.src.tolist()) if tuple(s) not in seen]
    assert len(unseen) > 400  # short strings repeat; score only the ones never trained on
    index = torch.tensor(unseen)
    accuracy = exact_match(model, held_out.src[index], held_out.tgt[index], BOS, EOS)
    assert accuracy >= 0.99, f"exact match {accuracy:.3f} after {seconds:.1f} s of training"


def test_greedy_decode_of_the_trained_model(copy_model):
    model, _, held_out, _, _ = copy_model
    src, tgt = held_out.src[:64], held_out.tgt[:64]
    model.train()
    out = greedy_decode(model, src, max_len=tgt.shape[1], bos_id=BOS, eos_id=EOS)
    assert model.training  # the mode was restored
    assert out.shape[1] <= tgt.shape[1]
    assert bool((out[:, 0] == BOS).all())
    lengths = held_out.lengths[:64]
    assert len(set(lengths.tolist())) > 1  # the batch mixes lengths
    for row in out.tolist():
        end = row.index(EOS)  # every sequence ended ...
        assert row[end + 1 :] == [PAD] * (len(row) - end - 1)  # ... and is padded after EOS
    matches = [out[i, : n + 2].tolist() == tgt[i, : n + 2].tolist() for i, n in enumerate(lengths)]
    assert sum(matches) >= 63
    # exact_match agrees: decoding's own output is a perfect match, a changed target is not
    assert exact_match(model, src, out, BOS, EOS) == 1.0
    wrong = out.clone()
    wrong[0, 1] = FIRST_SYMBOL + (int(wrong[0, 1]) - FIRST_SYMBOL + 1) % 8
    assert exact_match(model, src, wrong, BOS, EOS) == pytest.approx(63 / 64)
