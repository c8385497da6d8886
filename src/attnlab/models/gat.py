"""GAT: graph attention networks (Veličković et al. 2018).

Reads top to bottom like §2.1 of the paper: config, the graph attentional layer, the model. Each
node i attends over its neighbourhood N_i (its neighbours and itself), K heads at a time:

    e_ij = LeakyReLU(aᵀ [W h_i ‖ W h_j])                        (Eq. 1, 3)
    α_ij = softmax_j(e_ij) = exp(e_ij) / Σ_{k∈N_i} exp(e_ik)   (Eq. 2, 3)
    h'_i = ‖_{k=1..K} σ(Σ_{j∈N_i} α^k_ij W^k h_j)               (Eq. 5: hidden layers concatenate heads)
    h'_i = σ((1/K) Σ_k Σ_{j∈N_i} α^k_ij W^k h_j)                (Eq. 6: the output layer averages them)

Computed over the edge list, never an N × N matrix: splitting a = [a_dst ‖ a_src] gives
aᵀ[W h_i ‖ W h_j] = a_dstᵀ W h_i + a_srcᵀ W h_j, two numbers per node and head, added per edge;
the softmax over N_i is a softmax over the edges that end in i (`segment_softmax`). Time and memory
are linear in the number of edges.

Shape legend: N nodes, E edges (self-loops included), H heads, F features per head, L classes.

Dropout follows the reference code, which is where the paper's numbers come from: its one-head
layer `attn_head` is called once per head, and each call drops its own input (a mask per head) and
drops the transformed features W h_j again where they are summed. PyTorch Geometric and DGL drop
each layer's input once for all heads and leave W h alone (`per_head_dropout = False`,
`feature_dropout = 0`). With the score bias as well (`score_bias`), the reference code's way is
the more accurate on both Cora and Citeseer and the dearer per training step; the figures, beside
PyTorch Geometric's, are in docs/tasks/graphs.md ("Results") and BENCHMARKS.md ("Graph attention").

References:
- Veličković et al. 2018, "Graph Attention Networks" (ICLR), §2.1 and §3.3 (Cora/Citeseer setup:
  two layers, 8 heads of 8 features, ELU, one output head, dropout 0.6 on both layers' inputs and
  on the normalised attention coefficients).
- PetarV-/GAT `utils/layers.py` (Glorot-initialised weights, the attention vectors as 1×1
  convolutions F -> 1, a bias after aggregation, the dropouts of `attn_head`).
"""

import math
import weakref
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from attnlab.nn.graph import (
    add_self_loops,
    dropout,
    segment_softmax,
    segment_sum,
    sparse_product,
    sparse_transpose,
)


@dataclass(frozen=True)
class GATConfig:
    """The shape of a GAT; validated on construction. The defaults are the paper's Cora/Citeseer model."""

    kind: str = "gat"
    """Always "gat": lets the node-classification task pick the model family by `model.kind`."""
    n_features: int = 0
    """Input features per node; 0 until the task fills it in from the data."""
    n_classes: int = 0
    """Output classes L; 0 until the task fills it in from the data."""
    hidden: int = 8
    """Features F' of each head of a hidden layer."""
    n_heads: int = 8
    """Heads K of each hidden layer, concatenated (Eq. 5): a hidden layer outputs n_heads × hidden."""
    n_output_heads: int = 1
    """Heads of the output layer, averaged (Eq. 6); the paper uses 1 on Cora and Citeseer, 8 on PubMed."""
    n_layers: int = 2
    """Graph attentional layers, the output layer included."""
    dropout: float = 0.6
    """Dropout on each layer's input features (§3.3)."""
    per_head_dropout: bool = True
    """Each head drops its own random part of the layer's input, as the reference code, which calls
    its one-head layer (`attn_head`) once per head, each call with its own dropout. False: one
    mask for all heads (PyTorch Geometric's and DGL's GAT). What each gives, with feature_dropout and
    score_bias: docs/tasks/graphs.md, "Results"."""
    attention_dropout: float = 0.6
    """Dropout on the normalised attention coefficients α: each node sees a random subset of its
    neighbourhood at each training step (§3.3)."""
    feature_dropout: float = 0.6
    """Dropout on each head's transformed features W h_j where they are summed (not where they are
    scored): the reference code's second dropout (on `seq_fts`), not in the paper's text."""
    negative_slope: float = 0.2
    """Slope of the LeakyReLU for negative inputs in Eq. 1."""
    score_bias: bool = True
    """A learned bias b per head inside Eq. 1, LeakyReLU(aᵀ[W h_i ‖ W h_j] + b): the reference
    code scores with two 1×1 convolutions, which have biases (PyG's GATConv has none)."""

    def __post_init__(self) -> None:
        if self.kind != "gat":
            raise ValueError(f"kind must be 'gat', got {self.kind!r}")
        for name in ("n_features", "n_classes"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0 (0: from the data), got {getattr(self, name)}")
        for name in ("hidden", "n_heads", "n_output_heads", "n_layers"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("dropout", "attention_dropout", "feature_dropout"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"{name} must be in [0, 1), got {getattr(self, name)}")
        if self.negative_slope < 0:
            raise ValueError(f"negative_slope must be >= 0, got {self.negative_slope}")


class GraphAttention(nn.Module):
    """One graph attentional layer with `n_heads` heads (§2.1; Figure 1, right).

    concat: True for a hidden layer (heads concatenated, Eq. 5: out features n_heads × out_features),
    False for the output layer (heads averaged, Eq. 6: out features out_features). The
    non-linearity σ is the caller's: ELU between layers, the softmax of the loss after the last.
    The layer applies its dropouts itself, in training mode: on its input (`dropout`, one mask per
    head when `per_head_dropout`), on α (`attention_dropout`) and on W h where it is summed
    (`feature_dropout`), as the reference code's `attn_head`.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        n_heads: int,
        *,
        concat: bool = True,
        dropout: float = 0.0,
        per_head_dropout: bool = False,
        attention_dropout: float = 0.0,
        feature_dropout: float = 0.0,
        negative_slope: float = 0.2,
        score_bias: bool = False,
    ) -> None:
        super().__init__()
        self.n_heads, self.out_features, self.concat = n_heads, out_features, concat
        self.dropout, self.per_head_dropout = dropout, per_head_dropout
        self.attention_dropout, self.feature_dropout = attention_dropout, feature_dropout
        self.negative_slope = negative_slope
        self.proj = nn.Linear(in_features, n_heads * out_features, bias=False)  # W^1 .. W^K, stacked
        # a = [a_dst ‖ a_src] of each head: the half that meets W h_i (the attending node) and the
        # half that meets W h_j (the neighbour).
        self.att_dst = nn.Parameter(torch.empty(n_heads, out_features))
        self.att_src = nn.Parameter(torch.empty(n_heads, out_features))
        self.score_bias = nn.Parameter(torch.zeros(n_heads)) if score_bias else None
        self.bias = nn.Parameter(torch.zeros(n_heads * out_features if concat else out_features))
        self._transposed: tuple[weakref.ref, tuple[torch.Tensor, ...]] | None = None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Glorot-uniform weights, as the reference code's convolutions: W, and each head's half
        of `a` as a map from F features to one score (fan-in F, fan-out 1)."""
        nn.init.xavier_uniform_(self.proj.weight)
        bound = math.sqrt(6.0 / (self.out_features + 1))
        nn.init.uniform_(self.att_dst, -bound, bound)
        nn.init.uniform_(self.att_src, -bound, bound)
        nn.init.zeros_(self.bias)
        if self.score_bias is not None:
            nn.init.zeros_(self.score_bias)

    def project(self, x: torch.Tensor) -> torch.Tensor:
        """W^k x for every head, after input dropout: x `(N, in)` dense or sparse CSR -> `(N, H, F)`."""
        n, heads, f = x.size(0), self.n_heads, self.out_features
        per_head = self.training and self.per_head_dropout and self.dropout > 0 and heads > 1
        w = self.proj.weight.view(heads, f, -1)  # (H, F, in): W^k
        if x.layout == torch.sparse_csr:
            # The bag-of-words input stays sparse; its transpose (for the gradient of W) is made
            # once per matrix, not once per head, step and product, and not at all when no gradient
            # will be taken (what evaluation paid for it: docs/history.md, "Beside PyTorch Geometric's
            # `GATConv`").
            needs_grad = torch.is_grad_enabled() and self.proj.weight.requires_grad
            transpose = self._transpose(x) if needs_grad else None
            values = x.values()
            if not per_head:
                kept = dropout(values, self.dropout, self.training)
                return sparse_product(x, kept, transpose, self.proj.weight.T).view(n, heads, f)
            # unbind, not w[k]: its backward stacks the heads' gradients once, where each slice's
            # would fill a zero tensor the size of W and add it, once per head.
            heads_w = w.unbind(0)
            return torch.stack(
                [sparse_product(x, dropout(values, self.dropout, True), transpose, wk.T) for wk in heads_w], 1
            )
        if not per_head:
            return self.proj(dropout(x, self.dropout, self.training)).view(n, heads, f)
        copies = dropout(x.expand(heads, *x.shape), self.dropout, True)  # (H, N, in): a mask per head
        return torch.bmm(copies, w.transpose(1, 2)).transpose(0, 1)  # (N, H, F)

    def _transpose(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """`sparse_transpose(x)`, kept for the next call with the same matrix: a node task feeds the
        same feature matrix at every step, and its transpose is a sort (docs/history.md, "A faster
        per-head step"). Only x's structure goes in, which a CSR tensor cannot change in place."""
        if self._transposed is None or self._transposed[0]() is not x:
            self._transposed = (weakref.ref(x), sparse_transpose(x))
        return self._transposed[1]

    def forward(
        self, x: torch.Tensor, edge_index: torch.Tensor, *, need_weights: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """x `(N, in_features)` (dense, or sparse CSR), edge_index `(2, E)` with the self-loops
        already in (row 0 sources j, row 1 targets i). Returns the new features `(N, H·F)` or
        `(N, F)`, and when asked for the attention coefficients α `(E, H)` (before dropout; those
        of the edges into each node sum to 1 per head)."""
        n = x.size(0)
        source, target = edge_index
        h = self.project(x)  # (N, H, F): W^k h for each head
        # aᵀ[W h_i ‖ W h_j] = a_dstᵀ W h_i + a_srcᵀ W h_j: two scores per node and head, summed per edge.
        score_dst = (h * self.att_dst).sum(-1)  # (N, H)
        score_src = (h * self.att_src).sum(-1)  # (N, H)
        # index_select rather than t[index]: the same rows, and a backward that adds them up with
        # index_add instead of indexing's sort-and-accumulate (measured: docs/history.md, "A faster
        # per-head step").
        e = score_dst.index_select(0, target) + score_src.index_select(0, source)
        if self.score_bias is not None:
            e = e + self.score_bias
        e = F.leaky_relu(e, self.negative_slope)  # (E, H), Eq. 1
        alpha = segment_softmax(e, target, n)  # (E, H), Eq. 2: over the edges into each node
        dropped = dropout(alpha, self.attention_dropout, self.training)  # each node sees a random part of N_i
        summed = dropout(h, self.feature_dropout, self.training)  # the reference code's dropout on seq_fts
        messages = dropped.unsqueeze(-1) * summed.index_select(0, source)  # (E, H, F): α_ij W h_j
        out = segment_sum(messages, target, n)  # (N, H, F): Σ_j α_ij W h_j
        out = out.reshape(n, -1) if self.concat else out.mean(dim=1)  # Eq. 5 (concat) or Eq. 6 (mean)
        return out + self.bias, alpha if need_weights else None


@dataclass(frozen=True)
class GraphAttentionWeights:
    """What each layer of a GAT attended to: per layer, α `(E, H)` over `edge_index` `(2, E)` (the
    model's edges, self-loops included); the α of the edges into a node sum to 1 per head."""

    edge_index: torch.Tensor
    weights: list[torch.Tensor]


class GAT(nn.Module):
    """The transductive GAT of §3.3: (n_layers - 1) hidden layers of n_heads × hidden features with
    ELU, then an output layer of n_output_heads averaged heads giving class scores.

    forward(x `(N, n_features)` dense or sparse CSR, edge_index `(2, E)` without self-loops, both
    directions of each undirected edge) -> logits `(N, n_classes)`.
    """

    def __init__(self, config: GATConfig) -> None:
        super().__init__()
        if config.n_features < 1 or config.n_classes < 1:
            raise ValueError("GATConfig.n_features and n_classes must be set (>= 1) to build a model")
        self.config = config
        c = config
        widths = [c.n_features] + [c.n_heads * c.hidden] * (c.n_layers - 1)
        self.layers = nn.ModuleList(
            GraphAttention(
                widths[i],
                c.hidden if i < c.n_layers - 1 else c.n_classes,
                c.n_heads if i < c.n_layers - 1 else c.n_output_heads,
                concat=i < c.n_layers - 1,
                dropout=c.dropout,
                per_head_dropout=c.per_head_dropout,
                attention_dropout=c.attention_dropout,
                feature_dropout=c.feature_dropout,
                negative_slope=c.negative_slope,
                score_bias=c.score_bias,
            )
            for i in range(c.n_layers)
        )

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        return self._run(x, edge_index, need_weights=False)[0]

    @torch.no_grad()
    def attention_weights(self, x: torch.Tensor, edge_index: torch.Tensor) -> GraphAttentionWeights:
        """Every layer's attention coefficients (dropout off whatever the mode: these are what the
        model computes, not a training step's random subset)."""
        was_training = self.training
        self.eval()
        try:
            _, edges, weights = self._run(x, edge_index, need_weights=True)
        finally:
            self.train(was_training)
        return GraphAttentionWeights(edges, weights)

    def _run(
        self, x: torch.Tensor, edge_index: torch.Tensor, *, need_weights: bool
    ) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
        edges = add_self_loops(edge_index, x.size(0))  # N_i includes i (§2.1)
        weights = []
        for i, layer in enumerate(self.layers):
            x, alpha = layer(x, edges, need_weights=need_weights)  # dropout on its input inside (§3.3)
            if i < len(self.layers) - 1:
                x = F.elu(x)  # σ of the hidden layers (§3.3)
            if alpha is not None:
                weights.append(alpha)
        return x, edges, weights
