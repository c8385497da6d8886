"""`attnlab.Chat`, the Python face of `attnlab chat`, on the tiny chat run of tests/tool_run.py that
has memorized one conversation with a calculator call: the call is answered by the calculator and
the memorized answer follows; the history is OpenAI's chat messages; `reset` forgets it; a
conversation past the context is refused before anything is generated; `import attnlab` and
`attnlab.Chat` import no PyTorch."""

import dataclasses
import json
import shutil
import subprocess
import sys

import pytest

import attnlab
from attnlab.errors import UserError
from tool_run import ANSWER, CONVERSATION, EXPRESSION, QUESTION, train_tool_run

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def tool_run(tmp_path_factory):
    return train_tool_run(tmp_path_factory.mktemp("calls"))


def test_say_answers_the_call_and_keeps_the_history(tool_run):
    chat = attnlab.Chat(tool_run)
    assert chat.say(QUESTION) == ANSWER
    assert [m["role"] for m in chat.messages] == ["user", "assistant", "tool", "assistant"]
    (call,) = chat.messages[1]["tool_calls"]
    assert call["function"]["name"] == "calculator"
    assert json.loads(call["function"]["arguments"]) == {"expression": EXPRESSION}
    assert chat.messages[2] == {"role": "tool", "tool_call_id": call["id"], "content": str(347 * 12)}
    assert chat.messages[3] == {"role": "assistant", "content": ANSWER}
    # The exchange is the conversation it trained on, as its template renders it.
    from attnlab.decode.tool_use import for_template

    render = chat.template.render
    assert render(for_template(chat.messages), add_generation_prompt=False) == render(
        for_template(CONVERSATION), add_generation_prompt=False
    )


def test_stream_gives_the_pieces_and_the_tool_result(tool_run):
    from attnlab.decode.tool_use import ToolResult

    chat = attnlab.Chat(tool_run)
    items = list(chat.stream(QUESTION))
    (result,) = [i for i in items if isinstance(i, ToolResult)]
    assert result.summary() == f"{EXPRESSION} = 4164"
    texts = [i for i in items if isinstance(i, str)]
    assert len(texts) > 1 and "".join(texts) == ANSWER  # in pieces, the call's text held back


def test_without_tools_the_call_stays_text(tool_run):
    chat = attnlab.Chat(tool_run, tools=())
    text = chat.say(QUESTION)
    assert text.startswith("<tool_call>") and EXPRESSION in text
    assert chat.messages == [{"role": "user", "content": QUESTION}, {"role": "assistant", "content": text}]


def test_reset_forgets_all_but_the_system_prompt(tool_run):
    chat = attnlab.Chat(tool_run, system="Be brief.", max_new_tokens=3)
    chat.say(QUESTION)
    assert chat.messages[0] == {"role": "system", "content": "Be brief."} and len(chat.messages) > 2
    chat.reset()
    assert chat.messages == [{"role": "system", "content": "Be brief."}]
    assert "Be brief." in chat.template.render(chat.messages)


def test_a_conversation_past_the_context_is_refused_and_left_as_it_was(tool_run):
    chat = attnlab.Chat(tool_run)
    chat.say(QUESTION)
    before = [dict(m) for m in chat.messages]
    with pytest.raises(UserError, match=r"past the context of 256; reset\(\) it") as e:
        chat.say("9 " * 300)
    assert e.value.context == 256 and e.value.tokens > 256
    assert chat.messages == before


def test_a_loaded_model_chats_as_its_path_does(tool_run):
    from attnlab.train.load import load_any

    loaded = load_any(tool_run, command="chat")
    assert attnlab.Chat(loaded).say(QUESTION) == ANSWER
    with pytest.raises(UserError, match="carries no chat template; give Chat its path, or template="):
        attnlab.Chat(dataclasses.replace(loaded, chat_template=None))


def test_an_unknown_tool_is_refused_by_name(tool_run):
    from attnlab.decode.tool_use import TOOLS

    with pytest.raises(ValueError, match="no tool 'abacus'; the tools are " + ", ".join(TOOLS)):
        attnlab.Chat(tool_run, tools=("abacus",))


def test_a_run_without_a_template_is_refused_with_the_fix(tool_run, tmp_path):
    """A run whose chat template is gone: the fix that `attnlab chat` gives."""
    from attnlab.data.chat_templates import TEMPLATE_FILE

    bare = tmp_path / "bare"
    shutil.copytree(tool_run, bare)
    (bare / TEMPLATE_FILE).unlink()
    with pytest.raises(UserError, match=f"{bare} has no chat template; fine-tune it on conversations first"):
        attnlab.Chat(bare)


def test_importing_attnlab_and_naming_chat_import_no_torch():
    program = "import sys, attnlab; attnlab.Chat; print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"
