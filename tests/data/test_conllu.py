"""CoNLL-U reading: the EWT fixture, multiword tokens, empty nodes, comments, gzip, and malformed lines."""

import gzip
import re
from pathlib import Path

import pytest

from attnlab.data.conllu import TaggedSentence, read_conllu
from attnlab.errors import UserError

FIXTURE = Path(__file__).parents[1] / "fixtures" / "ud"
SHARED_DEV = Path("/work/shared/data/ud-english-ewt/en_ewt-ud-dev.conllu.gz")


def tok(token_id: str, form: str, upos: str = "NOUN", xpos: str = "NN") -> str:
    """One token line with the other fields filled as UD does."""
    return "\t".join([token_id, form, form.lower(), upos, xpos, "_", "0", "root", "_", "_"])


def write(tmp_path: Path, lines: list[str], name: str = "data.conllu") -> Path:
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def count_by_pattern(path: Path) -> tuple[int, int]:
    """An independent count, line by line with regexes: sentences (blocks with an integer-ID line)
    and words (integer-ID lines)."""
    sentences = words = 0
    in_sentence = False
    for line in path.read_text(encoding="utf-8").split("\n"):
        if re.match(r"\d+\t", line):
            words += 1
            sentences += not in_sentence
            in_sentence = True
        elif not line.strip():
            in_sentence = False
    return sentences, words


@pytest.mark.parametrize("split", ["train", "dev", "test"])
def test_fixture_counts_agree_with_a_line_count(split: str):
    path = FIXTURE / f"en_ewt-ud-{split}.conllu"
    sentences = read_conllu(path)
    n_sentences, n_words = count_by_pattern(path)
    assert len(sentences) == n_sentences
    assert sum(len(s.words) for s in sentences) == n_words
    assert all(len(s.words) == len(s.tags) > 0 for s in sentences)


def test_fixture_first_sentence_and_multiword_tokens():
    sentences = read_conllu(FIXTURE / "en_ewt-ud-train.conllu")
    first = sentences[0]
    assert isinstance(first, TaggedSentence)
    assert first.line == 1  # the block starts with its "# newdoc" comment
    assert first.words[:4] == ["Al", "-", "Zaman", ":"]
    assert first.tags[:4] == ["PROPN", "PUNCT", "PROPN", "PUNCT"]
    assert len(first.words) == 29
    # EWT splits "don't" (multiword token 19-20) into its words "do" and "n't".
    words = [w for s in sentences for w in s.words]
    assert "don't" not in words and "n't" in words
    xpos = read_conllu(FIXTURE / "en_ewt-ud-train.conllu", column="xpos")
    assert xpos[0].words == first.words and xpos[0].tags[:4] == ["NNP", "HYPH", "NNP", ":"]


def test_fixture_empty_node_is_skipped():
    """EWT's "Over 300 Iraqis are reported dead and 500 wounded" has an empty node 8.1, a copy of
    "reported" for "500 (reported) wounded"; it is not a word of the sentence."""
    sentences = read_conllu(FIXTURE / "en_ewt-ud-train.conllu")
    sentence = next(s for s in sentences if s.words[:3] == ["Over", "300", "Iraqis"])
    assert sentence.words == "Over 300 Iraqis are reported dead and 500 wounded in Fallujah alone .".split()
    assert sentence.tags[7:9] == ["NUM", "ADJ"]  # 500, wounded: nothing in between


def test_tricky_lines(tmp_path: Path):
    path = write(
        tmp_path,
        [
            "# sent_id = 1",  # line 1
            "# text = I'm here",
            tok("1-2", "I'm", "_", "_"),
            tok("1", "I", "PRON", "PRP"),
            tok("2", "'m", "AUX", "VBP"),
            tok("2.1", "be", "VERB", "VB"),  # an empty node
            tok("3", "here", "ADV", "RB"),
            "",
            "",  # two blank lines separate as one does
            "# a comment",  # line 10
            tok("1", "New York", "PROPN", "NNP"),  # a FORM with a space
            tok("2", "#hash", "X", "ADD"),
        ],
    )
    assert read_conllu(path) == [
        TaggedSentence(["I", "'m", "here"], ["PRON", "AUX", "ADV"], line=1),
        TaggedSentence(["New York", "#hash"], ["PROPN", "X"], line=10),
    ]


def test_last_sentence_without_trailing_blank_line(tmp_path: Path):
    path = tmp_path / "end.conllu"
    path.write_text("\n".join([tok("1", "Hi", "INTJ"), "", tok("1", "Bye", "INTJ"), tok("2", ".", "PUNCT")]))
    assert [s.words for s in read_conllu(path)] == [["Hi"], ["Bye", "."]]


def test_comment_only_blocks_are_no_sentences(tmp_path: Path):
    path = write(tmp_path, ["# newdoc id = x", "", tok("1", "Hi"), "", "# trailing comment"])
    assert [(s.words, s.line) for s in read_conllu(path)] == [(["Hi"], 3)]


def test_gzip_and_plain_read_the_same(tmp_path: Path):
    plain = FIXTURE / "en_ewt-ud-dev.conllu"
    packed = tmp_path / "dev.conllu"  # no .gz suffix: the magic bytes decide
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    assert read_conllu(packed) == read_conllu(plain)


@pytest.mark.parametrize(
    "bad_line, line_no, message",
    [
        ("1\tI\tI\tPRON\tPRP\t_\t0\troot\t_", 3, r"expected 10 tab-separated fields .*got 9"),
        ("1 I I PRON PRP _ 0 root _ _", 3, r"expected 10 .*got 1 \(are the fields separated by spaces"),
        (tok("x", "I"), 3, r"bad ID 'x'"),
        (tok("1.", "I"), 3, r"bad ID '1\.'"),
        (tok("01", "I"), 3, r"bad ID '01'"),
        (tok("3", "I"), 3, r"word ID 3 is out of sequence; expected 2"),
        (tok("1", "I"), 3, r"word ID 1 is out of sequence; expected 2"),
        (tok("2", "I", upos="_"), 3, r"word 2 has no UPOS tag \('_'\)"),
        (tok("2", "", upos="PRON"), 3, r"word 2 has an empty FORM"),
        (tok("3-4", "I'm"), 3, r"multiword token 3-4 must span words 2-N"),
    ],
)
def test_malformed_lines_name_file_and_line(tmp_path: Path, bad_line: str, line_no: int, message: str):
    path = write(tmp_path, ["# sent_id = 1", tok("1", "Yes", "INTJ"), bad_line, tok("3", ".", "PUNCT")])
    with pytest.raises(UserError, match=rf"^{re.escape(str(path))}:{line_no}: {message}"):
        read_conllu(path)


def test_error_line_counts_from_the_file_start(tmp_path: Path):
    path = write(tmp_path, [tok("1", "Hi"), "", "# c", tok("1", "A"), tok("3", "B")])
    with pytest.raises(UserError, match=r"data\.conllu:5: word ID 3 is out of sequence; expected 2"):
        read_conllu(path)


def test_xpos_underscore_is_an_error_only_for_xpos(tmp_path: Path):
    path = write(tmp_path, [tok("1", "Hi", "INTJ", "_")])
    assert read_conllu(path)[0].tags == ["INTJ"]
    with pytest.raises(UserError, match=r"data\.conllu:1: word 1 has no XPOS tag"):
        read_conllu(path, column="xpos")


def test_sentence_of_only_non_words(tmp_path: Path):
    path = write(tmp_path, ["# c", tok("1.1", "be")])
    with pytest.raises(UserError, match=r"data\.conllu:1: the sentence starting here has no word lines"):
        read_conllu(path)


def test_bad_bytes_and_bad_column(tmp_path: Path):
    path = tmp_path / "latin.conllu"
    path.write_bytes(tok("1", "na\u00efve").encode("latin-1") + b"\n")
    with pytest.raises(UserError, match=r"latin\.conllu:1 is not UTF-8"):
        read_conllu(path)
    with pytest.raises(ValueError, match="column must be one of"):
        read_conllu(FIXTURE / "en_ewt-ud-dev.conllu", column="deprel")


@pytest.mark.skipif(not SHARED_DEV.exists(), reason="the shared EWT data is not on this machine")
def test_shared_ewt_dev_counts():
    """The counts the data README states for EWT dev: 2,001 sentences, 25,147 syntactic words."""
    sentences = read_conllu(SHARED_DEV)
    assert len(sentences) == 2001
    assert sum(len(s.words) for s in sentences) == 25147
