"""`POST /v1/responses` through the openai client's `client.responses.create`, whole and streamed:
the prompt is the chat template's (instructions as a system turn, the input, a stored earlier
response's conversation), the output items are the chat path's reply (text, function calls, JSON
under `text.format`), the stream's events are OpenAI's and add up to the whole response; bad
fields are a 400 naming the field."""

import json

import httpx
import jsonschema
import openai
import pytest

from attnlab.serve.responses import ResponseStore
from serve.test_errors import assert_error
from serve.test_tools import SCHEMAS, serve_tool_models, theirs

pytest.importorskip("llguidance")


@pytest.fixture(scope="module")
def tool_server(tmp_path_factory):
    with serve_tool_models(tmp_path_factory.mktemp("responses")) as server:
        yield server


@pytest.fixture(scope="module")
def client(tool_server):
    return openai.OpenAI(base_url=f"{tool_server.url}/v1", api_key="x", max_retries=0)


WEATHER = {
    "type": "function",
    "name": "get_weather",
    "parameters": SCHEMAS["get_weather"],
}
CHAT_TOOLS = [{"type": "function", "function": {k: v for k, v in WEATHER.items() if k != "type"}}]
PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 8}, "age": {"type": "integer", "minimum": 0}},
    "required": ["name", "age"],
    "additionalProperties": False,
}


def prompt_tokens(server, messages, tools=None) -> int:
    return len(theirs(server.folders["qwen"], messages, tools))


def test_a_text_input_with_instructions(client, tool_server):
    answer = client.responses.create(
        model="qwen", input="Weather in Köln?", instructions="Be brief.", max_output_tokens=12, temperature=0
    )
    assert answer.object == "response" and answer.id.startswith("resp_")
    (item,) = answer.output
    assert item.type == "message" and item.role == "assistant" and item.content[0].type == "output_text"
    assert answer.output_text == item.content[0].text
    want = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather in Köln?"}]
    assert answer.usage.input_tokens == prompt_tokens(tool_server, want)
    assert (
        answer.usage.output_tokens <= 12
        and answer.usage.total_tokens == answer.usage.input_tokens + answer.usage.output_tokens
    )
    assert (answer.status, answer.incomplete_details) in (("completed", None),) or (
        answer.status == "incomplete" and answer.incomplete_details.reason == "max_output_tokens"
    )
    same = (
        client.chat.completions.create(model="qwen", messages=want, max_tokens=12, temperature=0)
        .choices[0]
        .message.content
    )
    assert answer.output_text == same  # the chat path's greedy reply


def test_the_stream_is_openais_events_and_adds_up_to_the_response(client):
    body = dict(model="qwen", input="Weather in Köln?", max_output_tokens=16, temperature=0)
    whole = client.responses.create(**body)
    events = list(client.responses.create(**body, stream=True))
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] in (
        "response.completed",
        "response.incomplete",
    )
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert kinds[2:5] == ["response.output_item.added", "response.content_part.added", "response.output_text.delta"]
    assert kinds[-5:-1] == [
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
    ]
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert len(deltas) > 3 and "".join(deltas) == whole.output_text
    assert events[-1].response.output_text == whole.output_text
    assert events[-1].response.usage.output_tokens == whole.usage.output_tokens


@pytest.mark.parametrize("stream", [False, True])
def test_a_forced_function_call_and_its_output(client, tool_server, stream):
    """tool_choice required: a function_call item; its output sent back (as input items, or after
    previous_response_id) gets a reply whose prompt holds the call and the result."""
    body = dict(model="qwen", input="Weather in Köln?", tools=[WEATHER], tool_choice="required", extra_body={"seed": 3})
    first = client.responses.create(**body, max_output_tokens=250, parallel_tool_calls=False, stream=stream)
    if stream:
        events = list(first)
        deltas = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
        first = events[-1].response
        assert "response.output_item.added" in [e.type for e in events]
        assert deltas == first.output[0].arguments
    (call,) = first.output
    assert call.type == "function_call" and call.name == "get_weather" and call.status == "completed"
    jsonschema.validate(json.loads(call.arguments), SCHEMAS["get_weather"])
    result = {"type": "function_call_output", "call_id": call.call_id, "output": "22 degrees"}
    chained = client.responses.create(
        model="qwen", previous_response_id=first.id, input=[result], tools=[WEATHER], max_output_tokens=5
    )
    spelled = client.responses.create(
        model="qwen",
        input=[
            {"role": "user", "content": "Weather in Köln?"},
            {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
            result,
        ],
        tools=[WEATHER],
        max_output_tokens=5,
    )
    messages = [
        {"role": "user", "content": "Weather in Köln?"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": call.call_id, "type": "function",
         "function": {"name": "get_weather", "arguments": call.arguments}}]},
        {"role": "tool", "content": "22 degrees", "tool_call_id": call.call_id},
    ]  # fmt: skip
    want = prompt_tokens(tool_server, messages, CHAT_TOOLS)
    assert chained.usage.input_tokens == spelled.usage.input_tokens == want


def test_text_format_gives_json_that_follows_the_schema(client):
    fmt = {"type": "json_schema", "name": "person", "schema": PERSON, "strict": True}
    for stream in (False, True):
        answer = client.responses.create(
            model="qwen",
            input="Who?",
            text={"format": fmt},
            max_output_tokens=200,
            extra_body={"seed": 1},
            stream=stream,
        )
        if stream:
            answer = list(answer)[-1].response
        assert answer.status == "completed"
        jsonschema.validate(json.loads(answer.output_text), PERSON)


def test_previous_response_id_carries_the_conversation_not_the_instructions(client, tool_server):
    first = client.responses.create(
        model="qwen", input="Hi.", instructions="Be brief.", max_output_tokens=6, extra_body={"seed": 1}
    )
    second = client.responses.create(model="qwen", previous_response_id=first.id, input="Again.", max_output_tokens=3)
    want = [
        {"role": "user", "content": "Hi."},
        {"role": "assistant", "content": first.output_text},
        {"role": "user", "content": "Again."},
    ]
    assert second.usage.input_tokens == prompt_tokens(tool_server, want)
    assert second.previous_response_id == first.id


def test_the_store_keeps_recent_responses_within_its_bounds():
    store = ResponseStore(count=2, characters=200)
    one = [{"role": "user", "content": "a"}]
    store.put("r1", one)
    store.put("r2", one)
    assert store.get("r1") == one  # r1 used last: r2 leaves first
    store.put("r3", one)
    assert store.get("r2") is None and store.get("r1") == one and store.get("r3") == one
    store.put("big", [{"role": "user", "content": "x" * 300}])  # larger than the bound: not kept
    assert store.get("big") is None and store.get("r3") == one
    store.put("r4", [{"role": "user", "content": "y" * 120}])  # past 200 characters with the others
    assert store.get("r4") is not None and store.get("r1") is None


BAD = [
    ({"previous_response_id": "resp_nope"}, "previous_response_id", "no response 'resp_nope' here"),
    ({"input": [{"type": "function_call_output", "call_id": "c1", "output": "x"}]}, "input[0].call_id",
     "no function_call with call_id 'c1'"),
    ({"input": [{"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{x"}]}, "input[0].arguments",
     "JSON object"),
    ({"tools": [{"type": "function", "description": "no name"}]}, "tools[0].name", "required"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "name": "nope"}}, "tool_choice.name", "no tool 'nope'"),
    ({"text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "objekt"}}}},
     "text.format.schema.type", "not valid JSON Schema"),
    ({"max_output_tokens": 10_000}, "max_output_tokens", "at most"),
    ({"input": []}, "input", "at least 1 item"),
    ({"stream": "yes"}, "stream", "valid boolean"),
    ({"model": "zephyr", "tools": [WEATHER]}, "tools", "teaches no tool-call format"),
]  # fmt: skip


@pytest.mark.parametrize("fields, param, fragment", BAD)
def test_bad_fields_are_a_400_naming_the_field(tool_server, fields, param, fragment):
    with httpx.Client(base_url=tool_server.url, timeout=60) as http:
        body = {"model": "qwen", "input": "hi", "max_output_tokens": 3, **fields}
        assert_error(http.post("/v1/responses", json=body), 400, param, fragment)
        assert http.get("/healthz").status_code == 200
