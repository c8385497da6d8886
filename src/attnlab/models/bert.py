"""BERT: a bidirectional Transformer encoder (Devlin et al. 2019).

Reads top to bottom like the paper: config, embeddings (token + position + segment, §3 "Input/Output
Representations", Figure 2), a stack of post-norm Transformer blocks that attend in both directions
(the encoder of Vaswani et al. 2017), the pooler on the first token ([CLS]), and the heads: masked
language modelling (§3.1, "Task #1"), and classifiers over the pooled output or every position
(§4, Figure 4).

The only attention mask is the key-padding mask: tokens equal to `pad_id` cannot be attended to.
Pad on the right: BERT counts positions from the first token, so left padding would shift them.
RoBERTa (Liu et al. 2019) is this model with its positions counted as fairseq counts them
(`position_ids = "after_padding"`: the real tokens only, from `pad_id + 1`), one segment, and
byte-level BPE ids. ModernBERT (Warner et al. 2024) is this model pre-norm, with RoPE, GeGLU, no
biases (`bias`), no segments (`type_vocab_size` 0), no norm before the first block's attention
(`norm_first_block`), its layers' attention alternating between global and a sliding window,
each with its own RoPE base (`layer_attention`, `window_rope_theta`), and classifiers over a
prediction head in place of the tanh pooler (`classifier_head`).

Shape legend: B batch, T time, C d_model, V vocab, H heads, L labels.

References:
- Devlin et al. 2019, "BERT: Pre-training of Deep Bidirectional Transformers for Language
  Understanding".
- google-research/bert `modeling.py` (initialiser range 0.02, LayerNorm eps 1e-12, the pooler, the
  transform before the tied MLM decoder in `run_pretraining.py`).
- Liu et al. 2019, "RoBERTa: A Robustly Optimized BERT Pretraining Approach"; fairseq
  `utils.make_positions` (its position ids).
- Warner et al. 2024, "Smarter, Better, Faster, Longer: A Modern Bidirectional Encoder" (ModernBERT), §2.1.
"""

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch
from torch import nn

from attnlab.config import old_field_names
from attnlab.names import OLD_FIELDS
from attnlab.nn import (
    EMBEDDING_STD,
    AttentionOptions,
    BlockOptions,
    StepSignal,
    TransformerBlock,
    build_norm,
    build_positions,
    build_stack,
    context_limit,
    normal_init,
    padding_mask_from_ids,
    sinusoidal_positions,
)
from attnlab.nn.feedforward import pointwise
from attnlab.nn.funnel import FunnelOptions, pool_mask, pool_pairs, upsample

HEADS = ("mlm", "sequence", "token", "none")
CLASSIFIER_HEADS = ("linear", "prediction")
POSITION_IDS = ("index", "after_padding")


@old_field_names(OLD_FIELDS)  # the block parts' n_kv_head until the rename (and the GPT's names, as TOML reads them)
@dataclass(frozen=True)
class BertConfig(AttentionOptions, BlockOptions, FunnelOptions):
    """Everything that fixes the shape and behaviour of a BERT. Validated on construction. The
    attention variants' fields (`attention`, `linformer_k`, ...) come from `AttentionOptions`, the
    block parts' (`normalization`, `experts`, `block_sharing`, `embedding_dim`, ...) from `BlockOptions`,
    the Funnel Transformer's stages (`funnel_stages`) from `FunnelOptions`."""

    kind: str = "bert"
    """Always "bert": lets a task pick the model family by `model.kind`."""
    vocab_size: int = 8000
    """Number of token ids."""
    max_len: int = 128
    """Number of learned position embeddings: the longest input (with learned positions or Linformer)."""
    positions: str = "learned"
    """Position scheme, one of attnlab.nn.POSITIONS: BERT's "learned", another at the input, or one
    inside attention (rope, alibi, relative)."""
    type_vocab_size: int = 2
    """Number of segment embeddings (sentence A / sentence B); 0: none (ModernBERT)."""
    d_model: int = 256
    """Model width C."""
    n_heads: int = 4
    """Attention heads per block; must divide d_model."""
    n_layers: int = 4
    """Number of Transformer blocks."""
    d_ff: int = 1024
    """Feed-forward hidden width (4C in the paper); 2/3 of it for gated units (`BlockOptions.ffn_hidden`)."""
    dropout: float = 0.1
    """Dropout on embeddings, attention weights, residual branches and classifier inputs."""
    activation: str = "gelu"
    """Feed-forward non-linearity, one of attnlab.nn.FEEDFORWARDS; the MLM transform applies the
    same function (a gated unit's gate function)."""
    layer_norm_eps: float = 1e-12
    """Epsilon of every LayerNorm (BERT's value)."""
    pad_id: int = 0
    """Token id of padding; keys with this id are masked out."""
    head: str = "mlm"
    """Output head: "mlm" (masked-LM logits), "sequence" (one label per input, from the pooled
    output), "token" (one label per position) or "none" (the hidden states)."""
    n_labels: int = 0
    """Number of classes of a "sequence" or "token" head; 0 for "mlm" and "none"."""
    classifier_head: str = "linear"
    """The form of the "sequence" and "token" heads: "linear" (BERT's, §4: dropout and a linear map,
    a sentence read through the tanh pooler) or "prediction" (ModernBERT's, transformers'
    `ModernBertPredictionHead`: the masked-LM head's transform, a dense layer, the activation and a
    norm, before the dropout and the linear map; a sentence read as its pooled state, with no tanh
    pooler, which the model then does not have)."""
    position_init: str = "normal"
    """How the learned position embeddings start: "normal" (BERT's N(0, 0.02²)) or "sinusoidal"
    (the §3.5 table of Vaswani et al., scaled to the same spread; still trained). Random vectors
    carry no notion of "next to", which MLM must learn before it can use neighbouring words; the
    sinusoids start with it (a row's dot product with another depends on their offset)."""
    norm: str = "post"
    """"post" (BERT's order, LayerNorm after each residual sum) or "pre" (LayerNorm before each
    sublayer and once after the last block, as GPT-2; it trains more stably at high learning rates)."""
    pooling: str = "cls"
    """What the pooler reads: "cls" (BERT's first-position state) or "mean" (the average of the
    non-padding positions). BERT's [CLS] state is trained by next-sentence prediction, which
    masked-LM pre-training alone does not do; the mean of the token states carries what MLM did learn."""
    bias: bool = True
    """Biases in the blocks (attention, feed-forward, norms), the embeddings' and the final norm and
    the masked-LM transform; ModernBERT has none (§2.1.1, "Bias Terms")."""
    norm_first_block: bool = True
    """Pre-norm: whether the first block normalises its attention input. ModernBERT's does not: the
    embeddings' norm has just normalised it."""
    position_ids: str = "index"
    """Which row of the learned position table each token reads: "index" (BERT's: its index 0, 1, ...)
    or "after_padding" (RoBERTa's, fairseq's `make_positions`: the real tokens counted from
    pad_id + 1, every padding token at row pad_id; the table then has max_len + pad_id + 1 rows,
    and a real token's position does not depend on where the padding is)."""
    funnel_decoder_layers: int = 2
    """With `funnel_stages`, for a head with an output per position ("mlm", "token", "none"): the
    full-length blocks after the up-sampling (the Funnel Transformer's decoder, Dai et al. 2020 §2.2).
    A "sequence" head reads the pooled sequence and has none."""

    def __post_init__(self) -> None:
        if self.kind != "bert":
            raise ValueError(f"kind must be 'bert', got {self.kind!r}")
        for name in ("vocab_size", "max_len", "d_model", "n_heads", "n_layers", "d_ff"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.type_vocab_size < 0:
            raise ValueError(f"type_vocab_size must be >= 0, got {self.type_vocab_size}")
        if self.d_model % self.n_heads != 0:
            raise ValueError(f"d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads})")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")
        self.check_parts(self.activation, n_heads=self.n_heads, d_model=self.d_model)
        if self.layer_norm_eps <= 0:
            raise ValueError(f"layer_norm_eps must be > 0, got {self.layer_norm_eps}")
        if not 0 <= self.pad_id < self.vocab_size:
            raise ValueError(f"pad_id must be in [0, vocab_size={self.vocab_size}), got {self.pad_id}")
        if self.position_init not in ("normal", "sinusoidal"):
            raise ValueError(f"position_init must be 'normal' or 'sinusoidal', got {self.position_init!r}")
        self.check_attention(self.positions, causal=False, head_dim=self.head_dim, d_model=self.d_model)
        self.check_layers(self.n_layers)
        if not self.norm_first_block and (self.norm != "pre" or self.block_sharing != "none"):
            raise ValueError(
                "norm_first_block false leaves out the first block's own norm: it needs norm 'pre' and "
                f"block_sharing 'none', got norm {self.norm!r}, block_sharing {self.block_sharing!r}"
            )
        if self.position_init == "sinusoidal" and self.positions != "learned":
            raise ValueError(f"position_init 'sinusoidal' starts learned positions; positions is {self.positions!r}")
        if self.norm not in ("post", "pre"):
            raise ValueError(f"norm must be 'post' or 'pre', got {self.norm!r}")
        if self.position_ids not in POSITION_IDS:
            raise ValueError(f"position_ids must be one of {list(POSITION_IDS)}, got {self.position_ids!r}")
        if self.position_ids != "index" and self.positions != "learned":
            raise ValueError(
                f"position_ids {self.position_ids!r} indexes learned positions; positions is {self.positions!r}"
            )
        if self.pooling not in ("cls", "mean"):
            raise ValueError(f"pooling must be 'cls' or 'mean', got {self.pooling!r}")
        if self.head not in HEADS:
            raise ValueError(f"head must be one of {list(HEADS)}, got {self.head!r}")
        if self.classifier_head not in CLASSIFIER_HEADS:
            raise ValueError(f"classifier_head must be one of {list(CLASSIFIER_HEADS)}, got {self.classifier_head!r}")
        if self.head in ("sequence", "token") and self.n_labels < 1:
            raise ValueError(f"n_labels must be >= 1 for head {self.head!r}, got {self.n_labels}")
        if self.head in ("mlm", "none") and self.n_labels != 0:
            raise ValueError(f"n_labels must be 0 for head {self.head!r} (it has no classes), got {self.n_labels}")
        self.check_funnel(self.n_layers, causal=False)
        if self.funnel_stages is not None:
            self._check_funnel_parts()

    def _check_funnel_parts(self) -> None:
        """ValueError for the parts a Funnel Transformer's pooled attention cannot take."""
        if self.funnel_decoder_layers < 0:
            raise ValueError(f"funnel_decoder_layers must be >= 0, got {self.funnel_decoder_layers}")
        # The pooled queries attend as cross-attention, which carries no positions or patterns.
        if self.positions not in ("learned", "sinusoidal", "fourier", "none") or self.attention != "full":
            raise ValueError(
                "funnel_stages pools the queries of whole sequences: it takes positions at the input (learned, "
                f"sinusoidal, fourier, none) and attention 'full', got positions {self.positions!r}, "
                f"attention {self.attention!r}"
            )
        if self.block_sharing == "universal" or self.branched_attention:
            raise ValueError(
                "funnel_stages takes no universal block sharing (its step signal is per position) "
                "and no branched_attention"
            )

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def ffn_size(self) -> int:
        """The blocks' feed-forward hidden width (d_ff, or 2/3 of it for gated units)."""
        return self.ffn_width(self.activation, self.d_ff)

    @property
    def embedding_size(self) -> int:
        """E: the token embeddings' width (ALBERT's factorization when below d_model)."""
        return self.embedding_dim or self.d_model

    @property
    def position_rows(self) -> int:
        """Rows of the learned position table: max_len, plus the pad_id + 1 rows that RoBERTa's
        counting skips ("after_padding")."""
        return self.max_len + (self.pad_id + 1 if self.position_ids == "after_padding" else 0)


def positions_after_padding(ids: torch.Tensor, pad_id: int) -> torch.Tensor:
    """RoBERTa's position ids (fairseq `make_positions`): the real tokens numbered pad_id + 1,
    pad_id + 2, ... in order, padding at pad_id. ids `(B, T)` -> `(B, T)` long.
    Example: pad_id 1, ids [[5, 7, 1], [1, 5, 7]] -> [[2, 3, 1], [1, 2, 3]]."""
    real = (ids != pad_id).long()  # (B, T)
    return torch.cumsum(real, dim=1) * real + pad_id


class BertEmbeddings(nn.Module):
    """The input representation (§3, Figure 2): token + position + segment embeddings, summed,
    then LayerNorm and dropout. ids and segments `(B, T)` long -> `(B, T, C)`."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        e = config.embedding_size
        self.token = nn.Embedding(config.vocab_size, e)
        self.token_proj = nn.Linear(e, config.d_model, bias=False) if e != config.d_model else nn.Identity()
        # BERT's own table stays an nn.Embedding (its checkpoints name it so); other schemes by name.
        self.position = (
            nn.Embedding(config.position_rows, config.d_model)
            if config.positions == "learned"
            else build_positions(config.positions, config.max_len, config.d_model)
        )
        table = config.max_len if config.positions == "learned" else self.position.max_positions
        self.max_len = context_limit(table, config.attention, config.max_len)
        self.position_ids = config.position_ids
        self.pad_id = config.pad_id
        self.segment = nn.Embedding(config.type_vocab_size, config.d_model) if config.type_vocab_size else None
        self.norm = build_norm(config.normalization, config.d_model, eps=config.layer_norm_eps, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, ids: torch.Tensor, segments: torch.Tensor | None = None) -> torch.Tensor:
        t = ids.size(1)
        if self.max_len is not None and t > self.max_len:
            raise ValueError(f"sequence of {t} tokens is longer than max_len {self.max_len}")
        if not isinstance(self.position, nn.Embedding):
            self.position.grow(t)
        if self.position_ids == "after_padding":
            pos = positions_after_padding(ids, self.pad_id)  # (B, T)
        else:
            pos = torch.arange(t, device=ids.device)  # (T,)
        x = self.token_proj(self.token(ids)) + self.position(pos)  # (B, T, C)
        if self.segment is not None:
            x = x + self.segment(torch.zeros_like(ids) if segments is None else segments)  # one text: all segment A
        return self.dropout(self.norm(x))


def transform_layers(
    config: BertConfig, width: int
) -> tuple[nn.Linear, Callable[[torch.Tensor], torch.Tensor], nn.Module]:
    """The masked-LM head's transform (google-research/bert `run_pretraining.py`): a dense layer
    from C to `width`, the activation (`pointwise(config.activation)`) and a norm, applied in that
    order. ModernBERT's classifiers start with the same three (`PredictionClassifierHead`)."""
    dense = nn.Linear(config.d_model, width, bias=config.bias)
    norm = build_norm(config.normalization, width, eps=config.layer_norm_eps, bias=config.bias)
    return dense, pointwise(config.activation), norm


class MaskedLMHead(nn.Module):
    """Masked-LM output (§3.1, Task #1): a dense layer, the activation and a LayerNorm, then a
    decoder whose weight is the token embedding matrix (tied) plus an output bias of its own.
    x `(B, T, C)` -> logits `(B, T, V)`. With factorized embeddings the dense layer maps to their
    width E (ALBERT). E is read from `token_embedding`: ELECTRA's small generator decodes with the
    discriminator's wider embeddings (`attnlab.models.electra`)."""

    def __init__(self, config: BertConfig, token_embedding: nn.Embedding) -> None:
        super().__init__()
        e = token_embedding.embedding_dim
        self.dense, self.act, self.norm = transform_layers(config, e)
        self.decoder = nn.Linear(e, config.vocab_size)
        self.decoder.weight = token_embedding.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.norm(self.act(self.dense(x))))


class ClassifierHead(nn.Module):
    """Dropout then a linear map to label scores (§4): x `(..., C)` -> `(..., L)`. The "sequence"
    head applies it to the pooled output `(B, C)`, the "token" head to every position `(B, T, C)`."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.dropout = nn.Dropout(config.dropout)
        self.proj = nn.Linear(config.d_model, config.n_labels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(self.dropout(x))


class PredictionClassifierHead(ClassifierHead):
    """ModernBERT's classifier (`classifier_head = "prediction"`; transformers'
    `ModernBertPredictionHead`, then dropout and a linear map): the masked-LM head's transform
    (dense, activation, norm; `transform_layers`) before BERT's dropout and linear map.
    x `(..., C)` -> `(..., L)`: the pooled state `(B, C)` itself (no tanh pooler) or every position."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__(config)
        self.dense, self.act, self.norm = transform_layers(config, config.d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(self.norm(self.act(self.dense(x))))


CLASSIFIERS: dict[str, type[ClassifierHead]] = {"linear": ClassifierHead, "prediction": PredictionClassifierHead}


class Bert(nn.Module):
    """Bidirectional Transformer encoder with one head. `forward(ids (B, T))` -> the head's output:
    "mlm" `(B, T, V)`, "sequence" `(B, L)`, "token" `(B, T, L)`, "none" `(B, T, C)`."""

    drop_full_mask: bool = False
    """Whether a padding mask that hides nothing is dropped, the same function at less cost. Set
    from outside, where the model is prepared for its hardware (`attnlab.accel.rules`): seeing that
    the mask hides nothing reads it, free on the CPU, a wait for the device on a GPU."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.config = config
        self.embeddings = BertEmbeddings(config)
        spec = config.attention_spec(config.positions, config.max_len)

        def block(i: int) -> TransformerBlock:
            return TransformerBlock(
                config.d_model,
                config.n_heads,
                config.ffn_size,
                dropout=config.dropout,
                activation=config.activation,
                norm=config.norm,  # BERT keeps the original Transformer's order, "post" (§3)
                eps=config.layer_norm_eps,
                bias=config.bias,
                spec=spec.for_layer(i),
                parts=config.block_parts(i),
            )

        self.blocks = build_stack(block, config.n_layers, config.block_sharing)
        if not config.norm_first_block:  # ModernBERT: the embeddings' norm has just normalised its input
            self.blocks[0].norm1 = nn.Identity()
        universal = config.block_sharing == "universal"
        self.step_signal = (
            StepSignal(config.d_model, config.max_len, config.n_layers, scale=EMBEDDING_STD) if universal else None
        )
        self.pool_layers = config.funnel_pool_layers()
        decoder = config.funnel_stages is not None and config.head != "sequence"
        n_up = config.funnel_decoder_layers if decoder else 0
        self.funnel_decoder = nn.ModuleList(block(config.n_layers + j) for j in range(n_up)) if decoder else None
        # Pre-norm leaves the residual stream unnormalised; one norm closes the stack.
        self.final_norm = (
            build_norm(config.normalization, config.d_model, eps=config.layer_norm_eps, bias=config.bias)
            if config.norm == "pre"
            else None
        )
        # ModernBERT's classifier reads the pooled state itself: it has no pooler.
        self.pooler = nn.Linear(config.d_model, config.d_model) if config.classifier_head == "linear" else None
        self.head: nn.Module | None
        if config.head == "mlm":
            self.head = MaskedLMHead(config, self.embeddings.token)
        elif config.head in ("sequence", "token"):
            self.head = CLASSIFIERS[config.classifier_head](config)
        else:
            self.head = None
        self.apply(normal_init)
        if config.position_init == "sinusoidal":
            table = sinusoidal_positions(config.position_rows, config.d_model)
            with torch.no_grad():
                self.embeddings.position.weight.copy_(table * (0.02 / table.std()))

    def _run(
        self, ids: torch.Tensor, segments: torch.Tensor | None, need_weights: bool
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Hidden states `(B, T, C)` of the last block and, when asked for, each block's weights."""
        mask = padding_mask_from_ids(ids, self.config.pad_id)  # (B, 1, 1, T): padding is never a key
        if self.drop_full_mask and bool(mask.all()):
            # Nothing to hide (masked-LM blocks are never padded): no mask spares the attention two
            # passes over its (B, H, T, T) weights and lets it take an unmasked kernel.
            mask = None
        x = self.embeddings(ids, segments)  # (B, T, C)
        pos = torch.arange(ids.size(1), device=ids.device)
        if self.step_signal is not None:
            self.step_signal.grow(ids.size(1))
        weights = []
        real = ids != self.config.pad_id  # (B, T); pooled with the sequence in a Funnel Transformer
        first_stage = x
        for i, block in enumerate(self.blocks):
            if self.step_signal is not None:
                x = self.step_signal(x, pos, i)
            if i in self.pool_layers:
                if i == min(self.pool_layers):
                    first_stage = x  # the full-length residual that the up-sampling adds back
                # Pool-query-only (Dai et al. 2020, Eq. 2): pooled queries read the unpooled keys.
                pooled, real = pool_pairs(x, real)
                x, w = block(pooled, mask=mask, need_weights=need_weights, keys=x)
                mask = None if mask is None else real[:, None, None, :]  # (B, 1, 1, T')
            else:
                x, w = block(x, mask=mask, need_weights=need_weights)
            if w is not None:
                weights.append(w)
        if self.funnel_decoder is not None:
            x, more = self._funnel_decode(x, first_stage, ids, need_weights)
            weights += more
        if self.final_norm is not None:
            x = self.final_norm(x)
        return x, weights

    def _funnel_decode(
        self, x: torch.Tensor, first_stage: torch.Tensor, ids: torch.Tensor, need_weights: bool
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """The Funnel Transformer's decoder (§2.2): the short sequence up-sampled to the input's
        length plus the first stage's output `(B, T, C)`, through the full-length blocks."""
        real = ids != self.config.pad_id
        mask = None if bool(real.all()) else real[:, None, None, :]  # (B, 1, 1, T)
        x = upsample(x, len(self.pool_layers), ids.size(1)) + first_stage  # (B, T, C)
        weights = []
        for block in self.funnel_decoder or ():
            x, w = block(x, mask=mask, need_weights=need_weights)
            if w is not None:
                weights.append(w)
        return x, weights

    def encode(self, ids: torch.Tensor, segments: torch.Tensor | None = None) -> torch.Tensor:
        """Last hidden states `(B, T, C)` of ids `(B, T)` long, with segment ids `(B, T)` long
        (default all 0). Positions where `ids == pad_id` are padding: no position attends to them."""
        return self._run(ids, segments, need_weights=False)[0]

    def pool(self, hidden: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """The pooler: tanh(W h + b) of the first position ([CLS]), or of the mean over the positions
        that are not padding (`config.pooling`); h itself without a pooler (`classifier_head`
        "prediction"). hidden `(B, T, C)`, ids `(B, T)` -> `(B, C)`; a Funnel Transformer's short
        hidden sequence `(B, T', C)` with the input's ids `(B, T)`."""
        if self.config.pooling == "cls":
            h = hidden[:, 0]
        else:
            real = ids != self.config.pad_id  # (B, T)
            if hidden.size(1) != ids.size(1):
                real = pool_mask(real, len(self.pool_layers))  # (B, T')
            real = real.unsqueeze(-1).to(hidden.dtype)  # (B, T, 1)
            h = (hidden * real).sum(1) / real.sum(1).clamp(min=1)
        return h if self.pooler is None else torch.tanh(self.pooler(h))

    def pooled(self, ids: torch.Tensor, segments: torch.Tensor | None = None) -> torch.Tensor:
        """The pooled representation `(B, C)` of ids `(B, T)`, the input of sentence-level classifiers."""
        return self.pool(self.encode(ids, segments), ids)

    def forward(
        self, ids: torch.Tensor, segments: torch.Tensor | None = None, chosen: torch.Tensor | None = None
    ) -> torch.Tensor:
        """The head's output for ids `(B, T)` long (see the class docstring for the shapes).

        chosen: bool `(B, T)`, for the per-position heads ("mlm", "token"): the output at those
        positions only, `(N, V)` or `(N, L)` in row-major order. Masked-LM training scores the
        chosen tokens alone, and the vocabulary projection everywhere else would be ~7x the work;
        passing them here, rather than calling `encode` and `head` apart, keeps the whole step in
        `forward`, which is what `torch.compile(model)` compiles."""
        if chosen is not None and self.config.head not in ("mlm", "token"):
            raise ValueError(f"chosen positions need a per-position head (mlm, token), not {self.config.head!r}")
        hidden = self.encode(ids, segments)  # (B, T, C)
        if self.head is None:
            return hidden
        if self.config.head == "sequence":
            return self.head(self.pool(hidden, ids))  # (B, L)
        if chosen is not None:
            hidden = hidden[chosen]  # (N, C)
        return self.head(hidden)  # (B, T, V) or (B, T, L); (N, V) or (N, L) when chosen

    @torch.no_grad()
    def attention_weights(self, ids: torch.Tensor, segments: torch.Tensor | None = None) -> list[torch.Tensor]:
        """The per-head self-attention weights of every block for ids `(B, T)`: a list of `(B, H, T, T)`."""
        return self._run(ids, segments, need_weights=True)[1]

    def load_encoder(self, state_dict: Mapping[str, torch.Tensor]) -> list[str]:
        """Copy everything but the head (embeddings, blocks, pooler) from the state dict of another
        `Bert`, whatever its head; this model's head keeps its fresh initialisation (fine-tuning
        starts from a pre-trained encoder, §4), but for the transform of a "prediction" classifier
        (`head_transform`). Other `head.*` entries of `state_dict` are ignored.

        Returns the names of this model's encoder tensors that `state_dict` lacks, left as they are
        (a checkpoint saved without a pooler, say). Raises ValueError for a tensor whose shape
        differs, or an encoder tensor this model has no place for (another depth, another family).
        """
        own = {name: t for name, t in self.state_dict().items() if not name.startswith("head.")}
        for name, tensor in state_dict.items():
            if name.startswith("head."):
                continue
            if name not in own:
                raise ValueError(f"{name} is in the state dict but this Bert has no such tensor ({self.config})")
            if tuple(tensor.shape) != tuple(own[name].shape):
                raise ValueError(
                    f"{name} has shape {tuple(tensor.shape)} in the state dict but {tuple(own[name].shape)} "
                    "in this Bert; the two configs differ"
                )
        encoder = {name: t for name, t in state_dict.items() if name in own}
        self.load_state_dict(encoder | self.head_transform(state_dict), strict=False)
        return [name for name in own if name not in encoder]

    def head_transform(self, state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The tensors of `state_dict` that a "prediction" classifier's transform starts from: its
        `head.dense` and `head.norm`, where they have this head's shapes (a masked-LM head's
        transform, or another classifier's; never the label layer `head.proj`). transformers'
        `ModernBertForSequenceClassification.from_pretrained` of a masked-LM checkpoint does the
        same, the two heads' transforms having the same names. Empty for any other head."""
        if not isinstance(self.head, PredictionClassifierHead):
            return {}
        mine = {f"head.{name}": t for name, t in self.head.state_dict().items() if not name.startswith("proj.")}
        return {
            name: state_dict[name]
            for name, t in mine.items()
            if name in state_dict and state_dict[name].shape == t.shape
        }
