"""What a trained GAT attends to: one node's neighbourhood weighted by each head's α, and how far
every layer's attention is from uniform.

The picture has two rows. Above, one panel per head of every layer: node i in the middle of its
neighbourhood N_i (networkx's spring layout of the subgraph on N_i), the edge from each neighbour
j drawn as wide and as dark as α_ij, and the nodes coloured by class. Below, one histogram per
layer of the attention entropy of every node, H_i = -Σ_j α_ij log α_ij (all heads pooled), beside
the entropy of uniform attention over the same neighbourhoods, log |N_i|. Where the two
distributions coincide, the layer attends about as a mean over neighbours (GCN-like) would;
where its entropies sit lower, it has learned to prefer some neighbours.

matplotlib is the optional `plot` extra; networkx comes with PyTorch.

Shape legend: N nodes, E edges (self-loops included), H heads, L layers, K neighbours of the node.

References:
- Veličković et al. 2018, "Graph Attention Networks", §3.4 (attention coefficients of a trained
  model drawn on the graph).
- Knyazev, Taylor & Amer 2019, "Understanding Attention and Generalization in Graph Neural
  Networks"; the DGL tutorial "Understand Graph Attention Network" (entropy histograms against a
  uniform baseline: on Cora they nearly coincide).
"""

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from attnlab.errors import UserError
from attnlab.nn.graph import in_degree, segment_sum
from attnlab.viz.figure import check_png_path, new_figure, save_png

CLASS_COLOURS = "tab10"  # distinct hues for up to 10 classes (Cora has 7, Citeseer 6)
EDGE_COLOURS = "viridis"
PANEL_IN = 2.6  # inches per neighbourhood panel


@dataclass(frozen=True)
class NodeAttention:
    """One node's view of a GAT, ready to draw.

    node: the node i; neighbours: the K nodes j with an edge j → i, i itself included, in edge order.
    classes: the class of each of the K nodes (-1 unknown); predicted: the model's class for i.
    weights: per layer, α `(H, K)` of the K edges into i (each row sums to 1).
    edges: `(2, M)` the edges among the K nodes (both directions; no self-loops), for the layout.
    entropies: per layer, `(H, N)` the attention entropy of every node of the graph, in nats.
    uniform: `(N,)` the entropy of uniform attention over each node's neighbourhood, log |N_i|.
    """

    node: int
    neighbours: list[int]
    classes: list[int]
    predicted: int
    weights: list[np.ndarray]
    edges: np.ndarray
    entropies: list[np.ndarray]
    uniform: np.ndarray

    @property
    def n_layers(self) -> int:
        return len(self.weights)


def attention_entropy(alpha: torch.Tensor, target: torch.Tensor, n_nodes: int) -> torch.Tensor:
    """H_i = -Σ_{j∈N_i} α_ij log α_ij for every node and head: alpha `(E, H)` over edges ending in
    `target (E,)` -> `(H, N)` nats. Example: two edges into node 0 with α 0.5 each -> log 2."""
    terms = -alpha * alpha.clamp_min(1e-30).log()  # 0 log 0 = 0
    return segment_sum(terms, target, n_nodes).T


def node_attention(
    model: torch.nn.Module, features: torch.Tensor, edge_index: torch.Tensor, labels: torch.Tensor, node: int
) -> NodeAttention:
    """The attention of a GAT (`attnlab.models.GAT`) around `node`, from every layer and head.

    features `(N, F)`, edge_index `(2, E)` (no self-loops, both directions), labels `(N,)` on the
    model's device. Raises `UserError` when `node` is not one of the N nodes.
    """
    n = features.size(0)
    if not 0 <= node < n:
        raise UserError(f"--node {node} is out of range: the graph has {n} nodes, 0 to {n - 1}")
    attention = model.attention_weights(features, edge_index)
    with torch.no_grad():
        predicted = int(model(features, edge_index)[node].argmax())
    source, target = attention.edge_index.cpu()
    into = (target == node).nonzero().squeeze(1)  # the edges j → node, its self-loop included
    neighbours = source[into]
    inside = torch.isin(edge_index[0].cpu(), neighbours) & torch.isin(edge_index[1].cpu(), neighbours)
    uniform = in_degree(attention.edge_index.cpu(), n).log()  # every node has its self-loop: |N_i| >= 1
    return NodeAttention(
        node=node,
        neighbours=neighbours.tolist(),
        classes=labels.cpu()[neighbours].tolist(),
        predicted=predicted,
        weights=[alpha.cpu()[into].T.float().numpy() for alpha in attention.weights],
        edges=edge_index.cpu()[:, inside].numpy(),
        entropies=[attention_entropy(alpha.cpu().float(), target, n).numpy() for alpha in attention.weights],
        uniform=uniform.numpy(),
    )


def draw_node_attention(run, node: int, out: str | Path, *, data_dir: str | None = None) -> NodeAttention:
    """`attnlab attention GAT_RUN --node ID`: the attention of a node-classification run's GAT around
    `node` (`node_attention`), drawn as the PNG `out` (`plot_node_attention`); the graph is read
    from `data_dir` when given, else the run's data.data_dir."""
    import dataclasses

    from attnlab.models.gat import GAT
    from attnlab.tasks import TASKS

    path = check_png_path(out)
    if run.config.task != "nodes":
        raise UserError(f"--node is for node-classification runs; {run.path} is a {run.config.task!r} run: use --text")
    if not isinstance(run.model, GAT):
        raise UserError(
            f"--node draws a GAT's attention over each neighbourhood; {run.path} holds a "
            f"{run.config.model.kind!r} model (train one with the cora-gat or citeseer-gat preset)"
        )
    data = dataclasses.replace(run.config.data, data_dir=data_dir) if data_dir else run.config.data
    task = TASKS["nodes"](data, run.config.model, run.path, resume=True, splits=())
    x, edges, labels = task.inputs(next(run.model.parameters()).device)
    att = node_attention(run.model, x, edges, labels, node)
    plot_node_attention(att, path, title=f"GAT on {task.graph.name}")
    return att


def plot_node_attention(att: NodeAttention, path: str | Path, *, title: str = "") -> Path:
    """Save the neighbourhood panels (one per head of every layer) and the entropy histograms (one
    per layer) of `att` as one PNG; returns its path. `UserError` for a bad path."""
    import networkx as nx
    from matplotlib.cm import ScalarMappable
    from matplotlib.collections import LineCollection
    from matplotlib.colors import Normalize

    path = check_png_path(path)
    panels = [(layer, head) for layer, w in enumerate(att.weights) for head in range(w.shape[0])]
    n_cols = min(len(panels), 5)
    n_rows = math.ceil(len(panels) / n_cols)
    fig = new_figure(n_cols * PANEL_IN, n_rows * PANEL_IN + 2.4 + (0.4 if title else 0))
    grid = fig.add_gridspec(n_rows + 1, n_cols, height_ratios=[PANEL_IN] * n_rows + [2.2])

    graph = nx.Graph()
    graph.add_nodes_from(att.neighbours)
    graph.add_edges_from(att.edges.T.tolist())
    # The node in the middle, its neighbours around it: a layout seeded for the same picture each time.
    pos = (
        nx.spring_layout(graph, seed=0, pos={att.node: (0.0, 0.0)}, fixed=[att.node])
        if len(graph) > 1
        else {att.node: (0.0, 0.0)}
    )
    xy = np.array([pos[j] for j in att.neighbours])  # (K, 2)
    centre = np.array(pos[att.node])
    class_cmap = _cmap(CLASS_COLOURS)
    edge_cmap = _cmap(EDGE_COLOURS)
    colours = [class_cmap(c % 10) if c >= 0 else (0.8, 0.8, 0.8, 1.0) for c in att.classes]
    context = [(pos[a], pos[b]) for a, b in att.edges.T.tolist() if att.node not in (a, b)]
    others = [k for k, j in enumerate(att.neighbours) if j != att.node]
    for p, (layer, head) in enumerate(panels):
        ax = fig.add_subplot(grid[p // n_cols, p % n_cols])
        alpha = att.weights[layer][head]  # (K,)
        if context:  # edges among the neighbours, for where they sit; not attention
            ax.add_collection(LineCollection(context, colors="0.85", linewidths=0.5, zorder=1))
        segments = [(xy[k], centre) for k in others]
        ax.add_collection(
            LineCollection(
                segments,
                colors=[edge_cmap(float(alpha[k])) for k in others],
                linewidths=[0.5 + 6.0 * float(alpha[k]) for k in others],
                zorder=2,
            )
        )
        sizes = [160 if j == att.node else 40 + 260 * float(alpha[k]) for k, j in enumerate(att.neighbours)]
        ax.scatter(xy[:, 0], xy[:, 1], s=sizes, c=colours, edgecolors="black", linewidths=0.5, zorder=3)
        self_weight = float(alpha[att.neighbours.index(att.node)])
        ax.set_title(f"layer {layer}, head {head}\nα(self) {self_weight:.2f}, max {alpha.max():.2f}", fontsize=8)
        ax.set_axis_off()
        ax.set_aspect("equal")
        ax.margins(0.08)
    scale = ScalarMappable(norm=Normalize(0.0, 1.0), cmap=edge_cmap)  # α on one 0..1 scale in every panel
    bar = fig.colorbar(scale, ax=fig.axes, shrink=0.6, aspect=30, pad=0.01)
    bar.set_label("α_ij (edge j → i)", fontsize=8)
    bar.ax.tick_params(labelsize=7)
    bottom = grid[n_rows, :].subgridspec(1, att.n_layers)  # the histograms share the last row
    for layer in range(att.n_layers):
        ax = fig.add_subplot(bottom[0, layer])
        entropies = att.entropies[layer].ravel()
        uniform = np.tile(att.uniform, att.entropies[layer].shape[0])
        # Bins 0.1 nats wide centred on multiples of 0.1: log 2, log 3, ... (the uniform entropies
        # of small neighbourhoods) sit inside a bin, so attention a little below uniform shares it.
        top = max(float(uniform.max()), float(entropies.max()))
        bins = np.arange(-0.05, top + 0.15, 0.1)
        ax.hist(uniform, bins=bins, color="0.7", label="uniform, log |N_i|")
        ax.hist(entropies, bins=bins, histtype="step", color="C3", linewidth=1.5, label="attention")
        ax.set_title(f"layer {layer}: entropy per node and head", fontsize=8)
        ax.set_xlabel("nats", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.legend(fontsize=7, frameon=False)
    label = att.classes[att.neighbours.index(att.node)]
    heading = f"node {att.node} (class {label}, predicted {att.predicted}), {len(att.neighbours) - 1} neighbours"
    fig.suptitle(f"{title}: {heading}" if title else heading, fontsize=10)
    save_png(fig, path)
    return path


def _cmap(name: str):
    from matplotlib import colormaps

    return colormaps[name]
