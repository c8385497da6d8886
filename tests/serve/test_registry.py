"""The server's paths are written once (`attnlab.names.API`): the router serves exactly those, the
page is handed them (`/static/api.js`) and names none itself, and no other module of the source
writes a path of the API as a literal, whole (`"/v1/tags"`) or under the router's prefix (`"/tags"`).
The handlers live in their own modules (serve/tasks.py, serve/attention.py, ...), app.py wires them."""

import ast
import dataclasses
import json
import re
from pathlib import Path

from fastapi.routing import APIRoute
from fastapi.testclient import TestClient

from attnlab.names import API
from attnlab.serve.app import api_router, create_app

SRC = Path(__file__).resolve().parents[2] / "src" / "attnlab"
STATIC = SRC / "serve" / "static"
PATHS = set(dataclasses.asdict(API).values())


def test_the_router_serves_exactly_the_paths_of_the_table():
    routes = [r for r in api_router().routes if isinstance(r, APIRoute)]
    # each path once as written and once with a trailing slash; /v1/models also as /v1/models/{name}
    assert {r.path.removesuffix("/").removesuffix("/{name}") for r in routes} == PATHS
    with TestClient(create_app({})) as client:  # the application serves the router
        documented = set(client.get("/openapi.json").json()["paths"])
    assert {p.removesuffix("/{name}") for p in documented if p.startswith("/v1")} == PATHS


def test_the_page_is_handed_the_paths_and_names_none_itself():
    with TestClient(create_app({})) as client:
        script = client.get("/static/api.js")
    assert script.status_code == 200 and script.headers["content-type"].startswith("text/javascript")
    prefix = "window.attnlabApi = "
    assert script.text.startswith(prefix)
    assert json.loads(script.text.removeprefix(prefix).rstrip().removesuffix(";")) == dataclasses.asdict(API)
    page = (STATIC / "index.html").read_text(encoding="utf-8")
    assert page.index('src="/static/api.js"') < page.index('src="/static/app.js"'), "api.js must load first"
    quoted = re.findall(r"""["'`](/v1[^"'`]*)["'`]""", (STATIC / "app.js").read_text(encoding="utf-8"))
    assert not quoted, f"app.js writes API paths by hand (read window.attnlabApi): {quoted}"


def path_literals(path: Path) -> list[tuple[int, str]]:
    """(line, text) of each string constant of `path` that is a path of the API, whole or after /v1."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and (node.value in PATHS or "/v1" + node.value in PATHS)
    ]


def test_the_scan_finds_both_forms_of_a_path(tmp_path):
    source = tmp_path / "m.py"
    source.write_text('A = "/v1/tags"\nB = ("/translations", 1)\nC = "see /v1/tags"\n')
    assert path_literals(source) == [(1, "/v1/tags"), (2, "/translations")]


def test_no_module_writes_a_path_of_the_api_by_hand():
    found = {
        path.relative_to(SRC).as_posix(): lines
        for path in sorted(SRC.rglob("*.py"))
        if path.name != "names.py" and (lines := path_literals(path))
    }
    assert not found, f"API paths written by hand (use attnlab.names.API): {found}"


def test_app_py_holds_the_wiring_and_no_task_handler():
    tree = ast.parse((SRC / "serve" / "app.py").read_text(encoding="utf-8"))
    defined = {node.name for node in tree.body if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)}
    assert not defined & {"translate", "classify", "tag", "attention"}
