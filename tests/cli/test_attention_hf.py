"""`attnlab attention FOLDER --text ...` on Hugging Face GPT-2, Llama and BERT folders: every layer
and head equal to transformers' own attention weights, labels that read as the text, and
`attnlab.viz.attention_maps` on what `load_causal_lm` returns."""

import json

import pytest
import torch

from attnlab.data.tokenizers import BPETokenizer
from attnlab.families import by_model_type
from attnlab.models.hf import load_bert, load_causal_lm
from attnlab.viz.maps import attention_maps, token_texts
from helpers import assert_user_error, cli, hf_bert_folder
from hf_folders import PROMPT, causal_lm_folder

transformers = pytest.importorskip("transformers")
TEXT = PROMPT + " café?"  # "é" is two bytes: byte-level BPE spells them as two stand-in characters


@pytest.fixture(scope="module", params=["gpt2", "llama"])
def causal(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(request.param)
    causal_lm_folder(folder, request.param)
    return folder


@pytest.fixture(scope="module")
def bert(tmp_path_factory):
    return hf_bert_folder(tmp_path_factory.mktemp("bert"))


@torch.no_grad()
def hf_attentions(folder, ids: list[int], cls) -> list[torch.Tensor]:
    model = cls.from_pretrained(folder, attn_implementation="eager").eval()
    return [a[0] for a in model(torch.tensor([ids]), output_attentions=True).attentions]  # L x (H, T, T)


def test_attention_maps_of_a_causal_folder_equal_transformers(causal):
    loaded = load_causal_lm(causal)
    maps = attention_maps(loaded, TEXT)
    ids = loaded.tokenizer.encode(TEXT)
    want = hf_attentions(causal, ids, transformers.AutoModelForCausalLM)
    assert maps.causal and maps.n_layers == len(want) == 2 and maps.n_heads == 4
    for got, expected in zip(maps.weights, want, strict=True):
        torch.testing.assert_close(torch.from_numpy(got), expected, atol=1e-5, rtol=1e-5)
    # Labels read as the text: "<s>" then the pieces, spaces as spaces (not "Ġ"); the two bytes of
    # "é", each a piece of this small vocabulary, as bytes (not "Ã" and "©").
    assert maps.query_tokens[0] == "<s>" and "".join(maps.query_tokens[1:]) == TEXT.replace("é", "<0xC3><0xA9>")
    assert any(t.startswith(" ") for t in maps.query_tokens) and not any(
        "Ġ" in t or "Ã" in t for t in maps.query_tokens
    )


def test_attention_maps_of_a_bert_folder_equal_transformers(bert):
    loaded = load_bert(bert, head="none")
    maps = attention_maps(loaded, "the movie is good")
    tok = loaded.tokenizer
    ids = [tok.cls_id, *tok.encode("the movie is good"), tok.sep_id]
    want = hf_attentions(bert, ids, transformers.BertModel)
    assert not maps.causal and maps.n_layers == 2 and maps.n_heads == 2
    for got, expected in zip(maps.weights, want, strict=True):
        torch.testing.assert_close(torch.from_numpy(got), expected, atol=1e-5, rtol=1e-5)
    assert maps.query_tokens == ["[CLS]", *tok.token_texts(tok.encode("the movie is good")), "[SEP]"]


@pytest.mark.parametrize("out", ["attention.html", "attention.png"])
def test_the_command_draws_every_layer_and_head_of_a_folder(causal, bert, tmp_path, capsys, out):
    for folder, text, heads in ((causal, TEXT, 4), (bert, "a good movie", 2)):
        path = tmp_path / f"{folder.name}-{out}"
        code, stdout, err = cli(capsys, "attention", folder, "--text", text, "--out", path, "--json")
        assert code == 0, err
        shown = json.loads(stdout)
        assert (shown["layers"], shown["heads"], shown["out"]) == (2, heads, str(path))
        assert path.stat().st_size > 1000
        if out.endswith(".html") and folder == causal:
            page = path.read_text(encoding="utf-8")
            assert '"\\u003c0xC3>"' in page  # the page's JSON escapes "<"


def test_byte_level_labels_show_whole_characters_as_text():
    from attnlab.viz.maps import _byte_level_text

    assert _byte_level_text("ĠcafÃ©") == " café"  # a piece holding both bytes of "é"
    assert _byte_level_text("ĠðŁĺ") == " <0xF0><0x9F><0x98>"  # three of an emoji's four bytes
    assert _byte_level_text("ĊĉHi") == "\n\tHi" and _byte_level_text("<|endoftext|>") == "<|endoftext|>"


def test_sentencepiece_labels_keep_their_word_start_space():
    # Llama 2's and Mistral's vocabularies mark a word's start with "▁"; their decoder strips the
    # first space of a text, so a piece decoded alone would lose it.
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {"▁Hello": 0, "▁world": 1, "!": 2}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    bpe = BPETokenizer(tok)
    assert bpe.token_texts([0, 1, 2]) == ["Hello", "world", "!"]  # what the decoder gives alone
    assert token_texts(bpe, [0, 1, 2]) == [" Hello", " world", "!"]


def test_folder_errors(causal, tmp_path, capsys):
    assert_user_error(cli(capsys, "attention", causal, "--node", "3"), "Hugging Face folder", "--text")
    assert_user_error(cli(capsys, "attention", causal, "--text", "a", "--kind", "cross"), "self-attention only")
    assert_user_error(cli(capsys, "attention", causal, "--text", "a" * 300), "at most 64")
    (tmp_path / "config.json").write_text('{"model_type": "t5"}', encoding="utf-8")
    assert_user_error(cli(capsys, "attention", tmp_path, "--text", "a"), "model_type is 't5'")


@pytest.mark.parametrize(
    "command", [["translate", "Ein Hund"], ["classify", "good"], ["tag", "a dog"], ["plot"], ["report"], ["export"]]
)
def test_the_commands_for_runs_only_refuse_a_folder_naming_those_that_take_one(causal, tmp_path, capsys, command):
    name, *rest = command
    extra = [tmp_path / "out", "--to", "hf"] if name == "export" else []
    result = cli(capsys, name, causal, *extra, *rest)
    model_type = json.loads((causal / "config.json").read_text())["model_type"]
    family = by_model_type(model_type).name
    assert_user_error(
        result,
        f"{causal} is a Hugging Face {family} folder (config.json's model_type is {model_type!r}: a causal language "
        "model), "
        f"which attnlab {name} does not take; attnlab {name} takes a run folder written by attnlab train; "
        "use it with attnlab sample, attnlab chat, attnlab eval, attnlab attention, attnlab serve, "
        "attnlab train --init-from",
    )
