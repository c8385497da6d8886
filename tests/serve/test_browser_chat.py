"""The page's Chat tab in a real headless Chromium, on random-weight Llamas with Qwen2.5's chat
template (tests/serve/test_tools.py's server): the JSON-mode toggle sends `response_format`
json_object and the reply shown parses (the same greedy request without it does not); a tool
round trip: the tools typed on the page and a forced call, the call shown with its arguments,
its result typed and sent as a `tool` message after the assistant's `tool_calls`, and the answer
shown."""

import json

import jsonschema
import pytest

from serve.browser import (
    by_id,
    chromium,
    fill,
    missing,
    open_page,
    pick_model,
    pick_option,
    record_requests,
    sent,
    wait,
)

pytestmark = [pytest.mark.slow, pytest.mark.skipif(missing() is not None, reason=missing() or "")]
pytest.importorskip("llguidance")
test_tools = pytest.importorskip("serve.test_tools")  # needs transformers for the random-weight folders

CHAT = "/v1/chat/completions"
WEATHER = test_tools.WEATHER["function"]


@pytest.fixture(scope="module")
def tool_server(tmp_path_factory):
    with test_tools.serve_tool_models(tmp_path_factory.mktemp("browser-tools")) as server:
        yield server


@pytest.fixture
def page(tool_server):
    """The page on model "qwen" (Chat tab), recording what it sends."""
    with chromium() as driver:
        open_page(driver, tool_server.url, len(tool_server.folders))
        pick_model(driver, "qwen")
        record_requests(driver)
        yield driver
        errors = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
        assert errors == [], errors


def chat_done(driver, n: int) -> None:
    """Wait until the page has sent its n-th chat request and shown the whole reply."""
    wait(driver, lambda d: len(sent(d, CHAT)) == n and by_id(d, "conversation").get_attribute("data-state") == "idle")


def turns(driver, kind: str) -> list[str]:
    """The text of the conversation's items of one kind ("user", "assistant", "tool-call", "tool")."""
    return driver.execute_script(
        "return [...document.querySelectorAll('#conversation .turn.' + arguments[0])].map((t) => t.textContent)", kind
    )


def parses(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


def greedy(driver) -> None:
    driver.execute_script("document.getElementById('chat-temperature').value = '0'")


def test_json_mode_makes_the_reply_json(page):
    """Greedy, so that the two requests differ only in the toggle: byte soup without it, a JSON object with it."""
    greedy(page)
    fill(page, "chat-max-tokens", "60")
    for n, json_mode in enumerate([False, True], start=1):
        by_id(page, "chat-clear").click()
        if json_mode:
            by_id(page, "json-mode").click()
        fill(page, "message", "What say you, good sir?")
        by_id(page, "send").click()
        chat_done(page, n)
        (reply,) = turns(page, "assistant")
        body = sent(page, CHAT)[-1]
        assert body["temperature"] == 0 and "tools" not in body
        if json_mode:
            assert body["response_format"] == {"type": "json_object"}
            assert isinstance(json.loads(reply), dict)
            assert by_id(page, "conversation").get_attribute("data-finish") == "stop"
        else:
            assert "response_format" not in body and reply and not parses(reply)


def test_a_tool_round_trip_on_the_page(page):
    greedy(page)  # sampled, the random model's answer to the result may end at its first token
    fill(page, "message", "Weather in Paris?")
    page.find_element("css selector", "#tools-panel summary").click()

    # Tools that are not JSON: said so, nothing sent, the message stays to send again.
    fill(page, "tools", "[{")
    by_id(page, "send").click()
    wait(page, lambda d: by_id(d, "error").is_displayed())
    assert "Tools: not JSON" in by_id(page, "error").text and sent(page, CHAT) == []
    assert turns(page, "user") == [] and by_id(page, "message").get_attribute("value") == "Weather in Paris?"

    # A forced call of get_weather: shown as an item of its own, its arguments valid.
    fill(page, "tools", json.dumps(test_tools.TOOLS))
    pick_option(page, "tool-choice", "function:get_weather")
    by_id(page, "send").click()
    chat_done(page, 1)
    assert not by_id(page, "error").is_displayed()
    first = sent(page, CHAT)[0]
    assert first["tools"] == test_tools.TOOLS
    assert first["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
    assert by_id(page, "conversation").get_attribute("data-finish") == "tool_calls"
    (shown,) = turns(page, "tool-call")
    assert turns(page, "assistant") == []  # the reply is the call alone
    call = page.find_element("css selector", "#conversation .tool-call")
    arguments = call.find_element("css selector", ".body").text
    assert shown == "calls get_weather" + arguments
    jsonschema.validate(json.loads(arguments), WEATHER["parameters"])
    call_id = call.get_attribute("data-call-id")
    assert call_id and by_id(page, "conversation").get_attribute("data-waiting") == call_id
    assert by_id(page, "send").text == "Send result"
    assert "get_weather" in by_id(page, "message").get_attribute("placeholder")

    # Its result, typed in the message box: a tool message after the assistant's call; then the answer.
    fill(page, "message", "22 degrees, sunny")
    by_id(page, "send").click()
    chat_done(page, 2)
    assert not by_id(page, "error").is_displayed()
    assert turns(page, "tool") == ["get_weather returned22 degrees, sunny"]
    follow_up = sent(page, CHAT)[1]
    assert follow_up["messages"] == [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "tool_calls": [
            {"id": call_id, "type": "function", "function": {"name": "get_weather", "arguments": arguments}},
        ]},
        {"role": "tool", "tool_call_id": call_id, "content": "22 degrees, sunny"},
    ]  # fmt: skip
    assert follow_up["tools"] == test_tools.TOOLS and follow_up["tool_choice"] == "auto"
    (answer,) = turns(page, "assistant")
    assert answer and by_id(page, "conversation").get_attribute("data-finish") in ("stop", "length")
    assert by_id(page, "send").text == "Send" and by_id(page, "conversation").get_attribute("data-waiting") == ""
