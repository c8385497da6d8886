"""OpenAI's completion fields at their defaults are taken (clients such as LangChain always send
them), and mean what OpenAI defines: presence and frequency penalties and `logit_bias` checked
against the definition written out (`decode.test_penalties`), per request in one batch. An
unknown model is a 404; /v1/models tells each model's own context."""

import concurrent.futures

import openai
import pytest

from attnlab.decode.sampling import Penalties
from decode.test_penalties import reference_greedy
from serve.conftest import LIMITS
from serve.test_api import post

DEFAULTS = dict(
    presence_penalty=0,
    frequency_penalty=0,
    logit_bias={},
    echo=False,
    logprobs=None,
    best_of=1,
    user="someone",
    n=1,
    suffix=None,
    stream=False,
    stop=None,
    seed=None,
    top_p=1,
)


def test_every_openai_field_at_its_default_changes_nothing(client):
    plain = post(client, "/v1/completions", model="lm", prompt="ROMEO:", max_tokens=12, temperature=0)
    full = post(client, "/v1/completions", model="lm", prompt="ROMEO:", max_tokens=12, temperature=0, **DEFAULTS)
    assert full["choices"] == plain["choices"]
    nulls = {k: None for k in DEFAULTS}  # null means the default, as in OpenAI's API
    assert (
        post(client, "/v1/completions", model="lm", prompt="ROMEO:", max_tokens=12, temperature=0, **nulls)["choices"]
        == plain["choices"]
    )


def test_the_openai_client_sends_them_all(live, runs):
    client = openai.OpenAI(base_url=f"{live.url}/v1", api_key="not-needed", max_retries=0)
    answer = client.completions.create(
        model="lm",
        prompt="ROMEO:",
        max_tokens=10,
        temperature=0,
        presence_penalty=0.5,
        frequency_penalty=0.5,
        logit_bias={"3": 2.0},
        echo=True,
        logprobs=2,
        best_of=1,
        user="u",
    )
    (choice,) = answer.choices
    tokens, _ = reference_greedy(
        runs["lm"].model, runs["lm"].tokenizer.encode("ROMEO:"), 10, Penalties(0.5, 0.5, ((3, 2.0),))
    )
    assert choice.text == "ROMEO:" + runs["lm"].tokenizer.decode(tokens)
    assert choice.logprobs.tokens == list(choice.text) and choice.logprobs.token_logprobs[0] is None
    with pytest.raises(openai.NotFoundError) as missing:
        client.completions.create(model="gpt-4", prompt="ROMEO:")
    assert missing.value.body["param"] == "model" and "this server has lm, mt" in missing.value.message


def penalised(runs, prompt: str, new: int, p: Penalties) -> str:
    run = runs["lm"]
    tokens, _ = reference_greedy(run.model, run.tokenizer.encode(prompt), new, p)
    return run.tokenizer.decode(tokens)


def test_penalties_and_bias_of_requests_decoded_together_are_each_their_own(live, runs):
    """Four requests at once (one batch, rows joining as they come), greedy past the block of 16:
    each text is the definition's, and each differs from the plain greedy text."""
    import httpx

    e = str(runs["lm"].tokenizer.encode("e")[0])
    settings = [
        Penalties(presence=1.5),
        Penalties(frequency=0.2),
        Penalties(0.3, 0.3, ((int(e), 4.0),)),
        Penalties(),
    ]

    def ask(p: Penalties) -> str:
        body = dict(model="lm", prompt="ROMEO:", max_tokens=30, temperature=0)
        body |= dict(
            presence_penalty=p.presence, frequency_penalty=p.frequency, logit_bias={str(t): b for t, b in p.bias}
        )
        response = httpx.post(f"{live.url}/v1/completions", json=body, timeout=60)
        assert response.status_code == 200, response.text
        return response.json()["choices"][0]["text"]

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        texts = list(pool.map(ask, settings))
    wants = [penalised(runs, "ROMEO:", 30, p) for p in settings]
    assert texts == wants
    assert len(set(texts)) == 4  # every setting changed the text


def test_a_bias_of_100_forces_a_token_and_minus_100_bans_it(client, runs):
    tok = runs["lm"].tokenizer
    e = str(tok.encode("e")[0])
    forced = post(client, "/v1/completions", model="lm", prompt="ROMEO:", max_tokens=8, logit_bias={e: 100}, seed=1)
    assert forced["choices"][0]["text"] == "e" * 8  # sampled at temperature 1: the bias dominates
    banned = post(client, "/v1/completions", model="lm", prompt="ROMEO:", max_tokens=60, logit_bias={e: -100}, seed=1)
    assert "e" not in banned["choices"][0]["text"] and len(banned["choices"][0]["text"]) == 60


def test_an_unknown_model_is_404_in_openais_shape(client):
    response = client.post("/v1/completions", json={"model": "gpt-4", "prompt": "hi"})
    assert response.status_code == 404
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["param"] == "model"
    assert "no model 'gpt-4' here" in error["message"]


def test_models_tell_each_models_own_context(client, runs):
    cards = {m["id"]: m for m in client.get("/v1/models").json()["data"]}
    assert cards["lm"]["context"] == runs["lm"].model.config.block_size == 16
    assert cards["lm"]["max_prompt_tokens"] == LIMITS.max_prompt_tokens  # read as its last 16 tokens
    assert cards["mt"]["context"] == 100 and cards["mt"]["max_prompt_tokens"] is None


@pytest.mark.parametrize(
    "body, param, fragment",
    [
        ({"presence_penalty": 2.5}, "presence_penalty", "less than or equal to 2"),
        ({"frequency_penalty": -3}, "frequency_penalty", "greater than or equal to -2"),
        ({"logit_bias": {"e": 1}}, "logit_bias", "key 'e' is not a token id"),
        ({"logit_bias": {"99999": 1}}, "logit_bias", "key '99999' is not a token id"),
        ({"logit_bias": {"3": 101}}, "logit_bias.3", "less than or equal to 100"),
        ({"best_of": 3}, "best_of", "does not rank completions"),
        ({"best_of": 0}, "best_of", "greater than or equal to 1"),
        ({"suffix": "the end"}, "suffix", "not served"),
        ({"echo": "maybe"}, "echo", "valid boolean"),
    ],
)
def test_bad_field_values_get_400_naming_the_field(client, body, param, fragment):
    response = client.post("/v1/completions", json={"model": "lm", "prompt": "ROMEO:", **body})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and fragment in error["message"], error


def test_best_of_equal_to_n_is_n_completions(client):
    body = post(client, "/v1/completions", model="lm", prompt="ROMEO:", max_tokens=5, n=2, best_of=2, seed=3)
    assert [c["index"] for c in body["choices"]] == [0, 1]
