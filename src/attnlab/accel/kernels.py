"""attnlab's own CPU kernels for training: GELU and self-attention, forward and backward.

In a small Transformer's CPU training step the matrix products run near the machine's fp32
peak; what is left is mostly PyTorch's GELU (its tanh and erf are accurate but do not vectorize
well) and its attention kernel at small T, with the head split and merge around it (the
measurements: BENCHMARKS.md, "Tuned CPU paths"). `kernels.cpp` computes both in vectorized loops,
attention straight from the fused q/k/v projection `(B, T, 3C)` to `(B, T, C)`.

Built with PyTorch's C++ extension tools (cached after the first build): by `attnlab kernels
build`, which `make` runs at installation, or on first use. A model takes them through
`attnlab.accel.for_training`, which the trainer calls when `train.fused_kernels` says so ("auto",
the default: when the kernels are built here, so that no run waits for a build). Each function
here takes the kernels for fp32 CPU tensors outside torch.compile and autocast, and PyTorch's
operators for everything else (or returns None for its caller to run PyTorch's path). So do
whole pre-norm blocks (`pre_norm_block`, one C++ call forward and one backward) and a GPT's stack
of them (`pre_norm_stack`, the whole stack one call each way).
"""

import functools
import weakref
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import torch
import torch.nn.functional as F
from torch import nn

from attnlab.accel.coverage import covers_attention, covers_block, shared_blocks
from attnlab.accel.extensions import build
from attnlab.accel.extensions import is_built as is_built_here
from attnlab.nn import MultiHeadAttention, TransformerBlock

HEAD_DIMS = (16, 32, 64, 128)
"""Head sizes the attention kernel is compiled for."""

NAME = "attnlab_kernels"
SOURCE = Path(__file__).with_name("kernels.cpp")


@functools.cache
def extension() -> ModuleType | None:
    """The compiled kernels, built on first use; None (with a warning) when they cannot be built."""
    return build(NAME, SOURCE, what="training kernels", fallback="using PyTorch's operators")


def is_built() -> bool:
    """Whether `extension()` loads a finished build (no pause to compile)."""
    return is_built_here(NAME, SOURCE)


def takes(x: torch.Tensor) -> ModuleType | None:
    """The extension, when the kernels take x (fp32 on the CPU, outside torch.compile and
    autocast) and are built; else None."""
    if x.device.type != "cpu" or x.dtype != torch.float32:
        return None
    if torch.compiler.is_compiling() or torch.is_autocast_enabled("cpu"):
        return None
    return extension()


class _Gelu(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, tanh: bool) -> torch.Tensor:
        ctx.save_for_backward(x)
        ctx.tanh = tanh
        return extension().gelu_forward(x, tanh)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        (x,) = ctx.saved_tensors
        return extension().gelu_backward(grad.contiguous(), x, ctx.tanh), None


def gelu(x: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    """`F.gelu(x, approximate=...)` ("none": x Φ(x) through erf; "tanh": GPT-2's approximation),
    through the kernel where it applies; within 2e-6 of PyTorch's in value and gradient."""
    if approximate not in ("none", "tanh"):
        raise ValueError(f"approximate must be 'none' or 'tanh', got {approximate!r}")
    if takes(x) is None:
        return F.gelu(x, approximate=approximate)
    return _Gelu.apply(x.contiguous(), approximate == "tanh")


class _SelfAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, qkv: torch.Tensor, n_heads: int, causal: bool) -> torch.Tensor:
        y, lse = extension().attention_forward(qkv, n_heads, causal)
        ctx.save_for_backward(qkv, y, lse)
        ctx.n_heads, ctx.causal = n_heads, causal
        return y

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        qkv, y, lse = ctx.saved_tensors
        return extension().attention_backward(grad.contiguous(), qkv, y, lse, ctx.n_heads, ctx.causal), None, None


def self_attention(qkv: torch.Tensor, n_heads: int, causal: bool) -> torch.Tensor | None:
    """Multi-head self-attention of the fused projection qkv `(B, T, 3C)` (q, k, v side by side,
    head h the columns [hD, (h+1)D) of each) -> `(B, T, C)`, heads concatenated, through the kernel;
    None where the kernel does not apply (the caller then takes PyTorch's path). No mask but the
    causal one, no dropout."""
    d = qkv.size(-1) // (3 * n_heads)
    if not takes_attention(qkv, d):
        return None
    return _SelfAttention.apply(qkv.contiguous(), n_heads, causal)


def takes_attention(x: torch.Tensor, head_dim: int) -> bool:
    """Whether `self_attention` runs the kernel for heads of `head_dim` on x `(B, T, ·)` (the
    input of the q/k/v projection or its output: the same dtype and device)."""
    return x.dim() == 3 and head_dim in HEAD_DIMS and takes(x) is not None


ACTIVATION_CODES = {"gelu": 0, "gelu_tanh": 1, "relu": 2}
"""The C++ side's numbering of the feed-forward activations (`attnlab::Activation` in vecmath.h),
for these kernels and the fused decoding steps."""


class _Runner:
    """A block's (or a stack's) C++ kernel, and a count of its forward calls: the kernel keeps one
    forward's activations, so a backward must follow its own forward."""

    def __init__(self, kernel: object, key: tuple) -> None:
        self.kernel, self.key, self.calls = kernel, key, 0


_RUNNERS: "weakref.WeakKeyDictionary[nn.Module, _Runner]" = weakref.WeakKeyDictionary()


class _PreNormBlock(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, runner: _Runner, *params: torch.Tensor) -> torch.Tensor:
        runner.calls += 1
        ctx.runner, ctx.call = runner, runner.calls
        ctx.has_grad = [p.numel() > 0 for p in params]
        return runner.kernel.forward(x, list(params))

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        if ctx.runner.calls != ctx.call:
            raise RuntimeError(
                "attnlab's fused block ran forward again before the backward of an earlier forward; "
                "run each backward before the next forward, or train without attnlab.accel.for_training"
            )
        dx, *grads = ctx.runner.kernel.backward(grad.contiguous())
        return (dx, None, *[g if has else None for g, has in zip(grads, ctx.has_grad, strict=True)])


def _params(block: nn.Module) -> list[torch.Tensor]:
    """A pre-norm block's parameters in the C++ side's order; an empty tensor for a missing bias.
    (Read from the modules' dictionaries: `Module.__getattr__` made this a measurable share of a
    small training step, BENCHMARKS.md "Tuned CPU paths".)"""
    mods = block._modules
    attn, ffn = mods["attn"]._modules, mods["ffn"]._modules
    out = []
    for layer in (mods["norm1"], attn["in_proj"], attn["out_proj"], mods["norm2"], ffn["fc1"], ffn["fc2"]):
        bias = layer._parameters.get("bias")
        out += [layer._parameters["weight"], bias if bias is not None else _NO_BIAS]
    return out


_NO_BIAS = torch.empty(0)


def _block_setup(block: nn.Module, x: torch.Tensor, causal: bool) -> tuple[tuple, list[torch.Tensor]] | None:
    """The C++ kernel's settings for `block` on x, and its parameters in the C++ side's order; None
    where the block is not one the kernel runs: a pre-norm `TransformerBlock` with full
    self-attention, positions only at the input, and no mask but the causal one, no dropout in
    training, fp32 CPU parameters (and not applied in several layers: the caller's to say)."""
    if x.dim() != 3 or not takes_block(block, block.training):
        return None
    params = _params(block)
    if any(p.dtype != torch.float32 or p.device.type != "cpu" for p in params if p is not _NO_BIAS):
        return None
    return (block.attn.n_heads, causal, block.ffn.activation, block.norm1.eps), params


def takes_block(block: nn.Module, training: bool) -> bool:
    """What of `_block_setup`'s conditions the block's modules decide: pre-norm, covered parts, a
    head size and activation compiled for, no dropout when `training`, one LayerNorm epsilon."""
    attn = block.attn
    return (
        block.pre_norm
        and covers_block(block)
        and attn.head_dim in HEAD_DIMS
        and block.ffn.activation in ACTIVATION_CODES
        and not (training and (attn.dropout > 0 or block.dropout.p > 0 or block.ffn.dropout.p > 0))
        and block.norm1.eps == block.norm2.eps
    )


def _runner(owner: nn.Module, key: tuple, make: Callable[[], object]) -> _Runner:
    """The runner kept for `owner` (a block, or a stack's ModuleList), made anew when its settings changed."""
    runner = _RUNNERS.get(owner)
    if runner is None or runner.key != key:
        runner = _RUNNERS[owner] = _Runner(make(), key)
    return runner


def pre_norm_block(block: nn.Module, x: torch.Tensor, causal: bool) -> torch.Tensor | None:
    """`TransformerBlock` (pre-norm, self-attention with no mask but the causal one, no dropout
    in training, applied in one layer only) on x `(B, T, C)` as one C++ call forward and one
    backward; None where the kernels do not apply (the caller then runs the block's modules)."""
    extension = takes(x)
    setup = None if extension is None else _block_setup(block, x, causal)
    if setup is None:
        return None
    key, params = setup
    n_heads, _, activation, eps = key
    runner = _runner(block, key, lambda: extension.PreNormBlock(n_heads, causal, ACTIVATION_CODES[activation], eps))
    return _PreNormBlock.apply(x.contiguous(), runner, *params)


def pre_norm_stack(blocks: nn.ModuleList, x: torch.Tensor, causal: bool) -> torch.Tensor | None:
    """Every block of `blocks` in turn on x `(B, T, C)`, each taking the one before's output (a
    GPT's stack), as one C++ call forward and one backward: each thread takes its sequences through
    all the blocks with no wait between them, and no Python runs between the blocks. None where
    the kernels do not apply, any block is not one `pre_norm_block` runs or comes twice (shared),
    or the blocks differ in their settings or FFN size (the caller then runs them one at a time)."""
    extension = takes(x)
    if extension is None or len(blocks) == 0 or len({id(block) for block in blocks}) != len(blocks):
        return None
    params: list[torch.Tensor] = []
    key = None
    for block in blocks:
        setup = _block_setup(block, x, causal)
        if setup is None or (key is not None and setup[0] != key):
            return None
        key = setup[0]
        params += setup[1]
    if len({block.ffn.fc1.weight.shape for block in blocks}) != 1:
        return None
    n_heads, _, activation, eps = key
    runner = _runner(
        blocks,
        (len(blocks), *key),
        lambda: extension.PreNormStack(len(blocks), n_heads, causal, ACTIVATION_CODES[activation], eps),
    )
    return _PreNormBlock.apply(x.contiguous(), runner, *params)


class _CrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits: torch.Tensor, target: torch.Tensor, ignore_index: int, smoothing: float) -> torch.Tensor:
        losses, lse = extension().cross_entropy_forward(logits, target, ignore_index, smoothing)
        ctx.save_for_backward(logits, target, lse)
        ctx.ignore_index, ctx.smoothing = ignore_index, smoothing
        return losses

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        logits, target, lse = ctx.saved_tensors
        dx = extension().cross_entropy_backward(
            grad.float().contiguous(), logits, target, lse, ctx.ignore_index, ctx.smoothing
        )
        return dx, None, None, None


def cross_entropy(
    logits: torch.Tensor, target: torch.Tensor, *, label_smoothing: float = 0.0, ignore_index: int = -100
) -> torch.Tensor:
    """The mean cross-entropy of logits `(N, V)` against target `(N,)` long, computed in fp32
    whatever the logits' dtype: `F.cross_entropy(logits.float(), target, ...)`, through the
    kernel for fp32 or bf16 CPU logits where the kernels are on (the gradient comes back in the
    logits' dtype, rounded once). Rows whose target is `ignore_index` do not count; with none
    left the mean is NaN, as PyTorch's."""
    kernel = (
        logits.device.type == "cpu"
        and logits.dim() == 2
        and logits.dtype in (torch.float32, torch.bfloat16)
        and not torch.compiler.is_compiling()
        and extension() is not None
    )
    if not kernel:
        return F.cross_entropy(logits.float(), target, label_smoothing=label_smoothing, ignore_index=ignore_index)
    losses = _CrossEntropy.apply(logits.contiguous(), target.contiguous(), ignore_index, float(label_smoothing))
    return losses.sum() / (target != ignore_index).sum()


def computed_parts(model: nn.Module) -> list[str]:
    """What of `model` these kernels compute in its training steps when they are on (fp32 on a
    CPU), judged from its modules alone: nothing is built or run. "Transformer blocks": pre-norm
    blocks that `pre_norm_block` / `pre_norm_stack` take whole; "self-attention" of the other
    blocks (`self_attention`); "GELU" of the other feed-forward layers (`gelu`); [] for none (a
    WaveNet, a GCN). A mask given at run time (padding) still sends attention to PyTorch's path."""
    shared = shared_blocks(model)

    blocks = [
        m
        for m in model.modules()
        if isinstance(m, TransformerBlock) and id(m) not in shared and takes_block(m, training=True)
    ]
    inside = {id(m) for block in blocks for m in block.modules()}
    rest = [m for m in model.modules() if id(m) not in inside]
    attention = any(
        isinstance(m, MultiHeadAttention) and covers_attention(m) and m.head_dim in HEAD_DIMS and m.dropout == 0
        for m in rest
    )
    gelu_layers = any(getattr(m, "activation", None) in ("gelu", "gelu_tanh", "geglu") for m in rest)
    found = (("Transformer blocks", bool(blocks)), ("self-attention", attention), ("GELU", gelu_layers))
    return [name for name, present in found if present]
