"""generate (chapter 13): greedy, sampling, the KV cache, validation."""

from __future__ import annotations

import pytest
import torch

from attention_course import GPT, generate

V = 13


@pytest.fixture
def model():
    return GPT(V, d_model=16, num_heads=2, num_layers=2, max_len=32).double()


def test_greedy_is_the_argmax_of_the_full_pass(model):
    prompt = torch.randint(0, V, (3, 4))
    out = generate(model, prompt, 6, temperature=0)
    assert out.shape == (3, 10)
    assert torch.equal(out[:, :4], prompt)
    for t in range(4, 10):
        assert torch.equal(out[:, t], model(out[:, :t])[:, -1].argmax(-1))


@pytest.mark.parametrize(
    "settings",
    [
        {"temperature": 0},
        {"temperature": 1.0},
        {"temperature": 0.7, "top_k": 4},
        {"temperature": 1.3, "top_p": 0.8},
        {"temperature": 1.0, "top_k": 5, "top_p": 0.9},
    ],
)
def test_same_tokens_with_and_without_the_cache(model, settings):
    prompt = torch.randint(0, V, (4, 3))
    runs = []
    for use_cache in (True, False):
        gen = torch.Generator().manual_seed(123)
        runs.append(generate(model, prompt, 20, use_cache=use_cache, generator=gen, **settings))
    assert torch.equal(runs[0], runs[1])


def test_a_seeded_generator_reproduces_samples_and_seeds_differ(model):
    prompt = torch.zeros(2, 1, dtype=torch.long)

    def sample(seed):
        return generate(model, prompt, 25, generator=torch.Generator().manual_seed(seed))

    assert torch.equal(sample(0), sample(0))
    assert not torch.equal(sample(0), sample(1))


def test_top_k_one_is_greedy(model):
    prompt = torch.randint(0, V, (2, 3))
    assert torch.equal(generate(model, prompt, 8, top_k=1), generate(model, prompt, 8, 0))


def test_restores_training_flag_and_runs_without_grad(model):
    model.train()
    out = generate(model, torch.zeros(1, 2, dtype=torch.long), 3)
    assert model.training
    assert not out.requires_grad
    model.eval()
    generate(model, torch.zeros(1, 2, dtype=torch.long), 3)
    assert not model.training


def test_context_limits_of_absolute_positions(model):
    prompt = torch.randint(0, V, (1, 30))
    assert generate(model, prompt, 3, use_cache=True).shape == (1, 33)  # 32 positions read
    with pytest.raises(ValueError, match="max_new_tokens"):
        generate(model, prompt, 4, use_cache=True)
    out = generate(model, prompt, 10, temperature=0, use_cache=False)  # a sliding window
    assert out.shape == (1, 40)
    assert torch.equal(out[:, -1], model(out[:, -33:-1])[:, -1].argmax(-1))
    free = GPT(V, d_model=16, num_heads=2, num_layers=1, max_len=4, pos="none")
    assert generate(free, prompt, 10, use_cache=True).shape == (1, 40)


def test_zero_new_tokens_returns_the_prompt(model):
    prompt = torch.randint(0, V, (2, 5))
    assert torch.equal(generate(model, prompt, 0), prompt)


def test_bad_arguments_raise_value_errors_naming_them(model):
    prompt = torch.zeros(1, 2, dtype=torch.long)
    for kwargs, name in (
        ({"temperature": -0.1}, "temperature"),
        ({"top_k": 0}, "top_k"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5, "temperature": 0}, "top_p"),
        ({"generator": 3}, "generator"),
    ):
        with pytest.raises(ValueError, match=name):
            generate(model, prompt, 2, **kwargs)
    with pytest.raises(ValueError, match="max_new_tokens"):
        generate(model, prompt, -1)
    with pytest.raises(ValueError, match="prompt"):
        generate(model, torch.zeros(2, dtype=torch.long), 2)
    with pytest.raises(ValueError, match="ids"):
        generate(model, torch.full((1, 2), V), 2)
