"""Tagging with a RoBERTa folder's byte-level BPE: attnlab encodes pre-split words as transformers'
RobertaTokenizer (roberta-base's class) does with add_prefix_space=True, the setting it asks for with
is_split_into_words and the lectures' lab passes: each word after a space. A WordPiece vocabulary's
words are left as they are."""

import pytest

from attnlab.data.tokenizers import EncoderTokenizer
from attnlab.models.hf.roberta import read_roberta_tokenizer
from attnlab.tasks.token_classification import TokenClassification, sentence_words
from roberta_folders import write_tokenizer

transformers = pytest.importorskip("transformers")

SENTENCES = [
    ["ROMEO", ":", "What", "light", "through", "yonder", "window", "breaks", "?"],
    ["I", "'m", "sure", "he", "ca", "n't", "--", "naïve", "café", "!"],
    ["Thou"],
]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    path = tmp_path_factory.mktemp("roberta-tokenizer")
    write_tokenizer(path)
    return path


def encode(tokenizer: EncoderTokenizer, words: list[str]) -> tuple[list[int], list[int]]:
    """The row and word starts a tagging task builds (`TokenClassification.encode_sentences`, max_len 64)."""
    task = TokenClassification.__new__(TokenClassification)  # the encoding alone: no data files, no model
    task.tokenizer, task.max_len = tokenizer, 64
    ids, starts, cut = task.encode_sentences([words])
    assert cut == 0
    return ids[0], starts[0]


@pytest.mark.parametrize("words", SENTENCES, ids=["plain", "clitics-accents", "one-word"])
def test_words_get_the_ids_of_transformers_with_add_prefix_space(folder, words):
    theirs = transformers.RobertaTokenizer.from_pretrained(str(folder), add_prefix_space=True)
    want = theirs(words, is_split_into_words=True)
    first = [want.word_ids().index(i) for i in range(len(words))]  # each word's first subword
    ids, starts = encode(read_roberta_tokenizer(folder), words)
    assert ids == want["input_ids"]
    assert starts == first


def test_without_the_space_the_ids_would_differ(folder):
    """The control: the words encoded as they are (what tagging did) are not transformers' ids."""
    tokenizer = read_roberta_tokenizer(folder)
    theirs = transformers.RobertaTokenizer.from_pretrained(str(folder), add_prefix_space=True)
    plain, _ = tokenizer.encode_words(SENTENCES[0])
    assert [tokenizer.cls_id, *plain, tokenizer.sep_id] != theirs(SENTENCES[0], is_split_into_words=True)["input_ids"]


def test_a_wordpiece_vocabulary_takes_the_words_as_they_are():
    tokenizer = EncoderTokenizer.train(["the cat sat on the mat"] * 5, 60)
    assert sentence_words(tokenizer, ["the", "cat"]) == ["the", "cat"]
