"""GPT: a decoder-only Transformer language model (Radford et al. 2018, 2019).

Reads top to bottom: config, then the model — token and position embeddings, N causal blocks,
a final LayerNorm (pre-norm stacks need it), and a language-model head tied to the token
embedding (Press & Wolf 2017).

Shape legend: B batch, T time, C n_embd, V vocab, H heads.
"""

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from attnlab.nn import (
    ACTIVATIONS,
    NORM_ORDERS,
    AttentionOptions,
    KVCache,
    Linear,
    TransformerBlock,
    build_positions,
    context_limit,
    kernels,
    normal_init,
)


@dataclass(frozen=True)
class GPTConfig(AttentionOptions):
    """Everything that fixes the shape and behaviour of a GPT. Validated on construction. The
    attention variants' fields (`attention`, `rope_theta`, ...) come from `AttentionOptions`."""

    vocab_size: int | None = None
    """Number of token ids. None while the config is still waiting for its tokenizer."""
    block_size: int = 256
    """The training context: the longest sequence a batch holds, the number of learned positions,
    and the KV cache's length. Schemes other than learned positions can evaluate past it."""
    n_layer: int = 6
    """Number of Transformer blocks."""
    n_head: int = 6
    """Attention heads per block; must divide n_embd."""
    n_embd: int = 384
    """Model width C."""
    dropout: float = 0.0
    """Dropout on attention weights, residual branches and embeddings."""
    bias: bool = True
    """Biases in linear layers and LayerNorms (GPT-2: True)."""
    positions: str = "learned"
    """Position scheme, one of attnlab.nn.POSITIONS: at the input (learned, sinusoidal, fourier,
    none) or inside attention (rope, alibi, relative)."""
    activation: str = "gelu"
    """Feed-forward non-linearity, one of attnlab.nn.ACTIVATIONS."""
    norm: str = "pre"
    """Residual block order: "pre" (GPT-2) or "post" (the paper)."""
    ffn_mult: int = 4
    """Feed-forward hidden width as a multiple of n_embd."""
    layer_norm_eps: float = 1e-5
    """Epsilon of every LayerNorm."""
    tie_weights: bool = True
    """Share the token embedding matrix with the output projection."""

    def __post_init__(self) -> None:
        if self.vocab_size is not None and self.vocab_size < 1:
            raise ValueError(f"vocab_size must be >= 1, got {self.vocab_size}")
        for name in ("block_size", "n_layer", "n_head", "n_embd", "ffn_mult"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.n_embd % self.n_head != 0:
            raise ValueError(f"n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head})")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")
        self.check_attention(self.positions, causal=True, head_dim=self.head_dim, d_model=self.n_embd)
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)}, got {self.activation!r}")
        if self.norm not in NORM_ORDERS:
            raise ValueError(f"norm must be one of {list(NORM_ORDERS)}, got {self.norm!r}")
        if self.layer_norm_eps <= 0:
            raise ValueError(f"layer_norm_eps must be > 0, got {self.layer_norm_eps}")

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    @property
    def d_ff(self) -> int:
        return self.ffn_mult * self.n_embd


class GPT(nn.Module):
    """Decoder-only Transformer. `forward(idx (B, T))` -> logits `(B, T, V)`."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        if config.vocab_size is None:
            raise ValueError("GPTConfig.vocab_size is None: set it (it normally comes from the tokenizer)")
        self.config = config
        self.token_embedding = nn.Embedding(config.vocab_size, config.n_embd)
        self.positions = build_positions(config.positions, config.block_size, config.n_embd)
        self.dropout = nn.Dropout(config.dropout)
        spec = config.attention_spec(config.positions, config.block_size)
        self.blocks = nn.ModuleList(
            TransformerBlock(
                config.n_embd,
                config.n_head,
                config.d_ff,
                dropout=config.dropout,
                activation=config.activation,
                bias=config.bias,
                norm=config.norm,
                eps=config.layer_norm_eps,
                spec=spec.for_layer(i),
            )
            for i in range(config.n_layer)
        )
        # Post-norm blocks end in a LayerNorm already; pre-norm stacks need one before the head.
        self.final_norm = (
            nn.LayerNorm(config.n_embd, eps=config.layer_norm_eps, bias=config.bias)
            if config.norm == "pre"
            else nn.Identity()
        )
        self.lm_head = Linear(config.n_embd, config.vocab_size, bias=False)
        if config.tie_weights:
            self.lm_head.weight = self.token_embedding.weight
        self.apply(normal_init)
        # GPT-2 §2.3: scale the residual projections by 1/√N, N = number of residual additions.
        for name, p in self.named_parameters():
            if name.endswith("attn.out_proj.weight") or name.endswith("ffn.fc2.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    @property
    def max_context(self) -> int | None:
        """The longest sequence this model can read: block_size for learned positions (and
        Linformer's projections), None (any) for schemes that compute a position's encoding."""
        return context_limit(self.positions.max_positions, self.config.attention, self.config.block_size)

    def num_parameters(self, *, exclude_positions: bool = True) -> int:
        """Parameter count (shared weights once); by default without position embeddings, as GPT-2 counts."""
        n = sum(p.numel() for p in self.parameters())
        if exclude_positions:
            n -= sum(p.numel() for p in self.positions.parameters())
        return n

    def new_cache(self, batch_size: int, max_len: int | None = None) -> list[KVCache]:
        """One preallocated KV cache per block, for incremental decoding up to `max_len` positions."""
        c = self.config
        max_len = c.block_size if max_len is None else min(max_len, c.block_size)
        p = self.lm_head.weight
        return [
            KVCache(batch_size, c.n_head, max_len, c.head_dim, device=p.device, dtype=p.dtype) for _ in range(c.n_layer)
        ]

    def _embed(self, idx: torch.Tensor, start: int, positions: torch.Tensor | None = None) -> torch.Tensor:
        """Token plus position embeddings of idx `(B, T)`, whose first token sits at `start`, or
        at `positions` `(T,)` when given (their range is the caller's to keep: checking it here
        would wait on the device at every decoding step)."""
        t = idx.size(1)
        if positions is None:
            limit = self.max_context
            if limit is not None and start + t > limit:
                raise ValueError(
                    f"sequence of {start + t} tokens is longer than block_size {limit}, "
                    f"the most that {self.config.positions} positions can place"
                )
            self.positions.grow(start + t)
            positions = torch.arange(start, start + t, device=idx.device)  # (T,)
        return self.dropout(self.token_embedding(idx) + self.positions(positions))

    def forward(
        self,
        idx: torch.Tensor,
        targets: torch.Tensor | None = None,
        *,
        cache: list[KVCache] | None = None,
        positions: torch.Tensor | None = None,
        last_only: bool = False,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Next-token logits for every position of idx `(B, T)` (long).

        Returns logits `(B, T, V)`; with `targets` `(B, T)` (long, -1 = ignore) it returns
        `(logits, loss)`, the mean cross-entropy. With `cache`, idx holds only the new tokens and
        positions continue after those cached; with `cache` and `positions` `(T,)` long, the new
        tokens sit at those positions and attend to the whole preallocated cache (the static-shape
        decoding step, see `KVCache.write`). `last_only` computes logits for the last position
        alone, `(B, 1, V)`, which is all a decoding step needs.
        """
        if last_only and targets is not None:
            raise ValueError("last_only computes one position's logits; the loss needs all of them")
        if positions is not None and cache is None:
            raise ValueError("positions place new tokens in a KV cache; pass cache too")
        x = self._embed(idx, start=cache[0].length if cache is not None else 0, positions=positions)  # (B, T, C)
        stacked = kernels.pre_norm_stack(self.blocks, x, causal=True) if cache is None else None
        if stacked is not None:  # the whole stack in one C++ call: attnlab's training kernels are on
            x = stacked
        else:
            for i, block in enumerate(self.blocks):
                x, _ = block(x, causal=True, cache=None if cache is None else cache[i], positions=positions)
        x = self.final_norm(x)
        if last_only:
            x = x[:, -1:, :]
        logits = self.lm_head(x)  # (B, T, V)
        if targets is None:
            return logits
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1), ignore_index=-1)
        return logits, loss

    @torch.no_grad()
    def attention_weights(self, idx: torch.Tensor) -> list[torch.Tensor]:
        """The per-head self-attention weights of every block for idx `(B, T)`: a list of `(B, H, T, T)`."""
        x = self._embed(idx, start=0)
        weights = []
        for block in self.blocks:
            x, w = block(x, causal=True, need_weights=True)
            weights.append(w)
        return weights
