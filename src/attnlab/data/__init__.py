"""Tokenizers, corpora and batching."""

from attnlab.data.tokenizers import BPETokenizer, CharTokenizer, Tokenizer, WordPieceTokenizer, load_tokenizer

__all__ = ["BPETokenizer", "CharTokenizer", "Tokenizer", "WordPieceTokenizer", "load_tokenizer"]
