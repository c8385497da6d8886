"""Fixtures of the `attnlab serve` tests: tiny real runs (trained once per session), loaded once,
and apps and live servers over them."""

from pathlib import Path

import pytest

from attnlab.serve.app import create_app
from attnlab.serve.limits import Limits
from attnlab.serve.registry import load_runs
from attnlab.serve.server import BackgroundServer
from helpers import shared

# Model name -> the shared tiny run behind it (see helpers.shared).
RUNS = {
    "lm": "lm",
    "mt": "mt-transformer",
    "sst": "sst2-bert",
    "sst-lstm": "sst2-bilstm",
    "pos": "pos-bert",
    "mlm": "mlm",
}
# Small caps, so that no accepted request of a test (or of the fuzz test) takes long. The shared
# "lm" run reads 16 tokens: its completions go on past that context (`past_context`, as `attnlab
# sample` does), the way these tests decode long texts and compare with the library's sampling;
# test_context.py checks the default, which stops at the context.
LIMITS = Limits(
    max_tokens=200,
    max_n=4,
    max_prompt_tokens=50,
    max_text_chars=400,
    max_inputs=8,
    max_beam=4,
    max_attention_tokens=40,
    past_context=True,
)


@pytest.fixture(scope="session")
def run_dirs(tmp_path_factory) -> dict[str, Path]:
    return {name: shared(tmp_path_factory, run) for name, run in RUNS.items()}


@pytest.fixture(scope="session")
def runs(run_dirs) -> dict:
    """The runs as `attnlab.load` gives them, shared by every app of the session (apps only read them)."""
    return load_runs([f"{name}={path}" for name, path in run_dirs.items()])


@pytest.fixture(scope="session")
def app(runs):
    return create_app(runs, limits=LIMITS)


@pytest.fixture(scope="session")
def client(app):
    from fastapi.testclient import TestClient

    with TestClient(app) as c:  # the lifespan starts the decoding thread
        yield c


@pytest.fixture(scope="session")
def live(runs):
    """A real HTTP server on a free 127.0.0.1 port; long completions allowed (the browser's Stop)."""
    with BackgroundServer(create_app(runs, limits=Limits(max_tokens=100_000, past_context=True))) as server:
        yield server


def lm_worker(server_or_app):
    """The decoding worker of model "lm" of an app or a live server."""
    app = getattr(server_or_app, "app", server_or_app)
    return app.state.models["lm"].worker


@pytest.fixture(scope="session")
def json_folders(tmp_path_factory) -> dict[str, Path]:
    """ "chat": a random-weight Llama folder with a chat template and 512 positions; "json": a tiny
    trained run with a byte-level BPE (tests/serve/json_models.py)."""
    from serve.json_models import chat_folder, json_run

    root = tmp_path_factory.mktemp("json-models")
    return {"chat": chat_folder(root / "chat"), "json": json_run(root / "json")}


@pytest.fixture(scope="session")
def json_runs(json_folders) -> dict:
    return load_runs([f"{name}={path}" for name, path in json_folders.items()])


@pytest.fixture(scope="session")
def json_server(json_runs):
    """A live server over `json_runs` with the default context rule (a completion ends at the context)."""
    with BackgroundServer(create_app(json_runs, limits=Limits(max_tokens=400, max_n=4, max_batch=8))) as server:
        yield server
