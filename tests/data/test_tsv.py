"""Labelled TSV files (SST-2): the fixture, header columns by name, bad rows, unknown labels, bad bytes."""

import csv
import gzip
from pathlib import Path

import pytest

from attnlab.data.tsv import LabelledSentences, check_labels, read_labelled_tsv
from attnlab.errors import UserError

FIXTURE = Path(__file__).parents[1] / "fixtures" / "sst2"


def write(tmp_path: Path, text: str, name: str = "data.tsv") -> Path:
    path = tmp_path / name
    path.write_bytes(text.encode("utf-8"))
    return path


def test_reads_the_sst2_fixture():
    data = read_labelled_tsv(FIXTURE / "train.tsv")
    assert isinstance(data, LabelledSentences)
    assert len(data) == len(data.labels) == len(data.line_numbers) == 300
    assert data.skipped_empty == 0
    assert data.sentences[0] == "hide new secretions from the parental units"  # the trailing space is gone
    assert data.labels[:3] == ["0", "0", "1"]
    assert data.line_numbers[:3] == [2, 3, 4]
    assert set(data.labels) == {"0", "1"}
    assert data.path == str(FIXTURE / "train.tsv")
    assert len(read_labelled_tsv(FIXTURE / "dev.tsv")) == 60


def test_agrees_with_the_csv_module():
    """An independent reading: the standard library's csv with a tab delimiter and no quoting."""
    with open(FIXTURE / "dev.tsv", encoding="utf-8", newline="") as f:
        rows = list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
    data = read_labelled_tsv(FIXTURE / "dev.tsv")
    assert data.sentences == [row["sentence"].strip() for row in rows]
    assert data.labels == [row["label"] for row in rows]


def test_columns_are_found_by_name_and_gzip_reads_the_same(tmp_path: Path):
    text = "id\tlabel\tsentence\n1\tpos\t a fine film \n2\tneg\tdull\n"
    plain = write(tmp_path, text)
    packed = tmp_path / "data.tsv.gz"
    packed.write_bytes(gzip.compress(text.encode("utf-8")))
    for path in (plain, packed):
        data = read_labelled_tsv(path)
        assert data.sentences == ["a fine film", "dull"]
        assert data.labels == ["pos", "neg"]
    custom = read_labelled_tsv(plain, text_column="id", label_column="sentence")
    assert custom.labels == ["a fine film", "dull"]


def test_blank_lines_at_the_end_are_ignored_and_empty_texts_skipped(tmp_path: Path):
    path = write(tmp_path, "sentence\tlabel\ngood \t1\n   \t0\nbad\t0\n\t1\n\n\n")
    data = read_labelled_tsv(path)
    assert data.sentences == ["good", "bad"]
    assert data.line_numbers == [2, 4]
    assert data.skipped_empty == 2


def test_wrong_column_count_names_file_and_line(tmp_path: Path):
    path = write(tmp_path, "sentence\tlabel\ngood\t1\na\tb\t1\n")
    with pytest.raises(UserError) as e:
        read_labelled_tsv(path)
    assert str(e.value) == f"{path}:3: expected 2 tab-separated columns (sentence, label), got 3"


def test_row_without_a_tab_and_blank_line_inside(tmp_path: Path):
    with pytest.raises(UserError, match=r"data\.tsv:2: expected 2 tab-separated columns \(sentence, label\), got 1"):
        read_labelled_tsv(write(tmp_path, "sentence\tlabel\ngood 1\n"))
    with pytest.raises(UserError, match=r"data\.tsv:3: .* got an empty line"):
        read_labelled_tsv(write(tmp_path, "sentence\tlabel\ngood\t1\n\nbad\t0\n"))


def test_missing_header_column(tmp_path: Path):
    path = write(tmp_path, "text\tlabel\ngood\t1\n")
    with pytest.raises(UserError) as e:
        read_labelled_tsv(path)
    message = str(e.value)
    assert message.startswith(f"{path}:1: ")
    assert "['text', 'label']" in message  # the header found
    assert "'sentence'" in message and "'label'" in message  # the names expected
    assert "\n" not in message


def test_empty_label_and_empty_file(tmp_path: Path):
    with pytest.raises(UserError, match=r"data\.tsv:2: the 'label' column is empty"):
        read_labelled_tsv(write(tmp_path, "sentence\tlabel\ngood\t \n"))
    with pytest.raises(UserError, match=r"empty\.tsv is empty"):
        read_labelled_tsv(write(tmp_path, "\n", name="empty.tsv"))


def test_header_only_gives_no_examples(tmp_path: Path):
    data = read_labelled_tsv(write(tmp_path, "sentence\tlabel\n"))
    assert len(data) == 0 and data.skipped_empty == 0


def test_non_utf8_bytes(tmp_path: Path):
    path = tmp_path / "latin1.tsv"
    path.write_bytes("sentence\tlabel\nna\u00efve\t1\n".encode("latin-1"))
    with pytest.raises(UserError, match=r"latin1\.tsv:2 is not UTF-8"):
        read_labelled_tsv(path)


def test_missing_file(tmp_path: Path):
    with pytest.raises(UserError, match="does not exist"):
        read_labelled_tsv(tmp_path / "nope.tsv")


def test_check_labels_names_the_first_unknown_label(tmp_path: Path):
    path = write(tmp_path, "sentence\tlabel\ngood\t1\n\t7\nodd\t2\nworse\t3\n")
    data = read_labelled_tsv(path)
    check_labels(read_labelled_tsv(FIXTURE / "dev.tsv"), ["0", "1"])  # passes silently
    with pytest.raises(UserError) as e:
        check_labels(data, ["0", "1"])
    # Line 4, not 3: the skipped empty row still counts as a line of the file.
    assert str(e.value) == f"{path}:4: unknown label '2'; labels seen in training are 0, 1"


def test_same_text_and_label_column_is_a_bug(tmp_path: Path):
    with pytest.raises(ValueError, match="must differ"):
        read_labelled_tsv(write(tmp_path, "a\n"), text_column="a", label_column="a")
