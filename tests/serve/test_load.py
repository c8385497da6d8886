"""Concurrent clients over HTTP: batched requests get what each gets decoded alone, and a small
load (the test-suite version of benchmarks/serve_load.py) ends with no errors but the queue's 429s."""

import asyncio
import json

import httpx
import pytest

from attnlab.decode import complete, greedy_picker
from attnlab.serve.app import create_app
from attnlab.serve.limits import Limits
from attnlab.serve.server import BackgroundServer
from serve.conftest import lm_worker

pytestmark = pytest.mark.slow

# Eight requests of different lengths and endings, sent at once.
REQUESTS = [
    ("ROMEO:", 30, []),
    ("First", 12, ["e"]),
    ("", 25, ["\n"]),
    ("MENENIUS:", 40, ["th", "an"]),
    ("a", 0, []),
    ("Citizen", 18, ["zz"]),
    ("What", 7, []),
    ("You are", 22, [" "]),
]


async def stream_text(client: httpx.AsyncClient, body: dict) -> tuple[int, str]:
    """(status, the streamed text) of one streaming completion."""
    async with client.stream("POST", "/v1/completions", json={**body, "stream": True}) as response:
        if response.status_code != 200:
            await response.aread()
            return response.status_code, response.text
        text = ""
        async for line in response.aiter_lines():
            if line.startswith("data: {"):
                text += "".join(c["text"] for c in json.loads(line[6:])["choices"])
        return 200, text


def test_concurrent_greedy_requests_get_what_each_gets_alone(live, runs):
    run = runs["lm"]

    async def main():
        async with httpx.AsyncClient(base_url=live.url, timeout=60) as client:
            bodies = [dict(model="lm", prompt=p, max_tokens=n, temperature=0, stop=s) for p, n, s in REQUESTS]
            return await asyncio.gather(*(stream_text(client, b) for b in bodies))

    for (prompt, n, stop), (status, text) in zip(REQUESTS, asyncio.run(main()), strict=True):
        assert status == 200
        assert text == complete(run.model, run.tokenizer, prompt, n, greedy_picker(), stop=stop), prompt


def test_a_small_load_has_no_errors_but_the_queues_429s(runs):
    """24 streaming clients, 2 completions each, against 4 rows and a queue of 8: every completion
    is served in full once its 429s are retried; nothing else fails."""
    app = create_app(runs, limits=Limits(max_batch=4, max_queue=8, past_context=True))
    statuses: list[int] = []

    async def client_loop(client: httpx.AsyncClient, i: int) -> list[str]:
        texts = []
        for r in range(2):
            body = dict(model="lm", prompt="ROMEO:", max_tokens=16, seed=100 * i + r, stop=[])
            while True:
                status, text = await stream_text(client, body)
                statuses.append(status)
                if status != 429:
                    break
                await asyncio.sleep(0.05)
            texts.append(text)
        return texts

    async def main(url: str):
        limits = httpx.Limits(max_connections=32)
        async with httpx.AsyncClient(base_url=url, timeout=60, limits=limits) as client:
            return await asyncio.gather(*(client_loop(client, i) for i in range(24)))

    with BackgroundServer(app) as server:
        texts = [t for per_client in asyncio.run(main(server.url)) for t in per_client]
        assert set(statuses) <= {200, 429}
        assert statuses.count(200) == 48 and 429 in statuses, "the queue bound was never reached"
        assert all(len(t) == 16 for t in texts)  # a character model: 16 tokens, 16 characters
        stats = lm_worker(app).stats()
        assert stats["active"] == 0 and stats["queued"] == 0
