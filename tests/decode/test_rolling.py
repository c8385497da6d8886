"""Rolling caches: window attention keeps exactly its window's keys a layer, gives the logits of a
cache that keeps everything, and (with positions inside attention) decodes past block_size with
no recomputation, alone and in continuous batching."""

import pytest
import torch

from attnlab.decode import greedy
from attnlab.decode.batching import Batcher, Sequence
from attnlab.decode.sampling import rolls_past_block
from attnlab.nn import KVCache, ModelCache, RollingKVCache
from decode.conftest import tiny_gpt

W, BLOCK = 5, 16  # a window narrower than the block, so that the ring wraps many times
POSITIONS = ["rope", "alibi", "relative", "learned", "none"]


def window_gpt(positions: str, **overrides):
    fields = dict(positions=positions, attention="window", attention_window=W, block_size=BLOCK)
    return tiny_gpt(**(fields | overrides))


def full_caches(model, batch: int) -> ModelCache:
    """Plain caches that keep every key: the reference, masked to the window by the pattern."""
    c = model.config
    return ModelCache(KVCache(batch, c.kv_heads, c.block_size, c.head_dim) for _ in range(c.n_layers))


@pytest.mark.parametrize("positions", POSITIONS)
@pytest.mark.parametrize("prompt", [1, 3, W, 2 * W + 1])
@pytest.mark.parametrize("static", [False, True], ids=["growing", "static"])
def test_a_ring_of_w_slots_gives_the_logits_of_the_full_cache_masked_to_the_window(positions, prompt, static):
    # Logits of a few units (weights of std 0.2): the ring's keys are summed in another order
    # than the full cache's, a difference of float32 rounding alone, well under 1e-5 at that scale.
    model = window_gpt(positions, n_kv_heads=1, weight_std=0.2)
    seq = torch.randint(0, 23, (2, BLOCK), generator=torch.Generator().manual_seed(prompt))
    ring, full = model.new_cache(2), full_caches(model, 2)
    assert all(isinstance(layer, RollingKVCache) for layer in ring)

    def run(cache, start, end):  # the static path places the tokens by a positions tensor
        at = torch.arange(start, end) if static else None
        return model(seq[:, start:end], cache=cache, positions=at)

    with torch.no_grad():
        got = [run(ring, 0, prompt)] + [run(ring, t, t + 1) for t in range(prompt, BLOCK)]
        want = [model(seq[:, :prompt], cache=full)]
        want += [model(seq[:, t : t + 1], cache=full) for t in range(prompt, BLOCK)]
    torch.testing.assert_close(torch.cat(got, 1), torch.cat(want, 1), rtol=0, atol=1e-5)
    assert all(layer.k.shape[2] == W and layer.v.shape[2] == W for layer in ring)  # O(w) a layer, exactly
    assert ring.length == (0 if static else BLOCK)  # every position counted, past the ring's slots


def test_a_ring_step_reads_at_most_window_keys():
    ring = RollingKVCache(1, 2, W, 4)
    for p in range(3 * W):
        k, v, held, sees = ring.update(p, torch.randn(1, 2, 1, 4), torch.randn(1, 2, 1, 4))
        assert k.shape[2] == v.shape[2] == held.numel() == min(p + 1, W)
        assert sorted(held.tolist()) == list(range(max(0, p - W + 1), p + 1)) and sees is None  # all seen


def test_a_prompt_longer_than_the_ring_attends_to_its_own_keys_then_keeps_the_last_w():
    ring = RollingKVCache(1, 1, W, 2)
    keys = torch.arange(12.0).view(1, 1, 12, 1).expand(1, 1, 12, 2)
    got, _, _, _ = ring.update(0, keys, keys)
    assert torch.equal(got, keys)  # all twelve, for the prompt's own queries
    assert sorted(ring.k[0, 0, :, 0].tolist()) == [7.0, 8.0, 9.0, 10.0, 11.0]
    before = ring.k[0, 0, :, 0].clone()
    got, _, held, _ = ring.update(12, torch.full((1, 1, 2, 2), 12.0), torch.zeros(1, 1, 2, 2))
    # the ring as the next two positions find it, then those two
    assert torch.equal(before, held[:W].float()) and held[W:].tolist() == [12, 13]
    assert torch.equal(got[0, 0, :W, 0], before)


def reference(model, prompt: list[int], new: int) -> list[int]:
    """Greedy decoding by recomputation: the model reads the whole sequence at every step."""
    seq = torch.tensor([prompt])
    with torch.no_grad():
        for _ in range(new):
            seq = torch.cat([seq, model(seq)[:, -1:].argmax(-1)], dim=1)
    return seq[0, len(prompt) :].tolist()


@pytest.mark.parametrize("positions", ["rope", "alibi", "relative", "none"])
@pytest.mark.parametrize("prompt_length", [3, BLOCK + 7])
def test_positions_inside_attention_decode_past_block_size_equal_to_recomputing_everything(positions, prompt_length):
    # Three layers of a 7-key window reach 3 * 6 + 1 = 19 > block_size tokens back: reading the
    # last block_size tokens alone (a sliding window) gives other logits, checked below.
    model = window_gpt(positions, n_layers=3, attention_window=7)
    assert rolls_past_block(model)
    prompt = torch.randint(0, 23, (prompt_length,), generator=torch.Generator().manual_seed(4)).tolist()
    new = 3 * BLOCK
    got = greedy(model, torch.tensor([prompt]), new)[0, prompt_length:].tolist()
    assert got == reference(model, prompt, new)
    whole = torch.tensor([prompt + got])
    with torch.no_grad():
        assert (model(whole)[:, -1] - model(whole[:, -BLOCK:])[:, -1]).abs().max() > 1e-5
    uncached = greedy(model, torch.tensor([prompt]), new, use_cache=False)[0, prompt_length:].tolist()
    assert uncached == got


def sliding_reference(model, prompt: list[int], new: int) -> list[int]:
    """Greedy decoding as learned positions do it: the last block_size tokens, recomputed."""
    seq = torch.tensor([prompt])
    with torch.no_grad():
        for _ in range(new):
            seq = torch.cat([seq, model(seq[:, -BLOCK:])[:, -1:].argmax(-1)], dim=1)
    return seq[0, len(prompt) :].tolist()


def test_learned_positions_keep_their_sliding_window_past_block_size():
    model = window_gpt("learned")
    assert not rolls_past_block(model)
    prompt = [1, 2, 3]
    got = greedy(model, torch.tensor([prompt]), 2 * BLOCK)[0, 3:].tolist()
    assert got == sliding_reference(model, prompt, 2 * BLOCK)


@pytest.mark.parametrize("positions", ["rope", "learned", "alibi"])
def test_batched_window_models_give_each_sequence_its_tokens_alone(positions):
    model = window_gpt(positions)
    g = torch.Generator().manual_seed(7)
    lengths = [(3, 30), (3, 9), (BLOCK + 4, 12), (1, 40), (6, 2), (6, 25)]
    requests = [(torch.randint(0, 23, (n,), generator=g).tolist(), m) for n, m in lengths]
    batcher = Batcher(model, max_batch=len(requests))
    assert batcher.runner.row_positions == (positions != "alibi") and batcher.runner.rolls == (positions != "learned")
    seqs = batcher.join_all([Sequence(p, m) for p, m in requests[:3]])
    for _ in range(4):
        batcher.step()
    seqs += batcher.join_all([Sequence(p, m) for p, m in requests[3:]])
    while len(batcher):
        batcher.step()
        assert not batcher.scheduler.windowed or positions == "learned"  # a rolling cache slides nothing
    for seq, (prompt, m) in zip(seqs, requests, strict=True):
        assert seq.tokens == greedy(model, torch.tensor([prompt]), m)[0, len(prompt) :].tolist(), (len(prompt), m)


def test_prompts_of_one_length_share_a_prefill_and_others_do_not():
    model = window_gpt("rope")
    calls = []
    model.register_forward_hook(lambda module, args, out: calls.append(args[0].shape[0]))
    batcher = Batcher(model, max_batch=4)
    batcher.join_all([Sequence([1, 2, 3], 2), Sequence([4, 5, 6], 2), Sequence([7] * (2 * BLOCK + 1), 2)])
    # Two rows of 3 tokens in one forward; the long prompt alone, block_size tokens a forward.
    assert calls == [2, 1, 1, 1]


def test_a_ring_refuses_attention_other_than_its_window():
    model = tiny_gpt(positions="rope")
    ring = ModelCache(RollingKVCache(1, 2, W, 16) for _ in range(2))
    with pytest.raises(ValueError, match="window attention"):
        model(torch.tensor([[1, 2]]), cache=ring)
