"""A Transformer encoder over the nodes of a graph: the same attention as GAT, with and without the graph.

All N nodes form one sequence; each node's features are projected to the model width and go
through attnlab's own encoder blocks (`attnlab.nn.TransformerBlock`, scaled dot-product attention,
Vaswani et al. 2017). There are no positions: the order of the nodes means nothing, so the model
is permutation-equivariant, as GAT is. Two variants, chosen by `attention`:

- "full": every node attends to every node. The model never sees an edge: it is graph-blind, and
  can only learn from the features what the graph would have told it.
- "neighbours": node i attends to j only along an edge j → i and to itself (`adjacency_mask`):
  masked self-attention over N_i, the setting of GAT §2.1, with dot-product instead of additive
  scores and a feed-forward block after each attention.

The lecture's claim, "self-attention extends naturally to graphs", becomes a measurement: the same
blocks, with and without the mask.

Attention over all N nodes is N × N per head: fine for Cora and Citeseer (a few thousand nodes),
not for large graphs; GAT is the edge-list way to do the masked variant.

Shape legend: N nodes, F input features, C model width, L classes.
"""

from dataclasses import dataclass

import torch
from torch import nn

from attnlab.nn import ACTIVATIONS, NORM_ORDERS, TransformerBlock, normal_init
from attnlab.nn.graph import dropout, sparse_linear
from attnlab.nn.masks import adjacency_mask

ATTENTION = ("full", "neighbours")


@dataclass(frozen=True)
class NodeTransformerConfig:
    """The shape of a node Transformer; validated on construction."""

    kind: str = "transformer"
    """Always "transformer": lets the node-classification task pick the model family by `model.kind`."""
    n_features: int = 0
    """Input features per node; 0 until the task fills it in from the data."""
    n_classes: int = 0
    """Output classes L; 0 until the task fills it in from the data."""
    attention: str = "full"
    """"full" (every node attends to every node: graph-blind) or "neighbours" (along the edges and
    to itself only)."""
    d_model: int = 64
    """Model width C."""
    n_heads: int = 1
    """Attention heads per block; must divide d_model. Each head costs N × N scores per block (the
    softmax over 2,708 Cora nodes: 7.3 million per head), so 1 head: 8 heads of 8 features, as GAT's,
    make an epoch several times as long (docs/history.md, "Graph attention on Cora and Citeseer")."""
    n_layers: int = 2
    """Encoder blocks."""
    d_ff: int = 128
    """Feed-forward hidden width."""
    dropout: float = 0.6
    """Dropout on the input features and on the classifier's input, as GAT's on its layers' inputs."""
    block_dropout: float = 0.0
    """Dropout inside the blocks: on the attention weights and the residual branches. Off by default:
    dropout on N × N attention weights takes PyTorch off its fused attention kernel and draws N²
    random numbers per head and block (what it costs: docs/history.md, "Graph attention on Cora and
    Citeseer")."""
    activation: str = "gelu"
    """Feed-forward non-linearity, one of attnlab.nn.ACTIVATIONS."""
    norm: str = "pre"
    """LayerNorm order of the blocks: "pre" (with a final LayerNorm) or "post"."""

    def __post_init__(self) -> None:
        if self.kind != "transformer":
            raise ValueError(f"kind must be 'transformer', got {self.kind!r}")
        if self.attention not in ATTENTION:
            raise ValueError(f"attention must be one of {list(ATTENTION)}, got {self.attention!r}")
        for name in ("n_features", "n_classes"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0 (0: from the data), got {getattr(self, name)}")
        for name in ("d_model", "n_heads", "n_layers", "d_ff"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.d_model % self.n_heads != 0:
            raise ValueError(f"d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads})")
        for name in ("dropout", "block_dropout"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"{name} must be in [0, 1), got {getattr(self, name)}")
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)}, got {self.activation!r}")
        if self.norm not in NORM_ORDERS:
            raise ValueError(f"norm must be one of {list(NORM_ORDERS)}, got {self.norm!r}")


class NodeTransformer(nn.Module):
    """Input projection and LayerNorm, encoder blocks over the N nodes as one sequence, a linear classifier.

    forward(x `(N, n_features)` dense or sparse CSR, edge_index `(2, E)` both directions of each
    undirected edge, no self-loops; read only with attention = "neighbours") -> logits `(N, L)`.
    """

    def __init__(self, config: NodeTransformerConfig) -> None:
        super().__init__()
        if config.n_features < 1 or config.n_classes < 1:
            raise ValueError("NodeTransformerConfig.n_features and n_classes must be set (>= 1) to build a model")
        self.config = config
        c = config
        self.input = nn.Linear(c.n_features, c.d_model, bias=False)  # torch's Linear: it takes sparse CSR features
        # Row-normalised bag-of-words rows project to vectors of size ~0.01, which the attention
        # output, the same weighted mean for every node at the start, would drown in the residual
        # stream: the nodes could no longer be told apart and training stalls at the class prior
        # (docs/history.md, "Graph attention on Cora and Citeseer"). A LayerNorm on the projection
        # (as BERT's on its embeddings) puts each node's own vector at unit scale; no bias, which
        # would be the same vector for every node.
        self.input_norm = nn.LayerNorm(c.d_model)
        self.blocks = nn.ModuleList(
            TransformerBlock(
                c.d_model, c.n_heads, c.d_ff, dropout=c.block_dropout, activation=c.activation, norm=c.norm
            )
            for _ in range(c.n_layers)
        )
        # Post-norm blocks end in a LayerNorm already; a pre-norm stack needs one before the head.
        self.final_norm = nn.LayerNorm(c.d_model) if c.norm == "pre" else nn.Identity()
        self.head = nn.Linear(c.d_model, c.n_classes)
        self.apply(normal_init)  # GPT-2's and BERT's N(0, 0.02²): small residual branches at the start

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        n = x.size(0)
        # (1, 1, N, N): one sequence, the same mask for every head; None = every node sees every node.
        mask = adjacency_mask(edge_index, n)[None, None] if self.config.attention == "neighbours" else None
        h = sparse_linear(dropout(x, self.config.dropout, self.training), self.input.weight)
        h = self.input_norm(h).unsqueeze(0)  # (1, N, C)
        for block in self.blocks:
            h, _ = block(h, mask=mask)
        h = self.final_norm(h).squeeze(0)  # (N, C)
        return self.head(dropout(h, self.config.dropout, self.training))
