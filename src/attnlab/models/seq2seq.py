"""The encoder–decoder Transformer of "Attention Is All You Need" (Vaswani et al. 2017).

Reads like the paper: config; embeddings scaled by √d_model plus sinusoidal positions (§3.4,
§3.5); an encoder of N self-attention blocks (§3.1, Figure 1 left); a decoder of N blocks with
masked self-attention and encoder–decoder attention (Figure 1 right); a linear projection to the
vocabulary, which shares its matrix with both embeddings when the vocabulary is joint (§3.4,
after Press & Wolf 2017).

Implements `attnlab.models.protocols.Seq2SeqModel`: `forward` for teacher-forced training,
`start`/`step` for incremental decoding (the encoder runs once per sentence; the decoder's
self-attention keys and values are cached, and each layer's projection of the encoder output is
computed once), `cross_attention` for the alignment picture.

With `funnel_stages` the encoder is a Funnel Transformer (Dai et al. 2020; `attnlab.nn.funnel`), as
in Narang et al. 2021's encoder–decoder: its sequence is mean-pooled in pairs between stages, and
the decoder cross-attends to the shortened memory `(B, S', C)` under the pooled source mask.

Shape legend: B batch, S source length, T target length, C d_model, H heads, V vocabulary.
"""

import math
from dataclasses import dataclass

import torch
from torch import nn

from attnlab.config import old_field_names
from attnlab.names import OLD_FIELDS
from attnlab.nn import (
    FIXUP,
    INPUT_POSITIONS,
    NORM_ORDERS,
    AttentionOptions,
    BlockOptions,
    DecoderBlock,
    KVCache,
    ModelCache,
    TransformerBlock,
    build_any_norm,
    build_positions,
    build_stack,
    fixup_init,
    padding_mask_from_ids,
)
from attnlab.nn.conv_attention import CONVOLUTIONS
from attnlab.nn.evolved import EvolvedDecoderCell, EvolvedEncoderCell
from attnlab.nn.funnel import FunnelOptions, pool_pairs, upsample
from attnlab.nn.transparent import TransparentMix

EMBEDDING_TIES = ("all", "none", "source-target", "target-output")
"""Which of the source embedding, the target embedding and the output projection share one matrix:
all three (the paper, §3.4), none (untied embeddings), the encoder's and the decoder's inputs (tied
encoder/decoder input embeddings), the decoder's input and output (tied decoder input and output
embeddings), Narang et al. 2021's rows."""


@old_field_names(OLD_FIELDS)  # the block parts' n_kv_head until the rename (and n_head, n_embd, as TOML reads them)
@dataclass(frozen=True)
class Seq2SeqConfig(AttentionOptions, BlockOptions, FunnelOptions):
    """Shape and behaviour of an encoder–decoder Transformer. Validated on construction. The
    attention variants (`attention`, `rope_theta`, ...; `AttentionOptions`) apply to the
    self-attention of both stacks, the block parts (`normalization`, `experts`, `n_kv_heads`,
    `block_sharing` = all, ...; `BlockOptions`) to the blocks of both; the Funnel Transformer's
    stages (`funnel_stages`, summing to n_encoder_layers; `FunnelOptions`) to the encoder."""

    kind: str = "seq2seq-transformer"
    """Model family tag in run configs; always "seq2seq-transformer" for this class."""
    vocab_size: int | None = None
    """Size of the joint source/target vocabulary; None until the tokenizer sets it."""
    d_model: int = 256
    n_heads: int = 8
    n_encoder_layers: int = 3
    n_decoder_layers: int = 3
    d_ff: int = 512
    """Hidden width of the position-wise feed-forward network (2/3 of it for gated units)."""
    dropout: float = 0.1
    """Dropout on embeddings, attention weights and every sublayer output (the paper's P_drop)."""
    activation: str = "relu"
    """Feed-forward non-linearity, one of attnlab.nn.FEEDFORWARDS (the paper: relu)."""
    norm: str = "post"
    """Residual order: "post" as in the paper, or "pre"."""
    positions: str = "sinusoidal"
    """Position scheme, one of attnlab.nn.POSITIONS (at the input, or inside self-attention)."""
    max_len: int = 256
    """Longest sequence (source or target, in tokens), whatever the position scheme."""
    tie_embeddings: bool | str = True
    """Which embeddings share one matrix, one of EMBEDDING_TIES: "all" (or true: the source and
    target embeddings and the output projection), "none" (or false), "source-target",
    "target-output"."""
    pad_id: int = 0
    """Padding token id of the vocabulary."""
    layer_norm_eps: float = 1e-5
    transparent_attention: bool = False
    """Transparent attention (Bapna et al. 2018): each decoder layer's cross-attention reads a
    learned softmax-weighted mix of all encoder layers' outputs, the embedding included."""

    def __post_init__(self) -> None:
        if self.kind != "seq2seq-transformer":
            raise ValueError(f"kind must be 'seq2seq-transformer' for Seq2SeqConfig, got {self.kind!r}")
        if self.vocab_size is not None and self.vocab_size < 1:
            raise ValueError(f"vocab_size must be >= 1, got {self.vocab_size}")
        for name in ("d_model", "n_heads", "n_encoder_layers", "n_decoder_layers", "d_ff", "max_len"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.d_model % self.n_heads != 0:
            raise ValueError(f"d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads})")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")
        self.check_parts(
            self.activation, n_heads=self.n_heads, d_model=self.d_model, encoder_decoder=True, evolved=True
        )
        if self.embedding_ties not in EMBEDDING_TIES:
            raise ValueError(
                f"tie_embeddings must be true, false or one of {', '.join(map(repr, EMBEDDING_TIES))}, "
                f"got {self.tie_embeddings!r}"
            )
        # The encoder–decoder ties its embeddings with `tie_embeddings`; the Universal Transformer
        # and factorized embeddings are the GPT's and BERT's.
        if self.block_sharing == "universal":
            raise ValueError("block_sharing 'universal' is for GPT and BERT; use 'all' or 'none' here")
        if self.embedding_dim is not None:
            raise ValueError("embedding_dim (factorized embeddings) is for GPT and BERT; leave it unset here")
        if self.branched_attention:
            raise ValueError("branched_attention (the Weighted Transformer) is for GPT and BERT; leave it off here")
        if self.norm not in NORM_ORDERS:
            raise ValueError(f"norm must be one of {list(NORM_ORDERS)}, got {self.norm!r}")
        if self.attention in CONVOLUTIONS:
            raise ValueError(f"attention {self.attention!r} (a convolution) is for GPT and BERT; use 'full' here")
        # causal: the decoder's self-attention, which the spec covers too
        self.check_attention(self.positions, causal=True, head_dim=self.d_model // self.n_heads, d_model=self.d_model)
        self.check_funnel(self.n_encoder_layers, causal=False, layers_field="n_encoder_layers")
        if self.funnel_stages is not None:
            self._check_funnel_parts()

    def _check_funnel_parts(self) -> None:
        """ValueError for the parts a funnel encoder cannot take."""
        # The pooled queries attend as cross-attention, which carries no positions or patterns;
        # the encoder's states shrink, so a mix of them (transparent attention) has no one length.
        if self.positions not in INPUT_POSITIONS or self.attention != "full" or self.transparent_attention:
            raise ValueError(
                "funnel_stages pools the encoder's queries: it takes positions at the input "
                f"({', '.join(INPUT_POSITIONS)}), attention 'full' and no transparent_attention, got positions "
                f"{self.positions!r}, attention {self.attention!r}, transparent_attention {self.transparent_attention}"
            )

    @property
    def embedding_ties(self) -> str:
        """`tie_embeddings` as one of EMBEDDING_TIES (true is "all", false "none")."""
        if isinstance(self.tie_embeddings, bool):
            return "all" if self.tie_embeddings else "none"
        return self.tie_embeddings


@dataclass
class TransformerDecoderState:
    """What `step` needs: per-layer memory keys/values, the source mask, self-attention caches."""

    memory_kv: list[tuple]  # per layer (k, v); an evolved cell's a pair of them
    src_mask: torch.Tensor  # (B, 1, 1, S)
    caches: ModelCache  # of KVCache or EvolvedCache, one a decoder layer, and the positions written

    def select(self, index: torch.Tensor, *, same_source: bool = False) -> None:
        if not same_source:  # the encoder side is the same for every row of one source sentence
            self.memory_kv = [_select_rows(kv, index) for kv in self.memory_kv]
            self.src_mask = self.src_mask.index_select(0, index)
        self.caches.select_rows(index)


def _select_rows(kv: tuple | torch.Tensor, index: torch.Tensor) -> tuple | torch.Tensor:
    """The rows `index` of every tensor in a nest of tuples (one layer's projected memory)."""
    if isinstance(kv, torch.Tensor):
        return kv.index_select(0, index)
    return tuple(_select_rows(part, index) for part in kv)


class Seq2SeqTransformer(nn.Module):
    """Encoder–decoder Transformer for translation."""

    def __init__(self, config: Seq2SeqConfig) -> None:
        super().__init__()
        if config.vocab_size is None:
            raise ValueError("Seq2SeqConfig.vocab_size is None: set it (it normally comes from the tokenizer)")
        self.config = config
        self.pad_id = config.pad_id
        c = config
        ties = c.embedding_ties
        self.src_embedding = nn.Embedding(c.vocab_size, c.d_model, padding_idx=c.pad_id)
        shared = ties in ("all", "source-target")
        self.tgt_embedding = self.src_embedding if shared else nn.Embedding(c.vocab_size, c.d_model)
        self.positions = build_positions(c.positions, c.max_len, c.d_model)
        self.dropout = nn.Dropout(c.dropout)
        block_args = dict(dropout=c.dropout, activation=c.activation, norm=c.norm, eps=c.layer_norm_eps)
        spec = c.attention_spec(c.positions, c.max_len)
        d_ff = c.ffn_width(c.activation, c.d_ff)

        # The Evolved Transformer's cells (So et al. 2019) fix their own activations and widths.
        cell_args = dict(dropout=c.dropout, norm=c.norm, normalization=c.normalization, eps=c.layer_norm_eps)
        cell_args |= dict(n_kv_heads=c.n_kv_heads)

        def encoder_block(i: int) -> TransformerBlock | EvolvedEncoderCell:
            if c.block == "evolved":
                return EvolvedEncoderCell(c.d_model, c.n_heads, spec=spec.for_layer(i), **cell_args)
            return TransformerBlock(
                c.d_model, c.n_heads, d_ff, spec=spec.for_layer(i), parts=c.block_parts(i), **block_args
            )

        def decoder_block(i: int) -> DecoderBlock | EvolvedDecoderCell:
            layer = c.n_encoder_layers + i
            if c.block == "evolved":
                return EvolvedDecoderCell(c.d_model, c.n_heads, cross=True, spec=spec.for_layer(layer), **cell_args)
            return DecoderBlock(
                c.d_model, c.n_heads, d_ff, spec=spec.for_layer(layer), parts=c.block_parts(layer), **block_args
            )

        self.encoder = build_stack(encoder_block, c.n_encoder_layers, c.stack_sharing("encoder"))
        self.pool_layers = c.funnel_pool_layers()  # empty without funnel_stages
        self.decoder = build_stack(decoder_block, c.n_decoder_layers, c.stack_sharing("decoder"))
        self.encoder_norm = self._final_norm()
        self.transparent = TransparentMix(c.n_encoder_layers, c.n_decoder_layers) if c.transparent_attention else None
        self.decoder_norm = self._final_norm()
        self.output = nn.Linear(c.d_model, c.vocab_size, bias=False)
        self._init_weights()
        if ties in ("all", "target-output"):
            self.output.weight = self.tgt_embedding.weight
        if c.normalization == FIXUP:  # two branches an encoder block, three a decoder block
            branches = 2 * c.n_encoder_layers + 3 * c.n_decoder_layers
            fixup_init(self.encoder, branches)
            fixup_init(self.decoder, branches, head=None if ties in ("all", "target-output") else self.output)

    def _final_norm(self) -> nn.Module:
        # Post-norm blocks end in a norm; pre-norm stacks need one at the end of each stack.
        c = self.config
        return build_any_norm(c.normalization, c.d_model, eps=c.layer_norm_eps) if c.norm == "pre" else nn.Identity()

    def _init_weights(self) -> None:
        # Xavier for projections (as the annotated Transformer); embeddings N(0, d^-1/2), so that
        # after the √d scaling of §3.4 they have unit variance, like the positional encodings.
        for p in self.parameters():
            if p.dim() > 1:
                nn.init.xavier_uniform_(p)
        for emb in {self.src_embedding, self.tgt_embedding}:
            nn.init.normal_(emb.weight, mean=0.0, std=self.config.d_model**-0.5)
            with torch.no_grad():
                emb.weight[self.pad_id].zero_()

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def _embed(self, ids: torch.Tensor, embedding: nn.Embedding, start: int = 0) -> torch.Tensor:
        t = ids.size(1)
        # max_len bounds every scheme here: translation has no use for longer sentences than it
        # was configured for, and the decoder's caches are that long.
        if start + t > self.config.max_len:
            raise ValueError(f"sequence of {start + t} tokens is longer than max_len {self.config.max_len}")
        pos = torch.arange(start, start + t, device=ids.device)
        return self.dropout(embedding(ids) * math.sqrt(self.config.d_model) + self.positions(pos))

    def encode(self, src: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """src `(B, S)` -> memory `(B, S, C)` and the source padding mask `(B, 1, 1, S)`; with
        `funnel_stages`, the pooled memory `(B, S', C)` and mask `(B, 1, 1, S')`,
        S' = ⌈S / 2^(stages − 1)⌉."""
        memory, src_mask, _ = self._encode(src, need_weights=False)
        return memory, src_mask

    def _encode(self, src: torch.Tensor, need_weights: bool) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
        """Memory, source mask and, when asked for, each encoder layer's weights `(B, H, S, S)`."""
        states, src_mask, weights = self._encoder_states(src, need_weights)
        return self.encoder_norm(states[-1]), src_mask, weights

    def _encoder_states(
        self, src: torch.Tensor, need_weights: bool = False
    ) -> tuple[list[torch.Tensor], torch.Tensor, list[torch.Tensor]]:
        """The embedded source and every encoder layer's output `[(B, S, C)] * (N + 1)`, the source
        mask (of the last state) and, when asked for, each layer's weights. In a Funnel Transformer
        the first block of each later stage pools its queries only (Dai et al. 2020, Eq. 2): the
        pair means `(B, ⌈S/2⌉, C)` read the unpooled keys and values, and the mask is pooled alike."""
        src_mask = padding_mask_from_ids(src, self.pad_id)  # (B, 1, 1, S)
        real = src != self.pad_id  # (B, S)
        states = [self._embed(src, self.src_embedding)]
        weights = []
        for i, block in enumerate(self.encoder):
            x = states[-1]
            if i in self.pool_layers:
                pooled, real = pool_pairs(x, real)
                x, w = block(pooled, mask=src_mask, need_weights=need_weights, keys=x)
                src_mask = real[:, None, None, :]  # (B, 1, 1, S')
            else:
                x, w = block(x, mask=src_mask, need_weights=need_weights)
            states.append(x)
            if w is not None:
                weights.append(w)
        return states, src_mask, weights

    def _memories(self, src: torch.Tensor) -> tuple[list[torch.Tensor], torch.Tensor]:
        """What each decoder layer's cross-attention reads `[(B, S, C)] * M`, and the source mask:
        the encoder's output, or with transparent attention each layer's mix of all its states
        (each through the encoder's final norm, as the last state is)."""
        if self.transparent is None:
            memory, src_mask = self.encode(src)
            return [memory] * len(self.decoder), src_mask
        states, src_mask, _ = self._encoder_states(src)
        return [self.encoder_norm(m) for m in self.transparent(states)], src_mask

    def _memory_kv(self, memories: list[torch.Tensor]) -> list[tuple]:
        """Each decoder layer's cross-attention keys and values (an evolved cell: a pair of them)."""
        return [
            block.project_memory(m) if isinstance(block, EvolvedDecoderCell) else block.cross_attn.project_memory(m)
            for block, m in zip(self.decoder, memories, strict=True)
        ]

    def _decode(
        self,
        tgt_in: torch.Tensor,
        memory_kv: list[tuple[torch.Tensor, torch.Tensor]],
        src_mask: torch.Tensor,
        *,
        caches: ModelCache | None = None,
        need_weights: bool = False,
    ) -> tuple[torch.Tensor, list[torch.Tensor | None]]:
        start = caches.length if caches is not None else 0  # the decoder's one count of positions
        x = self._embed(tgt_in, self.tgt_embedding, start)
        weights = []
        for i, block in enumerate(self.decoder):
            cache, at = (None, None) if caches is None else (caches[i], start)
            x, w = block(x, memory_kv[i], memory_mask=src_mask, cache=cache, positions=at, need_weights=need_weights)
            weights.append(w)
        if caches is not None:
            caches.length = start + tgt_in.size(1)  # once a step, after every layer has written
        return self.decoder_norm(x), weights

    def forward(self, src: torch.Tensor, tgt_in: torch.Tensor) -> torch.Tensor:
        """Teacher-forced next-token logits `(B, T, V)` for src `(B, S)` and decoder input `(B, T)`."""
        memories, src_mask = self._memories(src)
        h, _ = self._decode(tgt_in, self._memory_kv(memories), src_mask)
        return self.output(h)

    def start(self, src: torch.Tensor, max_len: int) -> TransformerDecoderState:
        """Encode src `(B, S)` once and preallocate self-attention caches for `max_len` target tokens."""
        memories, src_mask = self._memories(src)
        memory, c = memories[-1], self.config
        length = min(max_len, c.max_len)
        if c.block == "evolved":  # its attentions' keys and values and its convolutions' last inputs
            kind = dict(device=memory.device, dtype=memory.dtype)
            caches = ModelCache(block.new_cache(src.size(0), length, **kind) for block in self.decoder)
            return TransformerDecoderState(self._memory_kv(memories), src_mask, caches)
        caches = ModelCache(
            KVCache(
                src.size(0),
                c.n_kv_heads or c.n_heads,
                length,
                c.d_model // c.n_heads,
                device=memory.device,
                dtype=memory.dtype,
            )
            for _ in range(c.n_decoder_layers)
        )
        return TransformerDecoderState(self._memory_kv(memories), src_mask, caches)

    def step(self, tokens: torch.Tensor, state: TransformerDecoderState) -> torch.Tensor:
        """Previous target tokens `(B,)` -> next-token logits `(B, V)`; the caches grow by one."""
        h, _ = self._decode(tokens[:, None], state.memory_kv, state.src_mask, caches=state.caches)
        return self.output(h[:, -1])

    @torch.no_grad()
    def encoder_attention(self, src: torch.Tensor) -> list[torch.Tensor]:
        """The encoder's per-head self-attention of every layer for src `(B, S)`: a list of `(B, H, S, S)`
        (in a Funnel Transformer, `(B, H, Sq, Sk)` with each stage's lengths)."""
        return self._encode(src, need_weights=True)[2]

    @torch.no_grad()
    def cross_attention_layers(self, src: torch.Tensor, tgt_in: torch.Tensor) -> list[torch.Tensor]:
        """Encoder–decoder attention of every decoder layer: a list of `(B, H, T, S)` (`(B, H, T, S')`
        over a Funnel Transformer's pooled memory)."""
        memories, src_mask = self._memories(src)
        _, weights = self._decode(tgt_in, self._memory_kv(memories), src_mask, need_weights=True)
        return weights

    def cross_attention(self, src: torch.Tensor, tgt_in: torch.Tensor) -> torch.Tensor:
        """The alignment `(B, T, S)`: the last decoder layer's cross-attention, averaged over heads.
        Over a Funnel Transformer's pooled memory each source token shows the weight of the pooled
        position that holds it (a row then sums to one over the pooled positions, not the tokens)."""
        weights = self.cross_attention_layers(src, tgt_in)[-1].mean(dim=1)  # (B, T, S')
        if weights.size(-1) == src.size(1):
            return weights
        return upsample(weights.transpose(1, 2), len(self.pool_layers), src.size(1)).transpose(1, 2)  # (B, T, S)
