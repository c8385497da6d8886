"""Labelled sentences from a tab-separated file with a header, as in GLUE's SST-2.

The format (Wang et al. 2018, the GLUE `SST-2/{train,dev}.tsv` files):

    sentence<TAB>label
    hide new secretions from the parental units <TAB>0
    ...

Columns are found by their name in the header, so files with extra columns (or another order) read
too. Labels stay strings: the task maps them to ids and decides what an unknown label means.

References: Socher et al. 2013 (the Stanford Sentiment Treebank); Wang et al. 2018 (GLUE).
"""

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from attnlab.data.parallel import read_lines
from attnlab.errors import UserError


@dataclass(frozen=True)
class LabelledSentences:
    """Examples of one file, in file order; `sentences[i]` has label `labels[i]` and sits on line
    `line_numbers[i]` (1-based, the header being line 1), so later errors can point at it."""

    path: str
    sentences: list[str]
    labels: list[str]
    line_numbers: list[int]
    skipped_empty: int  # rows dropped because their text was empty after stripping

    def __len__(self) -> int:
        return len(self.sentences)


def read_labelled_tsv(
    path: str | Path, *, text_column: str = "sentence", label_column: str = "label"
) -> LabelledSentences:
    """The (text, label) rows of a TSV file with a header line naming its columns.

    Plain or gzip, UTF-8. Text is stripped of surrounding whitespace (SST-2 sentences end with a
    space); rows whose text is then empty are skipped and counted. Blank lines at the end of the
    file are ignored; any other row must have as many tab-separated fields as the header.
    Example: "sentence\\tlabel\\na fine film \\t1\\n" -> sentences ["a fine film"], labels ["1"],
    line_numbers [2].
    """
    if text_column == label_column:
        raise ValueError(f"text_column and label_column are both {text_column!r}; they must differ")
    where = str(Path(path).expanduser())
    lines = read_lines(path)
    while lines and not lines[-1].strip():
        lines.pop()
    if not lines:
        raise UserError(f"{where} is empty; expected a header line '{text_column}<TAB>{label_column}' and then rows")

    header = [name.strip() for name in lines[0].split("\t")]
    missing = [name for name in (text_column, label_column) if name not in header]
    if missing:
        raise UserError(
            f"{where}:1: the header has columns {header} but no {' or '.join(repr(m) for m in missing)}; "
            f"expected a tab-separated header naming the columns {text_column!r} and {label_column!r}"
        )
    text_at, label_at = header.index(text_column), header.index(label_column)

    sentences, labels, line_numbers, skipped = [], [], [], 0
    for n, line in enumerate(lines[1:], start=2):
        fields = line.split("\t")
        if len(fields) != len(header):
            got = "an empty line" if not line.strip() else str(len(fields))
            raise UserError(
                f"{where}:{n}: expected {len(header)} tab-separated columns ({', '.join(header)}), got {got}"
            )
        text, label = fields[text_at].strip(), fields[label_at].strip()
        if not text:
            skipped += 1
            continue
        if not label:
            raise UserError(f"{where}:{n}: the {label_column!r} column is empty; every row needs a label")
        sentences.append(text)
        labels.append(label)
        line_numbers.append(n)
    return LabelledSentences(where, sentences, labels, line_numbers, skipped)


def check_labels(data: LabelledSentences, known: Sequence[str]) -> None:
    """Raise a UserError at the first example whose label is not in `known` (the training labels).

    Example: a dev row "great \\t2" on line 7 with known ("0", "1") ->
    "dev.tsv:7: unknown label '2'; labels seen in training are 0, 1".
    """
    allowed = set(known)
    for label, n in zip(data.labels, data.line_numbers, strict=True):
        if label not in allowed:
            raise UserError(f"{data.path}:{n}: unknown label {label!r}; labels seen in training are {', '.join(known)}")
