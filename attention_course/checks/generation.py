"""Checker for exercise 13's ``generate(model, prompt, max_new_tokens, temperature=1.0,
generator=None)``: decoding with a KV cache, positions advanced by hand.

The student drives a :class:`StepDecoder`: a small RoPE GPT (the package's
:class:`~attention_course.GPT` with ``pos="rope"``, in float64) whose ``forward(ids,
positions, cache)`` takes the *absolute* positions of the tokens it is given, rotates the
queries and keys by them, appends the keys and values to ``cache`` and lets each query see
the cached keys at or before its position. Fed right (the prompt at positions ``0 .. T0 -
1``, then each new token alone at the next position) it gives the logits of the GPT
itself, so the reference tokens are the package's :func:`~attention_course.generate`'s
(``tests/test_exercises_13_16.py`` proves both).

The decoder records each call (which cache, how many positions it held, how many tokens
came, their first and last position) in a buffer that travels back with the model from a
grading kernel, so the checker can name what the tokens alone could not: the cache never
used, the whole sequence fed again into the cache, positions that restart at 0 (or are off
by one). The temperature applied after the softmax is named from the tokens: they are
those of sampling at temperature 1.

Tokens are compared exactly. The decoder runs in float64, so the student's logits (in a
grading kernel, another process) and the reference's agree to about 1e-16: an argmax or
a seeded ``torch.multinomial`` draw could differ only if a draw fell within that distance
of a boundary. The fixed cases keep a margin: ``tests/test_exercises_13_16.py`` moves the
logits by 1e-9 and gets the same tokens, and runs the checker under 1 and 2 threads.
"""

from __future__ import annotations

import torch
from torch import nn

from attention_course.attention import scaled_dot_product_attention
from attention_course.gpt import GPT
from attention_course.kv import repeat_kv
from attention_course.multihead import merge_heads, split_heads
from attention_course.relative_positions import apply_rope

from . import _data
from ._runner import TRIVIAL, Case, CaseFailed, call_student, checker

VOCAB = 13
MAX_CALLS = 64  # calls the log keeps; more are counted

GEN_NO_CACHE = (
    "the cache is never used: every step starts from an empty cache and re-reads the whole "
    "sequence; make one cache with `model.new_cache()` before the loop, feed it the prompt "
    "once, then only each new token"
)
GEN_REFED = (
    "you fed the whole sequence again into a cache that already holds it: the cache now "
    "holds every position twice; after the prompt, feed only the new token, (B, 1)"
)
GEN_POSITIONS_ZERO = (
    "positions restart at 0 for each new token: the new token is at position "
    "`cache.length` (the number of positions already cached), so its RoPE angle and its "
    "causal mask are those of that position"
)
GEN_POSITIONS_OFF = (
    "the new token's position is not the number of positions already in the cache: the "
    "prompt occupies 0 .. T0 - 1, the first new token is at T0, the next at T0 + 1, ..."
)
GEN_TEMP_AFTER = (
    "your samples are those of temperature 1: the temperature was applied after the "
    "softmax (dividing probabilities by T changes nothing once they are renormalised); "
    "divide the logits by T, then take the softmax"
)
GEN_ARGMAX = (
    "with temperature > 0 you took the argmax: sample from the probabilities with "
    "`torch.multinomial(probs, 1, generator=generator)`"
)
GEN_NOT_GREEDY = (
    "temperature 0 means greedy decoding: take the argmax of the last logits, do not sample"
)
GEN_LAST_FED = (
    "you fed the last new token to the model too: nothing uses its logits, so that call "
    "is a wasted forward pass; generating N tokens feeds T0 + N - 1 positions (the prompt, "
    "then each new token but the last), so stop after appending the last one"
)
GEN_TWO_CACHES = (
    "more than one cache was made: the prompt went into one cache and a later token into a "
    "new, empty one, which holds none of the prompt's keys; one cache from "
    "`model.new_cache()` serves the whole generation"
)
# known mistakes the tokens show: (name, message, applies at temperature 0, applies when sampling)
GEN_MISTAKES = (
    (
        "first position",
        "you took the logits of the first position (`logits[:, 0]`): the next token is "
        "predicted by the last position, `logits[:, -1]`",
        True,
        True,
    ),
    (
        "stale logits",
        "every step used the prompt's logits: the logits the model returns for the new "
        "token were not kept (`logits = model(nxt, ...)`)",
        True,
        True,
    ),
    (
        "previous token",
        "each call fed the token before the new one (the cache got the sequence one step "
        "late): append the new token, then feed that new token, (B, 1), at the next position",
        True,
        True,
    ),
    (
        "max over time",
        "you took a maximum over the time axis (`logits.max(dim=1)`) before the argmax: "
        "the next token is the argmax over the vocabulary of the last position, "
        "`logits[:, -1].argmax(-1, keepdim=True)`",
        True,
        False,
    ),
    (
        "temperature multiplies",
        "your samples are those of temperature 1 / T: the logits were multiplied by the "
        "temperature (or the probabilities raised to the power T); divide the logits by T, "
        "`softmax(logits[:, -1] / temperature, dim=-1)`",
        False,
        True,
    ),
    (
        "softmax over time",
        "the softmax ran over the time axis (dim=1), not over the vocabulary: take the "
        "softmax of the last position's logits over dim=-1",
        False,
        True,
    ),
    (
        "two draws",
        "the generator was drawn from twice per step (two `torch.multinomial` calls): "
        "sample once per step, so the seeded draws are the reference's",
        False,
        True,
    ),
    (
        "one draw for the batch",
        "one sample served the whole batch: `torch.multinomial(probs, 1, "
        "generator=generator)` on probs (B, V) draws one token per sequence",
        False,
        True,
    ),
)


class StepCache:
    """What :class:`StepDecoder` keeps between calls: per layer the keys, values and their
    positions. ``length`` is the number of positions cached."""

    def __init__(self, serial: int, num_layers: int) -> None:
        self.serial = serial
        self.keys: list = [None] * num_layers
        self.values: list = [None] * num_layers
        self.positions: torch.Tensor | None = None  # (S,) the absolute position of each key

    @property
    def length(self) -> int:
        return 0 if self.positions is None else int(self.positions.shape[0])


class StepDecoder(nn.Module):
    """A RoPE GPT driven one call at a time with explicit positions and a cache.

    ``forward(ids (B, T), positions (T,), cache) -> logits (B, T, V)``: the tokens ``ids`` sit
    at the absolute ``positions``; their keys and values join ``cache`` (from
    :meth:`new_cache`), and each query sees the cached keys whose position is at or before
    its own. ``cache`` None means an empty cache used once.

    A student's ``generate`` gets it through :class:`OfferedModel`, which offers only what
    the task needs, in the check cell and in the grader alike.
    """

    def __init__(self, gpt: GPT) -> None:
        super().__init__()
        self.gpt = gpt
        self.vocab_size = gpt.vocab_size
        # the calls, for the checker: (cache serial, cached before, tokens, first, last position)
        self.register_buffer("calls", torch.zeros(MAX_CALLS, 5, dtype=torch.long))
        self.register_buffer("num_calls", torch.zeros(1, dtype=torch.long))
        self.register_buffer("num_caches", torch.zeros(1, dtype=torch.long))

    def new_cache(self) -> StepCache:
        self.num_caches += 1
        return StepCache(int(self.num_caches), len(self.gpt.blocks))

    def forward(self, ids: torch.Tensor, positions: torch.Tensor, cache: StepCache | None = None):
        if not isinstance(ids, torch.Tensor) or ids.dim() != 2 or ids.is_floating_point():
            raise ValueError(f"ids: got {_describe(ids)}, expected a LongTensor (B, T)")
        T = ids.shape[1]
        if not isinstance(positions, torch.Tensor):
            positions = torch.as_tensor(positions)
        if positions.dim() != 1 or positions.shape[0] != T or positions.is_floating_point():
            raise ValueError(
                f"positions: got {_describe(positions)}, expected an integer tensor (T,) = ({T},)"
            )
        if cache is None:
            cache = self.new_cache()
        if not isinstance(cache, StepCache):
            raise ValueError(f"cache: got {type(cache).__name__}, expected model.new_cache()")
        positions = positions.long()
        n = int(self.num_calls)
        if n < MAX_CALLS:
            self.calls[n] = torch.tensor(
                [cache.serial, cache.length, T, int(positions[0]), int(positions[-1])]
            )
        self.num_calls += 1
        gpt = self.gpt
        x = gpt.tok_emb(ids)  # (B, T) -> (B, T, D)
        keys_at = positions if cache.positions is None else torch.cat([cache.positions, positions])
        visible = keys_at[None, :] <= positions[:, None]  # (T, S): True = may attend
        for i, block in enumerate(gpt.blocks):
            attn = block.attn
            h = block.norm1(x)
            q = split_heads(attn.w_q(h), attn.num_heads)  # (B, H, T, Dh)
            k = split_heads(attn.w_k(h), attn.num_kv_heads)  # (B, Hkv, T, Dh)
            v = split_heads(attn.w_v(h), attn.num_kv_heads)
            q, k = apply_rope(q, positions), apply_rope(k, positions)  # at the given positions
            if cache.keys[i] is not None:
                k = torch.cat([cache.keys[i], k], dim=2)  # (B, Hkv, S, Dh)
                v = torch.cat([cache.values[i], v], dim=2)
            cache.keys[i], cache.values[i] = k, v
            n_rep = attn.num_heads // attn.num_kv_heads
            heads, _ = scaled_dot_product_attention(
                q, repeat_kv(k, n_rep), repeat_kv(v, n_rep), mask=visible
            )
            x = x + attn.w_o(merge_heads(heads))  # (B, H, T, Dh) -> (B, T, D)
            x = x + block.ffn(block.norm2(x))
        cache.positions = keys_at
        return gpt.head(gpt.norm(x))  # (B, T, V)

    def logged_calls(self) -> list[tuple[int, int, int, int, int]]:
        n = min(int(self.num_calls), MAX_CALLS)
        return [tuple(int(v) for v in row) for row in self.calls[:n]]


def _describe(value) -> str:
    if isinstance(value, torch.Tensor):
        return f"a {value.dtype} tensor of shape {tuple(value.shape)}"
    return type(value).__name__


_OFFERED = (
    "the model given to generate offers the call model(ids, positions, cache), new_cache(), "
    "eval(), train(), parameters(), vocab_size and training, and its cache `length` and "
    "`positions` (a stand-in, not an nn.Module)"
)


class OfferedCache:
    """A :class:`StepCache` as the student's ``generate`` sees it: ``length`` and
    ``positions`` only. While grading, the kernel uses the grader's by reference
    (`attention_course.grading.sandbox`)."""

    served_while_grading = (False, (), ("length", "positions"))

    def __init__(self, cache: StepCache) -> None:
        object.__setattr__(self, "_cache", cache)

    @property
    def length(self) -> int:
        return self._cache.length

    @property
    def positions(self) -> torch.Tensor | None:
        return self._cache.positions

    def __getattr__(self, name: str):
        raise AttributeError(f"the cache has no `{name}` here: {_OFFERED}")


class OfferedModel:
    """The :class:`StepDecoder` as the student's ``generate`` sees it: the call, these
    methods and these attributes, nothing else (not ``.gpt``, not ``.to``, not an
    ``nn.Module``). The check cell and the grader give the same one: while grading, the
    model stays in the grader and the kernel gets a stand-in offering exactly this, whose
    calls run here on plain data (`attention_course.grading.sandbox`), so that no GPT, and
    no causal self-attention (exercise 13's task 2), exists in the sandbox."""

    served_while_grading = (
        True,
        ("new_cache", "eval", "train", "parameters"),  # parameters: `next(...).device`, by value
        ("vocab_size", "training"),
    )

    def __init__(self, model: StepDecoder) -> None:
        object.__setattr__(self, "_model", model)

    def __call__(self, ids, positions, cache=None):
        if isinstance(cache, OfferedCache):
            cache = cache._cache
        return self._model(ids, positions, cache)

    def new_cache(self) -> OfferedCache:
        return OfferedCache(self._model.new_cache())

    def eval(self) -> OfferedModel:
        self._model.eval()
        return self

    def train(self, mode: bool = True) -> OfferedModel:
        self._model.train(bool(mode))
        return self

    def parameters(self):
        return self._model.parameters()

    @property
    def vocab_size(self) -> int:
        return self._model.vocab_size

    @property
    def training(self) -> bool:
        return self._model.training

    def __getattr__(self, name: str):
        raise AttributeError(f"`{name}` is not offered: {_OFFERED}")


def step_decoder(seed: int = 0) -> StepDecoder:
    """The checker's decoder: 2 layers, 4 query heads sharing 2 key/value heads, RoPE,
    13 tokens, float64, weights drawn with ``seed`` (larger than a fresh GPT's, so that
    the temperature visibly changes the samples)."""
    gen = _data.generator(seed)
    gpt = GPT(VOCAB, d_model=16, num_heads=4, num_kv_heads=2, num_layers=2, pos="rope", max_len=64)
    gpt = gpt.double()
    with torch.no_grad():
        for name, p in gpt.named_parameters():
            if "norm" not in name:
                p.copy_(torch.randn(p.shape, generator=gen, dtype=p.dtype) * 0.4)
    return StepDecoder(gpt).eval()


def reference_generate(
    model, prompt, max_new_tokens, temperature=1.0, generator=None, *, mistake: str | None = None
):
    """Generation done right with a :class:`StepDecoder` (or with one known ``mistake``:
    ``"temperature after softmax"``, ``"argmax"`` or a name of :data:`GEN_MISTAKES`)."""
    cache = model.new_cache()
    out = prompt
    if max_new_tokens == 0:
        return out.clone()
    with torch.no_grad():
        logits = model(prompt, torch.arange(prompt.shape[1]), cache)
        for step in range(max_new_tokens):
            last = logits[:, 0 if mistake == "first position" else -1, :]  # (B, V)
            if mistake == "max over time":
                last = logits.max(dim=1).values
            if temperature == 0 or mistake == "argmax":
                nxt = last.argmax(dim=-1, keepdim=True)  # (B, 1)
            else:
                if mistake == "temperature after softmax":
                    probs = torch.softmax(last, dim=-1) / temperature
                elif mistake == "temperature multiplies":
                    probs = torch.softmax(last * temperature, dim=-1)
                elif mistake == "softmax over time":
                    probs = torch.softmax(logits / temperature, dim=1)[:, -1]
                else:
                    probs = torch.softmax(last / temperature, dim=-1)
                if mistake == "two draws":
                    torch.multinomial(probs, 1, generator=generator)
                if mistake == "one draw for the batch":
                    nxt = torch.multinomial(probs[:1], 1, generator=generator)
                    nxt = nxt.expand(probs.shape[0], 1)
                else:
                    nxt = torch.multinomial(probs, 1, generator=generator)  # (B, 1)
            out = torch.cat([out, nxt], dim=1)
            if step + 1 < max_new_tokens:
                fed = out[:, -2:-1] if mistake == "previous token" else nxt
                new_logits = model(fed, torch.tensor([out.shape[1] - 1]), cache)
                if mistake != "stale logits":
                    logits = new_logits
    return out


def _log_problem(calls: list, T0: int, max_new_tokens: int, num_calls: int) -> str | None:
    """The mistake the decoder's log shows, if any (``num_calls``: all calls, logged or
    not)."""
    if not calls:
        return "the model was never called: call `model(ids, positions, cache)`"
    if max_new_tokens > 1 and all(length == 0 for _, length, *_ in calls):
        return GEN_NO_CACHE
    for i, (serial, length, T, first, last) in enumerate(calls):
        if length == 0:
            if i > 0 and serial != calls[0][0] and first != 0:
                return (
                    f"{GEN_TWO_CACHES} (call {i + 1} fed {T} token(s) at position {first} into "
                    "an empty cache)"
                )
            if first != 0 or last != T - 1:
                return (
                    f"the first call fed {T} token(s) at positions {first} .. {last}: the prompt "
                    "sits at positions 0 .. T0 - 1"
                )
            continue
        if T > 1:
            return f"{GEN_REFED} (a call fed {T} tokens into a cache of {length} positions)"
        if first == 0:
            return f"{GEN_POSITIONS_ZERO} (a token was given position 0 after {length} cached)"
        if first != length:
            return (
                f"{GEN_POSITIONS_OFF} (a token was given position {first} after {length} "
                "cached positions)"
            )
    serials = {serial for serial, *_ in calls}
    if len(serials) > 1 and max_new_tokens > 1:
        return GEN_TWO_CACHES
    final = T0 + max_new_tokens - 1  # the last new token's position
    if any(last >= final for *_, last in calls):
        fed = sum(T for _, _, T, _, _ in calls)
        return (
            f"{GEN_LAST_FED} (position {final}, the last new token's, was fed: {fed} positions "
            f"in {num_calls} calls, where {T0} + {max_new_tokens - 1} are needed)"
        )
    return None


def _error_hint(text: str) -> str | None:
    if "probability tensor" in text or "division by zero" in text:
        return GEN_NOT_GREEDY + " (dividing by a temperature of 0 gives inf or NaN)"
    if "same number of dimensions" in text:
        return (
            "the new token must be (B, 1) to join the sequence with `torch.cat(..., dim=1)` "
            "and to be fed to the model: `argmax(-1, keepdim=True)` keeps that axis "
            "(`torch.multinomial(probs, 1)` already returns (B, 1))"
        )
    return None


def _showing_mistakes(B: int, T0: int, n: int, temperature: float) -> list[str]:
    """The mistakes of :func:`reference_generate` that can change the tokens of a case:
    the first position and a maximum over time only in the prompt's pass (T0 > 1), stale
    logits and the previous token fed only from the second new token on, one draw for the
    batch only with B > 1, the temperature's mistakes only at a temperature other than 1."""
    if n == 0:
        return []
    greedy = temperature == 0
    found = []
    for name, _, at_zero, sampling in GEN_MISTAKES:
        if not (at_zero if greedy else sampling):
            continue
        if name in ("first position", "max over time") and T0 == 1:
            continue
        if name in ("stale logits", "previous token") and n < 2:
            continue
        if name == "one draw for the batch" and B == 1:
            continue
        if name.startswith("temperature") and temperature == 1.0:
            continue
        found.append(name)
    if not greedy:
        found.append("argmax")
        if temperature != 1.0:
            found.append("temperature after softmax")
    return found


def _prompt(B: int, T0: int, n: int, temperature: float, seed: int) -> tuple[torch.Tensor, int]:
    """A (B, T0) prompt drawn from ``seed`` and the seed name of the samples' generator
    (``seed + 1``, as the check cells have always used), redrawn together
    (`_data.draw_until`) until each mistake of :func:`_showing_mistakes` gives other first
    tokens than the reference (and, greedy, than each other mistake: two, or five tokens
    for the mistakes that show from the second on, so the search stays cheap). On some
    prompts the first position's argmax is the last's, or a sample at temperature 0.5 is
    the one at temperature 1, and a run seed that drew one would let that mistake pass the
    case."""
    mistakes = _showing_mistakes(B, T0, n, temperature)
    model = step_decoder()

    def draw(name: int) -> tuple[torch.Tensor, int]:
        return torch.randint(0, VOCAB, (B, T0), generator=_data.generator(name)), name + 1

    def keep(drawn: tuple[torch.Tensor, int]) -> bool:
        prompt, sampler = drawn

        def tokens(steps: int, mistake=None):  # the first new tokens: a prefix of the case's
            generator = _data.generator(sampler)
            return reference_generate(model, prompt, steps, temperature, generator, mistake=mistake)

        seen = [tokens(min(n, 5))]  # the right tokens, then each mistake's
        for mistake in mistakes:
            steps = min(n, 5 if mistake in ("stale logits", "previous token") else 2)
            wrong = tokens(steps, mistake)
            # other tokens than the right ones and, when greedy (where the first failure of
            # most mistakes is), than every other mistake's: the diagnosis names it alone
            for other in seen if temperature == 0 else seen[:1]:
                length = min(wrong.shape[1], other.shape[1])
                if torch.equal(wrong[:, :length], other[:, :length]):
                    return False
            seen.append(wrong)
        return True

    return _data.draw_until(draw, keep, seed)


def _generate_case(candidate, *, B, T0, n, temperature, seed=0):
    def run():
        prompt, sampler = _prompt(B, T0, n, temperature, seed)
        model = step_decoder()
        expected = reference_generate(
            step_decoder(), prompt, n, temperature, _data.generator(sampler)
        )
        what = f"generate(model, prompt ({B}, {T0}), max_new_tokens={n}, temperature={temperature}"
        what += ", generator)" if temperature else ")"
        kwargs = {"temperature": temperature}
        if temperature:
            kwargs["generator"] = _data.generator(sampler)
        got = call_student(
            candidate,
            OfferedModel(model),
            prompt.clone(),
            n,
            what=what,
            error_hint=_error_hint,
            **kwargs,
        )
        if not isinstance(got, torch.Tensor) or got.is_floating_point() or got.dtype == torch.bool:
            raise CaseFailed(
                f"{what} returned {_describe(got)}; expected a LongTensor of token ids "
                f"(B, T0 + max_new_tokens) = ({B}, {T0 + n})"
            )
        calls = model.logged_calls()
        problem = _log_problem(calls, T0, n, int(model.num_calls)) if n > 0 else None
        if problem:
            raise CaseFailed(
                f"{what}: the calls of the model show a mistake\nLikely mistake: {problem}."
            )
        if tuple(got.shape) != tuple(expected.shape):
            raise CaseFailed(
                f"{what}: expected shape ({B}, {T0 + n}) (the prompt, then the new tokens), got "
                f"{tuple(got.shape)}"
            )
        if got.dtype != torch.int64:
            right = torch.equal(got.detach().cpu().long(), expected)
            raise CaseFailed(
                f"{what} returned a tensor of dtype {got.dtype}"
                + (" (the tokens are right)" if right else "")
                + "; expected a LongTensor (dtype torch.int64), as the task says: the prompt is "
                "int64 and `torch.cat` keeps it, so drop the conversion (or return `out.long()`)"
            )
        got = got.detach().cpu()
        if not torch.equal(got[:, :T0], prompt):
            raise CaseFailed(f"{what}: the result must start with the prompt, unchanged")
        if torch.equal(got, expected):
            return
        message = (
            f"{what}: the new tokens differ from the reference's\n"
            f"  expected {expected[:, T0:].tolist()}"
            f"\n  got      {got[:, T0:].tolist()}"
        )
        known = [("temperature after softmax", GEN_TEMP_AFTER, False, True)]
        known += [("argmax", GEN_ARGMAX, False, True), *GEN_MISTAKES]
        found = []  # the known mistakes that give exactly these tokens
        for mistake, text, greedy, sampling in known:
            if not (greedy if temperature == 0 else sampling):
                continue
            if temperature == 1.0 and mistake.startswith("temperature"):
                continue  # the same samples as the right ones at temperature 1
            variant = reference_generate(
                step_decoder(),
                prompt,
                n,
                temperature,
                _data.generator(sampler),
                mistake=mistake,
            )
            if torch.equal(got, variant):
                found.append(text)
        if len(found) == 1:
            raise CaseFailed(f"{message}\nLikely mistake: {found[0]}.")
        if found:
            raise CaseFailed(
                f"{message}\nLikely mistake, one of these (each gives exactly your tokens):"
                + "".join(f"\n- {text}." for text in found)
            )
        if temperature == 0:
            message += (
                "\nHint: at temperature 0 take the argmax over the vocabulary of the last "
                "position's logits, `logits[:, -1].argmax(-1, keepdim=True)`; then feed that "
                "new token, (B, 1), at the next position and use the logits that call returns"
            )
        else:
            message += (
                "\nHint: at each step sample once per sequence, `torch.multinomial(probs, 1, "
                "generator=generator)` on the softmax of the last position's logits / temperature"
            )
        raise CaseFailed(message)

    return run


@checker("generate")
def check_generate(candidate) -> list[Case]:
    """Check ``generate(model, prompt, max_new_tokens, temperature=1.0, generator=None)``
    with a :class:`StepDecoder`: the prompt once, then each new token alone at the next
    position; greedy at temperature 0; seeded samples equal the reference's."""
    return [
        Case(
            "greedy (temperature=0), B = 1, a prompt of 4, 6 new tokens",
            _generate_case(candidate, B=1, T0=4, n=6, temperature=0.0),
            covers=frozenset({"temperature"}),
        ),
        Case(
            "greedy, B = 2, a prompt of 3, 9 new tokens",
            _generate_case(candidate, B=2, T0=3, n=9, temperature=0.0),
            covers=frozenset({"temperature", "B>1"}),
        ),
        Case(
            "sampling at temperature 1, seeded generator, 8 new tokens",
            _generate_case(candidate, B=2, T0=3, n=8, temperature=1.0, seed=2),
            covers=frozenset({"generator", "sampling"}),
        ),
        Case(
            "sampling at temperature 0.5, seeded generator",
            _generate_case(candidate, B=2, T0=2, n=10, temperature=0.5, seed=4),
            covers=frozenset({"temperature", "generator", "sampling"}),
        ),
        Case(
            "sampling at temperature 2.0, a one-token prompt",
            _generate_case(candidate, B=1, T0=1, n=10, temperature=2.0, seed=6),
            covers=frozenset({"temperature", "generator", "sampling", "T0=1"}),
        ),
        Case(
            "max_new_tokens = 1: the prompt's pass only",
            _generate_case(candidate, B=1, T0=5, n=1, temperature=0.0),
            weight=TRIVIAL,
        ),
        Case(
            "max_new_tokens = 0 returns the prompt",
            _generate_case(candidate, B=2, T0=3, n=0, temperature=0.0),
            weight=TRIVIAL,
            support=True,
        ),
    ]
