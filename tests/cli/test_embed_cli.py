"""`attnlab embed` and the contextual word vectors of a BERT encoder, from an attnlab run and from a
Hugging Face BERT folder (checked against transformers itself)."""

import json
from pathlib import Path

import pytest
import torch

from attnlab.tasks.embeddings import load_sentence_encoder
from attnlab.tasks.encoder import load_encoder, word_vectors
from helpers import assert_user_error, cli, hf_bert_folder, shared

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def mlm_run(tmp_path_factory) -> Path:
    return shared(tmp_path_factory, "mlm")


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory) -> Path:
    pytest.importorskip("transformers")
    return hf_bert_folder(tmp_path_factory.mktemp("hf-bert"))


def vectors(capsys, source: Path, *texts: str) -> dict:
    code, out, err = cli(capsys, "embed", source, *texts, "--json")
    assert code == 0, err
    return json.loads(out)


def test_one_vector_of_the_model_width_per_sentence(mlm_run, capsys):
    result = vectors(capsys, mlm_run, "a river bank", "the bank account")
    width = 32  # tests/helpers.py ENCODERS["bert"]["d_model"]
    assert result["dim"] == width
    assert len(result["vectors"]) == 2 and all(len(v) == width for v in result["vectors"])
    assert result["vectors"][0] != result["vectors"][1]
    code, out, _ = cli(capsys, "embed", mlm_run, "a river bank", "the bank account")
    lines = out.splitlines()
    assert code == 0 and len(lines) == 2 and lines[0].split("\t")[0] == "a river bank"
    assert len(lines[0].split("\t")[1].split()) == width


def test_a_sentence_gets_the_same_vector_alone_twice_or_beside_a_longer_one(mlm_run):
    model, tok = load_encoder(mlm_run, CPU)
    encoder = load_sentence_encoder(mlm_run, CPU)
    text = "the bank of the river"
    alone = encoder.embed_texts([text])
    batch = encoder.embed_texts([text, text, "a much longer sentence about the history of the town and its river"])
    assert torch.equal(batch[0], batch[1])
    torch.testing.assert_close(batch[0], alone[0], atol=1e-5, rtol=1e-5)  # padding changes nothing
    # The mean of the last hidden states over the text's tokens, [CLS] and [SEP] included (as
    # sentence-transformers pools a folder without modules.json).
    ids = torch.tensor([[tok.cls_id, *tok.encode(text), tok.sep_id]])
    with torch.no_grad():
        expected = model.encode(ids)[0].mean(0)
    torch.testing.assert_close(alone[0], expected, atol=1e-5, rtol=1e-5)


def test_the_same_word_gets_a_vector_that_depends_on_both_sides(mlm_run):
    model, tok = load_encoder(mlm_run, CPU)
    river, money = "the bank of the river .".split(), "the bank of the money .".split()
    assert tok.encode("river") != tok.encode("money")  # the contexts differ after tokenisation
    a, again, b = (word_vectors(model, tok, words, CPU) for words in (river, river, money))
    assert a.shape == (6, 32)
    assert torch.equal(a, again)  # identical sentences, identical vectors
    # "bank" is word 1 in both; only the words after it differ, which a left-to-right model cannot see.
    assert not torch.allclose(a[1], b[1], atol=1e-4)
    assert not torch.allclose(a[0], a[3], atol=1e-4)  # "the" twice in one sentence: two contexts
    # The vector of a word is the hidden state at its first subword, as the encoder computes it.
    ids = torch.tensor([[tok.cls_id, *tok.encode(" ".join(river)), tok.sep_id]])
    with torch.no_grad():
        hidden = model.encode(ids)[0]
    first = 1 + len(tok.encode("the"))
    torch.testing.assert_close(a[1], hidden[first], atol=1e-5, rtol=1e-5)


def test_embed_from_a_hugging_face_folder_matches_transformers(hf_folder, capsys):
    import transformers

    texts = ["the movie is good", "a bad film"]
    result = vectors(capsys, hf_folder, *texts)
    assert result["dim"] == 32
    model, tok = load_encoder(hf_folder, CPU)
    hf = transformers.BertModel.from_pretrained(hf_folder).eval()
    for text, got in zip(texts, result["vectors"], strict=True):
        ids = torch.tensor([[tok.cls_id, *tok.encode(text), tok.sep_id]])
        with torch.no_grad():  # sentence-transformers' mean: every token, [CLS] and [SEP] included
            expected = hf(input_ids=ids).last_hidden_state[0].mean(0)
        torch.testing.assert_close(torch.tensor(got), expected, atol=1e-4, rtol=1e-4)


def test_embed_errors(mlm_run, capsys, tmp_path, tmp_path_factory):
    assert_user_error(cli(capsys, "embed", mlm_run, "a river bank", ""), "empty")
    assert_user_error(cli(capsys, "embed", mlm_run, "  "), "empty")
    assert_user_error(cli(capsys, "embed", mlm_run), "no text")
    assert_user_error(cli(capsys, "embed", tmp_path / "nowhere", "a bank"), "nowhere")
    bilstm = shared(tmp_path_factory, "sst2-bilstm")
    capsys.readouterr()  # the training log, when this test trained the BiLSTM
    assert_user_error(cli(capsys, "embed", bilstm, "a bank"), "(bilstm), not a BERT encoder")


def test_any_bert_run_embeds_even_a_classifier(capsys, tmp_path_factory):
    classifier = shared(tmp_path_factory, "sst2-bert")
    capsys.readouterr()  # the training log, when this test trained the classifier
    result = vectors(capsys, classifier, "a great movie")
    assert result["dim"] == 32 and len(result["vectors"]) == 1


def test_a_sentence_the_tokenizer_erases_is_an_error_not_a_zero_vector(mlm_run, capsys):
    # A zero-width space survives str.strip() but BERT's normaliser removes it: no token is left.
    assert_user_error(cli(capsys, "embed", mlm_run, "a river bank", "\u200b"), "empty")
