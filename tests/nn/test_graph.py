"""The graph operations against plain loops and torch's own softmax."""

import torch

from attnlab.data.graphs import sparse_rows
from attnlab.nn import (
    add_self_loops,
    adjacency_mask,
    dropout,
    in_degree,
    segment_softmax,
    segment_sum,
    undirected,
)
from attnlab.nn.graph import sparse_linear, sparse_product, sparse_transpose


def test_segment_softmax_is_a_softmax_within_each_group():
    g = torch.Generator().manual_seed(0)
    index = torch.tensor([2, 0, 2, 2, 0, 4])
    scores = torch.randn(6, 3, generator=g)
    out = segment_softmax(scores, index, 5)
    for node in index.unique():
        rows = index == node
        torch.testing.assert_close(out[rows], torch.softmax(scores[rows], dim=0))


def test_segment_softmax_worked_example_and_huge_scores():
    out = segment_softmax(torch.tensor([0.0, torch.log(torch.tensor(3.0)), 5.0]), torch.tensor([0, 0, 1]), 2)
    torch.testing.assert_close(out, torch.tensor([0.25, 0.75, 1.0]))
    huge = segment_softmax(torch.tensor([1000.0, 999.0, -1000.0]), torch.tensor([0, 0, 1]), 2)
    torch.testing.assert_close(huge, torch.tensor([1 / (1 + torch.e**-1), 1 / (1 + torch.e), 1.0]))


def test_segment_softmax_gradient_matches_the_dense_softmax():
    scores = torch.randn(4, generator=torch.Generator().manual_seed(1), requires_grad=True)
    weights = torch.tensor([1.0, -2.0, 0.5, 3.0])
    (segment_softmax(scores, torch.tensor([0, 0, 0, 0]), 1) * weights).sum().backward()
    reference = scores.detach().clone().requires_grad_()
    (torch.softmax(reference, 0) * weights).sum().backward()
    torch.testing.assert_close(scores.grad, reference.grad)


def test_segment_sum_and_degrees():
    torch.testing.assert_close(
        segment_sum(torch.tensor([1.0, 2.0, 3.0]), torch.tensor([0, 0, 2]), 3), torch.tensor([3.0, 0.0, 3.0])
    )
    edges = torch.tensor([[0, 1], [1, 1]])
    torch.testing.assert_close(in_degree(edges, 2), torch.tensor([0.0, 2.0]))


def test_edge_list_helpers():
    edges = torch.tensor([[0], [1]])
    assert undirected(edges).tolist() == [[0, 1], [1, 0]]
    assert add_self_loops(edges, 2).tolist() == [[0, 0, 1], [1, 0, 1]]
    assert adjacency_mask(edges, 2).tolist() == [[True, False], [True, True]]  # row i: may attend to j


def test_dropout_on_sparse_rows_is_dropout_on_the_dense_matrix():
    dense = torch.zeros(200, 50)
    dense[torch.arange(200), torch.arange(200) % 50] = 2.0
    crow = torch.arange(201)
    sparse = sparse_rows(crow, torch.arange(200) % 50, torch.full((200,), 2.0), (200, 50))
    torch.manual_seed(0)
    dropped = dropout(sparse, 0.5, True).to_dense()
    zeros = dense == 0
    assert (dropped[zeros] == 0).all()  # what was zero stays zero
    kept = dropped[~zeros]
    assert set(kept.unique().tolist()) == {0.0, 4.0}  # dropped, or kept and scaled by 1 / (1 - p)
    assert 60 < int((kept == 0).sum()) < 140  # about half of 200
    assert dropout(sparse, 0.5, False) is sparse
    assert torch.equal(dropout(dense, 0.0, True), dense)


def test_sparse_product_and_its_gradient_match_the_dense_product():
    g = torch.Generator().manual_seed(2)
    dense = torch.rand(7, 5, generator=g) * (torch.rand(7, 5, generator=g) < 0.4)
    dense[3] = 0  # an empty row
    crow = torch.cat([torch.zeros(1, dtype=torch.int64), (dense != 0).sum(1).cumsum(0)])
    x = sparse_rows(crow, (dense != 0).nonzero()[:, 1], dense[dense != 0], (7, 5))
    transpose = sparse_transpose(x)
    assert torch.equal(
        torch.sparse_csr_tensor(transpose[0], transpose[1], x.values()[transpose[2]], (5, 7)).to_dense(), dense.T
    )
    w = torch.randn(5, 3, generator=g, requires_grad=True)
    values = x.values() * 2  # new values on the same structure, as after dropout
    sparse_product(x, values, transpose, w).square().sum().backward()
    reference = w.detach().clone().requires_grad_()
    ((2 * dense) @ reference).square().sum().backward()
    torch.testing.assert_close(w.grad, reference.grad)
    # Without a transpose (evaluation): the same product, and PyTorch's own gradient if one is taken.
    untransposed = w.detach().clone().requires_grad_()
    product = sparse_product(x, values, None, untransposed)
    torch.testing.assert_close(product, (2 * dense) @ w.detach())
    product.square().sum().backward()
    torch.testing.assert_close(untransposed.grad, reference.grad)


def test_sparse_products_run_in_float32_under_bfloat16_autocast():
    """PyTorch has no bfloat16 kernel for sparse CSR products: a mixed-precision GAT, GCN or node
    Transformer run computes them in float32, equal to the dense float32 product."""
    g = torch.Generator().manual_seed(0)
    dense = torch.rand(7, 5, generator=g) * (torch.rand(7, 5, generator=g) > 0.6)
    x = dense.to_sparse_csr()
    w = torch.randn(5, 3, generator=g, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = sparse_product(x, x.values(), sparse_transpose(x), w)
        z = sparse_linear(x, w.T)
    assert y.dtype == z.dtype == torch.float32
    torch.testing.assert_close(y, dense @ w)
    torch.testing.assert_close(z, dense @ w)
    y.sum().backward()
    torch.testing.assert_close(w.grad, dense.T @ torch.ones(7, 3))
