"""The Planetoid citation graphs as their authors publish them, converted to the folder format of
`attnlab.data.graphs`: what `attnlab data download planetoid` runs once the files are verified.

kimiyoung/planetoid publishes each data set as eight files, `ind.NAME.SUFFIX`:

    x, tx, allx     bag-of-words rows (a pickled scipy.sparse.csr_matrix): x the labelled training
                    nodes, allx every node before the test nodes (x first), tx the test nodes
    y, ty, ally     the same rows' classes, one-hot (pickled numpy arrays)
    graph           {node: [neighbours]} (a pickled collections.defaultdict)
    test.index      text, one line per row of tx: the node it is

Seven of them are Python 2 pickles. Unpickling runs whatever functions a file names, so
`PlanetoidUnpickler` admits only the six globals these files name (numpy's array and dtype
rebuilders, the CSR matrix class, defaultdict and list) and refuses anything else before it is
called. The CSR matrix is not rebuilt with scipy: its pickled attributes are kept as plain arrays
(`_PickledCSR`), so neither scipy nor any of its code is needed or run.

The conversion is the one the GCN and GAT loaders make (Kipf & Welling's `load_data`): test rows
go to the nodes `test.index` names; a node in the test range that no row names (Citeseer's 15
isolated papers) gets no words and label -1; train = the nodes of y, val = the 500 after them,
test = the test nodes in order. Edges lose their direction, duplicates and self-loops.

References:
- Yang, Cohen & Salakhutdinov 2016, "Revisiting Semi-Supervised Learning with Graph Embeddings"
  (the files and the split); github.com/kimiyoung/planetoid.
- Kipf & Welling 2017, github.com/tkipf/gcn, `utils.load_data` (how the files are put together).
"""

import collections
import json
import pickle
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from attnlab.errors import UserError
from attnlab.fileio import atomic_write, atomic_write_text

try:  # NumPy 2 moved the array rebuilder; the files name its NumPy 1 home
    from numpy._core.multiarray import _reconstruct
except ImportError:  # NumPy 1
    from numpy.core.multiarray import _reconstruct

SUFFIXES = ("x", "y", "tx", "ty", "allx", "ally", "graph", "test.index")
N_VAL = 500  # the Planetoid split's validation nodes (Yang et al. 2016 §5)


class _PickledCSR:
    """What a pickled scipy.sparse.csr_matrix holds (its attributes: data, indices, indptr,
    _shape, ...), kept as they are: a stand-in for the class, so that no scipy code runs."""

    def __setstate__(self, state: Any) -> None:
        self.state = state


ALLOWED_GLOBALS: dict[tuple[str, str], Any] = {
    ("numpy.core.multiarray", "_reconstruct"): _reconstruct,
    ("numpy", "ndarray"): np.ndarray,
    ("numpy", "dtype"): np.dtype,
    ("scipy.sparse.csr", "csr_matrix"): _PickledCSR,
    ("collections", "defaultdict"): collections.defaultdict,
    ("__builtin__", "list"): list,  # Python 2's name: defaultdict(list)
}
"""Every global the upstream files name (module, name as written in the pickle), and what it
becomes here. Nothing is imported by name: a pickle can reach only these objects."""


class PlanetoidUnpickler(pickle.Unpickler):
    """An unpickler for the upstream Planetoid files that admits only `ALLOWED_GLOBALS`."""

    def find_class(self, module: str, name: str) -> Any:
        # Every route to a global (GLOBAL, STACK_GLOBAL, the EXT opcodes) comes through here; the
        # persistent-id opcodes are refused by pickle.Unpickler itself.
        try:
            return ALLOWED_GLOBALS[(module, name)]
        except KeyError:
            raise _Refused(f"{module}.{name}") from None


class _Refused(Exception):
    """A global outside ALLOWED_GLOBALS: raised inside load(), turned into a UserError outside."""


def read_pickle(path: Path) -> Any:
    """One upstream pickle, loaded by `PlanetoidUnpickler` (Python 2 strings as latin-1, as NumPy
    needs for its array bytes)."""
    try:
        with open(path, "rb") as f:
            return PlanetoidUnpickler(f, encoding="latin1").load()
    except _Refused as e:
        raise UserError(
            f"{path} asks to load {e}, which no Planetoid file holds; refused without running it. It is not "
            "the file kimiyoung/planetoid publishes: delete it and download the data set again"
        ) from None
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, IndexError) as e:
        raise UserError(f"{path} is not a readable Planetoid pickle ({type(e).__name__}: {e})") from None


@dataclass(frozen=True)
class CSR:
    """A sparse matrix `shape` in compressed rows: row r holds columns indices[indptr[r]:indptr[r+1]]."""

    data: np.ndarray
    indices: np.ndarray
    indptr: np.ndarray
    shape: tuple[int, int]

    def row_pieces(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(indptr, indices, data) of the matrix made of `rows` (-1: a row without entries), in order."""
        lengths = np.where(rows >= 0, np.diff(self.indptr)[np.maximum(rows, 0)], 0)
        indptr = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        take = np.concatenate([np.arange(self.indptr[r], self.indptr[r + 1]) for r in rows if r >= 0] or [[]])
        take = take.astype(np.int64)
        return indptr, self.indices[take].astype(np.int64), self.data[take].astype(np.float32)


def as_csr(obj: Any, path: Path) -> CSR:
    """A loaded x/tx/allx file -> its CSR pieces, checked."""
    state = obj.state if isinstance(obj, _PickledCSR) else None
    if not isinstance(state, dict) or state.get("format", "csr") != "csr":
        raise UserError(f"{path} does not hold a sparse CSR matrix, as a Planetoid x, tx or allx file does")
    arrays = [state.get(k) for k in ("data", "indices", "indptr")]
    shape = state.get("_shape")
    if not all(isinstance(a, np.ndarray) and a.ndim == 1 for a in arrays) or not _is_shape(shape):
        raise UserError(f"{path}: the CSR matrix needs 1-D arrays data, indices, indptr and a (rows, columns) shape")
    data, indices, indptr = arrays
    n, f = shape
    integer = np.issubdtype(indices.dtype, np.integer) and np.issubdtype(indptr.dtype, np.integer)
    if not integer or not np.issubdtype(data.dtype, np.number) or len(indices) != len(data):
        raise UserError(f"{path}: the CSR matrix's indices and indptr must be integers, data numbers, one each")
    if len(indptr) != n + 1 or indptr[0] != 0 or (np.diff(indptr) < 0).any() or indptr[-1] != len(data):
        raise UserError(f"{path}: the CSR row pointers must rise from 0 to {len(data)} in {n + 1} steps")
    if indices.size and (indices.min() < 0 or indices.max() >= f):
        raise UserError(f"{path}: a column index is outside [0, {f})")
    return CSR(data, indices, indptr, (n, f))


def as_classes(obj: Any, path: Path) -> np.ndarray:
    """A loaded y/ty/ally file (one-hot rows) -> int64 classes, -1 for a row without a class."""
    if not isinstance(obj, np.ndarray) or obj.ndim != 2 or not np.issubdtype(obj.dtype, np.number):
        raise UserError(f"{path} does not hold a 2-D numeric array of one-hot rows, as a Planetoid y file does")
    if not np.isin(obj, (0, 1)).all() or (obj.sum(1) > 1).any():
        raise UserError(f"{path}: every row must be one-hot (a single 1) or all 0")
    return np.where(obj.any(1), obj.argmax(1), -1).astype(np.int64)


def _is_shape(shape: Any) -> bool:
    return isinstance(shape, tuple) and len(shape) == 2 and all(type(s) is int and s >= 0 for s in shape)


def read_test_index(path: Path) -> np.ndarray:
    """ind.NAME.test.index -> int64 node indices, one per line."""
    try:
        return np.array([int(line) for line in path.read_text(encoding="ascii").split()], dtype=np.int64)
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise UserError(f"{path} should hold one node index per line ({e})") from None


@dataclass(frozen=True)
class PlanetoidGraph:
    """One data set in the pieces of attnlab's folder format (see `attnlab.data.graphs`)."""

    indptr: np.ndarray
    indices: np.ndarray
    data: np.ndarray
    n_features: int
    labels: np.ndarray
    edges: list[tuple[int, int]]
    split: dict[str, list[int]]


def read_upstream(folder: Path, name: str, *, n_val: int = N_VAL) -> PlanetoidGraph:
    """The eight `ind.NAME.*` files in `folder` -> the graph, put together as the GCN loader does
    (n_val: the validation nodes after the training ones; 500 in the published split)."""
    path = {s: folder / f"ind.{name}.{s}" for s in SUFFIXES}
    for p in path.values():
        if not p.is_file():
            raise UserError(f"{p} does not exist; `attnlab data download planetoid` fetches the ind.{name}.* files")
    x, tx, allx = (as_csr(read_pickle(path[s]), path[s]) for s in ("x", "tx", "allx"))
    y, ty, ally = (as_classes(read_pickle(path[s]), path[s]) for s in ("y", "ty", "ally"))
    test = read_test_index(path["test.index"])
    _check_shapes(path, x, tx, allx, y, ty, ally, test, n_val)
    n_nodes = int(test.max()) + 1
    # row of the stacked (allx; tx) matrix for each node; -1: a test-range node no row names
    rows = np.full(n_nodes, -1, dtype=np.int64)
    rows[: allx.shape[0]] = np.arange(allx.shape[0])
    rows[test] = allx.shape[0] + np.arange(len(test))
    stacked = _stack(allx, tx)
    indptr, indices, data = stacked.row_pieces(rows)
    labels = np.where(rows >= 0, np.concatenate([ally, ty])[np.maximum(rows, 0)], -1)
    split = {
        "train": list(range(len(y))),
        "val": list(range(len(y), len(y) + n_val)),
        "test": sorted(int(i) for i in test),
    }
    edges = _edges(read_pickle(path["graph"]), n_nodes, path["graph"])
    return PlanetoidGraph(indptr, indices, data, allx.shape[1], labels, edges, split)


def _check_shapes(path: dict, x: CSR, tx: CSR, allx: CSR, y, ty, ally, test: np.ndarray, n_val: int) -> None:
    """The files agree with each other: the mistakes of a mixed-up download, named."""
    n_all, n_features = allx.shape
    if x.shape[1] != n_features or tx.shape[1] != n_features:
        raise UserError(f"{path['x']}, {path['tx']} and {path['allx']} have different numbers of features (columns)")
    for rows, classes, p in ((x.shape[0], y, "y"), (tx.shape[0], ty, "ty"), (n_all, ally, "ally")):
        if len(classes) != rows:
            raise UserError(f"{path[p]} has {len(classes)} rows, but its feature file has {rows}; one each")
    if not (len(y) <= n_all and (ally[: len(y)] == y).all()) or len(y) + n_val > n_all:
        raise UserError(f"{path['y']}: y must be the first rows of ally, with {n_val} more for validation")
    if len(test) != tx.shape[0] or len(np.unique(test)) != len(test) or (len(test) and test.min() < n_all):
        raise UserError(
            f"{path['test.index']} must name {tx.shape[0]} different nodes (one per row of tx), each after "
            f"allx's {n_all} nodes"
        )


def _stack(top: CSR, bottom: CSR) -> CSR:
    """The rows of `top`, then those of `bottom` (same columns)."""
    indptr = np.concatenate([top.indptr[:-1], bottom.indptr + top.indptr[-1]])
    return CSR(
        np.concatenate([top.data, bottom.data]),
        np.concatenate([top.indices, bottom.indices]),
        indptr,
        (top.shape[0] + bottom.shape[0], top.shape[1]),
    )


def _edges(graph: Any, n_nodes: int, path: Path) -> list[tuple[int, int]]:
    """{node: [neighbours]} -> sorted undirected edges (a, b), a < b, once each, no self-loops."""
    if not isinstance(graph, dict):
        raise UserError(f"{path} does not hold a dict of neighbour lists, as a Planetoid graph file does")
    edges = set()
    for node, neighbours in graph.items():
        if type(node) is not int or not isinstance(neighbours, list) or not all(type(n) is int for n in neighbours):
            raise UserError(f"{path}: each node must be an integer with a list of integer neighbours")
        for other in neighbours:
            if not (0 <= node < n_nodes and 0 <= other < n_nodes):
                raise UserError(f"{path}: the edge {node} - {other} leaves the graph's {n_nodes} nodes")
            if node != other:
                edges.add((min(node, other), max(node, other)))
    return sorted(edges)


def write_folder(graph: PlanetoidGraph, out: Path) -> None:
    """Write `graph` as the four files `attnlab.data.graphs.read_graph` reads, each atomically."""
    out.mkdir(parents=True, exist_ok=True)
    shape = np.array([len(graph.labels), graph.n_features], dtype=np.int64)
    arrays = {"data": graph.data, "indices": graph.indices, "indptr": graph.indptr, "shape": shape}
    atomic_write(out / "features.npz", lambda tmp: _savez(tmp, arrays))
    atomic_write(out / "labels.npy", lambda tmp: _save(tmp, graph.labels))
    atomic_write_text(out / "edges.tsv", "source\ttarget\n" + "".join(f"{a}\t{b}\n" for a, b in graph.edges))
    atomic_write_text(out / "split.json", json.dumps(graph.split))


def _savez(path: Path, arrays: dict[str, np.ndarray]) -> None:
    with open(path, "wb") as f:  # a file object: np.savez_compressed would append .npz to the name
        np.savez_compressed(f, **arrays)


def _save(path: Path, array: np.ndarray) -> None:
    with open(path, "wb") as f:
        np.save(f, array, allow_pickle=False)


def convert(folder: Path, name: str, out: Path, *, n_val: int = N_VAL) -> Path:
    """`folder`'s ind.NAME.* files -> `out`/NAME in attnlab's format, checked by reading it back
    with `read_graph`; returns that folder."""
    from attnlab.data.graphs import read_graph

    graph = read_upstream(folder, name, n_val=n_val)
    write_folder(graph, out / name)
    read_graph(out / name)
    return out / name
