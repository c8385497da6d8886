"""Continuous batching on the fused C++ step (`Batcher(fused=True)`): rows decoded, prompts
prefilled in one call and sliding windows all in C++, each sequence getting exactly the tokens,
logits and cache of decoding alone; the batching itself is tests/decode/test_batching.py's."""

import pytest
import torch

from attnlab.accel.fused import extension
from attnlab.decode.batching import Batcher, Sequence
from decode.conftest import tiny_gpt
from decode.test_batching import REQUESTS, alone, count_forwards, prompts, recording, run_staggered
from tolerance import assert_float32_close, gpt_sums

# GPTs the fused step covers: learned positions with GELU, sinusoidal ones with ReLU.
FUSED_GPTS = pytest.mark.parametrize(
    "overrides", [{}, {"positions": "sinusoidal", "activation": "relu"}], ids=["learned", "sinusoidal"]
)


@FUSED_GPTS
def test_the_fused_rows_step_gives_the_tokens_of_decoding_alone(overrides):
    if extension() is None:
        pytest.skip("the fused step could not be built here")
    model = tiny_gpt(**overrides)
    requests = [(p, m) for p, (_, m) in zip(prompts(seed=11), REQUESTS, strict=True)]
    batcher = Batcher(model, max_batch=8, fused=True)
    assert batcher.runner.fused is not None
    calls = count_forwards(model)
    finished = run_staggered(batcher, requests)
    assert calls == []  # prompts, cached rows and sliding windows: all in C++
    by_prompt = {tuple(s.prompt): s for s in finished}
    for prompt, max_new in requests:
        assert by_prompt[tuple(prompt)].tokens == alone(model, prompt, max_new), (len(prompt), max_new)


@FUSED_GPTS
def test_the_fused_prefill_takes_every_prompt_in_one_call_with_the_logits_and_cache_of_each_alone(overrides):
    if extension() is None:
        pytest.skip("the fused step could not be built here")
    model = tiny_gpt(**overrides)
    # Windows of 3, 1, 7, 12, 16 (a prompt of 20), 5, 2 and 9 tokens: 55 in all, more tokens than
    # the cache's 10 rows, prefilled while two sequences are decoding, into rows 2 onwards.
    batcher = Batcher(model, max_batch=10, fused=True)
    for prompt in prompts(seed=5)[:2]:
        batcher.join(prompt, 30)
    batcher.step()
    calls, picked = count_forwards(model), []
    seqs = batcher.join_all([Sequence(p, 2, pick=recording(picked)) for p in prompts(seed=17)])
    assert calls == []  # not the model's forward: one C++ call
    assert [s.row for s in seqs] == list(range(2, 10))
    for seq, logits in zip(seqs, picked, strict=True):
        eager, got = Batcher(model, max_batch=1), []
        eager.join(seq.prompt, 2, pick=recording(got))
        assert_float32_close(logits, got[0], **gpt_sums(model.config))
        n = seq.filled
        assert n == min(len(seq.prompt), 16)
        for mine, its in zip(batcher.runner.cache, eager.runner.cache, strict=True):
            assert_float32_close(mine.k[seq.row, :, :n], its.k[0, :, :n], **gpt_sums(model.config))
            assert_float32_close(mine.v[seq.row, :, :n], its.v[0, :, :n], **gpt_sums(model.config))


def test_the_fused_prefill_refuses_prompts_the_cache_cannot_hold():
    if extension() is None:
        pytest.skip("the fused step could not be built here")
    step = Batcher(tiny_gpt(), max_batch=2, fused=True).runner.fused.step
    three = torch.zeros(3, dtype=torch.long)
    with pytest.raises(RuntimeError, match=r"prompts for rows 1 \.\. 2, but the cache has 2 rows"):
        step.prefill(three, [1, 2], 1, [])
    with pytest.raises(RuntimeError, match="a prompt of 0 tokens; the cache holds 1 to 16"):
        step.prefill(three, [3, 0], 0, [])
    with pytest.raises(RuntimeError, match="a prompt of 17 tokens"):
        step.prefill(torch.zeros(17, dtype=torch.long), [17], 0, [])
    with pytest.raises(RuntimeError, match="the lengths add up to 2 tokens, not 3"):
        step.prefill(three, [1, 1], 0, [])


def test_a_model_the_fused_step_does_not_cover_batches_eagerly_with_a_warning():
    with pytest.warns(UserWarning, match="decoding eagerly"):
        batcher = Batcher(tiny_gpt(positions="alibi"), max_batch=2, fused=True)
    assert batcher.runner.fused is None
