"""The Planetoid reader on the 60-node Cora slice (and the full data sets where they are present),
checked against a plain reading of the same files, and the errors a user meets."""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from attnlab.data.graphs import read_graph
from attnlab.errors import UserError

FIXTURE = Path(__file__).parents[1] / "fixtures" / "planetoid" / "cora"
SHARED = Path(__file__).parents[3] / "shared" / "data" / "planetoid"


def plain_reading(folder: Path) -> tuple[np.ndarray, np.ndarray, list[tuple[int, int]], dict]:
    """The four files read without attnlab: dense features, labels, edge pairs, split."""
    f = np.load(folder / "features.npz")
    dense = np.zeros(tuple(f["shape"]), np.float64)
    for row in range(dense.shape[0]):
        for k in range(f["indptr"][row], f["indptr"][row + 1]):
            dense[row, f["indices"][k]] = f["data"][k]
    lines = (folder / "edges.tsv").read_text().splitlines()[1:]
    pairs = [tuple(int(v) for v in line.split("\t")) for line in lines]
    return dense, np.load(folder / "labels.npy"), pairs, json.loads((folder / "split.json").read_text())


def test_the_fixture_reads_as_its_files_say():
    graph = read_graph(FIXTURE)
    dense, labels, pairs, split = plain_reading(FIXTURE)
    assert (graph.n_nodes, graph.n_features, graph.n_classes, graph.n_edges) == (60, 478, 3, 87)
    sums = dense.sum(1, keepdims=True)
    np.testing.assert_allclose(graph.features.to_dense().numpy(), dense / sums, rtol=1e-6)  # row-normalised
    assert graph.labels.tolist() == labels.tolist()
    directed = {(int(s), int(t)) for s, t in graph.edge_index.T.tolist()}
    assert directed == {(a, b) for a, b in pairs} | {(b, a) for a, b in pairs}  # both directions, once each
    assert graph.edge_index.size(1) == 2 * len(pairs)
    assert {k: v.tolist() for k, v in graph.splits.items()} == split


@pytest.mark.parametrize(
    ("name", "expected"),
    [("cora", (2708, 1433, 7, 5278, 140)), ("citeseer", (3327, 3703, 6, 4552, 120))],
)
def test_the_full_data_sets_have_the_published_sizes(name, expected):
    if not (SHARED / name).is_dir():
        pytest.skip(f"{SHARED / name} is not on this machine")
    graph = read_graph(SHARED / name)
    sizes = (graph.n_nodes, graph.n_features, graph.n_classes, graph.n_edges, len(graph.splits["train"]))
    assert sizes == expected  # the table of the data README and of the GCN paper
    assert [len(graph.splits[s]) for s in ("val", "test")] == [500, 1000]
    rows = graph.features.to_dense().sum(1)
    empty = rows == 0  # Citeseer's 15 isolated test indices that have no paper
    torch.testing.assert_close(rows[~empty], torch.ones(int((~empty).sum())))
    assert int(empty.sum()) == (15 if name == "citeseer" else 0)


@pytest.fixture
def copy(tmp_path) -> Path:
    folder = tmp_path / "cora"
    shutil.copytree(FIXTURE, folder)
    return folder


def read_error(folder: Path) -> str:
    with pytest.raises(UserError) as info:
        read_graph(folder)
    message = str(info.value)
    assert "\n" not in message
    return message


def test_a_missing_file_is_named(copy):
    (copy / "labels.npy").unlink()
    assert "labels.npy does not exist" in read_error(copy)
    assert "does not exist" in read_error(copy.parent / "nowhere")


def test_an_edge_to_a_node_that_does_not_exist(copy):
    with open(copy / "edges.tsv", "a") as f:
        f.write("3\t60\n")
    message = read_error(copy)
    assert "edges.tsv:89" in message and "node 60" in message and "60 nodes (0 to 59)" in message


@pytest.mark.parametrize(
    ("line", "fragment"),
    [("3\tx\n", "two node indices"), ("4\t4\n", "self-loop"), ("1\t0\n", "listed twice")],
)
def test_malformed_edges(copy, line, fragment):
    first = (copy / "edges.tsv").read_text().splitlines()[1]
    with open(copy / "edges.tsv", "a") as f:
        f.write(line if fragment != "listed twice" else "\t".join(reversed(first.split("\t"))) + "\n")
    assert fragment in read_error(copy)


def test_a_label_count_that_does_not_match_the_nodes(copy):
    np.save(copy / "labels.npy", np.zeros(59, np.int64))
    assert "59 labels, but features.npz has 60 nodes" in read_error(copy)


def test_a_split_index_out_of_range(copy):
    split = json.loads((copy / "split.json").read_text())
    split["test"].append(60)
    (copy / "split.json").write_text(json.dumps(split))
    message = read_error(copy)
    assert "'test' holds node 60, out of range" in message


def test_an_unlabelled_node_in_a_split(copy):
    labels = np.load(copy / "labels.npy")
    labels[json.loads((copy / "split.json").read_text())["val"][0]] = -1
    np.save(copy / "labels.npy", labels)
    assert "label is -1" in read_error(copy)


def test_features_that_are_not_a_pickle_free_csr_matrix(copy):
    np.savez(copy / "features.npz", data=np.ones(3, np.float32), indices=np.array([0, 1, 2]))
    assert "no array indptr, shape" in read_error(copy)
    np.savez(copy / "features.npz", data=np.array([object()], dtype=object))
    assert "without pickles" in read_error(copy)
    (copy / "features.npz").write_text("not a zip")
    assert "not a numpy .npz file" in read_error(copy)
