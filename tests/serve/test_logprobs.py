"""`logprobs` and `echo` in `POST /v1/completions` (OpenAI's legacy shape), checked against the
model's log-softmax computed here by a plain forward pass over the same tokens."""

import pytest
import torch

from attnlab.decode import complete, greedy_picker
from serve.conftest import LIMITS
from serve.test_api import events, post

TOLERANCE = 1e-5
BLOCK = 16  # the shared "lm" run's block_size


def reference(model, ids: list[int]) -> torch.Tensor:
    """log_softmax of the model's logits after each token of ids (at most block_size of them): row t
    is the distribution of token t + 1 `(T, V)`, float64."""
    with torch.no_grad():
        logits = model.eval()(torch.tensor([ids]))[0]
    return torch.log_softmax(logits.double(), dim=-1)


def next_logprobs(model, ids: list[int]) -> torch.Tensor:
    """The distribution of the token after ids, read as the decoder reads it: the last block_size tokens."""
    return reference(model, ids[-BLOCK:])[-1]


def assert_top(top: dict[str, float], row: torch.Tensor, n: int, tokenizer, token: int) -> None:
    """top holds the n most likely tokens of row with their log-probabilities, and the token itself."""
    values, ids = torch.topk(row, n)
    want = {tokenizer.decode([i]): v for i, v in zip(ids.tolist(), values.tolist(), strict=True)}
    want.setdefault(tokenizer.decode([token]), float(row[token]))
    assert top.keys() == want.keys()
    for key, value in want.items():
        assert abs(top[key] - value) < TOLERANCE, key


def test_echo_with_no_new_token_scores_the_prompt(client, runs):
    """What lm-eval's loglikelihood requests ask: the prompt's own tokens, each given those before it."""
    run = runs["lm"]
    prompt = "First Citizen:\nB"  # 16 tokens: the whole context
    ids = run.tokenizer.encode(prompt)
    body = post(client, "/v1/completions", model="lm", prompt=prompt, max_tokens=0, echo=True, logprobs=3)
    (choice,) = body["choices"]
    assert choice["text"] == prompt and choice["finish_reason"] == "length"
    assert body["usage"]["completion_tokens"] == 0
    lp = choice["logprobs"]
    assert lp["tokens"] == list(prompt) and lp["text_offset"] == list(range(len(prompt)))
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    ref = reference(run.model, ids)
    for t in range(1, len(ids)):
        assert abs(lp["token_logprobs"][t] - float(ref[t - 1, ids[t]])) < TOLERANCE, t
        assert_top(lp["top_logprobs"][t], ref[t - 1], 3, run.tokenizer, ids[t])


def test_generated_tokens_carry_the_models_logprobs_also_past_the_window(client, runs):
    """Greedy tokens past block_size (the window slides): each token's log-probability is the
    model's over the last block_size tokens before it, and with greedy decoding it is the top one."""
    run = runs["lm"]
    prompt, new = "ROMEO:", 20  # 6 + 20 tokens: past the block of 16
    body = post(client, "/v1/completions", model="lm", prompt=prompt, max_tokens=new, temperature=0, logprobs=2)
    (choice,) = body["choices"]
    assert choice["text"] == complete(run.model, run.tokenizer, prompt, new, greedy_picker())
    lp = choice["logprobs"]
    assert "".join(lp["tokens"]) == choice["text"] and len(lp["tokens"]) == new
    assert lp["text_offset"] == list(range(new))  # offsets into this choice's text
    ids = run.tokenizer.encode(prompt)
    for k, token in enumerate(run.tokenizer.encode(choice["text"])):
        row = next_logprobs(run.model, ids)
        assert abs(lp["token_logprobs"][k] - float(row[token])) < TOLERANCE, k
        assert_top(lp["top_logprobs"][k], row, 2, run.tokenizer, token)
        assert max(lp["top_logprobs"][k].values()) == lp["token_logprobs"][k]  # greedy: the top token
        ids.append(token)


def test_sampled_tokens_are_scored_by_the_model_not_the_temperature(client, runs):
    run = runs["lm"]
    request = dict(model="lm", prompt="ROMEO:", max_tokens=12, temperature=1.8, seed=4)
    plain = post(client, "/v1/completions", **request)["choices"][0]
    (choice,) = post(client, "/v1/completions", **request, logprobs=0)["choices"]
    assert choice["text"] == plain["text"]  # asking for logprobs changes no token
    ids = run.tokenizer.encode("ROMEO:")
    for k, token in enumerate(run.tokenizer.encode(choice["text"])):
        row = next_logprobs(run.model, ids)
        assert abs(choice["logprobs"]["token_logprobs"][k] - float(row[token])) < TOLERANCE
        assert choice["logprobs"]["top_logprobs"][k] == {
            run.tokenizer.decode([token]): choice["logprobs"]["token_logprobs"][k]
        }
        ids.append(token)


def test_lm_eval_request_token_ids_echo_and_one_new_token(client, runs):
    """lm-eval's local-completions sends token ids, echo, logprobs 1, max_tokens 1 and reads
    token_logprobs[ctxlen:-1]; with several prompts, each choice scores its own."""
    run = runs["lm"]
    texts = ["First Citizen:", "Before we go"]
    prompts = [run.tokenizer.encode(t) for t in texts]
    body = post(
        client, "/v1/completions", model="lm", prompt=prompts, max_tokens=1, temperature=0, logprobs=1, echo=True
    )
    for choice, ids, text in zip(body["choices"], prompts, texts, strict=True):
        lp = choice["logprobs"]
        assert choice["text"].startswith(text) and len(choice["text"]) == len(text) + 1
        assert len(lp["tokens"]) == len(ids) + 1 and lp["text_offset"] == list(range(len(ids) + 1))
        ref = reference(run.model, ids)
        want = [float(ref[t - 1, ids[t]]) for t in range(1, len(ids))] + [float(ref[-1].max())]
        assert lp["token_logprobs"][0] is None
        assert lp["token_logprobs"][1:] == pytest.approx(want, abs=TOLERANCE)


def test_a_streamed_echo_carries_the_same_logprobs(client):
    request = dict(model="lm", prompt="ROMEO:", max_tokens=20, temperature=0.9, seed=2, logprobs=2, echo=True)
    whole = post(client, "/v1/completions", **request)["choices"][0]
    chunks = [c for c in events(client.post("/v1/completions", json={**request, "stream": True})) if c != "[DONE]"]
    first = chunks[0]["choices"][0]
    assert first["text"] == "ROMEO:" and first["logprobs"]["token_logprobs"][0] is None
    merged = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for chunk in chunks:
        lp = chunk["choices"][0]["logprobs"]
        for key in merged:
            merged[key] += lp[key] if lp else []
    assert "".join(c["choices"][0]["text"] for c in chunks) == whole["text"]
    assert merged == whole["logprobs"]
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


def test_echo_alone_repeats_the_prompt(client):
    body = post(client, "/v1/completions", model="lm", prompt="ROMEO:", max_tokens=5, temperature=0, echo=True)
    plain = post(client, "/v1/completions", model="lm", prompt="ROMEO:", max_tokens=5, temperature=0)
    assert body["choices"][0]["text"] == "ROMEO:" + plain["choices"][0]["text"]
    assert body["choices"][0]["logprobs"] is None
    long = "a" * (BLOCK + 4)  # past the context: fine when nothing is scored
    assert (
        post(client, "/v1/completions", model="lm", prompt=long, max_tokens=0, echo=True)["choices"][0]["text"] == long
    )


@pytest.mark.parametrize(
    "body, param, fragment",
    [
        ({"logprobs": 6}, "logprobs", "at most 5"),
        ({"logprobs": -1}, "logprobs", "greater than or equal to 0"),
        (
            {"echo": True, "logprobs": 1, "prompt": "a" * (BLOCK + 1)},
            "prompt",
            f"at most {BLOCK}, the context of model 'lm'",
        ),
        ({"prompt": [3, 10_000]}, "prompt", "token id 10000 is not in the vocabulary"),
        ({"prompt": [[3], [4, -2]]}, "prompt[1][1]", "greater than or equal to 0"),
        ({"prompt": [[3], []]}, "prompt[1]", "at least 1 item"),
    ],
)
def test_bad_logprobs_and_prompts_get_400(client, body, param, fragment):
    response = client.post("/v1/completions", json={"model": "lm", **body})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and fragment in error["message"], error
    assert LIMITS.max_prompt_tokens > BLOCK  # the context check, not the prompt cap, refused the long prompt
