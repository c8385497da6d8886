"""Transparent attention (Bapna et al. 2018, §3): each decoder layer's encoder–decoder attention
reads its own learned mix of every encoder layer's output, the embedding included, rather than
the last layer's alone.

For decoder layer j, with x_0 the encoder's embedded input and x_1 … x_N its layers' outputs:

    memory_j = Σ_i softmax(W_{·j})_i x_i,    W `(N + 1, M)` learned,

a softmax over the encoder layers for each of the M decoder layers (Eq. 1). It shortens the
gradient path from the decoder to the lower encoder layers, which is what lets Bapna et al. train
deeper encoders.

Shape legend: B batch, S source length, C model dim, N encoder layers, M decoder layers.
"""

import torch
from torch import nn


class TransparentMix(nn.Module):
    """The M decoder layers' memories `[(B, S, C)] * M` of the encoder states `[(B, S, C)] * (N + 1)`."""

    def __init__(self, n_encoder_layers: int, n_decoder_layers: int) -> None:
        super().__init__()
        # Zero logits: every decoder layer starts from the mean of the encoder states.
        self.logits = nn.Parameter(torch.zeros(n_encoder_layers + 1, n_decoder_layers))

    def weights(self) -> torch.Tensor:
        """softmax over the encoder states for each decoder layer: `(N + 1, M)`, columns summing to 1."""
        return torch.softmax(self.logits, dim=0)

    def forward(self, states: list[torch.Tensor]) -> list[torch.Tensor]:
        if len(states) != self.logits.size(0):
            raise ValueError(f"expected {self.logits.size(0)} encoder states (embedding + layers), got {len(states)}")
        stacked = torch.stack(states, dim=-1)  # (B, S, C, N + 1)
        mixed = stacked @ self.weights().to(stacked.dtype)  # (B, S, C, M)
        return list(mixed.unbind(dim=-1))
