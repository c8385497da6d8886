"""GAT, GCN and the node Transformer against independent references: the papers' formulas written
out densely with an N × N adjacency matrix, PyTorch Geometric's GATConv, and the properties a
graph layer must have (attention normalised over each neighbourhood, outputs that depend on the
neighbourhood alone, equivariance under renumbering the nodes)."""

import importlib.util
import math

import pytest
import torch
import torch.nn.functional as F

from attnlab.data.graphs import sparse_rows
from attnlab.models import GAT, GCN, GATConfig, GCNConfig, GraphAttention, NodeTransformer, NodeTransformerConfig
from attnlab.nn.graph import add_self_loops, undirected

N_NODES, N_FEATURES, N_CLASSES = 12, 10, 3


def random_graph(seed: int = 0, n: int = N_NODES, n_edges: int = 20) -> torch.Tensor:
    """Both directions of `n_edges` distinct random undirected edges (no self-loops), plus node n-1
    left isolated so that a neighbourhood of the node alone is tested too."""
    g = torch.Generator().manual_seed(seed)
    pairs = set()
    while len(pairs) < n_edges:
        a, b = torch.randint(0, n - 1, (2,), generator=g).tolist()
        if a != b:
            pairs.add((min(a, b), max(a, b)))
    return undirected(torch.tensor(sorted(pairs)).T)


def adjacency_with_self(edge_index: torch.Tensor, n: int) -> torch.Tensor:
    """Dense bool (N, N): [i, j] is True when j ∈ N_i, i.e. an edge j → i, or j == i."""
    adj = torch.eye(n, dtype=torch.bool)
    adj[edge_index[1], edge_index[0]] = True
    return adj


def dense_gat_layer(layer: GraphAttention, x: torch.Tensor, adj: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The paper's Eq. 1-6 with every pair (i, j) scored, a ‖ concatenation and an N × N mask.
    Returns the output and α `(H, N, N)`."""
    h_count, f = layer.n_heads, layer.out_features
    w = layer.proj.weight.view(h_count, f, -1)  # (H, F', F_in): W^k
    wh = torch.einsum("hof,nf->hno", w, x)  # (H, N, F')
    n = x.size(0)
    pairs = torch.cat([wh[:, :, None, :].expand(-1, -1, n, -1), wh[:, None, :, :].expand(-1, n, -1, -1)], dim=-1)
    a = torch.cat([layer.att_dst, layer.att_src], dim=-1)  # (H, 2F'): a = [a_dst ‖ a_src]
    e = torch.einsum("hijc,hc->hij", pairs, a)  # aᵀ[W h_i ‖ W h_j]
    if layer.score_bias is not None:
        e = e + layer.score_bias[:, None, None]
    e = F.leaky_relu(e, 0.2)  # e_ij = LeakyReLU(aᵀ[W h_i ‖ W h_j] + b)
    alpha = torch.softmax(e.masked_fill(~adj, float("-inf")), dim=-1)  # over j ∈ N_i
    out = alpha @ wh  # (H, N, F')
    out = out.permute(1, 0, 2).reshape(n, -1) if layer.concat else out.mean(0)
    return out + layer.bias, alpha


def features(seed: int = 1, n: int = N_NODES) -> torch.Tensor:
    return torch.randn(n, N_FEATURES, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize(("heads", "concat", "score_bias"), [(1, True, False), (4, True, True), (3, False, True)])
def test_the_edge_list_layer_equals_the_dense_formula(heads, concat, score_bias):
    torch.manual_seed(0)
    layer = GraphAttention(N_FEATURES, 5, heads, concat=concat, score_bias=score_bias).eval()
    with torch.no_grad():  # non-zero biases and larger attention vectors: a stronger test than the init
        layer.bias.normal_()
        layer.att_src.mul_(3.0)
        if score_bias:
            layer.score_bias.normal_()
    edges, x = random_graph(), features()
    out, alpha = layer(x, add_self_loops(edges, N_NODES), need_weights=True)
    expected, dense_alpha = dense_gat_layer(layer, x, adjacency_with_self(edges, N_NODES))
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    loops = add_self_loops(edges, N_NODES)
    torch.testing.assert_close(alpha.T, dense_alpha[:, loops[1], loops[0]], atol=1e-6, rtol=1e-5)


def test_the_two_layer_model_equals_the_dense_formula():
    torch.manual_seed(0)
    config = GATConfig(n_features=N_FEATURES, n_classes=N_CLASSES, hidden=4, n_heads=3, n_output_heads=2)
    model = GAT(config).eval()
    with torch.no_grad():
        for layer in model.layers:
            layer.score_bias.normal_()
    edges, x = random_graph(), features()
    adj = adjacency_with_self(edges, N_NODES)
    hidden, _ = dense_gat_layer(model.layers[0], x, adj)
    expected, _ = dense_gat_layer(model.layers[1], F.elu(hidden), adj)
    torch.testing.assert_close(model(x, edges), expected, atol=1e-5, rtol=1e-5)


def as_sparse(x: torch.Tensor) -> torch.Tensor:
    """x `(N, F)` as a sparse CSR matrix of its non-zeros, as the data reader makes a bag of words."""
    crow = torch.cat([torch.zeros(1, dtype=torch.int64), (x != 0).sum(1).cumsum(0)])
    return sparse_rows(crow, (x != 0).nonzero()[:, 1], x[x != 0], tuple(x.shape))


def test_sparse_features_give_the_dense_result():
    torch.manual_seed(0)
    model = GAT(GATConfig(n_features=N_FEATURES, n_classes=N_CLASSES)).eval()
    x = torch.relu(features())  # zeros in it, as in a bag of words
    sparse = as_sparse(x)
    torch.testing.assert_close(model(sparse, random_graph()), model(x, random_graph()), atol=1e-6, rtol=1e-5)
    with torch.no_grad():  # the sparse path without the transpose it makes for gradients
        torch.testing.assert_close(model(sparse, random_graph()), model(x, random_graph()), atol=1e-6, rtol=1e-5)


def test_attention_over_each_neighbourhood_sums_to_one():
    torch.manual_seed(0)
    model = GAT(GATConfig(n_features=N_FEATURES, n_classes=N_CLASSES, n_heads=4, n_output_heads=2))
    model.train()  # attention_weights turns dropout off itself
    attention = model.attention_weights(features(), random_graph())
    target = attention.edge_index[1]
    assert [w.shape for w in attention.weights] == [(target.numel(), 4), (target.numel(), 2)]
    for w in attention.weights:
        sums = torch.zeros(N_NODES, w.size(1)).index_add(0, target, w)
        torch.testing.assert_close(sums, torch.ones(N_NODES, w.size(1)))
        assert (w > 0).all()
    isolated = N_NODES - 1  # its only edge is its self-loop: all its attention on itself
    assert torch.equal(attention.edge_index[:, target == isolated], torch.tensor([[isolated], [isolated]]))
    assert model.training  # restored


def test_scores_far_apart_do_not_overflow():
    layer = GraphAttention(N_FEATURES, 4, 2).eval()
    with torch.no_grad():
        layer.att_src.fill_(1e3)  # e_ij in the thousands: exp would overflow without the per-node max
    out, alpha = layer(features() * 50, add_self_loops(random_graph(), N_NODES), need_weights=True)
    assert torch.isfinite(out).all() and torch.isfinite(alpha).all()


def neighbours_within(edges: torch.Tensor, node: int, hops: int) -> set[int]:
    reach = {node}
    for _ in range(hops):
        reach |= {int(s) for s, t in edges.T.tolist() if t in reach}
    return reach


@pytest.mark.parametrize("n_layers", [1, 2])
def test_a_nodes_output_depends_only_on_its_neighbourhood(n_layers):
    torch.manual_seed(0)
    config = GATConfig(n_features=N_FEATURES, n_classes=N_CLASSES, n_layers=n_layers, n_heads=2)
    model = GAT(config).eval()
    edges = random_graph()
    for node in range(N_NODES):
        x = features().requires_grad_()
        model(x, edges)[node].sum().backward()
        depends = {j for j in range(N_NODES) if x.grad[j].abs().sum() > 0}
        assert depends == neighbours_within(edges, node, n_layers), node


def permuted(edges: torch.Tensor, perm: torch.Tensor) -> torch.Tensor:
    """The same graph with node `perm[k]` renamed k."""
    new_name = torch.empty_like(perm)
    new_name[perm] = torch.arange(perm.numel())
    return new_name[edges]


MODELS = {
    "gat": lambda: GAT(GATConfig(n_features=N_FEATURES, n_classes=N_CLASSES, n_heads=2)),
    "gcn": lambda: GCN(GCNConfig(n_features=N_FEATURES, n_classes=N_CLASSES)),
    "transformer": lambda: NodeTransformer(
        NodeTransformerConfig(n_features=N_FEATURES, n_classes=N_CLASSES, d_model=16, n_heads=2, d_ff=32)
    ),
    "transformer-neighbours": lambda: NodeTransformer(
        NodeTransformerConfig(
            n_features=N_FEATURES, n_classes=N_CLASSES, d_model=16, n_heads=2, d_ff=32, attention="neighbours"
        )
    ),
}


@pytest.mark.parametrize("kind", MODELS)
def test_renumbering_the_nodes_renumbers_the_output(kind):
    torch.manual_seed(0)
    model = MODELS[kind]().eval()
    edges, x = random_graph(), features()
    perm = torch.randperm(N_NODES, generator=torch.Generator().manual_seed(3))
    torch.testing.assert_close(model(x[perm], permuted(edges, perm)), model(x, edges)[perm], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(("kind", "local"), [("transformer", False), ("transformer-neighbours", True)])
def test_the_masked_transformer_sees_the_neighbours_only(kind, local):
    torch.manual_seed(0)
    model = MODELS[kind]().eval()
    edges = random_graph()
    for node in (0, N_NODES - 1):
        x = features().requires_grad_()
        model(x, edges)[node].sum().backward()
        depends = {j for j in range(N_NODES) if x.grad[j].abs().sum() > 0}
        expected = neighbours_within(edges, node, 2) if local else set(range(N_NODES))
        assert depends == expected


def test_gcn_equals_the_dense_normalised_adjacency():
    torch.manual_seed(0)
    model = GCN(GCNConfig(n_features=N_FEATURES, n_classes=N_CLASSES, hidden=6)).eval()
    with torch.no_grad():
        for layer in model.layers:
            layer.bias.normal_()
    edges, x = random_graph(), features()
    a_tilde = adjacency_with_self(edges, N_NODES).double()  # Ã = A + I
    d_inv_sqrt = torch.diag(a_tilde.sum(1).rsqrt())
    a_hat = d_inv_sqrt @ a_tilde @ d_inv_sqrt  # Kipf & Welling Eq. 2
    w0, w1 = (layer.proj.weight.double().T for layer in model.layers)
    b0, b1 = (layer.bias.double() for layer in model.layers)
    expected = a_hat @ torch.relu(a_hat @ x.double() @ w0 + b0) @ w1 + b1  # Eq. 9 before the softmax
    torch.testing.assert_close(model(x, edges).double(), expected, atol=1e-5, rtol=1e-5)


def test_dropout_changes_training_steps_but_not_evaluation():
    torch.manual_seed(0)
    model = GAT(GATConfig(n_features=N_FEATURES, n_classes=N_CLASSES))
    edges, x = random_graph(), features()
    assert not torch.equal(model(x, edges), model(x, edges))  # dropout 0.6 on inputs and on α
    model.eval()
    assert torch.equal(model(x, edges), model(x, edges))


@pytest.mark.parametrize(
    ("field", "value"),
    [("n_heads", 0), ("hidden", 0), ("dropout", 1.0), ("attention_dropout", -0.1), ("kind", "gcn"), ("n_features", -1)],
)
def test_gat_config_is_validated(field, value):
    with pytest.raises(ValueError, match=field):
        GATConfig(**{field: value})


def test_configs_without_the_data_sizes_build_no_model():
    for model, config in ((GAT, GATConfig()), (GCN, GCNConfig()), (NodeTransformer, NodeTransformerConfig())):
        with pytest.raises(ValueError, match="n_features and n_classes must be set"):
            model(config)
    with pytest.raises(ValueError, match="attention"):
        NodeTransformerConfig(attention="edges")


def test_the_initial_attention_vectors_follow_glorot():
    torch.manual_seed(0)
    layer = GraphAttention(100, 8, 64)
    bound = math.sqrt(6 / (8 + 1))  # fan-in F' = 8, fan-out 1, as the reference code's 1x1 convolutions
    assert layer.att_src.abs().max() <= bound and layer.att_src.abs().max() > 0.9 * bound
    assert torch.equal(layer.bias, torch.zeros(8 * 64))


@pytest.mark.skipif(
    importlib.util.find_spec("torch_geometric") is None,
    reason="torch_geometric is not installed (pip install torch-geometric; an optional peer, in the dev extra)",
)
@pytest.mark.parametrize(("heads", "concat"), [(4, True), (2, False)])
def test_the_layer_equals_pytorch_geometrics_gatconv(heads, concat):
    from torch_geometric.nn import GATConv

    torch.manual_seed(0)
    ours = GraphAttention(N_FEATURES, 5, heads, concat=concat).eval()
    theirs = GATConv(N_FEATURES, 5, heads=heads, concat=concat, negative_slope=0.2, dropout=0.0).eval()
    with torch.no_grad():
        ours.bias.normal_()
        theirs.lin.weight.copy_(ours.proj.weight)
        theirs.att_src.copy_(ours.att_src[None])
        theirs.att_dst.copy_(ours.att_dst[None])
        theirs.bias.copy_(ours.bias)
    edges, x = random_graph(), features()
    out, alpha = ours(x, add_self_loops(edges, N_NODES), need_weights=True)
    expected, (their_edges, their_alpha) = theirs(x, edges, return_attention_weights=True)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    assert torch.equal(their_edges, add_self_loops(edges, N_NODES))  # same edges, self-loops last
    torch.testing.assert_close(alpha, their_alpha, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("sparse", [False, True])
@pytest.mark.parametrize("per_head", [False, True])
def test_input_dropout_draws_a_mask_per_head_or_one_for_all(per_head, sparse):
    """The reference code drops each head's input separately; PyG and DGL drop it once."""
    torch.manual_seed(0)
    layer = GraphAttention(N_FEATURES, 3, 4, dropout=0.5, per_head_dropout=per_head)
    with torch.no_grad():
        layer.proj.weight.copy_(layer.proj.weight[:3].repeat(4, 1))  # W^1 = ... = W^4
    x = torch.rand(N_NODES, N_FEATURES) + 0.1  # no zeros: every entry can be dropped
    if sparse:
        crow = torch.arange(0, N_NODES * N_FEATURES + 1, N_FEATURES)
        x = sparse_rows(crow, torch.arange(N_FEATURES).repeat(N_NODES), x.flatten(), (N_NODES, N_FEATURES))
    h = layer.project(x)  # (N, H, F)
    same = [torch.equal(h[:, 0], h[:, k]) for k in range(1, 4)]
    assert same == ([False] * 3 if per_head else [True] * 3)
    layer.eval()
    h = layer.project(x)
    assert all(torch.equal(h[:, 0], h[:, k]) for k in range(1, 4))  # no dropout at evaluation


def test_the_kept_transpose_follows_the_input_matrix():
    """The layer keeps the sparse input's transpose between calls: the gradient of W stays the
    dense input's when the same matrix comes again, and when another (another structure) comes."""
    torch.manual_seed(0)
    model = GAT(
        GATConfig(n_features=N_FEATURES, n_classes=N_CLASSES, dropout=0.0, attention_dropout=0.0, feature_dropout=0.0)
    )
    first, second = torch.relu(features()), torch.relu(features() - 0.5)  # other zeros, other structure
    sparse = {id(first): as_sparse(first), id(second): as_sparse(second)}
    edges = random_graph()
    for x in (first, first, second, first):
        grads = []
        for inputs in (x, sparse[id(x)]):
            model.zero_grad()
            model(inputs, edges).square().sum().backward()
            grads.append(model.layers[0].proj.weight.grad.clone())
        torch.testing.assert_close(grads[1], grads[0], atol=1e-5, rtol=1e-4)


def test_per_head_dropout_trains_the_same_weights_on_sparse_and_dense_input():
    """One step's gradient of W: the sparse path (its own transpose) and the dense path agree
    when dropout is off."""
    torch.manual_seed(0)
    x = torch.relu(features())
    sparse = as_sparse(x)
    grads = []
    for inputs in (x, sparse):
        torch.manual_seed(0)
        model = GAT(
            GATConfig(
                n_features=N_FEATURES, n_classes=N_CLASSES, dropout=0.0, attention_dropout=0.0, feature_dropout=0.0
            )
        )
        model(inputs, random_graph()).square().sum().backward()
        grads.append([p.grad for p in model.parameters()])
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)
