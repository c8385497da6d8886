"""The recurrent language models measured beside the GPT: `RNNLM` (a GRU stack) and `AttentionRNNLM`
(each GRU layer followed by additive attention over its earlier states); `build_model` by name.

Legend: t sequence length, k width, d layers, V vocabulary, B batch (1 here).
"""

from dataclasses import dataclass

import torch
from torch import nn

from attnlab.models import GPT, GPTConfig
from attnlab.models.rnn import AdditiveAttention
from attnlab.studies.cost.settings import ALL_MODELS, ATTENTION_CHUNK, TRANSFORMERS, VOCAB, CostSettings


@dataclass(frozen=True)
class RNNLMConfig:
    """The shape of `RNNLM` and `AttentionRNNLM`; `block_size` is what `attnlab.decode` reads: the
    longest sequence the generation state is allocated for."""

    vocab_size: int
    d_model: int
    """Width k."""
    n_layers: int
    """Layers d."""
    block_size: int


@dataclass
class RNNCarry:
    """The generation state of `RNNLM`: the hidden state of every layer `(d, B, k)`, nothing more
    (test memory k·d)."""

    hidden: torch.Tensor | None = None


class RNNLM(nn.Module):
    """Embedding, a d-layer GRU of width k, a linear head. `forward(idx (B, T))` -> logits `(B, T, V)`.

    A `attnlab.models.protocols.CausalDecoder`, so `attnlab.decode` steps it as it steps a GPT.
    """

    def __init__(self, config: RNNLMConfig) -> None:
        super().__init__()
        self.config = config
        k = config.d_model
        self.embedding = nn.Embedding(config.vocab_size, k)
        self.rnn = nn.GRU(k, k, config.n_layers, batch_first=True)
        self.head = nn.Linear(k, config.vocab_size)

    def new_cache(self, batch_size: int, max_len: int | None = None) -> RNNCarry:
        return RNNCarry()

    def forward(
        self,
        idx: torch.Tensor,
        *,
        cache: RNNCarry | None = None,
        positions: torch.Tensor | None = None,
        last_only: bool = False,
    ) -> torch.Tensor:
        """Logits `(B, T, V)` for idx `(B, T)` long, or `(B, 1, V)` with `last_only`. With `cache`
        the GRU starts from its state and leaves its new state there; `positions` are not needed
        (the state knows where it is) and accepted for the decoding interface."""
        h, hidden = self.rnn(self.embedding(idx), None if cache is None else cache.hidden)  # (B, T, k)
        if cache is not None:
            cache.hidden = hidden  # (d, B, k)
        if last_only:
            h = h[:, -1:]
        return self.head(h)


@dataclass
class AttentionCarry:
    """What one `AttentionRNNLayer` carries while generating: its GRU state, and every state so far
    with its attention key, preallocated for `max_len` positions (test memory t·k per layer)."""

    states: torch.Tensor
    """h_1..h_max_len `(B, max_len, k)`; the first `length` are filled."""
    keys: torch.Tensor
    """U_a h_j `(B, max_len, k)`."""
    visible: torch.Tensor
    """All True `(B, max_len)`: every filled state may be attended to."""
    hidden: torch.Tensor | None = None
    length: int = 0


class AttentionRNNLayer(nn.Module):
    """One GRU layer, then additive attention of each state h_i over h_1..h_i of the same layer,
    combined as h̃_i = tanh(W_c [c_i; h_i]) (Luong et al. 2015, Eq. 5). x `(1, T, k)` -> `(1, T, k)`.

    Additive attention keeps tanh(W_a h_i + U_a h_j) for every pair j <= i for the backward pass:
    t²·k memory in training, the t² term of the lectures' table.
    """

    def __init__(self, width: int) -> None:
        super().__init__()
        self.gru = nn.GRU(width, width, batch_first=True)
        self.attention = AdditiveAttention(width, width, width)
        self.combine = nn.Linear(2 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.size(0) != 1:
            raise ValueError(f"AttentionRNNLayer runs one sequence at a time, got a batch of {x.size(0)}")
        h, _ = self.gru(x)  # (1, T, k)
        keys = self.attention.keys(h)  # (1, T, k)
        t = h.size(1)
        contexts = []
        # Query positions in chunks, each chunk a batch of one-query problems over the states up to
        # its last position: the saved tensors cover about t²/2 pairs, not t².
        for start in range(0, t, ATTENTION_CHUNK):
            end = min(start + ATTENTION_CHUNK, t)
            n = end - start
            visible = torch.arange(end, device=x.device)[None, :] <= torch.arange(start, end, device=x.device)[:, None]
            c, _ = self.attention(
                h[0, start:end], keys[:, :end].expand(n, -1, -1), h[:, :end].expand(n, -1, -1), visible
            )  # (n, k)
            contexts.append(c)
        c = torch.cat(contexts).unsqueeze(0)  # (1, T, k)
        return torch.tanh(self.combine(torch.cat([c, h], dim=-1)))

    def new_carry(self, batch_size: int, max_len: int, like: torch.Tensor) -> AttentionCarry:
        shape = (batch_size, max_len, self.combine.out_features)
        return AttentionCarry(
            states=like.new_zeros(shape),
            keys=like.new_zeros(shape),
            visible=torch.ones(batch_size, max_len, dtype=torch.bool, device=like.device),
        )

    def step(self, x: torch.Tensor, carry: AttentionCarry) -> torch.Tensor:
        """One position: x `(B, 1, k)` -> h̃ `(B, 1, k)`; stores h_i and U_a h_i in `carry`."""
        h, carry.hidden = self.gru(x, carry.hidden)  # (B, 1, k)
        i = carry.length
        if i >= carry.states.size(1):
            raise ValueError(f"generation state overflow: position {i} >= max_len {carry.states.size(1)}")
        carry.states[:, i] = h[:, 0]
        carry.keys[:, i] = self.attention.keys(h[:, 0])
        carry.length = i + 1
        end = i + 1
        c, _ = self.attention(h[:, 0], carry.keys[:, :end], carry.states[:, :end], carry.visible[:, :end])  # (B, k)
        return torch.tanh(self.combine(torch.cat([c, h[:, 0]], dim=-1))).unsqueeze(1)


class AttentionRNNLM(nn.Module):
    """Embedding, d `AttentionRNNLayer`s of width k, a linear head: `RNNLM` plus attention over all
    previous states. `forward(idx (1, T))` -> logits `(1, T, V)`; the decoding interface as `RNNLM`."""

    def __init__(self, config: RNNLMConfig) -> None:
        super().__init__()
        self.config = config
        k = config.d_model
        self.embedding = nn.Embedding(config.vocab_size, k)
        self.layers = nn.ModuleList(AttentionRNNLayer(k) for _ in range(config.n_layers))
        self.head = nn.Linear(k, config.vocab_size)

    def new_cache(self, batch_size: int, max_len: int | None = None) -> list[AttentionCarry]:
        max_len = self.config.block_size if max_len is None else max_len
        return [layer.new_carry(batch_size, max_len, self.head.weight) for layer in self.layers]

    def forward(
        self,
        idx: torch.Tensor,
        *,
        cache: list[AttentionCarry] | None = None,
        positions: torch.Tensor | None = None,
        last_only: bool = False,
    ) -> torch.Tensor:
        """As `RNNLM.forward`; with `cache` the tokens of idx are fed one at a time."""
        x = self.embedding(idx)  # (B, T, k)
        if cache is None:
            for layer in self.layers:
                x = layer(x)
        else:
            steps = []
            for i in range(x.size(1)):
                y = x[:, i : i + 1]
                for layer, carry in zip(self.layers, cache, strict=True):
                    y = layer.step(y, carry)
                steps.append(y)
            x = torch.cat(steps, dim=1)
        if last_only:
            x = x[:, -1:]
        return self.head(x)


def build_model(name: str, settings: CostSettings, max_len: int) -> nn.Module:
    """One of ALL_MODELS with the width and depth of `settings`, for sequences up to `max_len` tokens."""
    if name in TRANSFORMERS:
        return GPT(
            GPTConfig(
                vocab_size=VOCAB,
                block_size=max_len,
                n_layers=settings.layers,
                n_heads=settings.heads,
                d_model=settings.width,
                positions="sinusoidal",  # no parameters that grow with t
                attention=TRANSFORMERS[name],
                attention_window=settings.attention_window,
                attention_block=settings.attention_block,
                global_blocks=settings.global_blocks,
                random_blocks=settings.random_blocks,
            )
        )
    config = RNNLMConfig(vocab_size=VOCAB, d_model=settings.width, n_layers=settings.layers, block_size=max_len)
    if name == "rnn":
        return RNNLM(config)
    if name == "rnn-attention":
        return AttentionRNNLM(config)
    raise ValueError(f"model must be one of {ALL_MODELS}, got {name!r}")
