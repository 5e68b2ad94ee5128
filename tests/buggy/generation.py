"""Buggy generation loops with a cache (exercise 13, ``generate(model, prompt,
max_new_tokens, temperature=1.0, generator=None)`` on a ``StepDecoder``)."""

import torch


def _pick(last, temperature, generator, after=False, argmax=False):
    if temperature == 0 or argmax:
        return last.argmax(-1, keepdim=True)
    if after:
        probs = torch.softmax(last, dim=-1) / temperature
    else:
        probs = torch.softmax(last / temperature, dim=-1)
    return torch.multinomial(probs, 1, generator=generator)


def _loop(model, prompt, n, temperature, generator, *, mode=None):
    out = prompt
    if n == 0:
        return out
    cache = model.new_cache()
    logits = model(prompt, torch.arange(prompt.shape[1]), cache)
    for step in range(n):
        nxt = _pick(
            logits[:, -1], temperature, generator, after=mode == "after", argmax=mode == "argmax"
        )
        out = torch.cat([out, nxt], dim=1)
        if step + 1 == n:
            break
        t = out.shape[1] - 1
        if mode == "refeed":
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
]
