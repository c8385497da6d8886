"""A GGUF file's Q4_K and Q6_K blocks as the fused step's q4_k weights, used as they are.

The loader (`attnlab.models.hf.gguf`) dequantizes every tensor to float32, and the family's
importer reorders and joins rows (Llama's rotary rows, q/k/v into one in_proj, gate and up into
one fc1). Requantizing those values would not give back a K-quant file's blocks (llama.cpp's
scales come from a search), so `keep_file_blocks` finds each product's rows among the file's
Q4_K and Q6_K rows by their values (the dequantized float32 bytes, hashed) and hands the file's
super-blocks to `attnlab.accel.fused.keep_stored`: exact by construction, whatever the importer
did, since a row is matched only where the blocks decode to its values bit for bit. A product
some of whose rows are not found (changed since loading, or of another type) keeps
`stored_weight`'s own quantization.
"""

import hashlib
from pathlib import Path

import numpy as np
import torch
from torch import nn

from attnlab.accel.blocks import KINDS, Q4_K_BYTES, Q6_K_BYTES, QK
from attnlab.accel.fused import keep_stored, product_weights

RowBlocks = dict[bytes, tuple[int, np.ndarray]]
"""A row's float32 values, hashed -> (its kind, 0 Q4_K or 1 Q6_K; its super-blocks' bytes)."""


def _digest(row: np.ndarray) -> bytes:
    return hashlib.blake2b(np.ascontiguousarray(row, dtype=np.float32).tobytes(), digest_size=16).digest()


def file_rows(path: Path) -> RowBlocks:
    """Every row of the file's Q4_K and Q6_K tensors, by its values as gguf dequantizes them (what
    the loader reads): the row's kind and bytes."""
    from gguf import GGUFReader, quants

    table: RowBlocks = {}
    for tensor in GGUFReader(path).tensors:
        if tensor.tensor_type.name not in KINDS:
            continue
        width = int(tensor.shape[0])  # ggml lists the row length first
        values = np.asarray(quants.dequantize(tensor.data, tensor.tensor_type), dtype=np.float32).reshape(-1, width)
        raw = np.asarray(tensor.data).reshape(values.shape[0], -1)
        kind = KINDS.index(tensor.tensor_type.name)
        for row, blocks in zip(values, raw, strict=True):
            table[_digest(row)] = (kind, blocks)
    return table


def file_blocks(weight: torch.Tensor, rows: RowBlocks) -> tuple[torch.Tensor, torch.Tensor] | None:
    """`weight` `(..., out, in)` as the step's q4_k (values, kinds) made of the file's rows, or None
    where a row is not among them."""
    flat = weight.detach().reshape(-1, weight.size(-1)).numpy()
    found = [rows.get(_digest(row)) for row in flat]
    if any(f is None for f in found):
        return None
    kinds = np.array([kind for kind, _ in found], dtype=np.uint8)
    width = weight.size(-1) // QK * (Q6_K_BYTES if kinds.any() else Q4_K_BYTES)
    values = np.zeros((len(found), width), dtype=np.uint8)
    for i, (_, blocks) in enumerate(found):
        values[i, : blocks.size] = blocks
    shape = weight.shape[:-1]
    return torch.from_numpy(values).reshape(*shape, width), torch.from_numpy(kinds).reshape(shape)


def keep_file_blocks(model: nn.Module, path: Path) -> int:
    """Hold the file's own super-blocks as the q4_k copies of `model`'s products (a GPT the fused
    step reads, loaded from the GGUF file `path`) wherever all of a product's rows are found among
    them -> how many products take the file's blocks."""
    rows = file_rows(path)
    kept = 0
    for weight in product_weights(model):
        blocks = file_blocks(weight, rows)
        if blocks is not None:
            keep_stored(weight, "q4_k", blocks)
            kept += 1
    return kept
