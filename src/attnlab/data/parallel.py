"""Parallel corpora for translation: reading, the Multi30k splits, a joint BPE, length-bucketed batches.

A parallel corpus is two line-aligned text files, one sentence per line (line i of the source file
translates line i of the target file), plain or gzip. The pipeline is

    read_parallel / load_multi30k  ->  train_joint_bpe  ->  encode_pairs  ->  token_batches  ->  collate

Batches hold about the same number of tokens rather than the same number of sentences, and group
sentences of similar length, so little of each batch is padding (Vaswani et al. 2017, §5.1: "Sentence
pairs were batched together by approximate sequence length. Each training batch contained a set of
sentence pairs containing approximately 25000 source tokens and 25000 target tokens").

References: Elliott et al. 2016, "Multi30K: Multilingual English-German Image Descriptions" (W16-3210);
Sennrich et al. 2016 (BPE, and one joint vocabulary for both languages); Vaswani et al. 2017.
"""

import gzip
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from attnlab.data.tokenizers import BPETokenizer
from attnlab.errors import UserError
from attnlab.fileio import decode_utf8

GZIP_MAGIC = b"\x1f\x8b"


def read_lines(path: str | Path) -> list[str]:
    """The lines of a UTF-8 text file, plain or gzip (told apart by the gzip magic bytes, not the name).

    Lines are cut at "\\n" only (a stray U+2028 or form feed inside a sentence must not shift the
    alignment with the other language); a trailing "\\r" is dropped, and so is a UTF-8 byte-order mark.
    Example: b"Ein Hund.\\r\\nA dog.\\n" -> ["Ein Hund.", "A dog."].
    """
    p = Path(path).expanduser()
    if not p.exists():
        raise UserError(f"text file {p} does not exist; give the path of a UTF-8 text file (plain or .gz)")
    if not p.is_file():
        raise UserError(f"{p} is not a file; give the path of a UTF-8 text file (plain or .gz)")
    raw = p.read_bytes()
    if raw.startswith(GZIP_MAGIC):
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError, zlib.error) as e:
            raise UserError(f"{p} is a damaged gzip file ({e}); download or unpack it again") from None
    text = decode_utf8(raw, str(p), bom=True)
    lines = text.split("\n")
    if lines[-1] == "":  # the newline that ends the last line opens no new one
        lines.pop()
    return [line.removesuffix("\r") for line in lines]


@dataclass
class ParallelCorpus:
    """Sentence pairs (source, target), stripped of surrounding whitespace, neither side empty."""

    pairs: list[tuple[str, str]]
    skipped_empty: int  # line pairs dropped because one side (or both) was empty


def read_parallel(src_path: str | Path, tgt_path: str | Path) -> ParallelCorpus:
    """Pair line i of `src_path` with line i of `tgt_path`; the files must have equally many lines."""
    src, tgt = read_lines(src_path), read_lines(tgt_path)
    if len(src) != len(tgt):
        raise UserError(
            f"parallel files differ in length: {src_path} has {len(src)} lines but {tgt_path} has {len(tgt)}; "
            "they must hold one sentence per line, line i of one translating line i of the other"
        )
    pairs, skipped = [], 0
    for s, t in zip(src, tgt, strict=True):
        s, t = s.strip(), t.strip()
        if s and t:
            pairs.append((s, t))
        else:
            skipped += 1
    return ParallelCorpus(pairs, skipped)


# ------------------------------------------------------------------ Multi30k

# Split name -> file stem, as in multi30k/dataset data/task1/raw/{stem}.{lang}.gz.
MULTI30K_SPLITS = {"train": "train", "val": "val", "test2016": "test_2016_flickr", "test2017": "test_2017_flickr"}
_MULTI30K_EXPECTED = "{" + ",".join(MULTI30K_SPLITS.values()) + "}.{de,en}.gz"


def multi30k_paths(
    data_dir: str | Path | None, split: str, src_lang: str = "de", tgt_lang: str = "en"
) -> tuple[Path, Path]:
    """The (source, target) files of one Multi30k split: `data_dir/{stem}.{lang}.gz`; both must exist.

    Example: multi30k_paths("data/multi30k", "test2016") -> (data/multi30k/test_2016_flickr.de.gz,
    data/multi30k/test_2016_flickr.en.gz).
    """
    if split not in MULTI30K_SPLITS:
        raise UserError(f"unknown Multi30k split {split!r}; choose one of {', '.join(MULTI30K_SPLITS)}")
    if src_lang == tgt_lang:
        raise UserError(f"source and target language are both {src_lang!r}; give two different languages")
    if data_dir is None or not str(data_dir).strip():
        raise UserError(
            f"no Multi30k folder given; set the data path to a folder holding {_MULTI30K_EXPECTED} "
            "(multi30k/dataset on GitHub, data/task1/raw)"
        )
    folder = Path(data_dir).expanduser()
    if not folder.is_dir():
        what = "is not a folder" if folder.exists() else "does not exist"
        raise UserError(f"Multi30k folder {folder} {what}; it should hold {_MULTI30K_EXPECTED}")
    stem = MULTI30K_SPLITS[split]
    paths = folder / f"{stem}.{src_lang}.gz", folder / f"{stem}.{tgt_lang}.gz"
    missing = [p.name for p in paths if not p.is_file()]
    if missing:
        raise UserError(f"{folder} lacks {', '.join(missing)}; expected {_MULTI30K_EXPECTED}")
    return paths


def load_multi30k(
    data_dir: str | Path | None, split: str, src_lang: str = "de", tgt_lang: str = "en"
) -> ParallelCorpus:
    """One Multi30k split as sentence pairs; split is one of MULTI30K_SPLITS (train, val, test2016, test2017)."""
    return read_parallel(*multi30k_paths(data_dir, split, src_lang, tgt_lang))


# ------------------------------------------------------------------ tokenizer and encoding

TRANSLATION_SPECIAL_TOKENS = ("<pad>", "<bos>", "<eos>")  # ids 0, 1, 2


def train_joint_bpe(corpus: ParallelCorpus, vocab_size: int = 8000) -> BPETokenizer:
    """One byte-level BPE vocabulary for both languages, learnt from `corpus` (give it the train split
    only: the validation and test text must stay unseen). Special tokens: <pad>=0, <bos>=1, <eos>=2.

    A joint vocabulary lets names and numbers, spelt alike in both languages, share tokens
    (Sennrich et al. 2016, §4 "joint BPE"), and lets the model tie its embeddings.
    """
    minimum = 256 + len(TRANSLATION_SPECIAL_TOKENS)
    if vocab_size < minimum:
        raise UserError(f"BPE vocab_size {vocab_size} is too small; use at least {minimum} (256 bytes + 3 special)")
    if not corpus.pairs:
        raise UserError("the training corpus has no sentence pairs to learn a BPE vocabulary from")
    texts = [side for pair in corpus.pairs for side in pair]
    return BPETokenizer.train(texts, vocab_size, special_tokens=TRANSLATION_SPECIAL_TOKENS)


@dataclass
class EncodedPairs:
    """Token ids of each pair: `src[i]` the source ids, `tgt[i]` = [bos] + target ids + [eos]."""

    src: list[list[int]]
    tgt: list[list[int]]
    truncated: int  # pairs whose source or target was cut to max_len tokens


def encode_pairs(tokenizer: BPETokenizer, pairs: Sequence[tuple[str, str]], max_len: int) -> EncodedPairs:
    """Encode each pair; a side longer than `max_len` tokens (the target counting bos and eos) is cut to
    fit, keeping its beginning, and counted in `truncated`.

    Example, max_len 4: source ids [5, 6, 7, 8, 9] -> [5, 6, 7, 8]; target ids [5, 6, 7] -> [1, 5, 6, 2].
    """
    if max_len < 3:
        raise ValueError(f"max_len must be at least 3 (bos, one token, eos), got {max_len}")
    bos, eos = tokenizer.bos_id, tokenizer.eos_id
    if bos is None or eos is None:
        raise ValueError("the tokenizer needs <bos> and <eos> tokens; train it with train_joint_bpe")
    src_ids = tokenizer.encode_batch([s for s, _ in pairs])
    tgt_ids = tokenizer.encode_batch([t for _, t in pairs])
    src, tgt, truncated = [], [], 0
    for s, t in zip(src_ids, tgt_ids, strict=True):
        truncated += len(s) > max_len or len(t) > max_len - 2
        src.append(s[:max_len])
        tgt.append([bos, *t[: max_len - 2], eos])
    return EncodedPairs(src, tgt, int(truncated))


# ------------------------------------------------------------------ batching


def token_batches(
    src_lengths: Sequence[int], tgt_lengths: Sequence[int], max_tokens: int, *, seed: int | None
) -> list[list[int]]:
    """Example indices grouped into batches of similar length, each within a token budget.

    Examples are sorted by their longer side (then their shorter side), ties in random order when a
    seed is given; consecutive examples are packed while batch size × longest side in the batch
    <= max_tokens (the size of the padded batch); an example over the budget alone gets a batch of
    its own. With a seed the order of the batches is shuffled; with `seed=None` nothing is random
    and the batches come shortest first (for evaluation). Every index appears exactly once.

    Example: lengths [3, 9, 4, 8] (both sides), max_tokens 16, seed None -> [[0, 2], [3], [1]].
    """
    if len(src_lengths) != len(tgt_lengths):
        raise ValueError(f"{len(src_lengths)} source lengths but {len(tgt_lengths)} target lengths")
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be positive, got {max_tokens}")
    src_len, tgt_len = np.asarray(src_lengths, dtype=np.int64), np.asarray(tgt_lengths, dtype=np.int64)
    longer, shorter = np.maximum(src_len, tgt_len), np.minimum(src_len, tgt_len)
    rng = np.random.default_rng(seed) if seed is not None else None
    tie_break = rng.permutation(len(longer)) if rng is not None else np.arange(len(longer))
    order = np.lexsort((tie_break, shorter, longer))  # the last key sorts first

    batches: list[list[int]] = []
    batch: list[int] = []
    for i in order.tolist():
        # Sorted ascending, so this example is the longest of the batch it would join.
        if batch and (len(batch) + 1) * int(longer[i]) > max_tokens:
            batches.append(batch)
            batch = []
        batch.append(i)
    if batch:
        batches.append(batch)
    if rng is not None:
        batches = [batches[j] for j in rng.permutation(len(batches))]
    return batches


class EpochBatches:
    """The training stream of a data set as batches: batch `index` is found in its epoch, and each
    epoch is `token_batches` shuffled by its own seed, so a resumed run sees exactly the same
    batches. Every epoch has the same number of batches: packing depends only on the sorted
    lengths, which the seed does not change (it reorders ties and batches)."""

    def __init__(self, src_lengths: Sequence[int], tgt_lengths: Sequence[int], max_tokens: int) -> None:
        self.src_lengths, self.tgt_lengths, self.max_tokens = list(src_lengths), list(tgt_lengths), max_tokens
        self.per_epoch = len(token_batches(self.src_lengths, self.tgt_lengths, max_tokens, seed=None))
        self._epoch: tuple[int, list[list[int]]] | None = None

    def __call__(self, index: int, seed: int) -> list[int]:
        """The example indices of batch `index` of the stream seeded by `seed`."""
        epoch, position = divmod(index, self.per_epoch)
        if self._epoch is None or self._epoch[0] != epoch:
            self._epoch = (epoch, token_batches(self.src_lengths, self.tgt_lengths, self.max_tokens, seed=seed + epoch))
        return self._epoch[1][position]


@dataclass
class TranslationBatch:
    """A padded batch, long tensors: `src (B, S)`, `tgt_in (B, T)` (teacher-forced decoder input, starts
    with bos) and `tgt_out (B, T)` (what the decoder must predict, ends with eos). Padding is `pad_id`;
    the loss ignores those positions: `F.cross_entropy(..., ignore_index=batch.pad_id)`."""

    src: torch.Tensor
    tgt_in: torch.Tensor
    tgt_out: torch.Tensor
    pad_id: int

    @property
    def n_tokens(self) -> int:
        """Number of target tokens the loss counts (non-pad positions of tgt_out)."""
        return int((self.tgt_out != self.pad_id).sum())

    def to(self, device: torch.device | str) -> "TranslationBatch":
        return TranslationBatch(self.src.to(device), self.tgt_in.to(device), self.tgt_out.to(device), self.pad_id)


def pad_rows(rows: Sequence[Sequence[int]], pad_id: int) -> torch.Tensor:
    """Token id lists as one right-padded long tensor `(B, longest)`."""
    out = torch.full((len(rows), max((len(r) for r in rows), default=0)), pad_id, dtype=torch.long)
    for b, row in enumerate(rows):
        out[b, : len(row)] = torch.tensor(row, dtype=torch.long)
    return out


def collate(
    src: Sequence[Sequence[int]], tgt: Sequence[Sequence[int]], indices: Sequence[int], pad_id: int
) -> TranslationBatch:
    """The examples `indices` of encoded pairs as one padded batch; tgt_in = tgt[:-1], tgt_out = tgt[1:].

    Example, pad 0: tgt [[1, 7, 2], [1, 2]] -> tgt_in [[1, 7], [1, 0]], tgt_out [[7, 2], [2, 0]].
    """
    if not indices:
        raise ValueError("collate needs at least one example index")
    for i in indices:
        if len(tgt[i]) < 2:
            raise ValueError(f"target {i} has {len(tgt[i])} tokens; it needs at least bos and eos")
    return TranslationBatch(
        src=pad_rows([list(src[i]) for i in indices], pad_id),  # (B, S)
        tgt_in=pad_rows([list(tgt[i][:-1]) for i in indices], pad_id),  # (B, T)
        tgt_out=pad_rows([list(tgt[i][1:]) for i in indices], pad_id),  # (B, T)
        pad_id=pad_id,
    )
