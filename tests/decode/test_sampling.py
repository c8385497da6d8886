"""Logit filters and decoding loops, checked against plain reference implementations.

The references are written out here on purpose, without the KV cache, `last_only`, or any helper
from attnlab.decode: a full forward over the last block_size tokens, then argmax (or multinomial).
"""

import math

import pytest
import torch

from attnlab.decode import generate_tokens, greedy, greedy_picker, sample, sampling_picker, top_k_filter, top_p_filter
from attnlab.decode.sampling import pick_rows

BLOCK = 16


def random_logits(b: int = 4, v: int = 50, scale: float = 3.0, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(b, v, generator=g) * scale


def random_prompt(b: int, t: int, vocab: int = 23, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (b, t), generator=g)


def reference_greedy(model, idx: torch.Tensor, n: int) -> torch.Tensor:
    seq = idx
    with torch.no_grad():
        for _ in range(n):
            logits = model(seq[:, -model.config.block_size :])  # (B, T, V), full forward
            seq = torch.cat([seq, logits[:, -1].argmax(dim=-1, keepdim=True)], dim=1)
    return seq


def reference_sample(model, idx: torch.Tensor, n: int, temperature: float, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    seq = idx
    with torch.no_grad():
        for _ in range(n):
            logits = model(seq[:, -model.config.block_size :])[:, -1]
            probs = torch.softmax(logits / temperature, dim=-1)
            seq = torch.cat([seq, torch.multinomial(probs, 1, generator=g)], dim=1)
    return seq


# ------------------------------------------------------------------ top-k


@pytest.mark.parametrize("k", [1, 2, 5, 17, 49, 50, 80])
def test_top_k_keeps_exactly_the_k_largest(k):
    logits = random_logits()
    original = logits.clone()
    out = top_k_filter(logits, k)
    assert torch.equal(logits, original), "the input must not be modified"
    for row, out_row in zip(logits, out, strict=True):
        expected = set(sorted(range(len(row)), key=lambda i: -row[i].item())[: min(k, len(row))])
        kept = {i for i in range(len(row)) if math.isfinite(out_row[i].item())}
        assert kept == expected
        for i in range(len(row)):
            assert out_row[i].item() == (row[i].item() if i in expected else -math.inf)


def test_top_k_with_inf_entries_keeps_the_finite_largest():
    logits = torch.tensor([[0.5, -math.inf, 2.0, 1.0, -math.inf]])
    assert top_k_filter(logits, 2).tolist() == [[-math.inf, -math.inf, 2.0, 1.0, -math.inf]]


# ------------------------------------------------------------------ top-p


def reference_top_p(row: torch.Tensor, p: float) -> set[int]:
    """Walk the tokens from most to least likely and stop as soon as their mass reaches p."""
    probs = torch.softmax(row.double(), dim=-1).tolist()
    order = sorted(range(len(probs)), key=lambda i: -probs[i])
    kept, mass = set(), 0.0
    for i in order:
        kept.add(i)
        mass += probs[i]
        if mass >= p:
            break
    return kept


@pytest.mark.parametrize("p", [1e-6, 0.05, 0.3, 0.5, 0.8, 0.9, 0.97])
@pytest.mark.parametrize("scale", [0.5, 3.0])
def test_top_p_keeps_the_smallest_prefix_reaching_p(p, scale):
    logits = random_logits(b=6, scale=scale, seed=int(p * 1000) + int(scale))
    original = logits.clone()
    out = top_p_filter(logits, p)
    assert torch.equal(logits, original), "the input must not be modified"
    for row, out_row in zip(logits, out, strict=True):
        kept = {i for i in range(len(row)) if math.isfinite(out_row[i].item())}
        assert kept == reference_top_p(row, p)
        assert int(row.argmax()) in kept
        assert all(out_row[i].item() == row[i].item() for i in kept)


def test_top_p_always_keeps_the_argmax():
    logits = torch.tensor([[0.0, 0.1, 0.2, 5.0, 0.3], [9.0, 9.5, 1.0, 1.0, 1.0]])
    out = top_p_filter(logits, 1e-9)
    assert [[math.isfinite(x) for x in row] for row in out.tolist()] == [
        [False, False, False, True, False],
        [False, True, False, False, False],
    ]


def test_top_p_of_one_keeps_everything():
    # With p = 1 the nucleus is the whole vocabulary, even when float32 rounding makes the running
    # sum of a peaked distribution reach 1 before the tail.
    for scale in (1.0, 10.0, 30.0):
        logits = random_logits(b=3, v=200, scale=scale, seed=5)
        assert torch.isfinite(top_p_filter(logits, 1.0)).all(), scale


# ------------------------------------------------------------------ greedy: cache, window, reference


@pytest.mark.parametrize("t,n", [(5, 8), (5, 11), (5, 40), (16, 10), (20, 12), (1, 35)])
def test_greedy_cached_equals_uncached_equals_reference(gpt, t, n):
    idx = random_prompt(3, t)
    expected = reference_greedy(gpt, idx, n)
    cached = greedy(gpt, idx, n)
    uncached = greedy(gpt, idx, n, use_cache=False)
    assert cached.shape == (3, t + n)
    assert torch.equal(cached[:, :t], idx)
    assert torch.equal(uncached, expected)
    assert torch.equal(cached, expected)


def test_greedy_is_not_trivially_constant(gpt):
    # Guards the comparisons above: every row must wander over the vocabulary, before and after
    # the window starts to slide, rather than repeat one id.
    for row in greedy(gpt, random_prompt(3, 5), 40)[:, 5:].tolist():
        assert len(set(row[:11])) >= 4 and len(set(row[11:])) >= 4, row


def test_greedy_depends_on_positions(gpt):
    # The same tokens at other positions give another continuation: a window that slid with
    # wrong positions (stale cache entries) would be caught by the reference comparisons.
    idx = random_prompt(1, 8)
    assert not torch.equal(greedy(gpt, idx, 8)[:, 8:], greedy(gpt, idx[:, 4:], 8)[:, 4:])


def test_greedy_rows_are_independent(gpt):
    idx = random_prompt(3, 5)
    batched = greedy(gpt, idx, 30)
    for i in range(3):
        assert torch.equal(greedy(gpt, idx[i : i + 1], 30), batched[i : i + 1])


def test_generate_tokens_yields_one_batch_of_ids_per_step(gpt):
    idx = random_prompt(2, 4)
    steps = list(generate_tokens(gpt, idx, 7, greedy_picker()))
    assert len(steps) == 7
    assert all(s.shape == (2,) and s.dtype == torch.long for s in steps)
    assert torch.equal(torch.stack(steps, dim=1), reference_greedy(gpt, idx, 7)[:, 4:])


def test_compiled_decoding_gives_the_same_tokens(gpt):
    # torch.compile of the one-token step: the same greedy tokens, batched and per row, past the
    # point where the window slides (the compiled step only runs while the cache has room).
    idx = random_prompt(3, 5)
    expected = greedy(gpt, idx, 20)
    compiled = greedy(gpt, idx, 20, compile=True)
    assert torch.equal(compiled, expected)
    assert torch.equal(greedy(gpt, idx[1:2], 20, compile=True), expected[1:2])


class BrokenCompiled:
    def __init__(self, model, **_):
        pass

    def __call__(self, *args, **kwargs):
        raise RuntimeError("inductor: no working C++ compiler")


def test_a_failing_compile_warns_and_decodes_eagerly(gpt, monkeypatch):
    idx = random_prompt(2, 5)
    expected = greedy(gpt, idx, 12)
    monkeypatch.setattr(torch, "compile", BrokenCompiled)
    with pytest.warns(UserWarning, match="compiled decoding failed .RuntimeError.; decoding eagerly"):
        got = greedy(gpt, idx, 12, compile=True)
    assert torch.equal(got, expected)


def test_no_torch_compile_at_all_warns_and_decodes_eagerly(gpt, monkeypatch):
    def unavailable(model, **_):
        raise RuntimeError("Python 3.14+ is not supported by torch.compile")

    idx = random_prompt(2, 5)
    expected = greedy(gpt, idx, 12)
    monkeypatch.setattr(torch, "compile", unavailable)
    with pytest.warns(UserWarning, match="compiled decoding failed .RuntimeError.; decoding eagerly"):
        got = greedy(gpt, idx, 12, compile=True)
    assert torch.equal(got, expected)


def test_the_compiled_decoding_step_has_one_shape_whatever_the_position(gpt, monkeypatch):
    # What makes the step compile once: every call after the prefill sees the same shapes. The
    # "compiler" here is the identity, so the spy sees every call.
    monkeypatch.setattr(torch, "compile", lambda model, **_: model)
    shapes = set()
    original = type(gpt).forward

    def spy(self, idx, *args, cache=None, positions=None, **kwargs):
        if idx.size(1) == 1:
            shapes.add((tuple(idx.shape), tuple(positions.shape), tuple(cache[0].k.shape)))
        return original(self, idx, *args, cache=cache, positions=positions, **kwargs)

    monkeypatch.setattr(type(gpt), "forward", spy)
    idx = random_prompt(2, 3)
    assert torch.equal(greedy(gpt, idx, 10, compile=True), reference_greedy(gpt, idx, 10))
    assert shapes == {((2, 1), (1,), (2, 2, BLOCK, 16))}


def test_eager_decoding_steps_attend_to_the_filled_slots_alone(gpt, monkeypatch):
    lengths = []
    original = type(gpt).forward

    def spy(self, idx, *args, cache=None, positions=None, **kwargs):
        if cache is not None:  # not the reference's full forwards
            assert positions is None  # the growing path, at the model's count, cache.length
            lengths.append(cache.length)
        return original(self, idx, *args, cache=cache, positions=positions, **kwargs)

    monkeypatch.setattr(type(gpt), "forward", spy)
    idx = random_prompt(2, 3)
    assert torch.equal(greedy(gpt, idx, 6), reference_greedy(gpt, idx, 6))
    assert lengths == [0, 3, 4, 5, 6, 7]  # the prefill, then one slot more per step


# ------------------------------------------------------------------ sampling


def test_sample_matches_reference_multinomial(gpt):
    idx = random_prompt(3, 5)
    for use_cache in (False, True):
        out = sample(gpt, idx, 30, temperature=0.8, generator=torch.Generator().manual_seed(7), use_cache=use_cache)
        assert torch.equal(out, reference_sample(gpt, idx, 30, temperature=0.8, seed=7)), use_cache


def test_sample_is_reproducible_for_a_seeded_generator(gpt):
    idx = random_prompt(3, 5)

    def run(seed: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(seed)
        return sample(gpt, idx, 40, temperature=1.0, top_k=10, top_p=0.95, generator=g)

    assert torch.equal(run(3), run(3))
    assert not torch.equal(run(3), run(4))


def test_sample_with_top_k_one_is_greedy(gpt):
    idx = random_prompt(3, 5)
    out = sample(gpt, idx, 40, temperature=1.5, top_k=1, generator=torch.Generator().manual_seed(0))
    assert torch.equal(out, reference_greedy(gpt, idx, 40))


def test_sample_with_tiny_top_p_is_greedy(gpt):
    idx = random_prompt(3, 5)
    out = sample(gpt, idx, 40, temperature=1.0, top_p=1e-6, generator=torch.Generator().manual_seed(0))
    assert torch.equal(out, reference_greedy(gpt, idx, 40))


def test_temperature_zero_is_greedy(gpt):
    idx = random_prompt(3, 5)
    out = sample(gpt, idx, 40, temperature=0.0, generator=torch.Generator().manual_seed(0))
    assert torch.equal(out, reference_greedy(gpt, idx, 40))


def test_sampling_stays_inside_top_k():
    # A picker on fixed logits: every draw must be one of the k largest.
    logits = random_logits(b=2, v=30, scale=0.1, seed=3).repeat(200, 1)
    allowed = [set(row.topk(4).indices.tolist()) for row in logits[:2]]
    picks = sampling_picker(top_k=4, generator=torch.Generator().manual_seed(0))(logits)
    for i, token in enumerate(picks.tolist()):
        assert token in allowed[i % 2]
    assert {t for i, t in enumerate(picks.tolist()) if i % 2 == 0} == allowed[0]  # and all of them occur


@pytest.mark.parametrize(
    "kwargs", [{"temperature": -0.1}, {"top_k": 0}, {"top_p": 0.0}, {"top_p": 1.5}], ids=["temp", "k", "p0", "p>1"]
)
def test_sampling_picker_rejects_bad_settings(kwargs):
    with pytest.raises(ValueError):
        sampling_picker(**kwargs)


# ------------------------------------------------------------------ end of text


def test_eos_stops_and_pads(gpt):
    idx = random_prompt(3, 5)
    n = 40
    free = greedy(gpt, idx, n)[:, 5:].tolist()  # the continuations without any eos
    eos = free[0][6]  # the token row 0 produces at step 6: row 0 is certain to stop there
    first = [row.index(eos) if eos in row else None for row in free]
    out = greedy(gpt, idx, n, eos_id=eos)
    new = out[:, 5:].tolist()
    # Iteration ends once every row has produced eos, or after n steps.
    expected_len = n if None in first else max(first) + 1
    assert len(new[0]) == expected_len
    for row, row_free, f in zip(new, free, first, strict=True):
        if f is None:
            assert row == row_free[:expected_len]
        else:  # the row is its own continuation up to its first eos, then eos padding
            assert row == row_free[: f + 1] + [eos] * (expected_len - f - 1)
    assert torch.equal(out[:, :5], idx)


def test_eos_ends_iteration_when_every_row_is_done(gpt):
    idx = random_prompt(1, 5)
    free = greedy(gpt, idx, 30)[0, 5:].tolist()
    eos = free[9]
    stop = free.index(eos)
    steps = list(generate_tokens(gpt, idx, 30, greedy_picker(), eos_id=eos))
    assert len(steps) == stop + 1 < 30
    assert [int(s) for s in steps] == free[: stop + 1]


def test_eos_from_a_model_that_prefers_it(make_gpt):
    # Every row ends at once when eos dominates the logits: make the output layer favour it.
    model = make_gpt(tie_weights=False)
    with torch.no_grad():
        model.final_norm.weight.zero_()  # the final LayerNorm outputs its bias, all ones
        model.final_norm.bias.fill_(1.0)
        model.lm_head.weight.zero_()
        model.lm_head.weight[4] = 1.0  # logit 32 for token 4, 0 for every other
    idx = random_prompt(3, 5)
    steps = list(generate_tokens(model, idx, 20, greedy_picker(), eos_id=4))
    assert len(steps) == 1 and steps[0].tolist() == [4, 4, 4]


# ------------------------------------------------------------------ edges and side effects


def test_zero_new_tokens_returns_the_prompt(gpt):
    idx = random_prompt(2, 5)
    assert torch.equal(greedy(gpt, idx, 0), idx)
    assert torch.equal(sample(gpt, idx, 0, generator=torch.Generator().manual_seed(0)), idx)
    assert list(generate_tokens(gpt, idx, 0, greedy_picker())) == []


def test_negative_new_tokens_is_a_value_error(gpt):
    with pytest.raises(ValueError, match="max_new_tokens"):
        greedy(gpt, random_prompt(1, 3), -1)
    with pytest.raises(ValueError, match="max_new_tokens"):
        list(generate_tokens(gpt, random_prompt(1, 3), -5, greedy_picker()))


def test_empty_prompt_is_a_value_error(gpt):
    with pytest.raises(ValueError, match="prompt"):
        greedy(gpt, torch.zeros(2, 0, dtype=torch.long), 3)


def test_training_mode_is_restored(make_gpt):
    model = make_gpt(dropout=0.5)
    idx = random_prompt(2, 5)
    model.eval()
    expected = greedy(model, idx, 25)
    assert not model.training
    model.train()
    # Generation runs in eval mode (no dropout), then gives the mode back.
    assert torch.equal(greedy(model, idx, 25), expected)
    assert model.training and all(m.training for m in model.modules())
    assert torch.equal(sample(model, idx, 25, temperature=0.0), expected)
    assert model.training


def test_a_suspended_generator_leaks_no_mode_to_the_caller(make_gpt):
    # The caller's code runs between steps (streaming): it must see its own grad and train modes.
    model = make_gpt(dropout=0.1).train()
    idx = random_prompt(1, 5)
    gen = generate_tokens(model, idx, 10, greedy_picker())
    next(gen)
    assert torch.is_grad_enabled() and not torch.is_inference_mode_enabled()
    assert model.training
    x = torch.ones(2, requires_grad=True)
    assert (x * 2).sum().requires_grad
    # Two generators closed out of order leave the global modes as they were.
    other = generate_tokens(model, idx, 10, greedy_picker())
    next(other)
    gen.close()
    other.close()
    assert torch.is_grad_enabled() and not torch.is_inference_mode_enabled()
    assert model.training


def test_generation_builds_no_autograd_graph(gpt):
    tokens = list(generate_tokens(gpt, random_prompt(1, 5), 5, greedy_picker()))
    assert not any(t.requires_grad for t in tokens)


# ------------------------------------------------------------------ many rows' pickers at once


def test_pick_rows_draws_what_each_rows_picker_draws_alone():
    """Plain samplers (drawn together), filtered ones and greedy rows, each with its own settings
    and generator: the same tokens as calling each picker on its row, step after step (so every
    generator is also left where its own picker leaves it)."""
    settings = [(0.8, None, None), (1.0, None, None), (1.7, None, None), (0.05, None, None), (1.0, 5, None),
                (0.9, None, 0.8), (0.0, None, None), (0.3, None, None)]  # fmt: skip

    def pickers():  # and a None: greedy, as a continuous batch marks its greedy rows
        made = [sampling_picker(t, k, p, torch.Generator().manual_seed(10 + i)) for i, (t, k, p) in enumerate(settings)]
        return [*made[:3], None, *made[3:]]

    alone, together = pickers(), pickers()
    for step in range(20):
        logits = random_logits(b=len(alone), v=[65, 7, 1000][step % 3], scale=1 + step % 4, seed=step)
        expected = [int((pick or greedy_picker())(logits[i : i + 1])[0]) for i, pick in enumerate(alone)]
        assert pick_rows(together, logits) == expected, step
    assert len({tuple(pick_rows(together, logits)) for _ in range(10)}) > 1  # the draws do move on


def test_pick_rows_of_unseeded_samplers_draws_from_the_default_generator_as_they_would():
    logits = random_logits(b=6, v=40, scale=2.0, seed=1)
    samplers = [sampling_picker(0.7) for _ in range(6)]
    torch.manual_seed(123)
    expected = [int(s(logits[i : i + 1])[0]) for i, s in enumerate(samplers)]
    torch.manual_seed(123)
    assert pick_rows(samplers, logits) == expected
