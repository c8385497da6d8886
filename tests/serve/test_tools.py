"""Tool calls in chat (`attnlab.serve.tools`): the published templates of Qwen2.5, Qwen3, Llama 3.1,
Llama 3.2, Mistral 7B v0.3 and Mistral Nemo (`serve.tool_templates`) render tools, calls and results
as transformers' `apply_chat_template(..., tools=)` does; a call as each template writes it, and
replies in each format, are read back into OpenAI's `tool_calls` (malformed ones stay
content), streamed as OpenAI streams them; `tool_choice` "required" and a named function make a
random-weight model write a valid call, which the openai client receives, answers with a `tool`
message and gets a reply to; bad tool fields are a 400 naming the field."""

import contextlib
import json
import random

import httpx
import jinja2
import jsonschema
import openai
import pytest
import torch

from attnlab.serve import tools
from attnlab.serve.chat_template import read_chat_template
from attnlab.serve.schemas import ChatCompletionRequest
from serve.test_chat import chat_config
from serve.test_chat_template import folder_with
from serve.test_errors import assert_error
from serve.tool_templates import LLAMA31, LLAMA32, MISTRAL03, MISTRAL_NEMO, QWEN3, QWEN25

pytestmark = pytest.mark.slow

transformers = pytest.importorskip("transformers")
pytest.importorskip("llguidance")

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city <today> & tomorrow",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 10},
                "unit": {"enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {
            "type": "object",
            "properties": {"zone": {"type": "integer", "minimum": -12, "maximum": 14}},
            "required": ["zone"],
            "additionalProperties": False,
        },
    },
}
TOOLS = [WEATHER, TIME]
FORMATS = {
    "qwen": (QWEN25, tools.HERMES),
    "qwen3": (QWEN3, tools.HERMES),
    "llama3": (LLAMA31, tools.LLAMA3),
    "llama32": (LLAMA32, tools.LLAMA3),
    "mistral": (MISTRAL03, tools.MISTRAL),
    "mistral_nemo": (MISTRAL_NEMO, tools.MISTRAL_NEMO),
}


def conversation(call_id: str, result: str = "22 degrees, sunny") -> list[dict]:
    """A user asks, the assistant calls get_weather (OpenAI's shape: arguments as JSON text), the tool answers."""
    call = {"id": call_id, "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Köln"}'}}
    return [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Köln?"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "content": result, "tool_call_id": call_id},
    ]


def for_transformers(messages: list[dict], call_content: str | None = "") -> list[dict]:
    """The messages as transformers' templates take them: a call's arguments as a dict, no None
    values; a call turn's null content `call_content` (vLLM passes "": Qwen3's template needs a
    string there; None: left out)."""
    out = []
    for m in messages:
        if m.get("tool_calls") and m.get("content") is None:
            m = {**m, "content": call_content}
        m = {k: v for k, v in m.items() if v is not None}
        if "tool_calls" in m:
            m["tool_calls"] = [
                {**c, "function": {**c["function"], "arguments": json.loads(c["function"]["arguments"])}}
                for c in m["tool_calls"]
            ]
        out.append(m)
    return out


def ours(folder, messages: list[dict], tool_list, add_generation_prompt=True) -> list[int]:
    """The ids attnlab's server renders for a request's messages and tools."""
    from attnlab.models.hf._common import load_tokenizer

    body = ChatCompletionRequest.model_validate({"model": "m", "messages": messages, "tools": tool_list})
    rendered = [tools.template_message(body.messages, i, m.text()) for i, m in enumerate(body.messages)]
    tokenizer = load_tokenizer(folder / "tokenizer.json")
    template = read_chat_template(folder, tokenizer.decode)
    return template.encode(
        tokenizer, rendered, add_generation_prompt=add_generation_prompt, tools=tools.template_tools(body)
    )


def theirs(folder, messages: list[dict], tool_list, add_generation_prompt=True, call_content="") -> list[int]:
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    out = tok.apply_chat_template(
        for_transformers(messages, call_content),
        tools=tool_list,
        add_generation_prompt=add_generation_prompt,
        tokenize=True,
    )
    return list(out["input_ids"] if hasattr(out, "keys") else out)


@pytest.mark.parametrize("family", list(FORMATS))
@pytest.mark.parametrize("turns", [2, 4])
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_tools_calls_and_results_render_as_apply_chat_template(tmp_path, family, turns, add_generation_prompt):
    template, fmt = FORMATS[family]
    folder = folder_with(tmp_path, template)
    messages = conversation("A1b2C3d4E")[:turns]
    want = theirs(folder, messages, TOOLS, add_generation_prompt)
    assert ours(folder, messages, TOOLS, add_generation_prompt) == want
    text = transformers.AutoTokenizer.from_pretrained(folder).decode(want)
    assert "get_time" in text and "<today> & tomorrow" in text  # the tools are in the prompt, unescaped
    if turns == 4:
        assert "22 degrees, sunny" in text and "Köln" in text
        if family != "qwen3":  # "" for a call turn's null content renders as leaving it out
            assert theirs(folder, messages, TOOLS, add_generation_prompt, call_content=None) == want
        else:  # Qwen3's template reads the content as a string: a call turn without one fails
            with pytest.raises(jinja2.exceptions.UndefinedError):
                theirs(folder, messages, TOOLS, add_generation_prompt, call_content=None)
    assert tools.format_of(template) is fmt


def test_without_tools_the_templates_render_as_before(tmp_path):
    messages = conversation("A1b2C3d4E")[:2]
    for i, (template, _) in enumerate(FORMATS.values()):
        folder = folder_with(tmp_path / str(i), template)
        assert ours(folder, messages, None) == theirs(folder, messages, None)


# Where the assistant's turn opens and ends in each family's rendering.
TURNS = {
    "qwen": ("<|im_start|>assistant\n", "<|im_end|>"),
    "llama3": ("<|start_header_id|>assistant<|end_header_id|>\n\n", "<|eot_id|>"),
    "mistral": ("[/INST]", "</s>"),
}
TURNS |= {"qwen3": TURNS["qwen"], "llama32": TURNS["llama3"], "mistral_nemo": TURNS["mistral"]}
KOELN = {"id": "A1b2C3d4E", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Köln"}'}}
ZONE = {"id": "Z9y8X7w6V", "type": "function", "function": {"name": "get_time", "arguments": '{"zone": -3}'}}


@pytest.mark.parametrize("family", list(FORMATS))
def test_a_call_as_the_template_writes_it_is_read_back(tmp_path, family):
    """The assistant's turn that transformers renders for a turn with tool_calls (the model's
    training text for a call) is read back, whole and streamed, into those calls: OpenAI's shape,
    arguments as JSON text. Two calls where the template renders several (Llama 3's refuse them)."""
    template, fmt = FORMATS[family]
    calls = [KOELN] if family.startswith("llama") else [KOELN, ZONE]
    messages = [*conversation("A1b2C3d4E")[:2], {"role": "assistant", "content": None, "tool_calls": calls}]
    tok = transformers.AutoTokenizer.from_pretrained(folder_with(tmp_path, template))
    text = tok.apply_chat_template(for_transformers(messages), tools=TOOLS, tokenize=False)
    opening, end = TURNS[family]
    reply = text.rsplit(opening, 1)[1]
    assert reply.rstrip("\n").endswith(end)
    reply = reply[: reply.rindex(end)]
    want = [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls]
    content, found = tools.parse(reply, fmt)
    assert [(c.function.name, json.loads(c.function.arguments)) for c in found] == want
    # Qwen3 renders the latest call turn with its (empty) thinking, which stays content
    assert content == ("<think>\n\n</think>" if family == "qwen3" else None)
    # a forced reply wraps its calls as the template does
    calls_text = reply.removeprefix("<think>\n\n</think>\n\n")
    assert calls_text.startswith(fmt.opening) and calls_text.endswith(fmt.closing)
    assert calls_text.count("}" + fmt.joining + "{") == len(calls) - 1  # (no object nests in these arguments)
    stream = tools.ToolStream(fmt)
    deltas = [d for piece in reply for d in stream.feed(piece)] + stream.finish()
    streamed: dict[int, list] = {}
    for call in (c for d in deltas for c in d.get("tool_calls", [])):
        name, arguments = streamed.setdefault(call["index"], [call["function"].get("name"), ""])
        streamed[call["index"]][1] += call["function"]["arguments"]
    assert [(name, json.loads(arguments)) for name, arguments in streamed.values()] == want


# -- reading replies -----------------------------------------------------------------------------

ARGS = '{"city": "Paris", "days": [1, {"deep": "}]"}]}'
REPLIES = [
    # (format, reply, content, [(name, arguments)])
    (tools.HERMES, f'<tool_call>\n{{"name": "get_weather", "arguments": {ARGS}}}\n</tool_call>', None,
     [("get_weather", ARGS)]),
    (tools.HERMES, 'Let me look.\n<tool_call>\n{"name": "a", "arguments": {}}\n</tool_call>\n<tool_call>\n'
     '{"arguments": {"x": 1}, "name": "b"}\n</tool_call>', "Let me look.", [("a", "{}"), ("b", '{"x": 1}')]),
    (tools.HERMES, 'No tools today, <tool_response> maybe.', 'No tools today, <tool_response> maybe.', []),
    (tools.HERMES, '<tool_call>\n{"name": "a", "arguments": {"x": }\n</tool_call>', None, None),
    (tools.HERMES, '<tool_call>\n{"name": "a", "arguments": "x=1"}\n</tool_call>', None, None),
    (tools.HERMES, '<tool_call>\n{"arguments": {}}\n</tool_call>', None, None),
    (tools.HERMES, '<tool_call>\n{"name": "a", "arguments": {}}\n</tool_call> and then some words', None, None),
    (tools.HERMES, '<tool_call>\n{"name": "a", "arguments": {"x": "unfinished', None, None),
    (tools.LLAMA3, f'{{"name": "get_weather", "parameters": {ARGS}}}', None, [("get_weather", ARGS)]),
    (tools.LLAMA3, f'<|python_tag|>{{"name": "get_weather", "parameters": {ARGS}}}', None, [("get_weather", ARGS)]),
    (tools.LLAMA3, ' {"name": "a", "parameters": {}}; {"name": "b", "parameters": {"y": [2]}}', None,
     [("a", "{}"), ("b", '{"y": [2]}')]),
    (tools.LLAMA3, 'The weather is {"fine"}.', 'The weather is {"fine"}.', []),
    (tools.LLAMA3, '{"name": "a", "parameters": {"x": 1}', None, None),
    (tools.LLAMA3, '{"city": "Paris"}', None, None),
    (tools.MISTRAL, f'[TOOL_CALLS] [{{"name": "get_weather", "arguments": {ARGS}}}]', None, [("get_weather", ARGS)]),
    (tools.MISTRAL, 'Sure. [TOOL_CALLS] [{"name": "a", "arguments": {}}, {"name": "b", "arguments": {"z": null}}]',
     "Sure.", [("a", "{}"), ("b", '{"z": null}')]),
    (tools.MISTRAL, '[TOOL_CALLS] [{"name": "a", "arguments": {]', None, None),
    (tools.MISTRAL, '[TOOL_CALLS] [{"name": 3, "arguments": {}}]', None, None),
]  # fmt: skip


@pytest.mark.parametrize("fmt, reply, content, calls", REPLIES)
def test_replies_are_read_into_openais_tool_calls(fmt, reply, content, calls):
    """Each format's calls come out as (name, arguments text); a reply whose calls do not parse is
    all content, without calls."""
    found_content, found = tools.parse(reply, fmt)
    if calls is None:  # malformed: plain content
        assert (found_content, found) == (reply, [])
        return
    assert found_content == (reply if not calls else content)
    assert [(c.function.name, c.function.arguments) for c in found] == calls
    for call in found:
        want = dict(calls)[call.function.name]
        assert call.type == "function" and json.loads(call.function.arguments) == json.loads(want)
        assert len({c.id for c in found}) == len(found)
        if fmt is tools.MISTRAL:
            assert len(call.id) == 9 and call.id.isalnum()
        else:
            assert call.id.startswith("call_")


@pytest.mark.parametrize("incremental", [False, True])
@pytest.mark.parametrize("fmt, reply, content, calls", REPLIES)
def test_streamed_deltas_add_up_to_the_whole_reply(fmt, reply, content, calls, incremental):
    """Fed in random pieces, a reply's deltas give the same content and calls as the whole reply:
    a call's first delta holds its index, id, type and name, the later ones arguments only. The
    incremental stream (a forced reply, which a grammar keeps well formed) is checked on replies
    that parse."""
    if incremental and calls is None:
        pytest.skip("a forced reply parses")
    rng = random.Random(len(reply))
    stream, deltas, at = tools.ToolStream(fmt, incremental), [], 0
    while at < len(reply):
        step = rng.randint(1, 4)
        deltas += stream.feed(reply[at : at + step])
        at += step
    deltas += stream.finish()
    text = "".join(d.get("content", "") for d in deltas)
    got: dict[int, list] = {}
    for d in deltas:
        for call in d.get("tool_calls", []):
            if call["index"] not in got:
                assert set(call) == {"index", "id", "type", "function"} and call["function"]["arguments"] == ""
                got[call["index"]] = [call["function"]["name"], ""]
            else:
                assert set(call) == {"index", "function"} and set(call["function"]) == {"arguments"}
                got[call["index"]][1] += call["function"]["arguments"]
    assert stream.called == bool(calls)
    if not calls:
        assert text == reply and not got
    else:
        assert text.strip() == (content or "") and [tuple(got[i]) for i in sorted(got)] == calls


# -- the forced call ---------------------------------------------------------------------------


def tool_folder(folder, template: str):
    """A random-weight two-layer Llama (seed 0) with 2048 positions (a template's tool prompt is
    long in the test tokenizer's tokens) and `template`."""
    from hf_folders import BOS, EOS, write_tokenizer

    folder.mkdir(parents=True)
    tok = write_tokenizer(folder)
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=tok.get_vocab_size(),
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        bos_token_id=BOS,
        eos_token_id=EOS,
    )
    transformers.LlamaForCausalLM(config).eval().save_pretrained(folder)
    chat_config(folder, template)
    return folder


@contextlib.contextmanager
def serve_tool_models(root):
    """A live server over random-weight Llamas with the published tool templates of `FORMATS` and
    (no tool format) Zephyr's; `server.folders` by name."""
    from attnlab.serve.app import create_app
    from attnlab.serve.limits import Limits
    from attnlab.serve.registry import load_runs
    from attnlab.serve.server import BackgroundServer
    from serve.test_chat_template import ZEPHYR

    names = {**{family: template for family, (template, _) in FORMATS.items()}, "zephyr": ZEPHYR}
    runs = load_runs([f"{n}={tool_folder(root / n, t)}" for n, t in names.items()])
    limits = Limits(max_tokens=300, max_n=4, max_batch=8, max_text_chars=2000)
    with BackgroundServer(create_app(runs, limits=limits)) as server:
        server.folders = {n: root / n for n in names}
        yield server


@pytest.fixture(scope="module")
def tool_server(tmp_path_factory):
    with serve_tool_models(tmp_path_factory.mktemp("tools")) as server:
        yield server


@pytest.fixture(scope="module")
def client(tool_server):
    return openai.OpenAI(base_url=f"{tool_server.url}/v1", api_key="x", max_retries=0)


ASK = [{"role": "user", "content": "Weather in Köln?"}]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}


def assert_valid_calls(message, names=tuple(SCHEMAS)) -> None:
    assert message.tool_calls
    for call in message.tool_calls:
        assert call.type == "function" and call.function.name in names
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])


CHOICES = [("required", tuple(SCHEMAS)), ({"type": "function", "function": {"name": "get_time"}}, ("get_time",))]


@pytest.mark.parametrize("model", list(FORMATS))
@pytest.mark.parametrize("choice, names", CHOICES, ids=["required", "named"])
def test_a_forced_call_is_a_valid_call(client, model, choice, names):
    """A random-weight model writes byte soup; forced, each choice is one valid call."""
    answer = client.chat.completions.create(
        model=model, messages=ASK, tools=TOOLS, tool_choice=choice, parallel_tool_calls=False, n=3, seed=1,
        max_tokens=250,
    )  # fmt: skip
    for c in answer.choices:
        assert c.finish_reason == "tool_calls", c.message.content
        assert c.message.content is None and len(c.message.tool_calls) == 1
        assert_valid_calls(c.message, names)
    free = client.chat.completions.create(model=model, messages=ASK, tools=TOOLS, n=2, seed=1, max_tokens=60)
    assert all(c.message.tool_calls is None and c.finish_reason != "tool_calls" for c in free.choices)


def test_parallel_calls_end_where_the_model_ends_them(client):
    """parallel_tool_calls (the default): any number of calls; the end-of-text token, pushed up,
    is taken as soon as the grammar allows it, after the first call."""
    answer = client.chat.completions.create(
        model="qwen", messages=ASK, tools=TOOLS, tool_choice="required", seed=3, max_tokens=250,
        logit_bias={"1": 30},
    )  # fmt: skip
    (choice,) = answer.choices
    assert choice.finish_reason == "tool_calls" and len(choice.message.tool_calls) == 1
    assert_valid_calls(choice.message)


@pytest.mark.parametrize("model", ["qwen", "mistral", "mistral_nemo"])
def test_a_streamed_forced_call_is_the_whole_calls_deltas(client, model):
    """Streamed as OpenAI streams calls: the first delta names the call, the others carry its
    arguments in pieces; together, what the same seed gives whole."""
    body = dict(model=model, messages=ASK, tools=TOOLS, tool_choice="required", parallel_tool_calls=False, seed=5)
    whole = client.chat.completions.create(**body, max_tokens=250, temperature=0.8)
    chunks = list(client.chat.completions.create(**body, max_tokens=250, temperature=0.8, stream=True))
    calls = [t for c in chunks for t in (c.choices[0].delta.tool_calls or []) if c.choices]
    assert calls[0].id and calls[0].function.name and calls[0].function.arguments == ""
    assert all(t.index == 0 and t.id is None and t.function.name is None for t in calls[1:])
    assert len(calls) > 3  # the arguments come in pieces, not at once
    (want,) = whole.choices[0].message.tool_calls
    assert calls[0].function.name == want.function.name
    assert "".join(t.function.arguments for t in calls) == want.function.arguments
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"


@pytest.mark.parametrize("model", ["qwen", "qwen3"])
def test_a_tool_round_trip_with_the_openai_client(client, tool_server, model):
    """The model calls get_weather; the client runs it and sends the result back as a tool
    message (the call turn without content: Qwen3's template needs "" there); the model
    answers. The prompt of the second request is apply_chat_template's, tool result included (its
    token count), and a longer result makes a longer prompt."""
    messages = [{"role": "system", "content": "Be brief."}, *ASK]
    named = {"type": "function", "function": {"name": "get_weather"}}
    first = client.chat.completions.create(
        model=model, messages=messages, tools=TOOLS, tool_choice=named, max_tokens=250, seed=7
    )
    (call,) = first.choices[0].message.tool_calls
    assert call.function.name == "get_weather"
    turn = first.choices[0].message.model_dump(exclude_none=True)
    counts = []
    for result in ("22 degrees", "22 degrees, sunny, with a light breeze from the west"):
        conversation = [*messages, turn, {"role": "tool", "tool_call_id": call.id, "content": result}]
        answer = client.chat.completions.create(model=model, messages=conversation, tools=TOOLS, max_tokens=20, seed=1)
        (choice,) = answer.choices
        assert isinstance(choice.message.content, str) and choice.finish_reason in ("stop", "length")
        want = theirs(tool_server.folders[model], conversation, TOOLS)
        assert answer.usage.prompt_tokens == len(want)
        text = transformers.AutoTokenizer.from_pretrained(tool_server.folders[model]).decode(want)
        assert f"<tool_response>\n{result}\n</tool_response>" in text and call.function.arguments in text
        counts.append(answer.usage.prompt_tokens)
    assert counts[1] > counts[0]


def test_tool_choice_none_reads_the_reply_as_text(tool_server):
    with httpx.Client(base_url=tool_server.url, timeout=60) as http:
        body = {"model": "qwen", "messages": ASK, "tools": TOOLS, "tool_choice": "none", "max_tokens": 10}
        choice = http.post("/v1/chat/completions", json=body).json()["choices"][0]
    assert choice["message"]["tool_calls"] is None and isinstance(choice["message"]["content"], str)


CALL = {"id": "A1b2C3d4E", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}


def calling(arguments: str) -> list[dict]:
    """The question and an assistant turn that calls with `arguments`."""
    return [*ASK, {"role": "assistant", "tool_calls": [{**CALL, "function": {"name": "f", "arguments": arguments}}]}]


BAD = [
    ({"tools": [{"type": "function", "function": {"description": "no name"}}]}, "tools[0].function.name", "required"),
    ({"tools": [{"type": "function", "function": {"name": "a b"}}]}, "tools[0].function.name", "pattern"),
    ({"tools": [{"type": "code", "function": {"name": "a"}}]}, "tools[0].type", "'function'"),
    ({"tools": [WEATHER, WEATHER]}, "tools[1].function.name", "names two tools"),
    ({"tools": [{"type": "function", "function": {"name": "a", "parameters": {"type": "objekt"}}}]},
     "tools[0].function.parameters.type", "not valid JSON Schema"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "get_wether"}}},
     "tool_choice.function.name", "no tool 'get_wether'"),
    ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice", "Input should be"),
    ({"tool_choice": "required"}, "tool_choice", "needs tools"),
    ({"tools": TOOLS, "parallel_tool_calls": "yes"}, "parallel_tool_calls", "valid boolean"),
    ({"messages": [*ASK, {"role": "tool", "content": "22"}]}, "messages[1].tool_call_id", "required in a tool message"),
    ({"messages": [*ASK, {"role": "tool", "content": "22", "tool_call_id": "nope"}]}, "messages[1].tool_call_id",
     "no earlier assistant turn made a call with id 'nope'"),
    ({"messages": calling("{x")},
     "messages[1].tool_calls[0].function.arguments", "not JSON"),
    ({"messages": calling("[]")},
     "messages[1].tool_calls[0].function.arguments", "must be a JSON object"),
    ({"messages": [{"role": "user", "content": "hi", "tool_calls": [CALL]}]}, "messages[0].tool_calls",
     "only an assistant's turn"),
    ({"messages": [{"role": "assistant"}]}, "messages[0].content", "required"),
    ({"model": "zephyr", "tools": TOOLS}, "tools", "teaches no tool-call format"),
    ({"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}}, "tool_choice",
     "cannot also follow response_format"),
]  # fmt: skip


@pytest.mark.parametrize("fields, param, fragment", BAD)
def test_bad_tool_fields_are_a_400_naming_the_field(tool_server, fields, param, fragment):
    with httpx.Client(base_url=tool_server.url, timeout=60) as http:
        body = {"model": "qwen", "messages": ASK, "max_tokens": 3, **fields}
        assert_error(http.post("/v1/chat/completions", json=body), 400, param, fragment)
        assert http.get("/healthz").status_code == 200


def test_random_tool_bodies_never_break_the_server(tool_server):
    """Chat bodies with random tool fields (from good and bad values): a 200 or a 400, never a 500."""
    from serve.test_errors import random_value

    rng = random.Random(56)
    values = {
        "tools": [TOOLS, [WEATHER], [], None, [{"type": "function", "function": {}}], [{"function": WEATHER}]],
        "tool_choice": ["auto", "none", "required", {"type": "function", "function": {"name": "get_time"}}, {}, 3],
        "parallel_tool_calls": [True, False, None, 1],
        "messages": [ASK, conversation("call_1"), conversation("A1b2C3d4E")[1:], [{"role": "tool"}], []],
        "stream": [True, False],
        "n": [1, 2],
    }
    with httpx.Client(base_url=tool_server.url, timeout=120) as http:
        for _ in range(60):
            body = {"model": rng.choice(["qwen", "llama3", "mistral", "zephyr"]), "max_tokens": 8}
            for name, options in values.items():
                if rng.random() < 0.6:
                    body[name] = rng.choice(options) if rng.random() < 0.8 else random_value(rng)
            body.setdefault("messages", ASK)
            response = http.post("/v1/chat/completions", json=body)
            assert response.status_code in (200, 400), (body, response.text)
            if response.status_code == 400:
                assert_error(response, 400, response.json()["error"]["param"])
        assert http.get("/healthz").json() == {"status": "ok"}
