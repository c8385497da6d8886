"""GCN: graph convolutional networks (Kipf & Welling 2017), the baseline GAT is measured against.

Reads like §2 of the paper: config, the propagation rule, the model. A layer is

    H' = Â H W,   Â = D̃^-1/2 Ã D̃^-1/2,   Ã = A + I_N,   D̃_ii = Σ_j Ã_ij          (Eq. 2)

and the two-layer model of Eq. 9 is softmax(Â ReLU(Â X W⁰) W¹). Â is never made: each edge j → i
(self-loops included) carries the weight 1/√(d̃_i d̃_j), and the product Â (H W) is a sum over each
node's incoming edges, linear in the number of edges. Where GAT learns how much each neighbour
counts (α_ij), GCN fixes it from the degrees.

Shape legend: N nodes, E edges (self-loops included), F features, L classes.

References:
- Kipf & Welling 2017, "Semi-Supervised Classification with Graph Convolutional Networks" (ICLR),
  Eq. 2 and 9; §5.1 (16 hidden units, dropout 0.5, weight decay 5e-4, learning rate 0.01).
"""

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from attnlab.nn.graph import add_self_loops, dropout, in_degree, segment_sum, sparse_linear


@dataclass(frozen=True)
class GCNConfig:
    """The shape of a GCN; validated on construction. The defaults are the paper's (§5.1)."""

    kind: str = "gcn"
    """Always "gcn": lets the node-classification task pick the model family by `model.kind`."""
    n_features: int = 0
    """Input features per node; 0 until the task fills it in from the data."""
    n_classes: int = 0
    """Output classes L; 0 until the task fills it in from the data."""
    hidden: int = 16
    """Width of each hidden layer."""
    n_layers: int = 2
    """Graph convolutions, the output layer included."""
    dropout: float = 0.5
    """Dropout on each layer's input."""

    def __post_init__(self) -> None:
        if self.kind != "gcn":
            raise ValueError(f"kind must be 'gcn', got {self.kind!r}")
        for name in ("n_features", "n_classes"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0 (0: from the data), got {getattr(self, name)}")
        for name in ("hidden", "n_layers"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")


def normalised_adjacency(edge_index: torch.Tensor, n_nodes: int) -> torch.Tensor:
    """The entries of Â = D̃^-1/2 Ã D̃^-1/2 on the edges of Ã: `(E,)` float32, 1/√(d̃_i d̃_j) for edge
    j → i. edge_index `(2, E)` must hold the self-loops already (Ã = A + I_N), so no degree is 0."""
    source, target = edge_index
    inv_sqrt = in_degree(edge_index, n_nodes).rsqrt()  # the graph is undirected: in-degree = degree
    return inv_sqrt[target] * inv_sqrt[source]


class GraphConvolution(nn.Module):
    """One layer of Eq. 2 without its non-linearity: x `(N, in)` (dense or sparse CSR), the edges
    and their Â weights -> Â x W + b `(N, out)`."""

    def __init__(self, in_features: int, out_features: int) -> None:
        super().__init__()
        self.proj = nn.Linear(in_features, out_features, bias=False)
        self.bias = nn.Parameter(torch.zeros(out_features))
        nn.init.xavier_uniform_(self.proj.weight)  # Glorot, as the paper (§5.2)

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        h = sparse_linear(x, self.proj.weight)  # (N, out): X W first, the narrower product (F_out < F_in)
        source, target = edge_index
        return segment_sum(weights.unsqueeze(-1) * h[source], target, x.size(0)) + self.bias  # Â (X W)


class GCN(nn.Module):
    """Eq. 9 for any depth: (n_layers - 1) graph convolutions with ReLU, then one giving class scores.

    forward(x `(N, n_features)` dense or sparse CSR, edge_index `(2, E)` without self-loops, both
    directions of each undirected edge) -> logits `(N, n_classes)`.
    """

    def __init__(self, config: GCNConfig) -> None:
        super().__init__()
        if config.n_features < 1 or config.n_classes < 1:
            raise ValueError("GCNConfig.n_features and n_classes must be set (>= 1) to build a model")
        self.config = config
        widths = [config.n_features] + [config.hidden] * (config.n_layers - 1) + [config.n_classes]
        self.layers = nn.ModuleList(GraphConvolution(a, b) for a, b in zip(widths[:-1], widths[1:], strict=True))

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        n = x.size(0)
        edges = add_self_loops(edge_index, n)  # Ã = A + I_N
        weights = normalised_adjacency(edges, n)
        for i, layer in enumerate(self.layers):
            x = layer(dropout(x, self.config.dropout, self.training), edges, weights)
            if i < len(self.layers) - 1:
                x = F.relu(x)
        return x
