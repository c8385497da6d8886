"""Every endpoint of `attnlab serve` through FastAPI's test client, each answer checked against the
library computing the same thing directly (decoding, beam search, the task's classifier and tagger,
the attention maps of `attnlab attention`)."""

import json
import math
import re

import pytest
import torch

from attnlab.decode import complete, greedy_picker
from attnlab.decode.seq2seq import beam_search
from attnlab.tasks import open_task
from attnlab.viz.html import ATTENTION_JS, attention_data
from attnlab.viz.maps import attention_maps
from helpers import Page

REMOTE = re.compile(r"https?:|//cdn|@import|url\(", re.IGNORECASE)  # anything that would load from elsewhere


def post(client, path: str, **body):
    response = client.post(path, json=body)
    assert response.status_code == 200, response.text
    return response.json()


def events(response) -> list[dict | str]:
    """The server-sent events of a streamed answer: each `data:` payload, JSON-decoded but for [DONE]."""
    assert response.headers["content-type"].startswith("text/event-stream")
    blocks = response.text.split("\n\n")
    assert blocks[-1] == "", "every event ends with a blank line"
    out = []
    for block in blocks[:-1]:
        assert block.startswith("data: "), block
        payload = block.removeprefix("data: ")
        out.append(payload if payload == "[DONE]" else json.loads(payload))
    return out


# -- models and the page --------------------------------------------------------------------------


def test_models_lists_every_run_with_its_task_and_endpoints(client):
    body = client.get("/v1/models").json()
    assert body["object"] == "list"
    cards = {m["id"]: m for m in body["data"]}
    assert list(cards) == ["lm", "mt", "sst", "sst-lstm", "pos", "mlm"]
    assert cards["lm"]["endpoints"] == ["/v1/completions", "/v1/attention"]
    assert cards["mt"]["endpoints"] == ["/v1/translations", "/v1/attention"]
    assert cards["pos"]["endpoints"] == ["/v1/tags", "/v1/embeddings", "/v1/attention"]  # a BERT encoder embeds
    assert cards["sst-lstm"]["endpoints"] == ["/v1/classifications"]  # a BiLSTM has no attention
    assert cards["mlm"]["endpoints"] == ["/v1/embeddings", "/v1/attention"]
    assert {m["task"] for m in cards.values()} == {
        "language-model",
        "translation",
        "text-classification",
        "token-classification",
        "masked-lm",
    }
    assert all(m["object"] == "model" and m["owned_by"] == "attnlab" and m["created"] > 0 for m in cards.values())
    assert client.get("/v1/models/mt").json() == cards["mt"]
    assert client.get("/v1/models/nope").status_code == 404


def test_the_openapi_page_documents_every_endpoint(client):
    spec = client.get("/openapi.json").json()
    paths = {p for p in spec["paths"] if p.startswith("/v1")}
    assert paths == {
        "/v1/models",
        "/v1/models/{name}",
        "/v1/completions",
        "/v1/chat/completions",
        "/v1/responses",
        "/v1/translations",
        "/v1/classifications",
        "/v1/tags",
        "/v1/embeddings",
        "/v1/attention",
    }
    fields = spec["components"]["schemas"]["CompletionRequest"]["properties"]
    assert {"prompt", "max_tokens", "temperature", "top_p", "top_k", "n", "stream", "stop", "seed"} <= set(fields)
    assert client.get("/docs").status_code == 200


def test_health(client):
    assert client.get("/healthz").json() == {"status": "ok"}


def test_the_page_and_its_assets_come_from_the_server_alone(client):
    response = client.get("/")
    assert response.status_code == 200
    assert "default-src 'self'" in response.headers["content-security-policy"]
    page = Page(response.text)
    assert page.errors == [] and page.doctype.lower() == "doctype html"
    # What the page loads: scripts, style sheets, its icon (links to /docs are not loaded).
    links = re.findall(r"<(?:script|link)\b[^>]*\b(?:src|href)=\"([^\"]*)\"", response.text)
    assert len(links) == 6, links  # with /static/api.js, the API's paths (attnlab.names.API)
    assert all(link.startswith("/") and not link.startswith("//") for link in links), links
    for link in links:
        asset = client.get(link)
        assert asset.status_code == 200, link
        if not link.endswith(".svg"):  # an SVG names its XML namespace with a URL, loads nothing
            assert REMOTE.search(asset.text) is None, (link, REMOTE.search(asset.text))
    assert REMOTE.search(response.text) is None
    script = client.get("/static/attention-view.js").text
    assert ATTENTION_JS.strip() in script  # the explorer of `attnlab attention`, reused as is


# -- completions ----------------------------------------------------------------------------------

GREEDY = [("ROMEO:", 40, ()), ("First", 25, ("e",)), ("", 30, ("\n\n", "th")), ("MENENIUS:", 0, ())]


@pytest.mark.parametrize("prompt, max_tokens, stop", GREEDY)
def test_greedy_completion_is_what_the_library_decodes(client, runs, prompt, max_tokens, stop):
    run = runs["lm"]
    body = post(
        client, "/v1/completions", model="lm", prompt=prompt, max_tokens=max_tokens, temperature=0, stop=list(stop)
    )
    expected = complete(run.model, run.tokenizer, prompt, max_tokens, greedy_picker(), stop=stop)
    assert body["object"] == "text_completion" and body["model"] == "lm" and body["id"].startswith("cmpl-")
    (choice,) = body["choices"]
    assert choice["text"] == expected and choice["index"] == 0 and choice["logprobs"] is None
    stopped = any(s in expected for s in stop) or len(expected) < max_tokens
    assert choice["finish_reason"] == ("stop" if stopped else "length")
    prompt_tokens = len(run.tokenizer.encode(prompt)) if prompt else 1  # "" starts from one token
    usage = body["usage"]
    assert usage["prompt_tokens"] == prompt_tokens
    assert usage["completion_tokens"] >= len(expected)  # a character model: one token per character
    assert usage["completion_tokens"] <= max_tokens
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]


def test_a_stop_string_ends_the_text_before_it(client):
    request = dict(model="lm", prompt="ROMEO:", max_tokens=60, temperature=1.0, seed=5)
    free = post(client, "/v1/completions", **request)["choices"][0]["text"]
    # A two-character string the completion first reaches after 10 characters; the same seed decodes
    # the same tokens up to it.
    at = next(k for k in range(10, 50) if free.index(free[k : k + 2]) == k)
    stop = free[at : at + 2]
    (choice,) = post(client, "/v1/completions", **request, stop=[stop, "never reached"])["choices"]
    assert choice["text"] == free[:at] and choice["finish_reason"] == "stop"


def test_the_stream_carries_the_same_text_as_the_whole_answer(client):
    request = dict(model="lm", prompt="ROMEO:", max_tokens=60, temperature=0.9, top_k=20, top_p=0.9, seed=7)
    whole = post(client, "/v1/completions", **request)
    streamed = {**request, "stream": True, "stream_options": {"include_usage": True}}
    response = client.post("/v1/completions", json=streamed)
    assert response.status_code == 200
    chunks = events(response)
    assert chunks[-1] == "[DONE]"
    *pieces, last, usage = chunks[:-1]
    assert len(pieces) > 5, "the text came in one piece: not streamed"
    for chunk in pieces:
        assert chunk["object"] == "text_completion" and chunk["id"] == last["id"] and chunk["usage"] is None
        (choice,) = chunk["choices"]
        assert choice["finish_reason"] is None and choice["text"]
    assert last["choices"] == [{"text": "", "index": 0, "logprobs": None, "finish_reason": "length"}]
    assert "".join(c["choices"][0]["text"] for c in pieces) == whole["choices"][0]["text"]
    assert usage["choices"] == [] and usage["usage"] == whole["usage"]


def test_a_seed_gives_the_same_text_and_each_choice_its_own(client):
    request = dict(model="lm", prompt="ROMEO:", max_tokens=40, temperature=1.0, seed=11)
    one = post(client, "/v1/completions", **request)["choices"]
    again = post(client, "/v1/completions", **request)["choices"]
    three = post(client, "/v1/completions", **request, n=3)["choices"]
    assert one == again
    assert [c["index"] for c in three] == [0, 1, 2]
    assert three[0]["text"] == one[0]["text"]  # choice i uses seed + i
    assert len({c["text"] for c in three}) == 3
    other = post(client, "/v1/completions", **{**request, "seed": 12})["choices"]
    assert other[0]["text"] == three[1]["text"]


def test_several_prompts_give_choices_in_openai_order(client, runs):
    run = runs["lm"]
    prompts = ["ROMEO:", "MENENIUS", "First Citizen"]
    body = post(client, "/v1/completions", model="lm", prompt=prompts, n=1, max_tokens=12, temperature=0)
    for i, prompt in enumerate(prompts):
        assert body["choices"][i]["index"] == i
        assert body["choices"][i]["text"] == complete(run.model, run.tokenizer, prompt, 12, greedy_picker())
    assert body["usage"]["prompt_tokens"] == sum(len(p) for p in prompts)


def test_several_streamed_choices_interleave_and_each_ends_once(client):
    response = client.post(
        "/v1/completions", json=dict(model="lm", prompt=["ab", "ROMEO"], n=2, max_tokens=30, seed=3, stream=True)
    )
    chunks = [c for c in events(response) if c != "[DONE]"]
    texts, ends = ["", "", "", ""], []
    for chunk in chunks:
        (choice,) = chunk["choices"]
        texts[choice["index"]] += choice["text"]
        if choice["finish_reason"]:
            ends.append(choice["index"])
    assert sorted(ends) == [0, 1, 2, 3]
    whole = post(client, "/v1/completions", model="lm", prompt=["ab", "ROMEO"], n=2, max_tokens=30, seed=3)
    assert texts == [c["text"] for c in whole["choices"]]


# -- the other families ---------------------------------------------------------------------------


def test_translation_is_the_beam_search_translation_with_its_cross_attention(client, runs):
    run = runs["mt"]
    task = open_task(run)
    text = "Ein Mann fährt Fahrrad."
    body = post(client, "/v1/translations", model="mt", input=text, beam=3)
    (ids,), _ = task.encode_sources([text])
    assert body["translation"] == task.translate_ids(run.model, [ids], torch.device("cpu"), beam=3)[0]
    assert body["source_tokens"] == task.tokenizer.token_texts(ids)
    assert body["target_tokens"][-1] == "</s>"
    weights = torch.tensor(body["attention"])
    assert weights.shape == (len(body["target_tokens"]), len(body["source_tokens"]))
    torch.testing.assert_close(weights.sum(dim=1), torch.ones(len(weights)))
    # The weights are the model's own: its last decoder layer's cross-attention, mean over heads,
    # with the beam search's target tokens as the decoder's input.
    src = torch.tensor([ids])
    (target,) = beam_search(run.model, src, beam_size=3, bos_id=task.bos_id, eos_id=task.eos_id)
    assert body["target_tokens"] == [*task.tokenizer.token_texts(target), "</s>"]
    with torch.no_grad():
        layers = run.model.cross_attention_layers(src, torch.tensor([[task.bos_id, *target]]))
    torch.testing.assert_close(weights, layers[-1][0].mean(dim=0).float())
    assert body["source_labels"][1].startswith("▁")  # a space shown as ▁


def test_classification_gives_the_classifier_labels_and_probabilities(client, runs):
    run = runs["sst"]
    texts = ["a gorgeous , witty , seductive movie .", "the plot is nothing but boilerplate ."]
    body = post(client, "/v1/classifications", model="sst", input=texts)
    found = open_task(run).classify(run.model, texts, torch.device("cpu"))
    assert [d["index"] for d in body["data"]] == [0, 1]
    for item, ref, text in zip(body["data"], found, texts, strict=True):
        assert item["input"] == text and item["label"] == ref["label"]
        assert item["probabilities"] == pytest.approx(ref["probabilities"])
        assert list(item["probabilities"].values()) == sorted(item["probabilities"].values(), reverse=True)
        assert math.isclose(sum(item["probabilities"].values()), 1.0, rel_tol=1e-5)
    single = post(client, "/v1/classifications", model="sst", input=texts[0])
    assert single["data"][0]["label"] == found[0]["label"]


def test_tags_are_the_taggers_with_probabilities(client, runs):
    run = runs["pos"]
    text = "The cat can't sit on the mat."
    body = post(client, "/v1/tags", model="pos", input=text)
    (expected,) = open_task(run).tag(run.model, [text], torch.device("cpu"))
    words = body["data"][0]["words"]
    assert [(w["word"], w["tag"]) for w in words] == expected
    assert [w["word"] for w in words] == ["The", "cat", "ca", "n't", "sit", "on", "the", "mat", "."]
    for w in words:
        assert w["probability"] == max(w["probabilities"].values()) == w["probabilities"][w["tag"]]
        assert math.isclose(sum(w["probabilities"].values()), 1.0, rel_tol=1e-5)


ATTENTION = [
    ("lm", "ROMEO: hi", None),
    ("mt", "Ein Hund.", None),
    ("mt", "Ein Hund.", "self"),
    ("pos", "I run.", None),
    ("mlm", "the game is on .", None),
]


@pytest.mark.parametrize("model, text, kind", ATTENTION)
def test_attention_is_the_explorer_data_of_attnlab_attention(client, runs, model, text, kind):
    body = post(client, "/v1/attention", model=model, input=text, kind=kind, beam=2)
    expected = attention_data(attention_maps(runs[model], text, kind=kind, beam=2))
    assert body.pop("object") == "attention" and body.pop("model") == model
    assert body == expected


def test_a_model_asked_at_the_wrong_endpoint_names_its_own(client):
    response = client.post("/v1/completions", json={"model": "mt", "prompt": "x"})
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == "model" and error["type"] == "invalid_request_error"
    assert "POST /v1/translations" in error["message"]
    response = client.post("/v1/attention", json={"model": "sst-lstm", "input": "good"})
    assert response.status_code == 400 and "POST /v1/classifications" in response.json()["error"]["message"]
