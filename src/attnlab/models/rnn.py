"""RNN encoder–decoders: the baselines the Transformer replaced.

Two models, in the order the field built them:

- `GRUSeq2Seq` (kind "gru"): the RNN encoder–decoder of Cho et al. 2014. The encoder reads the
  source into one fixed-size vector c, its final hidden state; the decoder starts from c and sees
  c again at every step, but never the individual source positions. Every sentence, short or
  long, must squeeze through that one vector: the "single vector bottleneck" of the lectures.
- `AttentionGRUSeq2Seq` (kind "gru-attention"): Bahdanau et al. 2015. A bidirectional encoder
  keeps one annotation h_j per source token, and at every step the decoder computes a fresh
  context c_i = Σ_j α_ij h_j with additive attention, so the bottleneck is gone. The α are the
  first soft alignments between a translation and its source.

Both implement the `Seq2SeqModel` protocol of `models/protocols.py` (teacher-forced `forward`,
incremental `start` / `step`, `cross_attention`), so the trainer, greedy decoding and beam
search that serve the Transformer serve them too.

Both read out through the papers' "deep output" (Cho et al. Appendix A.1; Bahdanau et al.
Appendix A.2.2): a maxout layer of width `readout_size` over [state; context; previous
embedding], then the vocabulary projection. Besides following the papers, it keeps the widest
matrix of the model at readout_size × V instead of (2H + E) × V, which dominates the cost on a CPU.
Simplifications: the Cho et al. decoder starts from c itself (not tanh(V' c)), and weights keep
PyTorch's default initialisation. With `n_layers > 1` the GRUs are stacked; the attention
queries the top layer of the decoder.

Sources are right-padded with `pad_id`; the encoders run on packed sequences, so the number of
pad tokens after a sentence never changes its result.

References:
- Cho et al. 2014, "Learning Phrase Representations using RNN Encoder–Decoder for Statistical
  Machine Translation" (§2.2, Eq. 5–6 for the GRU; Appendix A.1 for the decoder).
- Bahdanau, Cho & Bengio 2015, "Neural Machine Translation by Jointly Learning to Align and
  Translate" (§3.1 decoder, §3.2 encoder, Appendix A.1.2 alignment model, A.2.2 initial state).

Shape legend: B batch, S source length, T target length, V vocab, E emb_dim, H hidden_size,
L n_layers, A attention width (= H, as in Bahdanau et al.).
"""

from dataclasses import dataclass

import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

KINDS = ("gru", "gru-attention")


@dataclass(frozen=True)
class RNNConfig:
    """Everything that fixes the shape and behaviour of an RNN baseline. Validated on construction."""

    kind: str = "gru-attention"
    """"gru": Cho et al. 2014, no attention; "gru-attention": Bahdanau et al. 2015."""
    vocab_size: int | None = None
    """Size of the vocabulary shared by source and target. None while waiting for the tokenizer."""
    emb_dim: int = 256
    """Width E of the token embeddings."""
    hidden_size: int = 512
    """Width H of every GRU state (per direction in the bidirectional encoder)."""
    readout_size: int = 256
    """Width l of the maxout layer before the vocabulary projection (the papers: 500)."""
    n_layers: int = 1
    """Number of stacked GRU layers, in the encoder and in the decoder."""
    dropout: float = 0.3
    """Dropout on the embeddings, between stacked GRU layers, and on the decoder output."""
    pad_id: int = 0
    """Padding token id; its embedding is zero and the encoders skip it."""
    tie_embeddings: bool = False
    """Share one embedding matrix between source and target (sensible with a joint vocabulary)."""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {list(KINDS)}, got {self.kind!r}")
        if self.vocab_size is not None and self.vocab_size < 1:
            raise ValueError(f"vocab_size must be None or >= 1, got {self.vocab_size}")
        for name in ("emb_dim", "hidden_size", "readout_size", "n_layers"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")
        if self.pad_id < 0 or (self.vocab_size is not None and self.pad_id >= self.vocab_size):
            raise ValueError(f"pad_id must be in [0, vocab_size), got {self.pad_id} (vocab_size {self.vocab_size})")


# --- shared pieces ----------------------------------------------------------------------------


def source_lengths(src: torch.Tensor, pad_id: int) -> torch.Tensor:
    """Number of real tokens in each right-padded source `(B, S)` -> `(B,)` long.

    Example: pad_id 0, src `[[5, 6, 0], [7, 0, 0]]` -> `[2, 1]`. Raises ValueError when a source
    is empty or has padding before a real token (left padding), which packing cannot represent.
    """
    real = src != pad_id  # (B, S)
    lengths = real.sum(dim=1)
    if bool((lengths == 0).any()):
        raise ValueError("every source needs at least one token that is not pad_id")
    prefix = torch.arange(src.size(1), device=src.device).unsqueeze(0) < lengths.unsqueeze(1)  # (B, S)
    if not torch.equal(real, prefix):
        raise ValueError(f"sources must be right-padded: pad_id {pad_id} found before a real token")
    return lengths


def run_packed(rnn: nn.GRU, x: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Run `rnn` over the first `lengths[b]` steps of each row of x `(B, S, E)`.

    Returns the outputs `(B, S, D)` (zeros at padded positions; D = H, or 2H if bidirectional)
    and the final states `(L * directions, B, H)`, taken at each row's own last real token.
    """
    packed = pack_padded_sequence(x, lengths.cpu(), batch_first=True, enforce_sorted=False)
    out, h_n = rnn(packed)
    out, _ = pad_packed_sequence(out, batch_first=True, total_length=x.size(1))  # (B, S, D)
    return out, h_n


def _select_rows(t: torch.Tensor, index: torch.Tensor, dim: int) -> torch.Tensor:
    """Rows `index` `(B',)` of t along its batch dimension `dim`."""
    return t.index_select(dim, torch.as_tensor(index, dtype=torch.long, device=t.device))


# --- Cho et al. 2014: the encoder–decoder without attention --------------------------------------


@dataclass
class GRUState:
    """Decoder state of `GRUSeq2Seq`. It holds no per-source-token tensor: after the encoder has
    run, the source is present only as the context c. This is the bottleneck."""

    hidden: torch.Tensor
    """Decoder GRU state `(L, B, H)`; batch is dimension 1, as nn.GRU wants it."""
    context: torch.Tensor
    """The summary c of the source `(B, H)`: the encoder's final top-layer state."""

    def select(self, index: torch.Tensor, *, same_source: bool = False) -> None:
        """Keep and reorder batch rows in place: index `(B',)` long (see DecoderState.select)."""
        self.hidden = _select_rows(self.hidden, index, dim=1)
        if not same_source:
            self.context = _select_rows(self.context, index, dim=0)


class DeepOutput(nn.Module):
    """t = maxout(W x) with pools of two units, width l; logits = W_o t. x `(..., in)` -> `(..., V)`."""

    def __init__(self, in_features: int, width: int, vocab_size: int) -> None:
        super().__init__()
        self.width = width
        self.hidden = nn.Linear(in_features, 2 * width)
        self.output = nn.Linear(width, vocab_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pooled = self.hidden(x).unflatten(-1, (self.width, 2)).amax(dim=-1)  # (..., l)
        return self.output(pooled)


def embeddings(config: RNNConfig) -> tuple[nn.Embedding, nn.Embedding]:
    """Source and target embeddings of a joint vocabulary, one shared matrix with tie_embeddings."""
    src = nn.Embedding(config.vocab_size, config.emb_dim, padding_idx=config.pad_id)
    tgt = nn.Embedding(config.vocab_size, config.emb_dim, padding_idx=config.pad_id)
    if config.tie_embeddings:
        tgt.weight = src.weight
    return src, tgt


class GRUSeq2Seq(nn.Module):
    """RNN encoder–decoder with a single context vector (Cho et al. 2014, Fig. 1).

    Encoder: GRU over the embedded source; c = its final hidden state.
    Decoder: h_t = GRU([emb(y_{t-1}); c], h_{t-1}) with h_0 = c (per layer: the encoder's final
    state of that layer), and logits = W_o [h_t; emb(y_{t-1}); c] (Cho et al. Appendix A.1).
    """

    def __init__(self, config: RNNConfig) -> None:
        super().__init__()
        if config.vocab_size is None:
            raise ValueError("RNNConfig.vocab_size is None: set it (it normally comes from the tokenizer)")
        self.config = config
        self.pad_id = config.pad_id
        V, E, H, L = config.vocab_size, config.emb_dim, config.hidden_size, config.n_layers
        between_layers = config.dropout if L > 1 else 0.0  # nn.GRU applies it between stacked layers only
        self.src_embedding, self.tgt_embedding = embeddings(config)
        self.dropout = nn.Dropout(config.dropout)
        self.encoder = nn.GRU(E, H, L, batch_first=True, dropout=between_layers)
        self.decoder = nn.GRU(E + H, H, L, batch_first=True, dropout=between_layers)
        self.readout = DeepOutput(H + E + H, config.readout_size, V)

    def start(self, src: torch.Tensor, max_len: int) -> GRUState:
        """Encode src `(B, S)` long into the context. `max_len` is unused: an RNN state has no length limit."""
        lengths = source_lengths(src, self.pad_id)
        x = self.dropout(self.src_embedding(src))  # (B, S, E)
        _, h_n = run_packed(self.encoder, x, lengths)  # (L, B, H); the outputs are thrown away
        return GRUState(hidden=h_n, context=h_n[-1])

    def _decode(self, emb: torch.Tensor, state: GRUState) -> tuple[torch.Tensor, torch.Tensor]:
        """Run the decoder over emb `(B, T, E)` from `state`; returns logits `(B, T, V)`, new hidden `(L, B, H)`.

        Teacher forcing knows every input in advance, so T steps run in one nn.GRU call; `step`
        calls this with T = 1.
        """
        c = state.context.unsqueeze(1).expand(-1, emb.size(1), -1)  # (B, T, H)
        h, hidden = self.decoder(torch.cat([emb, c], dim=-1), state.hidden)  # (B, T, H), (L, B, H)
        logits = self.readout(torch.cat([self.dropout(h), emb, c], dim=-1))  # (B, T, V)
        return logits, hidden

    def step(self, tokens: torch.Tensor, state: GRUState) -> torch.Tensor:
        """Feed the previous target tokens `(B,)` long; return next-token logits `(B, V)`; advance state."""
        emb = self.dropout(self.tgt_embedding(tokens)).unsqueeze(1)  # (B, 1, E)
        logits, state.hidden = self._decode(emb, state)
        return logits.squeeze(1)  # (B, V)

    def forward(self, src: torch.Tensor, tgt_in: torch.Tensor) -> torch.Tensor:
        """Teacher-forced logits `(B, T, V)` for source ids `(B, S)` and decoder input ids `(B, T)`."""
        state = self.start(src, max_len=tgt_in.size(1))
        logits, _ = self._decode(self.dropout(self.tgt_embedding(tgt_in)), state)
        return logits

    def cross_attention(self, src: torch.Tensor, tgt_in: torch.Tensor) -> torch.Tensor:
        """Uniform weights `(B, T, S)`: 1/length on every real source token, 0 on padding.

        This model has no attention: each target word depends on every source token only through
        the one vector c, so no source token weighs more than another. Uniform rows say exactly
        that in an attention picture, instead of inventing an alignment.
        """
        lengths = source_lengths(src, self.pad_id)
        real = (src != self.pad_id).float()  # (B, S)
        weights = real / lengths.unsqueeze(1).float()  # (B, S)
        return weights.unsqueeze(1).expand(-1, tgt_in.size(1), -1)  # (B, T, S)


# --- Bahdanau et al. 2015: the encoder–decoder with additive attention ---------------------------


class AdditiveAttention(nn.Module):
    """The alignment model of Bahdanau et al. 2015, Appendix A.1.2:

        e_ij = v_aᵀ tanh(W_a s_{i-1} + U_a h_j),   α_ij = softmax_j(e_ij),   c_i = Σ_j α_ij h_j.

    U_a h_j does not depend on i, so `keys` computes it once per sentence (the paper's own
    advice) and `forward` adds W_a s_{i-1} at each step.
    """

    def __init__(self, query_size: int, memory_size: int, attention_size: int) -> None:
        super().__init__()
        self.W_a = nn.Linear(query_size, attention_size, bias=False)
        self.U_a = nn.Linear(memory_size, attention_size, bias=False)
        self.v_a = nn.Linear(attention_size, 1, bias=False)

    def keys(self, memory: torch.Tensor) -> torch.Tensor:
        """U_a h_j for annotations memory `(B, S, 2H)` -> `(B, S, A)`."""
        return self.U_a(memory)

    def forward(
        self, query: torch.Tensor, keys: torch.Tensor, memory: torch.Tensor, mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One step of attention.

        query s_{i-1} `(B, H)`, keys U_a h_j `(B, S, A)`, memory h_j `(B, S, 2H)`, mask bool
        `(B, S)` (True = may attend). Returns the context c_i `(B, 2H)` and the weights α_i `(B, S)`,
        exactly 0 where the mask is False.
        """
        energies = self.v_a(torch.tanh(self.W_a(query).unsqueeze(1) + keys)).squeeze(-1)  # (B, S)
        energies = energies.masked_fill(~mask, float("-inf"))
        alpha = torch.softmax(energies, dim=-1)  # (B, S)
        context = torch.bmm(alpha.unsqueeze(1), memory).squeeze(1)  # (B, 1, S) @ (B, S, 2H) -> (B, 2H)
        return context, alpha


@dataclass
class AttentionGRUState:
    """Decoder state of `AttentionGRUSeq2Seq`: the decoder GRU state and the encoded source."""

    hidden: torch.Tensor
    """Decoder GRU state `(L, B, H)`; batch is dimension 1, as nn.GRU wants it. hidden[-1] is s_{i-1}."""
    memory: torch.Tensor
    """Annotations h_j = [h→_j; h←_j] `(B, S, 2H)`, zero at padding."""
    keys: torch.Tensor
    """U_a h_j, precomputed once per sentence `(B, S, A)`."""
    mask: torch.Tensor
    """Source mask `(B, S)` bool, True = a real token (may attend)."""

    def select(self, index: torch.Tensor, *, same_source: bool = False) -> None:
        """Keep and reorder batch rows in place: index `(B',)` long (see DecoderState.select)."""
        self.hidden = _select_rows(self.hidden, index, dim=1)
        if not same_source:
            self.memory = _select_rows(self.memory, index, dim=0)
            self.keys = _select_rows(self.keys, index, dim=0)
            self.mask = _select_rows(self.mask, index, dim=0)


class AttentionGRUSeq2Seq(nn.Module):
    """RNN encoder–decoder with additive attention (Bahdanau et al. 2015, Fig. 1).

    Encoder: bidirectional GRU; annotation h_j = [h→_j; h←_j] (§3.2).
    Initial state: s_0 = tanh(W_s [h→_last; h←_first]), per layer (Appendix A.2.2 uses h←_1 alone;
    we give it both ends, as most reimplementations do).
    Decoder: s_i = GRU([emb(y_{i-1}); c_i], s_{i-1}), where c_i attends with s_{i-1} (§3.1);
    logits = W_o [s_i; c_i; emb(y_{i-1})].
    """

    def __init__(self, config: RNNConfig) -> None:
        super().__init__()
        if config.vocab_size is None:
            raise ValueError("RNNConfig.vocab_size is None: set it (it normally comes from the tokenizer)")
        self.config = config
        self.pad_id = config.pad_id
        V, E, H, L = config.vocab_size, config.emb_dim, config.hidden_size, config.n_layers
        between_layers = config.dropout if L > 1 else 0.0  # nn.GRU applies it between stacked layers only
        self.src_embedding, self.tgt_embedding = embeddings(config)
        self.dropout = nn.Dropout(config.dropout)
        self.encoder = nn.GRU(E, H, L, batch_first=True, dropout=between_layers, bidirectional=True)
        self.bridge = nn.Linear(2 * H, H)  # W_s: encoder ends -> s_0
        self.attention = AdditiveAttention(query_size=H, memory_size=2 * H, attention_size=H)
        self.decoder = nn.GRU(E + 2 * H, H, L, batch_first=True, dropout=between_layers)
        self.readout = DeepOutput(H + 2 * H + E, config.readout_size, V)

    def start(self, src: torch.Tensor, max_len: int) -> AttentionGRUState:
        """Encode src `(B, S)` long into annotations and s_0. `max_len` is unused: an RNN state has no length limit."""
        lengths = source_lengths(src, self.pad_id)
        x = self.dropout(self.src_embedding(src))  # (B, S, E)
        memory, h_n = run_packed(self.encoder, x, lengths)  # (B, S, 2H), (L * 2, B, H)
        L, B, H = self.config.n_layers, src.size(0), self.config.hidden_size
        ends = h_n.view(L, 2, B, H)  # (L, direction, B, H): forward ends at the last token, backward at the first
        hidden = torch.tanh(self.bridge(torch.cat([ends[:, 0], ends[:, 1]], dim=-1)))  # (L, B, H)
        return AttentionGRUState(
            hidden=hidden, memory=memory, keys=self.attention.keys(memory), mask=src != self.pad_id
        )

    def _step(self, emb: torch.Tensor, state: AttentionGRUState) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One decoder step from emb(y_{i-1}) `(B, E)`.

        Returns logits `(B, V)`, α_i `(B, S)` and the new hidden `(L, B, H)`; `state` is only read.
        """
        context, alpha = self.attention(state.hidden[-1], state.keys, state.memory, state.mask)  # (B, 2H), (B, S)
        gru_in = torch.cat([emb, context], dim=-1).unsqueeze(1)  # (B, 1, E + 2H)
        s, hidden = self.decoder(gru_in, state.hidden)  # (B, 1, H), (L, B, H)
        logits = self.readout(torch.cat([self.dropout(s.squeeze(1)), context, emb], dim=-1))  # (B, V)
        return logits, alpha, hidden

    def step(self, tokens: torch.Tensor, state: AttentionGRUState) -> torch.Tensor:
        """Feed the previous target tokens `(B,)` long; return next-token logits `(B, V)`; advance state."""
        logits, _, state.hidden = self._step(self.dropout(self.tgt_embedding(tokens)), state)
        return logits

    def _teacher_forced(self, src: torch.Tensor, tgt_in: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits `(B, T, V)` and attention weights `(B, T, S)`, one `_step` per target position.

        c_i depends on s_{i-1}, so unlike `GRUSeq2Seq` the steps cannot be batched over time.
        """
        state = self.start(src, max_len=tgt_in.size(1))
        emb = self.dropout(self.tgt_embedding(tgt_in))  # (B, T, E)
        all_logits, alphas = [], []
        for t in range(tgt_in.size(1)):
            logits, alpha, state.hidden = self._step(emb[:, t], state)
            all_logits.append(logits)
            alphas.append(alpha)
        return torch.stack(all_logits, dim=1), torch.stack(alphas, dim=1)  # (B, T, V), (B, T, S)

    def forward(self, src: torch.Tensor, tgt_in: torch.Tensor) -> torch.Tensor:
        """Teacher-forced logits `(B, T, V)` for source ids `(B, S)` and decoder input ids `(B, T)`."""
        logits, _ = self._teacher_forced(src, tgt_in)
        return logits

    def cross_attention(self, src: torch.Tensor, tgt_in: torch.Tensor) -> torch.Tensor:
        """The alignment α `(B, T, S)` under teacher forcing: row t is where the decoder looked to
        predict the token after tgt_in[:, t]. Rows sum to 1; padded source positions get exactly 0."""
        _, alphas = self._teacher_forced(src, tgt_in)
        return alphas


# --- construction ----------------------------------------------------------------------------------

RNN_MODELS: dict[str, type[nn.Module]] = {
    "gru": GRUSeq2Seq,
    "gru-attention": AttentionGRUSeq2Seq,
}


def build_rnn(config: RNNConfig) -> GRUSeq2Seq | AttentionGRUSeq2Seq:
    """The RNN baseline named by `config.kind` (see RNN_MODELS)."""
    return RNN_MODELS[config.kind](config)
