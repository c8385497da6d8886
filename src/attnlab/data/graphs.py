"""Citation graphs for node classification: Cora and Citeseer with the Planetoid public split.

A data set folder (e.g. `planetoid/cora/`) holds four files, none of them a pickle:

    features.npz   the bag-of-words matrix (N, F) in CSR pieces: arrays data (float32), indices,
                   indptr and shape (int64); read with numpy's allow_pickle=False
    labels.npy     int64 (N,): the class of each node, -1 where unknown
    edges.tsv      header `source<TAB>target`, then one undirected edge per line (no self-loops)
    split.json     {"train": [...], "val": [...], "test": [...]}: node indices

Features are row-normalised (each row divided by its sum), as the GCN and GAT papers do with these
bag-of-words vectors. A mistake in a file is a `UserError` naming the file, the line or the array,
and what was expected.

Shape legend: N nodes, F features, E undirected edges.

References:
- Sen et al. 2008, "Collective Classification in Network Data" (the Cora and Citeseer graphs).
- Yang, Cohen & Salakhutdinov 2016, "Revisiting Semi-Supervised Learning with Graph Embeddings"
  (the Planetoid split: 20 labelled nodes per class, 500 validation, 1,000 test).
- Kipf & Welling 2017, `preprocess_features` (row normalisation); Veličković et al. 2018, §3.2.
"""

import json
import warnings
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from attnlab.data.parallel import read_lines
from attnlab.errors import UserError
from attnlab.nn.graph import undirected

FILES = ("features.npz", "labels.npy", "edges.tsv", "split.json")
SPLITS = ("train", "val", "test")
EDGES_HEADER = "source\ttarget"


@dataclass(frozen=True)
class Graph:
    """One data set, ready for a model.

    features: float32 `(N, F)`, a sparse CSR tensor with rows that sum to 1 (or 0 for a node
        without words).
    labels: int64 `(N,)`, the class of each node, -1 where unknown.
    edge_index: int64 `(2, 2E)`, every undirected edge in both directions, no self-loops (see
        `attnlab.nn.graph`).
    splits: node indices, int64 `(n,)`, for "train", "val" and "test".
    """

    name: str
    features: torch.Tensor
    labels: torch.Tensor
    edge_index: torch.Tensor
    splits: dict[str, torch.Tensor]

    @property
    def n_nodes(self) -> int:
        return self.labels.numel()

    @property
    def n_features(self) -> int:
        return self.features.size(1)

    @property
    def n_classes(self) -> int:
        return int(self.labels.max()) + 1

    @property
    def n_edges(self) -> int:
        """Undirected edges."""
        return self.edge_index.size(1) // 2


def read_graph(folder: str | Path) -> Graph:
    """Read a Planetoid-format data set folder (see the module docstring) into a `Graph`."""
    folder = Path(folder).expanduser()
    if not folder.is_dir():
        raise UserError(f"graph data folder {folder} does not exist; it should hold {', '.join(FILES)}")
    for name in FILES:
        if not (folder / name).is_file():
            raise UserError(f"{folder / name} does not exist; a graph data set folder holds {', '.join(FILES)}")
    features = read_features(folder / "features.npz")
    n_nodes = features.shape[0]
    labels = read_labels(folder / "labels.npy", n_nodes)
    edges = read_edges(folder / "edges.tsv", n_nodes)
    splits = read_split(folder / "split.json", labels)
    return Graph(folder.name, features, labels, undirected(edges), splits)


def read_features(path: Path) -> torch.Tensor:
    """features.npz -> a row-normalised sparse CSR float32 tensor `(N, F)`."""
    arrays = _load_npz(path)
    missing = [k for k in ("data", "indices", "indptr", "shape") if k not in arrays]
    if missing:
        raise UserError(f"{path} has no array {', '.join(missing)}; it needs data, indices, indptr and shape (CSR)")
    data, indices, indptr, shape = arrays["data"], arrays["indices"], arrays["indptr"], arrays["shape"]
    if shape.shape != (2,) or not np.issubdtype(shape.dtype, np.integer) or (shape < 1).any():
        raise UserError(f"{path}: 'shape' must be two positive integers (nodes, features), got {shape.tolist()}")
    n, f = (int(s) for s in shape)
    if not (np.issubdtype(indices.dtype, np.integer) and np.issubdtype(indptr.dtype, np.integer)):
        raise UserError(f"{path}: 'indices' and 'indptr' must be integer arrays")
    if indptr.shape != (n + 1,) or indptr[0] != 0 or (np.diff(indptr) < 0).any() or indptr[-1] != len(data):
        raise UserError(
            f"{path}: 'indptr' must rise from 0 to len(data) = {len(data)} in {n + 1} steps, one per node and "
            "one more (CSR row pointers)"
        )
    if indices.shape != data.shape or (indices.size and (indices.min() < 0 or indices.max() >= f)):
        raise UserError(f"{path}: 'indices' must hold one column in [0, {f}) per value of 'data'")
    values = data.astype(np.float32)
    # Row normalisation (Kipf & Welling's preprocess_features): a node's words sum to 1, whatever
    # the length of its paper; a row without words stays 0.
    rows = np.repeat(np.arange(n), np.diff(indptr))
    sums = np.bincount(rows, weights=values, minlength=n)
    values = (values / np.where(sums > 0, sums, 1.0)[rows]).astype(np.float32)
    return sparse_rows(
        torch.from_numpy(indptr.astype(np.int64)),
        torch.from_numpy(indices.astype(np.int64)),
        torch.from_numpy(values),
        (n, f),
    )


def sparse_rows(
    indptr: torch.Tensor, indices: torch.Tensor, values: torch.Tensor, shape: tuple[int, int]
) -> torch.Tensor:
    """A sparse CSR tensor from checked pieces (PyTorch warns once that CSR is in beta: not news here)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta")
        return torch.sparse_csr_tensor(indptr, indices, values, shape, check_invariants=False)


def read_labels(path: Path, n_nodes: int) -> torch.Tensor:
    """labels.npy -> int64 `(N,)`, checked against the number of nodes."""
    try:
        labels = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as e:
        raise UserError(f"{path} is not a numpy array file without pickles ({e})") from None
    if labels.ndim != 1 or not np.issubdtype(labels.dtype, np.integer):
        raise UserError(f"{path} must be a 1-D integer array (one class per node), got {labels.dtype} {labels.shape}")
    if len(labels) != n_nodes:
        raise UserError(f"{path} has {len(labels)} labels, but features.npz has {n_nodes} nodes (rows); one each")
    if labels.size and labels.min() < -1:
        raise UserError(f"{path}: classes are 0, 1, ... and -1 for unknown; found {int(labels.min())}")
    if not (labels >= 0).any():
        raise UserError(f"{path}: every label is -1 (unknown); nothing to learn from")
    return torch.from_numpy(labels.astype(np.int64))


def read_edges(path: Path, n_nodes: int) -> torch.Tensor:
    """edges.tsv -> int64 `(2, E)`, one column per undirected edge, each node checked to exist."""
    lines = read_lines(path)
    if not lines or lines[0].strip() != EDGES_HEADER:
        raise UserError(f"{path}:1: expected the header 'source<TAB>target', got {lines[0][:40] if lines else ''!r}")
    pairs = []
    for n, line in enumerate(lines[1:], start=2):
        if not line.strip():
            continue
        fields = line.split("\t")
        try:
            source, target = (int(x) for x in fields)
        except ValueError:
            raise UserError(f"{path}:{n}: expected two node indices separated by a tab, got {line[:40]!r}") from None
        for node in (source, target):
            if not 0 <= node < n_nodes:
                raise UserError(
                    f"{path}:{n}: the edge {source} - {target} names node {node}, but the graph has {n_nodes} "
                    f"nodes (0 to {n_nodes - 1})"
                )
        if source == target:
            raise UserError(f"{path}:{n}: a self-loop on node {source}; leave them out (the models add one per node)")
        pairs.append((min(source, target), max(source, target)))
    edges = torch.tensor(pairs, dtype=torch.int64).reshape(-1, 2).T
    if edges.size(1) and torch.unique(edges, dim=1).size(1) != edges.size(1):
        raise UserError(f"{path}: an edge is listed twice (edges are undirected: a - b and b - a are the same)")
    return edges


def read_split(path: Path, labels: torch.Tensor) -> dict[str, torch.Tensor]:
    """split.json -> the node indices of train, val and test, each in range and labelled."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise UserError(f"{path} is not readable JSON ({e})") from None
    if not isinstance(doc, dict) or any(s not in doc for s in SPLITS):
        raise UserError(f"{path} must be a JSON object with the lists {', '.join(repr(s) for s in SPLITS)}")
    n_nodes = labels.numel()
    splits = {}
    for split in SPLITS:
        nodes = doc[split]
        if not isinstance(nodes, list) or not nodes or not all(type(i) is int for i in nodes):
            raise UserError(f"{path}: {split!r} must be a non-empty list of node indices (integers)")
        bad = next((i for i in nodes if not 0 <= i < n_nodes), None)
        if bad is not None:
            raise UserError(
                f"{path}: {split!r} holds node {bad}, out of range: the graph has {n_nodes} nodes (0 to {n_nodes - 1})"
            )
        index = torch.tensor(nodes, dtype=torch.int64)
        unlabelled = index[labels[index] < 0]
        if unlabelled.numel():
            raise UserError(f"{path}: {split!r} holds node {int(unlabelled[0])}, whose label is -1 (unknown)")
        splits[split] = index
    return splits


def _load_npz(path: Path) -> dict[str, np.ndarray]:
    try:
        with np.load(path, allow_pickle=False) as npz:
            return {k: npz[k] for k in npz.files}
    except (OSError, ValueError, zipfile.BadZipFile) as e:
        raise UserError(f"{path} is not a numpy .npz file without pickles ({e})") from None
