"""Structured outputs (`response_format`): every reply of a constrained request parses and
follows its schema (checked by `jsonschema`, independently of the grammar that constrained it),
on a random-weight Llama folder and on a trained tiny run, in chat and completions, streamed and
whole; the openai client's `parse` with a Pydantic model; bad schemas are a 400 naming the field;
a schema that never ends stops at max_tokens; a constrained row leaves the others' tokens as they
were."""

import json
import threading
from typing import Literal

import httpx
import jsonschema
import openai
import pydantic
import pytest
import torch

from serve.test_errors import assert_error

pytestmark = pytest.mark.slow

pytest.importorskip("llguidance")

SCHEMAS = {
    "nested": {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 8},
            "place": {
                "type": "object",
                "properties": {"city": {"enum": ["Verona", "Athens"]}, "act": {"type": "integer", "minimum": 1}},
                "required": ["city", "act"],
                "additionalProperties": False,
            },
        },
        "required": ["name", "place"],
        "additionalProperties": False,
    },
    "array": {
        "type": "object",
        "properties": {"tags": {"type": "array", "items": {"enum": ["king", "fool"]}, "minItems": 1, "maxItems": 3}},
        "required": ["tags"],
        "additionalProperties": False,
    },
    "pattern": {
        "type": "object",
        "properties": {"code": {"type": "string", "pattern": "^[A-Z]{2}-[0-9]{3}$"}},
        "required": ["code"],
        "additionalProperties": False,
    },
    "bounds": {
        "type": "object",
        "properties": {
            "age": {"type": "integer", "minimum": 18, "maximum": 65},
            "score": {"type": "number", "minimum": -1.5, "maximum": 2.5},
            "ok": {"type": "boolean"},
        },
        "required": ["age", "score", "ok"],
        "additionalProperties": False,
    },
    "list": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9}, "maxItems": 4},
}
CHAT = [{"role": "user", "content": "Who is Romeo? Answer in JSON."}]


def json_schema_format(name: str) -> dict:
    return {"type": "json_schema", "json_schema": {"name": name, "schema": SCHEMAS[name], "strict": True}}


def events(response: httpx.Response) -> list[dict]:
    return [json.loads(line[6:]) for line in response.iter_lines() if line.startswith("data: {")]


def request(server, path: str, body: dict) -> tuple[list[str], list[str]]:
    """Each choice's text and finish_reason, whole or (with body["stream"]) joined from the events."""
    with httpx.Client(base_url=server.url, timeout=120) as http:
        if not body.get("stream"):
            response = http.post(path, json=body)
            assert response.status_code == 200, response.text
            choices = response.json()["choices"]
            texts = [c["message"]["content"] if "message" in c else c["text"] for c in choices]
            return texts, [c["finish_reason"] for c in choices]
        with http.stream("POST", path, json=body) as response:
            assert response.status_code == 200
            found = events(response)
    n = body.get("n", 1)
    texts, reasons = [""] * n, [None] * n
    for event in found:
        for c in event["choices"]:
            texts[c["index"]] += c["delta"].get("content") or "" if "delta" in c else c["text"]
            reasons[c["index"]] = c["finish_reason"] or reasons[c["index"]]
    return texts, reasons


def assert_follows(texts: list[str], reasons: list[str], schema: dict) -> None:
    for text, reason in zip(texts, reasons, strict=True):
        assert reason == "stop", (text, reason)
        jsonschema.validate(json.loads(text), schema)


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("name", list(SCHEMAS))
def test_chat_replies_follow_the_schema(json_server, name, stream):
    """A random-weight Llama: left alone its replies are byte soup; constrained, each parses and validates."""
    body = dict(model="chat", messages=CHAT, max_tokens=300, n=3, seed=1, stream=stream)
    texts, reasons = request(json_server, "/v1/chat/completions", body | {"response_format": json_schema_format(name)})
    assert_follows(texts, reasons, SCHEMAS[name])
    plain, _ = request(json_server, "/v1/chat/completions", body)
    assert not any(_parses(t) for t in plain)  # what the constraint changed


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("name", ["nested", "array", "bounds"])
def test_completions_of_a_trained_run_follow_the_schema(json_server, name, stream):
    body = dict(model="json", prompt='{"name": "Romeo", "age": 3}\n', max_tokens=120, n=2, seed=4, stream=stream)
    texts, reasons = request(json_server, "/v1/completions", body | {"response_format": json_schema_format(name)})
    assert_follows(texts, reasons, SCHEMAS[name])


@pytest.mark.parametrize("stream", [False, True])
def test_json_mode_gives_a_json_object(json_server, stream):
    """The trained run (any JSON object: its records close), and the random Llama pushed towards
    the characters that close JSON (a bias that, unconstrained, gives no JSON at all)."""
    mode = {"type": "json_object"}
    body = dict(model="json", prompt="\n", max_tokens=100, n=2, seed=3, temperature=0.7, stream=stream)
    assert_follows(*request(json_server, "/v1/completions", body | {"response_format": mode}), {"type": "object"})
    closing = {str(i): 8 for i in token_ids(json_server, '}",0')}
    body = dict(model="chat", messages=CHAT, max_tokens=300, n=2, seed=3, logit_bias=closing, stream=stream)
    assert_follows(*request(json_server, "/v1/chat/completions", body | {"response_format": mode}), {"type": "object"})
    plain, _ = request(json_server, "/v1/chat/completions", body)
    assert not any(_parses(t) for t in plain)


RECORD = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer"},
        "tags": {"type": "array", "items": {"enum": ["king", "lover", "fool", "ghost"]}},
        "place": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "act": {"type": "integer"}},
            "required": ["city", "act"],
            "additionalProperties": False,
        },
    },
    "required": ["name", "age", "tags", "place"],
    "additionalProperties": False,
}


def test_greedy_json_of_a_trained_run_is_its_own_greedy_record(json_server):
    """Temperature 0: each token is the most likely of those the grammar allows. The trained run
    writes records that follow RECORD unconstrained, so constrained it writes the same record, token
    for token, and stops where the record ends."""
    fmt = {"type": "json_schema", "json_schema": {"name": "record", "schema": RECORD}}
    body = dict(model="json", prompt="\n", max_tokens=100, temperature=0)
    (free,), _ = request(json_server, "/v1/completions", body)
    record = free.split("\n")[0]
    jsonschema.validate(json.loads(record), RECORD)  # the model's own record already follows it
    assert request(json_server, "/v1/completions", body | {"response_format": fmt}) == ([record], ["stop"])


def token_ids(server, characters: str) -> list[int]:
    """The ids of the chat folder's one-character tokens for `characters` (its tokenizer.json)."""
    from tokenizers import Tokenizer

    from attnlab.serve.tokens import gpt2_byte_decoder

    folder = server.app.state.models["chat"].run
    tok = Tokenizer.from_str(folder.tokenizer.tokenizer.to_str())
    shown = {b: c for c, b in gpt2_byte_decoder().items()}
    return [tok.token_to_id(shown[ord(c)]) for c in characters]


class Place(pydantic.BaseModel):
    city: Literal["Verona", "Athens"]
    act: int


class Person(pydantic.BaseModel):
    name: str = pydantic.Field(max_length=8)
    place: Place


def test_the_openai_client_parses_a_pydantic_model(json_server):
    client = openai.OpenAI(base_url=f"{json_server.url}/v1", api_key="x", max_retries=0)
    answer = client.chat.completions.parse(
        model="chat", messages=CHAT, response_format=Person, max_tokens=300, seed=2, n=2
    )
    for choice in answer.choices:
        assert choice.finish_reason == "stop"
        assert isinstance(choice.message.parsed, Person)
        assert choice.message.parsed == Person.model_validate_json(choice.message.content)


def test_a_schema_that_never_ends_stops_at_max_tokens(json_server):
    schema = {"type": "object", "properties": {"a": {"type": "string", "minLength": 1000}}, "required": ["a"]}
    fmt = {"type": "json_schema", "json_schema": {"name": "long", "schema": schema}}
    for stream in (False, True):
        body = dict(model="chat", messages=CHAT, max_tokens=20, stream=stream, response_format=fmt)
        (text,), (reason,) = request(json_server, "/v1/chat/completions", body)
        assert reason == "length" and text.startswith('{"a": "')


BAD = [
    ({"type": "json_schema"}, "response_format.json_schema", "required with type json_schema"),
    ({"type": "json_schema", "json_schema": {"schema": {}}}, "response_format.json_schema.name", "required"),
    ({"type": "xml"}, "response_format.type", "Input should be"),
    (
        {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "objekt"}}},
        "response_format.json_schema.schema.type",
        "not valid JSON Schema",
    ),
    (
        {"type": "json_schema", "json_schema": {"name": "x", "schema": {"properties": {"a": {"minLength": "3"}}}}},
        "response_format.json_schema.schema.properties.a.minLength",
        "not valid JSON Schema",
    ),
    (
        {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "string", "pattern": "(("}}},
        "response_format.json_schema.schema.pattern",
        "not valid JSON Schema",
    ),
    (
        {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "string", "pattern": "^(?=a)a$"}}},
        "response_format.json_schema.schema",
        "cannot be compiled for constrained decoding",
    ),
    (
        {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "string", "format": "hostname-x"}}},
        "response_format.json_schema.schema",
        "cannot be compiled for constrained decoding",
    ),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {}, "strict": "yes"}}, "", "valid boolean"),
]


@pytest.mark.parametrize("fmt, param, fragment", BAD)
def test_bad_response_formats_are_a_400_naming_the_field(json_server, fmt, param, fragment):
    with httpx.Client(base_url=json_server.url, timeout=60) as http:
        for path, body in (("/v1/chat/completions", {"messages": CHAT}), ("/v1/completions", {"prompt": "{"})):
            model = "chat" if "chat" in path else "json"
            response = http.post(path, json={"model": model, "max_tokens": 5, "response_format": fmt, **body})
            assert_error(response, 400, param or "response_format.json_schema.strict", fragment)
        assert http.get("/healthz").status_code == 200


def test_a_constrained_row_leaves_the_other_rows_alone(json_server):
    """Greedy plain replies decoded beside constrained ones (one batch) are those decoded alone."""
    plain = dict(model="chat", messages=CHAT, max_tokens=40, temperature=0)
    (alone,), _ = request(json_server, "/v1/chat/completions", plain)
    constrained = plain | {
        "max_tokens": 300,
        "n": 4,
        "temperature": 1.0,
        "response_format": json_schema_format("nested"),
    }
    found = {}
    worker = threading.Thread(target=lambda: found.update(c=request(json_server, "/v1/chat/completions", constrained)))
    worker.start()
    besides = [request(json_server, "/v1/chat/completions", plain)[0][0] for _ in range(3)]
    worker.join()
    assert besides == [alone] * 3
    assert_follows(*found["c"], SCHEMAS["nested"])


def test_a_character_tokenizer_is_constrained_through_its_bytes():
    """The batcher's per-row hook with attnlab's character tokenizer (its vocabulary holds JSON's
    characters) and a random-weight GPT: constrained rows give valid JSON, the plain row beside them
    is the library's own greedy decoding."""
    from attnlab.data.tokenizers import CharTokenizer
    from attnlab.decode import greedy
    from attnlab.decode.batching import Batcher, Sequence
    from attnlab.decode.sampling import sampling_picker
    from attnlab.models import GPT, GPTConfig
    from attnlab.serve.structured import GrammarMask, _compile

    tok = CharTokenizer.train('{}[]",:0123456789-.abcdefghijklmnopqrstuvwxyz etrue false null\n')
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=tok.vocab_size, block_size=128, n_layers=2, n_heads=2, d_model=32)).eval()
    matcher = _compile(SCHEMAS["bounds"], tok)
    batcher = Batcher(model, 4)
    prompt = tok.encode("abc")
    rows = [
        Sequence(
            list(prompt),
            100,
            sampling_picker(1.0, generator=torch.Generator().manual_seed(i)),
            mask=GrammarMask(matcher.deep_copy()),
        )
        for i in range(3)
    ]
    plain = Sequence(list(prompt), 20)
    batcher.join_all([*rows, plain])
    while len(batcher):
        batcher.step()
    for seq in rows:
        assert seq.finish_reason == "stop"
        jsonschema.validate(json.loads(tok.decode(seq.tokens)), SCHEMAS["bounds"])
    assert plain.tokens == greedy(model, torch.tensor([prompt]), 20)[0, len(prompt) :].tolist()


def _parses(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


def test_a_vocabulary_that_cannot_write_json_is_a_400(client):
    """The shared character "lm" knows Tiny Shakespeare's characters: no "{"."""
    body = {"model": "lm", "prompt": "ROMEO:", "max_tokens": 5, "response_format": {"type": "json_object"}}
    assert_error(client.post("/v1/completions", json=body), 400, "response_format", "can start this JSON")
    assert client.post("/v1/completions", json={**body, "response_format": {"type": "text"}}).status_code == 200
