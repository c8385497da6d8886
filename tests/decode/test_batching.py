"""Continuous batching gives every sequence exactly the tokens it gets decoded alone."""

import pytest
import torch

from attnlab.decode import greedy, sample, sampling_picker
from attnlab.decode.batching import Batcher, Sequence, takes_row_positions
from attnlab.nn.attention import KVCache
from decode.conftest import tiny_gpt
from tolerance import assert_float32_close, gpt_sums

# (prompt length, max new tokens): short and long prompts, one past block_size (16), sequences
# that slide their window mid-way, one that stops at once.
REQUESTS = [(3, 9), (1, 20), (7, 4), (12, 11), (20, 6), (5, 1), (2, 30), (9, 13)]


def prompts(vocab: int = 23, seed: int = 1) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (n,), generator=g).tolist() for n, _ in REQUESTS]


def alone(model, prompt: list[int], max_new: int, eos_id: int | None = None) -> list[int]:
    out = greedy(model, torch.tensor([prompt]), max_new, eos_id=eos_id)
    return out[0, len(prompt) :].tolist()


def run_staggered(batcher: Batcher, requests: list[tuple[list[int], int]], eos_id: int | None = None):
    """Join the requests two at a time, stepping in between, until every sequence is done."""
    pending, running, finished = list(requests), [], []
    while pending or running:
        for prompt, max_new in pending[:2]:
            seq = batcher.join(prompt, max_new, eos_id=eos_id)
            (finished if seq.done else running).append(seq)
        pending = pending[2:]
        for seq in batcher.step():
            if seq.done:
                running.remove(seq)
                finished.append(seq)
    assert len(batcher) == 0
    return finished


@pytest.mark.parametrize(
    "overrides",
    [{}, {"positions": "rope"}, {"positions": "sinusoidal", "n_kv_heads": 1}, {"positions": "alibi"}],
    ids=["learned", "rope", "sinusoidal-mqa", "alibi-one-at-a-time"],
)
def test_batched_greedy_equals_decoding_alone(overrides):
    model = tiny_gpt(**overrides)
    requests = [(p, m) for p, (_, m) in zip(prompts(), REQUESTS, strict=True)]
    batcher = Batcher(model, max_batch=8)
    assert batcher.runner.row_positions == (overrides.get("positions") != "alibi")
    finished = run_staggered(batcher, requests)
    by_prompt = {tuple(s.prompt): s for s in finished}
    for prompt, max_new in requests:
        seq = by_prompt[tuple(prompt)]
        assert seq.tokens == alone(model, prompt, max_new), (len(prompt), max_new)
        assert seq.finish_reason == "length"


def count_forwards(model) -> list[int]:
    calls = []
    model.register_forward_pre_hook(lambda module, args: calls.append(args[0].shape[0]))
    return calls


@pytest.mark.parametrize(
    "overrides",
    [{}, {"positions": "rope"}, {"positions": "sinusoidal", "n_kv_heads": 1}],
    ids=["learned", "rope", "sinusoidal-mqa"],
)
def test_prompts_that_join_together_share_their_prefill_and_get_the_tokens_of_decoding_alone(overrides):
    model = tiny_gpt(**overrides)
    requests = [(p, m) for p, (_, m) in zip(prompts(seed=13), REQUESTS, strict=True)]
    batcher = Batcher(model, max_batch=8)
    calls = count_forwards(model)
    # Windows of 16, 12, 9 (one forward, padded to 16) and 7, 5, 3, 2, 1 (another, padded to 7).
    seqs = batcher.join_all([Sequence(p, m) for p, m in requests])
    assert calls == [3, 5]
    assert sorted(s.row for s in seqs if not s.done) == list(range(len(batcher)))
    while len(batcher):
        batcher.step()
    for seq, (prompt, max_new) in zip(seqs, requests, strict=True):
        assert seq.tokens == alone(model, prompt, max_new), (len(prompt), max_new)


def recording(into: list[torch.Tensor]):
    """A picker that keeps the logits it is given and picks token 0."""

    def pick(logits: torch.Tensor) -> list[int]:
        into.append(logits)
        return [0]

    return pick


def test_a_padded_prefill_gives_each_prompt_the_logits_and_cache_of_its_own_prefill():
    model = tiny_gpt()
    ps = [p for p in prompts(seed=17) if len(p) <= 12][:4]  # 3, 1, 7, 12 tokens
    together = Batcher(model, max_batch=4)
    picked = []
    seqs = together.join_all([Sequence(p, 2, pick=recording(picked)) for p in ps])
    assert [s.row for s in seqs] == [2, 3, 1, 0]  # longest first: 12 and 7 in one forward, 3 and 1 in another
    for seq in seqs:
        alone_batcher, got = Batcher(model, max_batch=1), []
        alone_batcher.join(seq.prompt, 2, pick=recording(got))
        assert_float32_close(picked[seq.row], got[0], **gpt_sums(model.config))
        for mine, its in zip(together.runner.cache, alone_batcher.runner.cache, strict=True):
            n = seq.filled
            assert_float32_close(mine.k[seq.row, :, :n], its.k[0, :, :n], **gpt_sums(model.config))
            assert_float32_close(mine.v[seq.row, :, :n], its.v[0, :, :n], **gpt_sums(model.config))


def test_models_whose_positions_cannot_differ_by_row_prefill_one_prompt_at_a_time():
    model = tiny_gpt(positions="alibi")
    requests = [(p, m) for p, (_, m) in zip(prompts(seed=13), REQUESTS, strict=True)][:4]
    batcher = Batcher(model, max_batch=4)
    calls = count_forwards(model)
    seqs = batcher.join_all([Sequence(p, m) for p, m in requests])
    assert calls == [1, 1, 1, 1]
    while len(batcher):
        batcher.step()
    for seq, (prompt, max_new) in zip(seqs, requests, strict=True):
        assert seq.tokens == alone(model, prompt, max_new)


def test_end_of_text_ends_a_sequence_and_its_row_goes_to_another():
    model = tiny_gpt()
    requests = [(p, m) for p, (_, m) in zip(prompts(seed=3), REQUESTS, strict=True)]
    # An end-of-text id that some sequences produce early: pick the most common first token.
    firsts = [alone(model, p, 1)[0] for p, _ in requests]
    eos = max(set(firsts), key=firsts.count)
    finished = run_staggered(Batcher(model, max_batch=8), requests, eos_id=eos)
    stopped = [s for s in finished if s.finish_reason == "stop"]
    assert stopped, "no sequence reached the end-of-text token: the test would prove nothing"
    for seq in finished:
        want = alone(model, seq.prompt, seq.max_new_tokens, eos_id=eos)
        cut = want.index(eos) + 1 if eos in want else len(want)
        assert seq.tokens == want[:cut]


def test_leaving_early_does_not_disturb_the_others():
    model = tiny_gpt()
    batcher = Batcher(model, max_batch=4)
    ps = prompts(seed=5)[:4]
    seqs = [batcher.join(p, 12) for p in ps]
    batcher.step()
    batcher.leave(seqs[0])  # row 0 goes to the last sequence, whose cache rows are copied over
    batcher.leave(seqs[2])
    assert len(batcher) == 2
    while len(batcher):
        batcher.step()
    for i in (1, 3):
        assert seqs[i].tokens == alone(model, ps[i], 12)


def test_sampling_with_a_seed_per_sequence_matches_sampling_alone():
    model = tiny_gpt()
    batcher = Batcher(model, max_batch=4)
    ps = prompts(seed=7)[:4]
    seqs = []
    for i, p in enumerate(ps):
        pick = sampling_picker(0.9, top_k=10, generator=torch.Generator().manual_seed(100 + i))
        seqs.append(batcher.join(p, 15, pick=pick))
    while len(batcher):
        batcher.step()
    for i, (p, seq) in enumerate(zip(ps, seqs, strict=True)):
        g = torch.Generator().manual_seed(100 + i)
        want = sample(model, torch.tensor([p]), 15, temperature=0.9, top_k=10, generator=g)[0, len(p) :]
        assert seq.tokens == want.tolist()


def test_a_full_batch_refuses_another_sequence():
    batcher = Batcher(tiny_gpt(), max_batch=1)
    batcher.join([1, 2], 5)
    with pytest.raises(RuntimeError, match="full"):
        batcher.join([3], 5)


def test_row_positions_write_each_row_at_its_own_slot():
    cache = KVCache(3, 2, 6, 4)
    k, v = torch.randn(3, 2, 1, 4), torch.randn(3, 2, 1, 4)
    positions = torch.tensor([[0], [4], [2]])
    cache.update(positions, k, v)
    for row, pos in enumerate([0, 4, 2]):
        assert torch.equal(cache.k[row, :, pos], k[row, :, 0])
        assert torch.equal(cache.v[row, :, pos], v[row, :, 0])
        others = [p for p in range(6) if p != pos]
        assert not cache.k[row, :, others].any()


def test_only_full_attention_with_input_or_rotary_positions_takes_row_positions():
    assert takes_row_positions(tiny_gpt(positions="rope"))
    assert not takes_row_positions(tiny_gpt(positions="alibi"))
    assert not takes_row_positions(tiny_gpt(positions="relative"))
