"""Corpora, splits, the encoded-token cache, and batching."""

import os
from pathlib import Path

import numpy as np
import pytest
import torch

from attnlab.data.text import (
    bundled_shakespeare,
    encode,
    encode_splits,
    random_blocks,
    read_corpus,
    sequential_blocks,
    split_text,
    train_tokenizer,
)
from attnlab.data.tokenizers import BPETokenizer, CharTokenizer
from attnlab.errors import UserError

# ------------------------------------------------------------------ read_corpus


def test_empty_path_reads_bundled_tiny_shakespeare():
    text = read_corpus("")
    assert len(text) == 1_115_394
    assert text.startswith("First Citizen:")
    assert text == bundled_shakespeare()


def test_reads_a_user_file_exactly(tmp_path: Path):
    text = "line one\n\tline two é 日本 🎉\r\nno final newline"
    path = tmp_path / "corpus.txt"
    path.write_bytes(text.encode("utf-8"))
    assert read_corpus(str(path)) == text


def test_missing_file_is_a_user_error(tmp_path: Path):
    with pytest.raises(UserError, match="does not exist"):
        read_corpus(str(tmp_path / "missing.txt"))


def test_folder_without_txt_files_is_a_user_error(tmp_path: Path):
    (tmp_path / "notes.md").write_text("not a .txt file", encoding="utf-8")
    with pytest.raises(UserError, match="no .txt files"):
        read_corpus(str(tmp_path))


def test_folder_of_txt_files_is_read_in_name_order_each_file_on_new_lines(tmp_path: Path):
    (tmp_path / "b.txt").write_text("second\n", encoding="utf-8")
    (tmp_path / "a.txt").write_text("first", encoding="utf-8")  # no newline at its end: one is added
    (tmp_path / "c.txt").write_text("third", encoding="utf-8")
    (tmp_path / "skipped.md").write_text("not text for the corpus", encoding="utf-8")
    (tmp_path / "sub.txt").mkdir()  # a folder named like a text file is no file
    assert read_corpus(str(tmp_path)) == "first\nsecond\nthird"


def test_a_bad_file_in_a_folder_is_named(tmp_path: Path):
    (tmp_path / "a.txt").write_text("fine\n", encoding="utf-8")
    (tmp_path / "b.txt").write_bytes(b"bad \xff byte\n")
    with pytest.raises(UserError, match="b.txt"):
        read_corpus(str(tmp_path))


@pytest.mark.parametrize("content", [b"", b" ", b"\n\n\t  \r\n"], ids=["empty", "space", "whitespace"])
def test_empty_or_whitespace_file_is_a_user_error(tmp_path: Path, content):
    path = tmp_path / "corpus.txt"
    path.write_bytes(content)
    with pytest.raises(UserError, match="empty"):
        read_corpus(str(path))


def test_non_utf8_is_a_user_error_naming_the_line(tmp_path: Path):
    path = tmp_path / "corpus.txt"
    # Valid multi-byte UTF-8 on line 2, one invalid byte on line 3.
    path.write_bytes(b"first line\nsecond " + "\u00e9".encode("utf-8") + b" line\nthird \xff line\nfourth\n")
    with pytest.raises(UserError) as e:
        read_corpus(str(path))
    assert "UTF-8" in str(e.value)
    assert "line 3" in str(e.value)


def test_latin1_on_first_line_is_reported_as_line_1(tmp_path: Path):
    path = tmp_path / "corpus.txt"
    path.write_bytes("café\nok\n".encode("latin-1"))
    with pytest.raises(UserError, match="line 1"):
        read_corpus(str(path))


# ------------------------------------------------------------------ split_text


@pytest.mark.parametrize("n", [1, 9, 10, 11, 99, 100, 101, 12345])
def test_split_90_10_boundary(n):
    text = "".join(chr(ord("a") + i % 26) for i in range(n))
    train, val = split_text(text, 0.1)
    # Integer reference: the first floor(0.9 n) characters are training text.
    n_train = n * 9 // 10
    assert train == text[:n_train]
    assert val == text[n_train:]
    assert train + val == text


def test_split_of_tiny_shakespeare_matches_nanogpt():
    text = bundled_shakespeare()
    train, val = split_text(text, 0.1)
    assert len(train) == 1_003_854  # nanoGPT's shakespeare_char prepare.py: int(n * 0.9)
    assert len(val) == 1_115_394 - 1_003_854


# ------------------------------------------------------------------ train_tokenizer and encode


def test_train_tokenizer_char_covers_the_whole_corpus():
    train, full = "abc", "abcxyz"
    tok = train_tokenizer("char", train, full, vocab_size=300)
    assert isinstance(tok, CharTokenizer)
    assert tok.chars == sorted(set(full))


def test_train_tokenizer_unknown_kind_is_a_user_error():
    with pytest.raises(UserError, match="unknown tokenizer"):
        train_tokenizer("wordpiece", "abc", "abc", 300)


def test_encode_dtype_and_values():
    tok = CharTokenizer.train("hello")
    ids = encode(tok, "hole")
    assert ids.dtype == np.uint16
    assert ids.tolist() == [1, 3, 2, 0]


def test_encode_bpe_equals_whole_text_encode_across_chunk_boundaries():
    # Long enough (120,000 characters, 27,000 lines) to be encoded in several chunks, with blank
    # lines, indentation, trailing spaces and CRLF on every side of every line break: the ids must
    # not depend on where the text is cut for parallel encoding ("x\n\n  y" pre-tokenises as
    # "x", "\n\n ", " y"; cut after "\n\n" it would give "\n\n", " ", " y").
    block = "word\n\n  indented\n\tTab\n   \nx  \n\u00e9\u65e5\ncrlf\r\n\n"
    text = block * 3000
    tok = BPETokenizer.train([block * 50], 300)
    assert encode(tok, text).tolist() == tok.encode(text)


# ------------------------------------------------------------------ encode_splits and its cache


def stat(path: Path) -> tuple[int, int]:
    s = os.stat(path)
    return s.st_ino, s.st_mtime_ns


@pytest.mark.parametrize("kind", ["char", "bpe"])
def test_encode_splits_writes_token_files(tmp_path: Path, kind):
    text = "The quick brown fox\njumps over\n\n  the lazy dog. é 日本\n" * 30
    train_text, val_text = split_text(text, 0.1)
    tok = train_tokenizer(kind, train_text, text, 300)
    tok_json = tok.to_json() if isinstance(tok, CharTokenizer) else tok.tokenizer.to_str()
    splits = encode_splits(tok, train_text, val_text, tok_json, tmp_path / "data")
    dtype = np.uint16
    for name, split_text_, arr in (("train", train_text, splits.train), ("val", val_text, splits.val)):
        expected = tok.encode(split_text_)
        assert arr.tolist() == expected
        assert np.fromfile(tmp_path / "data" / f"{name}.bin", dtype=dtype).tolist() == expected
        assert tok.decode([int(i) for i in arr]) == split_text_


def test_encode_splits_reuses_then_rewrites(tmp_path: Path):
    cache = tmp_path / "data"
    text = "abcdefghij\n" * 20
    tok = CharTokenizer.train(text)
    train_text, val_text = split_text(text, 0.1)
    first = encode_splits(tok, train_text, val_text, tok.to_json(), cache)
    before = {name: stat(cache / f"{name}.bin") for name in ("train", "val")}
    meta_before = stat(cache / "meta.json")

    # Same inputs: nothing is rewritten.
    again = encode_splits(tok, train_text, val_text, tok.to_json(), cache)
    assert {name: stat(cache / f"{name}.bin") for name in ("train", "val")} == before
    assert stat(cache / "meta.json") == meta_before
    assert again.train.tolist() == first.train.tolist() and again.val.tolist() == first.val.tolist()

    # Changed text: both files are written afresh and hold the new encoding.
    text2 = "jihgfedcba\n" * 25
    train2, val2 = split_text(text2, 0.1)
    changed = encode_splits(tok, train2, val2, tok.to_json(), cache)
    assert stat(cache / "train.bin") != before["train"]
    assert changed.train.tolist() == tok.encode(train2)
    assert changed.val.tolist() == tok.encode(val2)

    # Changed tokenizer, same text: rewritten with the new ids.
    tok3 = CharTokenizer(list(reversed(tok.chars)))
    after_text_change = stat(cache / "train.bin")
    changed3 = encode_splits(tok3, train2, val2, tok3.to_json(), cache)
    assert stat(cache / "train.bin") != after_text_change
    assert changed3.train.tolist() == tok3.encode(train2)


def test_encode_splits_with_an_empty_split(tmp_path: Path):
    # A corpus of one character splits into no training text; the task reports it as too short,
    # so encoding must give an empty array rather than fail to map an empty file.
    tok = CharTokenizer.train("x")
    train_text, val_text = split_text("x", 0.1)
    assert train_text == ""
    splits = encode_splits(tok, train_text, val_text, tok.to_json(), tmp_path / "data")
    assert len(splits.train) == 0
    assert splits.val.tolist() == [0]


# ------------------------------------------------------------------ batching


def test_random_blocks_shapes_targets_and_offsets():
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 60000, size=500).astype(np.uint16)
    g = torch.Generator().manual_seed(1)
    x, y = random_blocks(tokens, batch_size=7, block_size=16, generator=g)
    assert x.shape == (7, 16) and y.shape == (7, 16)
    assert x.dtype == torch.long and y.dtype == torch.long
    assert torch.equal(x[:, 1:], y[:, :-1])
    # Find each row's offset independently and check x and y against the token array there.
    for row_x, row_y in zip(x.numpy(), y.numpy(), strict=True):
        starts = [s for s in range(len(tokens) - 16) if np.array_equal(tokens[s : s + 16], row_x)]
        assert starts, "row is not a contiguous window of the tokens"
        s = starts[0]
        assert np.array_equal(tokens[s + 1 : s + 17], row_y)


def test_random_blocks_is_deterministic_for_a_seeded_generator():
    tokens = np.arange(1000, dtype=np.uint16)
    a = random_blocks(tokens, 5, 8, torch.Generator().manual_seed(42))
    b = random_blocks(tokens, 5, 8, torch.Generator().manual_seed(42))
    c = random_blocks(tokens, 5, 8, torch.Generator().manual_seed(43))
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert not torch.equal(a[0], c[0])


def test_random_blocks_covers_every_window_and_stays_in_range():
    n, block = 12, 4
    tokens = np.arange(n, dtype=np.uint16)  # token value = its position
    g = torch.Generator().manual_seed(0)
    starts = set()
    for _ in range(50):
        x, y = random_blocks(tokens, 8, block, g)
        starts.update(x[:, 0].tolist())
        assert torch.equal(x, x[:, :1] + torch.arange(block))
        assert torch.equal(y, x + 1)
        assert int(y.max()) <= n - 1
    # Every start whose target window fits: 0 .. n - block - 1, and nothing else.
    assert starts == set(range(n - block))


@pytest.mark.parametrize("n,block,batch", [(33, 4, 3), (32, 4, 3), (9, 4, 5), (100, 7, 4), (5, 4, 2)])
def test_sequential_blocks_covers_non_overlapping_blocks_in_order(n, block, batch):
    tokens = np.arange(n, dtype=np.uint16) * 3  # distinct values, not equal to positions
    batches = list(sequential_blocks(tokens, block, batch))
    xs = torch.cat([x for x, _ in batches]) if batches else torch.empty(0, block, dtype=torch.long)
    ys = torch.cat([y for _, y in batches]) if batches else torch.empty(0, block, dtype=torch.long)
    # Reference: block i is tokens[i*T : (i+1)*T], its targets tokens[i*T + 1 : (i+1)*T + 1].
    expected_x, expected_y = [], []
    i = 0
    while (i + 1) * block + 1 <= n:
        expected_x.append(tokens[i * block : (i + 1) * block].tolist())
        expected_y.append(tokens[i * block + 1 : (i + 1) * block + 1].tolist())
        i += 1
    assert xs.tolist() == expected_x
    assert ys.tolist() == expected_y
    assert all(len(x) <= batch for x, _ in batches)
    assert all(len(x) == batch for x, _ in batches[:-1])
    assert all(x.dtype == torch.long for x, _ in batches)
