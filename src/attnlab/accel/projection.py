"""Linear maps y = x Wᵀ + b, with a faster route for the few-row products of decoding on a CPU.

A decoding step multiplies one row per sequence by every weight matrix of the model: matrix–vector
products, whose speed is how fast the weights stream from memory. On the CPU a one-row `F.linear`
goes to a BLAS gemv that reads a weight matrix too big for the cache well below the memory's
bandwidth. The same product written as a batched matmul — the weight rows split into two halves,
the vector as a column whose strides make it the transposed operand — takes the gemm kernel and
reads faster (`benchmarks/gemv.py`; BENCHMARKS.md, "Tuned CPU paths"). For matrices that stay in cache the call overhead
dominates and the gemv is the faster one, hence the size threshold. Everywhere else `linear` is
`F.linear`.

Products of a few rows (a batch of sequences decoding together, beams) are past what the gemv
trick helps; there oneDNN's kernel over a weight reordered once into its blocked layout reads
faster than `F.linear` (the same benchmark). `Linear` uses that reordered copy (kept beside the
weight, not in the state dict; remade when the weight changes) outside autograd and autocast.
`attnlab.accel.for_decoding` gives a model's projections this class.
"""

import weakref

import torch
import torch.nn.functional as F
from torch import nn

MKLDNN = torch.backends.mkldnn.is_available()  # asked once: torch.compile cannot trace the call

GEMV_MIN_WEIGHT = 1 << 17
"""One-row products take the streaming route for weights with at least this many elements
(512 KiB in fp32; smaller ones stay in cache)."""
GEMV_SPLITS = 2
"""Halves of the weight rows, one per batch entry of the batched matmul."""
PACKED_MAX_ROWS = 8
"""`Linear` uses the reordered weight for products of 2 to this many rows..."""
PACKED_MIN_WEIGHT = 1 << 15
"""...and weights with at least this many elements, to reach the 256×256 projections of the
translation model's beams (`benchmarks/decode_ab.py beam`; BENCHMARKS.md, "Tuned CPU paths")."""

# Under torch.compile both routes are operators of their own, which the compiler calls as they are
# (its own code for a one-row product streams the weights no faster than the gemv). Registered
# with `Library.impl` rather than `custom_op`, whose Python wrapper costs a sizeable part of a
# small decoding step, which makes several such calls per layer.
_LIB = torch.library.Library("attnlab", "DEF")
_LIB.define("streamed_product(Tensor x, Tensor weight) -> Tensor")
_LIB.define("packed_product(Tensor x, Tensor weight) -> Tensor")


def streams_as_gemv(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether `linear(x, weight)` takes the batched-matmul route (CPU, one row, a large weight)."""
    return (
        x.device.type == "cpu"
        and x.numel() == x.size(-1)
        and x.is_contiguous()
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
    if torch.compiler.is_compiling() and not torch.is_grad_enabled():
        y = torch.ops.attnlab.streamed_product(x, weight)
    else:
        y = _streamed_product(x, weight)
    return y if bias is None else y + bias


def _streamed_product(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x Wᵀ for one contiguous row x `(..., in)` as a batched matmul (see the module doc)."""
    out, inp = weight.shape
    halves = weight.view(GEMV_SPLITS, out // GEMV_SPLITS, inp)  # (S, out/S, in)
    # x as an (S, in, 1) column with strides (0, 1, in): the transposed operand of the gemm kernel.
    column = x.as_strided((GEMV_SPLITS, inp, 1), (0, 1, inp))
    return torch.bmm(halves, column).view(*x.shape[:-1], out)


_REORDERED: dict[tuple[int, int | None], tuple[weakref.ref, int, torch.Tensor]] = {}
"""(id(weight), rows) -> (the weight, its version when reordered, the reordered copy)."""


def _entry(weight: torch.Tensor, rows: int | None = None) -> tuple[weakref.ref, int, torch.Tensor] | None:
    """This weight's entry in `_REORDERED`, if it has one (not another tensor's that had its id)."""
    hit = _REORDERED.get((id(weight), rows))
    return hit if hit is not None and hit[0]() is weight else None


def reordered_weight(weight: torch.Tensor, rows: int | None = None) -> torch.Tensor:
    """oneDNN's blocked copy of weight `(out, in)` (of its first `rows` rows, if given), made once
    and kept while the weight lives and is unchanged: an optimizer step or `load_state_dict`
    bumps its version, which remakes it."""
    hit = _entry(weight, rows)
    if hit is not None and hit[1] == weight._version:
        return hit[2]
    key = (id(weight), rows)
    packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach()[:rows].contiguous(), PACKED_MAX_ROWS)
    # The entry goes with the weight (a new tensor may then take its id).
    _REORDERED[key] = (weakref.ref(weight, lambda _: _REORDERED.pop(key, None)), weight._version, packed)
    return packed


def has_reordered_weight(weight: torch.Tensor) -> bool:
    """Whether `reordered_weight` holds a copy of this weight (the reordered route ran on it)."""
    return _entry(weight) is not None


def _packed_product(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, reordered_weight(weight), None, "none", [], "")


def _product_shape(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], weight.size(0)))


_LIB.impl("streamed_product", _streamed_product, "CPU")
_LIB.impl("packed_product", _packed_product, "CPU")
torch.library.register_fake("attnlab::streamed_product", _product_shape, lib=_LIB)
torch.library.register_fake("attnlab::packed_product", _product_shape, lib=_LIB)


class Linear(nn.Linear):
    """`torch.nn.Linear` (same parameters, same state dict) whose forward is `linear`, or for a few
    rows in inference a oneDNN product with the reordered weight (see the module doc)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self._uses_reordered(x):
            return linear(x, self.weight, self.bias)
        if torch.compiler.is_compiling():
            y = torch.ops.attnlab.packed_product(x, self.weight)
            return y if self.bias is None else y + self.bias
        return torch.ops.mkldnn._linear_pointwise(x, reordered_weight(self.weight), self.bias, "none", [], "")

    def _uses_reordered(self, x: torch.Tensor) -> bool:
        w = self.weight
        return (
            MKLDNN
            and x.device.type == "cpu"
            and x.dtype == w.dtype == torch.float32
            and 1 < x.numel() // x.size(-1) <= PACKED_MAX_ROWS
            and w.numel() >= PACKED_MIN_WEIGHT
            and not torch.is_grad_enabled()
            and not torch.is_autocast_enabled("cpu")
        )
