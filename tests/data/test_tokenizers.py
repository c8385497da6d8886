"""Tokenizers: the character vocabulary, exact round trips, saving and loading, bad files."""

import json
from pathlib import Path

import pytest

from attnlab.data.tokenizers import CHAR_FORMAT, BPETokenizer, CharTokenizer, load_tokenizer
from attnlab.errors import UserError

# Unicode (accents, CJK, emoji), tabs, runs of spaces, leading spaces, blank lines and a line
# without a final newline: everything a byte-level BPE must carry through unchanged.
BPE_CORPUS = (
    "First Citizen:\n"
    "Before we proceed any further, hear me speak.\n"
    "\n"
    "  Two leading spaces,   three inside,\tand a tab.\n"
    "\tA tab first; café, naïve, résumé, élan.\n"
    "日本語のテキスト、日本。\n"
    "emoji 🎉🚀 and   🙂 between words\n"
    "   \n"
    "Last line without newline"
) * 8

UNSEEN = [
    "",
    " ",
    "   ",
    "\n\n\n",
    "  leading and trailing  ",
    "Ω≈ç√∫ µ — “quotes” «guillemets»",
    "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 and 🧪🦀 emoji never seen",
    "mixed\r\nline\rendings\n",
    "control \x00 \x07 \x1b[0m chars",
    "日本 Ελληνικά Русский עברית العربية",
    "tabs\t\t\tand\u00a0nbsp\u2028separator",
]


def bpe(vocab_size: int = 300) -> BPETokenizer:
    return BPETokenizer.train([BPE_CORPUS], vocab_size)


# ------------------------------------------------------------------ characters


def test_char_vocab_is_sorted_set_of_corpus_characters():
    text = "hello world\nhow are you?"
    tok = CharTokenizer.train(text)
    assert tok.chars == sorted(set(text))
    assert tok.vocab_size == len(set(text))
    assert tok.eos_id is None


def test_char_encode_worked_example():
    # Vocabulary of "hello" is ['e', 'h', 'l', 'o']: e=0, h=1, l=2, o=3.
    tok = CharTokenizer.train("hello")
    assert tok.chars == ["e", "h", "l", "o"]
    assert tok.encode("hole") == [1, 3, 2, 0]
    assert tok.encode("hello") == [1, 0, 2, 2, 3]
    assert tok.encode("") == []
    assert tok.decode([3, 2, 2, 0, 1]) == "olleh"


def test_char_round_trip_is_exact():
    text = "Tabs\tand  spaces\n\nunicode: é 日本 🎉\r\n"
    tok = CharTokenizer.train(text)
    ids = tok.encode(text)
    assert len(ids) == len(text)
    assert tok.decode(ids) == text
    # Each id names the position of its character in the sorted vocabulary.
    assert ids == [sorted(set(text)).index(c) for c in text]


def test_char_rejects_duplicate_characters():
    with pytest.raises(ValueError):
        CharTokenizer(["a", "b", "a"])


@pytest.mark.parametrize("unknown", ["z", "€", "🎉"])
def test_char_unknown_character_is_a_user_error_naming_it(unknown):
    tok = CharTokenizer.train("abc")
    with pytest.raises(UserError) as e:
        tok.encode(f"ab{unknown}c")
    assert repr(unknown) in str(e.value)
    # Known characters are not reported as unknown.
    assert "'a'" not in str(e.value) and "'b'" not in str(e.value)


def test_char_save_load_round_trip(tmp_path: Path):
    text = "To be, or not to be:\n\tthat is the question. é 日本 🎉"
    tok = CharTokenizer.train(text)
    path = tmp_path / "tokenizer.json"
    tok.save(path)
    doc = json.loads(path.read_text(encoding="utf-8"))
    assert doc["format"] == CHAR_FORMAT and isinstance(doc["version"], int)
    loaded = load_tokenizer(path)
    assert isinstance(loaded, CharTokenizer)
    assert loaded.chars == tok.chars
    assert loaded.encode(text) == tok.encode(text)
    assert loaded.decode(tok.encode(text)) == text


def test_char_unsupported_version_is_a_user_error(tmp_path: Path):
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps({"format": CHAR_FORMAT, "version": 999, "chars": ["a"]}), encoding="utf-8")
    with pytest.raises(UserError, match="version"):
        load_tokenizer(path)


# ------------------------------------------------------------------ byte-level BPE


def test_bpe_round_trip_on_the_training_corpus():
    tok = bpe()
    assert tok.decode(tok.encode(BPE_CORPUS)) == BPE_CORPUS
    for line in BPE_CORPUS.splitlines(keepends=True):
        assert tok.decode(tok.encode(line)) == line


@pytest.mark.parametrize("text", UNSEEN)
def test_bpe_round_trip_on_unseen_text(text):
    tok = bpe()
    assert tok.decode(tok.encode(text)) == text


def test_bpe_learns_merges_and_respects_vocab_size():
    tok = bpe(300)
    assert 257 < tok.vocab_size <= 300  # 256 bytes + <|endoftext|>, plus some merges
    ids = tok.encode(BPE_CORPUS)
    assert max(ids) < tok.vocab_size
    # Merges compress: fewer tokens than UTF-8 bytes.
    assert len(ids) < len(BPE_CORPUS.encode("utf-8"))
    assert bpe(280).vocab_size <= 280


def test_bpe_has_eos_token():
    tok = bpe()
    assert tok.eos_id is not None
    assert tok.decode([tok.eos_id]) == "<|endoftext|>"


def test_bpe_save_load_round_trip(tmp_path: Path):
    tok = bpe()
    path = tmp_path / "tokenizer.json"
    tok.save(path)
    loaded = load_tokenizer(path)
    assert isinstance(loaded, BPETokenizer)
    assert loaded.vocab_size == tok.vocab_size and loaded.eos_id == tok.eos_id
    for text in [BPE_CORPUS, *UNSEEN]:
        assert loaded.encode(text) == tok.encode(text)
        assert loaded.decode(tok.encode(text)) == text


def llama_named_bpe() -> BPETokenizer:
    """A BPE whose bos and eos are Llama's "<s>" and "</s>", which attnlab's names do not find."""
    tok = BPETokenizer.train([BPE_CORPUS], 300, special_tokens=("<s>", "</s>"))
    assert (tok.bos_id, tok.eos_id) == (None, None)
    return BPETokenizer(tok.tokenizer, bos_id=0, eos_id=1)


def test_bpe_bos_and_eos_given_by_id_survive_save_and_load(tmp_path: Path):
    path = tmp_path / "tokenizer.json"
    llama_named_bpe().save(path)
    assert json.loads((tmp_path / "tokenizer_config.json").read_text()) == {"bos_token": "<s>", "eos_token": "</s>"}
    loaded = load_tokenizer(path)
    assert (loaded.bos_id, loaded.eos_id) == (0, 1)
    # transformers' own form of the file (AddedToken objects) reads the same.
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": {"content": "</s>", "lstrip": False}}))
    assert load_tokenizer(path).eos_id == 1


def test_a_bpe_whose_names_say_it_all_writes_no_companion(tmp_path: Path):
    bpe().save(tmp_path / "tokenizer.json")
    assert not (tmp_path / "tokenizer_config.json").exists()


@pytest.mark.parametrize("content", ['{"eos_token": "<|im_end|>"}', "{not json"])
def test_a_companion_that_does_not_fit_its_tokenizer_is_one_line(tmp_path: Path, content):
    path = tmp_path / "tokenizer.json"
    llama_named_bpe().save(path)
    (tmp_path / "tokenizer_config.json").write_text(content)
    with pytest.raises(UserError, match="tokenizer_config.json"):
        load_tokenizer(path)


def test_bpe_encode_batch_matches_encode():
    tok = bpe()
    texts = BPE_CORPUS.splitlines(keepends=True) + UNSEEN
    assert tok.encode_batch(texts) == [tok.encode(t) for t in texts]


# ------------------------------------------------------------------ bad files

CORRUPT = {
    "not-json": b"this is not json",
    "truncated": b'{"format": "attnlab-char", "version": 1, "chars": ["a", "b"',
    "empty": b"",
    "not-utf8": b"\xff\xfe\x00garbage",
    "json-list": b"[1, 2, 3]",
    "json-string": b'"tokenizer"',
    "json-null": b"null",
    "empty-object": b"{}",
    "char-without-chars": b'{"format": "attnlab-char", "version": 1}',
    "char-chars-not-a-list": b'{"format": "attnlab-char", "version": 1, "chars": 5}',
    "char-duplicate-chars": b'{"format": "attnlab-char", "version": 1, "chars": ["a", "a"]}',
    "char-multi-char-entry": b'{"format": "attnlab-char", "version": 1, "chars": ["ab", "c"]}',
    "hf-missing-model": b'{"version": "1.0", "truncation": null}',
}


@pytest.mark.parametrize("name", sorted(CORRUPT))
def test_load_corrupt_file_is_a_user_error(tmp_path: Path, name):
    path = tmp_path / "tokenizer.json"
    path.write_bytes(CORRUPT[name])
    with pytest.raises(UserError) as e:
        load_tokenizer(path)
    assert str(path) in str(e.value)


def test_load_truncated_bpe_file_is_a_user_error(tmp_path: Path):
    path = tmp_path / "tokenizer.json"
    bpe().save(path)
    text = path.read_text(encoding="utf-8")
    path.write_text(text[: len(text) // 2], encoding="utf-8")
    with pytest.raises(UserError):
        load_tokenizer(path)


def test_load_missing_file_is_a_user_error(tmp_path: Path):
    path = tmp_path / "nowhere" / "tokenizer.json"
    with pytest.raises(UserError, match="does not exist"):
        load_tokenizer(path)


def test_load_directory_is_a_user_error(tmp_path: Path):
    with pytest.raises(UserError):
        load_tokenizer(tmp_path)


def test_bpe_token_texts_are_real_characters():
    tok = BPETokenizer.train(["Ein Mann fährt Fahrrad über die Straße.\n" * 20], 300)
    ids = tok.encode(" fährt über")
    texts = tok.token_texts(ids)
    assert "".join(texts) == " fährt über"  # whole characters here: concatenation is the text
    assert not any("Ã" in t for t in texts)
