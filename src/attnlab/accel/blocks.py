"""GGUF's K-quant super-blocks, Q4_K and Q6_K, as the fused step's "q4_k" weights store them
(`attnlab.accel.fused`; the C++ products in quantizedk.h).

The bytes are ggml's (`block_q4_K`, `block_q6_K` in ggml-common.h), so that gguf-py's
`gguf.quants.dequantize` reads what `quantize_q4_k` and `quantize_q6_k` write, and a GGUF file's
blocks could be multiplied as they are. A super-block holds 256 values of a row:

- Q4_K, 144 bytes: f16 d, f16 dmin, 12 bytes packing eight six-bit scales sc_j and mins m_j, 128
  bytes of four-bit codes q; sub-block j (32 values) is w = (d sc_j) q − (dmin m_j).
- Q6_K, 210 bytes: ql (128 bytes, the codes' low four bits), qh (64, their top two), sixteen int8
  scales, f16 d; sub-block s (16 values) is w = (d scale_s) (q − 32), q in 0..63.

gguf-py has no quantizer for these types (llama.cpp's searches scales that minimise a weighted
error). The quantizers here choose each scale as the smallest the six-bit (Q4_K) or int8 (Q6_K)
scales can write that covers its sub-block's range without clipping, so that every value rounds to
its nearest code: within half its sub-block's step d sc_j (Q4_K; plus float32's rounding of the
subtraction) or d scale_s (Q6_K, exactly), as the tests check. The scales are chosen in float64
and d rounded up to fp16, so that the six-bit codes never overflow.

References: llama.cpp's k-quants (ggml-quants.c, PR #1684); gguf-py's quants.py.
"""

import torch

QK = 256
"""Values per super-block (ggml's QK_K)."""
Q4_K_BYTES = 144
Q6_K_BYTES = 210
KINDS = ("Q4_K", "Q6_K")
"""A row's kind in the step's "q4_k" weights, by its code (`attnlab::kQ4K`, `kQ6K`)."""


def _check_super_blocks(n: int, name: str) -> None:
    if n % QK:
        raise ValueError(f"{name} needs rows a multiple of {QK} wide, got {n}")


def _half_up(x: torch.Tensor) -> torch.Tensor:
    """x (float64, ≥ 0) rounded up to an fp16 value, as float64: a scale never smaller than asked."""
    h = x.half()
    h = torch.where(h.double() < x, torch.nextafter(h, torch.full_like(h, float("inf"))), h)
    return h.double()


def _ceil_ratio(a: torch.Tensor, b: torch.Tensor, top: int) -> torch.Tensor:
    """ceil(a / b) clamped to 0..top, 0 where b is 0 (float64 in, float64 out)."""
    safe = torch.where(b > 0, b, torch.ones_like(b))
    return torch.where(b > 0, torch.ceil(a / safe), torch.zeros_like(a)).clamp(0, top)


def _f16_bytes(x: torch.Tensor) -> torch.Tensor:
    """(..., S) fp16-exact values -> their little-endian bytes (..., S, 2)."""
    return x.half().unsqueeze(-1).view(torch.uint8)


def _f16_values(b: torch.Tensor) -> torch.Tensor:
    """(..., S, 2) bytes -> their fp16 values as float32 (..., S, 1)."""
    return b.contiguous().view(torch.float16).float()


def quantize_q4_k(weight: torch.Tensor) -> torch.Tensor:
    """GGUF's Q4_K of a weight `(..., out, in)`, `in` a multiple of 256 -> its super-blocks `(...,
    out, in / 256 * 144)` uint8. Per sub-block of 32 values: m_j covers the sub-block's most
    negative value (none above 0), sc_j its range above −dmin m_j in 15 steps, each the smallest
    six-bit multiple of dmin and d that does (d and dmin the largest asked over 63, rounded up to
    fp16); q = round((w + dmin m_j) / (d sc_j)) in 0..15."""
    *lead, n = weight.shape
    _check_super_blocks(n, "Q4_K")
    w = weight.detach().double().reshape(*lead, n // QK, 8, 32)
    low = -w.amin(-1).clamp(max=0)  # (..., S, 8), ≥ 0: what the mins must lift
    dmin = _half_up(low.amax(-1) / 63)  # (..., S)
    m = _ceil_ratio(low, dmin.unsqueeze(-1), 63)
    lift = dmin.unsqueeze(-1) * m  # dmin m_j, exact in float32 too
    step = (w.amax(-1) + lift) / 15  # the sub-blocks' smallest steps
    d = _half_up(step.amax(-1) / 63)
    sc = _ceil_ratio(step, d.unsqueeze(-1), 63)
    scale = (d.unsqueeze(-1) * sc).unsqueeze(-1)
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))
    q = torch.round((w + lift.unsqueeze(-1)) / safe).clamp(0, 15).to(torch.uint8)  # (..., S, 8, 32)
    sc, m = sc.to(torch.uint8), m.to(torch.uint8)
    packed = torch.cat(
        [
            sc[..., :4] | ((sc[..., 4:] >> 4) << 6),
            m[..., :4] | ((m[..., 4:] >> 4) << 6),
            (sc[..., 4:] & 15) | ((m[..., 4:] & 15) << 4),
        ],
        dim=-1,
    )  # (..., S, 12)
    codes = (q[..., 0::2, :] | (q[..., 1::2, :] << 4)).flatten(-2)  # (..., S, 128): even j low, odd j high
    blocks = torch.cat([_f16_bytes(d), _f16_bytes(dmin), packed, codes], dim=-1)
    return blocks.reshape(*lead, n // QK * Q4_K_BYTES).contiguous()


def q4_k_scales(packed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q4_K's 12 packed bytes `(..., 12)` -> the eight six-bit scales and mins, each `(..., 8)` uint8."""
    first, second, rest = packed[..., :4], packed[..., 4:8], packed[..., 8:]
    sc = torch.cat([first & 63, (rest & 15) | ((first >> 6) << 4)], dim=-1)
    m = torch.cat([second & 63, (rest >> 4) | ((second >> 6) << 4)], dim=-1)
    return sc, m


def dequantize_q4_k(blocks: torch.Tensor) -> torch.Tensor:
    """The weights `(..., out, in)` that Q4_K super-blocks `(..., out, in / 256 * 144)` stand for:
    (d sc_j) q − (dmin m_j), in float32 in gguf.quants' order of operations."""
    *lead, size = blocks.shape
    b = blocks.reshape(*lead, size // Q4_K_BYTES, Q4_K_BYTES)
    d, dmin = _f16_values(b[..., 0:2]), _f16_values(b[..., 2:4])  # (..., S, 1)
    sc, m = q4_k_scales(b[..., 4:16])
    codes = b[..., 16:].reshape(*lead, -1, 4, 1, 32) >> torch.tensor([0, 4], dtype=torch.uint8).view(2, 1)
    q = (codes & 15).reshape(*lead, -1, 8, 32).float()
    values = (d * sc.float()).unsqueeze(-1) * q - (dmin * m.float()).unsqueeze(-1)
    return values.reshape(*lead, -1)


def quantize_q6_k(weight: torch.Tensor) -> torch.Tensor:
    """GGUF's Q6_K of a weight `(..., out, in)`, `in` a multiple of 256 -> its super-blocks `(...,
    out, in / 256 * 210)` uint8. Per sub-block of 16 values the scale is the smallest multiple
    d scale_s (scale_s in 0..127, d the largest asked over 127 rounded up to fp16) that puts the
    sub-block within 31 steps of 0; q = round(w / (d scale_s)) + 32 in 1..63."""
    *lead, n = weight.shape
    _check_super_blocks(n, "Q6_K")
    w = weight.detach().double().reshape(*lead, n // QK, 16, 16)
    step = w.abs().amax(-1) / 31  # (..., S, 16)
    d = _half_up(step.amax(-1) / 127)
    scales = _ceil_ratio(step, d.unsqueeze(-1), 127)
    scale = (d.unsqueeze(-1) * scales).unsqueeze(-1)
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))
    q = (torch.round(w / safe) + 32).clamp(0, 63).to(torch.uint8).reshape(*lead, -1, 2, 4, 32)  # half, group
    low = q & 15
    ql = torch.cat([low[..., 0, :] | (low[..., 2, :] << 4), low[..., 1, :] | (low[..., 3, :] << 4)], dim=-1)
    qh = (q[..., 0, :] >> 4) | ((q[..., 1, :] >> 4) << 2) | ((q[..., 2, :] >> 4) << 4) | ((q[..., 3, :] >> 4) << 6)
    blocks = torch.cat([ql.flatten(-2), qh.flatten(-2), scales.to(torch.int8).view(torch.uint8), _f16_bytes(d)], dim=-1)
    return blocks.reshape(*lead, n // QK * Q6_K_BYTES).contiguous()


def dequantize_q6_k(blocks: torch.Tensor) -> torch.Tensor:
    """The weights `(..., out, in)` that Q6_K super-blocks `(..., out, in / 256 * 210)` stand for:
    (d scale_s) (q − 32), in float32 in gguf.quants' order of operations."""
    *lead, size = blocks.shape
    b = blocks.reshape(*lead, size // Q6_K_BYTES, Q6_K_BYTES)
    ql, qh = b[..., :128].reshape(*lead, -1, 2, 1, 64), b[..., 128:192].reshape(*lead, -1, 2, 1, 32)
    low = (ql >> torch.tensor([0, 4], dtype=torch.uint8).view(2, 1)) & 15  # (..., S, 2, 2, 64)
    high = (qh >> torch.tensor([0, 2, 4, 6], dtype=torch.uint8).view(4, 1)) & 3  # (..., S, 2, 4, 32)
    q = low.reshape(*lead, -1, 8, 32) | (high.reshape(*lead, -1, 8, 32) << 4)
    scale = _f16_values(b[..., 208:210]) * b[..., 192:208].contiguous().view(torch.int8).float()  # (..., S, 16)
    values = scale.unsqueeze(-1) * (q.to(torch.int8) - 32).reshape(*lead, -1, 16, 16).float()
    return values.reshape(*lead, -1)


QUANTIZERS = {
    "Q4_K": (quantize_q4_k, dequantize_q4_k, Q4_K_BYTES),
    "Q6_K": (quantize_q6_k, dequantize_q6_k, Q6_K_BYTES),
}


def quantize_rows(weight: torch.Tensor, kinds: torch.Tensor) -> torch.Tensor:
    """A weight `(..., out, in)` with each row in its kind (`kinds` `(..., out)`: 0 Q4_K, 1 Q6_K) ->
    the rows' super-blocks `(..., out, in / 256 × the widest kind's bytes)`, a Q4_K row's bytes
    first in its row where a Q6_K row is wider (the step's "q4_k" weights)."""
    *lead, n = weight.shape
    _check_super_blocks(n, "Q4_K and Q6_K")
    rows, flat_kinds = weight.detach().reshape(-1, n), kinds.reshape(-1)
    if flat_kinds.numel() != rows.size(0) or bool((flat_kinds > 1).any()):
        raise ValueError(f"kinds must be one code per row, 0 (Q4_K) or 1 (Q6_K): shape {tuple(weight.shape[:-1])}")
    width = n // QK * (Q6_K_BYTES if bool((flat_kinds == 1).any()) else Q4_K_BYTES)
    out = torch.zeros(rows.size(0), width, dtype=torch.uint8)
    for code, name in enumerate(KINDS):
        chosen = flat_kinds == code
        if chosen.any():
            quantize, _, size = QUANTIZERS[name]
            out[chosen, : n // QK * size] = quantize(rows[chosen])
    return out.reshape(*lead, width)


def dequantize_rows(values: torch.Tensor, kinds: torch.Tensor) -> torch.Tensor:
    """The weights `(..., out, in)` that `quantize_rows`' super-blocks and kinds stand for."""
    *lead, width = values.shape
    flat, flat_kinds = values.reshape(-1, width), kinds.reshape(-1)
    super_blocks = width // (Q6_K_BYTES if bool((flat_kinds == 1).any()) else Q4_K_BYTES)
    out = torch.empty(flat.size(0), super_blocks * QK)
    for code, name in enumerate(KINDS):
        chosen = flat_kinds == code
        if chosen.any():
            _, dequantize, size = QUANTIZERS[name]
            out[chosen] = dequantize(flat[chosen, : super_blocks * size])
    return out.reshape(*lead, super_blocks * QK)
