"""The official `openai` client, unchanged, against a live `attnlab serve` on a loopback port."""

import openai
import pytest

from attnlab.decode import complete, greedy_picker
from attnlab.serve.app import create_app
from attnlab.serve.limits import Limits
from attnlab.serve.server import BackgroundServer

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def client(live):
    return openai.OpenAI(base_url=f"{live.url}/v1", api_key="not-needed", max_retries=0)


def test_models(client):
    models = client.models.list()
    assert [m.id for m in models.data] == ["lm", "mt", "sst", "sst-lstm", "pos", "mlm"]
    assert client.models.retrieve("lm").owned_by == "attnlab"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-4")


def test_a_completion_is_the_library_greedy_text(client, runs):
    run = runs["lm"]
    answer = client.completions.create(model="lm", prompt="ROMEO:", max_tokens=30, temperature=0)
    assert answer.object == "text_completion" and answer.model == "lm"
    (choice,) = answer.choices
    assert choice.text == complete(run.model, run.tokenizer, "ROMEO:", 30, greedy_picker())
    assert choice.finish_reason == "length"
    assert answer.usage.prompt_tokens == 6 and answer.usage.completion_tokens == 30
    assert answer.usage.total_tokens == 36


def test_a_streamed_completion_comes_in_pieces_that_make_the_whole(client):
    options = dict(model="lm", prompt="First Citizen:", max_tokens=40, temperature=0.8, top_p=0.9, seed=3)
    whole = client.completions.create(**options)
    chunks = list(client.completions.create(**options, stream=True, stream_options={"include_usage": True}))
    texts = [c.choices[0].text for c in chunks if c.choices]
    assert len([t for t in texts if t]) > 5
    assert "".join(texts) == whole.choices[0].text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


def test_stop_n_and_seed(client):
    answer = client.completions.create(model="lm", prompt="ROMEO:", max_tokens=50, n=2, seed=9, stop=["e", "\n"])
    assert len(answer.choices) == 2
    for choice in answer.choices:
        assert "e" not in choice.text and "\n" not in choice.text
        assert choice.finish_reason == "stop" or len(choice.text) == 50
    again = client.completions.create(model="lm", prompt="ROMEO:", max_tokens=50, n=2, seed=9, stop=["e", "\n"])
    assert [c.text for c in again.choices] == [c.text for c in answer.choices]


def test_errors_are_the_clients_exceptions(client):
    with pytest.raises(openai.BadRequestError) as bad:
        client.completions.create(model="lm", prompt="KING", max_tokens=5)
    assert "never saw: 'K'" in bad.value.message and bad.value.body["param"] == "prompt"
    with pytest.raises(openai.NotFoundError, match="no model 'gpt-4'"):  # as OpenAI answers
        client.completions.create(model="gpt-4", prompt="hi")
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model="lm", prompt="hi", max_tokens=-1)


def test_the_key_and_a_full_queue(runs):
    limits = Limits(max_batch=1, max_queue=1, max_tokens=100_000, past_context=True)
    app = create_app(runs, api_key="k3y", limits=limits)
    with BackgroundServer(app) as server:
        url = f"{server.url}/v1"
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=url, api_key="wrong", max_retries=0).models.list()
        client = openai.OpenAI(base_url=url, api_key="k3y", max_retries=0)
        running = client.completions.create(model="lm", prompt="ab", max_tokens=100_000, stream=True)
        waiting = client.completions.create(model="lm", prompt="ab", max_tokens=100_000, stream=True)
        first = iter(running)
        next(first)  # one decodes, one waits
        with pytest.raises(openai.RateLimitError):
            client.completions.create(model="lm", prompt="ab", max_tokens=5)
        running.close()
        waiting.close()
