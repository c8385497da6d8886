"""Tokenizers: characters, and byte-level BPE on the Hugging Face `tokenizers` library.

Both save to one `tokenizer.json` and round-trip text exactly: `decode(encode(s)) == s` for any
text the tokenizer can encode. The file says what it is through its own format fields: attnlab's
character format carries `"format": "attnlab-char"`; anything else is read as a Hugging Face
`tokenizers` file.

References: Sennrich et al. 2016 (BPE); Radford et al. 2019 (byte-level BPE of GPT-2).
"""

import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Protocol

from attnlab.errors import UserError
from attnlab.fileio import atomic_write_text

CHAR_FORMAT = "attnlab-char"
CHAR_FORMAT_VERSION = 1


class Tokenizer(Protocol):
    """What the rest of attnlab needs from a tokenizer."""

    vocab_size: int
    eos_id: int | None

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...

    def save(self, path: str | Path) -> None: ...


class CharTokenizer:
    """One token per character, the vocabulary being the sorted set of the corpus's characters.

    Example: trained on "hello" -> vocab ['e', 'h', 'l', 'o'], encode("hole") -> [1, 3, 2, 0].
    """

    eos_id = None

    def __init__(self, chars: Sequence[str]) -> None:
        if len(set(chars)) != len(chars):
            raise ValueError("CharTokenizer characters must be unique")
        self.chars = list(chars)
        self.stoi = {c: i for i, c in enumerate(self.chars)}

    @classmethod
    def train(cls, text: str) -> "CharTokenizer":
        return cls(sorted(set(text)))

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    def encode(self, text: str) -> list[int]:
        try:
            return [self.stoi[c] for c in text]
        except KeyError:
            unseen = sorted({c for c in text if c not in self.stoi})
            raise UserError(
                f"the text has characters this character tokenizer never saw: "
                f"{', '.join(repr(c) for c in unseen)}; remove them or train on a corpus that has them"
            ) from None

    def decode(self, ids: Sequence[int]) -> str:
        return "".join(self.chars[i] for i in ids)

    def to_json(self) -> str:
        return json.dumps({"format": CHAR_FORMAT, "version": CHAR_FORMAT_VERSION, "chars": self.chars})

    def save(self, path: str | Path) -> None:
        atomic_write_text(Path(path), self.to_json())


class BPETokenizer:
    """Byte-level BPE (GPT-2 style): any text encodes, nothing is unknown, decoding is exact.

    Thin wrapper over `tokenizers.Tokenizer`; trained on the user's corpus to `vocab_size`. Special
    tokens take the first ids, in the order given: `special_tokens=("<pad>", "<bos>", "<eos>")` gives
    pad 0, bos 1, eos 2 (the translation setup); the default `("<|endoftext|>",)` is GPT-2's one
    separator, which then serves as `eos_id`.
    """

    def __init__(self, tokenizer) -> None:  # tokenizers.Tokenizer
        self.tokenizer = tokenizer
        # Looked up once: decoding loops compare every new token with eos_id.
        self._pad_id = tokenizer.token_to_id("<pad>")
        self._bos_id = tokenizer.token_to_id("<bos>")
        eos = tokenizer.token_to_id("<eos>")
        self._eos_id = eos if eos is not None else tokenizer.token_to_id("<|endoftext|>")

    @classmethod
    def train(
        cls, texts: Iterable[str], vocab_size: int, *, special_tokens: Sequence[str] = ("<|endoftext|>",)
    ) -> "BPETokenizer":
        from tokenizers import Tokenizer as HFTokenizer
        from tokenizers import decoders, models, pre_tokenizers, trainers

        tok = HFTokenizer(models.BPE())
        # add_prefix_space=False and no normaliser keep encode/decode an exact round trip.
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size,
            special_tokens=list(special_tokens),
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        )
        tok.train_from_iterator(texts, trainer=trainer)
        # The trainer puts special tokens first, in order; the rest of attnlab relies on it (pad = 0).
        got = [tok.token_to_id(t) for t in special_tokens]
        if got != list(range(len(special_tokens))):
            raise RuntimeError(f"special tokens {list(special_tokens)} got ids {got}, expected 0, 1, ...")
        return cls(tok)

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size()

    @property
    def pad_id(self) -> int | None:
        """Id of "<pad>", or None when the tokenizer has none."""
        return self._pad_id

    @property
    def bos_id(self) -> int | None:
        """Id of "<bos>", or None when the tokenizer has none."""
        return self._bos_id

    @property
    def eos_id(self) -> int | None:
        """Id of "<eos>" if present, else of GPT-2's "<|endoftext|>", else None."""
        return self._eos_id

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [e.ids for e in self.tokenizer.encode_batch(texts, add_special_tokens=False)]

    def decode(self, ids: Sequence[int], skip_special: bool = False) -> str:
        """The text of `ids`; with `skip_special`, pad, bos and eos ids are dropped first."""
        ids = list(ids)
        if skip_special:
            special = {i for i in (self.pad_id, self.bos_id, self.eos_id) if i is not None}
            ids = [i for i in ids if i not in special]
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    def token_texts(self, ids: Sequence[int]) -> list[str]:
        """Each token's own text, for labels: real characters rather than the byte alphabet's
        stand-ins ("ä", not "Ã¤"); a token holding part of a multi-byte character shows "�".
        Example: ids of " Ein Mann" -> [" Ein", " Mann"]."""
        return [self.tokenizer.decode([i], skip_special_tokens=False) for i in ids]

    def save(self, path: str | Path) -> None:
        atomic_write_text(Path(path), self.tokenizer.to_str())


def load_tokenizer(path: str | Path) -> CharTokenizer | BPETokenizer:
    """Read a `tokenizer.json` written by either tokenizer."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
        doc = json.loads(text)
    except FileNotFoundError:
        raise UserError(f"tokenizer file {path} does not exist") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise UserError(f"tokenizer file {path} is unreadable or not JSON ({e}); retrain or restore it") from None
    if not isinstance(doc, dict):
        raise UserError(f"{path} is not a tokenizer file attnlab can read: expected a JSON object")
    if doc.get("format") == CHAR_FORMAT:
        if doc.get("version") != CHAR_FORMAT_VERSION:
            raise UserError(f"{path}: unsupported character tokenizer version {doc.get('version')!r}")
        chars = doc.get("chars")
        if (
            not isinstance(chars, list)
            or not all(isinstance(c, str) and len(c) == 1 for c in chars)
            or len(set(chars)) != len(chars)
        ):
            raise UserError(f"{path}: 'chars' must be a list of distinct single characters; retrain or restore it")
        return CharTokenizer(chars)
    from tokenizers import Tokenizer as HFTokenizer

    try:
        return BPETokenizer(HFTokenizer.from_str(text))
    except Exception as e:  # the Rust library raises its own exception type
        raise UserError(f"{path} is not a tokenizer file attnlab can read: {e}") from None
