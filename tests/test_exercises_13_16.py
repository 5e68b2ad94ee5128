"""Exercises 13-16's new tasks: the checkers' expected values equal the package's, each
buggy version in tests/buggy gets its named message, numbers given as numpy or torch
scalars are accepted, and the reworked quiz answers are what the statements derive."""

from __future__ import annotations

import math
import os
import sys

import numpy as np
import pytest
import torch

import attention_course as ac
from attention_course.checks import check_alibi_bias, check_generate, check_rolling_update
from attention_course.checks.alibi import expected_bias
from attention_course.checks.generation import reference_generate, step_decoder
from attention_course.checks.rolling_cache import expected_states
from attention_course.quiz import QUESTIONS, check_quiz, decode

sys.path.insert(0, os.path.dirname(__file__))
from buggy import alibi, generation, rolling_cache  # noqa: E402

CHECKS = {
    "alibi_bias": check_alibi_bias,
    "generate": check_generate,
    "rolling_update": check_rolling_update,
}
BUGGY = [*alibi.CATALOGUE, *generation.CATALOGUE, *rolling_cache.CATALOGUE]


# ---------------------------------------------------------------- the references


def test_step_decoder_gives_the_gpts_logits():
    """Fed the prompt, then one token at a time at the next position, the decoder's logits
    are those of its GPT run on the whole sequence."""
    model = step_decoder()
    ids = torch.randint(0, model.vocab_size, (2, 7), generator=torch.Generator().manual_seed(0))
    cache = model.new_cache()
    with torch.no_grad():
        parts = [model(ids[:, :4], torch.arange(4), cache)]
        for t in range(4, 7):
            parts.append(model(ids[:, t : t + 1], torch.tensor([t]), cache))
        full = model.gpt(ids)
    torch.testing.assert_close(torch.cat(parts, dim=1), full, atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize("temperature, seed", [(0.0, 0), (1.0, 1), (0.5, 2), (2.0, 3)])
def test_reference_generation_equals_the_packages_generate(temperature, seed):
    """The checker's reference loop gives the tokens of ``ac.generate`` on the same GPT
    (greedy, and seeded sampling: the same generator state gives the same tokens)."""
    model = step_decoder()
    prompt = torch.randint(0, model.vocab_size, (2, 3), generator=torch.Generator().manual_seed(9))
    ours = reference_generate(model, prompt, 10, temperature, torch.Generator().manual_seed(seed))
    package = ac.generate(
        model.gpt,
        prompt,
        10,
        temperature=temperature,
        generator=torch.Generator().manual_seed(seed),
    )
    assert torch.equal(ours, package)


def test_temperature_changes_the_checkers_samples():
    """The temperature cases can tell temperature 0.5 from temperature 1 (otherwise the
    'temperature after the softmax' mistake would pass)."""
    model = step_decoder()
    prompt = torch.zeros(2, 2, dtype=torch.long)
    a = reference_generate(model, prompt, 10, 0.5, torch.Generator().manual_seed(5))
    b = reference_generate(model, prompt, 10, 1.0, torch.Generator().manual_seed(5))
    assert not torch.equal(a, b)


def test_alibi_expected_bias_is_the_packages_causal_bias():
    slopes = ac.alibi_slopes(4).double()
    got = expected_bias(slopes, 3, 7)
    want = ac.relative_positions.alibi_causal_mask(4, 3, 7, None, torch.float64, need_weights=True)
    torch.testing.assert_close(got, want, atol=0, rtol=0)


def test_rolling_expected_states_follow_slot_p_mod_w():
    new = torch.arange(6, dtype=torch.float64).reshape(1, 1, 6, 1)
    kept, positions, buffer, slots = expected_states(4, [(0, new)])[-1]
    assert positions.tolist() == [2, 3, 4, 5]
    assert slots.tolist() == [4, 5, 2, 3]  # slot p % 4
    assert buffer.flatten().tolist() == [4.0, 5.0, 2.0, 3.0]
    assert kept.flatten().tolist() == [2.0, 3.0, 4.0, 5.0]


# ---------------------------------------------------------------- the checkers


@pytest.mark.parametrize("target", sorted(CHECKS))
def test_reference_passes(target):
    from buggy import REFERENCES

    report = CHECKS[target](REFERENCES[target])
    assert report.passed, str(report)


@pytest.mark.parametrize(
    "target, name, impl, phrase", BUGGY, ids=[f"{t}-{n}" for t, n, _, _ in BUGGY]
)
def test_each_buggy_version_gets_its_named_message(target, name, impl, phrase):
    report = CHECKS[target](impl)
    assert not report.passed, name
    first = next(r for r in report.results if not r.passed)
    assert phrase in first.message, (name, first.message)


def test_generate_without_the_cache_is_refused_even_with_the_right_tokens():
    report = check_generate(generation.generate_without_cache)
    greedy = report.results[0]
    assert not greedy.passed and "never used" in greedy.message


def test_rolling_update_that_returns_a_new_buffer_is_told_to_write_in_place():
    def fresh(buffer, slot_positions, new, start):
        buffer = buffer.clone()
        return rolling_cache.reference_rolling_update(buffer, slot_positions, new, start)

    report = check_rolling_update(fresh)
    assert not report.passed
    assert "in place" in next(r for r in report.results if not r.passed).message


def test_alibi_bias_accepts_the_dtypes_most_negative_value_for_future_keys():
    def finite(slopes, T, S=None):
        bias = alibi.reference_alibi_bias(slopes, T, S)
        return bias.masked_fill(bias == float("-inf"), torch.finfo(bias.dtype).min)

    assert check_alibi_bias(finite).passed


# ---------------------------------------------------------------- the reworked quizzes

SOLVED = {
    "13.uniform_loss": math.log(50257),
    "13.cache_positions": (149, 6225),
    "14.alibi_weight_ratios": tuple(math.exp(-8 * 2 ** (-8 * (h + 1) / 4)) for h in range(4)),
    "16.llama_swiglu": (13824, 3 * 5120 * 13824),
}


@pytest.mark.parametrize("question", sorted(SOLVED))
def test_reworked_quiz_answers(question):
    assert check_quiz(question, lambda: SOLVED[question]).passed
    stored = decode(question, QUESTIONS[question].answer)
    assert np.allclose(np.array(stored, dtype=float), np.array(SOLVED[question], dtype=float))


@pytest.mark.parametrize("question", sorted(SOLVED))
def test_reworked_quizzes_accept_numpy_and_torch_numbers(question):
    answer = SOLVED[question]
    if isinstance(answer, tuple):
        as_numpy = tuple(np.float64(a) if isinstance(a, float) else np.int64(a) for a in answer)
        as_torch = torch.tensor(
            answer, dtype=torch.float64 if isinstance(answer[0], float) else torch.long
        )
    else:
        as_numpy, as_torch = np.float64(answer), torch.tensor(answer)
    assert check_quiz(question, lambda: as_numpy).passed
    assert check_quiz(question, lambda: as_torch).passed


@pytest.mark.parametrize(
    "question, wrong, phrase",
    [
        ("13.uniform_loss", math.log(103), "character vocabulary"),
        ("13.uniform_loss", math.log2(50257), "bits"),
        ("13.cache_positions", (150, 6225), "last new token"),
        ("13.cache_positions", (149, 5000), "the prompt only"),
        ("13.cache_positions", (149, 7500), "whole final"),
        ("13.cache_positions", (6225, 149), "swapped"),
        ("13.cache_positions", (150, 11325), "not 1 + 2 + ..."),
        ("13.cache_positions", (149, 6224), "exactly 6225"),
        (
            "14.alibi_weight_ratios",
            tuple(math.exp(8 * 2 ** (-2 * (h + 1))) for h in range(4)),
            "sign",
        ),
        (
            "14.alibi_weight_ratios",
            tuple(math.exp(-8 / 2 ** (-2 * (h + 1))) for h in range(4)),
            "multiplies",
        ),
        ("16.llama_swiglu", (13653, 3 * 5120 * 13653), "multiple of 256"),
        ("16.llama_swiglu", (20480, 3 * 5120 * 20480), "two thirds"),
        ("16.llama_swiglu", (13824, 2 * 5120 * 13824), "three"),
    ],
)
def test_reworked_quizzes_name_the_misconceptions(question, wrong, phrase):
    report = check_quiz(question, lambda: wrong)
    assert not report.passed
    assert phrase in report.results[0].message, report.results[0].message


def test_the_llama_swiglu_answer_is_the_packages_recipe():
    """16.llama_swiglu: the package's sizing rule gives the width the answer holds (and
    LLaMA-7B's released 11008, the one the chapter prints, for d_model = 4096)."""
    from attention_course.ffn import swiglu_hidden_size

    assert swiglu_hidden_size(5120, multiple_of=256) == 13824
    assert swiglu_hidden_size(4096, multiple_of=256) == 11008
    swiglu = ac.SwiGLU(5120, 13824)
    assert sum(p.numel() for p in swiglu.parameters()) == 3 * 5120 * 13824


@pytest.mark.parametrize("use_cache, count", [(True, 149), (False, 6225)])
def test_the_cache_positions_answer_is_what_generate_feeds(use_cache, count):
    """13.cache_positions: the positions ``ac.generate`` feeds its GPT, prompt 100, 50 new."""
    gpt = ac.GPT(11, d_model=8, num_heads=2, num_layers=1, pos="rope", max_len=256)
    fed = []
    gpt.tok_emb.register_forward_hook(lambda module, args, out: fed.append(args[0].shape[1]))
    ac.generate(gpt, torch.zeros(1, 100, dtype=torch.long), 50, temperature=0, use_cache=use_cache)
    assert sum(fed) == count


CASES = [  # (B, T0, n, temperature, seed) of check_generate's cases
    (1, 4, 6, 0.0, 0),
    (2, 3, 9, 0.0, 0),
    (2, 3, 8, 1.0, 2),
    (2, 2, 10, 0.5, 4),
    (1, 1, 10, 2.0, 6),
]


def _tokens(model, B, T0, n, temperature, seed):
    prompt = torch.randint(
        0, model.vocab_size, (B, T0), generator=torch.Generator().manual_seed(seed)
    )
    return reference_generate(
        model, prompt, n, temperature, torch.Generator().manual_seed(seed + 1)
    )


def test_generate_cases_keep_their_tokens_when_the_logits_move_by_1e_9():
    """The expected tokens have a margin: logits perturbed by 1e-9 (far more than the
    float64 differences between two processes or thread counts) give the same tokens, so
    the verdict does not depend on the machine."""

    class Nudged(type(step_decoder())):
        def forward(self, ids, positions, cache=None):
            logits = super().forward(ids, positions, cache)
            noise = torch.randn(logits.shape, generator=self.noise, dtype=logits.dtype)
            return logits + 1e-9 * noise

    for case in CASES:
        plain = _tokens(step_decoder(), *case)
        for noise_seed in range(3):
            nudged = Nudged(step_decoder().gpt).eval()
            nudged.noise = torch.Generator().manual_seed(noise_seed)
            assert torch.equal(_tokens(nudged, *case), plain), case


@pytest.mark.parametrize("threads", [1, 2])
def test_check_generate_passes_the_reference_under_any_thread_count(threads):
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        assert check_generate(generation.reference_generate).passed
    finally:
        torch.set_num_threads(before)


def test_generate_that_divides_by_a_zero_temperature_is_told_to_take_the_argmax():
    def divides(model, prompt, max_new_tokens, temperature=1.0, generator=None):
        cache, out = model.new_cache(), prompt
        logits = model(prompt, torch.arange(prompt.shape[1]), cache)
        for _ in range(max_new_tokens):
            probs = torch.softmax(logits[:, -1] / temperature, dim=-1)
            nxt = torch.multinomial(probs, 1, generator=generator)
            out = torch.cat([out, nxt], dim=1)
            logits = model(nxt, torch.tensor([out.shape[1] - 1]), cache)
        return out

    report = check_generate(divides)
    first = next(r for r in report.results if not r.passed)
    assert "greedy decoding" in first.message, first.message


# ---------------------------------------------------------------- student s1316's findings


def test_generate_that_feeds_the_last_token_fails_the_one_token_case():
    """13.cache_positions says the last new token is never fed; the check agrees: with
    max_new_tokens = 1 only the prompt's pass is needed (the case's title)."""
    report = check_generate(generation.generate_feeds_the_last_token)
    one = next(r for r in report.results if r.name.startswith("max_new_tokens = 1"))
    assert not one.passed and "position 5, the last new token's" in one.message, one.message
    assert all(not r.passed for r in report.results[:6])


def test_generate_that_feeds_the_prompt_in_two_calls_passes():
    """Hugging Face's order (the prompt but its last token, then one token per call from
    the prompt's last) feeds T0 + N - 1 positions, as the quiz counts: accepted."""

    def split_prompt(model, prompt, max_new_tokens, temperature=1.0, generator=None):
        cache, out = model.new_cache(), prompt
        if max_new_tokens == 0:
            return prompt
        T0 = prompt.shape[1]
        if T0 > 1:
            model(prompt[:, :-1], torch.arange(T0 - 1), cache)
        cur = prompt[:, -1:]
        for _ in range(max_new_tokens):
            last = model(cur, torch.tensor([cache.length]), cache)[:, -1]
            if temperature == 0:
                cur = last.argmax(-1, keepdim=True)
            else:
                probs = torch.softmax(last / temperature, -1)
                cur = torch.multinomial(probs, 1, generator=generator)
            out = torch.cat([out, cur], 1)
        return out

    assert check_generate(split_prompt).passed


@pytest.mark.parametrize(
    "impl",
    [
        generation.generate_first_position,
        generation.generate_stale_logits,
        generation.generate_feeds_previous_token,
        generation.generate_max_over_time,
        generation.generate_two_caches,
    ],
)
def test_generate_does_not_blame_sampling_or_positions_for_greedy_slips(impl):
    """Greedy slips that never sample got "temperature 0 means greedy ... do not sample";
    two caches got "the prompt sits at positions 0 .. T0 - 1"."""
    report = check_generate(impl)
    first = next(r for r in report.results if not r.passed)
    assert "do not sample" not in first.message, first.message
    assert "the prompt sits at positions" not in first.message, first.message


def test_alibi_bias_locates_the_error_on_a_finite_cell():
    """A mismatch is located where the values differ, not on a masked cell where both are
    -inf (student s1316: "largest error inf at [0, 0, 1]", two identical rows)."""

    def one_third(slopes, T, S=None):
        return alibi.reference_alibi_bias(slopes / 3, T, S)

    report = check_alibi_bias(one_third)
    first = next(r for r in report.results if not r.passed)
    assert "largest error inf" not in first.message, first.message
    assert "[0, 0, 1]" not in first.message and "[0, 4, 0]" in first.message, first.message


def test_alibi_bias_with_minus_1e9_is_not_called_float32():
    report = check_alibi_bias(alibi.alibi_bias_minus_1e9)
    first = next(r for r in report.results if not r.passed)
    assert "float32" not in first.message and "-inf" in first.message, first.message


def test_rolling_update_with_wrong_contents_written_in_place_is_not_told_in_place():
    """Wrong slot contents that *were* written in place got "write into `buffer` in
    place"; the hint now goes only to a buffer left unchanged."""

    def other_row(buffer, slot_positions, new, start):
        out = rolling_cache.rolling_update_first_row(buffer, slot_positions, new, start)
        buffer[:, :, :, 0] += 1.0  # also disturbs the contents: no known variant matches
        return out

    report = check_rolling_update(other_row)
    first = next(r for r in report.results if not r.passed)
    assert "in place" not in first.message, first.message
    assert "new[:, :, p - start]" in first.message, first.message


def test_rolling_update_refuses_a_repeated_index_even_though_the_cpu_result_is_right():
    """buffer[:, :, pos % W] = new with Tn > W: on the CPU the last write wins and the
    state is right, but PyTorch leaves repeated indices undefined; the chunks of at most W
    positions pass."""
    report = check_rolling_update(rolling_cache.rolling_update_repeated_index)
    by_name = {r.name: r for r in report.results}
    assert not by_name["W = 4: a prompt of 6 positions, longer than the window"].passed
    assert by_name["W = 4: a prompt of 3, then 5 tokens one at a time (wraps around)"].passed


def test_rolling_update_writing_the_last_w_at_once_passes():
    """One indexed write of the chunk's last W positions repeats no slot: accepted."""

    def last_w(buffer, slot_positions, new, start):
        W, Tn = buffer.shape[2], new.shape[2]
        keep = min(W, Tn)
        pos = torch.arange(start + Tn - keep, start + Tn)
        buffer[:, :, pos % W] = new[:, :, Tn - keep :]
        slot_positions.index_copy_(0, pos % W, pos)
        filled = (slot_positions >= 0).nonzero().flatten()
        order = filled[slot_positions[filled].argsort()]
        return buffer[:, :, order], slot_positions[order]

    assert check_rolling_update(last_w).passed


def test_mistral_cache_bytes_one_position_too_many_is_not_called_float32():
    from attention_course.checks.quiz_computed import mistral_cache_bytes_reference as right

    per_token = right(1)
    report = check_quiz("15.mistral_cache_bytes", lambda t: per_token * min(t + 1, 4096))
    first = next(r for r in report.results if not r.passed)
    assert "float32" not in first.message, first.message
    assert "one position too many" in first.message, first.message


def test_uniform_loss_expects_nats_per_token():
    report = check_quiz("13.uniform_loss", lambda: "10.82")
    assert "nats per token" in report.results[0].message, report.results[0].message


def test_generate_with_argmax_without_keepdim_is_told_to_keep_the_axis():
    def no_keepdim(model, prompt, max_new_tokens, temperature=1.0, generator=None):
        cache, out = model.new_cache(), prompt
        logits = model(prompt, torch.arange(prompt.shape[1]), cache)
        for step in range(max_new_tokens):
            nxt = logits[:, -1].argmax(-1)
            out = torch.cat([out, nxt], dim=1)
            if step + 1 < max_new_tokens:
                logits = model(nxt[:, None], torch.tensor([out.shape[1] - 1]), cache)
        return out

    report = check_generate(no_keepdim)
    first = next(r for r in report.results if not r.passed)
    assert "keepdim=True" in first.message, first.message
