"""Graph building blocks: edge lists, and a softmax and a sum over each node's incoming edges.

A graph of N nodes is an edge index `(2, E)` long: row 0 holds the source j, row 1 the target i of
each directed edge j → i, along which j's message reaches i (PyG's "source_to_target" flow). An
undirected graph lists every edge in both directions. Everything here is linear in E: no N × N
matrix is ever made.

Shape legend: N nodes, E edges, H heads, F features; `...` any trailing dimensions.

References:
- Veličković et al. 2018, "Graph Attention Networks", Eq. 2: α_ij = softmax_j(e_ij) over the
  neighbourhood N_i of node i, which is a softmax over the edges that end in i.
- PyTorch Geometric, `torch_geometric.utils.softmax` and `scatter`: the same segment operations.
"""

import contextlib

import torch
import torch.nn.functional as F


def undirected(edges: torch.Tensor) -> torch.Tensor:
    """Both directions of each undirected edge: `(2, E)` -> `(2, 2E)`.

    Example: `[[0], [1]]` -> `[[0, 1], [1, 0]]`.
    """
    return torch.cat([edges, edges.flip(0)], dim=1)


def add_self_loops(edge_index: torch.Tensor, n_nodes: int) -> torch.Tensor:
    """The edges `(2, E)` and then one self-loop i → i per node: `(2, E + N)`.

    Every node attends to itself (GAT §2.1: "j ∈ N_i", N_i including i) and keeps its own features
    in a graph convolution (Kipf & Welling 2017, Ã = A + I_N). The graph must have none already.
    Example: `[[0], [1]]`, 2 nodes -> `[[0, 0, 1], [1, 0, 1]]`.
    """
    loops = torch.arange(n_nodes, device=edge_index.device).expand(2, n_nodes)
    return torch.cat([edge_index, loops], dim=1)


def in_degree(edge_index: torch.Tensor, n_nodes: int) -> torch.Tensor:
    """How many edges end in each node: `(N,)` float32. Example: `[[0, 1], [1, 1]]`, 2 nodes -> `[0, 2]`."""
    ones = torch.ones(edge_index.size(1), device=edge_index.device)
    return torch.zeros(n_nodes, device=edge_index.device).index_add(0, edge_index[1], ones)


def segment_sum(values: torch.Tensor, index: torch.Tensor, n_segments: int) -> torch.Tensor:
    """Sum the rows of `values (E, ...)` that share an `index (E,)` entry: `(n_segments, ...)`.

    With `index` the edges' targets, this is each node's sum over its incoming messages. A segment
    that no row names is 0. Example: values `[1, 2, 3]`, index `[0, 0, 2]`, 3 segments -> `[3, 0, 3]`.
    """
    out = values.new_zeros((n_segments, *values.shape[1:]))
    return out.index_add(0, index, values)


def segment_softmax(scores: torch.Tensor, index: torch.Tensor, n_segments: int) -> torch.Tensor:
    """Softmax of `scores (E, ...)` within each group of rows that share an `index (E,)` entry.

    With `index` the edges' targets, row k of the result is α_ij = exp(e_ij) / Σ_{k∈N_i} exp(e_ik)
    (GAT Eq. 2) for edge k = j → i, separately for each trailing position (each head). The largest
    score of each group is subtracted first, so exp never overflows. Example: scores `[0, ln 3, 5]`,
    index `[0, 0, 1]` -> `[0.25, 0.75, 1.0]`.
    """
    rows = index.view(-1, *([1] * (scores.dim() - 1))).expand_as(scores)
    # Softmax does not change when a group's scores shift together, so its gradient does not
    # depend on the maximum: it is a constant here (detach), as in PyG's softmax.
    maxima = scores.new_full((n_segments, *scores.shape[1:]), float("-inf"))
    maxima = maxima.scatter_reduce(0, rows, scores.detach(), reduce="amax", include_self=True)
    exp = (scores - maxima.index_select(0, index)).exp()
    return exp / segment_sum(exp, index, n_segments).index_select(0, index)


def dropout(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """Dropout (Srivastava et al. 2014) of dense tensors, and of sparse CSR feature matrices (N, F).

    Each entry is zeroed with probability p and the others scaled by 1 / (1 - p), as `F.dropout`
    does; the mask is drawn with `torch.rand`, which on a CPU is cheaper than the Bernoulli draws
    inside `F.dropout` (measured in docs/history.md, "Graph attention on Cora and Citeseer"), and a
    GAT step draws four masks. On a sparse matrix only the stored values are dropped:
    the entries not stored are zeros, which dropout leaves zero, so it is dropout on the dense
    matrix without making it (Kipf & Welling's `sparse_dropout` does the same for bag-of-words
    inputs).
    """
    if not training or p == 0.0:
        return x
    values = x.values() if x.layout == torch.sparse_csr else x
    scale = (torch.rand_like(values) >= p).to(values.dtype).mul_(1.0 / (1.0 - p))  # 0 or 1 / (1 - p)
    kept = values * scale
    if x.layout != torch.sparse_csr:
        return kept
    return torch.sparse_csr_tensor(x.crow_indices(), x.col_indices(), kept, x.shape, check_invariants=False)


def sparse_transpose(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The structure of xᵀ for a sparse CSR matrix x `(N, F)`: its row pointers `(F + 1,)`, its
    column indices `(nnz,)`, and `order (nnz,)`, such that xᵀ's values are `x.values()[order]`.

    Computed once for a matrix whose values change (dropout) and reused for each new set of values:
    PyTorch transposes a CSR matrix in the backward of every product with it, a sort each time.
    Example: x = [[1, 2], [0, 3]] (values [1, 2, 3]) -> rows [0, 1, 3], columns [0, 0, 1], order [0, 1, 2].
    """
    crow, col = x.crow_indices(), x.col_indices()
    rows = torch.repeat_interleave(torch.arange(x.size(0), device=col.device), crow.diff())
    order = torch.argsort(col, stable=True)  # xᵀ's rows are x's columns; within one, x's row order
    crow_t = torch.zeros(x.size(1) + 1, dtype=crow.dtype, device=col.device)
    crow_t[1:] = torch.bincount(col, minlength=x.size(1)).cumsum(0)
    return crow_t, rows.index_select(0, order), order


class _SparseProduct(torch.autograd.Function):
    """x @ w for a constant sparse CSR x, with the gradient xᵀ @ dy from a transpose made beforehand."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, x_t: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        ctx.x_t = x_t
        return x @ w

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[None, None, torch.Tensor]:
        return None, None, ctx.x_t @ grad


def sparse_product(
    x: torch.Tensor,
    values: torch.Tensor,
    transpose: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None,
    w: torch.Tensor,
) -> torch.Tensor:
    """x' @ w for x' the sparse CSR matrix with x's structure and `values (nnz,)` in place of its
    own (e.g. after dropout); `transpose` is `sparse_transpose(x)`, or None where no gradient will
    be taken (evaluation: the product alone, without the cost of a transpose). Differentiable in
    `w` (in, out) only: x' is data. Returns dense `(N, out)`."""
    shape = tuple(x.shape)
    with _in_float32(w) as (w,):
        values = values.float()
        rows = torch.sparse_csr_tensor(x.crow_indices(), x.col_indices(), values, shape, check_invariants=False)
        if transpose is None:
            return rows @ w  # (PyTorch's own backward, should a gradient be taken after all)
        crow_t, col_t, order = transpose
        # index_select, not values[order]: the same gather at a fraction of advanced indexing's time
        # (one per head and step with GAT's per-head dropout).
        values_t = values.index_select(0, order)
        cols = torch.sparse_csr_tensor(crow_t, col_t, values_t, shape[::-1], check_invariants=False)
        return _SparseProduct.apply(rows, cols, w)


def sparse_linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x Wᵀ for x `(N, in)` dense or sparse CSR and weight `(out, in)` -> `(N, out)`: `F.linear`,
    in float32 for a sparse x whatever the autocast (see `_in_float32`)."""
    if x.layout != torch.sparse_csr:
        return F.linear(x, weight)
    with _in_float32(weight) as (weight,):
        return F.linear(x.float(), weight)


@contextlib.contextmanager
def _in_float32(*tensors: torch.Tensor):
    """Autocast off and `tensors` in float32 inside the block: PyTorch's sparse CSR products have no
    bfloat16 or float16 kernels, so a mixed-precision run computes them in float32 (their output
    then goes on in the run's precision)."""
    with torch.autocast(tensors[0].device.type, enabled=False):
        yield tuple(t.float() for t in tensors)
