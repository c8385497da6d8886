"""`attnlab serve`: start-up checks as one line and exit code 2, and a real start in a child process."""

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from attnlab.serve.registry import parse_model_spec
from attnlab.serve.server import bind, is_loopback, model_threads
from helpers import assert_user_error, cli

pytestmark = pytest.mark.slow

SRC = Path(__file__).parents[2] / "src"


@pytest.mark.parametrize(
    "host, loopback",
    [("127.0.0.1", True), ("127.8.0.1", True), ("::1", True), ("localhost", True), ("0.0.0.0", False),
     ("::", False), ("192.168.1.20", False), ("example.com", False)],
)  # fmt: skip
def test_loopback_hosts(host, loopback):
    assert is_loopback(host) is loopback


def test_the_models_leave_one_core_to_the_event_loop():
    assert [model_threads(cores) for cores in (1, 2, 4, 16)] == [1, 1, 3, 15]


def test_threads_must_be_positive(capsys, run_dirs):
    code, _, err = cli(capsys, "serve", run_dirs["lm"], "--threads", "0")
    assert code == 2 and "--threads" in err


def test_model_names():
    assert parse_model_spec("tiny=runs/demo") == ("tiny", Path("runs/demo"))
    assert parse_model_spec("runs/shakespeare-char-cpu/") == ("shakespeare-char-cpu", Path("runs/shakespeare-char-cpu"))
    assert parse_model_spec("runs/a=b") == ("a=b", Path("runs/a=b"))  # "runs/a" is no name: a path with "="


def test_help(capsys):
    code, out, _ = cli(capsys, "serve", "--help")
    assert code == 0 and out.startswith("usage: attnlab serve") and "--api-key" in out


def test_beyond_this_machine_without_a_key_is_refused(capsys, run_dirs):
    result = cli(capsys, "serve", run_dirs["lm"], "--host", "0.0.0.0")
    assert_user_error(result, "--host 0.0.0.0 listens beyond this machine", "--api-key")


def test_bad_runs_are_one_line(capsys, run_dirs, tmp_path):
    assert_user_error(cli(capsys, "serve", tmp_path / "missing"), "does not exist")
    assert_user_error(cli(capsys, "serve", f"a={run_dirs['lm']}", f"a={run_dirs['mt']}"), "two models are named 'a'")


def test_a_port_in_use_is_one_line(capsys, run_dirs):
    taken = bind("127.0.0.1", 0)
    try:
        port = str(taken.getsockname()[1])
        assert_user_error(cli(capsys, "serve", run_dirs["lm"], "--port", port), f"cannot listen on 127.0.0.1:{port}")
    finally:
        taken.close()


def test_without_fastapi_it_says_how_to_install(capsys, monkeypatch, run_dirs):
    monkeypatch.setitem(sys.modules, "fastapi", None)  # `import fastapi` raises ImportError
    assert_user_error(cli(capsys, "serve", run_dirs["lm"]), "make serve", "pip install 'attnlab[serve]'")


def test_serve_starts_and_answers(run_dirs):
    """The two lines of the README, in a child process: start, read the address, use it, stop."""
    env = {**os.environ, "PYTHONPATH": f"{SRC}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", "ATTNLAB_API_KEY": ""}
    cmd = [
        sys.executable,
        "-m",
        "attnlab",
        "serve",
        run_dirs["lm"],
        f"de-en={run_dirs['mt']}",
        "--port",
        "0",
        "--threads",
        "3",
    ]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, env=env)
    try:
        banner = proc.stderr.readline()
        found = re.search(r"on (http://127\.0\.0\.1:\d+)/", banner)
        assert found, banner
        assert "run (language-model), de-en (translation)" in banner
        assert "; 3 torch threads)" in banner
        url = found.group(1)
        for _ in range(100):  # the address is printed just before the server starts accepting
            try:
                models = httpx.get(f"{url}/v1/models", timeout=5).json()
                break
            except httpx.ConnectError:
                time.sleep(0.1)
        assert [m["id"] for m in models["data"]] == ["run", "de-en"]
        assert "<title>attnlab" in httpx.get(url).text
    finally:
        proc.terminate()
        proc.wait(timeout=20)
    assert proc.returncode in (0, -15)
