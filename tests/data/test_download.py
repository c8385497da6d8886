"""`attnlab data download` against a real HTTP server on 127.0.0.1 (this machine has no internet):
verified, resumed with a Range request, atomic, nothing left behind on a checksum mismatch."""

import hashlib
import http.server
import threading
from pathlib import Path

import pytest

from attnlab.data.download import DATASETS, RemoteFile, download, fetch
from attnlab.errors import UserError
from helpers import FIXTURE, cli

SHARED = Path(__file__).parents[3] / "shared" / "data"  # the project's copies of the real files


class RangeHandler(http.server.BaseHTTPRequestHandler):
    """Serves the files of `root`, honouring `Range: bytes=N-`, and records what it was asked."""

    root: Path
    log: list

    def do_GET(self) -> None:
        path = self.root / self.path.lstrip("/")
        if not path.is_file():
            self.send_error(404)
            return
        data = path.read_bytes()
        start = int(self.headers["Range"].removeprefix("bytes=").rstrip("-")) if self.headers["Range"] else 0
        self.log.append((self.path, self.headers["Range"], len(data) - start))
        self.send_response(206 if start else 200)
        if start:
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        self.send_header("Content-Length", str(len(data) - start))
        self.end_headers()
        self.wfile.write(data[start:])

    def log_message(self, *args) -> None:  # quiet
        pass


@pytest.fixture
def server(tmp_path):
    """(base URL, served folder, request log) of a server running in a thread."""
    root = tmp_path / "served"
    root.mkdir()
    handler = type("Handler", (RangeHandler,), {"root": root, "log": []})
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", root, handler.log
    httpd.shutdown()
    httpd.server_close()


def served_file(root: Path, name: str, data: bytes, base: str) -> RemoteFile:
    (root / name).write_bytes(data)
    return RemoteFile(name, f"{base}/{name}", hashlib.sha256(data).hexdigest(), len(data))


def test_a_download_is_verified_and_a_second_one_finds_it_there(server, tmp_path):
    base, root, log = server
    file = served_file(root, "val.de.gz", (FIXTURE / "val.de.gz").read_bytes(), base)
    assert fetch(file, tmp_path / "out", say=lambda _: None) is True
    assert (tmp_path / "out" / "val.de.gz").read_bytes() == (FIXTURE / "val.de.gz").read_bytes()
    assert fetch(file, tmp_path / "out", say=lambda _: None) is False
    assert len(log) == 1  # the second call asked nothing of the server
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["val.de.gz"]


def test_an_interrupted_download_resumes_with_a_range_request(server, tmp_path):
    base, root, log = server
    data = (FIXTURE / "train.de.gz").read_bytes()
    file = served_file(root, "train.de.gz", data, base)
    out = tmp_path / "out"
    out.mkdir()
    half = len(data) // 2
    (out / "train.de.gz.part").write_bytes(data[:half])  # what an interrupted download left
    said = []
    assert fetch(file, out, say=said.append) is True
    assert (out / "train.de.gz").read_bytes() == data
    assert log == [("/train.de.gz", f"bytes={half}-", len(data) - half)]  # only the rest was sent
    assert said == [f"train.de.gz: resuming at byte {half:,} of {len(data):,}"]
    assert not (out / "train.de.gz.part").exists()


def test_a_checksum_mismatch_keeps_nothing(server, tmp_path):
    base, root, _ = server
    file = served_file(root, "dev.tsv", b"sentence\tlabel\ngood \t1\n", base)
    (root / "dev.tsv").write_bytes(b"sentence\tlabel\nbad \t0\n")  # the server's copy changed
    out = tmp_path / "out"
    with pytest.raises(UserError, match="dev.tsv .* has SHA-256 .* not the published"):
        fetch(file, out, say=lambda _: None)
    assert list(out.iterdir()) == []


def test_a_server_error_is_one_line_and_keeps_the_partial_file(server, tmp_path):
    base, _, _ = server
    file = RemoteFile("missing.gz", f"{base}/missing.gz", "0" * 64, 10)
    with pytest.raises(UserError, match="cannot download .*missing.gz.*run the command again"):
        fetch(file, tmp_path / "out", say=lambda _: None)


@pytest.mark.skipif(not (SHARED / "multi30k").is_dir(), reason="needs the project's shared copy of Multi30k")
def test_the_cli_downloads_multi30k_from_a_mirror_against_the_real_checksums(server, tmp_path, capsys, monkeypatch):
    base, root, _ = server
    for f in DATASETS["multi30k"].files:
        (root / f.name).write_bytes((SHARED / "multi30k" / f.name).read_bytes())
    monkeypatch.chdir(tmp_path)
    code, out, err = cli(capsys, "data", "download", "multi30k", "--mirror", base)
    assert code == 0, err
    assert "licence: no licence file; the publishers provide it for non-commercial research" in out
    assert "ready: attnlab train multi30k-de-en --data-dir data/multi30k" in out
    names = sorted(p.name for p in (tmp_path / "data" / "multi30k").iterdir())
    assert names == sorted(f.name for f in DATASETS["multi30k"].files)


def test_every_preset_has_its_data_set_listed(capsys):
    from attnlab.config import presets
    from attnlab.data.download import ELSEWHERE

    offered = {p for d in DATASETS.values() for p in d.presets}
    elsewhere = {p for d in ELSEWHERE.values() for p in d.presets}  # FSDD: a git repository of 3,000 files
    assert set(presets()) == offered | elsewhere and not offered & elsewhere
    code, out, _ = cli(capsys, "data", "list")
    assert code == 0 and all(f"{name}:" in out for name in [*DATASETS, *ELSEWHERE])
    assert "licence: CC BY-SA 4.0" in out


def test_download_of_an_unknown_name_suggests_one(capsys, tmp_path):
    from helpers import assert_user_error

    assert_user_error(cli(capsys, "data", "download", "multi30", "--to", tmp_path), "did you mean 'multi30k'")


def test_the_download_function_uses_the_mirror_for_every_file(server, tmp_path):
    base, root, log = server
    data = DATASETS["tinyshakespeare"]
    text = (Path(__file__).parents[2] / "src" / "attnlab" / "data" / "tinyshakespeare.txt").read_bytes()
    if hashlib.sha256(text).hexdigest() != data.files[0].sha256:
        pytest.skip("the bundled copy differs from the upstream file")
    (root / "input.txt").write_bytes(text)
    download("tinyshakespeare", tmp_path / "ts", mirror=base + "/", say=lambda _: None)
    assert (tmp_path / "ts" / "input.txt").read_bytes() == text and log[0][0] == "/input.txt"
