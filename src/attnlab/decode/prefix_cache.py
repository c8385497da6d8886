"""Automatic prefix caching (vLLM's): the keys and values of recent prompts, kept in blocks of
`block_tokens` tokens and found again by their token prefix.

A chat server reads the same long beginnings again and again: a system prompt, the earlier turns
of a conversation, a few-shot preamble. A causal model's key and value at position p depend on the
tokens 0 … p alone, so the keys and values a row wrote for one prompt are those of any prompt that
begins with the same tokens. The cache keeps them in blocks, each keyed by a hash chain
(`block_keys`): block i's key digests block i−1's key and block i's tokens, so equal keys mean
equal whole prefixes, not just equal blocks. A new sequence copies the longest chain of cached
blocks into its cache row (`load`) and prefills only the rest of its prompt.

Blocks are copies, not pages of the rows' cache: a cached block outlives the sequence that wrote
it, and a row's cache stays one contiguous buffer (the fused C++ step reads it as such). Under the
memory bound the least recently used block goes first; a chain is touched from its last block back
to its first, so a block is never older than one after it and eviction takes chains from the end.
"""

import hashlib
from array import array
from collections import OrderedDict

import torch

from attnlab.nn.attention import KVCache

BLOCK_TOKENS = 16
"""Tokens per cached block (vLLM's default block size): a shared prefix is reused whole blocks at a time."""


def block_keys(tokens: list[int], block_tokens: int = BLOCK_TOKENS) -> list[bytes]:
    """The hash chain of tokens' full blocks: key i = blake2b(key i−1, tokens of block i). A last
    block of fewer than block_tokens tokens has none (its keys and values would change as it fills)."""
    keys, parent = [], b""
    for start in range(0, len(tokens) - block_tokens + 1, block_tokens):
        digest = hashlib.blake2b(parent, digest_size=16)
        digest.update(array("q", tokens[start : start + block_tokens]).tobytes())
        parent = digest.digest()
        keys.append(parent)
    return keys


def reusable(cache: list[KVCache]) -> bool:
    """Whether a model's cache rows can take cached prefixes: a ring (`RollingKVCache`, window
    attention) overwrites its oldest keys and holds position p in slot p mod window, so its slots
    are no prefix of anything."""
    return all(type(layer) is KVCache for layer in cache)


class PrefixCache:
    """Cached keys and values of the rows of `cache` (one `KVCache` per layer, `(B, H, L, D)`
    each), in blocks of block_tokens tokens, at most `capacity_bytes` of them.

    `lookup(tokens)` finds the longest cached chain of tokens' full blocks, `load` copies those
    blocks into a cache row, and `store` keeps the full blocks a row has written."""

    def __init__(self, cache: list[KVCache], capacity_bytes: int, block_tokens: int = BLOCK_TOKENS) -> None:
        if capacity_bytes < 0:
            raise ValueError(f"capacity_bytes must be >= 0, got {capacity_bytes}")
        self.cache = cache
        self.block_tokens = block_tokens
        # A block: every layer's keys and values of block_tokens positions, (2, H, block_tokens, D) each.
        self.block_bytes = sum(2 * layer.k[0, :, :block_tokens].numel() * layer.k.element_size() for layer in cache)
        self.capacity = capacity_bytes // self.block_bytes  # blocks
        self._blocks: OrderedDict[bytes, list[torch.Tensor]] = OrderedDict()  # least recently used first

    def __len__(self) -> int:
        return len(self._blocks)

    @property
    def nbytes(self) -> int:
        """Bytes the cached blocks hold."""
        return len(self._blocks) * self.block_bytes

    def __contains__(self, key: bytes) -> bool:
        return key in self._blocks

    def lookup(self, tokens: list[int]) -> list[list[torch.Tensor]]:
        """The blocks of tokens' longest cached prefix of full blocks (its first len(result) ×
        block_tokens tokens), marked as used. A caller that holds them may `load` them even after
        later stores have evicted them: eviction drops the cache's reference, never the tensors."""
        found = []
        for key in block_keys(tokens, self.block_tokens):
            if key not in self._blocks:
                break
            found.append(key)
        self._touch(found)
        return [self._blocks[key] for key in found]

    def load(self, blocks: list[list[torch.Tensor]], row: int, length: int) -> None:
        """Write the first `length` positions of blocks (at most all of theirs) into slots
        0 … length − 1 of every layer's cache row `row`."""
        for start in range(0, length, self.block_tokens):
            n = min(self.block_tokens, length - start)
            for layer, kv in zip(self.cache, blocks[start // self.block_tokens], strict=True):
                layer.k[row, :, start : start + n] = kv[0, :, :n]
                layer.v[row, :, start : start + n] = kv[1, :, :n]

    def store(self, tokens: list[int], row: int) -> None:
        """Keep the full blocks of tokens, whose keys and values cache row `row` holds at slots
        0 … len(tokens) − 1: those not cached are copied, and the whole chain is marked as used.
        The least recently used blocks go when the bound is reached."""
        if self.capacity == 0:
            return
        keys = block_keys(tokens, self.block_tokens)[: self.capacity]
        for i, key in enumerate(keys):
            if key not in self._blocks:
                self._blocks[key] = self._copy(row, i * self.block_tokens)
        self._touch(keys)
        while len(self._blocks) > self.capacity:
            self._blocks.popitem(last=False)

    def clear(self) -> None:
        self._blocks.clear()

    def _copy(self, row: int, start: int) -> list[torch.Tensor]:
        """Every layer's keys and values of row's slots start … start + block_tokens − 1,
        `(2, H, block_tokens, D)` each."""
        end = start + self.block_tokens
        return [torch.stack((layer.k[row, :, start:end], layer.v[row, :, start:end])) for layer in self.cache]

    def _touch(self, keys: list[bytes]) -> None:
        """Mark a chain's blocks as the most recently used, its first block the most recent of
        all: eviction then takes the chain's last blocks first, and never leaves a block whose
        parent has gone (it could never be found again)."""
        for key in reversed(keys):
            self._blocks.move_to_end(key)


def for_cache(cache: list[KVCache], capacity_bytes: int, block_tokens: int = BLOCK_TOKENS) -> "PrefixCache | None":
    """A prefix cache over these rows, or None: a bound of 0, or a cache whose rows take no
    cached prefix (`reusable`)."""
    if capacity_bytes <= 0 or not reusable(cache):
        return None
    return PrefixCache(cache, capacity_bytes, block_tokens)


__all__ = ["BLOCK_TOKENS", "PrefixCache", "block_keys", "for_cache", "reusable"]
