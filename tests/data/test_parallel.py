"""Parallel corpora: reading plain and gzip files, Multi30k splits, joint BPE, encoding, batching, collation."""

import gzip
import random
import shutil
from pathlib import Path

import pytest
import torch

from attnlab.data.parallel import (
    MULTI30K_SPLITS,
    EncodedPairs,
    ParallelCorpus,
    collate,
    encode_pairs,
    load_multi30k,
    multi30k_paths,
    read_lines,
    read_parallel,
    token_batches,
    train_joint_bpe,
)
from attnlab.data.tokenizers import BPETokenizer, load_tokenizer
from attnlab.errors import UserError

FIXTURE = Path(__file__).parents[1] / "fixtures" / "multi30k"
FIXTURE_COUNTS = {"train": 200, "val": 50, "test2016": 50, "test2017": 50}
SHARED = Path("/work/shared/data/multi30k")


def gunzip_lines(path: Path) -> list[str]:
    """An independent reading of a gzip text file: the standard library, line by line."""
    with gzip.open(path, "rt", encoding="utf-8", newline="") as f:
        return [line.rstrip("\n") for line in f]


@pytest.fixture(scope="module")
def train_corpus() -> ParallelCorpus:
    return load_multi30k(FIXTURE, "train")


@pytest.fixture(scope="module")
def joint_bpe(train_corpus) -> BPETokenizer:
    return train_joint_bpe(train_corpus, vocab_size=600)


# ------------------------------------------------------------------ reading files

LINES = ["Zwei Männer stehen am Herd.", "", "  Ein Mädchen mit Größe \t", "Straße, Übermut, Ökologie 🎉"]


def test_gzip_and_plain_read_the_same(tmp_path: Path):
    text = "\n".join(LINES) + "\n"
    # The names lie on purpose: the format is told by the magic bytes, not the suffix.
    plain, packed = tmp_path / "plain.gz", tmp_path / "packed.txt"
    plain.write_bytes(text.encode("utf-8"))
    packed.write_bytes(gzip.compress(text.encode("utf-8")))
    assert read_lines(plain) == LINES
    assert read_lines(packed) == LINES


@pytest.mark.parametrize(
    "raw, lines",
    [
        (b"a\nb\n", ["a", "b"]),
        (b"a\nb", ["a", "b"]),  # no final newline
        (b"a\r\nb\r\n", ["a", "b"]),  # Windows line ends
        (b"\xef\xbb\xbfa\nb\n", ["a", "b"]),  # byte-order mark
        (b"a\n\nb\n", ["a", "", "b"]),  # an empty line is a line
        ("a\u2028x\nb\n".encode(), ["a\u2028x", "b"]),  # only \n ends a line
        (b"", []),
    ],
)
def test_read_lines_edge_cases(tmp_path: Path, raw: bytes, lines: list[str]):
    path = tmp_path / "f.txt"
    path.write_bytes(raw)
    assert read_lines(path) == lines


@pytest.mark.parametrize("packed", [False, True])
def test_non_utf8_byte_names_file_and_line(tmp_path: Path, packed: bool):
    raw = b"eins\nzwei\n" + b"dr\xe9i\n" + b"vier\n"  # Latin-1 "é" on line 3
    path = tmp_path / "de.txt"
    path.write_bytes(gzip.compress(raw) if packed else raw)
    with pytest.raises(UserError) as e:
        read_lines(path)
    msg = str(e.value)
    assert f"{path}:3 " in msg and "UTF-8" in msg and "0xe9" in msg


def test_missing_file_and_folder_are_user_errors(tmp_path: Path):
    with pytest.raises(UserError, match="does not exist"):
        read_lines(tmp_path / "nowhere.de.gz")
    with pytest.raises(UserError, match="not a file"):
        read_lines(tmp_path)


def test_damaged_gzip_is_a_user_error(tmp_path: Path):
    path = tmp_path / "train.de.gz"
    path.write_bytes(gzip.compress(b"Ein Hund.\n" * 100)[:30])
    with pytest.raises(UserError, match="gzip"):
        read_lines(path)


def test_mismatched_line_counts_name_both_files_and_counts(tmp_path: Path):
    src, tgt = tmp_path / "a.de", tmp_path / "b.en"
    src.write_text("eins\nzwei\ndrei\n", encoding="utf-8")
    tgt.write_text("one\ntwo\n", encoding="utf-8")
    with pytest.raises(UserError) as e:
        read_parallel(src, tgt)
    msg = str(e.value)
    assert str(src) in msg and str(tgt) in msg
    assert "3 lines" in msg and "has 2" in msg


def test_pairs_are_stripped_and_empty_pairs_skipped_and_counted(tmp_path: Path):
    src, tgt = tmp_path / "s.de", tmp_path / "t.en"
    src.write_text("  Ein Hund.\t\n\nZwei Katzen.\n   \nDrei.\n", encoding="utf-8")
    tgt.write_text("A dog.  \nNothing.\n\nBlank source.\n Three.\n", encoding="utf-8")
    corpus = read_parallel(src, tgt)
    assert corpus.pairs == [("Ein Hund.", "A dog."), ("Drei.", "Three.")]
    assert corpus.skipped_empty == 3


# ------------------------------------------------------------------ Multi30k


@pytest.mark.parametrize("split", list(MULTI30K_SPLITS))
def test_load_multi30k_fixture_splits(split: str):
    corpus = load_multi30k(FIXTURE, split)
    assert len(corpus.pairs) == FIXTURE_COUNTS[split]
    assert corpus.skipped_empty == 0
    stem = MULTI30K_SPLITS[split]
    de, en = gunzip_lines(FIXTURE / f"{stem}.de.gz"), gunzip_lines(FIXTURE / f"{stem}.en.gz")
    assert corpus.pairs[0] == (de[0].strip(), en[0].strip())
    assert corpus.pairs == [(d.strip(), e.strip()) for d, e in zip(de, en, strict=True)]


def test_first_train_pair_text():
    corpus = load_multi30k(FIXTURE, "train")
    assert corpus.pairs[0] == (
        "Zwei junge weiße Männer sind im Freien in der Nähe vieler Büsche.",
        "Two young, White males are outside near many bushes.",
    )


def test_languages_can_be_swapped():
    de_en, en_de = load_multi30k(FIXTURE, "val"), load_multi30k(FIXTURE, "val", src_lang="en", tgt_lang="de")
    assert en_de.pairs == [(e, d) for d, e in de_en.pairs]


@pytest.mark.skipif(not SHARED.is_dir(), reason="the full Multi30k copy is not on this machine")
def test_full_multi30k_counts():
    counts = {"train": 29000, "val": 1014, "test2016": 1000, "test2017": 1000}
    for split, n in counts.items():
        assert len(load_multi30k(SHARED, split).pairs) == n


def test_missing_split_files_are_listed(tmp_path: Path):
    folder = tmp_path / "multi30k"
    shutil.copytree(FIXTURE, folder)
    (folder / "val.de.gz").unlink()
    (folder / "val.en.gz").unlink()
    (folder / "test_2017_flickr.en.gz").unlink()
    with pytest.raises(UserError) as e:
        load_multi30k(folder, "val")
    msg = str(e.value)
    assert f"{folder} lacks val.de.gz, val.en.gz;" in msg
    assert "{train,val,test_2016_flickr,test_2017_flickr}.{de,en}.gz" in msg
    with pytest.raises(UserError) as e:
        load_multi30k(folder, "test2017")
    assert "lacks test_2017_flickr.en.gz;" in str(e.value) and "test_2017_flickr.de.gz," not in str(e.value)
    assert len(load_multi30k(folder, "train").pairs) == 200  # the other splits still load


@pytest.mark.parametrize("data_dir", [None, "", "  "])
def test_no_data_dir_is_a_user_error(data_dir):
    with pytest.raises(UserError, match="no Multi30k folder given"):
        load_multi30k(data_dir, "train")


def test_nonexistent_folder_is_a_user_error(tmp_path: Path):
    with pytest.raises(UserError, match="does not exist") as e:
        load_multi30k(tmp_path / "nowhere", "train")
    assert "{de,en}.gz" in str(e.value)


def test_unknown_split_lists_the_split_names():
    with pytest.raises(UserError) as e:
        multi30k_paths(FIXTURE, "test")
    assert "'test'" in str(e.value) and "train, val, test2016, test2017" in str(e.value)


def test_multi30k_paths():
    assert multi30k_paths(FIXTURE, "test2016") == (
        FIXTURE / "test_2016_flickr.de.gz",
        FIXTURE / "test_2016_flickr.en.gz",
    )


# ------------------------------------------------------------------ joint BPE


def test_joint_bpe_special_ids(joint_bpe: BPETokenizer):
    assert (joint_bpe.pad_id, joint_bpe.bos_id, joint_bpe.eos_id) == (0, 1, 2)
    assert [joint_bpe.tokenizer.id_to_token(i) for i in range(3)] == ["<pad>", "<bos>", "<eos>"]


def test_joint_bpe_respects_vocab_size_and_covers_both_languages(joint_bpe: BPETokenizer, train_corpus):
    assert 259 < joint_bpe.vocab_size <= 600
    vocab = joint_bpe.tokenizer.get_vocab()
    # Byte-level BPE writes a leading space as "Ġ"; frequent words of either language became tokens.
    assert "Ġder" in vocab and "Ġthe" in vocab


@pytest.mark.parametrize(
    "text",
    [
        "Zwei junge weiße Männer sind im Freien in der Nähe vieler Büsche.",
        "Größere Übungen: Ärger, Öl, Süße – „Straße“ ÄÖÜäöüß",
        "Two young, White males are outside near many bushes.",
        "A café's naïve résumé — 日本 🎉",
        "  spaces\tand tabs  ",
    ],
)
def test_joint_bpe_round_trips_exactly(joint_bpe: BPETokenizer, text: str):
    assert joint_bpe.decode(joint_bpe.encode(text)) == text


def test_decode_skips_special_tokens_when_asked(joint_bpe: BPETokenizer):
    ids = joint_bpe.encode("Ein Hund läuft.")
    framed = [1, *ids, 2, 0, 0]
    assert joint_bpe.decode(framed, skip_special=True) == "Ein Hund läuft."
    assert joint_bpe.decode(framed) == "<bos>Ein Hund läuft.<eos><pad><pad>"


def test_special_token_ids_survive_save_and_load(joint_bpe: BPETokenizer, tmp_path: Path):
    path = tmp_path / "tokenizer.json"
    joint_bpe.save(path)
    loaded = load_tokenizer(path)
    assert isinstance(loaded, BPETokenizer)
    assert (loaded.pad_id, loaded.bos_id, loaded.eos_id) == (0, 1, 2)


def test_gpt_style_bpe_has_no_pad_or_bos():
    tok = BPETokenizer.train(["hello world"] * 5, 300)
    assert tok.pad_id is None and tok.bos_id is None
    assert tok.eos_id == tok.tokenizer.token_to_id("<|endoftext|>") == 0


def test_special_tokens_take_ids_in_the_given_order():
    tok = BPETokenizer.train(["hallo welt"] * 5, 300, special_tokens=("<eos>", "<pad>", "<bos>"))
    assert (tok.eos_id, tok.pad_id, tok.bos_id) == (0, 1, 2)


def test_joint_bpe_rejects_a_vocabulary_smaller_than_the_bytes(train_corpus):
    with pytest.raises(UserError, match="at least 259"):
        train_joint_bpe(train_corpus, vocab_size=100)


# ------------------------------------------------------------------ encoding


def test_encode_pairs_adds_bos_and_eos(joint_bpe: BPETokenizer, train_corpus):
    pairs = train_corpus.pairs[:20]
    enc = encode_pairs(joint_bpe, pairs, max_len=256)
    assert isinstance(enc, EncodedPairs) and enc.truncated == 0
    assert enc.src == [joint_bpe.encode(s) for s, _ in pairs]
    assert enc.tgt == [[1, *joint_bpe.encode(t), 2] for _, t in pairs]
    assert joint_bpe.decode(enc.tgt[0], skip_special=True) == pairs[0][1]


def test_encode_pairs_truncates_and_counts(joint_bpe: BPETokenizer):
    short, long = "Ein Hund.", "Ein sehr langer Satz über viele Dinge, Hunde, Katzen und Männer im Freien."
    pairs = [(short, short), (long, short), (short, long), (long, long), (short, short)]
    max_len = 8
    assert len(joint_bpe.encode(short)) <= max_len - 2 < max_len < len(joint_bpe.encode(long))
    enc = encode_pairs(joint_bpe, pairs, max_len=max_len)
    assert enc.truncated == 3
    assert all(len(s) <= max_len for s in enc.src) and all(len(t) <= max_len for t in enc.tgt)
    assert enc.src[1] == joint_bpe.encode(long)[:max_len]
    assert enc.tgt[2] == [1, *joint_bpe.encode(long)[: max_len - 2], 2]
    # A target that fits only without bos/eos still counts as truncated.
    n = len(joint_bpe.encode(short))
    assert encode_pairs(joint_bpe, [(short, short)], max_len=n).truncated == 1
    assert encode_pairs(joint_bpe, [(short, short)], max_len=n + 2).truncated == 0


def test_encode_pairs_needs_room_for_bos_and_eos(joint_bpe: BPETokenizer):
    with pytest.raises(ValueError):
        encode_pairs(joint_bpe, [("a", "b")], max_len=2)


# ------------------------------------------------------------------ batching


def random_lengths(n: int = 2000, seed: int = 0) -> tuple[list[int], list[int]]:
    rng = random.Random(seed)
    src = [rng.randint(1, 60) for _ in range(n)]
    tgt = [max(2, s + rng.randint(-5, 5)) for s in src]
    return src, tgt


def test_token_batches_docstring_example():
    assert token_batches([3, 9, 4, 8], [3, 9, 4, 8], 16, seed=None) == [[0, 2], [3], [1]]


@pytest.mark.parametrize("seed", [None, 0, 1])
def test_token_batches_cover_every_index_once_within_budget(seed):
    src, tgt = random_lengths()
    src[7], tgt[7] = 500, 3  # over the budget on its own
    max_tokens = 400
    batches = token_batches(src, tgt, max_tokens, seed=seed)
    assert sorted(i for b in batches for i in b) == list(range(len(src)))
    for b in batches:
        longest = max(max(src[i], tgt[i]) for i in b)
        assert len(b) * longest <= max_tokens or len(b) == 1
    assert [7] in batches


def test_token_batches_fill_batches():
    # Greedy packing: adding the next example in sorted order would have broken the budget.
    src, tgt = random_lengths()
    batches = token_batches(src, tgt, 400, seed=None)
    longer = [max(s, t) for s, t in zip(src, tgt, strict=True)]
    for b, nxt in zip(batches, batches[1:], strict=False):
        assert (len(b) + 1) * longer[nxt[0]] > 400
    # seed None: sorted by length, shortest first.
    flat = [longer[i] for b in batches for i in b]
    assert flat == sorted(flat)


def test_token_batches_deterministic_per_seed_and_differ_across_seeds():
    src, tgt = random_lengths()
    assert token_batches(src, tgt, 400, seed=3) == token_batches(src, tgt, 400, seed=3)
    assert token_batches(src, tgt, 400, seed=None) == token_batches(src, tgt, 400, seed=None)
    assert token_batches(src, tgt, 400, seed=3) != token_batches(src, tgt, 400, seed=4)
    # Not only the batch order: the seed also decides which equal-length examples share a batch.
    as_sets = lambda bs: sorted(sorted(b) for b in bs)  # noqa: E731
    assert as_sets(token_batches(src, tgt, 400, seed=3)) != as_sets(token_batches(src, tgt, 400, seed=4))


def test_token_batches_shuffle_the_batch_order_only_with_a_seed():
    src, tgt = random_lengths()
    longer = [max(s, t) for s, t in zip(src, tgt, strict=True)]

    def batch_lengths(bs):
        return [max(longer[i] for i in b) for b in bs]

    assert batch_lengths(token_batches(src, tgt, 400, seed=None)) == sorted(
        batch_lengths(token_batches(src, tgt, 400, seed=None))
    )
    shuffled = batch_lengths(token_batches(src, tgt, 400, seed=0))
    # Far from sorted: about half of the neighbouring batches are in decreasing order.
    decreasing = sum(a > b for a, b in zip(shuffled, shuffled[1:], strict=False))
    assert decreasing > len(shuffled) // 4


def test_token_batches_group_similar_lengths():
    src, tgt = random_lengths()
    longer = [max(s, t) for s, t in zip(src, tgt, strict=True)]
    batches = token_batches(src, tgt, 400, seed=0)

    def mean_spread(bs):
        multi = [b for b in bs if len(b) > 1]
        return sum(max(longer[i] for i in b) - min(longer[i] for i in b) for b in multi) / len(multi)

    # Random batches of the same sizes, for comparison.
    perm = list(range(len(src)))
    random.Random(0).shuffle(perm)
    random_batches, start = [], 0
    for b in batches:
        random_batches.append(perm[start : start + len(b)])
        start += len(b)
    assert mean_spread(batches) <= 2
    assert mean_spread(batches) < 0.1 * mean_spread(random_batches)


def test_token_batches_rejects_bad_arguments():
    with pytest.raises(ValueError):
        token_batches([1, 2], [1], 10, seed=None)
    with pytest.raises(ValueError):
        token_batches([1], [1], 0, seed=None)
    assert token_batches([], [], 10, seed=0) == []


# ------------------------------------------------------------------ collation


def test_collate_pads_and_shifts():
    src = [[5, 6, 7], [8], [9, 10]]
    tgt = [[1, 11, 12, 2], [1, 13, 2], [1, 2]]
    batch = collate(src, tgt, [2, 0, 1], pad_id=0)
    assert torch.equal(batch.src, torch.tensor([[9, 10, 0], [5, 6, 7], [8, 0, 0]]))
    assert torch.equal(batch.tgt_in, torch.tensor([[1, 0, 0], [1, 11, 12], [1, 13, 0]]))
    assert torch.equal(batch.tgt_out, torch.tensor([[2, 0, 0], [11, 12, 2], [13, 2, 0]]))
    assert batch.src.dtype == batch.tgt_in.dtype == batch.tgt_out.dtype == torch.long
    assert batch.n_tokens == 1 + 3 + 2
    moved = batch.to("cpu")
    assert torch.equal(moved.tgt_out, batch.tgt_out) and moved.pad_id == 0


def test_collate_with_another_pad_id():
    batch = collate([[4], [4, 5]], [[1, 7, 2], [1, 2]], [0, 1], pad_id=99)
    assert batch.src.tolist() == [[4, 99], [4, 5]]
    assert batch.tgt_out.tolist() == [[7, 2], [2, 99]]
    assert batch.n_tokens == 3


def test_collate_rejects_a_target_without_bos_and_eos():
    with pytest.raises(ValueError):
        collate([[4]], [[1]], [0], pad_id=0)


def test_pipeline_on_the_fixture(joint_bpe: BPETokenizer):
    corpus = load_multi30k(FIXTURE, "val")
    enc = encode_pairs(joint_bpe, corpus.pairs, max_len=64)
    batches = token_batches([len(s) for s in enc.src], [len(t) for t in enc.tgt], 300, seed=0)
    total = 0
    for b in batches:
        batch = collate(enc.src, enc.tgt, b, pad_id=joint_bpe.pad_id)
        assert batch.src.shape[0] == batch.tgt_in.shape[0] == len(b)
        assert batch.tgt_in.shape == batch.tgt_out.shape
        total += batch.n_tokens
        for row, i in enumerate(b):
            n = len(enc.tgt[i]) - 1
            assert joint_bpe.decode(batch.tgt_out[row, :n].tolist(), skip_special=True) == corpus.pairs[i][1]
    assert total == sum(len(t) - 1 for t in enc.tgt)


def test_token_batches_count_does_not_depend_on_the_seed():
    rng = torch.Generator().manual_seed(0)
    src = torch.randint(1, 40, (500,), generator=rng).tolist()
    tgt = torch.randint(1, 40, (500,), generator=rng).tolist()
    counts = {len(token_batches(src, tgt, 300, seed=seed)) for seed in (None, 0, 1, 2, 3)}
    assert len(counts) == 1
