"""WordPiece: fixed special ids, BERT normalisation, word alignment for taggers, files, and HF parity."""

import json

import pytest

from attnlab.data.tokenizers import BPETokenizer, WordPieceTokenizer, load_tokenizer
from attnlab.errors import UserError

CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Running, jumping and swimming are the dogs' favourite games!",
    "A café in Zürich serves naïve tourists; the tourists don't mind.",
    "Unbelievable: the foxes were running quicker than the dogs.",
] * 10

# A hand-written vocabulary: ids are line numbers, specials deliberately not first.
VOCAB = ["the", "[PAD]", "cat", "[UNK]", "##s", "[CLS]", "un", "##aff", "##able", "[SEP]", "!", "[MASK]", "cafe"]


@pytest.fixture(scope="module")
def trained() -> WordPieceTokenizer:
    return WordPieceTokenizer.train(CORPUS, 200)


@pytest.fixture
def vocab_file(tmp_path):
    path = tmp_path / "vocab.txt"
    path.write_text("\n".join(VOCAB) + "\n", encoding="utf-8")
    return path


def test_special_ids_are_fixed(trained):
    t = trained
    assert (t.pad_id, t.unk_id, t.cls_id, t.sep_id, t.mask_id) == (0, 1, 2, 3, 4)
    assert t.special_ids == [0, 1, 2, 3, 4]
    assert t.bos_id is None and t.eos_id is None
    assert 5 < t.vocab_size <= 200
    assert t.token_texts([0, 1, 2, 3, 4]) == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def test_encode_decode(trained):
    ids = trained.encode("The Dogs were RUNNING!")
    assert all(i not in trained.special_ids for i in ids)
    assert trained.decode(ids) == "the dogs were running!"  # lowercased, "!" glued back
    assert trained.encode_batch(["the fox", "dogs"]) == [trained.encode("the fox"), trained.encode("dogs")]
    assert trained.encode("") == []


def test_accents_are_stripped_when_lowercasing(trained):
    assert trained.encode("Café Zürich") == trained.encode("cafe zurich")
    cased = WordPieceTokenizer.train(CORPUS, 200, lowercase=False)
    assert cased.decode(cased.encode("The café")) == "The café"


def test_special_tokens_match_in_raw_text(trained):
    # A task maps WikiText's "<unk>" to the text "[UNK]": it must become the one unk id.
    assert trained.encode("[UNK]") == [trained.unk_id]
    ids = trained.encode("the [MASK] dog [UNK].")
    assert trained.mask_id in ids and trained.unk_id in ids
    assert trained.encode("[unk]") != [trained.unk_id]  # only the exact spelling is special


def test_unknown_characters_become_unk(trained):
    assert trained.encode("€") == [trained.unk_id]


def test_decode_skip_special(trained):
    ids = [trained.cls_id, *trained.encode("the dog"), trained.sep_id, trained.pad_id]
    assert trained.decode(ids, skip_special=True) == "the dog"
    assert "[CLS]" in trained.decode(ids)


def test_encode_words_first_subword_positions(vocab_file):
    tok = WordPieceTokenizer.from_vocab_txt(vocab_file)
    ids, starts = tok.encode_words(["Unaffable", "cats", "!", "the"])
    assert tok.token_texts(ids) == ["un", "##aff", "##able", "cat", "##s", "!", "the"]
    assert starts == [0, 3, 5, 6]


def test_encode_words_splits_punctuation_inside_a_word(trained):
    ids, starts = trained.encode_words(["don't", "run"])
    assert len(trained.token_texts(ids[: starts[1]])) >= 3  # don ' t: one word, several pieces
    assert ids[starts[1] :] == trained.encode("run")


@pytest.mark.parametrize("erased", ["", " ", "\u200b", "\x00"])
def test_encode_words_erased_word_gets_unk(trained, erased):
    # The normaliser drops these entirely; the word still needs a position for its label.
    words = ["the", erased, "dog"]
    ids, starts = trained.encode_words(words)
    assert len(starts) == len(words)
    assert ids[starts[1]] == trained.unk_id
    assert starts == [0, starts[1], starts[1] + 1]
    assert ids[starts[2] :] == trained.encode("dog")


def test_encode_words_lengths_always_line_up(trained):
    words = ["\u200b", "Zürich", "", "naïve", "€", "quick-brown", "\x00"]
    ids, starts = trained.encode_words(words)
    assert len(starts) == len(words)
    assert starts == sorted(set(starts)) and starts[0] == 0 and starts[-1] < len(ids)
    assert trained.encode_words([]) == ([], [])


def test_save_and_load_round_trip(trained, tmp_path):
    path = tmp_path / "tokenizer.json"
    trained.save(path)
    assert json.loads(path.read_text())["model"]["type"] == "WordPiece"
    loaded = load_tokenizer(path)
    assert isinstance(loaded, WordPieceTokenizer)
    text = "The quick dogs [MASK] swimming"
    assert loaded.encode(text) == trained.encode(text)
    assert loaded.special_ids == trained.special_ids and loaded.vocab_size == trained.vocab_size


def test_bpe_files_still_load_as_bpe(tmp_path):
    path = tmp_path / "tokenizer.json"
    BPETokenizer.train(CORPUS, 300).save(path)
    assert isinstance(load_tokenizer(path), BPETokenizer)


def test_from_vocab_txt(vocab_file):
    tok = WordPieceTokenizer.from_vocab_txt(vocab_file)
    assert tok.vocab_size == len(VOCAB)
    assert (tok.pad_id, tok.unk_id, tok.cls_id, tok.sep_id, tok.mask_id) == (1, 3, 5, 9, 11)
    assert tok.special_ids == [1, 3, 5, 9, 11]
    assert tok.encode("The CATS [MASK] unaffable!") == [0, 2, 4, 11, 6, 7, 8, 10]
    assert tok.encode("Café dog") == [12, 3]
    assert tok.decode([6, 7, 8, 10]) == "unaffable!"


def test_from_vocab_txt_cased(vocab_file):
    tok = WordPieceTokenizer.from_vocab_txt(vocab_file, lowercase=False)
    assert tok.encode("The the") == [3, 0]


def test_from_vocab_txt_matches_transformers(vocab_file):
    transformers = pytest.importorskip("transformers")
    # A local folder holding vocab.txt: read from disk, nothing is downloaded.
    theirs = transformers.BertTokenizer.from_pretrained(str(vocab_file.parent), do_lower_case=True)
    ours = WordPieceTokenizer.from_vocab_txt(vocab_file)
    for text in ["The CATS [MASK] unaffable!", "Café   cat\tcats", "unknown cats!!", "[SEP] the"]:
        assert ours.encode(text) == theirs.encode(text, add_special_tokens=False), text


def test_from_vocab_txt_missing_special_token(tmp_path):
    path = tmp_path / "vocab.txt"
    path.write_text("\n".join(t for t in VOCAB if t != "[MASK]") + "\n", encoding="utf-8")
    with pytest.raises(UserError) as e:
        WordPieceTokenizer.from_vocab_txt(path)
    assert str(path) in str(e.value) and "[MASK]" in str(e.value)


def test_from_vocab_txt_missing_file(tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        WordPieceTokenizer.from_vocab_txt(tmp_path / "vocab.txt")


def test_bpe_in_the_bert_pipeline(tmp_path):
    bpe = WordPieceTokenizer.train(CORPUS * 3, 150, algorithm="bpe")
    assert [bpe.pad_id, bpe.unk_id, bpe.cls_id, bpe.sep_id, bpe.mask_id] == [0, 1, 2, 3, 4]
    text = " ".join(CORPUS).lower()
    ids = bpe.encode(text)
    pieces = bpe.token_texts(ids)
    # Subword units, continuation pieces marked the BERT way, and decoding joins them back to words.
    assert any(p.startswith("##") for p in pieces) and len(ids) > len(text.split())
    assert bpe.encode(bpe.decode(ids)) == ids  # decoding joins the pieces back into the same words
    words = ["Unaffable", "horses", "!"]
    ids, starts = bpe.encode_words(words)
    assert len(starts) == 3 and starts[0] == 0 and starts == sorted(starts)
    path = tmp_path / "tokenizer.json"
    bpe.save(path)
    loaded = load_tokenizer(path)
    assert isinstance(loaded, WordPieceTokenizer) and loaded.encode(text) == bpe.encode(text)


def test_unknown_algorithm():
    with pytest.raises(ValueError, match="algorithm"):
        WordPieceTokenizer.train(CORPUS, 100, algorithm="unigram")
