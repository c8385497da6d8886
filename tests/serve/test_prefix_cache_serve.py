"""Prefix caching through the server: a request that begins as an earlier one reports its cached
tokens in `usage.prompt_tokens_details.cached_tokens`, and every reply is the one a server without
a prefix cache (`--cache-memory 0`) gives."""

import pytest

from attnlab.cli.serve import memory_size
from attnlab.decode.prefix_cache import BLOCK_TOKENS
from attnlab.serve.app import create_app
from attnlab.serve.limits import Limits
from helpers import cli

SYSTEM = "You answer in verse. Rhymes come first, then meaning; never break the metre of a line. "
QUESTIONS = ["Where is Romeo?", "Who is Juliet?", "Where is Romeo? And Lear?"]


@pytest.fixture(scope="module")
def clients(json_runs):
    """Test clients of two apps over the random-weight Llama folder: the default prefix cache, and none."""
    from fastapi.testclient import TestClient

    with (
        TestClient(create_app(json_runs, limits=Limits(max_tokens=40))) as warm,
        TestClient(create_app(json_runs, limits=Limits(max_tokens=40, cache_memory=0))) as cold,
    ):
        yield warm, cold


def complete(client, prompt: str) -> dict:
    body = {"model": "chat", "prompt": prompt, "max_tokens": 12, "temperature": 0}
    response = client.post("/v1/completions", json=body)
    assert response.status_code == 200, response.text
    return response.json()


def test_the_second_request_reports_its_cached_prefix(clients):
    warm, _ = clients
    first = complete(warm, SYSTEM * 3 + QUESTIONS[0])
    second = complete(warm, SYSTEM * 3 + QUESTIONS[1])
    assert first["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}
    cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached % BLOCK_TOKENS == 0  # whole blocks
    # all of the shared system text but its last partial block (the questions differ from their first token on)
    shared = complete(warm, SYSTEM * 3)["usage"]["prompt_tokens"]
    assert shared - 2 * BLOCK_TOKENS < cached <= shared  # (the text's last space may join the question's token)


def test_replies_equal_those_of_a_server_without_a_prefix_cache(clients):
    warm, cold = clients
    for question in QUESTIONS:
        prompt = SYSTEM * 2 + question
        got, want = complete(warm, prompt), complete(cold, prompt)
        assert got["choices"][0]["text"] == want["choices"][0]["text"]
        assert want["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    # the warm server had its prompts' blocks cached: the last question shares the first's whole text
    assert complete(warm, SYSTEM * 2 + QUESTIONS[2])["usage"]["prompt_tokens_details"]["cached_tokens"] > 0


def test_a_conversation_reuses_its_earlier_reply(clients):
    warm, cold = clients
    turn = complete(warm, SYSTEM + QUESTIONS[0])
    follow = SYSTEM + QUESTIONS[0] + turn["choices"][0]["text"] + " And then?"
    got, want = complete(warm, follow), complete(cold, follow)
    assert got["choices"][0]["text"] == want["choices"][0]["text"]
    assert got["usage"]["prompt_tokens_details"]["cached_tokens"] > 0


def test_a_chat_turn_reports_the_conversation_it_shares_with_the_last(clients):
    """Chat completions count cached tokens as completions do: the second turn of a conversation
    begins with the first's rendered messages."""
    warm, cold = clients

    def chat(client, messages: list[dict]) -> dict:
        body = {"model": "chat", "messages": messages, "max_tokens": 8, "temperature": 0}
        response = client.post("/v1/chat/completions", json=body)
        assert response.status_code == 200, response.text
        return response.json()

    first = [{"role": "system", "content": SYSTEM * 3}, {"role": "user", "content": QUESTIONS[0]}]
    reply = chat(warm, first)
    assert reply["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    second = [*first, reply["choices"][0]["message"], {"role": "user", "content": QUESTIONS[1]}]
    got, want = chat(warm, second), chat(cold, second)
    assert got["choices"][0]["message"] == want["choices"][0]["message"]
    cached = got["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached % BLOCK_TOKENS == 0 and reply["usage"]["prompt_tokens"] - BLOCK_TOKENS < cached
    assert cached < got["usage"]["prompt_tokens"] and want["usage"]["prompt_tokens_details"]["cached_tokens"] == 0


def test_the_stats_show_the_bound_taken(clients):
    warm, cold = clients
    complete(warm, SYSTEM * 2)
    assert warm.app.state.models["chat"].worker.stats()["prefix_cache_bytes"] > 0
    assert cold.app.state.models["chat"].worker.stats()["prefix_cache_bytes"] == 0


def test_cache_memory_sizes():
    assert memory_size("512MB") == 512 * 10**6 and memory_size("1.5GiB") == 3 * 2**29
    assert memory_size("64k") == 64_000 and memory_size("0") == 0 and memory_size("2 gb") == 2 * 10**9
    assert memory_size("1024") == 1024


@pytest.mark.parametrize("size", ["lots", "MB", "-1GB", "5PB", "1iB"])
def test_a_bad_cache_memory_is_one_line(capsys, run_dirs, size):
    code, _, err = cli(capsys, "serve", run_dirs["lm"], f"--cache-memory={size}")
    assert code == 2 and "--cache-memory" in err and "512MB" in err and "Traceback" not in err
