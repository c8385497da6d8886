"""`--backend` and `--address`, refused as one line with exit code 2 and nothing written: an address
where no Ray cluster answers, a results folder that cannot be written, options that do not go
together. No Ray cluster is started here."""

import socket
import sys
import time
from pathlib import Path

import pytest

from attnlab.errors import UserError
from attnlab.studies.backends import check_address, join_error
from helpers import ONE_LAYER_LM, assert_user_error, cli

pytestmark = pytest.mark.slow

SPEC = """
base = "base.toml"
seeds = 1
[set]
"train.max_iters" = 16
[variants.narrow]
set = {{ "model.d_model" = 16 }}
"""

BASE = ONE_LAYER_LM


@pytest.fixture
def spec(tmp_path, corpus) -> Path:
    (tmp_path / "base.toml").write_text(BASE.format(corpus=corpus.as_posix()), encoding="utf-8")
    path = tmp_path / "spec.toml"
    path.write_text(SPEC.format(), encoding="utf-8")
    return path


def closed_port() -> int:
    """A loopback port where nothing listens (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_an_address_where_no_cluster_answers_is_one_line_within_the_timeout(spec, tmp_path, capsys):
    pytest.importorskip("ray", reason="Ray is not installed (pip install 'attnlab[ray]')")
    address = f"127.0.0.1:{closed_port()}"
    out = tmp_path / "out"
    start = time.monotonic()
    result = cli(capsys, "ablate", spec, "--out", out, "--backend", "ray", "--address", address)
    assert time.monotonic() - start < 60
    assert_user_error(result, f"no Ray cluster answers at {address}", "ray start --head")
    assert not out.exists()


def test_a_refused_address_fails_at_once_in_both_address_forms():
    """host:port and ray://host:port; Ray's own connect would retry for a minute and more."""
    start = time.monotonic()
    with pytest.raises(UserError, match="no Ray cluster answers at 127.0.0.1"):
        check_address(f"127.0.0.1:{closed_port()}", timeout=5)
    assert time.monotonic() - start < 5
    with pytest.raises(UserError, match="no Ray cluster answers at ray://127.0.0.1"):
        check_address(f"ray://127.0.0.1:{closed_port()}", timeout=5)


@pytest.mark.parametrize("backend", ["local", "ray"])
def test_a_results_folder_inside_a_file_is_refused_before_any_run(spec, tmp_path, capsys, backend):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder\n", encoding="utf-8")
    result = cli(capsys, "ablate", spec, "--out", blocker / "study", "--backend", backend)
    assert_user_error(result, "cannot write the results to", "is a file, not a folder", "--out")
    assert blocker.read_text() == "not a folder\n"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="uses /proc, where no file can be made")
def test_a_results_folder_that_cannot_be_written_is_refused_before_any_run(spec, capsys):
    # /proc refuses new files even to root, where a folder's permission bits would not.
    result = cli(capsys, "ablate", spec, "--out", "/proc/attnlab-study", "--backend", "ray")
    assert_user_error(result, "cannot write the results to /proc/attnlab-study", "not writable")


def test_train_seeds_on_ray_refuses_an_unwritable_folder(tiny_toml, tmp_path, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("", encoding="utf-8")
    result = cli(capsys, "train", tiny_toml, "--seeds", "2", "--out", blocker / "s", "--backend", "ray")
    assert_user_error(result, "cannot write the results to", "is a file")


@pytest.mark.parametrize(
    ("args", "fragments"),
    [
        (["ablate", "SPEC", "--address", "10.0.0.1:6379"], ["--address is the Ray cluster's", "--backend ray"]),
        (["ablate", "SPEC", "--backend", "ray", "--jobs", "2"], ["--jobs is for the local backend"]),
        (["scale", "--backend", "ray", "--jobs", "2"], ["--jobs is for the local backend"]),
        (["train", "TOML", "--backend", "ray"], ["--backend and --address go with --seeds"]),
        (["train", "TOML", "--seeds", "2", "--address", "10.0.0.1:6379"], ["--address is the Ray cluster's"]),
    ],
)
def test_options_that_do_not_go_together(spec, tiny_toml, tmp_path, capsys, args, fragments):
    args = [{"SPEC": spec, "TOML": tiny_toml}.get(a, a) for a in args]
    assert_user_error(cli(capsys, *args, "--out", tmp_path / "out"), *fragments)
    assert not (tmp_path / "out").exists()


def test_a_refused_token_and_a_stranger_at_the_address_are_told_apart():
    """`join_error` reads the exception `ray.init` raised, with Ray's own cause chained under it."""
    try:
        try:
            raise RuntimeError("Failed to connect to GCS: InvalidAuthToken: Authentication token is missing")
        except RuntimeError as cause:
            raise ConnectionError("Failed to connect to Ray cluster at 10.0.0.1:6379") from cause
    except ConnectionError as e:
        refused = join_error("10.0.0.1:6379", e)
    assert "refused this process's token" in refused and "RAY_AUTH_MODE=token" in refused
    stranger = join_error("10.0.0.1:80", ConnectionError("Failed to connect to Ray cluster at 10.0.0.1:80\nmore"))
    assert stranger == (
        "cannot join a Ray cluster at 10.0.0.1:80 (ConnectionError: Failed to connect to Ray cluster at "
        "10.0.0.1:80); pass the address `ray start --head` printed"
    )
