"""attnlab.accel.fused: the C++ decoding step against the model's own forward.

The reference is the eager decoding loop (itself tested against recomputing every window): the
fused step must give the same greedy tokens, and logits equal to float rounding, for every
configuration it accepts; for the others the loop falls back to the model with a warning.
The extension is built once per machine (about a minute; cached by torch.utils.cpp_extension).
"""

import pytest
import torch

from attnlab.accel import fused
from attnlab.accel.fused import FusedStep, extension, supports
from attnlab.accel.projection import MKLDNN, has_reordered_weight
from attnlab.decode import greedy, sample
from tolerance import assert_float32_close, gpt_sums

pytestmark = pytest.mark.skipif(extension() is None, reason="the fused step could not be built here")


@pytest.mark.parametrize(
    "overrides, batch",
    [
        (dict(activation="gelu_tanh"), 1),
        (dict(activation="gelu", bias=False, positions="sinusoidal"), 3),
        (dict(activation="relu", positions="none", tie_weights=True), 5),
        (dict(d_model=40, n_heads=4), 9),  # a width that is not a multiple of 16; more than 8 rows
    ],
)
def test_fused_greedy_tokens_equal_the_eager_ones(make_gpt, overrides, batch):
    model = make_gpt(**overrides)
    prompt = torch.randint(0, 23, (batch, 4), generator=torch.Generator().manual_seed(batch))
    eager = greedy(model, prompt, 11)  # 4 + 11 tokens in a block of 16: the cache never slides
    assert torch.equal(greedy(model, prompt, 11, fused=True), eager)
    # and past the block, where the loop slides the window with the model itself
    assert torch.equal(greedy(model, prompt, 30, fused=True), greedy(model, prompt, 30))


@pytest.mark.parametrize("activation", ["gelu", "gelu_tanh", "relu"])
def test_fused_step_logits_and_cache_equal_the_model_step(make_gpt, activation):
    model = make_gpt(d_model=48, n_heads=3, activation=activation)
    prompt = torch.randint(0, 23, (2, 5), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        ours, theirs = model.new_cache(2, 16), model.new_cache(2, 16)
        model(prompt, cache=ours, last_only=True)
        model(prompt, cache=theirs, last_only=True)
        step = FusedStep(model, extension(), ours)
        token = torch.tensor([[3], [7]])
        for position in range(5, 16):
            expected = model(token, cache=theirs, last_only=True)
            got = step(token, ours, position)
            assert_float32_close(got, expected, **gpt_sums(model.config))
            assert ours.length == theirs.length == position + 1
            token = expected[:, -1].argmax(-1, keepdim=True)
        for a, b in zip(ours, theirs, strict=True):
            assert_float32_close(a.k, b.k, **gpt_sums(model.config))
            assert_float32_close(a.v, b.v, **gpt_sums(model.config))


@pytest.mark.parametrize("lengths", [[5, 2, 9], [5, 2, 9, 1, 7, 3, 8, 4, 6, 2, 10, 5]])  # 12 rows: oneDNN's products
def test_rows_at_their_own_positions_equal_the_model_step_with_row_positions(make_gpt, lengths, monkeypatch):
    """Sequences of different lengths in one cache, as continuous batching holds them: the rows
    step writes each row's key and value at its own slot and attends to that row's slots alone
    (slots past a row's position hold another sequence's leftovers, which must not count)."""
    monkeypatch.setattr(fused, "REORDERED_MIN_WEIGHT", 5000)  # q/k/v (6,912) reordered, the output (2,304) not
    model = make_gpt(d_model=48, n_heads=3)
    rows = len(lengths) + 1
    with torch.inference_mode():
        ours, theirs = model.new_cache(rows, 16), model.new_cache(rows, 16)
        for cache in (ours, theirs):
            for layer in cache:  # leftovers of an earlier sequence in every slot
                layer.k.normal_(generator=torch.Generator().manual_seed(1))
                layer.v.normal_(generator=torch.Generator().manual_seed(2))
            for row, n in enumerate(lengths):
                prompt = torch.randint(0, 23, (1, n), generator=torch.Generator().manual_seed(row))
                model(prompt, cache=cache.view_rows(slice(row, row + 1)), last_only=True)
        step = FusedStep(model, extension(), ours)
        tokens, positions = torch.arange(3, 3 + len(lengths)) % 23, torch.tensor(lengths)
        for _ in range(4):
            length = int(positions.max()) + 1
            views = theirs.view_rows(slice(0, len(lengths)), length)
            expected = model(tokens[:, None], cache=views, positions=positions[:, None], last_only=True)[:, -1]
            got = step.rows(tokens, positions)
            assert_float32_close(got, expected, **gpt_sums(model.config))
            for a, b in zip(ours, theirs, strict=True):
                for row, pos in enumerate(positions.tolist()):
                    assert_float32_close(a.k[row, :, pos], b.k[row, :, pos], **gpt_sums(model.config))
            tokens, positions = expected.argmax(-1), positions + 1
        block = model.blocks[0]
        assert has_reordered_weight(block.attn.in_proj.weight) == (MKLDNN and len(lengths) > 8)
        assert not has_reordered_weight(block.attn.out_proj.weight)
        with pytest.raises(RuntimeError, match="outside the cache"):
            step.rows(tokens, torch.tensor([*lengths[:-1], 16]))
        with pytest.raises(RuntimeError, match=f"R <= {rows}"):
            step.rows(torch.zeros(rows + 1, dtype=torch.long), torch.zeros(rows + 1, dtype=torch.long))


def test_the_float32_bound_still_catches_an_off_by_one_position_and_a_dropped_key(make_gpt):
    """The tolerance above is rounding's, not a mistake's: the fused step one position off (its key
    written one slot late, its position embedding the next one's), or a step whose first key was
    never written, each fall outside it."""
    model = make_gpt(d_model=48, n_heads=3)
    prompt = torch.randint(0, 23, (2, 6), generator=torch.Generator().manual_seed(0))
    token = torch.tensor([[3], [7]])
    with torch.inference_mode():
        ours, theirs = model.new_cache(2, 16), model.new_cache(2, 16)
        model(prompt, cache=ours, last_only=True)
        model(prompt, cache=theirs, last_only=True)
        expected = model(token, cache=theirs, last_only=True)
        assert_float32_close(FusedStep(model, extension(), ours)(token, ours, 6), expected, **gpt_sums(model.config))
        ours.length = 6
        off_by_one = FusedStep(model, extension(), ours)(token, ours, 7)
        sequence = torch.cat([prompt, token], dim=1)
        empty_first = model.new_cache(2, 16)  # the first key's slot left empty (zeros)
        without_first_key = model(sequence[:, 1:], cache=empty_first, positions=torch.arange(1, 7), last_only=True)
    for wrong in (off_by_one, without_first_key):
        with pytest.raises(AssertionError, match="float32 bound"):
            assert_float32_close(wrong, expected, **gpt_sums(model.config))


def test_fused_step_sees_weights_changed_after_it_was_made(make_gpt):
    model = make_gpt()
    cache = model.new_cache(1, 16)
    with torch.inference_mode():
        model(torch.tensor([[1, 2]]), cache=cache, last_only=True)
    step = FusedStep(model, extension(), cache)
    with torch.no_grad():
        model.lm_head.weight.mul_(-1.0)  # in place: the step holds the same storage
    with torch.inference_mode():
        got = step(torch.tensor([[4]]), cache, 2)
        cache.length = 2
        expected = model(torch.tensor([[4]]), cache=cache, last_only=True)
    assert_float32_close(got, expected, **gpt_sums(model.config))


def test_many_rows_see_weights_changed_after_the_step_was_made(make_gpt, monkeypatch):
    """Past 8 rows the products use oneDNN copies of the weights, remade when a weight changes."""
    monkeypatch.setattr(fused, "REORDERED_MIN_WEIGHT", 1)
    model = make_gpt()
    prompt = torch.randint(0, 23, (12, 3), generator=torch.Generator().manual_seed(4))
    with torch.inference_mode():
        cache = model.new_cache(12, 16)
        model(prompt, cache=cache, last_only=True)
        step = FusedStep(model, extension(), cache)
        token = torch.arange(12)[:, None]
        step(token, cache, 3)
    with torch.no_grad():  # in place: a new version of each weight
        model.blocks[0].ffn.fc1.weight.mul_(-1.0)
        model.lm_head.weight.mul_(-1.0)
    with torch.inference_mode():
        got = step(token, cache, 4)
        cache.length = 4
        expected = model(token, cache=cache, last_only=True)
    assert_float32_close(got, expected, **gpt_sums(model.config))


def test_sampling_with_the_fused_step_follows_the_generator(make_gpt):
    model = make_gpt()
    prompt = torch.tensor([[1, 2, 3]])

    def draw(fused: bool) -> torch.Tensor:
        return sample(model, prompt, 10, temperature=1.0, generator=torch.Generator().manual_seed(5), fused=fused)

    assert torch.equal(draw(True), draw(False))


def test_models_it_does_not_cover_decode_eagerly_with_a_warning(make_gpt):
    post_norm = make_gpt(norm="post")
    assert not supports(post_norm, post_norm.new_cache(1, 16))
    prompt = torch.tensor([[1, 2, 3]])
    with pytest.warns(UserWarning, match="fused decoding step covers pre-norm GPTs"):
        got = greedy(post_norm, prompt, 8, fused=True)
    assert torch.equal(got, greedy(post_norm, prompt, 8))
    assert not supports(make_gpt().double(), make_gpt().double().new_cache(1, 16))


def test_under_cpu_autocast_the_gpt_decodes_eagerly_in_the_precision_asked(make_gpt):
    """The C++ step computes in fp32; under bf16 autocast the model's own forward does the step."""
    model = make_gpt()
    assert supports(model, model.new_cache(1, 16))
    prompt = torch.tensor([[1, 2, 3]])
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not supports(model, model.new_cache(1, 16))
        with pytest.warns(UserWarning, match="decoding eagerly"):
            got = greedy(model, prompt, 8, fused=True)
        assert torch.equal(got, greedy(model, prompt, 8))


def test_compile_and_fused_together_are_refused(make_gpt):
    with pytest.raises(ValueError, match="pick one"):
        greedy(make_gpt(), torch.tensor([[1, 2]]), 3, compile=True, fused=True)


def test_a_step_bound_to_one_cache_refuses_another(make_gpt):
    model = make_gpt()
    cache = model.new_cache(1, 16)
    step = FusedStep(model, extension(), cache)
    with pytest.raises(ValueError, match="bound to another cache"):
        step(torch.tensor([[1]]), model.new_cache(1, 16), 0)


def test_bad_token_id_is_an_error_not_a_read_past_the_table(make_gpt):
    model = make_gpt()
    cache = model.new_cache(1, 16)
    step = FusedStep(model, extension(), cache)
    with pytest.raises(RuntimeError, match="outside the vocabulary"):
        step(torch.tensor([[23]]), cache, 0)
    with pytest.raises(RuntimeError, match="outside the cache"):
        step(torch.tensor([[1]]), cache, 16)
