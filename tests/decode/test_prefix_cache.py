"""Automatic prefix caching: a prompt that begins as an earlier one reuses its keys and values and
gets the logits of a cold prefill, within float32 rounding."""

import pytest
import torch

from attnlab.accel.fused import extension
from attnlab.decode.batching import Batcher, Sequence
from attnlab.decode.prefix_cache import PrefixCache, block_keys
from attnlab.nn.attention import KVCache
from decode.conftest import tiny_gpt
from tolerance import assert_float32_close, gpt_sums

BLOCK = 4  # tokens per cached block: small, so that the tiny models' prompts span several
MODELS = pytest.mark.parametrize(
    "overrides",
    [{}, {"positions": "rope", "n_kv_heads": 1}, {"positions": "alibi"}],
    ids=["learned", "rope-mqa", "alibi-one-at-a-time"],
)


class Recorder:
    """A greedy picker that keeps every logits row it is given `(1, V)`."""

    def __init__(self) -> None:
        self.logits: list[torch.Tensor] = []

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        self.logits.append(logits[0].clone())
        return logits.argmax(dim=-1)


def decode(batcher: Batcher, prompts: list[list[int]], max_new: int = 6) -> list[Sequence]:
    """Join the prompts together and step until all are done; each records its logits."""
    seqs = [Sequence(list(p), max_new, Recorder()) for p in prompts]
    batcher.join_all(seqs)
    while len(batcher):
        batcher.step()
    return seqs


def same_logits(got: Sequence, want: Sequence, model) -> None:
    assert got.tokens == want.tokens
    assert len(got.pick.logits) == len(want.pick.logits) == len(want.tokens)
    assert_float32_close(torch.stack(got.pick.logits), torch.stack(want.pick.logits), **gpt_sums(model.config))


def random_tokens(n: int, seed: int, vocab: int = 23) -> list[int]:
    return torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def test_block_keys_chain_whole_prefixes():
    a = random_tokens(14, 1)
    keys = block_keys(a, BLOCK)
    assert len(keys) == 3  # 14 tokens: three full blocks; the last two tokens have no key
    assert block_keys(a[:12] + [0, 0, 0, 0], BLOCK)[:3] == keys  # the same first blocks: the same keys
    b = [a[0] + 1] + a[1:]  # only the first token differs
    # a changed prefix changes every key after it
    assert all(x != y for x, y in zip(block_keys(b, BLOCK), keys, strict=True))
    twice = a[:4] * 2
    first, second = block_keys(twice, BLOCK)
    assert first != second  # the same block's tokens after another prefix: another key
    assert len(set(keys)) == 3


def cache_rows(rows: int = 2, slots: int = 32) -> list[KVCache]:
    layers = [KVCache(rows, 2, slots, 3) for _ in range(2)]
    for i, layer in enumerate(layers):  # every slot's values tell its layer, row and position
        layer.k.copy_(torch.arange(layer.k.numel(), dtype=torch.float32).view_as(layer.k) + 1000 * i)
        layer.v.copy_(-layer.k)
    return layers


def test_lru_eviction_keeps_the_bound_and_takes_chains_from_their_end():
    cache = cache_rows()
    block_bytes = 2 * 2 * (2 * BLOCK * 3) * 4  # layers × (k, v) × (H, block, D) × fp32
    prefix = PrefixCache(cache, 5 * block_bytes, BLOCK)
    assert prefix.block_bytes == block_bytes and prefix.capacity == 5
    a, b = random_tokens(12, 1), random_tokens(12, 2)
    prefix.store(a, row=0)
    prefix.store(b, row=1)  # six blocks for five: a's last one goes (the least recently used chain, from its end)
    assert len(prefix) == 5 and prefix.nbytes == 5 * block_bytes
    assert len(prefix.lookup(a)) == 2 and len(prefix.lookup(b)) == 3
    prefix.lookup(a)  # a is now the more recent: b loses its last blocks first
    prefix.store(random_tokens(8, 3), row=0)
    assert len(prefix) == 5
    assert len(prefix.lookup(a)) == 2 and len(prefix.lookup(b)) == 1
    assert PrefixCache(cache, block_bytes - 1, BLOCK).capacity == 0


def test_load_copies_a_rows_blocks_into_another_row():
    cache = cache_rows()
    prefix = PrefixCache(cache, 1 << 20, BLOCK)
    tokens = random_tokens(10, 1)
    prefix.store(tokens, row=0)
    want = [(layer.k[0, :, :7].clone(), layer.v[0, :, :7].clone()) for layer in cache]
    prefix.load(prefix.lookup(tokens), row=1, length=7)  # two blocks found; the first 7 slots taken
    for layer, (k, v) in zip(cache, want, strict=True):
        assert torch.equal(layer.k[1, :, :7], k) and torch.equal(layer.v[1, :, :7], v)
        assert not torch.equal(layer.k[1, :, 7:8], layer.k[0, :, 7:8])  # slot 7 left as it was


def cold_and_warm(model, first: list[int], second: list[int], fused: bool = False):
    """second decoded by a batcher that has decoded first (its prefix cached), and by a cold one."""
    warm = Batcher(model, max_batch=4, fused=fused, prefix_memory=1 << 20, prefix_block=BLOCK)
    decode(warm, [first])
    (got,) = decode(warm, [second])
    (want,) = decode(Batcher(model, max_batch=4, fused=fused), [second])
    return got, want


@MODELS
def test_a_reused_prefix_gives_the_logits_of_a_cold_prefill(overrides):
    model = tiny_gpt(**overrides)
    first = random_tokens(11, 1)
    second = first[:9] + random_tokens(3, 2)  # 9 shared tokens: two full blocks, then part of one
    got, want = cold_and_warm(model, first, second)
    assert got.cached_tokens == 2 * BLOCK  # whole blocks only: the partial third is prefilled
    assert want.cached_tokens == 0
    same_logits(got, want, model)


def test_a_prompt_cached_whole_prefills_its_last_token():
    model = tiny_gpt()
    prompt = random_tokens(12, 3)  # three full blocks, all cached by the first request
    got, want = cold_and_warm(model, prompt, prompt)
    assert got.cached_tokens == 11  # its last token is fed again, for the next token's logits
    same_logits(got, want, model)


def test_a_finished_sequence_leaves_its_reply_cached_for_the_next_turn():
    model = tiny_gpt()
    batcher = Batcher(model, max_batch=4, prefix_memory=1 << 20, prefix_block=BLOCK)
    (turn,) = decode(batcher, [random_tokens(5, 4)], max_new=8)
    follow = turn.prompt + turn.tokens + random_tokens(2, 5)  # the conversation goes on
    (got,) = decode(batcher, [follow])
    (want,) = decode(Batcher(model, max_batch=4), [follow])
    assert got.cached_tokens == 12  # the row held 12 of the 13 tokens: three blocks, past the prompt's one
    same_logits(got, want, model)


def test_two_prompts_sharing_a_prefix_in_one_batch_prefill_it_once():
    model = tiny_gpt()
    shared = random_tokens(8, 6)
    prompts = [shared + random_tokens(3, 7), shared + random_tokens(2, 8), random_tokens(6, 9)]
    batcher = Batcher(model, max_batch=4, prefix_memory=1 << 20, prefix_block=BLOCK)
    got = decode(batcher, prompts)
    assert [s.cached_tokens for s in got] == [0, 8, 0]  # the second waits for the first's blocks
    for seq, prompt in zip(got, prompts, strict=True):
        (want,) = decode(Batcher(model, max_batch=4), [prompt])
        same_logits(seq, want, model)


def test_rolling_caches_take_no_prefix_cache():
    window = tiny_gpt(positions="rope", attention="window", attention_window=5)
    assert Batcher(window, max_batch=2, prefix_memory=1 << 20).prefix is None
    assert Batcher(tiny_gpt(), max_batch=2, prefix_memory=0).prefix is None
    assert Batcher(tiny_gpt(), max_batch=2, prefix_memory=1 << 20).prefix is not None


@pytest.mark.parametrize(
    "overrides", [{}, {"positions": "sinusoidal", "activation": "relu"}], ids=["learned", "sinusoidal"]
)
def test_the_fused_step_with_a_reused_prefix_gives_the_logits_of_a_cold_prefill(overrides):
    if extension() is None:
        pytest.skip("the fused step could not be built here")
    model = tiny_gpt(**overrides)
    first = random_tokens(13, 1)
    second = first[:10] + random_tokens(4, 2)
    got, want = cold_and_warm(model, first, second, fused=True)
    assert got.cached_tokens == 2 * BLOCK
    same_logits(got, want, model)
