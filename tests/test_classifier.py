"""Tests for the encoder-only classifier (chapter 11) and the synthetic sentiment task."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from attention_course.classifier import TransformerClassifier, masked_max_pool, masked_mean_pool
from attention_course.data.sentiment import (
    NEGATIVE_WORDS,
    NEGATORS,
    NEUTRAL_WORDS,
    PAD,
    POSITIVE_WORDS,
    VOCAB,
    make_sentiment_task,
)
from attention_course.train import accuracy, train_classifier


def _padded_batch(seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(3, 5, 4, generator=gen, dtype=torch.float64)
    mask = torch.tensor(
        [[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 0, 0, 0, 0]], dtype=torch.bool
    )  # lengths 5, 3, 1
    return x, mask


# --- pooling ---------------------------------------------------------------------------


def test_masked_mean_pool_equals_mean_over_real_tokens():
    x, mask = _padded_batch()
    out = masked_mean_pool(x, mask)
    expected = torch.stack([x[b, : int(mask[b].sum())].mean(dim=0) for b in range(3)])
    torch.testing.assert_close(out, expected)


def test_masked_max_pool_equals_max_over_real_tokens():
    x, mask = _padded_batch()
    out = masked_max_pool(x, mask)
    expected = torch.stack([x[b, : int(mask[b].sum())].max(dim=0).values for b in range(3)])
    torch.testing.assert_close(out, expected)


@pytest.mark.parametrize("pool", [masked_mean_pool, masked_max_pool])
def test_masked_pooling_ignores_whatever_is_in_the_padding(pool):
    x, mask = _padded_batch()
    junk = x.clone()
    junk[~mask] = 1e4  # huge values in padded positions must not leak into the result
    torch.testing.assert_close(pool(junk, mask), pool(x, mask))
    # ...whereas unmasked pooling sees them
    assert not torch.allclose(pool(junk), pool(x))


@pytest.mark.parametrize("pool", [masked_mean_pool, masked_max_pool])
def test_masked_pooling_ignores_extra_padding(pool):
    x, mask = _padded_batch()
    longer = torch.cat([x, torch.randn(3, 4, 4, dtype=x.dtype)], dim=1)
    longer_mask = torch.cat([mask, torch.zeros(3, 4, dtype=torch.bool)], dim=1)
    torch.testing.assert_close(pool(longer, longer_mask), pool(x, mask))


def test_unmasked_pooling_is_the_plain_reduction():
    x, _ = _padded_batch()
    torch.testing.assert_close(masked_mean_pool(x), x.mean(dim=1))
    torch.testing.assert_close(masked_max_pool(x), x.max(dim=1).values)
    full = torch.ones(3, 5, dtype=torch.bool)
    torch.testing.assert_close(masked_mean_pool(x, full), x.mean(dim=1))
    torch.testing.assert_close(masked_max_pool(x, full), x.max(dim=1).values)


@pytest.mark.parametrize("pool", [masked_mean_pool, masked_max_pool])
def test_row_without_real_tokens_gives_zeros_not_nan(pool):
    x, mask = _padded_batch()
    mask[1] = False
    out = pool(x, mask)
    assert torch.isfinite(out).all()
    assert (out[1] == 0).all()


@pytest.mark.parametrize("pool", [masked_mean_pool, masked_max_pool])
def test_pooling_half_precision_has_no_inf(pool):
    x, mask = _padded_batch()
    out = pool(x.half(), mask)
    assert out.dtype == torch.float16 and torch.isfinite(out).all()


@pytest.mark.parametrize("pool", [masked_mean_pool, masked_max_pool])
def test_pooling_gradients_reach_only_real_tokens(pool):
    x, mask = _padded_batch()
    x.requires_grad_(True)
    pool(x, mask).sum().backward()
    assert (x.grad[~mask] == 0).all()
    assert x.grad[mask].abs().sum() > 0


@pytest.mark.parametrize("pool", [masked_mean_pool, masked_max_pool])
def test_pooling_validates_its_inputs(pool):
    x, mask = _padded_batch()
    with pytest.raises(ValueError, match="x"):
        pool(x[0], mask)  # 2-D
    with pytest.raises(ValueError, match="x"):
        pool(torch.ones(3, 5, 4, dtype=torch.long), mask)
    with pytest.raises(ValueError, match=r"mask: got shape \(3, 4\)"):
        pool(x, mask[:, :4])
    with pytest.raises(ValueError, match="mask: got torch.int64"):
        pool(x, mask.long())


# --- the classifier ----------------------------------------------------------------------


def _model(pooling="mean", **kwargs):
    torch.manual_seed(0)
    model = TransformerClassifier(
        vocab_size=11, num_classes=3, d_model=16, num_heads=2, num_layers=2, d_ff=24,
        max_len=20, pad_id=0, pooling=pooling, **kwargs,
    )  # fmt: skip
    return model.double().eval()


def _tokens():
    gen = torch.Generator().manual_seed(1)
    tokens = torch.randint(1, 11, (4, 7), generator=gen)
    for b, n in enumerate([7, 5, 2, 1]):
        tokens[b, n:] = 0
    return tokens


def test_classifier_encodes_pools_real_tokens_and_classifies():
    """forward = encode -> pool over the real tokens -> linear layer; padding gets no weight."""
    model, tokens = _model(), _tokens()
    logits = model(tokens)
    assert logits.shape == (4, 3)
    hidden, keep, weights = model.encode(tokens, return_attention=True)
    assert hidden.shape == (4, 7, 16) and torch.equal(keep, tokens != 0)
    pooled = torch.stack([hidden[b, : int(n)].mean(dim=0) for b, n in enumerate(keep.sum(1))])
    torch.testing.assert_close(logits, model.output_layer(pooled))  # mean over real tokens only
    assert len(weights) == 2  # one (B, H, T, T) map per layer
    for w in weights:
        assert w.shape == (4, 2, 7, 7)
        assert bool((w.masked_select(~keep[:, None, None, :]) == 0).all())  # no padded key
        torch.testing.assert_close(w.sum(-1), torch.ones(4, 2, 7, dtype=w.dtype))


@pytest.mark.parametrize("pooling", ["mean", "max"])
@pytest.mark.parametrize("norm_first", [False, True])
def test_classifier_output_is_invariant_to_extra_padding(pooling, norm_first):
    model = _model(pooling, norm_first=norm_first)
    tokens = _tokens()
    longer = F.pad(tokens, (0, 9), value=0)  # nine more PAD tokens
    torch.testing.assert_close(model(longer), model(tokens))


def test_classifier_each_sentence_is_independent_of_the_batch():
    model = _model()
    tokens = _tokens()
    batch = model(tokens)
    for b, n in enumerate([7, 5, 2, 1]):
        alone = model(tokens[b : b + 1, :n])  # no padding at all
        torch.testing.assert_close(batch[b : b + 1], alone)


def test_classifier_attention_ignores_padded_keys():
    model = _model()
    _, keep, weights = model.encode(_tokens(), return_attention=True)
    for w in weights:  # (B, H, T, T)
        assert (w.masked_select(~keep[:, None, None, :].expand_as(w)) == 0).all()


def test_classifier_depends_on_word_order():
    model = _model()
    tokens = torch.tensor([[3, 4, 5, 6]])
    swapped = torch.tensor([[6, 4, 5, 3]])
    assert not torch.allclose(model(tokens), model(swapped))


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"pad_id": 11}, "pad_id"),
        ({"pad_id": -1}, "pad_id"),
        ({"pooling": "sum"}, "pooling"),
        ({"num_classes": 0}, "num_classes"),
        ({"vocab_size": 0}, "vocab_size"),
    ],
)
def test_classifier_constructor_validates(kwargs, match):
    args = {"vocab_size": 11, "num_classes": 2, "d_model": 16, "num_heads": 2, "d_ff": 8}
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        TransformerClassifier(**args)


@pytest.mark.parametrize(
    "tokens, match",
    [
        (torch.zeros(2, 3, 4, dtype=torch.long), "tokens: got shape"),
        (torch.zeros(2, 3), "dtype"),
        (torch.full((2, 3), 11), r"ids in \[11, 11\]"),
        (torch.ones(1, 21, dtype=torch.long), "max_len=20"),
        ([[1, 2]], "LongTensor"),
    ],
)
def test_classifier_forward_validates(tokens, match):
    with pytest.raises(ValueError, match=match):
        _model()(tokens)


def test_train_classifier_learns_a_trivial_task_and_accuracy_counts():
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(1, 11, (256, 6), generator=gen)
    labels = (tokens[:, 0] > 5).long()  # the class is written in the first token
    model = TransformerClassifier(
        11, 2, d_model=16, num_heads=2, num_layers=1, d_ff=32, dropout=0.0
    )
    losses = train_classifier(model, tokens, labels, num_steps=150, lr=3e-3, progress=False)
    assert len(losses) == 150 and sum(losses[-10:]) < sum(losses[:10])
    assert accuracy(model, tokens, labels) > 0.9
    assert model.training  # accuracy() restores the mode
    with pytest.raises(ValueError, match="labels"):
        train_classifier(model, tokens, labels[:10], num_steps=1, progress=False)


# --- the sentiment task ----------------------------------------------------------------


def _polarity(words: list[str]) -> int:
    """Sum of +1 / -1 per sentiment word, flipped when the previous word is a negator."""
    score = 0
    for prev, word in zip([""] + words[:-1], words):
        sign = 1 if word in POSITIVE_WORDS else -1 if word in NEGATIVE_WORDS else 0
        score += -sign if prev in NEGATORS else sign
    return score


def test_sentiment_task_shapes_padding_and_lengths():
    task = make_sentiment_task(200, min_len=4, max_len=12, seed=0)
    assert task.tokens.shape == (200, 12) and task.tokens.dtype == torch.long
    assert task.labels.shape == (200,) and set(task.labels.tolist()) <= {0, 1}
    assert task.vocab_size == len(VOCAB) and VOCAB[PAD] == "<pad>"
    assert int(task.lengths.min()) >= 4 and int(task.lengths.max()) <= 12
    real = torch.arange(12)[None, :] < task.lengths[:, None]
    assert ((task.tokens != PAD) == real).all()  # PAD exactly after the sentence, nowhere inside


def test_sentiment_labels_follow_the_words_with_negation():
    task = make_sentiment_task(500, seed=3)
    negated = 0
    for i in range(len(task)):
        words = task.text(i).split()
        assert len(words) == int(task.lengths[i])
        score = _polarity(words)
        assert score != 0 and (score > 0) == bool(task.labels[i])
        negated += any(w in NEGATORS for w in words)
        for prev, word in zip(words, words[1:]):  # a negator always negates a sentiment word
            if prev in NEGATORS:
                assert word in POSITIVE_WORDS + NEGATIVE_WORDS
    assert 0 < negated < len(task)


def test_sentiment_without_negation_has_no_negators():
    task = make_sentiment_task(200, min_len=2, negation=False, seed=0)
    negator_ids = [VOCAB.index(w) for w in NEGATORS]
    assert not torch.isin(task.tokens, torch.tensor(negator_ids)).any()


def test_sentiment_is_deterministic_and_leaves_global_rng_alone():
    torch.manual_seed(123)
    before = torch.get_rng_state()
    a = make_sentiment_task(50, seed=7)
    assert torch.equal(torch.get_rng_state(), before)
    b = make_sentiment_task(50, seed=7)
    c = make_sentiment_task(50, seed=8)
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.labels, b.labels)
    assert not torch.equal(a.tokens, c.tokens)


def test_sentiment_labels_are_roughly_balanced_and_words_are_neutral_mostly():
    task = make_sentiment_task(2000, seed=0)
    assert 0.45 < task.labels.float().mean() < 0.55
    neutral = torch.isin(task.tokens, torch.tensor([VOCAB.index(w) for w in NEUTRAL_WORDS]))
    assert neutral.sum() > 0.5 * (task.tokens != PAD).sum()


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"num_samples": 0}, "num_samples"),
        ({"min_len": 5, "max_len": 4}, "min_len, max_len"),
        ({"min_len": 3, "max_phrases": 2}, "min_len: got 3, expected at least 4"),
        ({"max_phrases": 0}, "max_phrases"),
        ({"negation_prob": 1.5}, "negation_prob"),
    ],
)
def test_sentiment_validates(kwargs, match):
    args = {"num_samples": 10}
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        make_sentiment_task(**args)
