"""The upstream Planetoid pickles, read by the restricted unpickler and converted to attnlab's graph
folders. The pickles are written here in the upstream format (protocol 2, Python 2 strings, the
globals under the names the published files use) from graphs in attnlab's format, so that each
conversion can be checked against the graph it came from; a crafted pickle must be refused unrun."""

import collections
import copyreg
import functools
import hashlib
import http.server
import json
import os
import pickle
import pickletools
import struct
import threading
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from attnlab.data import download as downloads
from attnlab.data.graphs import read_graph
from attnlab.data.planetoid import ALLOWED_GLOBALS, SUFFIXES, convert, read_pickle
from attnlab.errors import UserError
from helpers import assert_user_error, cli

FIXTURE = Path(__file__).parents[1] / "fixtures" / "planetoid" / "cora"
SHARED = Path(__file__).parents[3] / "shared" / "data" / "planetoid"


class CsrMatrix:
    """What scipy 0.x pickled for a csr_matrix: the class, no arguments, then its attributes."""

    def __init__(self, indptr: np.ndarray, indices: np.ndarray, data: np.ndarray, shape: tuple[int, int]) -> None:
        self.format, self._shape, self.maxprint = "csr", shape, 50
        self.indptr, self.indices, self.data = indptr.astype(np.int32), indices.astype(np.int32), data
        self._cs_matrix__has_sorted_indices = True

    def __reduce_ex__(self, protocol: int) -> tuple:
        return copyreg.__newobj__, (CsrMatrix,), dict(self.__dict__)


def _reconstruct_function():
    return np.empty(0).__reduce__()[0]


UPSTREAM_NAMES = {
    _reconstruct_function(): ("numpy.core.multiarray", "_reconstruct"),
    np.ndarray: ("numpy", "ndarray"),
    np.dtype: ("numpy", "dtype"),
    CsrMatrix: ("scipy.sparse.csr", "csr_matrix"),
    collections.defaultdict: ("collections", "defaultdict"),
    list: ("__builtin__", "list"),
}


class Python2Pickler(pickle._Pickler):
    """Protocol 2 as Python 2 wrote it: bytes as str (BINSTRING), globals by their upstream names."""

    dispatch = pickle._Pickler.dispatch.copy()

    def save_global(self, obj, name=None) -> None:
        module, qualname = UPSTREAM_NAMES[obj]
        self.write(pickle.GLOBAL + f"{module}\n{qualname}\n".encode())
        self.memoize(obj)

    def save_str2(self, obj: bytes) -> None:
        if len(obj) < 256:
            self.write(pickle.SHORT_BINSTRING + bytes([len(obj)]) + obj)
        else:
            self.write(pickle.BINSTRING + struct.pack("<i", len(obj)) + obj)
        self.memoize(obj)

    dispatch[bytes] = save_str2


def write_pickle(path: Path, obj: object) -> None:
    with open(path, "wb") as f:
        Python2Pickler(f, protocol=2).dump(obj)


def read_pieces(folder: Path) -> dict:
    """An attnlab graph folder's files as they are (features not normalised)."""
    f = np.load(folder / "features.npz")
    lines = (folder / "edges.tsv").read_text().splitlines()[1:]
    return {
        "features": (f["indptr"], f["indices"], f["data"], tuple(int(s) for s in f["shape"])),
        "labels": np.load(folder / "labels.npy"),
        "edges": [tuple(int(v) for v in line.split("\t")) for line in lines],
        "split": json.loads((folder / "split.json").read_text()),
    }


def rows(features: tuple, nodes) -> CsrMatrix:
    indptr, indices, data, (_, f) = features
    pieces = [(indices[indptr[n] : indptr[n + 1]], data[indptr[n] : indptr[n + 1]]) for n in nodes]
    lengths = [len(i) for i, _ in pieces]
    return CsrMatrix(
        np.concatenate([[0], np.cumsum(lengths)]),
        np.concatenate([i for i, _ in pieces] or [[]]),
        np.concatenate([d for _, d in pieces] or [[]]).astype(np.float32),
        (len(nodes), f),
    )


def write_upstream(graph: dict, out: Path, name: str, *, self_loop: bool = False, seed: int = 0) -> None:
    """The eight ind.NAME.* files of `graph` (read_pieces), whose nodes are in Planetoid's order:
    train, then validation, then the rest of allx, then the test range (unnamed nodes there: none
    of the files describe them)."""
    labels, split = graph["labels"], graph["split"]
    n_all = min(split["test"])
    one_hot = np.zeros((len(labels), labels.max() + 1), dtype=np.int32)
    one_hot[labels >= 0, labels[labels >= 0]] = 1
    n_train = len(split["train"])
    test = np.random.default_rng(seed).permutation(split["test"])  # tx's rows in no order, as upstream
    write_pickle(out / f"ind.{name}.x", rows(graph["features"], range(n_train)))
    write_pickle(out / f"ind.{name}.y", one_hot[:n_train])
    write_pickle(out / f"ind.{name}.allx", rows(graph["features"], range(n_all)))
    write_pickle(out / f"ind.{name}.ally", one_hot[:n_all])
    write_pickle(out / f"ind.{name}.tx", rows(graph["features"], test))
    write_pickle(out / f"ind.{name}.ty", one_hot[test])
    (out / f"ind.{name}.test.index").write_text("".join(f"{n}\n" for n in test))
    neighbours = collections.defaultdict(list)
    for a, b in graph["edges"]:
        neighbours[a].append(b)
        neighbours[b].append(a)
    if self_loop:
        neighbours[0].append(0)  # upstream Citeseer has 124; the conversion leaves them out
    write_pickle(out / f"ind.{name}.graph", neighbours)


def in_planetoid_order(graph: dict) -> tuple[dict, np.ndarray]:
    """`graph` renumbered train, val, the other nodes, test; and old node of each new node."""
    split = graph["split"]
    named = set(split["train"]) | set(split["val"]) | set(split["test"])
    others = [n for n in range(len(graph["labels"])) if n not in named]
    order = np.array(split["train"] + split["val"] + others + split["test"])
    new = np.argsort(order)
    start = {"train": 0, "val": len(split["train"]), "test": len(order) - len(split["test"])}
    features = rows(graph["features"], order)
    renumbered = {
        "features": (features.indptr, features.indices, features.data, features._shape),
        "labels": graph["labels"][order],
        "edges": [(int(new[a]), int(new[b])) for a, b in graph["edges"]],
        "split": {s: list(range(start[s], start[s] + len(nodes))) for s, nodes in split.items()},
    }
    return renumbered, order


def write_fixture(folder: Path) -> None:
    """The 60-node Cora slice as upstream files ind.cora.* (12 validation nodes, not 500)."""
    write_upstream(in_planetoid_order(read_pieces(FIXTURE))[0], folder, "cora")


def test_the_fixture_goes_to_upstream_pickles_and_back_to_the_same_graph(tmp_path):
    original = read_pieces(FIXTURE)
    graph, order = in_planetoid_order(original)
    write_upstream(graph, tmp_path, "cora", self_loop=True)
    converted = read_graph(convert(tmp_path, "cora", tmp_path / "out", n_val=len(original["split"]["val"])))
    fixture = read_graph(FIXTURE)
    np.testing.assert_array_equal(converted.features.to_dense().numpy(), fixture.features.to_dense().numpy()[order])
    assert converted.labels.tolist() == fixture.labels[order].tolist()
    assert {s: order[v.numpy()].tolist() for s, v in converted.splits.items()} == {
        s: sorted(v.tolist()) for s, v in fixture.splits.items()
    }
    edges = {tuple(sorted(order[e].tolist())) for e in converted.edge_index.T.numpy()}
    assert edges == {tuple(sorted(e)) for e in original["edges"]} and converted.n_edges == len(original["edges"])


@pytest.mark.parametrize("name", ["cora", "citeseer"])
def test_the_shared_graphs_convert_back_to_identical_arrays(name, tmp_path):
    if not (SHARED / name).is_dir():
        pytest.skip(f"{SHARED / name} is not on this machine")
    shared = read_pieces(SHARED / name)
    write_upstream(shared, tmp_path, name)
    convert(tmp_path, name, tmp_path / "out")
    got = read_pieces(tmp_path / "out" / name)
    for mine, theirs in zip(got["features"][:3], shared["features"][:3], strict=True):
        assert mine.dtype == theirs.dtype and np.array_equal(mine, theirs)
    assert got["features"][3] == shared["features"][3]
    assert got["labels"].dtype == shared["labels"].dtype and np.array_equal(got["labels"], shared["labels"])
    assert got["edges"] == shared["edges"] and got["split"] == shared["split"]
    assert int((got["labels"] < 0).sum()) == (15 if name == "citeseer" else 0)  # Citeseer's unnamed test nodes


def test_the_pickles_name_only_the_globals_the_unpickler_admits(tmp_path):
    write_fixture(tmp_path)
    named = set()
    for suffix in SUFFIXES[:-1]:
        for op, arg, _ in pickletools.genops((tmp_path / f"ind.cora.{suffix}").read_bytes()):
            if op.name == "GLOBAL":
                named.add(tuple(arg.split(" ")))
    assert named == set(ALLOWED_GLOBALS)  # the writer above writes what upstream writes, all of it


class RunsACommand:
    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self) -> tuple:
        return os.system, (self.command,)


@pytest.mark.parametrize("protocol", [2, 4])  # GLOBAL and STACK_GLOBAL: both go through find_class
def test_a_pickle_that_would_run_a_command_is_refused_unrun(tmp_path, protocol):
    write_fixture(tmp_path)
    marker = tmp_path / "ran"
    (tmp_path / "ind.cora.allx").write_bytes(pickle.dumps(RunsACommand(f"touch {marker}"), protocol=protocol))
    with pytest.raises(UserError, match=r"ind\.cora\.allx asks to load (posix|nt)\.system.*refused without running"):
        convert(tmp_path, "cora", tmp_path / "out", n_val=12)
    assert not marker.exists()
    assert not (tmp_path / "out" / "cora").exists()


def test_an_admitted_class_used_otherwise_is_still_checked(tmp_path):
    write_fixture(tmp_path)
    write_pickle(tmp_path / "ind.cora.tx", np.zeros(3))  # a numpy array where a CSR matrix belongs
    with pytest.raises(UserError, match=r"ind\.cora\.tx does not hold a sparse CSR matrix"):
        convert(tmp_path, "cora", tmp_path / "out", n_val=12)


def test_a_truncated_pickle_is_one_clear_error(tmp_path):
    path = tmp_path / "ind.cora.y"
    write_pickle(path, np.eye(3, dtype=np.int32))
    path.write_bytes(path.read_bytes()[:-20])  # an interrupted copy
    with pytest.raises(UserError, match=r"ind\.cora\.y is not a readable Planetoid pickle"):
        read_pickle(path)


def test_files_that_do_not_belong_together_are_named(tmp_path):
    write_fixture(tmp_path)
    (tmp_path / "ind.cora.test.index").write_text("0\n" * 36)
    with pytest.raises(UserError, match=r"test\.index must name 36 different nodes"):
        convert(tmp_path, "cora", tmp_path / "out", n_val=12)


def test_the_cli_downloads_verifies_and_converts_planetoid(server_folder, tmp_path, capsys, monkeypatch):
    base, root = server_folder
    if not SHARED.is_dir():
        pytest.skip("needs the project's shared copy of the Planetoid graphs")
    write_upstream(read_pieces(SHARED / "cora"), root, "cora")
    write_upstream(read_pieces(SHARED / "citeseer"), root, "citeseer")
    files = tuple(
        downloads.RemoteFile(f.name, f"{base}/{f.name}", _sha256(root / f.name), (root / f.name).stat().st_size)
        for f in _files()
    )
    planetoid = replace(downloads.DATASETS["planetoid"], files=files)
    monkeypatch.setitem(downloads.DATASETS, "planetoid", planetoid)
    code, out, err = cli(capsys, "data", "download", "planetoid", "--to", tmp_path / "planetoid")
    assert code == 0, err
    assert f"ready: attnlab train cora-gat --data-dir {tmp_path / 'planetoid'}" in out
    assert "cora: converted from the ind.cora.* files" in out
    cora = read_graph(tmp_path / "planetoid" / "cora")
    assert (cora.n_nodes, cora.n_features, cora.n_edges) == (2708, 1433, 5278)
    assert read_graph(tmp_path / "planetoid" / "citeseer").n_nodes == 3327


def test_the_recorded_files_are_the_eight_of_each_data_set():
    names = {f.name for f in _files()}
    assert names == {f"ind.{d}.{s}" for d in ("cora", "citeseer") for s in SUFFIXES}
    assert all(f.url.startswith("https://raw.githubusercontent.com/kimiyoung/planetoid/") for f in _files())
    assert all(len(f.sha256) == 64 and f.size > 0 for f in _files())


def test_data_list_names_planetoid_and_fsdd_and_part_names_point_to_the_whole(capsys, tmp_path):
    code, out, _ = cli(capsys, "data", "list")
    assert code == 0 and "planetoid: " in out and "fsdd: " in out
    assert "git clone https://github.com/Jakobovski/free-spoken-digit-dataset" in out
    assert_user_error(cli(capsys, "data", "download", "cora", "--to", tmp_path), "attnlab data download planetoid")
    assert_user_error(cli(capsys, "data", "download", "fsdd", "--to", tmp_path), "git clone")


def _files():
    return downloads.DATASETS["planetoid"].files


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def server_folder(tmp_path):
    """(base URL, folder) of a plain HTTP server on 127.0.0.1 serving the folder."""
    root = tmp_path / "served"
    root.mkdir()
    handler = functools.partial(QuietHandler, directory=str(root))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", root
    httpd.shutdown()
    httpd.server_close()


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass
