"""The calculator during generation (`attnlab.decode.tool_use`, `attnlab chat --tools calculator`),
on a tiny chat run trained in the test to memorize one conversation with a calculator call: the
call is answered by the calculator, the template's tool message and the next assistant header
are forced into the sequence, and the model goes on to its final answer. Bad calls (an unknown
tool, bad arguments, an expression the calculator refuses) are tool errors in the conversation,
never a crash; past the bound on calls a call stays text."""

import json
import os
import pty
import sys

import pytest

from attnlab.cli import main
from cli.test_chat import read_until
from tool_run import ANSWER, CONVERSATION, EXPRESSION, QUESTION, train_tool_run

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def tool_run(tmp_path_factory):
    return train_tool_run(tmp_path_factory.mktemp("calls"))


@pytest.fixture(scope="module")
def loaded(tool_run):
    from attnlab.cli.chat import chat_template
    from attnlab.train.load import load_any

    found = load_any(tool_run, command="chat")
    return found, chat_template(tool_run, found)


def reply(loaded, messages, new_tokens=200, **options):
    from attnlab.decode import greedy_picker
    from attnlab.decode.tool_use import reply_with_tools

    found, template = loaded
    items = reply_with_tools(found.model, found.tokenizer, template, messages, new_tokens, greedy_picker(), **options)
    return list(items)


def test_the_call_is_answered_and_the_answer_follows(loaded):
    """The reply: the calculator's answer forced in, then the memorized final answer. The sequence
    the model read for its final answer is the template's rendering of the whole exchange."""
    from attnlab.decode.tool_use import ToolResult, for_template

    found, template = loaded
    messages = [{"role": "user", "content": QUESTION}]
    items = reply(loaded, messages, context=found.model.config.block_size)
    (result,) = [i for i in items if isinstance(i, ToolResult)]
    assert result.name == "calculator" and json.loads(result.arguments) == {"expression": EXPRESSION}
    assert result.content == str(347 * 12) and result.summary() == f"{EXPRESSION} = 4164"
    assert "".join(i for i in items if isinstance(i, str)) == ANSWER  # no call text in what streams
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "assistant"]
    assert messages[2] == {"role": "tool", "tool_call_id": result.id, "content": "4164"}
    assert messages[1]["tool_calls"][0]["id"] == result.id and messages[1]["content"] is None
    assert messages[3] == {"role": "assistant", "content": ANSWER}
    rendered = template.render(for_template(messages), add_generation_prompt=False)
    assert "<|im_start|>tool\n4164<|im_end|>\n<|im_start|>assistant\n" + ANSWER + "<|im_end|>" in rendered
    # The conversation it trained on, exactly (the model's call, the calculator's answer, the answer).
    assert rendered == template.render(for_template(CONVERSATION), add_generation_prompt=False)


def test_without_tools_the_call_is_text(loaded):
    messages = [{"role": "user", "content": QUESTION}]
    items = reply(loaded, messages, tools={})
    assert all(isinstance(i, str) for i in items)
    text = "".join(items)
    assert text.startswith("<tool_call>") and text.endswith("</tool_call>") and EXPRESSION in text
    assert messages[-1] == {"role": "assistant", "content": text}


def test_the_token_budget_covers_the_call_and_the_answer(loaded):
    """max_new_tokens counts every token the model writes: a budget that holds the call and two
    more tokens ends the final answer after two tokens."""
    found, _ = loaded
    messages = [{"role": "user", "content": QUESTION}]
    text = "".join(reply(loaded, [dict(m) for m in messages], tools={}))  # the call, as text
    call_tokens = len(found.tokenizer.tokenizer.encode(text + "<|im_end|>", add_special_tokens=False).ids)
    items = reply(loaded, messages, call_tokens + 2)
    cut = "".join(i for i in items if isinstance(i, str))
    assert cut == messages[-1]["content"] and ANSWER.startswith(cut) and 0 < len(cut) < len(ANSWER)
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "assistant"]


def test_past_max_calls_a_call_stays_text(loaded):
    messages = [{"role": "user", "content": QUESTION}]
    items = reply(loaded, messages, max_calls=0)
    assert all(isinstance(i, str) for i in items) and "".join(items).startswith("<tool_call>")
    assert [m["role"] for m in messages] == ["user", "assistant"]


@pytest.mark.parametrize(
    "reply_text, want",
    [
        ('<tool_call>{"name": "calculator", "arguments": {"expression": "9**9**9"}}</tool_call>', "digits"),
        ('<tool_call>{"name": "calculator", "arguments": {"expression": "1/0"}}</tool_call>', "division by zero"),
        (
            '<tool_call>{"name": "calculator", "arguments": {"expression": "__import__(\'os\')"}}</tool_call>',
            "unknown function",
        ),
        ('<tool_call>{"name": "calculator", "arguments": {"expression": "().__class__"}}</tool_call>', "attributes"),
        ('<tool_call>{"name": "calculator", "arguments": {"expr": "1+1"}}</tool_call>', '{"expression"'),
        ('<tool_call>{"name": "calculator", "arguments": {"expression": 12}}</tool_call>', '{"expression"'),
        ('<tool_call>{"name": "shell", "arguments": {"command": "rm -rf /"}}</tool_call>', "no tool 'shell'"),
    ],
)
def test_bad_calls_get_error_answers(reply_text, want):
    from attnlab.decode.tool_calls import HERMES
    from attnlab.decode.tool_use import TOOLS, answer_calls

    added, (result,) = answer_calls("Let me compute. " + reply_text, HERMES, TOOLS)
    assert result.content.startswith("error: ") and want in result.content, result.content
    assert added[0]["content"] == "Let me compute." and added[1]["content"] == result.content


def test_a_reply_that_is_no_call_adds_nothing():
    from attnlab.decode.tool_calls import HERMES
    from attnlab.decode.tool_use import TOOLS, answer_calls

    for text in ("4164.", '<tool_call>{"name": "calculator", "arguments": {"expression": "1+1"</tool_call>'):
        assert answer_calls(text, HERMES, TOOLS) == ([], [])


def test_the_cli_names_its_tools_without_importing_torch():
    from attnlab.cli.chat import TOOL_NAMES
    from attnlab.decode.tool_use import TOOLS

    assert TOOL_NAMES == tuple(TOOLS)


def test_an_unknown_tool_is_one_line(tool_run, capsys):
    with pytest.raises(SystemExit) as e:
        main(["chat", str(tool_run), "--tools", "shell"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "no tool 'shell'; the tools are calculator" in err and "Traceback" not in err


def test_a_calculator_call_in_the_terminal(tool_run, tmp_path):
    """Through a pseudo-terminal: the call shows as a dim line with its answer, the final answer
    streams after it, and /save writes the call and the tool's answer as OpenAI's messages."""
    saved = tmp_path / "talk.jsonl"
    pid, fd = pty.fork()
    if pid == 0:
        command = ["chat", str(tool_run), "--tools", "calculator", "--temperature", "0", "-n", "200"]
        os.execv(sys.executable, [sys.executable, "-m", "attnlab", *command])
    read_until(fd, b">>> ")
    os.write(fd, f"{QUESTION}\n".encode())
    out = read_until(fd, b">>> ").partition(QUESTION.encode())[2]
    assert f"\x1b[2m[calculator] {EXPRESSION} = 4164\x1b[0m".encode() in out, out
    after = out.partition(b"4164\x1b[0m")[2]
    assert ANSWER.encode() in after and b"<tool_call>" not in out
    os.write(fd, f"/save {saved}\n".encode())
    assert b"(saved 4 messages" in read_until(fd, b">>> ")
    os.write(fd, b"/bye\n")
    _, status = os.waitpid(pid, 0)
    os.close(fd)
    assert os.WEXITSTATUS(status) == 0
    messages = json.loads(saved.read_text(encoding="utf-8"))["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "assistant"]
    call = messages[1]["tool_calls"][0]
    assert call["type"] == "function" and json.loads(call["function"]["arguments"]) == {"expression": EXPRESSION}
    assert messages[2]["content"] == "4164" and messages[3]["content"] == ANSWER
