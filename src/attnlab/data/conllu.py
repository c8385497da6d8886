"""Words and part-of-speech tags from CoNLL-U files (Universal Dependencies).

A CoNLL-U file holds sentences separated by blank lines. Each word is one line of 10 tab-separated
fields, ID FORM LEMMA UPOS XPOS FEATS HEAD DEPREL DEPS MISC; lines starting with "#" are comments.
Two kinds of token lines are not words of the sentence and are skipped here:

- multiword tokens, ID "1-2": a surface form such as "don't" whose words ("do", "n't") follow on
  their own integer-ID lines; the tagger tags those words, as UD scores it.
- empty nodes, ID "8.1": elided predicates used only by the enhanced graph (DEPS); they have no
  surface form in the text.

Only tabs separate fields: a FORM may contain spaces in some treebanks.

References: the CoNLL-U format, https://universaldependencies.org/format.html; de Marneffe et al.
2021, "Universal Dependencies" (Computational Linguistics 47(2)); Silveira et al. 2014 (EWT).
"""

import re
from dataclasses import dataclass
from pathlib import Path

from attnlab.data.parallel import read_lines
from attnlab.errors import UserError

FIELDS = ("ID", "FORM", "LEMMA", "UPOS", "XPOS", "FEATS", "HEAD", "DEPREL", "DEPS", "MISC")
TAG_COLUMNS = {"upos": 3, "xpos": 4}  # the `column` names read_conllu accepts -> field index

_WORD_ID = re.compile(r"[1-9][0-9]*")
_RANGE_ID = re.compile(r"([1-9][0-9]*)-([1-9][0-9]*)")
_EMPTY_NODE_ID = re.compile(r"[0-9]+\.[1-9][0-9]*")


@dataclass(frozen=True)
class TaggedSentence:
    """One sentence: its words and one tag per word (`len(words) == len(tags)`)."""

    words: list[str]
    tags: list[str]
    line: int  # 1-based line where the sentence starts (its first comment, or its first token line)


def read_conllu(path: str | Path, *, column: str = "upos") -> list[TaggedSentence]:
    """The sentences of a CoNLL-U file (plain or gzip, UTF-8), each word tagged from `column`.

    `column` is "upos" (the universal tags, 17 of them) or "xpos" (the treebank's own, e.g. Penn
    Treebank tags in EWT). Malformed lines raise a UserError naming the file and line.
    Example: "# text = I'm\\n1-2\\tI'm\\t_...\\n1\\tI\\t...PRON...\\n2\\t'm\\t...AUX...\\n" ->
    [TaggedSentence(words=["I", "'m"], tags=["PRON", "AUX"], line=1)].
    """
    if column not in TAG_COLUMNS:
        raise ValueError(f"column must be one of {list(TAG_COLUMNS)}, got {column!r}")
    tag_at = TAG_COLUMNS[column]
    where = str(Path(path).expanduser())

    sentences: list[TaggedSentence] = []
    words: list[str] = []
    tags: list[str] = []
    start: int | None = None  # line of the current sentence's first line, None between sentences
    has_tokens = False  # any token line (word, range or empty node) in the current sentence

    def finish() -> None:
        if has_tokens and not words:
            raise UserError(f"{where}:{start}: the sentence starting here has no word lines (integer IDs 1, 2, ...)")
        if words:
            sentences.append(TaggedSentence(list(words), list(tags), start))

    for n, line in enumerate(read_lines(path), start=1):
        if not line.strip():
            # Several blank lines in a row separate sentences as one does.
            if start is not None:
                finish()
            words.clear()
            tags.clear()
            start, has_tokens = None, False
            continue
        if start is None:
            start = n
        if line.startswith("#"):
            continue

        has_tokens = True
        word = _word(_fields(line, f"{where}:{n}"), len(words) + 1, tag_at, column, f"{where}:{n}")
        if word is not None:
            words.append(word[0])
            tags.append(word[1])
    if start is not None:  # the last sentence, when the file lacks a final blank line
        finish()
    return sentences


def _fields(line: str, at: str) -> list[str]:
    """A token line's 10 tab-separated fields; a `UserError` naming `at` (file:line) for any other count."""
    fields = line.split("\t")
    if len(fields) != len(FIELDS):
        hint = " (are the fields separated by spaces instead of tabs?)" if len(fields) == 1 else ""
        raise UserError(
            f"{at}: expected {len(FIELDS)} tab-separated fields ({' '.join(FIELDS)}), got {len(fields)}{hint}"
        )
    return fields


def _word(fields: list[str], expected: int, tag_at: int, column: str, at: str) -> tuple[str, str] | None:
    """(FORM, tag) of a word line, the `expected`-th of its sentence; None for a multiword token or an
    empty node (checked, then skipped); a `UserError` naming `at` (file:line) for a malformed line."""
    token_id = fields[0]
    if _WORD_ID.fullmatch(token_id):
        if int(token_id) != expected:
            raise UserError(
                f"{at}: word ID {token_id} is out of sequence; expected {expected} "
                "(word IDs count 1, 2, 3, ... within each sentence)"
            )
        form, tag = fields[1], fields[tag_at]
        if not form:
            raise UserError(f"{at}: word {token_id} has an empty FORM; expected the word itself")
        if tag in ("", "_"):
            raise UserError(
                f"{at}: word {token_id} has no {column.upper()} tag ({tag!r}); "
                f"every word needs one to train a {column} tagger"
            )
        return form, tag
    if match := _RANGE_ID.fullmatch(token_id):
        first, last = int(match[1]), int(match[2])
        if first != expected or last <= first:
            raise UserError(
                f"{at}: multiword token {token_id} must span words {expected}-N with N > {expected}, "
                "and come just before its first word"
            )
    elif not _EMPTY_NODE_ID.fullmatch(token_id):
        raise UserError(
            f"{at}: bad ID {token_id!r}; expected a word index (1, 2, ...), "
            "a multiword token range (1-2) or an empty node (1.1)"
        )
    return None
