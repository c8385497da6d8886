"""A completion never goes past the model's context (the default rule): it ends with
finish_reason "length" where its next token would be predicted from more tokens than the model
reads, its tokens those the library decodes with no window sliding; a prompt past the context
that asks for tokens is a 400 naming the numbers."""

import httpx
import pytest
import torch

from attnlab.decode import greedy
from serve.json_models import CONTEXT, JSON_BLOCK
from serve.test_errors import assert_error


def post(server, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{server.url}{path}", json=body, timeout=120)


@pytest.mark.parametrize("stream", [False, True])
def test_a_completion_stops_at_the_context(json_server, json_runs, stream):
    run = json_runs["json"]
    prompt = run.tokenizer.decode(run.tokenizer.encode(" ROMEO: What say you?" * 12)[: JSON_BLOCK - 10])
    ids = run.tokenizer.encode(prompt)
    room = JSON_BLOCK - len(ids) + 1  # the last token is predicted from the whole context
    body = dict(
        model="json", prompt=prompt, max_tokens=200, temperature=0, logit_bias={str(run.tokenizer.eos_id): -100}
    )
    want = greedy(run.model, torch.tensor([ids]), room)[0, len(ids) :].tolist()
    assert len(ids) + room - 1 == JSON_BLOCK and len(want) == room
    if not stream:
        answer = post(json_server, "/v1/completions", body).json()
        assert answer["choices"][0]["finish_reason"] == "length"
        assert answer["usage"]["completion_tokens"] == room
        assert answer["choices"][0]["text"] == run.tokenizer.decode(want).rstrip("\ufffd")
        return
    with httpx.stream("POST", f"{json_server.url}/v1/completions", json={**body, "stream": True}) as response:
        lines = [line for line in response.iter_lines() if line.startswith("data: {")]
    assert '"finish_reason": "length"' in lines[-1]


def test_a_chat_reply_stops_at_the_context(json_server, json_runs):
    tok = json_runs["chat"].tokenizer
    line = "ROMEO: What say you? "
    text = line * (450 // len(tok.encode(line)))
    answer = post(json_server, "/v1/chat/completions", dict(model="chat", messages=[{"role": "user", "content": text}]))
    answer = answer.json()
    prompt = answer["usage"]["prompt_tokens"]
    assert CONTEXT - 100 < prompt < CONTEXT  # the server's max_tokens (400) would have gone past the context
    reason, new = answer["choices"][0]["finish_reason"], answer["usage"]["completion_tokens"]
    assert (reason, new) == ("length", CONTEXT - prompt + 1) or (reason == "stop" and new <= CONTEXT - prompt)


def test_a_prompt_past_the_context_is_a_400_naming_the_numbers(json_server, json_runs):
    run = json_runs["json"]
    ids = (run.tokenizer.encode(" ROMEO: What say you?") * 20)[: JSON_BLOCK + 3]
    error = assert_error(
        post(json_server, "/v1/completions", dict(model="json", prompt=ids, max_tokens=1)), 400, "prompt"
    )
    assert f"{JSON_BLOCK + 3} tokens, past the {JSON_BLOCK}-token context of model 'json'" in error["message"]
    scored = post(json_server, "/v1/completions", dict(model="json", prompt=ids, max_tokens=0, echo=True))
    assert scored.status_code == 200  # nothing to generate: the prompt is echoed
    full = post(json_server, "/v1/completions", dict(model="json", prompt=ids[:JSON_BLOCK], max_tokens=5))
    assert full.json()["usage"]["completion_tokens"] == 1  # a whole context gives one token, read from all of it
    batch = dict(model="json", prompt=[ids[:4], ids], max_tokens=1)
    assert_error(post(json_server, "/v1/completions", batch), 400, "prompt[1]", f"past the {JSON_BLOCK}-token context")
    long_chat = [{"role": "user", "content": "ROMEO: What say you? " * 200}]
    error = assert_error(
        post(json_server, "/v1/chat/completions", dict(model="chat", messages=long_chat)), 400, "messages"
    )
    assert f"but model 'chat' takes at most {CONTEXT}" in error["message"]  # a folder's prompts fit its context
