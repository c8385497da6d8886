"""Decoding steps as one C++ call each on the CPU (`fused_step.cpp`): a pre-norm GPT's, and the
encoder–decoder Transformer's decoder for beam search.

An eager decoding step of a small GPT is about a hundred PyTorch operators, and at batch 1 their call
overhead is as large as the arithmetic; torch.compile fuses the elementwise ones but still calls
the products one by one. The fused step is the whole step in plain loops: one call per token. It
is built with PyTorch's C++ extension tools (cached afterwards in `TORCH_EXTENSIONS_DIR`,
by default ~/.cache/torch_extensions) by `attnlab kernels build`, which `make` runs at
installation, or on first use: `generate_tokens(..., fused=True)`. `attnlab sample` and `attnlab
bench` take it by default where it is built (`is_built`), and never wait for a build unless
asked (`--fused`); `--no-fused` keeps PyTorch's path.

What the GPT step covers: `attnlab.models.GPT` with pre-norm blocks (GPT-2's order) and full
attention, in GPT-2's parts and today's (`attnlab.accel.coverage.decodes_gpt`): any position scheme
added at the input (the embeddings stay in Python) or rotary positions of any base (ALiBi and
relative positions act on the scores, and those models decode eagerly); LayerNorm or RMSNorm;
as many key/value heads as query heads, or fewer (grouped-query and multi-query attention); a
dense feed-forward layer (`STEP_ACTIVATIONS`), a gated one (SwiGLU, GeGLU, ReGLU, GLU, LiGLU) or
a mixture of experts routing each token to its top k (Mixtral; no capacity limit); with or
without biases; the head tied to the embedding or not; fp32 on the CPU. That is every model
`attnlab.models.hf` imports (GPT-2, Llama, Mistral without its window, Mixtral). `supports` says
whether a model qualifies; the decoding loop falls back to the model's own forward otherwise.

The GPT step reads its products' weights (attention's, the feed-forward layers' and experts', the
head's) in one of `WEIGHT_FORMATS` (`weights=`): fp32, the model's own; bf16, each weight rounded
to its upper 16 bits; int8, GGUF's q8_0 (`quantize_q8_0`: blocks of 32 values of a row, one
fp32 scale each); int4, GGUF's Q4_0 (`quantize_q4_0`: blocks of 32 four-bit codes, one scale
each); or q4_k, llama.cpp's Q4_K_M mix of GGUF's K-quants (`attnlab.accel.blocks`: super-blocks of
256 values; Q6_K for the head and, in some layers, attention's value rows and the feed-forward
output, `q4_k_m_kinds`; Q4_K for the rest), for rows a multiple of 256 wide. Only the weights are
stored so: the activations, norms, embeddings, router and caches stay fp32, and the bf16 and int8
products widen each weight to fp32 as they read it and sum in fp32 (`quantized.h`), on any CPU
(AVX-512, AVX2 or plain C++). The int4 and q4_k products of up to 15 rows quantize the rows too,
per block of 32 to int8, and sum integers (`quantized4.h`, `quantizedk.h`), as llama.cpp's Q4_0
and K-quant products do: their outputs differ from the dequantized weights' fp32 product by that
rounding of the activations. int4 is Q4_0 rather than Q4_K because Q4_0 quantizes any row a
multiple of 32 wide (Q4_K's super-blocks need 256) with one scale a block, and a GGUF file's Q4_0
blocks are read as they are. At batch 1 a step's speed is how fast
the weights stream from memory, and bf16, int8 and int4 read 2, about 1 and about 0.6 bytes a
weight where fp32 reads 4. A step of many rows (a prompt's prefill, a large batch) costs its multiply-adds instead:
from 16 rows on, each stored weight is widened to fp32 once per product, a chunk of rows at a time,
for PyTorch's matrix product (the values the streamed products read, summed in another order);
except bf16 weights on a CPU with bf16 instructions (`NATIVE_BF16`: AVX-512 BF16 or AMX), whose
many-row products in the blocks run in bf16 through oneDNN, the rows rounded to bf16 as
llama.cpp's bf16 products round them (fp32 sums, bf16 outputs); the head's logits keep fp32
activations (speed: docs/benchmarks.md, "Matching precisions").
The stored copies are made at the first step and kept while the model's weights are unchanged.

The decoder step (`FusedDecoderState`, used by `beam_search(..., fused=True)`) covers
`attnlab.models.Seq2SeqTransformer`, pre- or post-norm, fp32 on the CPU (`supports_decoder`). Beam
search reorders its hypotheses at every step; eagerly that moves every layer's cache. Here the
caches stay put: each hypothesis keeps a table of the cache rows that wrote its earlier positions,
and the index of its source sentence in the encoder memory, and only those integers move.
"""

import functools
import math
import warnings
import weakref
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import TypeVar

import torch
import torch.nn.functional as F
from torch import nn

from attnlab.accel.blocks import QK, quantize_rows
from attnlab.accel.coverage import covers_decoder_block, decodes_gpt, undecoded_parts
from attnlab.accel.extensions import build
from attnlab.accel.extensions import is_built as is_built_here
from attnlab.accel.kernels import ACTIVATION_CODES
from attnlab.accel.projection import MKLDNN, reordered_weight
from attnlab.device import BF16_CPU_FLAGS, cpu_flags, cpu_has_bf16_matmul
from attnlab.errors import UserError
from attnlab.models import GPT
from attnlab.models.protocols import CausalDecoder
from attnlab.nn import KVCache, MixtureOfExperts, RMSNorm
from attnlab.nn.feedforward import is_gated

T = TypeVar("T")


NAME = "attnlab_fused_step"
SOURCE = Path(__file__).with_name("fused_step.cpp")
REORDERED_MIN_WEIGHT = 1 << 17
"""Past the extension's STREAMED_MAX_ROWS (up to which the C++ products stream the weights
themselves), the GPT step multiplies by oneDNN's reordered copy of weights with at
least this many elements, PyTorch's product being faster for smaller ones (`benchmarks/rows_step.py`;
BENCHMARKS.md, "Tuned CPU paths")."""
_NONE = torch.empty(0)  # no reordered weight: PyTorch's product

STEP_ACTIVATIONS = {
    **ACTIVATION_CODES,
    "swish": 3,
    "sigmoid": 4,
    "glu": 4,
    "geglu": ACTIVATION_CODES["gelu"],
    "reglu": ACTIVATION_CODES["relu"],
    "swiglu": 3,
    "liglu": 5,
}
"""The GPT step's activations (`attnlab::Activation` in vecmath.h): a dense layer's function, or
a gated unit's gate function (`attnlab.nn.GATED_UNITS`: SiLU for SwiGLU, the logistic function for
GLU, the identity for LiGLU)."""


WEIGHT_FORMATS = ("fp32", "bf16", "int8", "int4", "q4_k")
"""How the GPT step may store its products' weights (the module doc; `--weights` on the command line)."""

Q8_BLOCK = 32
"""Values of a weight row per int8 scale (q8_0's block, `attnlab::kQ8Block` in quantized.h)."""


def quantize_q8_0(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """GGUF's q8_0 of a weight `(..., out, in)`: each row cut into blocks of `Q8_BLOCK` values (the
    last one shorter where `in` is not a multiple), a block's scale s = max |w| / 127 and its values
    q = round(w / s) -> (q `(..., out, in)` int8, s `(..., out, ceil(in / 32))` fp32); w ≈ s q,
    within s / 2 of it. An all-zero block has s = 0 and q = 0."""
    *lead, n = weight.shape
    blocks = -(-n // Q8_BLOCK)
    w = F.pad(weight.detach().float(), (0, blocks * Q8_BLOCK - n)).reshape(*lead, blocks, Q8_BLOCK)
    scale = w.abs().amax(-1) / 127  # (..., out, blocks)
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))  # a zero block's q: 0 / 1
    q = torch.round(w / safe.unsqueeze(-1)).clamp(-127, 127).to(torch.int8)
    return q.reshape(*lead, blocks * Q8_BLOCK)[..., :n].contiguous(), scale.contiguous()


Q4_BLOCK = 32
"""Values of a weight row per int4 scale (Q4_0's block, `attnlab::kQ4Block` in quantized4.h)."""


def quantize_q4_0(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """GGUF's Q4_0 of a weight `(..., out, in)`, `in` a multiple of `Q4_BLOCK`, as llama.cpp and
    gguf.quants compute it: per block of 32 values of a row, m the value of largest magnitude (the
    first of equals), d = m / -8, q = min(15, trunc(w / d + 8.5)) in 0..15, and d stored in fp16
    -> (nibbles `(..., out, in / 2)` uint8, d `(..., out, in / 32)` fp32, the fp16 value widened);
    w ≈ d (q - 8). Byte i of a block holds value i in its low four bits and value i + 16 in its
    high four (ggml's order). The codes use d before its rounding to fp16, as ggml's do."""
    *lead, n = weight.shape
    if n % Q4_BLOCK:
        raise ValueError(f"Q4_0 needs rows a multiple of {Q4_BLOCK} wide, got {n}")
    w = weight.detach().float().reshape(*lead, n // Q4_BLOCK, Q4_BLOCK)
    largest = w.gather(-1, w.abs().argmax(-1, keepdim=True))  # (..., blocks, 1), its sign kept
    d = largest / -8
    inverse = torch.where(d == 0, torch.zeros_like(d), 1 / d)
    # two roundings, as numpy's (not one fused multiply-add)
    q = torch.trunc(w * inverse + 8.5).clamp(0, 15).to(torch.uint8)
    nibbles = q[..., :16] | (q[..., 16:] << 4)  # (..., blocks, 16)
    return nibbles.reshape(*lead, n // 2).contiguous(), d.squeeze(-1).half().float().contiguous()


def dequantize_q4_0(nibbles: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """The weights `(..., out, in)` that `quantize_q4_0`'s (nibbles, scales) stand for: d (q - 8)."""
    *lead, half = nibbles.shape
    blocks = nibbles.reshape(*lead, half // 16, 16).long()
    q = torch.cat([blocks & 15, blocks >> 4], dim=-1) - 8  # (..., blocks, 32)
    return (q.float() * scales.unsqueeze(-1)).reshape(*lead, 2 * half)


NATIVE_BF16 = bool(set(BF16_CPU_FLAGS) & cpu_flags()) and cpu_has_bf16_matmul()
"""Whether this CPU multiplies bf16 in hardware (AVX-512 BF16 or AMX) through oneDNN: a bf16 step
of 16 rows or more then multiplies in bf16 rather than widening its weights to fp32."""

_STORED: dict[tuple[int, str], tuple[weakref.ref, int, tuple[torch.Tensor, torch.Tensor]]] = {}
"""(id(weight), format) -> (the weight, its version when stored, (values, scales))."""


def stored_weight(
    weight: torch.Tensor, weights: str, kinds: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """A product's weight as the GPT step reads it in format `weights` (`WEIGHT_FORMATS`): (values,
    scales), the scales an empty tensor except for int8 and int4, and for q4_k each row's kind
    (`kinds` `(..., out)` uint8, 0 Q4_K and 1 Q6_K, `attnlab.accel.blocks.quantize_rows`, for a copy
    not made yet; all Q4_K when None; `q4_k_m_kinds` gives llama.cpp's Q4_K_M choice). The other
    copies are made once, or given (`keep_stored`: a GGUF file's own blocks), and kept while the
    weight lives and is unchanged (as `projection.reordered_weight` keeps its own)."""
    if weights == "fp32":
        return weight.detach(), torch.empty(0)
    hit = _STORED.get((id(weight), weights))
    if hit is not None and hit[0]() is weight and hit[1] == weight._version:
        return hit[2]
    with torch.no_grad():
        if weights == "bf16":
            stored = (weight.detach().to(torch.bfloat16).contiguous(), torch.empty(0))
        elif weights == "int8":
            stored = quantize_q8_0(weight)
        elif weights == "int4":
            stored = quantize_q4_0(weight)
        elif weights == "q4_k":
            kinds = torch.zeros(weight.shape[:-1], dtype=torch.uint8) if kinds is None else kinds.contiguous()
            stored = (quantize_rows(weight, kinds), kinds)
        else:
            raise ValueError(f"weights must be one of {', '.join(WEIGHT_FORMATS)}, got {weights!r}")
    keep_stored(weight, weights, stored)
    return stored


def keep_stored(weight: torch.Tensor, weights: str, stored: tuple[torch.Tensor, torch.Tensor]) -> None:
    """Hold `stored` (values, scales) as `stored_weight(weight, weights)`'s copy: made there, or the
    blocks a GGUF file stores the weight in (`attnlab.accel.gguf_blocks`), kept while the weight
    lives and is unchanged."""
    key = (id(weight), weights)
    _STORED[key] = (weakref.ref(weight, lambda _: _STORED.pop(key, None)), weight._version, stored)


@functools.cache
def extension() -> ModuleType | None:
    """The compiled step, built on first use; None (with a warning) when it cannot be built."""
    return build(NAME, SOURCE, what="fused decoding step", fallback="decoding eagerly")


def is_built() -> bool:
    """Whether `extension()` loads a finished build (no pause to compile)."""
    return is_built_here(NAME, SOURCE)


def by_default(model: nn.Module, weights: str = "fp32") -> bool:
    """Whether decoding `model` without a flag takes a fused step (the GPT's or the decoder's): it
    covers the model and is built here (no pause to compile), or the weights asked for are bf16,
    int8 or int4, which the GPT step alone reads (built first if need be)."""
    if weights != "fp32":
        return supports(model, [])
    return (supports(model, []) or supports_decoder(model)) and is_built()


class WeightsShapeError(UserError, ValueError):
    """A weight format the model's shape cannot take: int4 for rows not a multiple of 32 wide, q4_k
    for rows not a multiple of 256 (`BLOCK_WIDTHS`). A
    user's mistake on the command line (one line, exit 2) and a bad argument in Python."""


def weights_refusal(model: nn.Module, weights: str) -> str | None:
    """None where the GPT step decodes `model` with `weights` (`WEIGHT_FORMATS`); else one line
    saying why not and what decoding does instead (fp32 weights on PyTorch's path). Raises
    `WeightsShapeError` for int4 or q4_k where a product's rows are not whole blocks: nothing
    runs instead of what was asked for there, the format cannot hold the model."""
    if weights not in WEIGHT_FORMATS:
        raise ValueError(f"weights must be one of {', '.join(WEIGHT_FORMATS)}, got {weights!r}")
    if weights == "fp32" or supports(model, []):
        _check_block_widths(model, weights)
        return None
    device = next(model.parameters()).device.type
    return (
        f"{weights} weights are read by the fused decoding step alone, which covers {_GPT_COVERS} in fp32 on "
        f"the CPU, not this {type(model).__name__} on {device}; decoding it with its fp32 weights on PyTorch's path"
    )


BLOCK_WIDTHS = {
    "int4": (Q4_BLOCK, "blocks of 32 values of a row (Q4_0)", "int8, bf16 or fp32 (any width)"),
    "q4_k": (
        QK,
        "super-blocks of 256 values of a row (Q4_K, Q6_K)",
        "int4 (rows a multiple of 32), int8, bf16 or fp32",
    ),
}
"""The formats that store a row in whole blocks: format -> (the block's values, what it stores, the
formats to use instead), for `_check_block_widths`' message."""


def _check_block_widths(model: nn.Module, weights: str) -> None:
    """Raise `WeightsShapeError` unless every product's rows are whole blocks of `weights`
    (`BLOCK_WIDTHS`; any width for the other formats)."""
    if weights not in BLOCK_WIDTHS:
        return
    block, holds, instead = BLOCK_WIDTHS[weights]
    odd = sorted({w.size(-1) for w in product_weights(model) if w.size(-1) % block})
    if odd:
        widths = ", ".join(str(n) for n in odd)
        raise WeightsShapeError(
            f"--weights {weights} stores {holds}, and this model's products read rows {widths} wide, "
            f"not multiples of {block}; use --weights {instead}"
        )


def _more_bits(layer: int, n_layers: int) -> bool:
    """llama.cpp's `use_more_bits`: the first and last eighth of the layers and every third between."""
    return layer < n_layers // 8 or layer >= 7 * n_layers // 8 or (layer - n_layers // 8) % 3 == 2


def q4_k_m_kinds(model: nn.Module) -> list[torch.Tensor]:
    """Each product's row kinds (0 Q4_K, 1 Q6_K; `product_weights`' order) as llama.cpp's Q4_K_M
    picks its tensors' types (llama-quant.cpp, `llama_tensor_get_type`): Q6_K for the head (the
    output tensor, or the token embedding tied to it), and in the layers `_more_bits` picks for
    attention's value rows (attn_v) and the feed-forward output (ffn_down, a mixture's experts'
    too); Q4_K for the rest. The value rows are the last KV D rows of the fused in_proj (llama.cpp
    gives a fused attn_qkv tensor, GPT-2's, Q5_K, which the step does not read)."""
    kinds: list[torch.Tensor] = []
    n = len(model.blocks)
    for layer, (block, (in_proj, out_proj, fc1, fc2)) in enumerate(zip(model.blocks, _by_block(model), strict=True)):
        six = int(_more_bits(layer, n))
        attn = block.attn
        rows = torch.zeros(in_proj.shape[:-1], dtype=torch.uint8)
        rows[(attn.n_heads + attn.n_kv_heads) * attn.head_dim :] = six
        kinds += [rows, _kinds(out_proj, 0), _kinds(fc1, 0), _kinds(fc2, six)]
    return [*kinds, _kinds(model.lm_head.weight, 1)]


def _kinds(weight: torch.Tensor, kind: int) -> torch.Tensor:
    return torch.full(weight.shape[:-1], kind, dtype=torch.uint8)


def _by_block(model: nn.Module) -> list[list[torch.Tensor]]:
    """`product_weights` of each block: in_proj, out_proj, fc1, fc2."""
    products = product_weights(model)[:-1]
    return [products[i : i + 4] for i in range(0, len(products), 4)]


def product_weights(model: nn.Module) -> list[torch.Tensor]:
    """Every weight a GPT step's products read, in the step's order: each block's in_proj,
    out_proj, fc1 and fc2 (a mixture's experts' stacked), then the head's."""
    products: list[torch.Tensor] = []
    for block in model.blocks:
        ffn = block.ffn
        moe = isinstance(ffn, MixtureOfExperts)
        experts = (ffn.experts.fc1, ffn.experts.fc2) if moe else (ffn.fc1.weight, ffn.fc2.weight)
        products += [block.attn.in_proj.weight, block.attn.out_proj.weight, *experts]
    return [*products, model.lm_head.weight]


def supports(model: nn.Module, cache: list[KVCache]) -> bool:
    """Whether the fused step computes this model's decoding step: a pre-norm GPT of the parts
    `decodes_gpt` accepts, fp32, on the CPU, in inference, with a known activation and contiguous
    caches."""
    from attnlab.models import GPT

    if not isinstance(model, GPT):
        return False
    return (
        model.config.norm == "pre"
        and decodes_gpt(model)
        and model.config.activation in STEP_ACTIVATIONS
        and _runs_here(model, model.lm_head.weight)
        and all(layer.k.is_contiguous() and layer.v.is_contiguous() for layer in cache)
    )


def _runs_here(model: nn.Module, weight: torch.Tensor) -> bool:
    """What both fused steps need: fp32 weights on the CPU, inference, and no CPU autocast (the
    steps compute in fp32 whatever autocast asks; the training loop's evaluation runs under bf16
    autocast on CPUs with bf16 instructions, and decodes eagerly there)."""
    return (
        weight.device.type == "cpu"
        and weight.dtype == torch.float32
        and not model.training
        and not torch.is_autocast_enabled("cpu")
    )


def _bias(layer: nn.Module) -> torch.Tensor:
    bias = getattr(layer, "bias", None)  # RMSNorm has none
    return bias if bias is not None else torch.empty(0)


class FusedStep:
    """The decoding step of a GPT that `supports` accepts, bound to one generation's cache:
    `step(token (B, 1), cache, position)` -> logits `(B, 1, V)`, the new keys and values written
    at `position` of the cache (the same cache, whose buffers the C++ side holds).

    `rows` steps sequences at their own positions (continuous batching), `prefill` writes whole
    prompts, each into a row of its own, in one call, and `extend` adds several tokens to one row
    in one call (speculative decoding's verification), `truncate` taking back what was rejected.

    A step of more than 8 rows multiplies the larger weights (`REORDERED_MIN_WEIGHT`) by oneDNN's
    reordered copies (`reordered_weight`, remade when a weight changes), looked up at each such step.
    With `weights` bf16, int8, int4 or q4_k (`WEIGHT_FORMATS`) the products read `stored_weight`'s copies
    instead, streamed up to 15 rows and widened to fp32 for PyTorch's product from 16 on (bf16
    where `native_bf16`: the blocks' products multiplied in bf16 by oneDNN from 16 rows on, the rows
    rounded to bf16). `native_bf16` defaults to `NATIVE_BF16`, whether this CPU has bf16
    instructions; False keeps a bf16 step's rows fp32 on any CPU.
    """

    def __init__(
        self,
        model: CausalDecoder,
        ext: ModuleType,
        cache: list[KVCache],
        weights: str = "fp32",
        native_bf16: bool | None = None,
    ) -> None:
        self._bind(model, ext, cache, weights)
        native = NATIVE_BF16 if native_bf16 is None else native_bf16
        # the bf16 weights themselves in place of reordered copies: the C++ step's sign to multiply in
        # bf16; not the head's, whose logits (scored prompts, sampling) keep fp32's precision
        self.native_bf16 = weights == "bf16" and native and MKLDNN
        blocks = [_NONE if w is None else stored_weight(w, "bf16")[0] for w in self.weights[:-1]]
        self._bf16 = [*blocks, _NONE] if self.native_bf16 else []

    def _bind(self, model: nn.Module, ext: ModuleType, cache: list[KVCache], weights: str) -> None:
        params: list[torch.Tensor] = []
        # The products' weights, in the step's order; None for a mixture's experts, which always
        # take the streamed or PyTorch's product (each sees a step's few tokens routed to it).
        self.weights: list[torch.Tensor | None] = []
        for block in model.blocks:
            attn, ffn = block.attn, block.ffn
            for layer in (block.norm1, attn.in_proj, attn.out_proj, block.norm2):
                params += _weight_bias(layer)
            params += _feedforward(ffn)
            dense = not isinstance(ffn, MixtureOfExperts)
            self.weights += [attn.in_proj.weight, attn.out_proj.weight]
            self.weights += [ffn.fc1.weight, ffn.fc2.weight] if dense else [None, None]
        params += [*_weight_bias(model.final_norm), model.lm_head.weight.detach()]
        self.weights.append(model.lm_head.weight)
        products = product_weights(model)  # every product's weight, experts' included: what `weights` stores
        _check_block_widths(model, weights)
        self.format = weights  # how the products' weights are stored (WEIGHT_FORMATS)
        kinds = q4_k_m_kinds(model) if weights == "q4_k" else [None] * len(products)
        stored = [stored_weight(w, weights, k) for w, k in zip(products, kinds, strict=True)]
        for index, (values, _) in zip(_product_indices(len(model.blocks)), stored, strict=True):
            params[index] = values
        # False: PyTorch's product for every weight (benchmarks/rows_step.py compares the two); bf16
        # and int8 weights have no reordered copies (the step streams or widens them itself)
        large = any(w is not None and w.numel() >= REORDERED_MIN_WEIGHT for w in self.weights)
        self.reordered = weights == "fp32" and MKLDNN and large
        c = model.config
        with torch.inference_mode():  # every position's vector, whatever the encoding (all are added)
            positions = model.positions(torch.arange(c.block_size)).contiguous()
        self.cache = cache
        self.streamed_max_rows = ext.STREAMED_MAX_ROWS
        self.step = ext.GPTStep(
            params,
            [scales for _, scales in stored],
            model.token_embedding.weight.detach(),
            positions,
            *_rotary_tables(model.blocks[0].attn, c.block_size),
            [layer.k for layer in cache],
            [layer.v for layer in cache],
            c.n_heads,
            c.layer_norm_eps,
            STEP_ACTIVATIONS[c.activation],
            is_gated(c.activation),
            isinstance(model.final_norm, RMSNorm),
            c.expert_top_k,
        )

    def __call__(self, token: torch.Tensor, cache: list[KVCache], position: int) -> torch.Tensor:
        if cache is not self.cache:
            raise ValueError("this fused step is bound to another cache")
        logits = self.step.step(token.view(-1), position, self._packed(token.size(0)))
        cache.length = position + 1  # the model's one count (`ModelCache`)
        return logits.unsqueeze(1)

    def rows(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """The step of the sequences in cache rows 0..R-1, each at its own position (continuous
        batching): tokens `(R,)`, positions `(R,)` long -> next-token logits `(R, V)`. Row r writes
        its key and value at positions[r] and attends to its slots 0..positions[r]; the caches'
        `length` is left alone (the caller knows each row's)."""
        return self.step.step_rows(tokens, positions, self._packed(tokens.size(0)))

    def extend(self, tokens: torch.Tensor, position: int, row: int = 0, *, last_only: bool = False) -> torch.Tensor:
        """The next T ≥ 1 tokens of the sequence in cache row `row`, at positions position …
        position + T − 1, in one call: tokens `(T,)` long -> the logits after each `(T, V)`, or
        after the last alone `(1, V)` with `last_only` (a context read into the cache). Token t
        writes its key and value at its slot and attends to the row's slots up to its own (the
        cache, then the tokens before it: causal). The products read each weight once for the T
        tokens. The cache's `length` becomes position + T (the growing path's count, shared by
        every row); `truncate` sets it back, after rejected drafts for instance."""
        logits = self.step.extend(tokens.view(-1), row, position, last_only, self._packed(tokens.numel()))
        self.cache.length = position + tokens.numel()
        return logits

    def truncate(self, length: int) -> None:
        """Forget the cache's slots from `length` on (`ModelCache.truncate`): the next token is
        written at `length` and nothing attends past it. The C++ step keeps no count of its own
        (each call is told its positions), so the cache's `length` is the one to set back."""
        self.cache.truncate(length)

    def prefill(self, prompts: list[list[int]], first_row: int) -> torch.Tensor:
        """Prefill prompts into cache rows first_row, first_row + 1, … in one call, prompt i's
        tokens at positions 0 … len − 1 of its row, whatever the lengths (no padding) -> the
        next-token logits after each prompt's last token `(G, V)`. The rows' earlier contents
        past each prompt are never read: a token attends to its own row's slots up to its position."""
        lengths = [len(p) for p in prompts]
        tokens = torch.tensor([t for p in prompts for t in p], dtype=torch.long)
        return self.step.prefill(tokens, lengths, first_row, self._packed(tokens.numel()))

    def _packed(self, rows: int) -> list[torch.Tensor]:
        """The reordered weights for a step of `rows` rows (an empty tensor for a weight multiplied
        by PyTorch's product); none up to 8 rows, where the C++ step streams the weights itself. For
        `native_bf16` steps, the bf16 weights (the C++ step multiplies them in bf16 from 16 rows on)."""
        if rows <= self.streamed_max_rows:
            return []
        if self.native_bf16:
            return self._bf16
        if not self.reordered:
            return []
        return [
            reordered_weight(w) if w is not None and w.numel() >= REORDERED_MIN_WEIGHT else _NONE for w in self.weights
        ]


PARAMS_PER_BLOCK = 13
"""The tensors of a block in the GPT step's `params` (`kPerBlock` in fused_step.cpp)."""


def _product_indices(n_layers: int) -> list[int]:
    """Where the products' weights sit in the GPT step's `params`: each block's in_proj, out_proj,
    fc1 and fc2 weights, then the head's (the last tensor)."""
    blocks = [b * PARAMS_PER_BLOCK + i for b in range(n_layers) for i in (2, 4, 8, 10)]
    return [*blocks, n_layers * PARAMS_PER_BLOCK + 2]


def _feedforward(ffn: nn.Module) -> list[torch.Tensor]:
    """A block's feed-forward tensors in the step's order: fc1's weight and bias, fc2's, and the
    router's weight; a mixture's are its experts' stacked weights `(E, W, C)`, `(E, C, F)` and
    biases `(E, 1, W)`, `(E, 1, C)`, a dense or gated layer's router an empty tensor."""
    if isinstance(ffn, MixtureOfExperts):
        e = ffn.experts
        biases = [torch.empty(0) if b is None else b.detach() for b in (e.fc1_bias, e.fc2_bias)]
        return [e.fc1.detach(), biases[0], e.fc2.detach(), biases[1], ffn.router.weight.detach()]
    return [*_weight_bias(ffn.fc1), *_weight_bias(ffn.fc2), torch.empty(0)]


def _rotary_tables(attn: nn.Module, n_positions: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The cosines and sines `(P, D/2)` of the rotary angles of positions 0 … P − 1, computed as
    `attnlab.nn.rope_rotate` computes them; two empty tensors for attention without rotary positions."""
    rotary = attn.positions
    if rotary is None:
        return torch.empty(0), torch.empty(0)
    angles = rotary.angles(torch.arange(n_positions))  # (P, D/2), scaled as the model scales them
    return angles.cos().contiguous(), angles.sin().contiguous()


def supports_decoder(model: nn.Module) -> bool:
    """Whether the fused decoder step computes this model's decoding step: an encoder–decoder
    Transformer in fp32 on the CPU, in inference, with a known activation."""
    from attnlab.models import Seq2SeqTransformer

    return (
        isinstance(model, Seq2SeqTransformer)
        and model.config.activation in ACTIVATION_CODES
        and _runs_here(model, model.output.weight)
        and all(covers_decoder_block(block) for block in model.decoder)
    )


class FusedDecoderState:
    """Beam search's decoder state for a model that `supports_decoder` accepts, with the fused
    step: like `model.start(src (B, S), max_len)` it encodes the sources and holds caches for
    `max_len` target positions, and it offers what beam search asks of a state,
    `step(tokens (R,))` -> logits `(R, V)` and `select(index (R',))`.

    The weights must not change while a state lives (one search): past 8 rows the products use
    oneDNN copies of them made when the state is made.

    The caches are never reordered: row r of this step's keys and values is written to cache row
    r, and `origin[r, t]` says which cache row holds position t of row r's history. `select` moves
    the rows of `origin` and of `memory_row` (row -> memory row of its source) only.
    """

    def __init__(self, model: nn.Module, ext: ModuleType, src: torch.Tensor, max_len: int) -> None:
        params: list[torch.Tensor] = []
        products: list[tuple[torch.Tensor, int | None]] = []  # (weight, rows used)
        for block in model.decoder:
            c = block.self_attn.d_model
            products += [
                (block.self_attn.in_proj.weight, None),
                (block.self_attn.out_proj.weight, None),
                (block.cross_attn.in_proj.weight, c),
                (block.cross_attn.out_proj.weight, None),
                (block.ffn.fc1.weight, None),
                (block.ffn.fc2.weight, None),
            ]
            cross_bias = block.cross_attn.in_proj.bias
            params += [
                *_weight_bias(block.self_attn.in_proj),
                *_weight_bias(block.self_attn.out_proj),
                *_weight_bias(block.norm1),
                block.cross_attn.in_proj.weight.detach()[:c],  # the query rows; the memory's are done
                cross_bias.detach()[:c] if cross_bias is not None else torch.empty(0),
                *_weight_bias(block.cross_attn.out_proj),
                *_weight_bias(block.norm2),
                *_weight_bias(block.ffn.fc1),
                *_weight_bias(block.ffn.fc2),
                *_weight_bias(block.norm3),
            ]
        final = model.decoder_norm
        params += [*_weight_bias(final)] if isinstance(final, nn.LayerNorm) else [torch.empty(0), torch.empty(0)]
        params.append(model.output.weight.detach())
        products.append((model.output.weight, None))
        # oneDNN's blocked copies, for the steps with many rows (kept with the weights between searches)
        packed = [reordered_weight(w, rows) if MKLDNN else torch.empty(0) for w, rows in products]
        c = model.config
        with torch.inference_mode():  # every position's vector, whatever the encoding (all are added)
            positions = model.positions(torch.arange(c.max_len)).contiguous()
        self.step_fn = ext.DecoderStep(
            params,
            packed,
            model.tgt_embedding.weight.detach(),
            positions,
            c.n_heads,
            c.layer_norm_eps,
            ACTIVATION_CODES[c.activation],
            c.norm == "pre",
            math.sqrt(c.d_model),
        )
        eager = model.start(src, 1)  # the encoder's work; its one-position caches go unused
        self.memory_k = [k.contiguous() for k, _ in eager.memory_kv]  # (M, H, S, D)
        self.memory_v = [v.contiguous() for _, v in eager.memory_kv]
        self.keep = eager.src_mask.reshape(src.size(0), -1).contiguous()  # (M, S) bool
        # (P, L, H, D): one position of one row holds every head, read in one piece (see `attend`).
        # Uninitialised: a slot is read only after the step that writes it.
        rows, max_len = src.size(0), min(max_len, c.max_len)
        shape = (rows, max_len, c.n_heads, c.d_model // c.n_heads)
        self.k = [torch.empty(shape) for _ in model.decoder]
        self.v = [torch.empty(shape) for _ in model.decoder]
        self.memory_row = torch.arange(rows)
        self.origin = torch.zeros((rows, max_len), dtype=torch.long)
        self.length = 0

    def select(self, index: torch.Tensor, *, same_source: bool = False) -> None:
        """Keep and reorder rows: row i becomes old row index[i] (`TransformerDecoderState.select`)."""
        self.origin = self.origin.index_select(0, index)
        self.memory_row = self.memory_row.index_select(0, index)
        if index.numel() > self.k[0].size(0):  # more rows than the caches have: widen them
            self.k = [_widen(t, index.numel(), self.length) for t in self.k]
            self.v = [_widen(t, index.numel(), self.length) for t in self.v]

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        """Previous tokens `(R,)` -> next-token logits `(R, V)`; the history grows by one position."""
        logits = self.step_fn.step(
            tokens.contiguous(), self.length, self.k, self.v, self.origin,
            self.memory_k, self.memory_v, self.memory_row, self.keep,
        )  # fmt: skip
        self.length += 1
        return logits


_GPT_COVERS = (
    "pre-norm GPTs (LayerNorm or RMSNorm; dense, gated or mixture feed-forward layers; any "
    "key/value heads) with full attention and positions at the input or rotary"
)


def gpt_step(model: CausalDecoder, cache: list[KVCache], weights: str = "fp32") -> FusedStep | None:
    """`FusedStep(model, extension(), cache, weights)`, or None with a warning when the model does
    not qualify (`supports`; the warning says so in `weights_refusal`'s words for the stored formats) or
    the step cannot be built."""
    refusal = weights_refusal(model, weights)
    if refusal is not None:
        warnings.warn(refusal, stacklevel=4)
        return None
    make = functools.partial(FusedStep, model, cache=cache, weights=weights)
    outside = undecoded_parts(model) if isinstance(model, GPT) else []
    covers = _GPT_COVERS + (f", not {', '.join(outside)}" if outside else "")  # which part of today's checkpoints
    return _when_built(supports(model, cache), covers, make, stacklevel=5)


def decoder_state(model: nn.Module, src: torch.Tensor, max_len: int) -> FusedDecoderState | None:
    """`FusedDecoderState(model, extension(), src, max_len)`, or None with a warning when the model
    does not qualify (`supports_decoder`) or the step cannot be built."""
    make = functools.partial(FusedDecoderState, model, src=src, max_len=max_len)
    covers = _COVERS.format(family="encoder-decoder Transformers")
    return _when_built(supports_decoder(model), covers, make, stacklevel=4)


_COVERS = "{family} with full attention and positions at the input"


def _when_built(qualifies: bool, covers: str, make: Callable[[ModuleType], T], stacklevel: int) -> T | None:
    """make(extension()) for a model that qualifies, where the extension builds; otherwise None,
    with a warning for a model the fused steps do not cover (a failed build warns on its own)."""
    if not qualifies:
        warnings.warn(
            f"the fused decoding step covers {covers} in fp32 on the CPU; decoding eagerly", stacklevel=stacklevel
        )
        return None
    ext = extension()
    return None if ext is None else make(ext)


def _weight_bias(layer: nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    return layer.weight.detach(), _bias(layer).detach()


def _widen(cache: torch.Tensor, rows: int, filled: int) -> torch.Tensor:
    """The cache `(P, L, H, D)` with `rows` rows, the first P's `filled` positions as they were
    (origin points into them)."""
    wide = cache.new_empty((rows, *cache.shape[1:]))
    wide[: cache.size(0), :filled] = cache[:, :filled]
    return wide
