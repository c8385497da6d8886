"""Linear maps y = x Wᵀ + b, with a faster route for the few-row products of decoding on a CPU.

A decoding step multiplies one row per sequence by every weight matrix of the model: matrix–vector
products, whose speed is how fast the weights stream from memory. On the CPU a one-row `F.linear`
goes to a BLAS gemv that reads a weight matrix too big for the cache at ~7 GB/s on our 2-core
machine, where a plain sum reads ~30 GB/s. The same product written as a batched matmul — the
weight rows split into two halves, the vector as a column whose strides make it the transposed
operand — takes the gemm kernel and reads 2.7× as fast (`benchmarks/gemv.py`; BENCHMARKS.md). For
matrices that stay in cache the call overhead dominates and the gemv is the faster one, hence the
size threshold. Everywhere else `linear` is `F.linear`.

Products of a few rows (a batch of sequences decoding together, beams) are past what the gemv
trick helps; there oneDNN's kernel over a weight reordered once into its blocked layout reads
1.8× as fast as `F.linear` (the same benchmark). `Linear` keeps that reordered copy (not in the state
dict; remade when the weight changes) and uses it outside autograd, autocast and torch.compile,
which has its own kernels.
"""

import torch
import torch.nn.functional as F
from torch import nn

GEMV_MAX_ROWS = 1
"""Products with at most this many rows take the streaming route."""
GEMV_MIN_WEIGHT = 1 << 17
"""...and weights with at least this many elements (512 KiB in fp32; smaller ones stay in cache)."""
GEMV_SPLITS = 2
"""Halves of the weight rows, one per batch entry of the batched matmul."""
PACKED_MAX_ROWS = 8
"""`Linear` uses its reordered weight for products of 2 to this many rows..."""
PACKED_MIN_WEIGHT = 1 << 15
"""...and weights with at least this many elements, to reach the 256×256 projections of the
translation model's beams (`benchmarks/decode_ab.py beam`: both routes 1.2× neither; this threshold
against GEMV_MIN_WEIGHT's, 11.7 vs 12.5 sentences/s, within noise)."""


def streams_as_gemv(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether `linear(x, weight)` takes the batched-matmul route (CPU, few rows, a large weight)."""
    return (
        x.device.type == "cpu"
        and x.numel() <= GEMV_MAX_ROWS * x.size(-1)
        and weight.numel() >= GEMV_MIN_WEIGHT
        and weight.size(0) % GEMV_SPLITS == 0
        and weight.is_contiguous()
        and x.dtype == weight.dtype
    )


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x Wᵀ + b: x `(..., in)`, weight `(out, in)`, bias `(out,)` -> `(..., out)`; the same function
    as `F.linear`, through the streaming route when `streams_as_gemv` says so."""
    if not streams_as_gemv(x, weight):
        return F.linear(x, weight, bias)
    out, inp = weight.shape
    rows = x.numel() // inp
    halves = weight.view(GEMV_SPLITS, out // GEMV_SPLITS, inp)  # (S, out/S, in)
    # (rows, in) -> (S, in, rows) with the `in` stride 1: the column is the transposed operand.
    column = x.reshape(1, rows, inp).transpose(1, 2).expand(GEMV_SPLITS, inp, rows)
    y = torch.bmm(halves, column).view(out, rows).t()  # (rows, out)
    if bias is not None:
        y = y + bias
    return y.reshape(*x.shape[:-1], out)


class Linear(nn.Linear):
    """`torch.nn.Linear` (same parameters, same state dict) whose forward is `linear`, or for a few
    rows in inference a oneDNN product with a reordered copy of the weight (see the module doc)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._packed: tuple[tuple[int, int], torch.Tensor] | None = None  # ((data_ptr, version), weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self._uses_packed(x):
            return torch.ops.mkldnn._linear_pointwise(x, self._packed_weight(), self.bias, "none", [], "")
        return linear(x, self.weight, self.bias)

    def _uses_packed(self, x: torch.Tensor) -> bool:
        w = self.weight
        return (
            x.device.type == "cpu"
            and x.dtype == w.dtype == torch.float32
            and 1 < x.numel() // x.size(-1) <= PACKED_MAX_ROWS
            and w.numel() >= PACKED_MIN_WEIGHT
            and not torch.is_grad_enabled()
            and not torch.is_autocast_enabled("cpu")
            and not torch.compiler.is_compiling()
            and torch.backends.mkldnn.is_available()
        )

    def __getstate__(self) -> dict:
        # The reordered copy is a cache, remade on demand; an opaque oneDNN tensor cannot be copied.
        state = super().__getstate__()
        state["_packed"] = None
        return state

    def _packed_weight(self) -> torch.Tensor:
        key = (self.weight.data_ptr(), self.weight._version)  # an optimizer step bumps the version
        if self._packed is None or self._packed[0] != key:
            self._packed = (key, torch.ops.mkldnn._reorder_linear_weight(self.weight.detach(), PACKED_MAX_ROWS))
        return self._packed[1]
