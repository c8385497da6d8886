"""The decoding thread behind `attnlab serve`: concurrent completions decoded together give what
each gets decoded alone; cancelling frees its row; the queue is bounded."""

import asyncio

import pytest
import torch

from attnlab.accel.fused import by_default, extension
from attnlab.data.tokenizers import BPETokenizer, CharTokenizer
from attnlab.decode import complete, greedy_picker, sampling_picker
from attnlab.serve.worker import ModelWorker, QueueFull, Sampling
from decode.conftest import tiny_gpt

CORPUS = "the quick brown fox jumps over the lazy dog.\nTHE FIVE BOXING WIZARDS JUMP QUICKLY!\n"


@pytest.fixture(scope="module")
def char_tok() -> CharTokenizer:
    return CharTokenizer.train(CORPUS)


async def collect(stream) -> str:
    return "".join([piece.text async for piece in stream])


def run_worker(model, tokenizer, body, **kwargs):
    """Run `body(worker)` in a fresh event loop with a started worker."""

    async def main():
        worker = ModelWorker(model, tokenizer, **kwargs)
        worker.start()
        try:
            return await body(worker)
        finally:
            worker.close()

    return asyncio.run(main())


# Eight requests of different lengths and endings: stop strings that occur, that never occur,
# max_tokens past the model's block_size (16), a max_tokens of 0.
REQUESTS = [
    ("the ", 30, ()),
    ("fox", 12, ("LB",)),  # a stop string that spans two tokens
    ("", 20, ("never",)),
    ("THE FIVE BOXING WIZ", 25, ("zz", "TR")),
    ("lazy", 0, ()),
    ("q", 40, ("Tz",)),
    ("dog.\n", 7, ()),
    ("jumps over", 18, ("\n",)),
]


@pytest.mark.parametrize("fused", [False, True], ids=["pytorch", "fused"])
def test_concurrent_greedy_completions_equal_decoding_each_alone(char_tok, fused):
    if fused and extension() is None:
        pytest.skip("the fused step could not be built here")
    model = tiny_gpt(vocab_size=char_tok.vocab_size)

    async def body(worker):
        from attnlab.decode.text import encode_prompt

        assert (worker.batcher.runner.fused is not None) == fused

        streams = [
            worker.submit(encode_prompt(char_tok, p)[0].tolist(), Sampling(n, temperature=0, stop=stop))
            for p, n, stop in REQUESTS
        ]
        texts = await asyncio.gather(*(collect(s) for s in streams))
        return texts, streams

    texts, streams = run_worker(model, char_tok, body, max_batch=8, fused=fused)
    stopped = 0
    for (prompt, n, stop), text, stream in zip(REQUESTS, texts, streams, strict=True):
        assert text == complete(model, char_tok, prompt, n, greedy_picker(), stop=stop), prompt
        stopped += stream.finish_reason == "stop"
        assert stream.finish_reason == ("stop" if stream.completion_tokens < n else "length")
    assert stopped >= 4, "no stop string was reached: the test would not see them handled"


def test_the_step_is_fused_by_default_exactly_where_it_is_built(char_tok):
    worker = ModelWorker(tiny_gpt(vocab_size=char_tok.vocab_size), char_tok)
    assert (worker.batcher.runner.fused is not None) == by_default(worker.model)
    assert ModelWorker(tiny_gpt(vocab_size=char_tok.vocab_size), char_tok, fused=False).batcher.runner.fused is None


def test_end_of_text_and_usage_counts():
    tok = BPETokenizer.train([CORPUS * 5], 80)
    model = tiny_gpt(vocab_size=tok.vocab_size, seed=2)
    prompt = tok.encode("the quick")

    async def body(worker):
        stream = worker.submit(prompt, Sampling(40, temperature=0))
        return await collect(stream), stream

    text, stream = run_worker(model, tok, body)
    assert text == complete(model, tok, "the quick", 40, greedy_picker())
    ids = torch.tensor([prompt])
    from attnlab.decode import greedy

    tokens = greedy(model, ids, 40, eos_id=tok.eos_id)[0, len(prompt) :].tolist()
    text_tokens = tokens[: tokens.index(tok.eos_id)] if tok.eos_id in tokens else tokens
    assert stream.prompt_tokens == len(prompt)
    assert stream.completion_tokens == len(text_tokens)
    assert stream.finish_reason == ("stop" if tok.eos_id in tokens else "length")


def test_a_seed_gives_the_text_of_sampling_alone(char_tok):
    model = tiny_gpt(vocab_size=char_tok.vocab_size)
    prompt = char_tok.encode("the ")

    async def body(worker):
        streams = [worker.submit(prompt, Sampling(25, temperature=0.8, top_k=5, seed=s)) for s in (1, 2, 1)]
        return await asyncio.gather(*(collect(s) for s in streams))

    a, b, a_again = run_worker(model, char_tok, body)
    assert a == a_again != b
    pick = sampling_picker(0.8, top_k=5, generator=torch.Generator().manual_seed(1))
    assert a == complete(model, char_tok, "the ", 25, pick)


def test_cancel_frees_the_row_at_the_next_step(char_tok):
    model = tiny_gpt(vocab_size=char_tok.vocab_size, block_size=512)

    async def body(worker):
        stream = worker.submit(char_tok.encode("the "), Sampling(500, temperature=0))
        async for _ in stream:
            break  # the client reads one piece and goes
        assert worker.stats()["active"] == 1
        stream.cancel()
        for _ in range(200):
            if worker.stats()["active"] == 0:
                break
            await asyncio.sleep(0.01)
        return stream, worker.stats()

    stream, stats = run_worker(model, char_tok, body)
    assert stats["active"] == 0
    assert stream.completion_tokens < 500


def test_the_queue_is_bounded(char_tok):
    model = tiny_gpt(vocab_size=char_tok.vocab_size)

    async def body():
        worker = ModelWorker(model, char_tok, max_queue=2)  # not started: nothing leaves the queue
        for _ in range(2):
            worker.submit([1, 2], Sampling(5))
        with pytest.raises(QueueFull) as e:
            worker.submit([1, 2], Sampling(5))
        assert e.value.retry_after > 0
        assert worker.stats()["queued"] == 2

    asyncio.run(body())


def test_one_at_a_time_mode_gives_the_same_text(char_tok):
    model = tiny_gpt(vocab_size=char_tok.vocab_size)

    async def body(worker):
        streams = [worker.submit(char_tok.encode(p), Sampling(10, temperature=0)) for p in ("the", "dog", "fox")]
        return await asyncio.gather(*(collect(s) for s in streams)), worker.stats()

    texts, stats = run_worker(model, char_tok, body, batched=False)
    assert not stats["batched"]
    assert texts == [complete(model, char_tok, p, 10, greedy_picker()) for p in ("the", "dog", "fox")]


def test_a_step_wakes_the_event_loop_once_for_all_its_streams(char_tok):
    """Every stream's piece of a step goes to the loop in one hand-over, not one per token."""
    model = tiny_gpt(vocab_size=char_tok.vocab_size)
    steps, wakeups = [], []

    async def body(worker):
        loop = asyncio.get_running_loop()
        real_call, real_step = loop.call_soon_threadsafe, worker.batcher.step

        def call(*args):
            wakeups.append(args)
            return real_call(*args)

        def step():
            steps.append(len(worker.batcher))
            return real_step()

        loop.call_soon_threadsafe, worker.batcher.step = call, step
        streams = [worker.submit(char_tok.encode(p), Sampling(12, temperature=0)) for p in ("the", "dog", "fox", "q")]
        return await asyncio.gather(*(collect(s) for s in streams))

    texts = run_worker(model, char_tok, body, max_batch=4)
    assert texts == [complete(model, char_tok, p, 12, greedy_picker()) for p in ("the", "dog", "fox", "q")]
    assert max(steps) == 4  # the four were decoded together
    assert len(wakeups) <= len(steps) + 1  # 4 x 12 tokens and 4 ends, in one hand-over per step
