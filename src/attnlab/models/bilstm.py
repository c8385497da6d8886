"""The BiLSTM baseline for sentence classification and sequence tagging.

A bidirectional LSTM (Hochreiter & Schmidhuber 1997; Graves & Schmidhuber 2005) reads the sentence
both ways; position t is represented by [h→_t; h←_t], which has seen the whole sentence. Two heads:

- "sequence" (classification, e.g. SST-2): max-pooling over time of the top layer, then a linear
  layer, as in the BiLSTM-max sentence encoder of Conneau et al. 2017 (InferSent), who
  found max-pooling better than taking the last states or mean-pooling.
- "token" (tagging, e.g. UPOS): a linear layer at every position, the BiLSTM tagger of
  Plank et al. 2016 without its character model.

This is the pre-Transformer point of comparison for BERT fine-tuning on the same tasks (Devlin et
al. 2019 compare against ELMo, itself a BiLSTM). Inputs are right-padded with `pad_id`; the LSTM
runs on packed sequences, so padding never reaches a real position and the pooling skips it.

References:
- Hochreiter & Schmidhuber 1997, "Long Short-Term Memory".
- Conneau et al. 2017, "Supervised Learning of Universal Sentence Representations from Natural
  Language Inference Data" (BiLSTM with max-pooling).
- Plank, Søgaard & Goldberg 2016, "Multilingual Part-of-Speech Tagging with Bidirectional Long
  Short-Term Memory Models and Auxiliary Loss".

Shape legend: B batch, T time, E d_embed, H hidden (per direction), N n_labels.
"""

from dataclasses import dataclass

import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

HEADS = ("sequence", "token")


@dataclass(frozen=True)
class BiLSTMConfig:
    """Everything that fixes the shape and behaviour of a BiLSTM baseline. Validated on construction."""

    kind: str = "bilstm"
    """The model family; always "bilstm" (tasks dispatch on it)."""
    vocab_size: int = 8000
    """Number of token ids the embedding holds."""
    d_embed: int = 256
    """Width E of the token embeddings."""
    hidden: int = 256
    """Width H of each LSTM direction; positions are represented by 2H numbers."""
    n_layers: int = 2
    """Number of stacked bidirectional LSTM layers."""
    dropout: float = 0.3
    """Dropout on the embeddings, between stacked LSTM layers, and before the output layer."""
    pad_id: int = 0
    """Padding token id; its embedding is zero and the LSTM skips it."""
    head: str = "sequence"
    """"sequence": one prediction per sentence (B, N); "token": one per position (B, T, N)."""
    n_labels: int = 2
    """Number N of classes (sentence labels or tags)."""

    def __post_init__(self) -> None:
        if self.kind != "bilstm":
            raise ValueError(f"kind must be 'bilstm', got {self.kind!r}")
        if self.head not in HEADS:
            raise ValueError(f"head must be one of {list(HEADS)}, got {self.head!r}")
        for name in ("vocab_size", "d_embed", "hidden", "n_layers", "n_labels"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")
        if not 0 <= self.pad_id < self.vocab_size:
            raise ValueError(f"pad_id must be in [0, vocab_size={self.vocab_size}), got {self.pad_id}")


def padded_lengths(ids: torch.Tensor, pad_id: int) -> torch.Tensor:
    """Number of real tokens in each right-padded row of ids `(B, T)` -> `(B,)` long.

    Example: pad_id 0, ids `[[5, 6, 0], [0, 0, 0]]` -> `[2, 0]`. Raises ValueError on padding before
    a real token (left padding), which packing cannot represent.
    """
    real = ids != pad_id  # (B, T)
    lengths = real.sum(dim=1)
    prefix = torch.arange(ids.size(1), device=ids.device).unsqueeze(0) < lengths.unsqueeze(1)  # (B, T)
    if not torch.equal(real, prefix):
        raise ValueError(f"inputs must be right-padded: pad_id {pad_id} found before a real token")
    return lengths


class BiLSTM(nn.Module):
    """Embedding -> dropout -> stacked bidirectional LSTM -> head (see the module docstring)."""

    def __init__(self, config: BiLSTMConfig) -> None:
        super().__init__()
        self.config = config
        self.pad_id = config.pad_id
        between_layers = config.dropout if config.n_layers > 1 else 0.0  # nn.LSTM drops between layers only
        self.embedding = nn.Embedding(config.vocab_size, config.d_embed, padding_idx=config.pad_id)
        self.dropout = nn.Dropout(config.dropout)
        self.lstm = nn.LSTM(
            config.d_embed,
            config.hidden,
            config.n_layers,
            batch_first=True,
            dropout=between_layers,
            bidirectional=True,
        )
        self.output = nn.Linear(2 * config.hidden, config.n_labels)

    def encode(self, ids: torch.Tensor, segments: torch.Tensor | None = None) -> torch.Tensor:
        """Top-layer states `(B, T, 2H)` for right-padded ids `(B, T)` long; zeros at padding.

        `segments` is ignored: it is accepted so that a task can call every encoder the same way
        (BERT takes segment ids). A row of padding only is read as one pad token, so it gets finite
        states at position 0 instead of breaking the packing (which needs lengths >= 1).
        """
        states, _ = self._encode(ids)
        return states

    def forward(self, ids: torch.Tensor, segments: torch.Tensor | None = None) -> torch.Tensor:
        """Logits: `(B, N)` with the "sequence" head, `(B, T, N)` with the "token" head.

        With the token head, logits at padded positions are those of a zero state; the loss must
        ignore them (the task sets their labels to the ignore index). `segments` is ignored.
        """
        states, lengths = self._encode(ids)  # (B, T, 2H), (B,)
        if self.config.head == "token":
            return self.output(self.dropout(states))  # (B, T, N)
        # Max over the real positions only: a pad position's zeros would otherwise win over
        # negative states.
        real = torch.arange(ids.size(1), device=ids.device).unsqueeze(0) < lengths.unsqueeze(1)  # (B, T)
        pooled = states.masked_fill(~real.unsqueeze(-1), float("-inf")).amax(dim=1)  # (B, 2H)
        return self.output(self.dropout(pooled))  # (B, N)

    def _encode(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """States `(B, T, 2H)` and the lengths `(B,)` the LSTM ran over (at least 1, see encode)."""
        lengths = padded_lengths(ids, self.pad_id).clamp(min=1)
        x = self.dropout(self.embedding(ids))  # (B, T, E)
        packed = pack_padded_sequence(x, lengths.cpu(), batch_first=True, enforce_sorted=False)
        out, _ = self.lstm(packed)
        out, _ = pad_packed_sequence(out, batch_first=True, total_length=ids.size(1))  # (B, T, 2H)
        return out, lengths
