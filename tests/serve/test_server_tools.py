"""Server-side tools (`attnlab serve --tools calculator`, `attnlab.serve.server_tools`), through the
openai client against a live server, on a tiny chat run trained in the test to memorize one
conversation with a calculator call: the server answers the call and continues the same reply, so
the client gets the final answer as plain content (streamed or not, every choice of n, the
Responses API too); the call and its answer are logged; a request's own tools turn the server's
off (the call goes back to the client); a reply cut inside its call stays text; an unknown tool
name is one line, exit 2."""

import logging

import openai
import pytest

from attnlab.cli import main
from tool_run import ANSWER, EXPRESSION, QUESTION, train_tool_run

pytestmark = pytest.mark.slow

ASK = [{"role": "user", "content": QUESTION}]
CALCULATOR = {
    "type": "function",
    "function": {
        "name": "calculator",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}},
    },
}


@pytest.fixture(scope="module")
def tool_run(tmp_path_factory):
    return train_tool_run(tmp_path_factory.mktemp("calls"))


@pytest.fixture(scope="module")
def server(tool_run):
    from attnlab.serve.app import create_app
    from attnlab.serve.limits import Limits
    from attnlab.serve.registry import load_runs
    from attnlab.serve.server import BackgroundServer

    runs = load_runs([f"calc={tool_run}"])
    with BackgroundServer(create_app(runs, limits=Limits(max_tokens=200, tools=("calculator",)))) as running:
        yield running


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0)


def answer_tokens(tool_run) -> int:
    """The tokens of the final answer and its end of turn, as the model wrote them."""
    from attnlab.train.load import load_any

    tokenizer = load_any(tool_run, command="chat").tokenizer
    return len(tokenizer.tokenizer.encode(ANSWER + "<|im_end|>", add_special_tokens=False).ids)


def test_the_server_answers_the_call_and_the_client_gets_the_final_answer(client, tool_run, caplog):
    caplog.set_level(logging.INFO, logger="attnlab.serve.server_tools")
    answer = client.chat.completions.create(model="calc", messages=ASK, temperature=0, n=2, max_tokens=200)
    for choice in answer.choices:
        assert choice.message.content == ANSWER and choice.message.tool_calls is None
        assert choice.finish_reason == "stop"
    logged = [r.getMessage() for r in caplog.records if r.name == "attnlab.serve.server_tools"]
    assert logged == [f"calc: [calculator] {EXPRESSION} = 4164"] * 2
    # Every token the model generated counts: each choice's call as well as its answer.
    assert answer.usage.completion_tokens > 2 * answer_tokens(tool_run)


def test_streamed_the_final_answer_streams_and_the_call_does_not(client):
    chunks = list(
        client.chat.completions.create(model="calc", messages=ASK, temperature=0, max_tokens=200, stream=True)
    )
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert "".join(d.content or "" for d in deltas) == ANSWER
    assert all(d.tool_calls is None for d in deltas)
    assert len([d for d in deltas if d.content]) > 1  # in pieces, as they come
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"


def test_a_requests_own_tools_are_the_clients_to_run(client):
    answer = client.chat.completions.create(model="calc", messages=ASK, tools=[CALCULATOR], temperature=0)
    (choice,) = answer.choices
    assert choice.finish_reason == "tool_calls" and choice.message.tool_calls[0].function.name == "calculator"


def test_a_reply_cut_inside_its_call_stays_text(client):
    answer = client.chat.completions.create(model="calc", messages=ASK, temperature=0, max_tokens=15)
    (choice,) = answer.choices
    assert choice.finish_reason == "length" and choice.message.content.startswith("<tool_call>{")


def test_an_unknown_server_tool_is_one_line(tool_run, capsys):
    pytest.importorskip("uvicorn")
    with pytest.raises(SystemExit) as e:
        main(["serve", str(tool_run), "--tools", "calculator,shell"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "no tool 'shell'; the tools are calculator" in err and "Traceback" not in err


def test_the_responses_api_gets_the_final_answer_too(client):
    answer = client.responses.create(model="calc", input=QUESTION, temperature=0, max_output_tokens=200)
    assert answer.output_text == ANSWER and answer.status == "completed"
