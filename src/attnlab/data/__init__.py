"""Tokenizers, corpora and batching."""

from attnlab.data.tokenizers import BPETokenizer, CharTokenizer, Tokenizer, load_tokenizer

__all__ = ["BPETokenizer", "CharTokenizer", "Tokenizer", "load_tokenizer"]
