"""`attnlab serve` with its models on the GPU: the FastAPI app through its test client, answers
checked against the library decoding on the same device."""

import pytest
import torch

from attnlab.decode import complete, greedy_picker
from attnlab.tasks import open_task

pytestmark = pytest.mark.cuda


@pytest.fixture(scope="module")
def served(trained, device):
    from fastapi.testclient import TestClient

    from attnlab.serve.app import create_app
    from attnlab.serve.registry import load_runs

    runs = load_runs([f"lm={trained('gpt')}", f"mt={trained('translation')}"], device=str(device))
    with TestClient(create_app(runs)) as client:  # the lifespan starts the decoding thread
        yield client, runs


def post(client, path: str, **body) -> dict:
    response = client.post(path, json=body)
    assert response.status_code == 200, response.text
    return response.json()


def test_the_models_are_served_from_the_device(served, device):
    _, runs = served
    for run in runs.values():
        assert {p.device.type for p in run.model.parameters()} == {device.type}


def test_a_greedy_completion_is_what_the_library_decodes_on_the_device(served):
    client, runs = served
    body = post(client, "/v1/completions", model="lm", prompt="ROMEO:", max_tokens=40, temperature=0)
    run = runs["lm"]
    assert body["choices"][0]["text"] == complete(run.model, run.tokenizer, "ROMEO:", 40, greedy_picker())


def test_sampled_completions_follow_their_seeds_on_the_device(served):
    # n = 3: the rows are sampled together in one batch (`decode.sampling.pick_rows`), each with
    # its own generator on the device; choice i uses seed + i, so choice 0 is the one-row answer.
    client, _ = served
    request = dict(model="lm", prompt="ROMEO:", max_tokens=30, temperature=0.8, seed=11)
    one = post(client, "/v1/completions", **request)["choices"]
    three = post(client, "/v1/completions", **request, n=3)["choices"]
    assert post(client, "/v1/completions", **request)["choices"] == one
    assert three[0]["text"] == one[0]["text"] and len({c["text"] for c in three}) == 3


def test_a_translation_is_the_beam_search_on_the_device(served, device):
    client, runs = served
    text = "Ein Mann fährt Fahrrad."
    body = post(client, "/v1/translations", model="mt", input=text, beam=3)
    task, run = open_task(runs["mt"]), runs["mt"]
    (ids,), _ = task.encode_sources([text])
    assert body["translation"] == task.translate_ids(run.model, [ids], device, beam=3)[0]
    weights = torch.tensor(body["attention"])
    torch.testing.assert_close(weights.sum(dim=1), torch.ones(len(weights)))
