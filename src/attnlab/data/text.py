"""Plain-text corpora for language modelling.

Any UTF-8 file is a corpus, and so is a folder of `.txt` files (joined in the order of their
names). It is split into train and validation text (the last `val_fraction` of the characters is
validation, as in nanoGPT), encoded once into token files beside the run (numpy memmaps, reused
while the corpus and tokenizer are unchanged), and served as random contiguous blocks.
"""

import hashlib
import json
import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import numpy as np
import torch

from attnlab.data.tokenizers import BPETokenizer, CharTokenizer, Tokenizer
from attnlab.errors import UserError
from attnlab.fileio import atomic_write, atomic_write_text, decode_utf8

TOKEN_CACHE_VERSION = 2  # 2: BPE chunks cut only where pre-tokenisation cuts (ids equal tokenizer.encode)


def bundled_shakespeare() -> str:
    """Tiny Shakespeare (Karpathy's char-rnn corpus, 1,115,394 characters), shipped with attnlab."""
    return (resources.files("attnlab") / "data" / "tinyshakespeare.txt").read_text(encoding="utf-8")


def read_corpus(path: str) -> str:
    """The text of a UTF-8 corpus: a file, or a folder's `.txt` files (`read_folder`); an empty
    path means the bundled Tiny Shakespeare."""
    if not path:
        return bundled_shakespeare()
    p = Path(path).expanduser()
    if not p.exists():
        raise UserError(f"corpus file {p} does not exist; set data.path to a UTF-8 text file or a folder of .txt files")
    text = read_folder(p) if p.is_dir() else _read_text_file(p)
    if not text.strip():
        raise UserError(f"corpus {p} is empty; give a text file with some content")
    return text


def read_folder(folder: Path) -> str:
    r"""The `.txt` files directly in `folder`, in sorted order of their names, joined into one text;
    a file that does not end with a newline gets one, so the next starts on a line of its own.
    Example: a.txt "one", b.txt "two\n" -> "one\ntwo\n"."""
    files = sorted(f for f in folder.iterdir() if f.suffix == ".txt" and f.is_file())
    if not files:
        raise UserError(f"corpus folder {folder} has no .txt files; put the text in .txt files there")
    texts = [_read_text_file(f) for f in files]
    return "".join(t if t.endswith("\n") else t + "\n" for t in texts[:-1]) + texts[-1]


def _read_text_file(p: Path) -> str:
    if not p.is_file():
        raise UserError(f"corpus path {p} is not a file; set data.path to a UTF-8 text file or a folder of .txt files")
    return decode_utf8(p.read_bytes(), f"corpus {p}")


def split_text(text: str, val_fraction: float) -> tuple[str, str]:
    """The first (1 - val_fraction) of the characters for training, the rest for validation."""
    n = int(len(text) * (1.0 - val_fraction))
    return text[:n], text[n:]


def train_tokenizer(kind: str, train_text: str, full_text: str, vocab_size: int) -> Tokenizer:
    """A character tokenizer over the whole corpus (so validation has no unknown characters), or a
    byte-level BPE trained on the training text alone (bytes cover everything)."""
    if kind == "char":
        return CharTokenizer.train(full_text)
    if kind == "bpe":
        return BPETokenizer.train(_chunks(train_text), vocab_size)
    raise UserError(f"unknown tokenizer {kind!r}; data.tokenizer must be 'char' or 'bpe'")


def _chunks(text: str, lines_per_chunk: int = 2000) -> list[str]:
    lines = text.splitlines(keepends=True)
    return ["".join(lines[i : i + lines_per_chunk]) for i in range(0, len(lines), lines_per_chunk)]


# A newline between two non-space characters: GPT-2's pre-tokeniser regex always splits on both sides
# of it, so encoding the pieces one by one gives exactly the ids of encoding the whole text.
# (Anywhere in a run of whitespace it does not: "\n\n  b" pre-tokenises as "\n\n ", " b".)
_SAFE_CUT = re.compile(r"(?<=\S\n)(?=\S)")


def _encode_chunks(text: str, chunk_chars: int = 1 << 16) -> list[str]:
    """text cut into pieces of about chunk_chars characters, each cut at a _SAFE_CUT."""
    chunks, start = [], 0
    while start < len(text):
        cut = _SAFE_CUT.search(text, start + chunk_chars)
        end = cut.start() if cut else len(text)
        chunks.append(text[start:end])
        start = end
    return chunks


def encode(tokenizer: Tokenizer, text: str) -> np.ndarray:
    """Token ids of `text` as a 1-D array of the smallest unsigned type that holds the vocabulary.

    Equal to `tokenizer.encode(text)`."""
    dtype = np.uint16 if tokenizer.vocab_size < 2**16 else np.uint32
    if isinstance(tokenizer, BPETokenizer):
        # Encoding chunks lets the Rust library use every core.
        ids = [i for chunk in tokenizer.encode_batch(_encode_chunks(text)) for i in chunk]
    else:
        ids = tokenizer.encode(text)
    return np.asarray(ids, dtype=dtype)


@dataclass
class TokenSplits:
    """Encoded train and validation tokens (memmaps over files in the cache folder)."""

    train: np.ndarray
    val: np.ndarray


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def encode_splits(
    tokenizer: Tokenizer, train_text: str, val_text: str, tokenizer_json: str, cache_dir: Path
) -> TokenSplits:
    """Encode both splits once into `cache_dir/{train,val}.bin`, reusing them while the corpus and
    the tokenizer are unchanged (a fingerprint of both is kept in `meta.json`)."""
    cache_dir.mkdir(parents=True, exist_ok=True)
    fingerprint = {
        "version": TOKEN_CACHE_VERSION,
        "train_sha256": _sha256(train_text.encode("utf-8")),
        "val_sha256": _sha256(val_text.encode("utf-8")),
        "tokenizer_sha256": _sha256(tokenizer_json.encode("utf-8")),
    }
    meta_path = cache_dir / "meta.json"
    meta = json.loads(meta_path.read_text()) if meta_path.exists() else {}
    files_present = all((cache_dir / f"{name}.bin").exists() for name in ("train", "val"))
    if {k: meta.get(k) for k in fingerprint} != fingerprint or not files_present:
        meta = dict(fingerprint)
        for name, text in (("train", train_text), ("val", val_text)):
            ids = encode(tokenizer, text)
            atomic_write(cache_dir / f"{name}.bin", ids.tofile)
            meta[f"{name}_tokens"] = int(ids.size)
            meta["dtype"] = ids.dtype.name
        atomic_write_text(meta_path, json.dumps(meta, indent=2))
    dtype = np.dtype(meta["dtype"])

    def load(name: str) -> np.ndarray:
        n = meta[f"{name}_tokens"]
        if n == 0:  # numpy cannot map an empty file; the caller reports a split that is too short
            return np.zeros(0, dtype=dtype)
        return np.memmap(cache_dir / f"{name}.bin", dtype=dtype, mode="r", shape=(n,))

    return TokenSplits(load("train"), load("val"))


def random_blocks(
    tokens: np.ndarray, batch_size: int, block_size: int, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch of random contiguous blocks: inputs x `(B, T)` and next-token targets y `(B, T)`, long."""
    starts = torch.randint(len(tokens) - block_size, (batch_size,), generator=generator).numpy()
    windows = np.lib.stride_tricks.sliding_window_view(tokens, block_size + 1)[starts]  # (B, T+1)
    batch = torch.from_numpy(windows.astype(np.int64))
    return batch[:, :-1], batch[:, 1:]


def sequential_blocks(tokens: np.ndarray, block_size: int, batch_size: int):
    """Every non-overlapping block of the split in order, in batches: the exact validation loss."""
    n_blocks = (len(tokens) - 1) // block_size
    for first in range(0, n_blocks, batch_size):
        starts = np.arange(first, min(first + batch_size, n_blocks)) * block_size
        windows = np.lib.stride_tricks.sliding_window_view(tokens, block_size + 1)[starts]
        batch = torch.from_numpy(windows.astype(np.int64))
        yield batch[:, :-1], batch[:, 1:]
