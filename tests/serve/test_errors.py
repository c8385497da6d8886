"""Bad requests get OpenAI's JSON error body with the right status and the field at fault; the API
key guards /v1 and nothing else; a full queue answers 429; random bodies never break the server."""

import asyncio
import dataclasses
import json
import random
import threading
import time

import httpx
import pytest

from attnlab.serve.app import create_app
from attnlab.serve.errors import APIError
from attnlab.serve.limits import Limits
from attnlab.serve.server import BackgroundServer
from serve.conftest import LIMITS, lm_worker

pytestmark = pytest.mark.slow

C, T, K, A, G = "/v1/completions", "/v1/translations", "/v1/classifications", "/v1/tags", "/v1/attention"
E = "/v1/embeddings"

# (path, body (JSON, or raw bytes), param, a fragment of the message); every one answers 400.
BAD = [
    (C, b'{"model": ', None, "not valid JSON"),
    (C, b"[1, 2]", None, "must be a JSON object"),
    (C, b"", None, "the request body is empty"),
    (C, {}, "model", "required"),
    (C, {"model": "lm", "max_tokens": -1}, "max_tokens", "greater than or equal to 0"),
    (C, {"model": "lm", "max_tokens": LIMITS.max_tokens + 1}, "max_tokens", f"at most {LIMITS.max_tokens}"),
    (C, {"model": "lm", "max_tokens": "ten"}, "max_tokens", "valid integer"),
    (C, {"model": "lm", "n": 0}, "n", "greater than or equal to 1"),
    (C, {"model": "lm", "n": LIMITS.max_n + 1}, "n", f"at most {LIMITS.max_n}"),
    (C, {"model": "lm", "n": 2, "prompt": ["a", "b", "c"]}, "n", "6 completions asked"),
    (C, {"model": "lm", "temperature": 2.5}, "temperature", "less than or equal to 2"),
    (C, b'{"model": "lm", "temperature": NaN}', "temperature", "finite number"),
    (C, {"model": "lm", "top_p": 0}, "top_p", "greater than 0"),
    (C, {"model": "lm", "top_k": 0}, "top_k", "greater than or equal to 1"),
    (C, {"model": "lm", "seed": 2**64}, "seed", "less than or equal to"),
    (C, {"model": "lm", "prompt": "KING"}, "prompt", "never saw: 'K'"),
    (C, {"model": "lm", "prompt": ["ab", "Kent"]}, "prompt[1]", "never saw: 'K'"),
    (C, b'{"model": "lm", "prompt": "\\ud800"}', "prompt", "lone surrogate"),
    (C, {"model": "lm", "prompt": "a" * 60}, "prompt", "60 tokens, but model 'lm' takes at most 50"),
    (C, {"model": "lm", "prompt": "a" * 401}, "prompt", "400 characters"),
    (C, {"model": "lm", "prompt": [1, 2000]}, "prompt", "token id 2000 is not in the vocabulary"),
    (C, {"model": "lm", "prompt": [1.5]}, "prompt[0]", "valid string"),
    (C, {"model": "lm", "prompt": []}, "prompt", "at least 1 item"),
    (C, {"model": "lm", "stop": ["a", "b", "c", "d", "e"]}, "stop", "at most 4 items"),
    (C, {"model": "lm", "logprobs": 6}, "logprobs", "at most 5"),
    (C, {"model": "lm", "best_of": 2}, "best_of", "does not rank completions"),
    (C, {"model": "lm", "logit_bias": {"x": 1}}, "logit_bias", "not a token id"),
    (C, {"model": "lm", "echo": True, "logprobs": 0, "prompt": "a" * 17}, "prompt", "the context of model 'lm'"),
    (C, {"model": "lm", "best": 2}, "best", "unknown field"),
    (C, {"model": "lm", "stream": "maybe"}, "stream", "valid boolean"),
    (C, {"model": "lm", "stream_options": {"include_usage": True, "x": 1}}, "stream_options.x", "unknown field"),
    (C, {"model": "mt"}, "model", "it answers POST /v1/translations and POST /v1/attention"),
    (T, {"model": "mt", "input": "   "}, "input", "empty"),
    (T, {"model": "mt", "input": "Hund", "beam": 0}, "beam", "greater than or equal to 1"),
    (T, {"model": "mt", "input": "Hund", "beam": LIMITS.max_beam + 1}, "beam", f"at most {LIMITS.max_beam}"),
    (T, {"model": "mt", "input": "Ein Hund " * 44}, "input", "tokens, but this model takes at most 100"),
    (T, {"model": "lm", "input": "Hund"}, "model", "POST /v1/completions"),
    (K, {"model": "sst", "input": ["good"] * (LIMITS.max_inputs + 1)}, "input", f"at most {LIMITS.max_inputs}"),
    (K, {"model": "sst", "input": ["good", ""]}, "input[1]", "empty"),
    (K, {"model": "sst", "input": []}, "input", "at least 1 item"),
    (K, {"model": "sst", "input": 3}, "input", "valid string"),
    (A, {"model": "pos", "input": None}, "input", "valid string"),
    (G, {"model": "lm", "input": "a" * 41}, "input", f"at most {LIMITS.max_attention_tokens}"),
    (G, {"model": "lm", "input": "ROMEO", "kind": "cross"}, None, "self-attention only"),
    (G, {"model": "lm", "input": "ROMEO", "kind": "diagonal"}, "kind", "'self' or 'cross'"),
    (G, {"model": "sst-lstm", "input": "fine"}, "model", "POST /v1/classifications"),
    (
        C,
        {"model": "mlm"},
        "model",
        "a masked language model: it answers POST /v1/embeddings and POST /v1/attention, not POST /v1/completions",
    ),
]


def assert_error(response, status: int, param: str | None = None, fragment: str = "") -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["param"] == param and fragment in error["message"], error
    assert "\n" not in error["message"] and "Traceback" not in error["message"]
    return error


@pytest.mark.parametrize("path, body, param, fragment", BAD, ids=[f"{p}-{f}" for p, _, _, f in BAD])
def test_bad_requests_get_400_naming_the_field(client, path, body, param, fragment):
    if isinstance(body, bytes):
        response = client.post(path, content=body, headers={"content-type": "application/json"})
    else:
        response = client.post(path, json=body)
    assert assert_error(response, 400, param, fragment)["type"] == "invalid_request_error"


def test_an_unknown_model_is_404_as_in_openais_api(client):
    assert_error(client.post(C, json={"model": "gpt-4"}), 404, "model", "no model 'gpt-4' here; this server has lm, mt")


def test_unknown_paths_and_methods_and_huge_bodies(client):
    assert_error(client.get("/v2/models"), 404, None, "no route for GET /v2/models")
    assert_error(client.get("/v1/completions"), 405, None, "GET /v1/completions")
    huge = b'{"model": "lm", "prompt": "' + b"a" * LIMITS.max_body_bytes + b'"}'
    assert_error(client.post(C, content=huge), 413, None, f"{LIMITS.max_body_bytes} bytes")
    assert client.get("/healthz").status_code == 200


# -- the API key ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def keyed(runs):
    from fastapi.testclient import TestClient

    with TestClient(create_app(runs, api_key="s3cret", limits=LIMITS)) as c:
        yield c


@pytest.mark.parametrize("header", [None, "Bearer wrong", "Basic s3cret", "s3cret", "Bearer s3cret2", "Bearer "])
def test_without_the_key_v1_answers_401(keyed, header):
    headers = {"Authorization": header} if header else {}
    for response in (
        keyed.get("/v1/models", headers=headers),
        keyed.post(C, json={"model": "lm", "max_tokens": 1}, headers=headers),
        keyed.post(C, content=b"{not json", headers=headers),  # the key is checked before anything else
        keyed.get("/v1/nothing-here", headers=headers),
    ):
        error = assert_error(response, 401, None, "Authorization: Bearer KEY")
        assert error["type"] == "authentication_error"
        assert response.headers["www-authenticate"] == "Bearer"


def test_with_the_key_v1_answers_and_the_page_needs_none(keyed):
    for header in ("Bearer s3cret", "bearer s3cret"):
        assert keyed.get("/v1/models", headers={"Authorization": header}).status_code == 200
    response = keyed.post(C, json={"model": "lm", "max_tokens": 3}, headers={"Authorization": "Bearer s3cret"})
    assert response.status_code == 200 and response.json()["usage"]["completion_tokens"] <= 3
    for path in ("/", "/static/app.js", "/static/attention-view.js", "/healthz"):
        assert keyed.get(path).status_code == 200, path


# -- bounds ---------------------------------------------------------------------------------------


def wait_for(condition, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_past_the_queue_bound_429_and_gone_clients_free_their_slots(runs):
    """max_batch 1, max_queue 1: one stream decodes, one waits, the third is refused. Closing the
    two connections frees both: the worker is idle again and stops generating."""
    app = create_app(runs, limits=Limits(max_batch=1, max_queue=1, max_tokens=100_000, past_context=True))
    worker = lm_worker(app)
    body = {"model": "lm", "prompt": "ROMEO:", "max_tokens": 100_000, "stream": True}
    with BackgroundServer(app) as server, httpx.Client(base_url=server.url, timeout=30) as http:
        with http.stream("POST", C, json=body) as first:
            assert first.status_code == 200
            lines = first.iter_lines()  # kept: dropping the iterator would close the connection
            assert next(lines).startswith("data: {")
            with http.stream("POST", C, json=body) as second:
                assert second.status_code == 200
                wait_for(lambda: worker.stats()["queued"] == 1)
                refused = http.post(C, json={**body, "stream": False})
                assert_error(refused, 429, None, "full queue")
                assert int(refused.headers["retry-after"]) >= 1
                assert worker.stats()["active"] == 1
        wait_for(lambda: worker.stats()["active"] == 0 and worker.stats()["queued"] == 0)
        generated = worker.stats()["generated_tokens"]
        time.sleep(0.3)
        assert worker.stats()["generated_tokens"] == generated, "still decoding for nobody"
        assert generated < 100_000
        assert http.post(C, json={**body, "stream": False, "max_tokens": 5}).status_code == 200


def test_a_client_gone_mid_stream_frees_its_row_at_the_next_step(live):
    worker = lm_worker(live)
    body = {"model": "lm", "prompt": "ROMEO:", "max_tokens": 100_000, "stream": True, "n": 2}
    with httpx.Client(base_url=live.url, timeout=30) as http:
        with http.stream("POST", C, json=body) as response:
            lines = response.iter_lines()
            for _ in range(20):
                next(lines)
            assert worker.stats()["active"] == 2
    wait_for(lambda: worker.stats()["active"] == 0, timeout=5)


def test_a_client_gone_before_its_whole_answer_frees_its_row_too(live):
    worker = lm_worker(live)
    before = worker.stats()["generated_tokens"]
    with pytest.raises(httpx.ReadTimeout), httpx.Client(base_url=live.url, timeout=0.5) as http:
        http.post(C, json={"model": "lm", "prompt": "ROMEO:", "max_tokens": 100_000})
    wait_for(lambda: worker.stats()["active"] == 0, timeout=5)
    assert worker.stats()["generated_tokens"] - before < 100_000


def test_other_endpoints_are_bounded_per_model(runs):
    """Model calls besides decoding run one at a time per model; past `bound` waiting: 429."""
    model = create_app(runs, limits=LIMITS).state.models["sst"]
    release = threading.Event()

    async def main():
        first = asyncio.ensure_future(model.call(1, release.wait))
        await asyncio.sleep(0.05)
        with pytest.raises(APIError) as refused:
            await model.call(1, lambda: None)
        release.set()
        assert await first is True
        assert await model.call(1, lambda: "free again") == "free again"
        return refused.value

    refused = asyncio.run(main())
    assert refused.status == 429 and refused.headers == {"Retry-After": "1"}


# -- fuzz -------------------------------------------------------------------------------------------

FIELDS = ["model", "prompt", "max_tokens", "temperature", "top_p", "top_k", "n", "stream", "stop", "seed", "input"]
FIELDS += ["beam", "kind", "stream_options", "include_usage", "echo", "", "モデル", "encoding_format", "dimensions"]
FIELDS += ["logprobs", "presence_penalty", "frequency_penalty", "logit_bias", "best_of", "user", "suffix"]
FIELDS += ["response_format", "type", "json_schema", "schema", "top_logprobs"]
FIELDS += ["tools", "tool_choice", "parallel_tool_calls", "tool_calls", "tool_call_id", "function", "parameters"]


def random_value(rng: random.Random, depth: int = 0):
    choices = [
        lambda: None,
        lambda: rng.choice([True, False]),
        lambda: rng.choice([0, 1, -1, 3, 2**31, -(2**63), 2**64, 10**30]),
        lambda: rng.choice([0.0, 0.5, 1.0, -0.1, 2.0000001, 1e308, -1e-300]),
        lambda: rng.choice(["lm", "mt", "sst", "pos", "mlm", "", " ", "ROMEO:", "Ein Hund.", "cross", "self"]),
        lambda: "".join(rng.choice("aZ :\n\t\\\"'<é中\U0001f600\x00K") for _ in range(rng.randint(0, 30))),
    ]
    if depth < 2:
        choices.append(lambda: [random_value(rng, depth + 1) for _ in range(rng.randint(0, 5))])
        choices.append(lambda: {rng.choice(FIELDS): random_value(rng, depth + 1) for _ in range(rng.randint(0, 3))})
    return rng.choice(choices)()


# Values each field takes in a real request, good and bad, so that many bodies get past validation.
PLAUSIBLE = {
    "prompt": ["ROMEO:", "", ["ab", "cd"], "KING", "a" * 60, "\n\n"],
    "max_tokens": [0, 1, 5, 16, 17, -1, None],
    "temperature": [0, 0.7, 2, 3, None],
    "top_p": [0.5, 1, 0],
    "top_k": [1, 5, 0, None],
    "n": [1, 2, 5],
    "stream": [True, False, None],
    "stop": ["a", ["\n", "e"], [], "", None],
    "seed": [0, 42, -1, None],
    "input": ["Ein Hund.", "good movie", ["a", "b"], "", "I can't", " "],
    "beam": [1, 2, 4, 9, None],
    "kind": ["self", "cross", None],
    "stream_options": [{"include_usage": True}, None, {}],
    "encoding_format": ["float", "base64", "hex", None],
    "dimensions": [32, 1, None],
    "echo": [True, False, None],
    "logprobs": [0, 1, 5, 6, None],
    "presence_penalty": [0, 1.5, -2, 3, None],
    "frequency_penalty": [0, 0.5, 2.1, None],
    "logit_bias": [{}, {"3": 100}, {"3": -100, "7": 2}, {"x": 1}, {"99999": 1}, {"3": 200}, None],
    "best_of": [1, 2, None],
    "suffix": [None, "", "x"],
    "response_format": [
        {"type": "json_object"},
        {"type": "text"},
        {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}},
        {"type": "json_schema", "json_schema": {"name": "x", "schema": {"enum": ["ROMEO", "KING"]}}},
        {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "foo"}}},
        {"type": "json_schema"},
        None,
    ],
    "tools": [
        [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
        [{"type": "function", "function": {}}],
        [],
        None,
    ],
    "tool_choice": ["auto", "none", "required", {"type": "function", "function": {"name": "f"}}, "x", None],
    "parallel_tool_calls": [True, False, None, "yes"],
}
# The embeddings' token-id inputs and the completions' token-id prompts, good and bad.
PLAUSIBLE["input"] += [[5, 6, 7], [[5], [6, 7]], [[]], [-1], [True]]
PLAUSIBLE["prompt"] += [[3, 4, 5], [[3], [4, 5]], [999999], [[]], "a" * 17]


# Half the bodies keep to the fields and the model of their endpoint, so that many pass validation
# and reach the models; the other half mix anything.
OWN = {
    C: (
        "lm",
        ["prompt", "max_tokens", "temperature", "top_p", "top_k", "n", "stream", "stop", "seed", "echo", "logprobs"]
        + ["presence_penalty", "frequency_penalty", "logit_bias", "best_of", "suffix", "response_format"],
    ),
    T: ("mt", ["input", "beam"]),
    K: ("sst", ["input"]),
    A: ("pos", ["input"]),
    G: ("lm", ["input", "kind", "beam"]),
    E: ("mlm", ["input", "encoding_format", "dimensions"]),
}


def random_body(rng: random.Random, path: str) -> bytes:
    if rng.random() < 0.1:  # not JSON, or not quite
        return rng.choice([b"{", b"nul", b'{"model": "lm",}', b"\xff\xfe", b'{"prompt": "\\ud83d"}', b"[]" * 50])
    model, own = OWN.get(path, ("lm", list(PLAUSIBLE)))
    if rng.random() < 0.5:
        body = {f: rng.choice(PLAUSIBLE[f]) for f in rng.sample(own, rng.randint(0, len(own)))}
        return json.dumps({"model": model, **body}).encode()
    fields = rng.sample(FIELDS, rng.randint(0, 6))
    body = {f: rng.choice(PLAUSIBLE[f]) if f in PLAUSIBLE and rng.random() < 0.6 else random_value(rng) for f in fields}
    if rng.random() < 0.7:
        body["model"] = rng.choice(["lm", "mt", "sst", "sst-lstm", "pos", "mlm"])
    return json.dumps(body).encode()


def test_random_bodies_never_break_the_server(runs):
    """200 random JSON bodies to every endpoint of a live server: answers are 200, or a JSON error
    with a 4xx status, never a 500; the server answers normally afterwards."""
    rng = random.Random(2024)
    paths = [C, T, K, A, G, E, "/v1/models"]
    statuses = set()
    limits = dataclasses.replace(LIMITS, max_tokens=16)  # any accepted completion is short
    with BackgroundServer(create_app(runs, limits=limits)) as server, httpx.Client(base_url=server.url) as http:
        for _ in range(200):
            path = rng.choice(paths)
            body = random_body(rng, path)
            response = http.post(path, content=body, headers={"content-type": "application/json"}, timeout=60)
            statuses.add(response.status_code)
            assert response.status_code in (200, 400, 404, 405, 429), (path, body, response.text)
            if response.status_code != 200:
                assert_error(response, response.status_code, response.json()["error"]["param"])
            elif path == C and b'"stream": true' in body:  # a stream ends as OpenAI's do
                assert response.text.endswith("data: [DONE]\n\n")
            elif path == C:  # logprobs, where asked: a row per token
                for choice in response.json()["choices"]:
                    rows = choice["logprobs"] or {}
                    assert len({len(v) for v in rows.values()}) <= 1, rows
        assert http.get("/healthz").json() == {"status": "ok"}
        ok = http.post(C, json={"model": "lm", "prompt": "ROMEO:", "max_tokens": 5, "temperature": 0})
        assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 5
    assert {200, 400} <= statuses
