"""Part V's data pieces: the Python documentation text, the positional split, the
character tokenizer and the counting (n-gram) baselines."""

from __future__ import annotations

import sys

import pytest
import torch

import attention_course as ac
from attention_course.data import python_docs, split_text


@pytest.fixture(scope="module")
def text() -> str:
    return python_docs()


@pytest.fixture(scope="module")
def tok(text) -> ac.CharTokenizer:
    return ac.CharTokenizer(text)


# ---------------------------------------------------------------- python_docs


def test_python_docs_is_the_sorted_topics(text):
    from pydoc_data.topics import topics

    assert isinstance(text, str)
    assert 400_000 < len(text) < 550_000  # about 465,000 (465,048 on Python 3.11.7)
    first = sorted(topics)[0]
    assert text.startswith(topics[first])
    assert text == "\n".join(topics[name] for name in sorted(topics))
    assert python_docs() == text  # deterministic


@pytest.mark.skipif(sys.version_info[:2] != (3, 11), reason="the topics change between releases")
def test_python_docs_length_on_311(text):
    assert 464_000 < len(text) < 466_000


def test_python_docs_without_pydoc_data(monkeypatch):
    monkeypatch.setitem(sys.modules, "pydoc_data.topics", None)  # import now fails
    with pytest.raises(ImportError, match="pydoc_data.topics"):
        python_docs()


# ---------------------------------------------------------------- split_text


def test_split_text_holds_out_the_last_tenth(text):
    train, val = split_text(text)
    assert train + val == text
    assert len(val) == round(len(text) * 0.1)
    assert val == text[-len(val) :]


def test_split_text_on_tensors_and_other_fractions():
    ids = torch.arange(20)
    train, val = split_text(ids, val_fraction=0.25)
    assert torch.equal(train, torch.arange(15)) and torch.equal(val, torch.arange(15, 20))
    assert split_text("abcdefghij", 0.5) == ("abcde", "fghij")


@pytest.mark.parametrize("fraction", [0.0, 1.0, -0.1, 1.5, "0.1", True, float("nan")])
def test_split_text_rejects_bad_fractions(fraction):
    with pytest.raises(ValueError, match="val_fraction"):
        split_text("abcdefghij", fraction)


def test_split_text_rejects_a_text_too_short():
    with pytest.raises(ValueError, match="text"):
        split_text("abc", 0.1)  # round(0.3) = 0 held out


# ---------------------------------------------------------------- CharTokenizer


def test_vocabulary_is_the_sorted_characters(text, tok):
    assert tok.chars == sorted(set(text))
    assert tok.vocab_size == len(set(text)) == len(tok)
    assert tok.encode(tok.chars[0]).tolist() == [0]
    assert tok.encode(tok.chars[-1]).tolist() == [tok.vocab_size - 1]


def test_round_trip(text, tok):
    ids = tok.encode(text)
    assert ids.dtype == torch.long and ids.shape == (len(text),)
    assert int(ids.min()) >= 0 and int(ids.max()) < tok.vocab_size
    assert tok.decode(ids) == text
    assert tok.decode(ids[:50].tolist()) == text[:50]


def test_small_vocabulary():
    tok = ac.CharTokenizer("hello world")
    assert tok.chars == [" ", "d", "e", "h", "l", "o", "r", "w"]
    assert tok.encode("hello").tolist() == [3, 2, 4, 4, 5]
    assert tok.decode(torch.tensor([7, 5, 6, 4, 1])) == "world"
    assert tok.encode("").shape == (0,) and tok.decode([]) == ""
    assert repr(tok) == "CharTokenizer(vocab_size=8)"


def test_unknown_character_is_named_with_its_position():
    tok = ac.CharTokenizer("abc")
    with pytest.raises(ValueError, match=r"'z' \(U\+007A\) at position 2"):
        tok.encode("abzc")


def test_empty_text_is_rejected():
    with pytest.raises(ValueError, match="empty"):
        ac.CharTokenizer("")


@pytest.mark.parametrize(
    "ids, phrase",
    [
        (torch.tensor([[0, 1], [1, 0]]), "one sequence"),
        (torch.tensor([0.0, 1.0]), "integer"),
        (torch.tensor([0, 3]), "id 3 at position 1"),
        ([0, -1], "id -1 at position 1"),
        ([0, 1.5], "list of ints"),
    ],
)
def test_decode_rejects_bad_ids(ids, phrase):
    with pytest.raises(ValueError, match=phrase):
        ac.CharTokenizer("abc").decode(ids)


# ---------------------------------------------------------------- n-gram baselines


def _by_loops(train: list[int], val: list[int], order: int, V: int, alpha: float) -> float:
    """The same model with Python dictionaries, for small inputs."""
    from collections import Counter
    from math import log

    pairs = Counter(tuple(train[i - order + 1 : i + 1]) for i in range(order - 1, len(train)))
    contexts = Counter(tuple(train[i - order + 1 : i]) for i in range(order - 1, len(train)))
    total = 0.0
    positions = range(order - 1, len(val))
    for i in positions:
        pair, context = tuple(val[i - order + 1 : i + 1]), tuple(val[i - order + 1 : i])
        total -= log((pairs[pair] + alpha) / (contexts[context] + alpha * V))
    return total / len(positions)


@pytest.mark.parametrize("order", [1, 2, 3, 4])
def test_ngram_matches_counting_with_loops(order):
    generator = torch.Generator().manual_seed(order)
    train = torch.randint(0, 5, (300,), generator=generator)
    val = torch.randint(0, 5, (60,), generator=generator)
    model = ac.NGramModel(order, 5, alpha=0.3).fit(train)
    expected = _by_loops(train.tolist(), val.tolist(), order, 5, 0.3)
    assert model.cross_entropy(val) == pytest.approx(expected, rel=1e-12)


def test_ngram_probabilities_sum_to_one():
    model = ac.NGramModel(3, 4, alpha=0.05).fit([0, 1, 2, 3, 0, 1, 2, 2, 1, 0])
    for context in ([0, 1], [2, 2], [3, 3]):  # seen, seen, unseen
        total = sum(float(model.log_probs([*context, c]).exp()) for c in range(4))
        assert total == pytest.approx(1.0)
    assert float(model.log_probs([3, 3, 1]).exp()) == pytest.approx(0.25)  # unseen: 1/V


def test_ngram_rejects_bad_input():
    with pytest.raises(ValueError, match="order"):
        ac.NGramModel(0, 5)
    with pytest.raises(ValueError, match="alpha"):
        ac.NGramModel(2, 5, alpha=0.0)
    with pytest.raises(ValueError, match="order"):
        ac.NGramModel(10, 200)  # 200 ** 10 does not fit an int64
    with pytest.raises(ValueError, match="vocab_size=5"):
        ac.NGramModel(2, 5).fit([0, 1, 5])
    with pytest.raises(RuntimeError, match="fit"):
        ac.NGramModel(2, 5).cross_entropy([0, 1])


def test_baselines_on_python_docs(text, tok):
    """The numbers chapter 13 prints: unigram 3.24, bigram 2.32, 4-gram 1.48 nats/char held out."""
    train, val = split_text(tok.encode(text))
    scores = {
        order: ac.NGramModel(order, tok.vocab_size, alpha=0.05).fit(train).cross_entropy(val)
        for order in (1, 2, 4)
    }
    assert round(scores[1], 2) == pytest.approx(3.24, abs=0.02)
    assert round(scores[2], 2) == pytest.approx(2.32, abs=0.02)
    assert round(scores[4], 2) == pytest.approx(1.48, abs=0.02)
