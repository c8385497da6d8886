"""Attention masks as pure functions.

One convention everywhere: a boolean tensor, `True` = the query may attend to that key.
Shapes broadcast to the attention scores `(B, H, Tq, Tk)`.
"""

import torch


def causal_mask(t_q: int, t_k: int | None = None, *, device: torch.device | None = None) -> torch.Tensor:
    """The look-ahead mask of a decoder: query i may attend to keys 0..i (Vaswani et al. §3.2.3).

    With `t_k > t_q` the queries are the last `t_q` positions of a sequence of length `t_k`
    (incremental decoding with a KV cache), so query i sits at absolute position `t_k - t_q + i`.

    Returns a bool tensor `(t_q, t_k)`. Example: `causal_mask(3)` is
    `[[T, F, F], [T, T, F], [T, T, T]]`.
    """
    t_k = t_q if t_k is None else t_k
    if t_k < t_q:
        raise ValueError(f"causal_mask needs t_k >= t_q, got t_q={t_q}, t_k={t_k}")
    q_pos = torch.arange(t_k - t_q, t_k, device=device).unsqueeze(1)
    k_pos = torch.arange(t_k, device=device).unsqueeze(0)
    return k_pos <= q_pos


def padding_mask(lengths: torch.Tensor, max_len: int | None = None) -> torch.Tensor:
    """Key-padding mask from sequence lengths: `True` for real tokens, `False` for padding.

    lengths: `(B,)` integer tensor. Returns bool `(B, 1, 1, T)`, ready to broadcast over heads and
    queries. Example: lengths `[2, 3]`, max_len 3 -> `[[T, T, F], [T, T, T]]` (before unsqueezing).
    """
    max_len = int(lengths.max()) if max_len is None else max_len
    positions = torch.arange(max_len, device=lengths.device)
    keep = positions.unsqueeze(0) < lengths.unsqueeze(1)  # (B, T)
    return keep[:, None, None, :]


def padding_mask_from_ids(ids: torch.Tensor, pad_id: int) -> torch.Tensor:
    """Key-padding mask from token ids: `True` where `ids != pad_id`. ids `(B, T)` -> `(B, 1, 1, T)`."""
    return (ids != pad_id)[:, None, None, :]


def adjacency_mask(edge_index: torch.Tensor, n_nodes: int) -> torch.Tensor:
    """Self-attention restricted to a graph: node i may attend to node j when there is an edge
    j → i, and always to itself (GAT's masked attention, Veličković et al. 2018 §2.1).

    edge_index: `(2, E)` long, row 0 the sources j, row 1 the targets i (`attnlab.nn.graph`).
    Returns bool `(N, N)`, rows the attending nodes (queries), columns the attended (keys). Dense:
    for attention over all N nodes as one sequence, which is N × N anyway. Example: the edge 0 → 1
    of 2 nodes -> `[[T, F], [T, T]]`.
    """
    mask = torch.eye(n_nodes, dtype=torch.bool, device=edge_index.device)
    mask[edge_index[1], edge_index[0]] = True
    return mask
