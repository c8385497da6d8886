"""Streams send a chunk per token, as soon as the step that decoded it ends: a 20-token completion
arrives as 20 events (it arrived in 2), a chat reply in pieces (it arrived whole), also beside
other streams."""

import concurrent.futures
import json

import httpx


def stream_events(url: str, path: str, body: dict) -> list[dict]:
    with httpx.stream("POST", url + path, json={**body, "stream": True}, timeout=120) as response:
        assert response.status_code == 200
        return [json.loads(line[6:]) for line in response.iter_lines() if line.startswith("data: {")]


def texts(events: list[dict]) -> list[str]:
    found = []
    for event in events:
        for choice in event["choices"]:
            text = choice["delta"].get("content") if "delta" in choice else choice["text"]
            if text:
                found.append(text)
    return found


def test_a_completion_streams_a_chunk_per_token(live):
    """The character "lm": a token is a character, so 20 tokens are 20 chunks of one character."""
    body = dict(model="lm", prompt="ROMEO:", max_tokens=20, temperature=0.8, seed=1)
    pieces = texts(stream_events(live.url, "/v1/completions", body))
    assert len(pieces) >= 15 and all(len(p) == 1 for p in pieces)


def test_four_streams_at_once_each_get_a_chunk_per_token(live):
    body = dict(model="lm", prompt="ROMEO:", max_tokens=20, temperature=0.8)
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        found = list(
            pool.map(lambda s: texts(stream_events(live.url, "/v1/completions", body | {"seed": s})), range(4))
        )
    assert all(len(pieces) >= 15 for pieces in found)


def test_a_chat_reply_streams_in_pieces(json_server):
    """The byte-level BPE Llama, its end of turn banned: 20 tokens, a piece per token that ends a
    character (a character's first bytes wait for its last)."""
    body = dict(model="chat", messages=[{"role": "user", "content": "hi"}], max_tokens=20, seed=2)
    body["logit_bias"] = {"1": -100}
    events = stream_events(json_server.url, "/v1/chat/completions", body)
    assert len(texts(events)) >= 10
