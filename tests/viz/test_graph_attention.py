"""The numbers behind `attnlab attention --node`: entropies and one node's coefficients."""

import math

import torch

from attnlab.models import GAT, GATConfig
from attnlab.nn import add_self_loops, undirected
from attnlab.viz.graph_attention import attention_entropy, node_attention


def test_attention_entropy_worked_example():
    alpha = torch.tensor([[0.5, 1.0], [0.5, 0.0], [1.0, 1.0]])  # (E, H): two edges into node 0, one into 1
    entropy = attention_entropy(alpha, torch.tensor([0, 0, 1]), 2)
    torch.testing.assert_close(entropy, torch.tensor([[math.log(2), 0.0], [0.0, 0.0]]))


def test_node_attention_holds_the_coefficients_of_the_edges_into_the_node():
    torch.manual_seed(0)
    edges = undirected(torch.tensor([[0, 0, 1, 2], [1, 2, 3, 3]]))
    x = torch.randn(5, 6)
    model = GAT(GATConfig(n_features=6, n_classes=2, hidden=3, n_heads=2)).eval()
    att = node_attention(model, x, edges, torch.tensor([0, 1, 0, 1, -1]), node=3)
    assert sorted(att.neighbours) == [1, 2, 3]
    assert att.classes == [1 if j in (1, 3) else 0 for j in att.neighbours]
    everything = model.attention_weights(x, edges)
    loops = add_self_loops(edges, 5)
    assert torch.equal(everything.edge_index, loops)
    for layer, alpha in enumerate(everything.weights):
        into = loops[1] == 3
        assert att.weights[layer].tolist() == alpha[into].T.tolist()
        # Node 4 is isolated: its attention is all on itself, entropy 0, as uniform over 1 node.
        assert (att.entropies[layer][:, 4] == 0).all() and att.uniform[4] == 0
    assert {tuple(e) for e in att.edges.T.tolist()} == {(1, 3), (3, 1), (2, 3), (3, 2)}
    assert att.predicted == int(model(x, edges)[3].argmax())
