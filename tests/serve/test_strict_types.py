"""OpenAI's types are strict: a string where a number or a boolean goes is a 400 naming the
field, never a value coerced ("3" taken for 3, "yes" for true). And every path answers with a
trailing slash as without it (it answered a POST with an empty 307)."""

import pytest

from serve.test_errors import assert_error

C = "/v1/completions"
WRONG_TYPES = [
    ({"max_tokens": "3"}, "max_tokens", "valid integer"),
    ({"stream": "yes"}, "stream", "valid boolean"),
    ({"stream": 1}, "stream", "valid boolean"),
    ({"echo": "true"}, "echo", "valid boolean"),
    ({"temperature": "0.5"}, "temperature", "valid number"),
    ({"n": 2.0}, "n", "valid integer"),
    ({"n": True}, "n", "valid integer"),
    ({"logprobs": "2"}, "logprobs", "valid integer"),
    ({"seed": "7"}, "seed", "valid integer"),
    ({"stream_options": {"include_usage": "yes"}}, "stream_options.include_usage", "valid boolean"),
    ({"logit_bias": {"3": "5"}}, "logit_bias.3", "valid number"),
    ({"response_format": {"type": "json_object", "json_schema": {"name": 3}}}, "response_format.json_schema.name", ""),
]


@pytest.mark.parametrize("fields, param, fragment", WRONG_TYPES, ids=[p for _, p, _ in WRONG_TYPES])
def test_a_value_of_the_wrong_type_is_a_400_naming_the_field(client, fields, param, fragment):
    assert_error(client.post(C, json={"model": "lm", "prompt": "ROMEO:", **fields}), 400, param, fragment)


def test_numbers_are_numbers_and_an_integer_is_a_number(client):
    body = {"model": "lm", "prompt": "ROMEO:", "max_tokens": 3, "temperature": 0, "top_p": 1, "stream": False}
    assert client.post(C, json=body).status_code == 200


CHAT_WRONG = [
    ({"max_completion_tokens": "3"}, "max_completion_tokens", "valid integer"),
    ({"logprobs": "true"}, "logprobs", "valid boolean"),
    ({"top_logprobs": "2", "logprobs": True}, "top_logprobs", "valid integer"),
    ({"stream": "yes"}, "stream", "valid boolean"),
]


@pytest.mark.parametrize("fields, param, fragment", CHAT_WRONG, ids=[p for _, p, _ in CHAT_WRONG])
def test_chat_fields_of_the_wrong_type_are_a_400_naming_the_field(json_server, fields, param, fragment):
    import httpx

    body = {"model": "chat", "messages": [{"role": "user", "content": "hi"}], **fields}
    assert_error(httpx.post(f"{json_server.url}/v1/chat/completions", json=body), 400, param, fragment)
    bad_message = {"model": "chat", "messages": [{"role": "user", "content": 5}]}
    response = httpx.post(f"{json_server.url}/v1/chat/completions", json=bad_message)
    assert_error(response, 400, "messages[0].content")


def test_every_path_answers_with_a_trailing_slash(client):
    body = {"model": "lm", "prompt": "ROMEO:", "max_tokens": 8, "temperature": 0}
    plain, slashed = client.post(C, json=body), client.post(C + "/", json=body, follow_redirects=False)
    assert slashed.status_code == 200, slashed.text
    assert slashed.json()["choices"] == plain.json()["choices"]
    assert client.get("/v1/models/").json() == client.get("/v1/models").json()
    streamed = client.post(C + "/", json={**body, "stream": True}, follow_redirects=False)
    assert streamed.status_code == 200 and streamed.text.rstrip().endswith("data: [DONE]")
    assert_error(client.post(C + "/", json={"model": "lm", "max_tokens": "3"}), 400, "max_tokens")
    assert "/v1/completions/" not in client.get("/openapi.json").json()["paths"]  # documented once
