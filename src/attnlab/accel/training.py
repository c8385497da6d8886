"""attnlab's C++ training kernels applied to a model: `for_training(model)`.

The model's covered modules change class in place to subclasses that override `forward` alone,
so their parameters, state dict and optimizer state stay as they were: self-attention
(`FusedSelfAttention`), pre-norm blocks (`FusedPreNormBlock`), a GPT's stack (`FusedGPT`, the
whole stack one C++ call each way) and the GELUs of the feed-forward layers, the experts and
BERT's masked-LM head. Each takes its kernel in training mode where the call is one the kernel
takes (fp32 on the CPU, outside torch.compile and autocast, no mask but the causal one, no dropout),
and the reference forward of its parent class otherwise; evaluation (eval mode) runs the
reference code, as it did when the trainer switched the kernels on around its steps alone.
"""

import torch
from torch import nn

from attnlab.accel import kernels
from attnlab.accel.applied import Applied
from attnlab.accel.coverage import covers_attention, covers_block, shared_blocks, uncovered_parts
from attnlab.accel.rules import prepare_for_training
from attnlab.models import GPT
from attnlab.models.bert import MaskedLMHead
from attnlab.nn import (
    DecoderBlock,
    Experts,
    FeedForward,
    GatedFeedForward,
    KVCache,
    MultiHeadAttention,
    TransformerBlock,
)
from attnlab.nn import feedforward as reference

_GELUS = {"gelu": "none", "gelu_tanh": "tanh", "geglu": "none"}
"""The activations (and gated units) whose GELU the kernel computes, and its approximation."""


def activate(activation: str, h: torch.Tensor) -> torch.Tensor:
    """`attnlab.nn.feedforward.activate`, with the kernel's GELU."""
    approximate = _GELUS.get(activation)
    if approximate is None:
        return reference.activate(activation, h)
    if activation in reference.GATED_UNITS:
        gate, up = h.chunk(2, dim=-1)
        return kernels.gelu(gate, approximate) * up
    return kernels.gelu(h, approximate)


class FusedSelfAttention(MultiHeadAttention):
    """`MultiHeadAttention` whose self-attention in training, with no cache, mask or dropout and
    no weights asked for, is the kernel's (from the q/k/v projection to the heads concatenated)."""

    def forward(
        self,
        x: torch.Tensor,
        memory: torch.Tensor | None = None,
        *,
        memory_kv: tuple[torch.Tensor, torch.Tensor] | None = None,
        mask: torch.Tensor | None = None,
        causal: bool = False,
        cache: KVCache | None = None,
        positions: torch.Tensor | None = None,
        need_weights: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        self_attention = memory is None and memory_kv is None
        plain_call = self_attention and cache is None and mask is None and not need_weights and self.dropout == 0
        if self.training and plain_call and kernels.takes_attention(x, self.head_dim):
            y = kernels.self_attention(self.in_proj(x), self.n_heads, causal)
            if y is not None:
                return self.out_proj(y), None
        kw = dict(memory_kv=memory_kv, mask=mask, causal=causal, cache=cache, positions=positions)
        return super().forward(x, memory, need_weights=need_weights, **kw)


class FusedPreNormBlock(TransformerBlock):
    """`TransformerBlock` (pre-norm, applied in one layer) whose forward in training is one C++
    call and its backward another (`kernels.pre_norm_block`)."""

    def forward(
        self,
        x: torch.Tensor,
        *,
        mask: torch.Tensor | None = None,
        causal: bool = False,
        cache: KVCache | None = None,
        positions: torch.Tensor | None = None,
        need_weights: bool = False,
        keys: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        plain_call = mask is None and cache is None and positions is None and not need_weights and keys is None
        if self.training and plain_call:
            y = kernels.pre_norm_block(self, x, causal)
            if y is not None:
                return y, None
        kw = dict(mask=mask, causal=causal, cache=cache, positions=positions, need_weights=need_weights, keys=keys)
        return super().forward(x, **kw)


class FusedGPT(GPT):
    """`GPT` whose stack of blocks in training is one C++ call forward and one backward
    (`kernels.pre_norm_stack`), each thread taking its sequences through every block."""

    def _stack(
        self,
        x: torch.Tensor,
        pos: torch.Tensor,
        cache: list[KVCache] | None = None,
        positions: torch.Tensor | None = None,
        need_weights: bool = False,
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        if self.training and cache is None and not need_weights:
            stacked = kernels.pre_norm_stack(self.blocks, x, causal=True)
            if stacked is not None:
                return stacked, []
        return super()._stack(x, pos, cache, positions, need_weights)


class _KernelGELUForward:
    """The training forward of a dense or gated feed-forward layer (`fc1`, the activation, `fc2`,
    dropout) with the kernel's GELU; `activate` tells the two apart by the layer's activation.
    Evaluation runs the layer's own forward."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training:
            return super().forward(x)
        return self.dropout(self.fc2(activate(self.activation, self.fc1(x))))


class FusedFeedForward(_KernelGELUForward, FeedForward):
    """`FeedForward` whose GELU in training is the kernel's."""


class FusedGatedFeedForward(_KernelGELUForward, GatedFeedForward):
    """`GatedFeedForward` whose GELU gate (GEGLU) in training is the kernel's."""


class FusedExperts(Experts):
    """`Experts` whose GELU in training is the kernel's."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training:
            return super().forward(x)
        h = torch.baddbmm(self.fc1_bias, x, self.fc1.mT) if self.fc1_bias is not None else x @ self.fc1.mT
        h = activate(self.activation, h)
        return torch.baddbmm(self.fc2_bias, h, self.fc2.mT) if self.fc2_bias is not None else h @ self.fc2.mT


class FusedMaskedLMHead(MaskedLMHead):
    """BERT's `MaskedLMHead` whose GELU in training is the kernel's."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training:
            return super().forward(x)
        approximate = "tanh" if self.act is reference.gelu_tanh else "none"
        return self.decoder(self.norm(kernels.gelu(self.dense(x), approximate)))


def _swaps(model: nn.Module) -> dict[str, tuple[nn.Module, type]]:
    """name -> (module, the class it takes) for every module of `model` that a kernel covers."""
    shared, cross = shared_blocks(model), {id(m.cross_attn) for m in model.modules() if isinstance(m, DecoderBlock)}
    gelu = set(_GELUS)
    found = {}
    for name, m in model.named_modules():
        kind = None
        if type(m) is MultiHeadAttention and covers_attention(m) and id(m) not in cross:
            kind = FusedSelfAttention
        elif type(m) is TransformerBlock and m.pre_norm and covers_block(m) and id(m) not in shared:
            kind = FusedPreNormBlock
        elif type(m) is GPT:
            kind = FusedGPT
        elif type(m) in (FeedForward, GatedFeedForward, Experts) and m.activation in gelu:
            kind = {FeedForward: FusedFeedForward, GatedFeedForward: FusedGatedFeedForward, Experts: FusedExperts}[
                type(m)
            ]
        elif type(m) is MaskedLMHead and m.act in (reference.gelu, reference.gelu_tanh):
            kind = FusedMaskedLMHead
        if kind is not None:
            found[name] = (m, kind)
    return found


def for_training(model: nn.Module) -> Applied:
    """attnlab's C++ training kernels on `model`: its covered modules change class in place (the
    subclasses above; parameters, state dict and optimizer state unchanged), built first if they
    are not (about a minute). Returns what it covered and, for the rest, why not (`Applied`);
    where the kernels cannot be built, the model is left as it was. Applying twice is applying once.
    """
    prepare_for_training(model)  # the rules the kernels leave to the reference code (bf16 attention)
    if kernels.extension() is None:
        return Applied(model, uncovered="attnlab's C++ kernels could not be built here")
    swaps = _swaps(model)
    for module, kind in swaps.values():
        module.__class__ = kind
    covered = tuple(name for name, m in model.named_modules() if type(m).__module__ == __name__)
    return Applied(model, covered, uncovered_parts(model), kernels.cross_entropy)
