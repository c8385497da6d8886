"""Which norm, feed-forward, attention heads and block sharing a model's blocks use, by name.

The modifications Narang et al. 2021 compare (RMSNorm, ReZero, gated units, mixtures of experts,
shared blocks, factorized embeddings) and those of today's open models (grouped-query attention)
are parts behind the blocks' existing interfaces. A model config holds their fields once through
the mixin `BlockOptions`; `BlockOptions.block_parts(i)` gives layer i a `BlockParts`, which builds
its norm, its residual gate and its feed-forward layer.
"""

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from attnlab.nn.attention import MultiHeadAttention
from attnlab.nn.conv_attention import CONVOLUTIONS, build_convolution
from attnlab.nn.evolved import BLOCKS, check_evolved
from attnlab.nn.feedforward import build_feedforward, check_activation, gated_width, is_gated
from attnlab.nn.fixup import FixupBias, FixupScale
from attnlab.nn.memory import ProductKeyMemory
from attnlab.nn.moe import MixtureOfExperts, check_experts
from attnlab.nn.norms import NORMALIZATIONS, build_gate, build_norm
from attnlab.nn.positions import SinusoidalPositions, check_choice
from attnlab.nn.variants import AttentionSpec
from attnlab.nn.weighted import BranchedAttention

SHARING = ("none", "all", "universal", "encoder", "decoder")
"""Block sharing: none; all (ALBERT, Lan et al. 2020: one block's weights in every layer);
universal (the Universal Transformer, Dehghani et al. 2019: one block applied n_layers times, with
a position-and-step signal added before each step); encoder, decoder (an encoder–decoder's one
stack shared, the other not: Narang et al. 2021's encoder-only and decoder-only block sharing)."""

FIXUP = "fixup"
"""The normalization that is none: Fixup's scalar biases and multipliers, and its initialisation
(`attnlab.nn.fixup`), which the model applies after its own."""

BLOCK_NORMALIZATIONS = (*NORMALIZATIONS, FIXUP)
"""Every name a config's `normalization` takes."""


def build_any_norm(name: str, d_model: int, *, eps: float = 1e-5, bias: bool = True) -> nn.Module:
    """`attnlab.nn.build_norm`, or Fixup's scalar bias where the normalization is "fixup" (also
    the models' final norm)."""
    return FixupBias() if name == FIXUP else build_norm(name, d_model, eps=eps, bias=bias)


@dataclass(frozen=True)
class BlockParts:
    """The parts of one block: its norm, its attention's key/value heads, its feed-forward layer
    (dense, gated, or a mixture of experts when `experts` > 0)."""

    normalization: str = "layernorm"
    n_kv_heads: int | None = None
    experts: int = 0
    top_k: int = 2
    capacity_factor: float = 0.0
    aux_weight: float = 0.01
    z_weight: float = 0.0
    expert_hidden: int | None = None
    renormalize: bool | None = None
    memory_keys: int = 0
    memory_top_k: int = 8
    memory_heads: int = 4
    branched: bool = False

    def build_attention(
        self,
        d_model: int,
        n_heads: int,
        d_ff: int,
        *,
        activation: str,
        dropout: float,
        bias: bool,
        spec: AttentionSpec | None,
    ) -> nn.Module:
        """The self-attention: multi-head, or the Weighted Transformer's branches (which hold the
        block's feed-forward layers: `build_ffn` is then not called), or a convolution in its
        place (the spec's pattern "lightweight-conv" or "dynamic-conv", Wu et al. 2019)."""
        kw = dict(dropout=dropout, bias=bias, spec=spec, n_kv_heads=self.n_kv_heads)
        if self.branched:
            return BranchedAttention(d_model, n_heads, d_ff, activation=activation, **kw)
        if spec is not None and spec.pattern in CONVOLUTIONS:
            return build_convolution(spec.pattern, d_model, n_heads, spec.conv_kernel, dropout=dropout, bias=bias)
        return MultiHeadAttention(d_model, n_heads, **kw)

    def build_norm(self, d_model: int, *, eps: float, bias: bool) -> nn.Module:
        return build_any_norm(self.normalization, d_model, eps=eps, bias=bias)

    def build_gate(self) -> nn.Module:
        return FixupScale() if self.normalization == FIXUP else build_gate(self.normalization)

    def build_ffn(self, d_model: int, d_ff: int, *, activation: str, dropout: float, bias: bool) -> nn.Module:
        if self.memory_keys > 0:  # product key memory: the memory replaces this block's feed-forward layer
            keys, top_k, heads = self.memory_keys, self.memory_top_k, self.memory_heads
            return ProductKeyMemory(d_model, keys, top_k=top_k, heads=heads, dropout=dropout)
        if self.experts == 0:
            return build_feedforward(d_model, d_ff, activation=activation, dropout=dropout, bias=bias)
        return MixtureOfExperts(
            d_model,
            d_ff if self.expert_hidden is None else self.expert_hidden,
            experts=self.experts,
            top_k=self.top_k,
            capacity_factor=self.capacity_factor,
            activation=activation,
            dropout=dropout,
            bias=bias,
            aux_weight=self.aux_weight,
            z_weight=self.z_weight,
            renormalize=self.renormalize,
        )


@dataclass(frozen=True)
class BlockOptions:
    """Config fields of the block parts, shared by the GPT, BERT and encoder–decoder configs (a
    mixin, like `AttentionOptions`; `activation` stays each family's own field)."""

    normalization: str = "layernorm"
    """Norm around each sublayer, one of attnlab.nn.NORMALIZATIONS: layernorm, rmsnorm, rezero,
    rezero+layernorm, rezero+rmsnorm (`norm` still says pre or post); or fixup (no norm: Fixup's
    scalars and initialisation, Zhang et al. 2019)."""
    ffn_hidden: int | None = None
    """The feed-forward hidden width exactly; None: ffn_mult × width, times 2/3 for gated units
    (which have three matrices) so that they keep the dense layer's parameter count."""
    n_kv_heads: int | None = None
    """Key/value heads: None = one per query head; fewer = grouped-query; 1 = multi-query."""
    experts: int = 0
    """Feed-forward experts per mixture layer; 0 = a dense feed-forward layer."""
    expert_top_k: int = 2
    """Experts each token is routed to: 1 = Switch Transformer, 2 = Mixtral."""
    capacity_factor: float = 0.0
    """An expert's capacity as a multiple of its even share of a batch's choices; 0 = no limit."""
    expert_every: int = 1
    """A mixture in every n-th block (the others dense): 1 = all (Mixtral), 2 = Switch's layout."""
    dense_blocks: tuple[int, ...] = ()
    """Blocks (from 0) kept dense whatever `expert_every` says (Qwen3-MoE's mlp_only_layers)."""
    expert_hidden: int | None = None
    """Each expert's hidden width exactly; None: the dense layers' (`ffn_hidden`). Qwen3-MoE's
    experts are narrower than its dense layers (moe_intermediate_size)."""
    expert_renormalize: bool | None = None
    """Rescale each token's k gates to sum to 1: None = when k > 1 (GShard, Mixtral; k = 1 is the
    Switch Transformer's probability); True = always (Mixtral's one expert gets 1); False = never,
    the softmax's probabilities as they are (Qwen3-MoE's norm_topk_prob false)."""
    router_aux_weight: float = 0.01
    """Weight of the load-balancing loss added to the task loss while training."""
    router_z_weight: float = 0.0
    """Weight of the router z-loss (0 = off)."""
    block_sharing: str = "none"
    """none, all (ALBERT) or universal (Universal Transformer); an encoder–decoder's encoder or
    decoder alone; see attnlab.nn.parts.SHARING."""
    embedding_dim: int | None = None
    """Factorized embeddings (ALBERT): tokens embedded in this many dimensions, then projected
    to the model width; None = the model width."""
    # Product key memory (Lample et al. 2019, attnlab.nn.memory), in place of some feed-forward layers.
    memory_keys: int = 0
    """Sub-keys n per half of a product key memory, which holds n² values; 0 = no memory."""
    memory_top_k: int = 8
    """Keys k each memory head reads (of n per half, then of the k² candidates)."""
    memory_heads: int = 4
    """Memory heads: each its own query and sub-keys, the values shared, the outputs summed."""
    memory_every: int = 2
    """A memory in place of the feed-forward layer of every n-th block (the last of each group)."""
    branched_attention: bool = False
    """The Weighted Transformer (Ahmed et al. 2017, attnlab.nn.weighted): each head a branch with
    its own projection, κ weight and feed-forward layer, the branches summed with α weights."""
    block: str = "transformer"
    """The blocks, one of attnlab.nn.evolved.BLOCKS: transformer (the family's own) or evolved (the
    Evolved Transformer's cells, So et al. 2019: GPT and the encoder–decoder)."""

    def check_parts(
        self, activation: str, *, n_heads: int, d_model: int, encoder_decoder: bool = False, evolved: bool = False
    ) -> None:
        """ValueError naming the first field that is out of range or unknown; `evolved`: whether the
        family builds the Evolved Transformer's cells (`block`)."""
        check_choice("normalization", self.normalization, BLOCK_NORMALIZATIONS)
        check_choice("block", self.block, BLOCKS)
        if self.block == "evolved":
            self.check_evolved_block(n_heads, d_model, evolved=evolved)
        check_activation(activation)
        check_choice("block_sharing", self.block_sharing, SHARING)
        if self.block_sharing in ("encoder", "decoder") and not encoder_decoder:
            raise ValueError(
                f"block_sharing {self.block_sharing!r} shares one stack of an encoder–decoder; this model has "
                "one stack: use 'all' or 'universal'"
            )
        if self.ffn_hidden is not None and self.ffn_hidden < 1:
            raise ValueError(f"ffn_hidden must be >= 1, got {self.ffn_hidden}")
        if self.n_kv_heads is not None and (self.n_kv_heads < 1 or n_heads % self.n_kv_heads != 0):
            raise ValueError(f"n_kv_heads ({self.n_kv_heads}) must divide the number of heads ({n_heads})")
        if self.experts < 0:
            raise ValueError(f"experts must be >= 0 (0: a dense feed-forward layer), got {self.experts}")
        if self.experts > 0:
            check_experts(self.experts, self.expert_top_k, self.capacity_factor)
        if self.expert_every < 1:
            raise ValueError(f"expert_every must be >= 1, got {self.expert_every}")
        if any(i < 0 for i in self.dense_blocks):
            raise ValueError(f"dense_blocks counts blocks from 0, got {list(self.dense_blocks)}")
        if self.expert_hidden is not None and self.expert_hidden < 1:
            raise ValueError(f"expert_hidden must be >= 1, got {self.expert_hidden}")
        if self.router_aux_weight < 0 or self.router_z_weight < 0:
            raise ValueError("router_aux_weight and router_z_weight must be >= 0")
        if self.embedding_dim is not None and not 1 <= self.embedding_dim <= d_model:
            raise ValueError(f"embedding_dim must be between 1 and the model width {d_model}, got {self.embedding_dim}")
        self.check_memory()
        if self.branched_attention and (is_gated(activation) or self.experts > 0 or self.memory_keys > 0):
            raise ValueError(
                "branched_attention gives each head a dense feed-forward layer of its own: it takes a dense "
                "activation (relu, gelu, ...), and no experts or memory"
            )

    def check_evolved_block(self, n_heads: int, d_model: int, *, evolved: bool) -> None:
        """ValueError where the Evolved Transformer's cells cannot be built (`attnlab.nn.evolved.check_evolved`)."""
        if not evolved:
            raise ValueError("block 'evolved' is built in GPT and the encoder–decoder; leave it 'transformer' here")
        others = [
            name
            for name, on in (
                ("experts", self.experts > 0),
                ("memory_keys", self.memory_keys > 0),
                ("branched_attention", self.branched_attention),
                ("ffn_hidden", self.ffn_hidden is not None),
            )
            if on
        ]
        attention = getattr(self, "attention", "full")  # AttentionOptions' field, beside this mixin
        check_evolved(d_model, n_heads, normalization=self.normalization, attention=attention, others=others)

    def check_memory(self) -> None:
        """ValueError naming the product key memory's field that is out of range."""
        if self.memory_keys < 0:
            raise ValueError(f"memory_keys must be >= 0 (0: no product key memory), got {self.memory_keys}")
        if self.memory_every < 1 or self.memory_heads < 1:
            raise ValueError("memory_every and memory_heads must be >= 1")
        if self.memory_keys > 0 and not 1 <= self.memory_top_k <= self.memory_keys:
            raise ValueError(
                f"memory_top_k must be between 1 and memory_keys ({self.memory_keys}), got {self.memory_top_k}"
            )
        if self.memory_keys > 0 and self.experts > 0:
            raise ValueError(
                "a product key memory and a mixture of experts both replace feed-forward layers; choose one"
            )

    def ffn_width(self, activation: str, dense_width: int) -> int:
        """The hidden width of the feed-forward layers (see `ffn_hidden`)."""
        if self.ffn_hidden is not None:
            return self.ffn_hidden
        return gated_width(dense_width) if is_gated(activation) else dense_width

    def block_parts(self, index: int) -> BlockParts:
        """Layer `index`'s parts: a mixture in every `expert_every`-th block (the last of each group)
        but the `dense_blocks`."""
        moe = self.experts > 0 and (index + 1) % self.expert_every == 0 and index not in self.dense_blocks
        memory = self.memory_keys > 0 and (index + 1) % self.memory_every == 0
        return BlockParts(
            normalization=self.normalization,
            n_kv_heads=self.n_kv_heads,
            experts=self.experts if moe else 0,
            top_k=self.expert_top_k,
            capacity_factor=self.capacity_factor,
            aux_weight=self.router_aux_weight,
            z_weight=self.router_z_weight,
            expert_hidden=self.expert_hidden,
            renormalize=self.expert_renormalize,
            memory_keys=self.memory_keys if memory else 0,
            memory_top_k=self.memory_top_k,
            memory_heads=self.memory_heads,
            branched=self.branched_attention,
        )

    @property
    def shared_blocks(self) -> bool:
        return self.block_sharing != "none"

    def stack_sharing(self, stack: str) -> str:
        """How the "encoder" or "decoder" stack of an encoder–decoder shares its blocks: "all" or "none"."""
        return "all" if self.block_sharing in ("all", stack) else "none"


class StepSignal(nn.Module):
    """The Universal Transformer's coordinate embedding (Dehghani et al. 2019, §2.1), added before
    each application t of the shared block: scale · (P[i] + P[t]) with P the sinusoid table of
    §3.5 of Vaswani et al., i the token's position and t the step. x `(B, T, C)` -> `(B, T, C)`.

    `scale` puts the signal at the scale of the model's embeddings: the paper adds it to
    embeddings of unit size; attnlab's GPT and BERT start theirs at N(0, 0.02²), beside which
    the unscaled sinusoids (entries of size ~0.7, added again at every step) drowned the tokens (a
    character GPT stayed at the unigram loss: docs/history.md, the ablations' Universal Transformer)."""

    def __init__(self, d_model: int, n_positions: int, n_steps: int, *, scale: float = 1.0) -> None:
        super().__init__()
        self.scale = scale
        self.table = SinusoidalPositions(max(n_positions, n_steps), d_model)

    def grow(self, n_positions: int) -> None:
        """Room for positions 0 … n_positions − 1 (past the training context, as schemes allow);
        the model calls it with its input positions, so no step waits on the device to check."""
        self.table.grow(n_positions)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, step: int) -> torch.Tensor:
        """positions `(T,)` long: the tokens' positions in their sequence."""
        signal = self.table(positions) + self.table.table[step]
        return x + (self.scale * signal).to(x.dtype)


def build_stack(make_block: Callable[[int], nn.Module], n_layers: int, sharing: str) -> nn.ModuleList:
    """n_layers blocks, `make_block(i)` for layer i; with sharing, the first block in every layer
    (its parameters counted and trained once: the same module at every position of the list)."""
    if sharing == "none":
        return nn.ModuleList(make_block(i) for i in range(n_layers))
    return nn.ModuleList([make_block(0)] * n_layers)
