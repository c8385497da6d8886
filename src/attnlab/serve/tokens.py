"""Each token's own bytes, for a language model's tokenizer: what chat `logprobs` report as
`bytes`, and what a grammar is matched against (`attnlab.serve.structured`).

A token's text (`decode([id])`) is not enough: a byte-level token can hold part of a character,
which decodes as U+FFFD. So the bytes are read from the vocabulary itself: a character
tokenizer's characters in UTF-8; a byte-level BPE's symbols through GPT-2's byte-to-character
table (Radford et al. 2019, `bytes_to_unicode`); a SentencePiece-style BPE's pieces with "▁" as a
space and its byte-fallback pieces ("<0x0A>") as their byte. Special tokens (those the
`tokenizers` file marks special) have their name's bytes and are listed apart.
"""

import functools
import json
import re
from dataclasses import dataclass

from attnlab.data.tokenizers import gpt2_byte_decoder

BYTE_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")


@dataclass(frozen=True)
class TokenBytes:
    """A vocabulary's bytes: `pieces[i]` is token i's; `special` the ids of its special tokens."""

    pieces: tuple[bytes, ...]
    special: frozenset[int]


def token_bytes(tokenizer) -> TokenBytes:
    """The bytes of every token of a language model's tokenizer (`CharTokenizer` or
    `BPETokenizer`), computed once per tokenizer object."""
    return _cached(tokenizer)


@functools.lru_cache(maxsize=16)
def _cached(tokenizer) -> TokenBytes:
    chars = getattr(tokenizer, "chars", None)
    if chars is not None:  # attnlab's character tokenizer
        return TokenBytes(tuple(c.encode() for c in chars), frozenset())
    return _from_tokenizers_file(json.loads(tokenizer.tokenizer.to_str()), tokenizer.vocab_size)


def _from_tokenizers_file(doc: dict, size: int) -> TokenBytes:
    """The bytes of a Hugging Face `tokenizers` file's tokens (its model's vocabulary and its
    added tokens), ids past the vocabulary empty."""
    vocab = {token: i for token, i in (doc.get("model") or {}).get("vocab", {}).items()}
    byte_level = "ByteLevel" in json.dumps(doc.get("decoder")) or "ByteLevel" in json.dumps(doc.get("pre_tokenizer"))
    pieces = [b""] * size
    for token, i in vocab.items():
        if i < size:
            pieces[i] = _piece_bytes(token, byte_level)
    special = set()
    for added in doc.get("added_tokens") or []:
        if added["id"] < size:
            pieces[added["id"]] = added["content"].encode()
            if added.get("special"):
                special.add(added["id"])
    return TokenBytes(tuple(pieces), frozenset(special))


def _piece_bytes(token: str, byte_level: bool) -> bytes:
    if byte_level:
        table = gpt2_byte_decoder()
        if all(c in table for c in token):
            return bytes(table[c] for c in token)
        return token.encode()
    if found := BYTE_PIECE.fullmatch(token):  # SentencePiece's byte fallback
        return bytes([int(found.group(1), 16)])
    return token.replace("\u2581", " ").encode()
