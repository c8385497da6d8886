"""attnlab.accel.fused: several new tokens of one sequence in one call (`FusedStep.extend`), against
the same tokens stepped one at a time and against the model's own forward over the whole sequence
without a cache; and the cache set back (`FusedStep.truncate`) after tokens it rejects, as
speculative decoding's verification does. Runs under `make test-avx2` too (the Makefile's NUMERICAL).
"""

import pytest
import torch

from accel.test_fused_int8 import ARCHITECTURES, STORED, reference_model
from attnlab.accel import fused
from attnlab.accel.fused import FusedStep, extension
from attnlab.accel.projection import MKLDNN, has_reordered_weight
from decode.conftest import tiny_gpt
from tolerance import assert_float32_close, gpt_sums

pytestmark = pytest.mark.skipif(extension() is None, reason="the fused step could not be built here")

PROMPT = 6


def _sequence(seed: int, new: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A prompt `(1, PROMPT)` and `new` tokens to follow it `(1, new)`."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 23, (1, PROMPT), generator=g), torch.randint(0, 23, (1, new), generator=g)


def _prompted(model, prompt: torch.Tensor) -> list:
    """A cache of one row and block_size slots holding the prompt, written by the model's forward."""
    cache = model.new_cache(1)
    model(prompt, cache=cache, last_only=True)
    return cache


def _assert_same_slots(ours: list, theirs: list, slots: int, bound: dict) -> None:
    for a, b in zip(ours, theirs, strict=True):
        assert_float32_close(a.k[:, :, :slots], b.k[:, :, :slots], **bound)
        assert_float32_close(a.v[:, :, :slots], b.v[:, :, :slots], **bound)


@pytest.mark.parametrize("T", range(1, 10))
@pytest.mark.parametrize("name", ARCHITECTURES)
def test_t_tokens_in_one_call_equal_t_steps_and_the_models_forward(name, T):
    """Logits after each of T tokens read onto a cache at positions 6 .. 5 + T: those of T one-token
    fused steps, and those of the model's forward over prompt and tokens read whole (no cache);
    the keys and values written are the model's (its forward over the same cache)."""
    model = tiny_gpt(block_size=32, **ARCHITECTURES[name])
    prompt, new = _sequence(T, T)
    bound = gpt_sums(model.config)
    with torch.inference_mode():
        together, stepped, theirs = (_prompted(model, prompt) for _ in range(3))
        got = FusedStep(model, extension(), together).extend(new[0], PROMPT)
        step = FusedStep(model, extension(), stepped)
        one_by_one = torch.cat([step(new[:, t : t + 1], stepped, PROMPT + t)[0] for t in range(T)])
        whole = model(torch.cat([prompt, new], dim=1))[0, PROMPT:]
        model(new, cache=theirs)
    assert got.shape == (T, model.config.vocab_size)
    assert_float32_close(got, one_by_one, **bound)
    assert_float32_close(got, whole, **bound)
    assert together.length == theirs.length == PROMPT + T
    _assert_same_slots(together, theirs, PROMPT + T, bound)


@pytest.mark.parametrize("kept", [0, 2, 5])
@pytest.mark.parametrize("name", ["gpt2", "llama", "mixtral"])
def test_after_a_rewind_the_next_tokens_see_only_the_kept_ones(name, kept):
    """Six drafts read in one call, all but `kept` taken back, then three other tokens read in one
    call and one more stepped: their logits are the model's over prompt, kept drafts and new tokens
    (the rejected drafts' keys, still in the buffers, are overwritten or never read)."""
    model = tiny_gpt(block_size=32, **ARCHITECTURES[name])
    prompt, drafts = _sequence(kept, 6)
    new = torch.randint(0, 23, (1, 4), generator=torch.Generator().manual_seed(100 + kept))
    bound = gpt_sums(model.config)
    with torch.inference_mode():
        ours = _prompted(model, prompt)
        step = FusedStep(model, extension(), ours)
        step.extend(drafts[0], PROMPT)
        step.truncate(PROMPT + kept)
        assert ours.length == PROMPT + kept
        got = step.extend(new[0, :3], PROMPT + kept)
        last = step(new[:, 3:], ours, PROMPT + kept + 3)[0]
        sequence = torch.cat([prompt, drafts[:, :kept], new], dim=1)
        whole = model(sequence)[0, PROMPT + kept :]
        theirs = _prompted(model, sequence[:, :PROMPT])
        model(sequence[:, PROMPT:], cache=theirs)
    assert_float32_close(got, whole[:3], **bound)
    assert_float32_close(last, whole[3:], **bound)
    _assert_same_slots(ours, theirs, sequence.size(1), bound)
    with pytest.raises(ValueError, match="truncate"):
        step.truncate(sequence.size(1) + 1)  # only back: a slot never written cannot be kept


def test_the_bound_catches_a_rejected_draft_left_in_the_cache():
    """Without the rewind the new tokens would attend to the rejected drafts' keys: the comparison
    above then fails by far more than rounding (what makes `truncate` testable)."""
    model = tiny_gpt(block_size=32)
    prompt, drafts = _sequence(0, 4)
    new = torch.tensor([[3, 9]])
    with torch.inference_mode():
        ours = _prompted(model, prompt)
        step = FusedStep(model, extension(), ours)
        step.extend(drafts[0], PROMPT)
        unrewound = step.extend(new[0], PROMPT + 4)  # after the drafts, not in their place
        whole = model(torch.cat([prompt, new], dim=1))[0, PROMPT:]
    with pytest.raises(AssertionError, match="float32 bound"):
        assert_float32_close(unrewound, whole, **gpt_sums(model.config))


@pytest.mark.parametrize("T", [2, 8, 9, 16])  # streamed groups of 8 up to 15 rows; widened from 16
@pytest.mark.parametrize("weights", STORED)
@pytest.mark.parametrize("name", ["gpt2", "llama", "short-blocks"])
def test_stored_weights_read_t_tokens_as_t_steps_and_the_reference_model(name, weights, T):
    """bf16 and int8 weights: T tokens in one call against T one-token steps over the same stored
    weights, and against the forward of the model whose weights are those values (bf16 widened, as
    on a CPU without bf16 instructions)."""
    model = tiny_gpt(block_size=32, **ARCHITECTURES[name])
    prompt, new = _sequence(T, T)
    bound = gpt_sums(model.config)
    with torch.inference_mode():
        ref = reference_model(model, weights)
        together, stepped = _prompted(ref, prompt), _prompted(ref, prompt)
        got = FusedStep(model, extension(), together, weights, native_bf16=False).extend(new[0], PROMPT)
        step = FusedStep(model, extension(), stepped, weights)
        one_by_one = torch.cat([step(new[:, t : t + 1], stepped, PROMPT + t)[0] for t in range(T)])
        whole = ref(torch.cat([prompt, new], dim=1))[0, PROMPT:]
    assert_float32_close(got, one_by_one, **bound)
    assert_float32_close(got, whole, **bound)
    _assert_same_slots(together, stepped, PROMPT + T, bound)


def test_past_eight_tokens_the_products_use_onednns_reordered_weights(monkeypatch):
    monkeypatch.setattr(fused, "REORDERED_MIN_WEIGHT", 1)
    model = tiny_gpt(block_size=32, d_model=48, n_heads=3)
    prompt, new = _sequence(3, 12)
    with torch.inference_mode():
        got = FusedStep(model, extension(), _prompted(model, prompt)).extend(new[0], PROMPT)
        whole = model(torch.cat([prompt, new], dim=1))[0, PROMPT:]
    assert_float32_close(got, whole, **gpt_sums(model.config))
    assert has_reordered_weight(model.blocks[0].attn.in_proj.weight) == MKLDNN


def test_last_only_gives_the_last_tokens_logits_and_fills_the_same_cache():
    """A context read into the cache (a prompt, a drafter's kept tokens): the last logits alone."""
    model = tiny_gpt(block_size=32, **ARCHITECTURES["llama"])
    prompt, new = _sequence(5, 7)
    bound = gpt_sums(model.config)
    with torch.inference_mode():
        every, last = _prompted(model, prompt), _prompted(model, prompt)
        all_rows = FusedStep(model, extension(), every).extend(new[0], PROMPT)
        only = FusedStep(model, extension(), last).extend(new[0], PROMPT, last_only=True)
    assert only.shape == (1, model.config.vocab_size)
    assert_float32_close(only, all_rows[-1:], **bound)
    _assert_same_slots(last, every, PROMPT + 7, bound)


def test_tokens_past_the_cache_or_an_unknown_row_are_refused():
    model = tiny_gpt(block_size=16)
    with torch.inference_mode():
        cache = model.new_cache(2)
        step = FusedStep(model, extension(), cache)
        with pytest.raises(RuntimeError, match=r"positions 12 \.\. 16 are outside the cache's 16 slots"):
            step.extend(torch.arange(5), 12)
        with pytest.raises(RuntimeError, match="row 2 is outside the cache's 2 rows"):
            step.extend(torch.arange(2), 0, row=2)
        with pytest.raises(RuntimeError, match="T >= 1"):
            step.extend(torch.zeros(0, dtype=torch.long), 0)
        # row 1 extended alone: its logits are the model's for that row's tokens
        got = step.extend(torch.tensor([4, 5, 6]), 0, row=1)
        assert_float32_close(got, model(torch.tensor([[4, 5, 6]]))[0], **gpt_sums(model.config))
