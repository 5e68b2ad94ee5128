"""Buggy generation loops with a cache (exercise 13, ``generate(model, prompt,
max_new_tokens, temperature=1.0, generator=None)`` on a ``StepDecoder``)."""

import torch


def _pick(last, temperature, generator, after=False, argmax=False, mode=None):
    if temperature == 0 or argmax:
        return last.argmax(-1, keepdim=True)
    if after:
        probs = torch.softmax(last, dim=-1) / temperature
    elif mode == "power":
        probs = torch.softmax(last, dim=-1) ** temperature
    else:
        probs = torch.softmax(last / temperature, dim=-1)
    if mode == "two draws":
        torch.multinomial(probs, 1, generator=generator)
    if mode == "one draw":
        return torch.multinomial(probs[:1], 1, generator=generator).expand(probs.shape[0], 1)
    return torch.multinomial(probs, 1, generator=generator)


def _loop(model, prompt, n, temperature, generator, *, mode=None):
    out = prompt
    if n == 0:
        return out
    cache = model.new_cache()
    logits = model(prompt, torch.arange(prompt.shape[1]), cache)
    second = model.new_cache() if mode == "two caches" else cache
    for step in range(n):
        last = logits[:, 0] if mode == "first" else logits[:, -1]
        if mode == "max over time" and temperature == 0:
            nxt = logits.max(dim=1).values.argmax(-1, keepdim=True)
        elif mode == "softmax over time" and temperature != 0:
            probs = torch.softmax(logits / temperature, dim=1)[:, -1]
            nxt = torch.multinomial(probs, 1, generator=generator)
        else:
            nxt = _pick(
                last,
                temperature,
                generator,
                after=mode == "after",
                argmax=mode == "argmax",
                mode=mode,
            )
        if mode == "previous token" and step + 1 < n:
            logits = model(out[:, -1:], torch.tensor([out.shape[1]]), cache)
        out = torch.cat([out, nxt], dim=1)
        if mode == "feed last":
            logits = model(nxt, torch.tensor([out.shape[1] - 1]), cache)
            continue
        if step + 1 == n or mode == "previous token":
            continue
        t = out.shape[1] - 1
        if mode == "stale":
            model(nxt, torch.tensor([t]), cache)
        elif mode == "two caches":
            logits = model(nxt, torch.tensor([t]), second)
        elif mode == "refeed":
            logits = model(out, torch.arange(out.shape[1]), cache)
        elif mode == "restart":
            logits = model(nxt, torch.arange(1), cache)
        elif mode == "no cache":
            logits = model(out, torch.arange(out.shape[1]), model.new_cache())
        elif mode == "off by one":
            logits = model(nxt, torch.tensor([t + 1]), cache)
        else:
            logits = model(nxt, torch.tensor([t]), cache)
    return out


def reference_generate(model, prompt, max_new_tokens, temperature=1.0, generator=None):
    """Right: the prompt once, then each new token alone at the next position."""
    return _loop(model, prompt, max_new_tokens, temperature, generator)


def generate_temperature_after_softmax(
    model, prompt, max_new_tokens, temperature=1.0, generator=None
):
    """softmax(logits) / temperature: the renormalised samples are temperature 1's."""
    return _loop(model, prompt, max_new_tokens, temperature, generator, mode="after")


def generate_refeeds_sequence(model, prompt, max_new_tokens, temperature=1.0, generator=None):
    """Feeds the whole sequence into the cache at every step (each position cached again)."""
    return _loop(model, prompt, max_new_tokens, temperature, generator, mode="refeed")


def generate_positions_restart(model, prompt, max_new_tokens, temperature=1.0, generator=None):
    """Each new token alone, but at position 0 (arange(1)) every time."""
    return _loop(model, prompt, max_new_tokens, temperature, generator, mode="restart")


def generate_without_cache(model, prompt, max_new_tokens, temperature=1.0, generator=None):
    """A new empty cache at every step, the whole sequence re-read: right tokens, no cache."""
    return _loop(model, prompt, max_new_tokens, temperature, generator, mode="no cache")


def generate_positions_off_by_one(model, prompt, max_new_tokens, temperature=1.0, generator=None):
    """The new token at position len(sequence) instead of len(sequence) - 1."""
    return _loop(model, prompt, max_new_tokens, temperature, generator, mode="off by one")


def generate_argmax_always(model, prompt, max_new_tokens, temperature=1.0, generator=None):
    """Greedy whatever the temperature."""
    return _loop(model, prompt, max_new_tokens, temperature, generator, mode="argmax")


def generate_feeds_the_last_token(model, prompt, max_new_tokens, temperature=1.0, generator=None):
    """Right tokens, but the last new token is fed too: one wasted forward pass."""
    return _loop(model, prompt, max_new_tokens, temperature, generator, mode="feed last")


def generate_first_position(model, prompt, max_new_tokens, temperature=1.0, generator=None):
    """``logits[:, 0]``: the first position's prediction instead of the last's."""
    return _loop(model, prompt, max_new_tokens, temperature, generator, mode="first")


def generate_stale_logits(model, prompt, max_new_tokens, temperature=1.0, generator=None):
    """Calls the model on each new token but never keeps the logits it returns."""
    return _loop(model, prompt, max_new_tokens, temperature, generator, mode="stale")


def generate_feeds_previous_token(model, prompt, max_new_tokens, temperature=1.0, generator=None):
    """Feeds ``out[:, -1:]`` before appending the new token: the token before it."""
    return _loop(model, prompt, max_new_tokens, temperature, generator, mode="previous token")


def generate_max_over_time(model, prompt, max_new_tokens, temperature=1.0, generator=None):
    """Greedy as ``logits.max(dim=1).values.argmax(-1)``: a maximum over time first."""
    return _loop(model, prompt, max_new_tokens, temperature, generator, mode="max over time")


def generate_two_caches(model, prompt, max_new_tokens, temperature=1.0, generator=None):
    """The prompt in one cache, the new tokens in a second, empty one."""
    return _loop(model, prompt, max_new_tokens, temperature, generator, mode="two caches")


def generate_temperature_power(model, prompt, max_new_tokens, temperature=1.0, generator=None):
    """``softmax(logits) ** T``: the samples of temperature 1 / T."""
    return _loop(model, prompt, max_new_tokens, temperature, generator, mode="power")


def generate_softmax_over_time(model, prompt, max_new_tokens, temperature=1.0, generator=None):
    """The softmax over dim=1 (time), then the last position."""
    return _loop(model, prompt, max_new_tokens, temperature, generator, mode="softmax over time")


def generate_two_draws(model, prompt, max_new_tokens, temperature=1.0, generator=None):
    """Two ``torch.multinomial`` calls per step, the first thrown away."""
    return _loop(model, prompt, max_new_tokens, temperature, generator, mode="two draws")


def generate_one_draw_for_the_batch(model, prompt, max_new_tokens, temperature=1.0, generator=None):
    """One sample (of the first sequence) copied to the whole batch."""
    return _loop(model, prompt, max_new_tokens, temperature, generator, mode="one draw")


CATALOGUE = [
    (
        "generate",
        "temperature after softmax",
        generate_temperature_after_softmax,
        "after the softmax",
    ),
    ("generate", "whole sequence re-fed", generate_refeeds_sequence, "whole sequence again"),
    ("generate", "positions restart at 0", generate_positions_restart, "restart at 0"),
    ("generate", "no cache", generate_without_cache, "the cache is never used"),
    (
        "generate",
        "positions off by one",
        generate_positions_off_by_one,
        "not the number of positions",
    ),
    ("generate", "argmax when sampling", generate_argmax_always, "you took the argmax"),
    (
        "generate",
        "last token fed",
        generate_feeds_the_last_token,
        "you fed the last new token to the model too",
    ),
    ("generate", "logits[:, 0]", generate_first_position, "first position"),
    ("generate", "stale logits", generate_stale_logits, "prompt's logits"),
    ("generate", "previous token fed", generate_feeds_previous_token, "token before the new one"),
    ("generate", "max over time", generate_max_over_time, "maximum over the time axis"),
    ("generate", "two caches", generate_two_caches, "more than one cache"),
    ("generate", "softmax(logits) ** T", generate_temperature_power, "temperature 1 / T"),
    ("generate", "softmax over time", generate_softmax_over_time, "over the time axis (dim=1)"),
    ("generate", "two draws per step", generate_two_draws, "drawn from twice"),
    ("generate", "one draw for the batch", generate_one_draw_for_the_batch, "whole batch"),
]


# Round 5 (a fresh student, set 13): tests/test_verdicts_round5.py runs it.


def generate_returns_int32(model, prompt, max_new_tokens, temperature=1.0, generator=None):
    """The right tokens, returned as an int32 tensor, not the LongTensor the task asks for."""
    return _loop(model, prompt, max_new_tokens, temperature, generator).to(torch.int32)
