"""Token tagging (UD English EWT part-of-speech): one tag per word.

Which model: a BERT encoder with a classifier on every position, or the BiLSTM baseline
(`model.kind`). Which data: the CoNLL-U files `*-ud-{train,dev,test}.conllu[.gz]` of a Universal
Dependencies treebank. Words are split into subwords; the loss and the prediction use each word's
first subword (Devlin et al. 2019, §5.3), or with `data.word_pooling = "mean"` the mean over all of
its subwords, so accuracy is per word. The best checkpoint is chosen on dev; test is reported.

With a byte-level BPE (RoBERTa's, Liu et al. 2019 §4.4) each word is encoded after a space, as
every word but a text's first was in pre-training ("Ġword"): transformers' RoBERTa tokenizer asks
for `add_prefix_space=True` before it encodes split words, and the lectures' lab passes it;
attnlab adds the space itself (`sentence_words`).
"""

import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import torch

from attnlab.data.conllu import TaggedSentence, read_conllu
from attnlab.data.mlm import IGNORE_INDEX
from attnlab.data.tokenizers import EncoderTokenizer
from attnlab.errors import UserError
from attnlab.tasks.encoder import EncoderTask, per_nonblank

# The universal part-of-speech tags (universaldependencies.org/u/pos): the fixed label set for
# "upos", so a tag that a small training file happens to lack can still be scored.
UPOS = (
    "ADJ", "ADP", "ADV", "AUX", "CCONJ", "DET", "INTJ", "NOUN", "NUM",
    "PART", "PRON", "PROPN", "PUNCT", "SCONJ", "SYM", "VERB", "X",
)  # fmt: skip

# Words of free text for `attnlab tag`, split as UD English does: clitics are words of their own
# ("can't" -> "ca n't", "I'm" -> "I 'm"), hyphenated words stay whole, other symbols stand alone.
WORD = re.compile(r"(?i)\w+(?=n't\b)|n't\b|'(?:s|m|re|ve|ll|d)\b|\w+(?:-\w+)*|[^\w\s]")


def word_mean(scores: torch.Tensor, word_of: torch.Tensor) -> torch.Tensor:
    """Scores `(B, T, L)` averaged over each word's subwords: position `word_of[b, t]` `(B, T)` is
    where position t's word starts. The mean lands at that first position; the word's other
    positions get zeros (they are never scored), positions outside words keep their own."""
    index = word_of.unsqueeze(-1).expand_as(scores)
    sums = torch.zeros_like(scores).scatter_add_(1, index, scores)
    counts = torch.zeros(word_of.shape, dtype=scores.dtype, device=scores.device)
    counts.scatter_add_(1, word_of, torch.ones_like(counts))
    return sums / counts.clamp(min=1).unsqueeze(-1)


@dataclass(frozen=True)
class TaggingDataConfig:
    """Where the tagged sentences come from and how they become tokens."""

    path_fields: ClassVar[tuple[str, ...]] = ("data_dir", "tokenizer", "init_from")
    """The fields that name files or folders: stored absolute (`attnlab.train.config.resolve`)."""

    data_dir: str = ""
    """Folder with one `*-ud-train.conllu`, `*-ud-dev.conllu` and `*-ud-test.conllu` (plain or .gz)."""
    column: str = "upos"
    """Which tag column to learn: "upos" or "xpos"."""
    vocab_size: int = 8000
    """WordPiece vocabulary trained on the training words (unless init_from or tokenizer is set)."""
    lowercase: bool = True
    """Lowercase (and strip accents) before WordPiece when training the vocabulary; False keeps case
    (capitals tell proper nouns apart)."""
    tokenizer: str = ""
    """Use this tokenizer.json (or a run folder's) instead of training one."""
    init_from: str = ""
    """Start from this pre-trained encoder: an attnlab run folder or a Hugging Face BERT folder."""
    max_len: int = 128
    """Longest input in subword tokens, [CLS] and [SEP] included; words past it count as errors."""
    max_tokens: int = 4096
    """Tokens per batch (batch size × longest sentence in it)."""
    token_dropout: float = 0.0
    """Share of training input subwords replaced by [MASK] (a fresh draw per batch): the model must
    also read a word from its context, as it must for words it has never seen."""
    word_pooling: str = "first"
    """How a word's tag scores come from its subwords: "first" (BERT's choice, §5.3) or "mean" (their
    average, so a suffix such as "##ly" in the word's last piece is read directly; Ács et al. 2021)."""

    def __post_init__(self) -> None:
        if self.column not in ("upos", "xpos"):
            raise ValueError(f"column must be 'upos' or 'xpos', got {self.column!r}")
        if self.word_pooling not in ("first", "mean"):
            raise ValueError(f"word_pooling must be 'first' or 'mean', got {self.word_pooling!r}")
        if not 0.0 <= self.token_dropout < 1.0:
            raise ValueError(f"token_dropout must be in [0, 1), got {self.token_dropout}")
        for name in ("vocab_size", "max_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.max_len < 3:
            raise ValueError(f"max_len must be >= 3 ([CLS], a token, [SEP]), got {self.max_len}")


def sentence_words(tokenizer: EncoderTokenizer, words: Sequence[str]) -> list[str]:
    """The words as a tokenizer should see them inside a sentence: a byte-level BPE's each after a
    space, unless it has one (what its pre-tokenizer's add_prefix_space does, so the ids are the
    same whichever way the tokenizer.json sets it); a WordPiece vocabulary's as they are.
    Example (byte-level): ["Hello", "world"] -> [" Hello", " world"]."""
    from tokenizers import decoders

    if not isinstance(tokenizer.tokenizer.decoder, decoders.ByteLevel):
        return list(words)
    return [w if w.startswith(" ") else " " + w for w in words]


def find_split_file(data_dir: str, split: str) -> Path:
    folder = Path(data_dir).expanduser()
    if not folder.is_dir():
        raise UserError(f"data folder {folder} does not exist; pass --data-dir with a UD treebank folder")
    found = sorted(folder.glob(f"*-ud-{split}.conllu")) + sorted(folder.glob(f"*-ud-{split}.conllu.gz"))
    if not found:
        raise UserError(
            f"{folder} has no *-ud-{split}.conllu[.gz]; a UD treebank folder holds "
            "*-ud-train.conllu, *-ud-dev.conllu and *-ud-test.conllu (plain or .gz)"
        )
    if len(found) > 1:
        raise UserError(f"{folder} has several {split} files ({', '.join(p.name for p in found)}); keep one")
    return found[0]


class TokenClassification(EncoderTask):
    """A tag for every word, predicted at its first subword."""

    name = "token-classification"
    data_config_class = TaggingDataConfig
    head = "token"
    split_names = ("train", "dev", "test")

    def __init__(
        self,
        data: TaggingDataConfig,
        model: Any,
        run_dir: Path,
        *,
        resume: bool = False,
        batch_size: int = 0,
        splits: Sequence[str] = ("train", "val"),
    ) -> None:
        """Read the CoNLL-U splits (`val` is the treebank's dev set), set up the vocabulary and
        the tag set (from train), encode. `splits=()` loads nothing: enough to tag new text."""
        if splits and not data.data_dir:
            raise UserError("tagging needs its data: pass --data-dir DIR (a UD treebank folder)")
        names = {"dev" if s == "val" else s for s in splits}
        for s in names:
            if s not in self.split_names:
                raise UserError(f"unknown split {s!r}; choose one of {', '.join(self.split_names)}")
        self.paths = {s: find_split_file(data.data_dir, s) for s in sorted(names)}
        self.sentences: dict[str, list[TaggedSentence]] = {
            s: read_conllu(path, column=data.column) for s, path in self.paths.items()
        }
        train = self.sentences.get("train")
        self._setup(
            data,
            model,
            run_dir,
            resume=resume,
            train_texts=(lambda: [" ".join(s.words) for s in train]) if train is not None else None,
            labels=(lambda: self._label_set(train)) if train is not None else None,
        )
        self.ids: dict[str, list[list[int]]] = {}
        self.starts: dict[str, list[list[int]]] = {}
        self.unscorable: dict[str, int] = {}
        for s, sents in self.sentences.items():
            self.ids[s], self.starts[s], cut = self.encode_sentences([x.words for x in sents])
            self.unscorable[s] = cut + self._unknown_tags(s)
        if "dev" in self.sentences:  # `val` is dev under the trainer's name: the same data, encoded once
            for table in (self.sentences, self.paths, self.ids, self.starts, self.unscorable):
                table["val"] = table["dev"]

    def _label_set(self, train: list[TaggedSentence]) -> list[str]:
        return list(UPOS) if self.data_config.column == "upos" else sorted({t for s in train for t in s.tags})

    def _unknown_tags(self, split: str) -> int:
        """Words whose tag is outside the label set. In UPOS that is a malformed file; an XPOS tag
        that training never saw cannot be predicted, so it counts as an error."""
        unknown = 0
        for sentence in self.sentences[split]:
            for tag in sentence.tags:
                if tag not in self.label_ids:
                    if self.data_config.column == "upos":
                        raise UserError(
                            f"{self.paths[split]}: the sentence at line {sentence.line} has {tag!r}, "
                            f"which is not a UPOS tag ({', '.join(UPOS)})"
                        )
                    unknown += 1
        if unknown:
            sys.stderr.write(f"{split}: {unknown} words have XPOS tags never seen in training; they count as errors\n")
        return unknown

    def encode_sentences(self, sentences: Sequence[Sequence[str]]) -> tuple[list[list[int]], list[list[int]], int]:
        """[CLS] subwords [SEP] of each sentence, the position of each word's first subword (words
        cut off by max_len have none), and how many words were cut off."""
        ids, starts, cut = [], [], 0
        for words in sentences:
            pieces, first = self.tokenizer.encode_words(sentence_words(self.tokenizer, words))
            row = self.wrap(pieces)
            kept = [p + 1 for p in first if p + 1 < len(row) - 1]  # +1: after [CLS]
            cut += len(first) - len(kept)
            ids.append(row)
            starts.append(kept)
        return ids, starts, cut

    def collate(self, split: str, indices: Sequence[int]) -> tuple[torch.Tensor, ...]:
        """ids `(B, T)`, tags `(B, T)`, and with mean pooling where each position's word starts."""
        ids, targets = super().collate(split, indices)
        return ids, targets, *self._pooling([self.starts[split][i] for i in indices], ids)

    def _pooling(self, starts: Sequence[Sequence[int]], ids: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """What `logits` takes beside the ids: nothing for first-subword scoring, the word starts for mean."""
        return () if self.data_config.word_pooling == "first" else (self.word_starts(starts, ids),)

    def word_starts(self, starts: Sequence[Sequence[int]], ids: torch.Tensor) -> torch.Tensor:
        """`(B, T)`: for every subword of a word, the position of the word's first subword; for
        [CLS], [SEP] and padding, their own. A word runs to the next word's start or to [SEP]."""
        out = torch.arange(ids.size(1)).repeat(ids.size(0), 1)
        sep = (ids != self.tokenizer.pad_id).sum(dim=1) - 1  # (B,)
        for row, first in enumerate(starts):
            for start, end in zip(first, [*first[1:], int(sep[row])], strict=True):
                out[row, start:end] = start
        return out

    def logits(self, model: torch.nn.Module, ids: torch.Tensor, *extra: torch.Tensor) -> torch.Tensor:
        scores = model(ids)
        return word_mean(scores, extra[0].to(scores.device)) if extra else scores

    def targets(self, split: str, indices: Sequence[int]) -> torch.Tensor:
        width = max(len(self.ids[split][i]) for i in indices)
        out = torch.full((len(indices), width), IGNORE_INDEX, dtype=torch.long)
        for row, i in enumerate(indices):
            tags = self.sentences[split][i].tags
            for position, tag in zip(self.starts[split][i], tags, strict=False):
                out[row, position] = self.label_ids.get(tag, IGNORE_INDEX)
        return out

    def unscored(self, split: str) -> int:
        return self.unscorable[split]

    def split_size(self, split: str) -> int:
        return sum(len(s.words) for s in self.sentences[split])

    def tag(self, model: torch.nn.Module, texts: Sequence[str], device: torch.device) -> list[list[tuple[str, str]]]:
        """(word, tag) pairs for each text, words split off as in UD English; "?" for a word cut off
        by max_len; no pairs for a blank text."""
        return per_nonblank(texts, lambda present: self._tag(model, present, device), list)

    def _tag(self, model: torch.nn.Module, texts: list[str], device: torch.device) -> list[list[tuple[str, str]]]:
        return [
            [(word, max(probs, key=probs.get) if probs else "?") for word, probs in sentence]
            for sentence in self.tag_probabilities(model, texts, device)
        ]

    @torch.no_grad()
    def tag_probabilities(
        self, model: torch.nn.Module, texts: Sequence[str], device: torch.device
    ) -> list[list[tuple[str, dict[str, float]]]]:
        """(word, probability of every tag) for each word of each text, words split off as in UD
        English; an empty dict for a word cut off by max_len (the model never saw it)."""
        sentences = [WORD.findall(t) for t in texts]
        ids, starts, _ = self.encode_sentences(sentences)
        padded = self.pad(ids)
        logits = self.logits(model, padded.to(device), *self._pooling(starts, padded)).float().cpu()
        probs = torch.softmax(logits, dim=-1)  # (B, T, L)
        out = []
        for row, (words, first) in enumerate(zip(sentences, starts, strict=True)):
            scored = [dict(zip(self.labels, probs[row, p].tolist(), strict=True)) for p in first]
            out.append(list(zip(words, scored + [{}] * (len(words) - len(scored)), strict=True)))
        return out
