"""`attnlab serve` on Hugging Face causal-LM folders, and `POST /v1/chat/completions`, through the
official `openai` client against a live server: the reply is transformers' own greedy reply to
`apply_chat_template`'s ids; streamed and whole replies agree; multi-byte characters never arrive
in halves; bad conversations get a 400 naming the field; random bodies never break the server."""

import json
import os
import random
import re
import subprocess
import sys
from pathlib import Path

import httpx
import openai
import pytest
import torch

from attnlab.serve.app import create_app
from attnlab.serve.limits import Limits
from attnlab.serve.registry import load_runs
from attnlab.serve.server import BackgroundServer
from hf_folders import EOS, causal_lm_folder, hf_model, write_tokenizer
from serve.test_chat_template import LLAMA2, ZEPHYR
from serve.test_errors import assert_error, random_value

pytestmark = pytest.mark.slow

transformers = pytest.importorskip("transformers")

CHAT = "/v1/chat/completions"
TURNS = [
    {"role": "system", "content": "Thou art a player."},
    {"role": "user", "content": "ROMEO: What say you?"},
]
# The conversations nearly fill the models' 64 positions: their replies go on past the context, as
# transformers' generate does (test_context.py checks the default, which stops there).
LIMITS = Limits(max_tokens=40, max_n=4, max_text_chars=400, past_context=True)
# The reply of the scripted model (`byte_chain_folder`): an emoji and two CJK characters, one
# byte a token, so that 9 of its 10 token boundaries fall inside a character.
REPLY = "😀中文"
SRC = Path(__file__).parents[2] / "src"


def chat_config(folder, template) -> None:
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>"}
    if template is not None:
        config["chat_template"] = template
    (folder / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")


def byte_chain_folder(folder, starts: list[str]):
    """A Llama whose greedy continuation of any text ending in one of `starts` is REPLY and then
    </s>: attention and MLP outputs are zero, so the logits depend on the last token alone, and
    embedding row `t` and output row `next[t]` share a direction (a bigram table)."""
    folder.mkdir(parents=True)
    tok = write_tokenizer(folder)
    chain = tok.encode(REPLY, add_special_tokens=False).ids
    assert len(chain) == len(REPLY.encode()), "the reply's bytes are single tokens"
    keys = [tok.encode(s, add_special_tokens=False).ids[-1] for s in starts]
    table = {k: chain[0] for k in keys} | dict(zip(chain, [*chain[1:], EOS], strict=True))
    assert len(set(keys) | set(chain)) == len(keys) + len(chain)
    model = hf_model("llama", tok.get_vocab_size())
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("o_proj.weight", "down_proj.weight")):
                p.zero_()
        model.model.embed_tokens.weight.zero_()
        model.lm_head.weight.zero_()
        for i, (token, following) in enumerate(table.items()):
            model.model.embed_tokens.weight[token, i] = 1.0
            model.lm_head.weight[following, i] = 10.0
    model.save_pretrained(folder)
    chat_config(folder, ZEPHYR)
    return folder


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf")
    made = {}
    for name, family, template in (("llama", "llama", ZEPHYR), ("mixtral", "mixtral", LLAMA2), ("gpt2", "gpt2", None)):
        tok, model = causal_lm_folder(root / name, family)
        chat_config(root / name, template)
        made[name] = (root / name, tok, model)
    made["bytes"] = (byte_chain_folder(root / "bytes", ["你好", "<|assistant|>\n"]), None, None)
    return made


@pytest.fixture(scope="module")
def server(folders):
    runs = load_runs([f"{name}={path}" for name, (path, _, _) in folders.items()])
    with BackgroundServer(create_app(runs, limits=LIMITS)) as live:
        yield live


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="not-needed", max_retries=0)


@torch.no_grad()
def transformers_reply(folder, model, messages, n: int) -> tuple[str, int]:
    """transformers' greedy reply to apply_chat_template's ids (up to n tokens, to </s>), and the prompt's length."""
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
    out = model.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False, eos_token_id=EOS, pad_token_id=EOS)
    new = out[0, len(ids) :].tolist()
    new = new[: new.index(EOS)] if EOS in new else new
    # A character cut by the end (bytes that a random model strings together) is dropped by the server.
    return tok.decode(new, skip_special_tokens=False).rstrip("\ufffd"), len(ids)


def test_the_models_and_their_endpoints(client, server):
    cards = {m["id"]: m for m in httpx.get(f"{server.url}/v1/models").json()["data"]}
    assert cards["llama"]["endpoints"] == ["/v1/completions", CHAT, "/v1/attention"]
    assert cards["gpt2"]["endpoints"] == ["/v1/completions", "/v1/attention"]  # no template: no chat
    assert {m["task"] for m in cards.values()} == {"language-model"}
    assert {m["context"] for m in cards.values()} == {64}  # their positions, not the server's 4096


@pytest.mark.parametrize("name, messages", [("llama", TURNS), ("mixtral", TURNS[1:])])
def test_a_reply_is_transformers_greedy_reply(client, folders, name, messages):
    folder, _, model = folders[name]
    want, prompt_tokens = transformers_reply(folder, model, messages, 12)
    answer = client.chat.completions.create(model=name, messages=messages, max_tokens=12, temperature=0)
    assert answer.object == "chat.completion" and answer.id.startswith("chatcmpl-")
    (choice,) = answer.choices
    assert choice.message.role == "assistant" and choice.message.content == want and want
    assert answer.usage.prompt_tokens == prompt_tokens
    assert choice.finish_reason == ("length" if answer.usage.completion_tokens == 12 else "stop")


def test_a_streamed_reply_is_the_whole_reply_in_pieces(client):
    options = dict(model="llama", messages=TURNS, max_completion_tokens=30, temperature=0.9, seed=5, n=2)
    whole = client.chat.completions.create(**options)
    chunks = list(client.chat.completions.create(**options, stream=True, stream_options={"include_usage": True}))
    assert {c.object for c in chunks} == {"chat.completion.chunk"} and len({c.id for c in chunks}) == 1
    for i in range(2):
        deltas = [c.choices[0] for c in chunks if c.choices and c.choices[0].index == i]
        assert deltas[0].delta.role == "assistant" and deltas[0].delta.content == ""
        assert "".join(d.delta.content or "" for d in deltas) == whole.choices[i].message.content
        assert len([d for d in deltas if d.delta.content]) > 3
        assert [d.finish_reason for d in deltas][-1] == whole.choices[i].finish_reason
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    assert whole.choices[0].message.content != whole.choices[1].message.content  # seed + i


def test_a_stop_string_and_the_end_of_turn(client):
    first = client.chat.completions.create(model="llama", messages=TURNS, max_tokens=20, temperature=0)
    text = first.choices[0].message.content
    cut = next(c for c in text[1:] if c.strip())
    stopped = client.chat.completions.create(model="llama", messages=TURNS, max_tokens=20, temperature=0, stop=[cut])
    assert stopped.choices[0].message.content == text[: text.index(cut, 1)]
    assert stopped.choices[0].finish_reason == "stop"


@torch.no_grad()
def test_openai_fields_at_their_defaults_and_the_logit_bias(client, folders):
    """What clients such as LangChain send on every chat call is accepted and changes nothing; a
    bias of -100 on the greedy next token makes the reply transformers' second choice (the
    penalties' arithmetic is tested against OpenAI's definition in test_openai_fields)."""
    defaults = dict(presence_penalty=0, frequency_penalty=0, logit_bias={}, logprobs=False, user="u")
    options = dict(model="llama", messages=TURNS, max_tokens=1, temperature=0)
    plain = client.chat.completions.create(**options).choices[0].message.content
    assert client.chat.completions.create(**options, **defaults).choices[0].message.content == plain
    folder, _, model = folders["llama"]
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    ids = tok.apply_chat_template(TURNS, add_generation_prompt=True, tokenize=True)
    ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
    best, second = model(torch.tensor([ids])).logits[0, -1].topk(2).indices.tolist()
    assert plain == tok.decode([best]).rstrip("\ufffd")
    biased = client.chat.completions.create(**options, logit_bias={str(best): -100}).choices[0].message.content
    assert biased == tok.decode([second]).rstrip("\ufffd")


# -- multi-byte characters -------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
def test_emoji_and_cjk_never_arrive_in_halves(client, stream):
    """The scripted model writes REPLY one byte a token: through completions and chat, streamed
    and not, the text is REPLY, with no U+FFFD in any piece; a reply cut inside a character by
    max_tokens ends before it."""

    def reply(choice):
        return choice.delta.content if stream else choice.message.content

    asks = [
        (client.completions.create, dict(prompt="KING: 你好"), lambda c: c.text),
        (client.chat.completions.create, dict(messages=[{"role": "user", "content": "你好 😀"}]), reply),
    ]
    for create, options, text in asks:
        for max_tokens, want in ((40, REPLY), (len("😀中".encode()) + 1, "😀中")):
            answer = create(model="bytes", max_tokens=max_tokens, temperature=0, stream=stream, **options)
            pieces = [text(c.choices[0]) or "" for c in answer if c.choices] if stream else [text(answer.choices[0])]
            assert "".join(pieces) == want, pieces
            # (How many pieces: the worker sends one a character, but pieces that pile up while the
            # event loop is busy go out as one, so a loaded machine may send the reply whole;
            # tests/decode/test_text.py checks the cut between characters without a server.)
            assert not any("\ufffd" in p for p in pieces)


# -- bad conversations -----------------------------------------------------------------------------

IMAGE = [{"type": "image_url", "image_url": {"url": "x"}}]
BAD = [
    ({"model": "llama", "messages": []}, "messages", "at least 1 item"),
    ({"model": "llama"}, "messages", "required"),
    ({"model": "llama", "messages": [{"role": "wizard", "content": "hi"}]}, "messages[0].role", "or 'assistant'"),
    ({"model": "llama", "messages": [{"role": "user"}]}, "messages[0].content", "required"),
    ({"model": "llama", "messages": [{"role": "user", "content": IMAGE}]}, "messages[0].content[0].type", "'text'"),
    ({"model": "llama", "messages": [{"role": "user", "content": "a" * 401}]}, "messages[0].content", "400 characters"),
    ({"model": "llama", "messages": [{"role": "user", "content": "ROMEO " * 60}]}, "messages", "takes at most 64"),
    ({"model": "llama", "messages": TURNS, "max_tokens": 41}, "max_tokens", "at most 40"),
    ({"model": "llama", "messages": TURNS, "max_completion_tokens": 41}, "max_completion_tokens", "at most 40"),
    ({"model": "llama", "messages": TURNS, "n": 5}, "n", "at most 4"),
    ({"model": "llama", "messages": TURNS, "top_logprobs": 2}, "top_logprobs", "needs logprobs true"),
    ({"model": "llama", "messages": TURNS, "logit_bias": {"x": 1}}, "logit_bias", "not a token id"),
    ({"model": "mixtral", "messages": [TURNS[1], TURNS[1]]}, "messages", "Conversation roles must alternate"),
    ({"model": "gpt2", "messages": TURNS}, "model", "model 'gpt2' has no chat template"),
]  # fmt: skip


@pytest.mark.parametrize("body, param, fragment", BAD, ids=[f for _, _, f in BAD])
def test_bad_conversations_get_400_naming_the_field(server, body, param, fragment):
    assert_error(httpx.post(f"{server.url}{CHAT}", json=body, timeout=30), 400, param, fragment)


def test_an_unknown_model_is_a_404_as_openai_answers(server):
    answer = httpx.post(f"{server.url}{CHAT}", json={"model": "gpt-4", "messages": TURNS}, timeout=30)
    assert_error(answer, 404, "model", "no model 'gpt-4' here")


def test_errors_are_the_clients_exceptions(client):
    with pytest.raises(openai.BadRequestError, match="no chat template") as refused:
        client.chat.completions.create(model="gpt2", messages=TURNS)
    assert refused.value.body["param"] == "model"
    with pytest.raises(openai.BadRequestError) as empty:
        client.chat.completions.create(model="llama", messages=[])
    assert empty.value.body["param"] == "messages"


PARTS = [{"role": "user", "content": [{"type": "text", "text": "你好"}]}]
PLAUSIBLE = {
    "messages": [TURNS, [], [TURNS[1], TURNS[1]], [{"role": "tool", "content": "x"}], [{"role": "user", "content": ""}],
                 PARTS, "hi", [{"role": "user", "content": None}]],
    "max_tokens": [0, 1, 5, 41, -1, None], "max_completion_tokens": [0, 3, None, "x"], "temperature": [0, 0.7, 3, None],
    "n": [1, 2, 5], "stream": [True, False], "stop": ["a", ["\n"], None], "seed": [0, -1, None],
    "stream_options": [{"include_usage": True}, None], "model": ["llama", "mixtral", "gpt2", "bytes", "nope"],
}  # fmt: skip


def test_random_chat_bodies_never_break_the_server(server):
    """300 random bodies to the chat endpoint: 200 or a JSON 4xx naming its field, never a 500."""
    rng = random.Random(47)
    statuses = set()
    with httpx.Client(base_url=server.url, timeout=60) as http:
        for _ in range(300):
            fields = rng.sample(list(PLAUSIBLE), rng.randint(1, len(PLAUSIBLE)))
            body = {f: rng.choice(PLAUSIBLE[f]) if rng.random() < 0.8 else random_value(rng) for f in fields}
            response = http.post(CHAT, json=body)
            statuses.add(response.status_code)
            assert response.status_code in (200, 400, 404, 429), (body, response.text)
            if response.status_code != 200:
                assert_error(response, response.status_code, response.json()["error"]["param"])
            elif body.get("stream") is True:
                assert response.text.endswith("data: [DONE]\n\n")
        ok = http.post(CHAT, json={"model": "llama", "messages": TURNS, "max_tokens": 3, "temperature": 0})
        assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] <= 3
    assert {200, 400} <= statuses


def test_serve_a_folder_from_the_command_line(folders):
    """`attnlab serve FOLDER` in a child process: the banner, then a chat through the API."""
    env = {**os.environ, "PYTHONPATH": f"{SRC}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", "ATTNLAB_API_KEY": ""}
    cmd = [sys.executable, "-m", "attnlab", "serve", str(folders["llama"][0]), "--port", "0", "--threads", "1"]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, env=env)
    try:
        banner = proc.stderr.readline()
        found = re.search(r"on (http://127\.0\.0\.1:\d+)/", banner)
        assert found and "llama (language-model)" in banner, banner
        client = openai.OpenAI(base_url=f"{found.group(1)}/v1", api_key="x", max_retries=3)
        answer = client.chat.completions.create(model="llama", messages=TURNS, max_tokens=4)
        assert answer.usage.completion_tokens <= 4 and answer.choices[0].message.role == "assistant"
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def test_the_page_chats(server):
    """The page's chat mode in headless Chromium: two turns of a conversation streamed in, a
    template's refusal shown, the tabs to completion, a model without a template without chat."""
    from serve.browser import by_id, chromium, fill, missing, open_page, pick_model, wait

    if missing():
        pytest.skip(missing())

    def turns(driver) -> list[str]:
        return driver.execute_script(
            "return [...document.querySelectorAll('#conversation .turn')].map(t => t.textContent)"
        )

    def idle(driver) -> bool:
        return by_id(driver, "conversation").get_attribute("data-state") == "idle"

    with chromium() as driver:
        open_page(driver, server.url, 4)
        pick_model(driver, "bytes")
        fill(driver, "chat-max-tokens", "20")
        assert by_id(driver, "chat-view").is_displayed() and not by_id(driver, "lm-view").is_displayed()
        # ChromeDriver types no character outside the BMP (the emoji): set the text itself.
        driver.execute_script("document.getElementById('message').value = arguments[0]", "你好 😀")
        by_id(driver, "send").click()
        wait(driver, lambda d: idle(d) and len(turns(d)) == 2)
        assert turns(driver) == ["你好 😀", REPLY]
        assert by_id(driver, "conversation").get_attribute("data-finish") == "stop"
        assert by_id(driver, "message").get_attribute("value") == ""

        # Another model, a new conversation of two turns; a message past its context: the error
        # shows, and the conversation stays as it was.
        pick_model(driver, "mixtral")
        assert turns(driver) == []
        fill(driver, "chat-max-tokens", "3")  # a random model's bytes make many tokens once read back
        for message in ("ROMEO: What say you?", "Again?"):
            fill(driver, "message", message)
            by_id(driver, "send").click()
            wait(driver, lambda d: idle(d) and turns(d)[-2:-1] == [message])  # noqa: B023
        assert len(turns(driver)) == 4 and "tokens in" in by_id(driver, "chat-status").text
        fill(driver, "message", "ROMEO " * 40)
        by_id(driver, "send").click()
        wait(driver, lambda d: "takes at most 64" in by_id(d, "error").text)
        assert len(turns(driver)) == 4 and idle(driver)
        by_id(driver, "chat-clear").click()
        assert turns(driver) == []

        # The tabs: the same model completes a text; a model without a template has no chat.
        by_id(driver, "mode-complete").click()
        assert by_id(driver, "lm-view").is_displayed() and not by_id(driver, "chat-view").is_displayed()
        pick_model(driver, "gpt2")
        assert not by_id(driver, "mode").is_displayed() and by_id(driver, "lm-view").is_displayed()
        errors = [
            e for e in driver.get_log("browser") if e["level"] == "SEVERE" and "400 (Bad Request)" not in e["message"]
        ]
        assert errors == [], errors
