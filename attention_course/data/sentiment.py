"""A synthetic sentiment task: short "reviews" made of positive, negative and neutral words.

The source notes (see the book's introduction) train their Transformer classifier
on IMDB reviews; the course downloads nothing, so we generate sentences in memory
instead. Each sentence has one or more *sentiment phrases* hidden among neutral
filler words. A phrase is either a sentiment word that agrees with the label
("great" in a positive review) or, with negation on, a negator followed by a word
of the **opposite** polarity ("not bad" in a positive review). All phrases of a
sentence agree, so the label is never ambiguous. Because negated phrases use the
opposite word, neither "not" nor a single sentiment word decides the label alone:
the model has to read words in context, which is what self-attention is for.

Token ids: ``PAD = 0``, then the words of :data:`VOCAB`. Sentences are padded
on the right with ``PAD``; labels are ``0`` (negative) and ``1`` (positive).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

PAD = 0
POSITIVE_WORDS = ("good", "great", "excellent", "wonderful", "fun", "loved")
NEGATIVE_WORDS = ("bad", "awful", "boring", "terrible", "dull", "hated")
NEUTRAL_WORDS = (
    "the", "a", "movie", "film", "plot", "actors", "story", "was", "is", "and",
    "it", "this", "very", "really", "ending", "music", "i", "quite",
)  # fmt: skip
NEGATORS = ("not", "never")
VOCAB = ("<pad>",) + POSITIVE_WORDS + NEGATIVE_WORDS + NEUTRAL_WORDS + NEGATORS
"""Every token, indexed by id: ``VOCAB[PAD] == "<pad>"``."""

_ID = {word: i for i, word in enumerate(VOCAB)}
_POSITIVE_IDS = torch.tensor([_ID[w] for w in POSITIVE_WORDS])
_NEGATIVE_IDS = torch.tensor([_ID[w] for w in NEGATIVE_WORDS])
_NEUTRAL_IDS = torch.tensor([_ID[w] for w in NEUTRAL_WORDS])
_NEGATOR_IDS = torch.tensor([_ID[w] for w in NEGATORS])


@dataclass
class SentimentTask:
    """A generated sentiment data set.

    Shapes:
        tokens: ``(N, max_len)`` token ids, right-padded with ``PAD``;
        labels: ``(N,)`` in ``{0, 1}`` (negative, positive); lengths: ``(N,)``.
    """

    tokens: torch.Tensor
    labels: torch.Tensor
    lengths: torch.Tensor
    vocab: tuple[str, ...] = VOCAB
    pad_id: int = PAD

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    def __len__(self) -> int:
        return self.tokens.shape[0]

    def text(self, index: int) -> str:
        """The sentence at ``index`` as words, padding left out."""
        return " ".join(self.vocab[t] for t in self.tokens[index].tolist() if t != self.pad_id)


def make_sentiment_task(
    num_samples: int,
    min_len: int = 4,
    max_len: int = 16,
    negation: bool = True,
    negation_prob: float = 0.4,
    max_phrases: int = 2,
    seed: int = 0,
) -> SentimentTask:
    """Generate ``num_samples`` labelled sentences of ``min_len .. max_len`` words.

    Each sentence draws its label (0 or 1) uniformly, then ``1 .. max_phrases``
    sentiment phrases; with ``negation`` each phrase is negated with probability
    ``negation_prob`` (a negator followed by an opposite-polarity word, which
    takes two words). The remaining words are neutral, and phrases land at
    random positions. Uses its own ``torch.Generator`` seeded by ``seed``, so
    the data neither depends on nor disturbs the global random state.

    Shapes:
        returns a :class:`SentimentTask` with tokens ``(N, max_len)``,
        labels ``(N,)`` and lengths ``(N,)``.
    """
    for name, value in (("num_samples", num_samples), ("max_phrases", max_phrases)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name}: got {value!r}, expected a positive int")
    if not (isinstance(min_len, int) and isinstance(max_len, int)) or not 1 <= min_len <= max_len:
        raise ValueError(
            f"min_len, max_len: got {min_len!r}, {max_len!r}, expected ints with "
            f"1 <= min_len <= max_len"
        )
    # The longest possible set of phrases (all negated) must fit in the shortest sentence.
    needed = 2 * max_phrases if negation else max_phrases
    if min_len < needed:
        raise ValueError(
            f"min_len: got {min_len}, expected at least {needed} so that {max_phrases} "
            f"phrase(s){' (negated: two words each)' if negation else ''} fit in a sentence"
        )
    if not isinstance(negation_prob, (int, float)) or not 0.0 <= negation_prob <= 1.0:
        raise ValueError(f"negation_prob: got {negation_prob!r}, expected a probability in [0, 1]")

    gen = torch.Generator().manual_seed(seed)
    N, P = num_samples, max_phrases
    # Draw every random number up front, in bulk (fast); the loop below only arranges them.
    labels = torch.randint(0, 2, (N,), generator=gen)
    lengths = torch.randint(min_len, max_len + 1, (N,), generator=gen)
    num_phrases = torch.randint(1, P + 1, (N,), generator=gen).tolist()
    negate = ((torch.rand(N, P, generator=gen) < negation_prob) & negation).tolist()
    same = torch.randint(len(POSITIVE_WORDS), (N, P), generator=gen).tolist()  # word indices
    opposite = torch.randint(len(NEGATIVE_WORDS), (N, P), generator=gen).tolist()
    negator = _NEGATOR_IDS[torch.randint(len(NEGATORS), (N, P), generator=gen)].tolist()
    fillers = _NEUTRAL_IDS[torch.randint(len(NEUTRAL_WORDS), (N, max_len), generator=gen)].tolist()
    slot_order = torch.rand(N, max_len, generator=gen).argsort(dim=1).tolist()

    rows = []
    positive, negative = _POSITIVE_IDS.tolist(), _NEGATIVE_IDS.tolist()
    for i, (label, n) in enumerate(zip(labels.tolist(), lengths.tolist())):
        words = (positive, negative) if label == 1 else (negative, positive)
        k = num_phrases[i]
        phrases = [
            [negator[i][p], words[1][opposite[i][p]]]  # "not" + an opposite word
            if negate[i][p]
            else [words[0][same[i][p]]]  # a word that agrees with the label
            for p in range(k)
        ]
        # Scatter the phrases among neutral words: each phrase takes one "slot";
        # the first k slots of a random order of the valid slots start phrases.
        num_slots = n - sum(len(p) for p in phrases) + k
        starts = sorted([s for s in slot_order[i] if s < num_slots][:k])
        sentence, fill, next_phrase = [], iter(fillers[i]), 0
        for slot in range(num_slots):
            if next_phrase < k and slot == starts[next_phrase]:
                sentence += phrases[next_phrase]
                next_phrase += 1
            else:
                sentence.append(next(fill))
        rows.append(sentence + [PAD] * (max_len - n))
    return SentimentTask(torch.tensor(rows, dtype=torch.long), labels, lengths)
