"""Tokenizers: characters, byte-level BPE, and the encoders' vocabularies, BERT's WordPiece and
RoBERTa's byte-level BPE (the last three on the Hugging Face `tokenizers` library).

All save to one `tokenizer.json`. Characters and byte-level BPE round-trip text exactly:
`decode(encode(s)) == s` for any text the tokenizer can encode. WordPiece does not: it normalises
(lowercases, strips accents, drops control characters) and splits off punctuation, as BERT does.
The file says what it is through its own format fields: attnlab's character format carries
`"format": "attnlab-char"`; anything else is read as a Hugging Face `tokenizers` file, an encoder's
one when its model type (WordPiece) or its post-processor (RoBERTa's, ModernBERT's) says so.

References: Sennrich et al. 2016 (BPE); Radford et al. 2019 (byte-level BPE of GPT-2);
Schuster & Nakajima 2012 and Wu et al. 2016, §4.1 (WordPiece); Devlin et al. 2019 (BERT's use of it);
Liu et al. 2019, §4.4 (RoBERTa's byte-level BPE).
"""

import functools
import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Protocol

from attnlab.errors import UserError
from attnlab.fileio import atomic_write_text, decode_utf8

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

    A published checkpoint's `tokenizer.json` (Llama's, Mistral's) names its special tokens itself:
    `bos_id` / `eos_id` then come from the checkpoint's config.json, and `add_special_tokens=True`
    lets the file's own post-processor add them when encoding, as transformers does (Llama's "<s>"
    before every text). `save` writes ids the names above would not find into a `tokenizer_config.json`
    beside the file (transformers' place for them: `bos_token`, `eos_token`), and `load_tokenizer`
    reads them back from there, so that a run fine-tuned from Llama still stops at its "</s>".
    """

    def __init__(
        self,
        tokenizer,  # tokenizers.Tokenizer
        *,
        bos_id: int | None = None,
        eos_id: int | None = None,
        add_special_tokens: bool = False,
    ) -> None:
        self.tokenizer = tokenizer
        self.add_special_tokens = add_special_tokens
        # Looked up once: decoding loops compare every new token with eos_id.
        self._pad_id = tokenizer.token_to_id("<pad>")
        self._bos_id = bos_id if bos_id is not None else tokenizer.token_to_id("<bos>")
        if eos_id is None:
            eos_id = tokenizer.token_to_id("<eos>")
        self._eos_id = eos_id if eos_id is not None else tokenizer.token_to_id("<|endoftext|>")

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
        """Id of "<bos>" (or the one given), or None when the tokenizer has none."""
        return self._bos_id

    @property
    def eos_id(self) -> int | None:
        """The id given, else of "<eos>" if present, else of GPT-2's "<|endoftext|>", else None."""
        return self._eos_id

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=self.add_special_tokens).ids

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [e.ids for e in self.tokenizer.encode_batch(texts, add_special_tokens=self.add_special_tokens)]

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
        path = Path(path)
        atomic_write_text(path, self.tokenizer.to_str())
        named = BPETokenizer(self.tokenizer)  # the ids the file's token names give on their own
        if (self.bos_id, self.eos_id) != (named.bos_id, named.eos_id):
            special = {
                f"{role}_token": self.tokenizer.id_to_token(i)
                for role, i in (("bos", self.bos_id), ("eos", self.eos_id))
                if i is not None
            }
            atomic_write_text(path.with_name(SPECIAL_TOKENS_FILE), json.dumps(special, indent=1) + "\n")


SPECIAL_TOKENS_FILE = "tokenizer_config.json"
"""Beside a tokenizer.json: its bos and eos tokens by name, where the names alone do not say."""


def _special_ids(path: Path, tokenizer) -> dict[str, int | None]:
    """bos_id and eos_id from the `tokenizer_config.json` beside the tokenizer file `path`, if there
    is one (a run's, or a Hugging Face folder's: a token is a string or {"content": ...})."""
    companion = path.with_name(SPECIAL_TOKENS_FILE)
    try:
        doc = json.loads(companion.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise UserError(f"{companion} is unreadable or not JSON ({e}); restore it or delete it") from None
    ids: dict[str, int | None] = {}
    for role in ("bos", "eos"):
        token = doc.get(f"{role}_token") if isinstance(doc, dict) else None
        token = token.get("content") if isinstance(token, dict) else token
        if isinstance(token, str):
            ids[f"{role}_id"] = tokenizer.token_to_id(token)
            if ids[f"{role}_id"] is None:
                raise UserError(f"{companion}: {role}_token {token!r} is not in {path.name}; restore the pair of files")
    return ids


# BERT's special tokens for the encoder's five roles (pad, unk, cls, sep, mask), in the order that
# fixes their ids when attnlab trains a WordPiece vocabulary.
WORDPIECE_SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
# RoBERTa's names for the same roles (fairseq's dictionary symbols; <s> and </s> frame a text).
ROBERTA_SPECIAL_TOKENS = ("<pad>", "<unk>", "<s>", "</s>", "<mask>")


class EncoderTokenizer:
    """An encoder's vocabulary: ids for text, and the five special roles pad, unk, cls, sep, mask.

    BERT's is WordPiece: normalise, split on whitespace and punctuation, then split each word
    greedily into the longest pieces of the vocabulary, continuation pieces prefixed with "##"
    (the BERT normaliser with `lowercase`, accents stripped exactly when lowercasing as in BERT
    uncased; the BERT pre-tokenizer; the WordPiece decoder). Example: "Unaffable!" -> ["una",
    "##ffa", "##ble", "!"] with BERT's vocabulary. RoBERTa's is byte-level BPE, its roles named
    `ROBERTA_SPECIAL_TOKENS`. Thin wrapper over a `tokenizers.Tokenizer`, which holds the pipeline;
    this class adds the roles. The special tokens are matched in raw text before anything else, so
    the text "[UNK]" encodes to `unk_id` alone. Nothing adds [CLS] or [SEP]: callers place them.
    """

    bos_id = None
    eos_id = None

    def __init__(
        self,
        tokenizer,  # tokenizers.Tokenizer
        *,
        source: str = "the tokenizer",
        special_tokens: Sequence[str] = WORDPIECE_SPECIAL_TOKENS,
    ) -> None:
        self.tokenizer = tokenizer
        self.special_tokens = tuple(special_tokens)
        """The tokens of the roles pad, unk, cls, sep, mask, in that order."""
        ids = {}
        for token in self.special_tokens:
            ids[token] = tokenizer.token_to_id(token)
            if ids[token] is None:
                raise UserError(
                    f"{source} has no {token} token; an encoder's vocabulary needs all of "
                    f"{', '.join(self.special_tokens)}"
                )
        self._pad_id, self._unk_id, self._cls_id, self._sep_id, self._mask_id = ids.values()
        from tokenizers import decoders

        # Byte-level pieces spell bytes with stand-in characters ("Ġ" for a space); labels decode them.
        self._byte_level = isinstance(tokenizer.decoder, decoders.ByteLevel)

    @staticmethod
    def _pipeline(model, *, lowercase: bool):  # tokenizers.models.WordPiece -> tokenizers.Tokenizer
        from tokenizers import Tokenizer as HFTokenizer
        from tokenizers import decoders, normalizers, pre_tokenizers

        tok = HFTokenizer(model)
        # strip_accents=None follows lowercase, the behaviour of BERT's uncased and cased models.
        tok.normalizer = normalizers.BertNormalizer(lowercase=lowercase, strip_accents=None)
        tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        tok.decoder = decoders.WordPiece(prefix="##")
        return tok

    @classmethod
    def train(
        cls, texts: Iterable[str], vocab_size: int, *, lowercase: bool = True, algorithm: str = "wordpiece"
    ) -> "EncoderTokenizer":
        """A WordPiece vocabulary of at most `vocab_size` entries learnt from `texts`, with [PAD] 0, [UNK] 1,
        [CLS] 2, [SEP] 3, [MASK] 4. A small corpus may give fewer entries.

        algorithm: "wordpiece" (BERT's: pieces chosen by likelihood) or "bpe" (pieces by merge
        frequency, Sennrich et al. 2016). Both run in the same BERT pipeline (normaliser,
        pre-tokenizer, "##" continuation pieces, decoder), so everything downstream is the same."""
        from tokenizers import models, trainers

        specials = list(WORDPIECE_SPECIAL_TOKENS)
        if algorithm == "wordpiece":
            tok = cls._pipeline(models.WordPiece(unk_token="[UNK]"), lowercase=lowercase)
            trainer = trainers.WordPieceTrainer(vocab_size=vocab_size, special_tokens=specials, show_progress=False)
        elif algorithm == "bpe":
            tok = cls._pipeline(models.BPE(unk_token="[UNK]", continuing_subword_prefix="##"), lowercase=lowercase)
            trainer = trainers.BpeTrainer(
                vocab_size=vocab_size, special_tokens=specials, continuing_subword_prefix="##", show_progress=False
            )
        else:
            raise ValueError(f"algorithm must be 'wordpiece' or 'bpe', got {algorithm!r}")
        tok.train_from_iterator(texts, trainer=trainer)
        # The trainer puts special tokens first, in order; BERT code relies on pad = 0.
        got = [tok.token_to_id(t) for t in WORDPIECE_SPECIAL_TOKENS]
        if got != list(range(len(WORDPIECE_SPECIAL_TOKENS))):
            raise RuntimeError(f"special tokens {list(WORDPIECE_SPECIAL_TOKENS)} got ids {got}, expected 0..4")
        return cls(tok)

    @classmethod
    def from_vocab_txt(cls, path: str | Path, *, lowercase: bool = True) -> "EncoderTokenizer":
        """The tokenizer of a BERT `vocab.txt`: one token per line, its id the line number (from 0).
        Special ids are wherever the vocabulary has [PAD], [UNK], [CLS], [SEP] and [MASK]."""
        from tokenizers import AddedToken, models

        path = Path(path)
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            raise UserError(f"vocabulary file {path} does not exist") from None
        except OSError as e:
            raise UserError(f"vocabulary file {path} is unreadable ({e})") from None
        text = decode_utf8(raw, str(path), bom=True)
        # Line breaks as Python's text mode reads them (BERT's own loader): str.splitlines would
        # also break at characters such as U+0085 or U+2028, which can be tokens.
        lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
        # A final empty line is the file's last newline, not a token.
        while lines and lines[-1] == "":
            lines.pop()
        vocab: dict[str, int] = {}
        for i, token in enumerate(lines):
            if token in vocab:
                raise UserError(
                    f"{path}:{i + 1}: token {token!r} already on line {vocab[token] + 1}; ids must be unique"
                )
            vocab[token] = i
        missing = [t for t in WORDPIECE_SPECIAL_TOKENS if t not in vocab]
        if missing:
            raise UserError(
                f"{path} has no {missing[0]} token; a BERT vocabulary needs all of "
                f"{', '.join(WORDPIECE_SPECIAL_TOKENS)}"
            )
        tok = cls._pipeline(models.WordPiece(vocab=vocab, unk_token="[UNK]"), lowercase=lowercase)
        # Registered as special tokens, as a trained vocabulary has them: matched before
        # normalisation (so "[MASK]" survives lowercasing) and never split. Their ids stay the file's.
        tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in WORDPIECE_SPECIAL_TOKENS])
        return cls(tok, source=str(path))

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size()

    @property
    def pad_id(self) -> int:
        return self._pad_id

    @property
    def unk_id(self) -> int:
        return self._unk_id

    @property
    def cls_id(self) -> int:
        return self._cls_id

    @property
    def sep_id(self) -> int:
        return self._sep_id

    @property
    def mask_id(self) -> int:
        return self._mask_id

    @property
    def special_ids(self) -> list[int]:
        """The ids of the five special tokens ([PAD], [UNK], [CLS], [SEP] and [MASK]), sorted."""
        return sorted((self._pad_id, self._unk_id, self._cls_id, self._sep_id, self._mask_id))

    def encode(self, text: str) -> list[int]:
        """Subword ids of `text`, without [CLS] or [SEP]."""
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [e.ids for e in self.tokenizer.encode_batch(list(texts), add_special_tokens=False)]

    def encode_words(self, words: Sequence[str]) -> tuple[list[int], list[int]]:
        """Subword ids of already split words, and for each word the index of its first subword
        in those ids (where a tagger reads the word's label).

        A word the normaliser erases entirely (an empty string, a zero-width space, a control
        character) still gets one token, [UNK], so that `len(starts) == len(words)` always.
        Example (BERT's vocabulary): ["Unaffable", "!"] -> ids of [una, ##ffa, ##ble, !], starts [0, 3].
        """
        if not words:
            return [], []
        encoding = self.tokenizer.encode(list(words), is_pretokenized=True, add_special_tokens=False)
        pieces: list[list[int]] = [[] for _ in words]
        for token_id, word in zip(encoding.ids, encoding.word_ids, strict=True):
            pieces[word].append(token_id)
        ids: list[int] = []
        starts: list[int] = []
        for word_pieces in pieces:
            starts.append(len(ids))
            ids.extend(word_pieces or [self._unk_id])
        return ids, starts

    def decode(self, ids: Sequence[int], skip_special: bool = False) -> str:
        """The text of `ids`, "##" pieces joined to the word before them. Normalisation is not
        undone (lowercased stays lowercased). With `skip_special`, the five special ids are dropped."""
        ids = list(ids)
        if skip_special:
            special = set(self.special_ids)
            ids = [i for i in ids if i not in special]
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    def token_texts(self, ids: Sequence[int]) -> list[str]:
        """Each token as the vocabulary spells it, for labels: continuation pieces keep their "##";
        byte-level pieces show their real characters (" world", not "Ġworld").
        Example: ids of "unaffable" -> ["una", "##ffa", "##ble"]."""
        if self._byte_level:
            return [self.tokenizer.decode([i], skip_special_tokens=False) for i in ids]
        return [self.tokenizer.id_to_token(i) for i in ids]

    def save(self, path: str | Path) -> None:
        atomic_write_text(Path(path), self.tokenizer.to_str())


# The name of EncoderTokenizer from before it held RoBERTa's vocabulary too; its callers still use it.
WordPieceTokenizer = EncoderTokenizer


# Where a tokenizer.json names its encoder roles only by convention: pad, unk and mask are whichever
# of these its vocabulary has (BERT's and ModernBERT's brackets, RoBERTa's angle brackets).
CONVENTIONAL_NAMES = {"pad": ("[PAD]", "<pad>"), "unk": ("[UNK]", "<unk>"), "mask": ("[MASK]", "<mask>")}


def encoder_special_tokens(doc: dict, tokenizer) -> tuple[str, ...] | None:  # tokenizers.Tokenizer
    """The five roles' tokens (pad, unk, cls, sep, mask) of a tokenizer.json, read as `doc`, whose
    post-processor frames a text as an encoder's input, one special token either side ("<s> $A </s>"
    of RoBERTa, "[CLS] $A [SEP]" of ModernBERT); None for any other file (a causal LM's "<s> $A")."""
    post = doc.get("post_processor") or {}
    if post.get("type") in ("RobertaProcessing", "BertProcessing"):
        cls, sep = str(post["cls"][0]), str(post["sep"][0])
    elif post.get("type") == "TemplateProcessing" and len(single := post.get("single") or []) == 3:
        ends = [piece.get("SpecialToken", {}).get("id") for piece in (single[0], single[2])]
        if "Sequence" not in single[1] or None in ends:
            return None
        cls, sep = ends
    else:
        return None
    found = {
        role: [t for t in names if tokenizer.token_to_id(t) is not None] for role, names in CONVENTIONAL_NAMES.items()
    }
    if not all(found.values()):
        return None
    return found["pad"][0], found["unk"][0], cls, sep, found["mask"][0]


def load_tokenizer(path: str | Path) -> CharTokenizer | BPETokenizer | EncoderTokenizer:
    """Read a `tokenizer.json` written by any of the tokenizers: an `EncoderTokenizer` when the
    file's model is WordPiece or BPE with "##" continuation pieces (the BERT pipeline), or its
    post-processor frames a text as an encoder's input (RoBERTa's, ModernBERT's), else byte-level BPE."""
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
        tok = HFTokenizer.from_str(text)
    except Exception as e:  # the Rust library raises its own exception type
        raise UserError(f"{path} is not a tokenizer file attnlab can read: {e}") from None
    # A published tokenizer.json may keep the padding and truncation of the pipeline it was saved
    # from (all-MiniLM-L6-v2's pads and cuts every text to 128 ids); attnlab's callers cut, wrap
    # and pad the ids themselves, so encode must return a text's own ids and nothing else.
    tok.no_padding()
    tok.no_truncation()
    model = doc.get("model")
    if isinstance(model, dict) and model.get("type") == "WordPiece":
        return WordPieceTokenizer(tok, source=str(path))
    if isinstance(model, dict) and model.get("continuing_subword_prefix") == "##":
        return WordPieceTokenizer(tok, source=str(path))  # BPE trained in the BERT pipeline
    if (roles := encoder_special_tokens(doc, tok)) is not None:
        return EncoderTokenizer(tok, source=str(path), special_tokens=roles)
    return BPETokenizer(tok, **_special_ids(path, tok))


@functools.cache
def gpt2_byte_decoder() -> dict[str, int]:
    """GPT-2's table from the printable stand-in of each byte back to the byte: the bytes that
    print as themselves keep their character, the others take 256, 257, ... in order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    shown, extra = {}, 0
    for b in range(256):
        if b in printable:
            shown[chr(b)] = b
        else:
            shown[chr(256 + extra)] = b
            extra += 1
    return shown
