"""GPT: a decoder-only Transformer language model (Radford et al. 2018, 2019).

Reads top to bottom: config, then the model — token and position embeddings, N causal blocks,
a final norm (pre-norm stacks need it), and a language-model head tied to the token embedding
(Press & Wolf 2017). The blocks' parts (norm, feed-forward, experts, key/value heads, sharing)
are chosen by name through `BlockOptions`; the defaults are GPT-2's.

Shape legend: B batch, T time, C d_model, V vocab, H heads.
"""

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from attnlab.config import old_field_names
from attnlab.names import OLD_FIELDS
from attnlab.nn import (
    BLOCK_ORDERS,
    EMBEDDING_STD,
    FIXUP,
    AttentionOptions,
    AttentionSpec,
    BlockOptions,
    EmbeddingOptions,
    KVCache,
    ModelCache,
    RollingKVCache,
    StepSignal,
    TransformerBlock,
    build_any_norm,
    build_input_embedding,
    build_positions,
    build_softmax,
    build_stack,
    collect_aux_loss,
    context_limit,
    fixup_init,
    normal_init,
    tie_embeddings,
)
from attnlab.nn.conv_attention import CONVOLUTIONS, ConvCache
from attnlab.nn.evolved import EvolvedDecoderCell
from attnlab.nn.funnel import FunnelOptions


@old_field_names(OLD_FIELDS)  # nanoGPT's n_layer, n_head, n_embd: attnlab's own names until the rename
@dataclass(frozen=True)
class GPTConfig(AttentionOptions, BlockOptions, EmbeddingOptions, FunnelOptions):
    """Everything that fixes the shape and behaviour of a GPT. Validated on construction. The
    attention variants' fields (`attention`, `rope_theta`, ...) come from `AttentionOptions`, the
    block parts' (`normalization`, `experts`, `n_kv_heads`, `block_sharing`, ...) from `BlockOptions`,
    the input embedding's and softmax's (`input_embedding`, `softmax`, ...) from `EmbeddingOptions`."""

    vocab_size: int | None = None
    """Number of token ids. None while the config is still waiting for its tokenizer."""
    block_size: int = 256
    """The training context: the longest sequence a batch holds, the number of learned positions,
    and the KV cache's length. Schemes other than learned positions can evaluate past it."""
    n_layers: int = 6
    """Number of Transformer blocks."""
    n_heads: int = 6
    """Attention heads per block; must divide d_model."""
    d_model: int = 384
    """Model width C."""
    dropout: float = 0.0
    """Dropout on attention weights, residual branches and embeddings."""
    bias: bool = True
    """Biases in linear layers and LayerNorms (GPT-2: True)."""
    positions: str = "learned"
    """Position scheme, one of attnlab.nn.POSITIONS: at the input (learned, sinusoidal, fourier,
    none) or inside attention (rope, alibi, relative)."""
    activation: str = "gelu"
    """Feed-forward non-linearity, one of attnlab.nn.FEEDFORWARDS: a dense layer's activation
    (relu, gelu, swish, ...) or a gated unit (glu, geglu, reglu, swiglu, liglu)."""
    norm: str = "pre"
    """Residual block order: "pre" (GPT-2) or "post" (the paper)."""
    ffn_mult: int = 4
    """Feed-forward hidden width as a multiple of d_model."""
    layer_norm_eps: float = 1e-5
    """Epsilon of every norm (LayerNorm or RMSNorm)."""
    tie_weights: bool = True
    """Share the token embedding matrix with the output projection (False: untied embeddings)."""
    scale_embeddings: bool = False
    """Multiply the token embeddings by √d_model (the paper's §3.4; Gemma)."""
    logit_softcap: float | None = None
    """Soft-cap the logits at ±c: c·tanh(logits / c) (Gemma 2's final_logit_softcapping); None: none."""

    def __post_init__(self) -> None:
        if self.vocab_size is not None and self.vocab_size < 1:
            raise ValueError(f"vocab_size must be >= 1, got {self.vocab_size}")
        for name in ("block_size", "n_layers", "n_heads", "d_model", "ffn_mult"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.head_size is None and self.d_model % self.n_heads != 0:
            raise ValueError(f"d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads})")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")
        self.check_attention(self.positions, causal=True, head_dim=self.head_dim, d_model=self.d_model)
        self.check_layers(self.n_layers)
        self.check_parts(self.activation, n_heads=self.n_heads, d_model=self.d_model, evolved=True)
        self.check_funnel(self.n_layers, causal=True)  # refused: pooling over time would leak the future
        factorized = self.embedding_dim is not None and self.embedding_dim != self.d_model
        self.check_embeddings(self.vocab_size, tied=self.tie_weights, factorized=factorized)
        if self.norm not in BLOCK_ORDERS:
            raise ValueError(f"norm must be one of {list(BLOCK_ORDERS)}, got {self.norm!r}")
        if self.norm == "sandwich" and self.block != "transformer":
            raise ValueError("norm 'sandwich' is built in the Transformer's blocks; leave block 'transformer'")
        if self.logit_softcap is not None and self.logit_softcap <= 0:
            raise ValueError(f"logit_softcap must be > 0 or None, got {self.logit_softcap}")
        if self.layer_norm_eps <= 0:
            raise ValueError(f"layer_norm_eps must be > 0, got {self.layer_norm_eps}")

    @property
    def head_dim(self) -> int:
        return self.head_size or self.d_model // self.n_heads

    @property
    def d_ff(self) -> int:
        return self.ffn_width(self.activation, self.ffn_mult * self.d_model)

    @property
    def kv_heads(self) -> int:
        return self.n_kv_heads or self.n_heads


def gpt_block(c: GPTConfig, spec: AttentionSpec, i: int) -> TransformerBlock | EvolvedDecoderCell:
    """Block `i` of a GPT: the family's own, or the Evolved Transformer's decoder cell (`c.block`)."""
    if c.block == "evolved":  # So et al. 2019's decoder cell, its cross-attentions left out
        return EvolvedDecoderCell(
            c.d_model,
            c.n_heads,
            cross=False,
            dropout=c.dropout,
            bias=c.bias,
            norm=c.norm,
            normalization=c.normalization,
            eps=c.layer_norm_eps,
            spec=spec.for_layer(i),
            n_kv_heads=c.n_kv_heads,
        )
    return TransformerBlock(
        c.d_model,
        c.n_heads,
        c.d_ff,
        dropout=c.dropout,
        activation=c.activation,
        bias=c.bias,
        norm=c.norm,
        eps=c.layer_norm_eps,
        spec=spec.for_layer(i),
        parts=c.block_parts(i),
    )


class GPT(nn.Module):
    """Decoder-only Transformer. `forward(idx (B, T))` -> logits `(B, T, V)`."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        if config.vocab_size is None:
            raise ValueError("GPTConfig.vocab_size is None: set it (it normally comes from the tokenizer)")
        self.config = config
        c = config
        # Factorized embeddings (ALBERT §3.1): tokens live in E < C dimensions, projected up to the
        # model width, and the head projects back down before the (tied) output matrix.
        # Adaptive input embeddings and softmaxes, and the mixture of softmaxes, are chosen by name
        # (`attnlab.nn.embeddings`); the defaults are the plain matrix and the full softmax.
        e = c.embedding_dim or c.d_model
        self.token_embedding = build_input_embedding(c, c.vocab_size, e)
        self.embedding_proj = nn.Linear(e, c.d_model, bias=False) if e != c.d_model else nn.Identity()
        self.positions = build_positions(c.positions, c.block_size, c.d_model)
        self.dropout = nn.Dropout(c.dropout)
        spec = c.attention_spec(c.positions, c.block_size, norm_eps=c.layer_norm_eps)

        self.blocks = build_stack(lambda i: gpt_block(c, spec, i), c.n_layers, c.block_sharing)
        universal = c.block_sharing == "universal"
        self.step_signal = StepSignal(c.d_model, c.block_size, c.n_layers, scale=EMBEDDING_STD) if universal else None
        # Post-norm blocks end in a norm already; pre-norm stacks need one before the head.
        self.final_norm = (
            build_any_norm(c.normalization, c.d_model, eps=c.layer_norm_eps, bias=c.bias)
            if c.norm in ("pre", "sandwich")
            else nn.Identity()
        )
        self.head_proj = nn.Linear(c.d_model, e, bias=False) if e != c.d_model else nn.Identity()
        self.lm_head = build_softmax(c, e, c.vocab_size)
        if c.tie_weights:
            tie_embeddings(self.lm_head, self.token_embedding)
        self.apply(normal_init)
        # GPT-2 §2.3: scale the residual projections by 1/√N, N = number of residual additions.
        for name, p in self.named_parameters():
            if name.endswith("attn.out_proj.weight") or name.endswith("ffn.fc2.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layers))
        if c.normalization == FIXUP:  # two branches a block; an untied full softmax starts at 0
            untied = None if c.tie_weights or not isinstance(self.lm_head, nn.Linear) else self.lm_head
            fixup_init(self.blocks, 2 * c.n_layers, head=untied)

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

    def new_cache(self, batch_size: int, max_len: int | None = None) -> ModelCache:
        """One preallocated KV cache per block, for incremental decoding up to `max_len` positions,
        and the model's one count of positions written (`ModelCache`); with window attention a ring
        of attention_window slots a block (`RollingKVCache`), whatever the length; an evolved
        cell's own (`EvolvedCache`: its two attentions' and three convolutions'); a convolution's
        last inputs (`ConvCache`)."""
        c = self.config
        max_len = c.block_size if max_len is None else min(max_len, c.block_size)
        p = next(self.blocks.parameters())  # the model's device and dtype, whatever its head
        if c.block == "evolved":
            return ModelCache(b.new_cache(batch_size, max_len, device=p.device, dtype=p.dtype) for b in self.blocks)
        if c.attention in CONVOLUTIONS:  # a convolution reads its last conv_kernel inputs alone
            kind = (c.conv_kernel, c.d_model)
            return ModelCache(ConvCache(batch_size, *kind, device=p.device, dtype=p.dtype) for _ in range(c.n_layers))
        layers = c.layer_attention or (c.attention,) * c.n_layers
        return ModelCache(
            RollingKVCache(batch_size, c.kv_heads, c.attention_window, c.head_dim, device=p.device, dtype=p.dtype)
            if pattern == "window"
            else KVCache(batch_size, c.kv_heads, max_len, c.head_dim, device=p.device, dtype=p.dtype)
            for pattern in layers
        )

    def _positions(self, idx: torch.Tensor, start: int, positions: torch.Tensor | None = None) -> torch.Tensor:
        """The positions `(T,)` of idx `(B, T)`'s tokens: from `start` on, or `positions` when given
        (their range is the caller's to keep: checking it here would wait on the device at every
        decoding step)."""
        if positions is not None:
            return positions
        t = idx.size(1)
        limit = self.max_context
        if limit is not None and start + t > limit:
            raise ValueError(
                f"sequence of {start + t} tokens is longer than block_size {limit}, "
                f"the most that {self.config.positions} positions can place"
            )
        self.positions.grow(start + t)
        if self.step_signal is not None:
            self.step_signal.grow(start + t)
        return torch.arange(start, start + t, device=idx.device)

    def _embed(self, idx: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Token plus position embeddings `(B, T, C)` of idx `(B, T)` at positions `(T,)`."""
        tokens = self.embedding_proj(self.token_embedding(idx))
        if self.config.scale_embeddings:  # √C rounded to the weights' dtype first, as Gemma rounds it
            tokens = tokens * torch.tensor(math.sqrt(self.config.d_model), dtype=tokens.dtype)
        return self.dropout(tokens + self.positions(positions))

    def _stack(
        self,
        x: torch.Tensor,
        pos: torch.Tensor,
        cache: ModelCache | None = None,
        positions: int | torch.Tensor | None = None,
        need_weights: bool = False,
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """x `(B, T, C)` through the blocks (the Universal Transformer's signal before each step),
        each writing to its cache at `positions` (an int: the first of the new tokens'; or a tensor);
        returns the output and, when asked for, each block's attention weights."""
        weights = []
        for i, block in enumerate(self.blocks):
            if self.step_signal is not None:
                x = self.step_signal(x, pos, i)
            layer_cache = None if cache is None else cache[i]
            x, w = block(x, causal=True, cache=layer_cache, positions=positions, need_weights=need_weights)
            weights.append(w)
        return x, weights

    def forward(
        self,
        idx: torch.Tensor,
        targets: torch.Tensor | None = None,
        *,
        cache: ModelCache | None = None,
        positions: torch.Tensor | None = None,
        last_only: bool = False,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Next-token logits for every position of idx `(B, T)` (long).

        Returns logits `(B, T, V)` (log-probabilities where the softmax is adaptive or a mixture:
        they are their own log-softmax, so every loss and decoder reads them as logits); with
        `targets` `(B, T)` (long, -1 = ignore) it returns
        `(logits, loss)`, the mean cross-entropy (plus, in training, the experts' auxiliary
        losses). With `cache` (`new_cache`), idx holds only the new tokens and positions continue
        after those cached, from `cache.length`, which the forward then advances by T (the model's
        one count, handed to every layer); with `cache` and `positions` `(T,)` long, the new tokens
        sit at those positions and attend to the whole preallocated cache (the static-shape
        decoding step, see `KVCache.update`), and `cache.length` is left alone. `last_only`
        computes logits for the last position alone, `(B, 1, V)`, which is all a decoding step
        needs.
        """
        if last_only and targets is not None:
            raise ValueError("last_only computes one position's logits; the loss needs all of them")
        if positions is not None and cache is None:
            raise ValueError("positions place new tokens in a KV cache; pass cache too")
        start = cache.length if cache is not None else 0
        pos = self._positions(idx, start, positions)  # (T,)
        x = self._embed(idx, pos)  # (B, T, C)
        growing = cache is not None and positions is None
        x, _ = self._stack(x, pos, cache, start if growing else positions)
        if growing:
            cache.length = start + idx.size(1)  # once a forward, after every layer has written
        x = self.final_norm(x)
        if last_only:
            x = x[:, -1:, :]
        logits = self.lm_head(self.head_proj(x))  # (B, T, V)
        if self.config.logit_softcap is not None:
            logits = torch.tanh(logits / self.config.logit_softcap) * self.config.logit_softcap
        if targets is None:
            return logits
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1), ignore_index=-1)
        aux = collect_aux_loss(self)  # the experts' balancing losses (gathered in training only)
        return logits, (loss if aux is None else loss + aux)

    @torch.no_grad()
    def attention_weights(self, idx: torch.Tensor) -> list[torch.Tensor]:
        """The per-head self-attention weights of every block for idx `(B, T)`: a list of `(B, H, T, T)`."""
        pos = self._positions(idx, 0)
        return self._stack(self._embed(idx, pos), pos, need_weights=True)[1]
